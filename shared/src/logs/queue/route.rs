//! Ingest's choice for one request when a queue is configured: queue it, or store it at once.
//!
//! A request whose pieces overlap no stored byte is queued and answered
//! [`PieceOutcome::Queued`]: there is nothing stored to compare it with yet. One that overlaps
//! stored bytes (a shipper re-sending after it lost its state), or reaches where its file was
//! found rewritten, is stored at once, so that a rewritten file is answered
//! [`PieceOutcome::Refused`] and the shipper stops sending it; and so is one too large for a
//! message. Reading the node's index to choose costs one GET, a twelfth of the price of a PUT
//! storing the request would make.

use super::LogQueue;
use super::message::{MAX_MESSAGE_BYTES, QueuedPieces};
use crate::keys::NodeLogs;
use crate::logs::index::{self, LogIndex};
use crate::logs::store::{LogError, PieceOutcome, ReadPiece, put_pieces};
use crate::storage::Storage;

/// Queues `pieces` of `node` on `queue`, or stores them at once (see the module's doc), sent
/// at `sent_ms` (milliseconds since the epoch).
#[tracing::instrument(name = "log_route", skip_all, fields(node = %node.prefix(), pieces = pieces.len()))]
pub async fn queue_or_store(
    storage: &dyn Storage,
    queue: &dyn LogQueue,
    node: &NodeLogs,
    pieces: &[ReadPiece<'_>],
    sent_ms: u64,
) -> Result<Vec<PieceOutcome>, LogError> {
    let stored = index::load(storage, node).await?;
    let ends: Option<Vec<u64>> = pieces
        .iter()
        .map(|piece| piece.offset.checked_add(piece.bytes.len() as u64))
        .collect();
    // A piece past the largest offset is refused by the store, with its reason.
    let Some(ends) = ends.filter(|_| !overlaps_stored(&stored.index, pieces)) else {
        return put_pieces(storage, node, pieces).await;
    };
    let message = QueuedPieces::new(node.clone(), sent_ms, pieces)
        .encode()
        .map_err(LogError::Encode)?;
    if message.len() > MAX_MESSAGE_BYTES {
        return put_pieces(storage, node, pieces).await;
    }
    queue.send(node, message).await?;
    tracing::info!("queued log pieces");
    Ok(ends
        .into_iter()
        .map(|end| PieceOutcome::Queued { end })
        .collect())
}

/// Whether any of `pieces` overlaps bytes `index` says are stored, or reaches where its file
/// was found rewritten (refused at once, so the shipper stops sending the file).
fn overlaps_stored(index: &LogIndex, pieces: &[ReadPiece<'_>]) -> bool {
    pieces.iter().any(|piece| {
        let file = piece.file.as_str();
        let end = piece.offset.saturating_add(piece.bytes.len() as u64);
        let overlaps = index.files.get(file).is_some_and(|extents| {
            extents
                .iter()
                .any(|extent| extent.start < end && extent.end > piece.offset)
        });
        overlaps || index.rewritten.get(file).is_some_and(|&from| end > from)
    })
}
