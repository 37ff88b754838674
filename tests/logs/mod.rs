//! Node logs (docs/architecture.md, "Logs"), a file per behaviour:
//!
//! - `store`: pieces stored by index on both backends, re-sends and lost responses recognised
//!   wherever they overlap, rewritten files refused, reads that never list;
//! - `queue`: requests queued by ingest and stored a batch at a time, as on AWS;
//! - `route`: `POST /v1/logs/{cluster}` checking what it is sent, and the shipper sending a Ray
//!   session folder through `serve`;
//! - `reads`: a task's output, a node's files and their tails, in our routes and Ray's;
//! - `inferred`: attempts Ray exported no offsets for get only their own lines;
//! - `migrate`: logs of the older layout, an object per piece, moved into the index;
//! - `dashboard`: the cluster events and cluster metadata shipped beside the logs, answered as
//!   Ray's dashboard answered them.

mod dashboard;
mod inferred;
mod migrate;
mod queue;
mod reads;
mod route;
mod store;

use anyhow::Context as _;
use shared::keys::{ClusterName, LogFile, LogFileName, NodeId, SessionName};
use shared::logs::store::{PieceOutcome, ReadPiece, put_pieces};
use shared::storage::Storage;

const SESSION: &str = "session_2026-11-23_10-00-00_000001_4242";

/// No limit on the bytes a read returns.
const ALL: usize = usize::MAX;

fn node_id() -> String {
    "5e".repeat(28)
}

fn log_file(name: &str) -> anyhow::Result<LogFile> {
    Ok(LogFile {
        cluster: ClusterName::new("logs")?,
        session: SessionName::new(SESSION)?,
        node_id: NodeId::new(&node_id())?,
        file: LogFileName::new(name)?,
    })
}

/// Stores one piece of `file` as a request of its own.
async fn put(
    storage: &dyn Storage,
    file: &LogFile,
    offset: u64,
    bytes: &[u8],
) -> anyhow::Result<PieceOutcome> {
    let pieces = [ReadPiece {
        file: file.file.clone(),
        offset,
        bytes,
    }];
    put_pieces(storage, &file.node(), &pieces)
        .await?
        .into_iter()
        .next()
        .context("no outcome for the piece")
}

/// `serve` over a local folder with `bodies` posted as cluster `logs` and compacted.
async fn serving(bodies: &[Vec<u8>]) -> anyhow::Result<afterglow_tests::Served> {
    let served = afterglow_tests::serve_runs_locally(&[], Ok).await?;
    afterglow_tests::post_all(&format!("{}/v1/events/logs", served.server.url), bodies).await?;
    served.queue.idle().await;
    Ok(served)
}
