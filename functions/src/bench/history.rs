//! `afterglow bench --sessions N`: reads over the whole history. Generates `N` sessions of
//! `--tasks` attempts each, an hour apart, spread over `--clusters` clusters, ingests and
//! compacts them, rolls up each cluster's ended sessions, then times the cluster-wide and
//! fleet-wide routes cold (a fresh engine and cache) and warm, with the bytes each cold request
//! copied into the query cache. The store is read as the query function reads S3: every file
//! copied into its cache, none in place.
//!
//! Every cold ask runs in a process that has answered once before, as the single-session
//! benchmark's cold engine does: the process's own first answer also pays the first use of
//! DuckDB's code and ours, once per process (a new Lambda container), and is reported apart
//! (`first_answer_ms`) rather than charged to whichever probe happens to come first.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;
use shared::compact::{CompactSettings, Compactor};
use shared::ingest::{IngestAccess, IngestLimits, Ingestor};
use shared::keys::ClusterName;
use shared::query::{ApiRoute, COPY_BUDGET_BYTES, QueryEngine, QueryError, QuerySettings};
use shared::storage::{
    ETag, LocalDirStorage, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject,
};
use synth::Generator;

use super::report::Machine;
use super::stats::{Stats, ms};
use super::{BenchArgs, WorkDir, compact_phase, dir_bytes};
use crate::progress;

/// Time between the starts of consecutive sessions.
const SESSION_GAP_MS: i64 = 3_600_000;

/// The report of a history run (JSON on stdout).
#[derive(Debug, Serialize)]
struct HistoryReport {
    sessions: usize,
    clusters: usize,
    attempts_per_session: u64,
    attempts: u64,
    machine: Machine,
    /// Generating and ingesting every session.
    ingest_s: f64,
    /// Compacting every raw object.
    compaction_s: f64,
    /// Rolling up every cluster, as the compact function does once a session has ended.
    roll_up_s: f64,
    /// Sessions the clusters' rollups count (every session but each cluster's newest).
    rolled_up_sessions: usize,
    tables_dir_bytes: u64,
    /// Most bytes one request may copy.
    copy_budget_bytes: u64,
    /// The process's first answer (a cluster's summary, from a fresh engine and cache): a cold
    /// ask plus the first use of the code, which a new query function container pays once.
    first_answer_ms: f64,
    probes: Vec<ProbeTimes>,
}

/// One route over one scope.
#[derive(Debug, Serialize)]
struct ProbeTimes {
    name: String,
    /// The first ask of a fresh engine and empty cache (in a process that has answered before).
    cold_ms: f64,
    /// Bytes the cold ask copied into the cache.
    copied_bytes: u64,
    /// Later asks of the same engine; `None` when refused.
    warm: Option<Stats>,
    /// The 400 it answered, when its scope is wider than the copy budget.
    refused: Option<String>,
}

/// The cluster session `index` belongs to.
fn cluster_of(index: usize, clusters: usize) -> String {
    format!("bench-{:02}", index % clusters.max(1))
}

/// Runs the history benchmark and prints its report.
pub(super) async fn run(args: &BenchArgs, sessions: usize) -> anyhow::Result<()> {
    let clusters = args.clusters.max(1);
    let work = WorkDir::new(args.dir.clone())?;
    let storage = Arc::new(
        LocalDirStorage::open(work.path().join("store"))
            .context("cannot open the benchmark's store")?,
    );
    let settings = args.synth.settings();
    let (mut ingest_s, mut compaction_s, mut roll_up_s) = (0.0, 0.0, 0.0);
    let mut rolled_up_sessions = 0;
    if !args.query_only {
        eprintln!(
            "afterglow bench: {sessions} sessions of {} attempts over {clusters} clusters in {}",
            settings.attempts,
            work.path().display()
        );
        let started = Instant::now();
        let ingestor = Ingestor::new(
            Arc::clone(&storage) as Arc<dyn Storage>,
            IngestAccess::Open,
            IngestLimits {
                // Months of sessions arrive in minutes here; a live cluster starts one at a time.
                new_sessions_per_minute: usize::MAX,
                ..IngestLimits::default()
            },
        );
        let bar = progress::bar(sessions as u64, "ingest");
        for index in 0..sessions {
            let cluster = ClusterName::new(&cluster_of(index, clusters))?;
            let offset = i64::try_from(index).context("too many sessions")?;
            let mut generator = Generator::new(synth::SynthSettings {
                seed: settings.seed + index as u64,
                start_ms: synth::START_MS + offset * SESSION_GAP_MS,
                ..settings.clone()
            });
            for body in generator.by_ref() {
                ingestor.ingest(&cluster, &body?.json).await?;
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
        ingest_s = started.elapsed().as_secs_f64();
        let compaction = compact_phase(
            Arc::clone(&storage) as Arc<dyn Storage>,
            work.path(),
            args.objects_per_run,
            CompactSettings::default(),
        )
        .await?;
        compaction_s = compaction.wall_s;
        (roll_up_s, rolled_up_sessions) = roll_up_phase(&storage, work.path(), clusters).await?;
    }
    let copied: Arc<dyn Storage> = Arc::new(Copied(Arc::clone(&storage) as Arc<dyn Storage>));
    let first_answer_ms = first_answer(&copied, work.path(), clusters).await?;
    let probes = query_phase(&copied, work.path(), sessions, clusters, args.repeat).await?;
    let report = HistoryReport {
        sessions,
        clusters,
        attempts_per_session: settings.attempts,
        attempts: settings.attempts * sessions as u64,
        machine: Machine::this(),
        ingest_s,
        compaction_s,
        roll_up_s,
        rolled_up_sessions,
        tables_dir_bytes: dir_bytes(&work.path().join("store/tables")),
        copy_budget_bytes: COPY_BUDGET_BYTES,
        first_answer_ms,
        probes,
    };
    print_table(&report);
    println!("{}", super::report::pretty(&report)?);
    Ok(())
}

/// Rolls up every cluster, as the compact function's quiet checks do once a newer session has
/// ended a cluster's earlier ones; returns the seconds it took and the sessions the clusters'
/// rollups count.
async fn roll_up_phase(
    storage: &Arc<LocalDirStorage>,
    work: &Path,
    clusters: usize,
) -> anyhow::Result<(f64, usize)> {
    let scratch = fresh_dir(&work.join("roll-up-scratch"))?;
    let compactor = Compactor::new(
        Arc::clone(storage) as Arc<dyn Storage>,
        CompactSettings::default(),
        scratch,
    );
    let started = Instant::now();
    let mut counted = 0;
    for index in 0..clusters {
        let cluster = ClusterName::new(&cluster_of(index, clusters))?;
        counted += compactor.roll_up_cluster(&cluster).await?.sessions;
    }
    Ok((started.elapsed().as_secs_f64(), counted))
}

/// Times the process's first answer: the summary of a cluster the probes do not read (the
/// second, when there are two), from a fresh engine and cache over `copied`.
async fn first_answer(
    copied: &Arc<dyn Storage>,
    work: &Path,
    clusters: usize,
) -> anyhow::Result<f64> {
    let cache = fresh_dir(&work.join("history-query").join("first-answer"))?;
    let engine = QueryEngine::open(Arc::clone(copied), QuerySettings::under(&cache))?;
    let params = [("cluster".to_owned(), cluster_of(1, clusters))];
    let timer = Instant::now();
    engine
        .answer(&ApiRoute::Summary, &params)
        .await
        .context("the first answer")?;
    Ok(ms(timer.elapsed()))
}

/// Every probe cold and warm, over the store read as S3 is read (`copied`).
async fn query_phase(
    copied: &Arc<dyn Storage>,
    work: &Path,
    sessions: usize,
    clusters: usize,
    repeat: usize,
) -> anyhow::Result<Vec<ProbeTimes>> {
    let cluster = cluster_of(0, clusters);
    // Time ranges from 100 ms into the session `share` percent of the way through the
    // history, so that the range cuts through that session and holds every later one whole.
    let since = |share: usize| {
        let offset = i64::try_from(sessions * share / 100).unwrap_or(0);
        (synth::START_MS + offset * SESSION_GAP_MS + 100).to_string()
    };
    let (newest_half, newest_tenth) = (since(50), since(90));
    let mut probes = Vec::new();
    for (scope, scope_params, table) in [
        ("cluster-wide", vec![("cluster", cluster.as_str())], true),
        ("fleet-wide", vec![], true),
        (
            "cluster-wide, newest half",
            vec![("cluster", cluster.as_str()), ("since_ms", &newest_half)],
            false,
        ),
        (
            "fleet-wide, newest tenth",
            vec![("since_ms", &newest_tenth)],
            false,
        ),
    ] {
        for (route_name, route, params) in [
            ("summary", ApiRoute::Summary, vec![]),
            (
                "aggregates by name",
                ApiRoute::Aggregates,
                vec![("by", "name")],
            ),
            (
                "table, newest page",
                ApiRoute::Tasks,
                vec![("limit", "100")],
            ),
        ] {
            if route == ApiRoute::Tasks && !table {
                continue;
            }
            let params: Vec<(String, String)> = scope_params
                .iter()
                .chain(&params)
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect();
            let name = format!("{scope} {route_name}");
            let cache = fresh_dir(&work.join("history-query").join(name.replace(' ', "-")))?;
            let engine = QueryEngine::open(Arc::clone(copied), QuerySettings::under(&cache))?;
            let timer = Instant::now();
            let cold = engine.answer(&route, &params).await;
            let cold_ms = ms(timer.elapsed());
            let copied_bytes = engine.copied_bytes();
            let refused = match cold {
                Ok(_) => None,
                Err(QueryError::BadRequest(message)) => Some(message),
                Err(err) => return Err(err).with_context(|| format!("{name}: cold")),
            };
            let warm = if refused.is_none() {
                let mut times = Vec::with_capacity(repeat);
                for _ in 0..repeat {
                    let timer = Instant::now();
                    engine
                        .answer(&route, &params)
                        .await
                        .with_context(|| format!("{name}: warm"))?;
                    times.push(timer.elapsed());
                }
                Some(Stats::of(&mut times))
            } else {
                None
            };
            probes.push(ProbeTimes {
                name,
                cold_ms,
                copied_bytes,
                warm,
                refused,
            });
        }
    }
    Ok(probes)
}

/// `dir`, emptied.
fn fresh_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("cannot empty {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir.to_path_buf())
}

/// The table on stderr, beside the targets (docs/performance.md, "Targets").
fn print_table(report: &HistoryReport) {
    eprintln!(
        "{:<44} {:>9} {:>9} {:>11}  refused",
        "probe", "cold ms", "warm p50", "copied MiB"
    );
    for probe in &report.probes {
        eprintln!(
            "{:<44} {:>9.1} {:>9} {:>11.1}  {}",
            probe.name,
            probe.cold_ms,
            probe
                .warm
                .map_or_else(|| "-".to_owned(), |warm| format!("{:.1}", warm.p50_ms)),
            probe.copied_bytes as f64 / f64::from(1 << 20),
            if probe.refused.is_some() { "yes" } else { "" },
        );
    }
    eprintln!(
        "the process's first answer (another cluster's summary, cold): {:.1} ms",
        report.first_answer_ms
    );
}

/// A store whose files are copied into the query cache, as S3's are: every call forwarded,
/// none read in place.
#[derive(Debug)]
struct Copied(Arc<dyn Storage>);

#[async_trait]
impl Storage for Copied {
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError> {
        self.0.put(key, body, mode).await
    }

    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
        self.0.get(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError> {
        self.0.list(prefix).await
    }

    async fn delete(&self, key: &ObjectKey) -> Result<(), StorageError> {
        self.0.delete(key).await
    }

    async fn delete_all(&self, keys: &[ObjectKey]) -> Result<(), StorageError> {
        self.0.delete_all(keys).await
    }

    fn location(&self) -> String {
        self.0.location()
    }
}
