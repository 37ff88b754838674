//! `afterglow bench`: the whole pipeline over synthetic Ray traffic, measured.
//!
//! Generates `--tasks` attempts ([`synth`]), ingests every body through the ingest
//! library into a local store (timing each), compacts the raw objects in batches the size SQS
//! hands the compact function, measures the stored bytes, then times each dashboard route cold
//! (a fresh engine) and warm (p50/p95 over repeats) and the query phase's peak memory. The
//! report (typed in `report.rs`) is JSON on stdout; a readable table goes to stderr, beside
//! the targets (docs/performance.md, "Targets"). With `--sessions`, the whole history instead
//! (`history.rs`); with `--logs`, the log path (`logs.rs`).

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use shared::compact::{CompactSettings, Compactor};
use shared::ingest::{IngestAccess, IngestLimits, Ingestor};
use shared::keys::{
    ClusterName, SessionName, cluster_manifests_prefix, manifest_key, manifest_session,
};
use shared::raw::key::RAW_PREFIX;
use shared::storage::{LocalDirStorage, ObjectKey, Storage};
use shared::tables::manifest;
use synth::{Generator, SynthSettings};

use crate::generate::SynthArgs;
use crate::progress;

mod cost;
mod counting;
mod history;
mod logs;
mod report;
mod routes;
mod stats;
mod table;

use self::counting::{Counters, CountingStorage, RequestCounts};
use self::report::{
    ColumnBytes, CompactOnlyReport, CompactionReport, FoldTimes, IngestReport, Machine, Phases,
    QueryReport, Report, Settings, StorageReport,
};
use self::routes::query_phase;
use self::stats::Stats;
use self::table::print_table;

/// Flags of `afterglow bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// What to generate.
    #[command(flatten)]
    pub synth: SynthArgs,
    /// Work directory (kept afterwards); a temporary one (removed) when not given.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Warm repetitions of each route.
    #[arg(long, value_name = "R", default_value_t = 20)]
    pub repeat: usize,
    /// Raw objects per compaction run (the compact function's SQS batch size).
    #[arg(long, value_name = "N", default_value_t = shared::compact::RUN_OBJECTS)]
    pub objects_per_run: usize,
    /// Memory (MiB) compaction keeps between runs for where stored attempts are; 0 makes every
    /// run scan the stored task ids instead (for comparisons).
    #[arg(long, value_name = "MIB", default_value_t = shared::tables::stored_keys::DEFAULT_BUDGET >> 20)]
    pub stored_keys_mib: u64,
    /// Only time the routes, over the store an earlier run left in --dir.
    #[arg(long, requires = "dir", conflicts_with = "compact_only")]
    pub query_only: bool,
    /// Only time compaction again, over the raw objects an earlier run left in --dir: its
    /// tables are dropped first (as `afterglow rebuild` drops them) and the raw objects read
    /// once (the full run finds them in the page cache), then compacted as the full benchmark
    /// compacts them. Prints the compaction report alone.
    #[arg(long, requires = "dir")]
    pub compact_only: bool,
    /// With --query-only: the session to query (the only one, when not given).
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,
    /// With --query-only: fold the deltas into the base first (`afterglow compact --fold`).
    #[arg(long, requires = "query_only")]
    pub fold: bool,
    /// Reads over the whole history instead: this many sessions of --tasks attempts each, an
    /// hour apart, over --clusters clusters; times the cluster-wide and fleet-wide routes and
    /// reports the bytes each copies (with --query-only: over the sessions a run left).
    #[arg(long, value_name = "N", conflicts_with_all = ["compact_only", "session", "fold"])]
    pub sessions: Option<usize>,
    /// With --sessions: the clusters they are spread over.
    #[arg(long, value_name = "C", default_value_t = 20, requires = "sessions")]
    pub clusters: usize,
    /// The log path instead: nodes whose files print a line a second, shipped by the shipper
    /// into the store; then one file's reads. Reports requests and storage requests per
    /// node-hour, bytes stored per byte shipped, read times, and the cost per node-month.
    #[arg(long, conflicts_with_all = ["query_only", "compact_only", "sessions", "session", "fold"])]
    pub logs: bool,
    /// With --logs: nodes shipping.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub log_nodes: usize,
    /// With --logs: files growing on each node.
    #[arg(long, value_name = "M", default_value_t = 32)]
    pub log_files: usize,
    /// With --logs: seconds between the shipper's passes (its --interval).
    #[arg(long, value_name = "S", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub log_interval: u64,
    /// With --logs: simulated minutes of shipping.
    #[arg(long, value_name = "T", default_value_t = 60)]
    pub log_minutes: u64,
    /// With --logs: seconds of requests the log queue gathers into one batch for the log store
    /// function (the template's window); 0 stores each request at once, as `serve` does.
    #[arg(long, value_name = "S", default_value_t = 60)]
    pub log_batch_window: u64,
    /// With --logs: shards of the log queue (the template's LogQueueShards), each batched on
    /// its own; each node's requests go to one.
    #[arg(
        long,
        value_name = "K",
        default_value_t = 1,
        value_parser = clap::value_parser!(u64).range(1..=64)
    )]
    pub log_queue_shards: u64,
    /// With --logs: one-line requests the file read back is shipped in.
    #[arg(long, value_name = "P", default_value_t = 100_000)]
    pub log_pieces: usize,
}

/// The cluster name the synthetic traffic is filed under.
const CLUSTER: &str = "bench";

/// Runs the benchmark and prints its report.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(sessions) = args.sessions {
        return history::run(&args, sessions).await;
    }
    if args.logs {
        return logs::run(&args).await;
    }
    if args.query_only {
        return query_only(&args).await;
    }
    if args.compact_only {
        return compact_only(&args).await;
    }
    let work = WorkDir::new(args.dir.clone())?;
    let storage = Arc::new(
        LocalDirStorage::open(work.path().join("store"))
            .context("cannot open the benchmark's store")?,
    );
    let settings = args.synth.settings();
    eprintln!(
        "afterglow bench: {} attempts, {} jobs, {} nodes, seed {} in {}",
        settings.attempts,
        settings.jobs,
        settings.nodes,
        settings.seed,
        work.path().display()
    );

    let ingest_requests = Arc::new(Counters::default());
    let mut ingest = ingest_phase(counted(&storage, &ingest_requests), settings).await?;
    ingest.report.storage_requests = ingest_requests.counts();
    let compaction = measured_compaction(&storage, work.path(), &args).await?;
    let mut stored = storage_phase(&storage, &ingest.session, ingest.attempts).await?;
    stored.tables_dir_bytes = dir_bytes(&work.path().join("store/tables"));
    stored.raw_dir_bytes = dir_bytes(&work.path().join("store/raw"));
    // A process of its own, so its peak memory is the query engine's alone.
    let queries = query_in_child(work.path(), &ingest.session, args.repeat).await?;

    let cost = cost::per_million_attempts(
        ingest.attempts,
        &ingest.report,
        &compaction,
        &stored,
        &queries,
    );
    let report = Report {
        attempts: ingest.attempts,
        settings: Settings {
            jobs: args.synth.jobs,
            nodes: args.synth.nodes,
            failure_rate: args.synth.failure_rate,
            seed: args.synth.seed,
            objects_per_compaction: args.objects_per_run,
            repeat: args.repeat,
            stored_keys_mib: args.stored_keys_mib,
        },
        machine: Machine::this(),
        ingest: ingest.report,
        compaction,
        storage: stored,
        query: queries,
        cost,
    };
    print_table(&report);
    println!("{}", report::pretty(&report)?);
    Ok(())
}

/// `storage`, its requests counted in `counters`.
fn counted(storage: &Arc<LocalDirStorage>, counters: &Arc<Counters>) -> Arc<dyn Storage> {
    Arc::new(CountingStorage {
        inner: Arc::clone(storage) as Arc<dyn Storage>,
        counters: Arc::clone(counters),
    })
}

/// The compaction phase over `storage`, with its CPU time and storage requests.
async fn measured_compaction(
    storage: &Arc<LocalDirStorage>,
    work: &Path,
    args: &BenchArgs,
) -> anyhow::Result<CompactionReport> {
    let requests = Arc::new(Counters::default());
    let settings = CompactSettings {
        stored_keys_bytes: args.stored_keys_mib.saturating_mul(1 << 20),
        ..CompactSettings::default()
    };
    let cpu_before = stats::cpu_seconds();
    let mut compaction = compact_phase(
        counted(storage, &requests),
        work,
        args.objects_per_run,
        settings,
    )
    .await?;
    compaction.cpu_s = stats::cpu_seconds()
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    compaction.storage_requests = requests.counts();
    Ok(compaction)
}

/// `--compact-only`: the compaction phase again, over the raw objects an earlier run left in
/// `--dir`, its tables dropped first.
async fn compact_only(args: &BenchArgs) -> anyhow::Result<()> {
    let dir = args
        .dir
        .as_ref()
        .context("--compact-only needs --dir with the raw objects of an earlier run")?;
    let storage = Arc::new(
        LocalDirStorage::open(dir.join("store")).context("cannot open the benchmark's store")?,
    );
    let scratch = dir.join("compact-scratch");
    std::fs::create_dir_all(&scratch)
        .with_context(|| format!("cannot create {}", scratch.display()))?;
    let dropped = Compactor::new(
        Arc::clone(&storage) as Arc<dyn Storage>,
        CompactSettings::default(),
        scratch,
    )
    .drop_tables()
    .await?;
    // The full run compacts raw objects ingest has just written, from the page cache; read
    // from disk instead, the runs' reads would time the disk rather than compaction.
    let raw = storage.list(RAW_PREFIX).await?;
    anyhow::ensure!(
        !raw.is_empty(),
        "no raw objects in {}; run the full benchmark with --dir first",
        dir.display()
    );
    let bar = progress::bar(raw.len() as u64, "warm");
    for meta in &raw {
        storage.get(&meta.key).await?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    eprintln!(
        "afterglow bench: {dropped} table objects dropped, {} raw objects read once; compacting again",
        raw.len()
    );
    let compaction = measured_compaction(&storage, dir, args).await?;
    println!("{}", report::pretty(&CompactOnlyReport { compaction })?);
    Ok(())
}

/// `--query-only`: the query phase over a store an earlier run left in `--dir`.
async fn query_only(args: &BenchArgs) -> anyhow::Result<()> {
    let dir = args
        .dir
        .as_ref()
        .context("--query-only needs --dir with the store of an earlier run")?;
    let storage: Arc<dyn Storage> = Arc::new(
        LocalDirStorage::open(dir.join("store")).context("cannot open the benchmark's store")?,
    );
    let session = match &args.session {
        Some(session) => session.clone(),
        None => only_session(&storage).await?,
    };
    let mut fold = None;
    if args.fold {
        let scratch = dir.join("compact-scratch");
        std::fs::create_dir_all(&scratch)
            .with_context(|| format!("cannot create {}", scratch.display()))?;
        let compactor = Compactor::new(Arc::clone(&storage), CompactSettings::default(), scratch);
        let timer = Instant::now();
        let sessions = compactor.fold().await?;
        fold = Some(FoldTimes {
            sessions,
            wall_s: timer.elapsed().as_secs_f64(),
        });
    }
    // The fold's memory is not the query's: after one, the routes are timed in a process of
    // their own, as the full benchmark times them.
    let mut report = if args.fold {
        query_in_child(dir, &session, args.repeat).await?
    } else {
        query_phase(storage, dir, &session, args.repeat).await?
    };
    report.fold = fold;
    println!("{}", report::line(&report)?);
    Ok(())
}

/// The single session of the benchmark's cluster.
async fn only_session(storage: &Arc<dyn Storage>) -> anyhow::Result<String> {
    let prefix = cluster_manifests_prefix(&ClusterName::new(CLUSTER)?);
    let manifests = storage.list(&prefix).await?;
    let first = manifests
        .first()
        .context("no compacted session in the store; run the full benchmark first")?;
    manifest_session(&first.key)
        .map(|(_, session)| session.to_string())
        .context("unexpected manifest key")
}

/// Runs the query phase as `afterglow bench --query-only` and returns its report.
async fn query_in_child(work: &Path, session: &str, repeat: usize) -> anyhow::Result<QueryReport> {
    let exe = std::env::current_exe().context("cannot find the afterglow binary")?;
    let output = tokio::process::Command::new(exe)
        // The query phase runs as the query function does: `MALLOC_CONF`, which template.yaml
        // sets for the compact function alone, is compaction's (docs/performance.md).
        .env_remove("MALLOC_CONF")
        .arg("bench")
        .arg("--query-only")
        .arg("--dir")
        .arg(work)
        .arg("--session")
        .arg(session)
        .arg("--repeat")
        .arg(repeat.to_string())
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .context("cannot run the query phase")?;
    anyhow::ensure!(
        output.status.success(),
        "the query phase failed ({})",
        output.status
    );
    serde_json::from_slice(&output.stdout).context("the query phase printed no JSON report")
}

/// The benchmark's directory: the one given (kept), or a temporary one (removed).
struct WorkDir {
    path: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl WorkDir {
    fn new(dir: Option<PathBuf>) -> anyhow::Result<Self> {
        match dir {
            Some(path) => {
                std::fs::create_dir_all(&path)
                    .with_context(|| format!("cannot create {}", path.display()))?;
                Ok(Self { path, _temp: None })
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("afterglow-bench-")
                    .tempdir()
                    .context("cannot create a temporary directory (set TMPDIR or --dir)")?;
                Ok(Self {
                    path: temp.path().to_path_buf(),
                    _temp: Some(temp),
                })
            }
        }
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// What ingest measured, and what the later phases need of the traffic.
struct IngestOutcome {
    report: IngestReport,
    session: String,
    attempts: u64,
}

/// Generates on a thread of its own and ingests each body as the HTTP handler would.
async fn ingest_phase(
    storage: Arc<dyn Storage>,
    settings: SynthSettings,
) -> anyhow::Result<IngestOutcome> {
    let cluster = ClusterName::new(CLUSTER)?;
    let ingestor = Ingestor::new(storage, IngestAccess::Open, IngestLimits::default());
    let (sender, mut receiver) = tokio::sync::mpsc::channel(32);
    let expected = settings.attempts;
    let generator = std::thread::spawn(move || {
        let mut generator = Generator::new(settings);
        for body in generator.by_ref() {
            if sender.blocking_send(body).is_err() {
                break;
            }
        }
        generator.truth().clone()
    });
    let bar = progress::bar(expected, "ingest");
    let started = Instant::now();
    let mut latencies = Vec::new();
    let (mut bytes_in, mut bytes_stored, mut events) = (0u64, 0u64, 0u64);
    while let Some(body) = receiver.recv().await {
        let body = body?;
        let timer = Instant::now();
        let receipt = ingestor.ingest(&cluster, &body.json).await?;
        latencies.push(timer.elapsed());
        bytes_in += body.json.len() as u64;
        bytes_stored += receipt.stored_bytes as u64;
        events += receipt.events as u64;
        // Roughly four events per attempt; the bar only needs to move.
        bar.inc((body.events as u64 / 4).min(expected.saturating_sub(bar.position())));
    }
    let wall = started.elapsed();
    bar.finish_and_clear();
    let truth = generator
        .join()
        .map_err(|_| anyhow::anyhow!("the generator thread panicked"))?;
    let per_body = Stats::of(&mut latencies);
    Ok(IngestOutcome {
        session: truth.session_name.clone(),
        attempts: truth.attempts,
        report: IngestReport {
            bodies: truth.bodies,
            redelivered_bodies: truth.redeliveries,
            events,
            request_bytes: bytes_in,
            stored_bytes: bytes_stored,
            per_body_ms: per_body,
            mean_events_per_body: events as f64 / truth.bodies.max(1) as f64,
            wall_s: wall.as_secs_f64(),
            truth,
            // Counted by the caller, around the phase.
            storage_requests: RequestCounts::default(),
        },
    })
}

/// Compacts every raw object, `per_run` objects per run (what one SQS batch hands Lambda).
async fn compact_phase(
    storage: Arc<dyn Storage>,
    work: &Path,
    per_run: usize,
    settings: CompactSettings,
) -> anyhow::Result<CompactionReport> {
    let scratch = work.join("compact-scratch");
    std::fs::create_dir_all(&scratch)
        .with_context(|| format!("cannot create {}", scratch.display()))?;
    let compactor = Compactor::new(storage, settings, scratch);
    let keys: Vec<ObjectKey> = compactor.raw_keys().await?;
    let per_run = NonZeroUsize::new(per_run).context("--objects-per-run must be at least 1")?;
    let bar = progress::bar(keys.len() as u64, "compact");
    let started = Instant::now();
    let mut runs = Vec::new();
    let mut run_started = started;
    let in_runs = compactor
        .compact_in_runs(&keys, per_run, |objects| {
            runs.push(run_started.elapsed());
            run_started = Instant::now();
            bar.inc(objects as u64);
        })
        .await;
    let wall = started.elapsed();
    bar.finish_and_clear();
    if let Some(run) = in_runs.failed_runs.first() {
        anyhow::bail!(
            "a run of {} raw objects failed: {}",
            run.keys.len(),
            run.error
        );
    }
    let outcome = in_runs.outcome;
    if let Some((key, err)) = outcome.unreadable.first() {
        anyhow::bail!("raw object {key} unreadable: {err}");
    }
    if let Some(failed) = outcome.failed.first() {
        anyhow::bail!("session {} not compacted: {}", failed.session, failed.error);
    }
    let report = outcome.report;
    let took = report.took;
    let (events, duplicates) = (report.events as u64, report.duplicates as u64);
    let rows = report.rows_written;
    let parsed = events + duplicates;
    let phases = [took.read, took.locate, took.delta, took.rollup, took.fold];
    let other = wall.saturating_sub(phases.iter().sum());
    Ok(CompactionReport {
        raw_objects: keys.len(),
        runs: runs.len(),
        events,
        duplicates_dropped: duplicates,
        rows_written: rows,
        wall_s: wall.as_secs_f64(),
        events_per_s: parsed as f64 / wall.as_secs_f64().max(1e-9),
        per_run_ms: Stats::of(&mut runs),
        phases_s: Phases {
            read: took.read.as_secs_f64(),
            locate: took.locate.as_secs_f64(),
            delta: took.delta.as_secs_f64(),
            rollup: took.rollup.as_secs_f64(),
            fold: took.fold.as_secs_f64(),
            other: other.as_secs_f64(),
        },
        stored_keys_read: compactor.stored_keys().rows_read(),
        // Measured by the caller, around the phase.
        cpu_s: None,
        storage_requests: RequestCounts::default(),
    })
}

/// Live `task_attempts` bytes (the manifest's data files and their key indexes), per attempt,
/// with and without the error text.
async fn storage_phase(
    storage: &Arc<LocalDirStorage>,
    session: &str,
    attempts: u64,
) -> anyhow::Result<StorageReport> {
    let cluster = ClusterName::new(CLUSTER)?;
    let key = manifest_key(&cluster, &SessionName::new(session)?)?;
    let current = manifest::load(&**storage as &dyn Storage, &key).await?;
    let live = &current.manifest;
    let files: Vec<PathBuf> = live
        .task_attempts
        .all()
        .map(|file| storage.root().join(file.key.as_str()))
        .collect();
    // Key indexes are part of what an attempt costs to keep (the manifest records only the
    // data files' sizes).
    let mut key_index_bytes = 0;
    for key in live
        .task_attempts
        .all()
        .filter_map(|file| file.key_index.as_ref())
    {
        key_index_bytes += tokio::fs::metadata(storage.root().join(key.as_str()))
            .await
            .with_context(|| format!("key index {key}"))?
            .len();
    }
    let attempt_bytes: u64 =
        live.task_attempts.all().map(|file| file.bytes).sum::<u64>() + key_index_bytes;
    let entity_bytes: u64 = live.entities.values().map(|file| file.bytes).sum();
    let columns = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<(String, u64)>> {
        let connection = shared::tables::open_duckdb()?;
        Ok(shared::tables::task_attempts::column_bytes(
            &connection,
            &files,
        )?)
    })
    .await??;
    let error_columns = ["error_message", "reported_error_message"];
    let error_bytes: u64 = columns
        .iter()
        .filter(|(column, _)| error_columns.contains(&column.as_str()))
        .map(|(_, bytes)| bytes)
        .sum();
    let column_total: u64 = columns.iter().map(|(_, bytes)| bytes).sum();
    let per = |bytes: u64| bytes as f64 / attempts.max(1) as f64;
    Ok(StorageReport {
        task_attempt_files: live.task_attempts.all().count(),
        task_attempt_bytes: attempt_bytes,
        entity_bytes,
        bytes_per_attempt: per(attempt_bytes),
        bytes_per_attempt_without_error_text: per(
            (column_total + key_index_bytes).saturating_sub(error_bytes)
        ),
        key_index_bytes_per_attempt: per(key_index_bytes),
        largest_columns_bytes_per_attempt: columns
            .iter()
            .take(12)
            .map(|(column, bytes)| ColumnBytes {
                column: column.clone(),
                bytes_per_attempt: per(*bytes),
            })
            .collect(),
        // Measured by the caller, over the store's directories.
        tables_dir_bytes: 0,
        raw_dir_bytes: 0,
    })
}

/// Bytes of every file under `dir` (retired files still waiting out their grace included).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => dir_bytes(&entry.path()),
            Ok(_) => entry.metadata().map_or(0, |meta| meta.len()),
            Err(_) => 0,
        })
        .sum()
}
