//! The report `afterglow bench` prints as JSON: one typed struct per section, so that every
//! reader of a measure (the table on stderr, the cost model) names a field the compiler checks.
//! The field names are the JSON's keys, which scripts read (`infra/smoke-bootstrap`) and
//! docs/performance.md quotes: renaming one is a change to the report's format.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use synth::Truth;

use super::cost::Cost;
use super::counting::RequestCounts;
use super::stats::Stats;

/// The full benchmark's report.
#[derive(Debug, Serialize)]
pub(super) struct Report {
    /// Task attempts generated.
    pub(super) attempts: u64,
    /// The flags the run was made with.
    pub(super) settings: Settings,
    /// Where it ran.
    pub(super) machine: Machine,
    /// The ingest phase.
    pub(super) ingest: IngestReport,
    /// The compaction phase.
    pub(super) compaction: CompactionReport,
    /// What the tables take.
    pub(super) storage: StorageReport,
    /// The query phase, measured in a process of its own.
    pub(super) query: QueryReport,
    /// The AWS cost these measures come to.
    pub(super) cost: Cost,
}

/// The flags a run was made with.
#[derive(Debug, Serialize)]
pub(super) struct Settings {
    /// Jobs (drivers).
    pub(super) jobs: u32,
    /// Nodes, each sending its own bodies.
    pub(super) nodes: u32,
    /// Share of tasks whose first attempt fails.
    pub(super) failure_rate: f64,
    /// The generator's seed.
    pub(super) seed: u64,
    /// Raw objects per compaction run (`--objects-per-run`).
    pub(super) objects_per_compaction: usize,
    /// Warm repetitions of each route.
    pub(super) repeat: usize,
    /// Memory compaction keeps between runs for where stored attempts are.
    pub(super) stored_keys_mib: u64,
}

/// The machine and build a run was measured on.
#[derive(Debug, Serialize)]
pub(super) struct Machine {
    /// Cores this process may use.
    pub(super) cpus: usize,
    /// `std::env::consts::OS`.
    pub(super) os: &'static str,
    /// `std::env::consts::ARCH`.
    pub(super) arch: &'static str,
    /// `release` or `debug`.
    pub(super) build: &'static str,
}

impl Machine {
    /// This process's machine and build.
    pub(super) fn this() -> Self {
        Self {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            os: std::env::consts::OS,
            arch: std::env::consts::ARCH,
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
        }
    }
}

/// What ingesting every body measured.
#[derive(Debug, Serialize)]
pub(super) struct IngestReport {
    /// Bodies ingested, re-deliveries included.
    pub(super) bodies: u64,
    /// Bodies delivered a second time.
    pub(super) redelivered_bodies: u64,
    /// Events stored.
    pub(super) events: u64,
    /// Bytes of the bodies as POSTed.
    pub(super) request_bytes: u64,
    /// Compressed bytes of the raw objects written.
    pub(super) stored_bytes: u64,
    /// Time to ingest one body.
    pub(super) per_body_ms: Stats,
    /// Events per body, on average.
    pub(super) mean_events_per_body: f64,
    /// The phase's wall time.
    pub(super) wall_s: f64,
    /// What the generator sent.
    pub(super) truth: Truth,
    /// The storage requests ingest made.
    pub(super) storage_requests: RequestCounts,
}

/// What compacting every raw object measured.
#[derive(Debug, Serialize)]
pub(super) struct CompactionReport {
    /// Raw objects compacted.
    pub(super) raw_objects: usize,
    /// Runs they were compacted in.
    pub(super) runs: usize,
    /// Events kept.
    pub(super) events: u64,
    /// Re-delivered events dropped.
    pub(super) duplicates_dropped: u64,
    /// Table rows written, folds' bases included.
    pub(super) rows_written: u64,
    /// The phase's wall time.
    pub(super) wall_s: f64,
    /// Events parsed (kept and dropped) per second of wall time.
    pub(super) events_per_s: f64,
    /// Time per run.
    pub(super) per_run_ms: Stats,
    /// Where the runs' wall time went.
    pub(super) phases_s: Phases,
    /// Stored task ids compaction read to find stored versions.
    pub(super) stored_keys_read: u64,
    /// CPU seconds the phase used; `None` where `/proc/self/stat` cannot be read. Set by the
    /// caller that measures around the phase.
    pub(super) cpu_s: Option<f64>,
    /// The storage requests compaction made. Set by the caller that counts them.
    pub(super) storage_requests: RequestCounts,
}

/// Wall clock summed over the runs, by phase (seconds). `other` is the rest of the runs
/// (fetching stored files, writing key indexes, storing the runs' files and manifests,
/// collecting orphans); a fold's own fetching and storing is in `fold`.
#[derive(Debug, Serialize)]
pub(super) struct Phases {
    /// Fetching and parsing the raw objects, their events taken into each session's attempts.
    pub(super) read: f64,
    /// Finding the stored versions of the attempts merged and reading them.
    pub(super) locate: f64,
    /// Merging the attempts with their stored versions and writing the deltas.
    pub(super) delta: f64,
    /// Counting the deltas' rollups.
    pub(super) rollup: f64,
    /// Folding deltas into new bases, all of it.
    pub(super) fold: f64,
    /// The rest.
    pub(super) other: f64,
}

/// What the live `task_attempts` files take, per attempt.
#[derive(Debug, Serialize)]
pub(super) struct StorageReport {
    /// Data files in the session's manifest.
    pub(super) task_attempt_files: usize,
    /// Their bytes and their key indexes'.
    pub(super) task_attempt_bytes: u64,
    /// Bytes of the entity tables (jobs, actors, nodes, …).
    pub(super) entity_bytes: u64,
    /// `task_attempt_bytes` per attempt.
    pub(super) bytes_per_attempt: f64,
    /// The same without the error text columns.
    pub(super) bytes_per_attempt_without_error_text: f64,
    /// The key indexes' share.
    pub(super) key_index_bytes_per_attempt: f64,
    /// The largest columns, largest first.
    pub(super) largest_columns_bytes_per_attempt: Vec<ColumnBytes>,
    /// Every file under `tables/`, retired files still waiting out their grace included.
    pub(super) tables_dir_bytes: u64,
    /// Every file under `raw/`.
    pub(super) raw_dir_bytes: u64,
}

/// One column's share of an attempt.
#[derive(Debug, Serialize)]
pub(super) struct ColumnBytes {
    /// The column.
    pub(super) column: String,
    /// Its bytes per attempt.
    pub(super) bytes_per_attempt: f64,
}

/// What timing the dashboard routes measured. The query phase runs as a child process
/// (`--query-only`) and prints this; the full run reads it back.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct QueryReport {
    /// Each route's times, by probe name.
    pub(super) routes: BTreeMap<String, RouteTimes>,
    /// Resident memory once the engine was open (MiB).
    pub(super) rss_before_mib: Option<f64>,
    /// Peak resident memory of the process (MiB).
    pub(super) peak_rss_mib: Option<f64>,
    /// What the peak covers.
    pub(super) peak_rss_note: String,
    /// The fold `--query-only --fold` made first; `None` without `--fold`.
    pub(super) fold: Option<FoldTimes>,
}

/// One route's times.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct RouteTimes {
    /// The first answer of a fresh engine.
    pub(super) cold_ms: f64,
    /// The repeated answers of a warm engine.
    pub(super) warm: Stats,
    /// Whether every warm answer came from rollups rather than a scan.
    pub(super) from_rollups: bool,
}

/// The fold made before timing the routes.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct FoldTimes {
    /// Sessions folded.
    pub(super) sessions: usize,
    /// Its wall time.
    pub(super) wall_s: f64,
}

/// What `--compact-only` prints.
#[derive(Debug, Serialize)]
pub(super) struct CompactOnlyReport {
    /// The compaction phase.
    pub(super) compaction: CompactionReport,
}

/// `report` as pretty JSON, its keys sorted at every level. The report is printed through a
/// [`serde_json::Value`], whose maps keep their keys sorted, so that two reports compare line
/// by line whatever order the structs declare their fields in.
pub(super) fn pretty(report: &impl Serialize) -> serde_json::Result<String> {
    serde_json::to_string_pretty(&serde_json::to_value(report)?)
}

/// `report` as one line of JSON, its keys sorted as [`pretty`] sorts them.
pub(super) fn line(report: &impl Serialize) -> serde_json::Result<String> {
    serde_json::to_string(&serde_json::to_value(report)?)
}
