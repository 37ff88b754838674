//! `afterglow bench --logs`: the log path, measured. `--log-nodes` nodes, each with
//! `--log-files` files printing a 100-byte line a second, are shipped for `--log-minutes` by the
//! shipper itself (a pass every `--log-interval`, 5 s as the shipper's default) into the store
//! itself, over a local
//! folder that counts its requests; then one file of `--log-pieces` one-line requests is read
//! back: one task's output and a 1 000-line tail, timed warm. The report gives requests and
//! storage requests per node-hour, bytes stored per byte shipped, the reads' times and storage
//! requests, and what an always-busy node costs per month and per GB shipped.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_trait::async_trait;
use serde::Serialize;
use shared::keys::{ClusterName, LogFileName, NodeId, NodeLogs, SessionName};
use shared::logs::frames::{BodyAnswer, PieceAnswer, read_body};
use shared::logs::read::{read_range, read_tail};
use shared::logs::ship::{LogBatch, LogSink, SendError, ShipSettings, Shipper};
use shared::logs::store::{ReadPiece, put_pieces};
use shared::storage::{LocalDirStorage, Storage};

use super::cost::{LogCost, LogRates, logs_per_node_month};
use super::counting::{Counters, CountingStorage, RequestCounts};
use super::report::Machine;
use super::stats::Stats;
use super::{BenchArgs, WorkDir, dir_bytes};

/// Bytes of one printed line.
const LINE_BYTES: usize = 100;
/// Lines in the task output read back: a task that printed a little.
const TASK_LINES: u64 = 20;
/// Lines of the tail read back.
const TAIL_LINES: usize = 1_000;
/// Most bytes a read may return (the query function's response limit).
const READ_LIMIT: usize = 6 * 1024 * 1024;
/// The session every simulated node runs.
const SESSION: &str = "session_2026-12-01_00-00-00_000000_1";

/// The report of a log run (JSON on stdout).
#[derive(Debug, Serialize)]
struct LogReport {
    nodes: usize,
    files_per_node: usize,
    simulated_minutes: u64,
    interval_s: u64,
    machine: Machine,
    shipping: Shipping,
    reads: Reads,
    cost: LogCost,
}

/// What shipping did.
#[derive(Debug, Serialize)]
struct Shipping {
    /// Passes each node made, one per simulated interval.
    passes: u64,
    /// Requests sent, all nodes together.
    requests: u64,
    /// Requests an idle pass of every node sent (after the files stopped growing).
    idle_pass_requests: u64,
    /// Storage requests, all nodes together.
    storage: RequestCounts,
    /// Per node-hour.
    per_node_hour: LogRates,
    /// Bytes stored per byte shipped.
    stored_per_shipped: f64,
    /// Time the store took per request (local disk).
    store_per_request: Stats,
}

/// The reads of one file shipped as `pieces` one-line requests.
#[derive(Debug, Serialize)]
struct Reads {
    pieces: usize,
    /// Storing them, one request each (seconds).
    store_s: f64,
    /// One task's output: `TASK_LINES` lines from the middle of the file.
    task_output: ReadTimes,
    /// The file's last `TAIL_LINES` lines.
    tail: ReadTimes,
}

/// One read, repeated.
#[derive(Debug, Serialize)]
struct ReadTimes {
    /// Warm times (local disk).
    warm: Stats,
    /// Bytes returned.
    bytes: usize,
    /// Storage requests one read makes (whole and ranged GETs; no listing).
    gets: u64,
    /// Listings one read makes.
    lists: u64,
}

/// Runs the log benchmark and prints its report.
pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let work = WorkDir::new(args.dir.clone())?;
    let store = Arc::new(
        LocalDirStorage::open(work.path().join("store"))
            .context("cannot open the benchmark's store")?,
    );
    eprintln!(
        "afterglow bench --logs: {} nodes × {} files for {} simulated minutes, a pass every {} s, \
         then {} pieces read back, in {}",
        args.log_nodes,
        args.log_files,
        args.log_minutes,
        args.log_interval,
        args.log_pieces,
        work.path().display()
    );
    let shipping = shipping_phase(&store, work.path(), args).await?;
    let reads = read_phase(&store, args.log_pieces, args.repeat).await?;
    let cost = logs_per_node_month(&shipping.per_node_hour);
    let report = LogReport {
        nodes: args.log_nodes,
        files_per_node: args.log_files,
        simulated_minutes: args.log_minutes,
        interval_s: args.log_interval,
        machine: Machine::this(),
        shipping,
        reads,
        cost,
    };
    print_summary(&report);
    println!("{}", super::report::pretty(&report)?);
    Ok(())
}

/// Ingest as the log ingest function does it: each batch through the store, timed.
struct StoreSink {
    storage: Arc<dyn Storage>,
    cluster: ClusterName,
    times: Mutex<Vec<Duration>>,
}

#[async_trait]
impl LogSink for StoreSink {
    async fn send(&self, batch: LogBatch<'_>) -> Result<BodyAnswer, SendError> {
        let started = Instant::now();
        let pieces = read_body(batch.body).map_err(|err| SendError::Retry(err.to_string()))?;
        let node = NodeLogs {
            cluster: self.cluster.clone(),
            session: batch.session.clone(),
            node_id: batch.node_id.clone(),
        };
        let outcomes = put_pieces(&*self.storage, &node, &pieces)
            .await
            .map_err(|err| SendError::Retry(err.to_string()))?;
        if let Ok(mut times) = self.times.lock() {
            times.push(started.elapsed());
        }
        Ok(BodyAnswer {
            pieces: pieces
                .iter()
                .zip(outcomes)
                .map(|(piece, outcome)| PieceAnswer {
                    file: piece.file.to_string(),
                    offset: piece.offset,
                    outcome,
                })
                .collect(),
        })
    }
}

/// A line of file `file` at second `second`, exactly [`LINE_BYTES`] long.
fn line(file: usize, second: u64) -> String {
    let mut text = format!("file {file:04} second {second:08} step loss=0.{second:06}");
    text.truncate(LINE_BYTES - 1);
    while text.len() < LINE_BYTES - 1 {
        text.push('.');
    }
    text.push('\n');
    text
}

async fn shipping_phase(
    store: &Arc<LocalDirStorage>,
    work: &Path,
    args: &BenchArgs,
) -> anyhow::Result<Shipping> {
    let counters = Arc::new(Counters::default());
    let sink = StoreSink {
        storage: Arc::new(CountingStorage {
            inner: Arc::clone(store) as Arc<dyn Storage>,
            counters: Arc::clone(&counters),
        }),
        cluster: ClusterName::new("bench-logs")?,
        times: Mutex::new(Vec::new()),
    };
    let mut nodes = Vec::new();
    for node in 0..args.log_nodes {
        let ray_dir = work.join(format!("node-{node}"));
        let session = ray_dir.join(SESSION);
        std::fs::create_dir_all(session.join("logs"))
            .with_context(|| format!("cannot make {}", session.display()))?;
        let node_id = format!("{node:056x}");
        std::fs::write(session.join(format!("metrics_agent_port_{node_id}")), "1")?;
        let shipper = Shipper::new(ShipSettings {
            ray_dir: ray_dir.clone(),
            node_id: None,
            state_file: ray_dir.join("afterglow-ship-logs.json"),
            body_bytes: 1024 * 1024,
        })?;
        nodes.push((session.join("logs"), shipper));
    }
    let interval = args.log_interval;
    let passes = args.log_minutes * 60 / interval;
    let mut shipped = 0_u64;
    let started = Instant::now();
    for pass in 0..passes {
        for (logs, shipper) in &mut nodes {
            for file in 0..args.log_files {
                let text: String = (0..interval)
                    .map(|second| line(file, pass * interval + second))
                    .collect();
                append(
                    &logs.join(format!("worker-{file:04}-01000000-{file}.out")),
                    &text,
                )?;
            }
            shipped += shipper.pass(&sink).await?.bytes;
        }
        if (pass + 1) % (passes / 10).max(1) == 0 {
            eprintln!(
                "  shipped {} of {passes} intervals ({:.0} s)",
                pass + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let requests = sink.times.lock().map(|times| times.len()).unwrap_or(0) as u64;
    let mut idle_pass_requests = 0;
    for (_, shipper) in &mut nodes {
        idle_pass_requests += shipper.pass(&sink).await?.requests as u64;
    }
    let storage = counters.counts();
    let stored = dir_bytes(&work.join("store/logs"));
    let node_hours =
        (args.log_nodes as f64 * args.log_minutes as f64 / 60.0).max(f64::MIN_POSITIVE);
    let mut times = sink
        .times
        .lock()
        .map(|times| times.clone())
        .unwrap_or_default();
    let store_per_request = Stats::of(&mut times);
    Ok(Shipping {
        passes,
        requests,
        idle_pass_requests,
        per_node_hour: LogRates {
            requests: requests as f64 / node_hours,
            puts: storage.puts as f64 / node_hours,
            gets: storage.gets as f64 / node_hours,
            bytes_shipped: shipped as f64 / node_hours,
            bytes_stored: stored as f64 / node_hours,
            store_ms_per_request: store_per_request.p50_ms,
        },
        stored_per_shipped: stored as f64 / (shipped as f64).max(1.0),
        storage,
        store_per_request,
    })
}

fn append(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot append to {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

async fn read_phase(
    store: &Arc<LocalDirStorage>,
    pieces: usize,
    repeat: usize,
) -> anyhow::Result<Reads> {
    let node = NodeLogs {
        cluster: ClusterName::new("bench-logs")?,
        session: SessionName::new(SESSION)?,
        node_id: NodeId::new(&"f".repeat(56))?,
    };
    let name = LogFileName::new("worker-read-01000000-1.out")?;
    let started = Instant::now();
    for piece in 0..pieces {
        let text = line(0, piece as u64);
        let one = [ReadPiece {
            file: name.clone(),
            offset: (piece * LINE_BYTES) as u64,
            bytes: text.as_bytes(),
        }];
        put_pieces(&**store, &node, &one).await?;
        if (piece + 1) % (pieces / 10).max(1) == 0 {
            eprintln!(
                "  stored {} of {pieces} one-line pieces ({:.0} s)",
                piece + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let store_s = started.elapsed().as_secs_f64();
    let file = node.file(name);
    let middle = (pieces / 2 * LINE_BYTES) as u64;
    let task_end = middle + TASK_LINES * LINE_BYTES as u64;
    let task_output = timed(store, repeat, |storage| {
        let file = file.clone();
        async move {
            let range = read_range(&*storage, &file, middle, Some(task_end), READ_LIMIT).await?;
            anyhow::ensure!(range.complete, "the task's range was not all read");
            Ok(range.bytes.len())
        }
    })
    .await?;
    let tail = timed(store, repeat, |storage| {
        let file = file.clone();
        async move {
            let tail = read_tail(&*storage, &file, TAIL_LINES, READ_LIMIT).await?;
            anyhow::ensure!(tail.complete, "the tail was not all read");
            Ok(tail.bytes.len())
        }
    })
    .await?;
    Ok(Reads {
        pieces,
        store_s,
        task_output,
        tail,
    })
}

/// Times `read` `repeat` times (after one unmeasured run), counting one run's storage requests.
async fn timed<F, Fut>(
    store: &Arc<LocalDirStorage>,
    repeat: usize,
    read: F,
) -> anyhow::Result<ReadTimes>
where
    F: Fn(Arc<dyn Storage>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<usize>>,
{
    let counters = Arc::new(Counters::default());
    let counted: Arc<dyn Storage> = Arc::new(CountingStorage {
        inner: Arc::clone(store) as Arc<dyn Storage>,
        counters: Arc::clone(&counters),
    });
    let bytes = read(Arc::clone(&counted)).await?;
    let once = counters.counts();
    let mut times = Vec::with_capacity(repeat);
    for _ in 0..repeat.max(1) {
        let started = Instant::now();
        read(Arc::clone(store) as Arc<dyn Storage>).await?;
        times.push(started.elapsed());
    }
    Ok(ReadTimes {
        warm: Stats::of(&mut times),
        bytes,
        gets: once.gets,
        lists: once.lists,
    })
}

fn print_summary(report: &LogReport) {
    let shipping = &report.shipping;
    let rates = &shipping.per_node_hour;
    eprintln!(
        "\nper node-hour: {:.0} requests, {:.0} PUTs, {:.0} GETs; {:.2} bytes stored per byte \
         shipped; an idle pass sent {} requests",
        rates.requests,
        rates.puts,
        rates.gets,
        shipping.stored_per_shipped,
        shipping.idle_pass_requests
    );
    for (what, read) in [
        ("one task's output", &report.reads.task_output),
        ("a 1 000-line tail", &report.reads.tail),
    ] {
        eprintln!(
            "{what} at {} pieces: p50 {:.2} ms, p95 {:.2} ms warm; {} storage reads, {} listings",
            report.reads.pieces, read.warm.p50_ms, read.warm.p95_ms, read.gets, read.lists
        );
    }
    eprintln!(
        "an always-busy node: ${:.2} a month, ${:.3} per GB shipped",
        report.cost.usd_per_node_month, report.cost.usd_per_gb_shipped
    );
}
