//! `afterglow bench --logs`: the log path, measured. `--log-nodes` nodes, each with
//! `--log-files` files printing a 100-byte line a second, are shipped for `--log-minutes` by the
//! shipper itself (a pass every `--log-interval`, 5 s as the shipper's default) into the store
//! itself, over a local folder that counts its requests, through the log queue's
//! `--log-queue-shards` shards as Lambda's SQS sources batch them; then one file of
//! `--log-pieces` one-line requests is read back: one task's output and a 1 000-line tail,
//! timed warm. The report gives requests and storage requests per node-hour, bytes stored per
//! byte shipped, the reads' times and storage requests, and what an always-busy node costs per
//! month and per GB shipped.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_trait::async_trait;
use serde::Serialize;
use shared::keys::{ClusterName, LogFileName, NodeId, NodeLogs, SessionName};
use shared::logs::frames::{BodyAnswer, PieceAnswer, read_body};
use shared::logs::queue::drain::{DrainLimits, Received, store_batch};
use shared::logs::queue::route::queue_or_store;
use shared::logs::queue::shard::shard_of;
use shared::logs::queue::{LogQueue, QueueError};
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
/// Most messages in one batch of Lambda's SQS source.
const BATCH_MESSAGES: usize = 10_000;
/// Most bytes of one batch: Lambda's payload limit.
const BATCH_BYTES: usize = 6 * 1024 * 1024;
/// Bytes Lambda's SQS event adds to each message in a batch, about: its id, receipt handle
/// (a few hundred bytes), attributes, checksum, and the queue's ARN and region.
const RECORD_BYTES: usize = 900;
/// The session every simulated node runs.
const SESSION: &str = "session_2026-12-01_00-00-00_000000_1";

/// The report of a log run (JSON on stdout).
#[derive(Debug, Serialize)]
struct LogReport {
    nodes: usize,
    files_per_node: usize,
    simulated_minutes: u64,
    interval_s: u64,
    queue_shards: u64,
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
    /// Seconds of requests a batch of the log queue gathers (0: no queue).
    batch_window_s: u64,
    /// Batches the log store function stored.
    batches: u64,
    /// Requests queued (the others were stored at once).
    queued_messages: u64,
    /// Mean size of a queued message (bytes).
    mean_message_bytes: f64,
    /// Busy nodes all shards' batches of a window hold before Lambda's 6 MB payload closes
    /// them early (and each node's requests are spread over more batches).
    nodes_before_batches_close_early: Option<u64>,
    /// Storage requests of the log ingest function, all nodes together.
    ingest_storage: RequestCounts,
    /// Storage requests of the log store function.
    log_store_storage: RequestCounts,
    /// Per node-hour.
    per_node_hour: LogRates,
    /// Bytes stored per byte shipped.
    stored_per_shipped: f64,
    /// Time ingest took per request (local disk).
    ingest_per_request: Stats,
    /// Time the log store took per batch (local disk).
    store_per_batch: Stats,
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
         {} log queue shards, then {} pieces read back, in {}",
        args.log_nodes,
        args.log_files,
        args.log_minutes,
        args.log_interval,
        args.log_queue_shards,
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
        queue_shards: args.log_queue_shards,
        machine: Machine::this(),
        shipping,
        reads,
        cost,
    };
    print_summary(&report);
    println!("{}", super::report::pretty(&report)?);
    Ok(())
}

/// The log queue as the bench plays it: the messages ingest sent to each shard, until the
/// shard's next batch takes them.
#[derive(Debug)]
struct MemoryQueue {
    shards: Vec<Mutex<Vec<String>>>,
}

#[async_trait]
impl LogQueue for MemoryQueue {
    async fn send(&self, node: &NodeLogs, message: String) -> Result<(), QueueError> {
        let shard = shard_of(&node.prefix(), self.shards.len());
        if let Ok(mut messages) = self.shards[shard].lock() {
            messages.push(message);
        }
        Ok(())
    }
}

impl MemoryQueue {
    fn new(shards: u64) -> Self {
        Self {
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
        }
    }

    /// What each shard holds, taken off it.
    fn take(&self) -> Vec<Vec<String>> {
        self.shards
            .iter()
            .map(|shard| {
                shard
                    .lock()
                    .map(|mut messages| std::mem::take(&mut *messages))
                    .unwrap_or_default()
            })
            .collect()
    }
}

/// Ingest as the log ingest function does it: each batch through the queue (or, with no
/// queue, the store), timed.
struct IngestSink {
    storage: Arc<dyn Storage>,
    queue: Option<Arc<MemoryQueue>>,
    cluster: ClusterName,
    /// The simulated time, for the messages' order.
    now_ms: AtomicU64,
    times: Mutex<Vec<Duration>>,
}

#[async_trait]
impl LogSink for IngestSink {
    async fn send(&self, batch: LogBatch<'_>) -> Result<BodyAnswer, SendError> {
        let started = Instant::now();
        let pieces = read_body(batch.body).map_err(|err| SendError::Retry(err.to_string()))?;
        let node = NodeLogs {
            cluster: self.cluster.clone(),
            session: batch.session.clone(),
            node_id: batch.node_id.clone(),
        };
        let outcomes = match &self.queue {
            Some(queue) => {
                let sent_ms = self.now_ms.load(Ordering::Relaxed);
                queue_or_store(&*self.storage, &**queue, &node, &pieces, sent_ms).await
            }
            None => put_pieces(&*self.storage, &node, &pieces).await,
        }
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

/// What the log store function did with the queue's batches.
#[derive(Debug, Default)]
struct Draining {
    batches: u64,
    messages: u64,
    message_bytes: u64,
    /// SQS requests: each message sent, and the receives and deletes of ten at a time.
    sqs_requests: u64,
    times: Vec<Duration>,
}

impl Draining {
    /// Stores everything queued, each shard in batches as its Lambda SQS source closes them:
    /// at [`BATCH_MESSAGES`] messages or [`BATCH_BYTES`] bytes.
    async fn drain(&mut self, queue: &MemoryQueue, storage: &dyn Storage) -> anyhow::Result<()> {
        for messages in queue.take() {
            let mut batch: Vec<&str> = Vec::new();
            let mut bytes = 0;
            for message in &messages {
                let size = message.len() + RECORD_BYTES;
                if batch.len() == BATCH_MESSAGES || bytes + size > BATCH_BYTES {
                    self.store(&batch, storage).await?;
                    (batch, bytes) = (Vec::new(), 0);
                }
                bytes += size;
                batch.push(message);
            }
            if !batch.is_empty() {
                self.store(&batch, storage).await?;
            }
        }
        Ok(())
    }

    async fn store(&mut self, batch: &[&str], storage: &dyn Storage) -> anyhow::Result<()> {
        let ids: Vec<String> = (0..batch.len()).map(|at| at.to_string()).collect();
        let received: Vec<Received<'_>> = ids
            .iter()
            .zip(batch)
            .map(|(id, body)| Received { id, body })
            .collect();
        let started = Instant::now();
        let drained = store_batch(storage, &received, DrainLimits::default()).await;
        self.times.push(started.elapsed());
        anyhow::ensure!(
            drained.redeliver.is_empty() && drained.refused == 0,
            "the log store did not store a batch: {drained:?}"
        );
        let count = batch.len() as u64;
        self.batches += 1;
        self.messages += count;
        self.message_bytes += batch.iter().map(|body| body.len() as u64).sum::<u64>();
        self.sqs_requests += count + 2 * count.div_ceil(10);
        Ok(())
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
    let counted = |counters: &Arc<Counters>| -> Arc<dyn Storage> {
        Arc::new(CountingStorage {
            inner: Arc::clone(store) as Arc<dyn Storage>,
            counters: Arc::clone(counters),
        })
    };
    let (ingest_counters, store_counters) =
        (Arc::new(Counters::default()), Arc::new(Counters::default()));
    let queue =
        (args.log_batch_window > 0).then(|| Arc::new(MemoryQueue::new(args.log_queue_shards)));
    let sink = IngestSink {
        storage: counted(&ingest_counters),
        queue: queue.clone(),
        cluster: ClusterName::new("bench-logs")?,
        now_ms: AtomicU64::new(0),
        times: Mutex::new(Vec::new()),
    };
    let log_store = counted(&store_counters);
    let mut draining = Draining::default();
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
        let seconds = pass * interval;
        sink.now_ms.store(seconds * 1000, Ordering::Relaxed);
        for (logs, shipper) in &mut nodes {
            for file in 0..args.log_files {
                let text: String = (0..interval)
                    .map(|second| line(file, seconds + second))
                    .collect();
                append(&logs.join(file_name(file)), &text)?;
            }
            shipped += shipper.pass(&sink).await?.bytes;
        }
        if let Some(queue) = &queue
            && (seconds + interval) % args.log_batch_window < interval
        {
            draining.drain(queue, &*log_store).await?;
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
    if let Some(queue) = &queue {
        draining.drain(queue, &*log_store).await?;
    }
    check_stored(store, &nodes[..nodes.len().min(1)], args.log_files).await?;
    let ingest = ingest_counters.counts();
    let stored_by_batches = store_counters.counts();
    let stored = dir_bytes(&work.join("store/logs"));
    let node_hours =
        (args.log_nodes as f64 * args.log_minutes as f64 / 60.0).max(f64::MIN_POSITIVE);
    let mut times = sink
        .times
        .lock()
        .map(|times| times.clone())
        .unwrap_or_default();
    let ingest_per_request = Stats::of(&mut times);
    let store_per_batch = Stats::of(&mut draining.times);
    let per_hour = |count: u64| count as f64 / node_hours;
    let mean_message_bytes = draining.message_bytes as f64 / (draining.messages as f64).max(1.0);
    let per_node_hour = LogRates {
        requests: per_hour(requests),
        ingest_puts: per_hour(ingest.puts),
        ingest_gets: per_hour(ingest.gets),
        queue_sends: per_hour(draining.messages),
        store_batches: per_hour(draining.batches),
        store_puts: per_hour(stored_by_batches.puts),
        store_gets: per_hour(stored_by_batches.gets),
        sqs_requests: per_hour(draining.sqs_requests),
        bytes_shipped: per_hour(shipped),
        bytes_stored: per_hour(stored),
        ingest_ms_per_request: ingest_per_request.p50_ms,
        store_ms_per_batch: store_per_batch.p50_ms,
    };
    Ok(Shipping {
        passes,
        requests,
        idle_pass_requests,
        batch_window_s: args.log_batch_window,
        batches: draining.batches,
        queued_messages: draining.messages,
        mean_message_bytes,
        nodes_before_batches_close_early: (args.log_batch_window > 0).then(|| {
            let per_node_window = (mean_message_bytes + RECORD_BYTES as f64)
                * args.log_batch_window as f64
                / interval as f64;
            (BATCH_BYTES as f64 / per_node_window.max(1.0)).floor() as u64 * args.log_queue_shards
        }),
        ingest_storage: ingest,
        log_store_storage: stored_by_batches,
        per_node_hour,
        stored_per_shipped: stored as f64 / (shipped as f64).max(1.0),
        ingest_per_request,
        store_per_batch,
    })
}

/// The name of file `file` on every simulated node.
fn file_name(file: usize) -> String {
    format!("worker-{file:04}-01000000-{file}.out")
}

/// Every file of the first simulated node reads back as it was written, so the numbers are
/// those of a store that works.
async fn check_stored(
    store: &Arc<LocalDirStorage>,
    nodes: &[(std::path::PathBuf, Shipper)],
    files: usize,
) -> anyhow::Result<()> {
    for (node, (logs, _)) in nodes.iter().enumerate() {
        let node = NodeLogs {
            cluster: ClusterName::new("bench-logs")?,
            session: SessionName::new(SESSION)?,
            node_id: NodeId::new(&format!("{node:056x}"))?,
        };
        for file in 0..files {
            let name = file_name(file);
            let written = std::fs::read(logs.join(&name))?;
            let stored = read_range(
                &**store,
                &node.file(LogFileName::new(&name)?),
                0,
                None,
                written.len() + 1,
            )
            .await?;
            anyhow::ensure!(
                stored.complete && stored.bytes == written,
                "{name} was not stored as written ({} of {} bytes)",
                stored.bytes.len(),
                written.len()
            );
        }
    }
    Ok(())
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
        "\nper node-hour: {:.0} requests, {:.0} queued; {:.0} PUTs, {:.0} GETs (ingest and the log \
         store); {:.2} bytes stored per byte shipped; an idle pass sent {} requests",
        rates.requests,
        rates.queue_sends,
        rates.ingest_puts + rates.store_puts,
        rates.ingest_gets + rates.store_gets,
        shipping.stored_per_shipped,
        shipping.idle_pass_requests
    );
    if let Some(nodes) = shipping.nodes_before_batches_close_early {
        eprintln!(
            "{} batches of a {} s window; past {nodes} busy nodes a batch closes before its window",
            shipping.batches, shipping.batch_window_s
        );
    }
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
