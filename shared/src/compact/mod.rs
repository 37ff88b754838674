//! Compaction: raw NDJSON objects → merged Parquet tables, per `(cluster, session)`.
//!
//! A run reads the raw objects it is given, parses and de-duplicates their events (by
//! `eventId`), folds each session's task events with the rules of [`crate::merge`], merges the
//! result with the rows already stored for the same attempts, and writes the full merged rows as
//! a new immutable delta file. The session's manifest is then replaced conditionally; a lost race
//! re-reads the manifest and redoes the merge, so concurrent runs never lose each other's work.
//! When deltas pile up they are folded into a new base. Because every merge is idempotent and
//! order-independent, re-delivered notifications and re-read raw objects change no row.
//!
//! This module owns the orchestration; Parquet I/O is in [`crate::tables`].

pub mod backlog;
pub mod batch;
pub mod check_queue;
pub mod expiry;
pub mod fold;
pub mod notification;
pub mod orphans;
pub mod queue;
pub mod raw;
mod seen;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ulid::Ulid;

use self::fold::{FoldPolicy, QuietCheck};
use self::raw::{QuarantinedLine, RawError, RawObject, read_raw};
use self::seen::SeenEvents;
use crate::event::RayEvent;
use crate::layout::{
    self, ClusterName, MANIFESTS_PREFIX, SessionName, Table, TableFile, table_file_key,
};
use crate::merge::entities::SessionEntities;
use crate::merge::{SessionTasks, merge_stored};
use crate::storage::{
    CachedFiles, FileCache, InvalidKey, ObjectKey, PutMode, Storage, StorageError,
};
use crate::tables::entities::{self, EntityKind};
use crate::tables::key_index;
use crate::tables::manifest::{
    Commit, DataFile, Deletes, Document as _, Manifest, ManifestError, RetiredFile, SessionStats,
    VersionedManifest,
};
use crate::tables::newest::{LocalDeletes, LocalFiles};
use crate::tables::rollup::{self, RowsByFile};
use crate::tables::stored_keys::{self, StoredFile, StoredKeys};
use crate::tables::task_attempts::{self, RowFilter, TableError};
use crate::tables::{catalog, manifest};

/// Raw objects fetched at once (parsed at most one per core).
const READ_PARALLELISM: usize = 8;

/// Turns to parse a raw object, with `cores` cores: a turn is held from the parse until the
/// fold has taken the object, so while the fold runs, one per parsing thread besides the
/// object being folded.
const fn parse_turns(cores: usize) -> usize {
    cores + 1
}

/// Most raw objects one compaction run takes: the compact function's SQS batch size
/// (template.yaml's `BatchSize`), `serve`'s largest batch, and the bench's default. A run's
/// costs that do not follow its events (locating stored versions, a delta's files and rollup,
/// the share of folds) are paid half as often as with 500: at 10 M attempts, back to back,
/// 204 412 against 175 632 events/s on 329.7 against 371.1 CPU-s, peaking at 1.27 against
/// 1.18 GB (174 552–204 412 for 1 000 over three hours of this machine's spread; 2 000 were
/// no faster, at 1.90 GB: docs/performance.md, "Compaction runs of 1 000 raw objects").
pub const RUN_OBJECTS: usize = 1000;

/// Tuning of compaction.
#[derive(Clone, Debug)]
pub struct CompactSettings {
    /// When deltas are folded into a new base (see [`fold`]).
    pub fold: FoldPolicy,
    /// Keep retired files this long, so queries that started before can finish.
    pub retire_grace: Duration,
    /// Give up after this many lost manifest races in a row.
    pub max_manifest_retries: usize,
    /// DuckDB's memory limit for merges (MiB); beyond it, sorts spill to the scratch
    /// directory. `None`: DuckDB's default (80 % of the machine).
    pub memory_limit_mib: Option<u64>,
    /// Remove sessions whose newest event is older than this, after each run (see
    /// [`expiry`]). `None`: keep history forever.
    pub retention: Option<Duration>,
    /// A session's table file that its manifest does not name (written by a run that was cut
    /// off before committing) is deleted once the store says it is this old (see [`orphans`]).
    /// Far longer than any run, so files a running compaction has written but not yet
    /// committed are never taken.
    pub orphan_age: Duration,
    /// Most bytes of fetched table files kept in the scratch directory between runs (the
    /// least recently used go first); `None`: no limit.
    pub cache_bytes: Option<u64>,
    /// Most bytes of memory kept between runs for where each stored attempt is (see
    /// [`crate::tables::stored_keys`]); a session whose files need more is located by a scan.
    pub stored_keys_bytes: u64,
}

impl Default for CompactSettings {
    fn default() -> Self {
        Self {
            fold: FoldPolicy::default(),
            retire_grace: Duration::from_secs(15 * 60),
            max_manifest_retries: 20,
            memory_limit_mib: None,
            retention: None,
            orphan_age: Duration::from_secs(86_400),
            cache_bytes: None,
            stored_keys_bytes: stored_keys::DEFAULT_BUDGET,
        }
    }
}

/// Why a compaction run failed. Raw objects stay the source of truth: a failed run can always
/// be retried, and nothing it half-wrote is ever referenced by a manifest.
#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    /// A raw object could not be read.
    #[error(transparent)]
    Raw(#[from] RawError),
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A manifest could not be read or written.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// Parquet could not be written or read.
    #[error(transparent)]
    Table(#[from] TableError),
    /// A key could not be formed.
    #[error(transparent)]
    Key(#[from] InvalidKey),
    /// Local scratch files failed.
    #[error("scratch directory: {0}")]
    Scratch(#[from] std::io::Error),
    /// Other compactions kept winning the manifest race.
    #[error("gave up on the manifest of {cluster}/{session} after {attempts} lost races")]
    Contended {
        /// Cluster.
        cluster: String,
        /// Session.
        session: String,
        /// Races lost.
        attempts: usize,
    },
    /// The blocking DuckDB task panicked or was cancelled.
    #[error("compaction worker failed: {0}")]
    Worker(String),
    /// Raw objects the tables were built from are gone, so a rebuild would drop history.
    #[error(
        "the tables of cluster {cluster} were built from raw objects since {compacted_from_ms} \
         (ms since the epoch, ULID time), but the oldest stored one is {} (expired by the raw \
         retention?): rebuilding would drop that history",
        .oldest_stored_ms.map_or_else(|| "none".to_owned(), |ms| ms.to_string())
    )]
    RawHistoryGone {
        /// The cluster.
        cluster: String,
        /// ULID time of the oldest raw object ever compacted for it.
        compacted_from_ms: u64,
        /// ULID time of the oldest raw object stored now.
        oldest_stored_ms: Option<u64>,
    },
}

/// What one run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Raw objects read.
    pub raw_objects: usize,
    /// Events parsed.
    pub events: usize,
    /// Events dropped as re-deliveries (same `eventId`).
    pub duplicates: usize,
    /// Lines set aside (see the quarantine objects).
    pub quarantined: usize,
    /// Sessions touched.
    pub sessions: usize,
    /// Rows written to delta or base files.
    pub rows_written: u64,
    /// Manifest races lost and redone.
    pub retries: usize,
    /// The sessions this run committed, as it left them: each is to be checked once it has
    /// gone quiet ([`Compactor::tidy_if_quiet`]).
    pub committed: Vec<QuietCheck>,
    /// Where the run's time went.
    pub took: RunTimes,
}

impl CompactReport {
    /// Adds what a later run did: counts summed (`sessions` too, so a session two runs
    /// touched counts twice), its commits appended.
    pub fn add(&mut self, run: CompactReport) {
        self.raw_objects += run.raw_objects;
        self.events += run.events;
        self.duplicates += run.duplicates;
        self.quarantined += run.quarantined;
        self.sessions += run.sessions;
        self.rows_written += run.rows_written;
        self.retries += run.retries;
        self.committed.extend(run.committed);
        self.took.add(&run.took);
    }
}

/// What a run did with the raw objects it was given ([`Compactor::compact_readable`]).
#[derive(Debug, Default)]
pub struct RunOutcome {
    /// What it did: what it read and the sessions it touched (the failed ones' included),
    /// and the sessions it committed (`committed`) and the rows they wrote.
    pub report: CompactReport,
    /// Objects that could not be read, and why (compacted with none of the others).
    pub unreadable: Vec<(ObjectKey, RawError)>,
    /// Sessions that could not be merged or committed; the run's other sessions were.
    pub failed: Vec<FailedSession>,
}

impl RunOutcome {
    /// The objects not compacted, to be tried again: those that could not be read, and those
    /// holding events of a failed session.
    pub fn not_compacted(&self) -> HashSet<&ObjectKey> {
        self.unreadable
            .iter()
            .map(|(key, _)| key)
            .chain(self.failed.iter().flat_map(|session| &session.keys))
            .collect()
    }
}

/// What [`Compactor::compact_in_runs`] did.
#[derive(Debug, Default)]
pub struct InRuns {
    /// What the runs that did not fail as a whole did, together.
    pub outcome: RunOutcome,
    /// The runs that failed as a whole, none of their objects compacted; the later runs ran.
    pub failed_runs: Vec<FailedRun>,
}

impl InRuns {
    /// The objects not compacted, to be tried again: those of [`RunOutcome::not_compacted`]
    /// and of the runs that failed.
    pub fn not_compacted(&self) -> HashSet<&ObjectKey> {
        let mut keys = self.outcome.not_compacted();
        keys.extend(self.failed_runs.iter().flat_map(|run| &run.keys));
        keys
    }
}

/// A run that failed as a whole ([`Compactor::compact_readable`]'s error): its quarantine could
/// not be written, or a worker died.
#[derive(Debug)]
pub struct FailedRun {
    /// Its raw objects.
    pub keys: Vec<ObjectKey>,
    /// Why.
    pub error: CompactError,
}

/// A session a run read but could not merge or commit.
#[derive(Debug)]
pub struct FailedSession {
    /// Its cluster.
    pub cluster: ClusterName,
    /// The session.
    pub session: SessionName,
    /// The run's raw objects that hold events of it.
    pub keys: Vec<ObjectKey>,
    /// Why.
    pub error: CompactError,
}

/// Where a run's time went (wall clock; a session's merge summed over its tries): what
/// `afterglow bench` reports of compaction, for profiling without a profiler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunTimes {
    /// Fetching and parsing the raw objects, their events taken into each session's attempts.
    pub read: Duration,
    /// Finding the stored versions of the attempts merged and reading them from the stored
    /// files' local copies (fetching those copies is not counted).
    pub locate: Duration,
    /// Merging the attempts with their stored versions and writing the deltas with their
    /// deletion vectors.
    pub delta: Duration,
    /// Counting the deltas' rollups.
    pub rollup: Duration,
    /// Folding deltas into new bases, all of it: fetching the files, merging, the new base's
    /// rollup and key index, and storing them.
    pub fold: Duration,
}

impl RunTimes {
    /// Adds `other`'s times to these.
    pub fn add(&mut self, other: &Self) {
        self.read += other.read;
        self.locate += other.locate;
        self.delta += other.delta;
        self.rollup += other.rollup;
        self.fold += other.fold;
    }
}

/// One raw object read, or its key and why it could not be.
type RawRead = Result<RawObject, (ObjectKey, RawError)>;

/// Runs compactions against one store.
#[derive(Clone, Debug)]
pub struct Compactor {
    storage: Arc<dyn Storage>,
    settings: CompactSettings,
    scratch: PathBuf,
    cache: FileCache,
    /// Where each stored attempt is, by file, kept between runs; shared by clones.
    stored_keys: StoredKeys,
    /// Folds whose base's rollup was summed (see [`Compactor::folds_summed`]), shared by
    /// clones.
    folds_summed: Arc<AtomicU64>,
}

impl Compactor {
    /// A compactor writing through `storage`, with local scratch files under `scratch`.
    pub fn new(storage: Arc<dyn Storage>, settings: CompactSettings, scratch: PathBuf) -> Self {
        let cache = FileCache::bounded(
            Arc::clone(&storage),
            scratch.join("cache"),
            8,
            settings.cache_bytes,
        );
        Self {
            stored_keys: StoredKeys::new(settings.stored_keys_bytes),
            storage,
            settings,
            scratch,
            cache,
            folds_summed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// How many folds wrote their base's rollup by summing the rollups it replaces rather
    /// than counting the base: tests tell the two ways apart by it.
    pub fn folds_summed(&self) -> u64 {
        self.folds_summed.load(Ordering::Relaxed)
    }

    /// Where runs found stored attempts (tests tell by it what a run read).
    pub fn stored_keys(&self) -> &StoredKeys {
        &self.stored_keys
    }

    /// The store compacted into.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// How it compacts.
    pub fn settings(&self) -> &CompactSettings {
        &self.settings
    }

    /// Compacts the given raw objects; fails if any of them cannot be read or a session they
    /// hold cannot be committed (the other sessions are).
    pub async fn compact(&self, raw_keys: &[ObjectKey]) -> Result<CompactReport, CompactError> {
        let RunOutcome {
            report,
            unreadable,
            failed,
        } = self.compact_readable(raw_keys).await?;
        if let Some((_, err)) = unreadable.into_iter().next() {
            return Err(err.into());
        }
        match failed.into_iter().next() {
            Some(session) => Err(session.error),
            None => Ok(report),
        }
    }

    /// Compacts `keys` in runs of at most `per_run` raw objects, as the compact function's
    /// batches take them, and returns what they did together ([`InRuns`]). A run holds its
    /// objects' attempts in memory until it commits, so a whole store in one run (a `rebuild`
    /// of millions of attempts) would not fit. A run that fails as a whole is reported and the
    /// next one run: compaction merges in any order, so its objects can be compacted later.
    /// `after_run` is told how many objects each run took, for progress.
    pub async fn compact_in_runs(
        &self,
        keys: &[ObjectKey],
        per_run: NonZeroUsize,
        mut after_run: impl FnMut(usize),
    ) -> InRuns {
        let mut total = InRuns::default();
        for run in keys.chunks(per_run.get()) {
            match self.compact_readable(run).await {
                Ok(outcome) => {
                    total.outcome.report.add(outcome.report);
                    total.outcome.unreadable.extend(outcome.unreadable);
                    total.outcome.failed.extend(outcome.failed);
                }
                Err(error) => {
                    tracing::error!(%error, objects = run.len(), "a compaction run failed");
                    total.failed_runs.push(FailedRun {
                        keys: run.to_vec(),
                        error,
                    });
                }
            }
            after_run(run.len());
        }
        // A session in several runs is one session touched.
        let outcome = &mut total.outcome;
        let committed = outcome
            .report
            .committed
            .iter()
            .map(|check| (&check.cluster, &check.session));
        let failed = outcome
            .failed
            .iter()
            .map(|session| (&session.cluster, &session.session));
        outcome.report.sessions = committed.chain(failed).collect::<BTreeSet<_>>().len();
        total
    }

    /// Compacts the raw objects that can be read into every session they hold that can be
    /// committed, so that one bad or missing object, or one session whose merge or commit
    /// fails, costs only its own objects ([`RunOutcome`]; their notifications are retried).
    /// An error means nothing could be: the quarantine could not be written, or a worker died.
    #[tracing::instrument(name = "compact", skip(self, raw_keys), fields(objects = raw_keys.len()))]
    pub async fn compact_readable(
        &self,
        raw_keys: &[ObjectKey],
    ) -> Result<RunOutcome, CompactError> {
        let mut report = CompactReport::default();
        let mut sessions: BTreeMap<(ClusterName, SessionName), SessionFold> = BTreeMap::new();
        // By the object's position in `raw_keys`: objects are folded as their reads finish,
        // but what is set aside or reported unreadable keeps the order asked for.
        let mut quarantined: Vec<(usize, Vec<QuarantinedLine>)> = Vec::new();
        let mut unreadable = Vec::new();
        let mut oldest_raw: BTreeMap<ClusterName, u64> = BTreeMap::new();
        // The copy of a re-delivered event that is kept is the one whose object finished
        // reading first: Ray resends a body as it was, so the copies are the same event.
        let mut seen = SeenEvents::default();
        let reading = Instant::now();
        self.read_each(raw_keys, |index, read| {
            let object = match read {
                Ok(object) => object,
                Err((key, err)) => {
                    tracing::warn!(key = %key, error = %err, "raw object unreadable");
                    unreadable.push((index, key, err));
                    return;
                }
            };
            let key = object.key;
            report.raw_objects += 1;
            if let Some(at) = crate::layout::raw_object_time_ms(&key) {
                let oldest = oldest_raw.entry(object.cluster.clone()).or_insert(at);
                *oldest = (*oldest).min(at);
            }
            let mut set_aside = object.quarantined;
            let mut events = object.events;
            seen.reserve(events.len());
            events.retain(|event| match &event.event_id {
                Some(id) if !seen.first_time(id) => {
                    report.duplicates += 1;
                    false
                }
                _ => true,
            });
            report.events += events.len();
            for (name, events) in by_session(events) {
                // The session becomes a key segment.
                match SessionName::new(&name) {
                    Ok(session) => {
                        let fold = sessions
                            .entry((object.cluster.clone(), session))
                            .or_default();
                        fold.objects.push(index);
                        fold.fold(events);
                    }
                    Err(_) => set_aside.extend(events.iter().map(|_| QuarantinedLine {
                        source: key.to_string(),
                        line: 0,
                        reason: format!("invalid session name {name:?}"),
                        text: String::new(),
                    })),
                }
            }
            if !set_aside.is_empty() {
                quarantined.push((index, set_aside));
            }
        })
        .await?;
        report.took.read = reading.elapsed();
        quarantined.sort_by_key(|(index, _)| *index);
        let quarantined: Vec<QuarantinedLine> = quarantined
            .into_iter()
            .flat_map(|(_, lines)| lines)
            .collect();
        unreadable.sort_by_key(|(index, _, _)| *index);
        let unreadable: Vec<(ObjectKey, RawError)> = unreadable
            .into_iter()
            .map(|(_, key, err)| (key, err))
            .collect();
        report.quarantined = quarantined.len();
        if !quarantined.is_empty() {
            self.write_quarantine(&quarantined).await?;
        }
        report.sessions = sessions.len();
        let mut failed = Vec::new();
        for ((cluster, session), fold) in sessions {
            let SessionFold {
                tasks,
                entities,
                span,
                objects,
            } = fold;
            let tasks = Arc::new(tasks);
            let batch = SessionBatch {
                tasks: &tasks,
                entities: &entities,
                span: &span,
                oldest_raw_ms: oldest_raw.get(&cluster).copied(),
            };
            let landed = match self.compact_session(&cluster, &session, &batch).await {
                Ok(landed) => landed,
                Err(error) => {
                    // The run's other sessions go on: their objects need not wait for this one
                    // (its manifest refused, a stored file unreadable), on AWS or in `serve`.
                    tracing::error!(%cluster, %session, %error, objects = objects.len(), "session not compacted");
                    let keys = objects
                        .iter()
                        .filter_map(|&index| raw_keys.get(index).cloned())
                        .collect();
                    failed.push(FailedSession {
                        cluster,
                        session,
                        keys,
                        error,
                    });
                    continue;
                }
            };
            // A run folds ~126 000 attempts per 500 objects, which take a core ~0.1 s to free
            // (perf): off this task, so the run's last steps and its answer do not wait.
            drop(tokio::task::spawn_blocking(move || drop(tasks)));
            report.rows_written += landed.rows;
            report.retries += landed.retries;
            report.took.add(&landed.took);
            report.committed.push(QuietCheck {
                cluster: cluster.clone(),
                session: session.clone(),
                sequence: landed.sequence,
            });
            // Costs a few listings of this session's folders; the next run tries again.
            if let Err(err) = self.collect_orphans(&cluster, &session).await {
                tracing::warn!(%cluster, %session, error = %err, "could not collect orphan files");
            }
        }
        tracing::info!(
            ?report,
            unreadable = unreadable.len(),
            failed_sessions = failed.len(),
            "compaction finished"
        );
        if let Some(retention) = self.settings.retention
            && let Err(err) = self.expire_sessions(retention, now_ms()).await
        {
            // The next run tries again; nothing read depends on it.
            tracing::warn!(error = %err, "could not expire old sessions");
        }
        Ok(RunOutcome {
            report,
            unreadable,
            failed,
        })
    }

    /// Reads and parses `keys`, several at a time (fetches overlap, parses use every core),
    /// and hands each object, or why it could not be read, to `take` with its position in
    /// `keys` as soon as it is parsed: in the order the reads finish, so that what `take` does
    /// (the fold, one core's work) overlaps the parsing of the objects after it.
    ///
    /// A parse waits for one of [`parse_turns`] turns, which its object holds until `take`
    /// has returned. Parsed without turns, a fold slower than the parses (as it is on two
    /// cores) left objects waiting parsed, up to every object of the run, and finished them
    /// alone on one core after the last parse. With them, a run holds a few parsed objects
    /// whatever the fold's pace: the 1 M bench's compaction peaked 17 % lower, at the same
    /// speed (docs/performance.md, stop 66). A parse waits for its turn with its body fetched,
    /// so fetching goes on while the fold is busy, up to [`READ_PARALLELISM`] objects.
    async fn read_each(
        &self,
        keys: &[ObjectKey],
        mut take: impl FnMut(usize, RawRead),
    ) -> Result<(), CompactError> {
        let mut reads = tokio::task::JoinSet::new();
        let slots = Arc::new(tokio::sync::Semaphore::new(READ_PARALLELISM));
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let parsers = Arc::new(tokio::sync::Semaphore::new(cores));
        let turns = Arc::new(tokio::sync::Semaphore::new(parse_turns(cores)));
        for (index, key) in keys.iter().enumerate() {
            let storage = Arc::clone(&self.storage);
            let key = key.clone();
            let slots = Arc::clone(&slots);
            let parsers = Arc::clone(&parsers);
            let turns = Arc::clone(&turns);
            reads.spawn(async move {
                let _slot = slots.acquire_owned().await;
                let read = read_raw(&*storage, &key, &parsers, &turns)
                    .await
                    .map_err(|err| (key, err));
                (index, read)
            });
        }
        while let Some(joined) = reads.join_next().await {
            let (index, read) = joined.map_err(|err| CompactError::Worker(err.to_string()))?;
            match read {
                // The object's turn is given back once it is folded, not before.
                Ok((object, _turn)) => take(index, Ok(object)),
                Err(failed) => take(index, Err(failed)),
            }
        }
        Ok(())
    }

    /// Checks that `rebuild` would lose nothing: for every cluster, the oldest raw object ever
    /// compacted (the catalog records it) must still be stored. Raw objects expire after
    /// `RawRetentionDays` while tables may be kept longer; rebuilding then would drop the
    /// history only the tables still hold.
    pub async fn ensure_rebuildable(&self) -> Result<(), CompactError> {
        let (catalog, _) = catalog::load(&*self.storage).await?;
        let mut stored: BTreeMap<String, u64> = BTreeMap::new();
        for meta in self.storage.list(layout::RAW_PREFIX).await? {
            if let (Some(cluster), Some(at)) = (
                layout::raw_object_cluster(&meta.key),
                layout::raw_object_time_ms(&meta.key),
            ) {
                let oldest = stored.entry(cluster.to_string()).or_insert(at);
                *oldest = (*oldest).min(at);
            }
        }
        for (cluster, &compacted_from) in &catalog.raw_from {
            let present = stored.get(cluster).copied();
            if present.is_none_or(|oldest| oldest > compacted_from) {
                return Err(CompactError::RawHistoryGone {
                    cluster: cluster.clone(),
                    compacted_from_ms: compacted_from,
                    oldest_stored_ms: present,
                });
            }
        }
        Ok(())
    }

    /// Every raw object in the store, for `rebuild`.
    pub async fn raw_keys(&self) -> Result<Vec<ObjectKey>, CompactError> {
        Ok(raw::list_keys(&*self.storage).await?)
    }

    /// Deletes every table file and manifest (raw objects stay), for `rebuild`. Returns how
    /// many objects were deleted.
    pub async fn drop_tables(&self) -> Result<usize, CompactError> {
        let objects = self.storage.list(layout::TABLES_PREFIX).await?;
        // Manifests first, so no reader is ever pointed at a deleted file.
        let (manifests, data): (Vec<_>, Vec<_>) = objects
            .into_iter()
            .partition(|meta| meta.key.as_str().starts_with(MANIFESTS_PREFIX));
        let count = manifests.len() + data.len();
        for meta in manifests.into_iter().chain(data) {
            self.storage.delete(&meta.key).await?;
        }
        Ok(count)
    }

    async fn write_quarantine(&self, lines: &[QuarantinedLine]) -> Result<(), CompactError> {
        let mut body = Vec::new();
        for line in lines {
            serde_json::to_writer(&mut body, line)
                .map_err(|err| CompactError::Scratch(std::io::Error::other(err)))?;
            body.push(b'\n');
        }
        let key = layout::quarantine_key(Ulid::new())?;
        tracing::warn!(lines = lines.len(), key = %key, "quarantined unreadable events");
        self.storage
            .put(&key, Bytes::from(body), PutMode::Create)
            .await?;
        Ok(())
    }

    /// Merges one session's new facts into its tables.
    #[tracing::instrument(name = "compact_session", skip(self, batch), fields(cluster = %cluster, session = %session, attempts = batch.tasks.attempts.len()))]
    async fn compact_session(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        batch: &SessionBatch<'_>,
    ) -> Result<Landed, CompactError> {
        let manifest_key = layout::manifest_key(cluster, session)?;
        let mut took = RunTimes::default();
        for attempt in 0..self.settings.max_manifest_retries {
            let current = manifest::load(&*self.storage, &manifest_key).await?;
            let (mut next, mut written, mut rows) = self
                .next_manifest(cluster, session, batch.tasks, &current, &mut took)
                .await?;
            next.stats
                .include_span(batch.span.first_ms, batch.span.last_ms);
            rows += self
                .next_entities(cluster, session, batch.entities, &mut next, &mut written)
                .await?;
            let commit = manifest::commit(
                &*self.storage,
                &manifest_key,
                &next,
                current.etag.as_ref(),
                &written,
            )
            .await?;
            match commit {
                Commit::Landed => {
                    self.delete_expired(&next, &current.manifest).await;
                    catalog::record(
                        &*self.storage,
                        cluster,
                        session,
                        &next.stats,
                        batch.oldest_raw_ms,
                    )
                    .await?;
                    return Ok(Landed {
                        rows,
                        retries: attempt,
                        sequence: next.sequence,
                        took,
                    });
                }
                Commit::Lost => {
                    tracing::info!(attempt, "lost the manifest race; merging again");
                    self.delete_unreferenced(&written).await;
                }
            }
        }
        Err(CompactError::Contended {
            cluster: cluster.to_string(),
            session: session.to_string(),
            attempts: self.settings.max_manifest_retries,
        })
    }

    /// Builds the manifest that adds `fold` to `current`, writing the data files it names;
    /// adds where its time went to `took`.
    async fn next_manifest(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        fold: &Arc<SessionTasks>,
        current: &VersionedManifest,
        took: &mut RunTimes,
    ) -> Result<(Manifest, Vec<ObjectKey>, u64), CompactError> {
        let stored_failures = current.manifest.failures();
        let mut failures = stored_failures.clone();
        failures.merge(&fold.failures);
        let filter = RowFilter {
            keys: fold
                .attempts
                .keys()
                .map(|key| (key.task_id.to_string(), key.attempt_number))
                .collect(),
            unfinished_of_jobs: failures
                .job_ends
                .iter()
                .filter(|(job, end)| stored_failures.job_ends.get(*job) != Some(*end))
                .map(|(job, _)| job.to_string())
                .collect(),
            unfinished_on_workers: failures
                .worker_deaths
                .iter()
                .filter(|(worker, death)| {
                    stored_failures.worker_deaths.get(*worker) != Some(*death)
                })
                .map(|(worker, _)| worker.to_string())
                .collect(),
        };

        let files = self.fetch(current.manifest.task_attempts.all()).await?;
        let stored_files: Vec<(ObjectKey, PathBuf, u64)> = current
            .manifest
            .task_attempts
            .all()
            .zip(files.files())
            .map(|(file, path)| (file.key.clone(), path.clone(), file.rows))
            .collect();
        let listed = current.manifest.task_attempts.all().count();
        if listed != files.files().len() {
            return Err(TableError::Corrupt(format!(
                "{} local copies of {listed} stored files",
                files.files().len(),
            ))
            .into());
        }
        let stored_keys = self.stored_keys.clone();
        // The new delta's rollup adds in rollups of the deltas before it, so reads sum a few
        // rollups instead of one per delta. Those are an optimization: one that cannot be
        // fetched only means this delta's rollup counts itself alone.
        let (add_in, mut covers) = current.manifest.task_attempts.rollups_to_add_in();
        let previous = match self.fetch_keys(add_in.into_iter()).await {
            Ok(previous) => previous,
            Err(err) => {
                tracing::warn!(error = %err, "earlier rollups not fetched; this delta's counts itself");
                covers = 1;
                self.fetch_keys(std::iter::empty()).await?
            }
        };
        let (delta_key, delta_path) = self.new_attempts_file(cluster, session, TableFile::Delta)?;
        let (deletes_key, deletes_path) =
            self.new_attempts_file(cluster, session, TableFile::Deletes)?;
        let (rollup_key, rollup_path) =
            self.new_attempts_file(cluster, session, TableFile::Rollup)?;
        let (index_key, index_path) =
            self.new_attempts_file(cluster, session, TableFile::KeyIndex)?;
        let cluster_name = cluster.to_string();
        let session_name = session.to_string();
        let fold = Arc::clone(fold);
        let write_failures = failures.clone();
        let path = delta_path.clone();
        let superseded_path = deletes_path.clone();
        let write_rollup_path = rollup_path.clone();
        let write_index_path = index_path.clone();
        let (rows, added, superseded, covers, times) =
            run_blocking(move || -> Result<_, CompactError> {
                let started = Instant::now();
                // The local copies stay pinned until the rollup has read the versions it replaces.
                let _pinned = &files;
                let connection = crate::tables::open_duckdb()?;
                let stored_files: Vec<StoredFile<'_>> = stored_files
                    .iter()
                    .map(|(key, path, rows)| StoredFile {
                        key,
                        path,
                        rows: *rows,
                    })
                    .collect();
                let stored = stored_keys.read_attempts(&connection, &stored_files, &filter)?;
                let located = started.elapsed();
                // Every stored version read is merged into the delta, so the delta supersedes
                // exactly those rows.
                let superseded =
                    task_attempts::write_deletes(&connection, &stored.positions, &superseded_path)?;
                let live = stored.live;
                let merged = merge_stored(stored.attempts, &fold);
                let added = merged.new.len() as u64;
                let (rows, index) = task_attempts::write_delta(
                    &path,
                    &cluster_name,
                    &session_name,
                    &merged.all(),
                    &write_failures,
                )?;
                let written = started.elapsed();
                let mut covers = covers;
                let mut rolled_up = written;
                if rows > 0 {
                    // From the file just written: DuckDB decodes the few columns these need in
                    // tens of milliseconds (docs/performance.md).
                    covers = write_delta_rollup(
                        &connection,
                        &path,
                        &live,
                        previous.files(),
                        covers,
                        &write_rollup_path,
                    )?;
                    rolled_up = started.elapsed();
                    index.write(&write_index_path)?;
                    // Where a run's time goes after the parse, for profiling without a profiler.
                    tracing::debug!(
                        rows,
                        previous_rollups = previous.files().len(),
                        superseded,
                        unfinished = filter.names_unfinished(),
                        locate_ms = located.as_millis(),
                        delta_ms = (written - located).as_millis(),
                        rollup_ms = (rolled_up - written).as_millis(),
                        key_index_ms = (started.elapsed() - rolled_up).as_millis(),
                        "the run's files written"
                    );
                }
                let times = RunTimes {
                    locate: located,
                    delta: written - located,
                    rollup: rolled_up - written,
                    ..RunTimes::default()
                };
                Ok((rows, added, superseded, covers, times))
            })
            .await?;
        took.add(&times);

        let mut written = Vec::new();
        let mut next = current.manifest.next_run();
        next.format = Manifest::FORMAT;
        next.stats.attempts += added;
        next.set_failures(&failures);
        if rows > 0 {
            let deletes = if superseded > 0 {
                self.upload(&deletes_path, &deletes_key).await?;
                written.push(deletes_key.clone());
                Deletes {
                    key: Some(deletes_key.clone()),
                    rows: superseded,
                }
            } else {
                Deletes::default()
            };
            self.upload(&rollup_path, &rollup_key).await?;
            written.push(rollup_key.clone());
            self.upload(&index_path, &index_key).await?;
            written.push(index_key.clone());
            let bytes = self.upload(&delta_path, &delta_key).await?;
            written.push(delta_key.clone());
            next.task_attempts.deltas.push(DataFile {
                key: delta_key.clone(),
                rows,
                bytes,
                deletes: Some(deletes),
                rollup: Some(rollup_key),
                rollup_format: Some(rollup::FORMAT),
                rollup_covers: Some(u32::try_from(covers).unwrap_or(u32::MAX)),
                key_index: Some(index_key),
            });
        }
        let _ = tokio::fs::remove_file(&delta_path).await;
        let _ = tokio::fs::remove_file(&deletes_path).await;
        let _ = tokio::fs::remove_file(&rollup_path).await;
        let _ = tokio::fs::remove_file(&index_path).await;

        let mut rows_written = rows;
        if let Some(reason) = self.settings.fold.due(&next.task_attempts) {
            tracing::info!(?reason, "folding the deltas into a new base");
            let folding = Instant::now();
            let base = self.merge_base(cluster, session, &next).await?;
            took.fold += folding.elapsed();
            rows_written += base.rows;
            // No run reads the files the new base replaces again (if this commit loses, the
            // next try reads their keys again).
            self.stored_keys
                .forget(next.task_attempts.all().map(|file| &file.key));
            written.extend(next.install_base(base, now_ms()));
        }
        self.prune_retired(&mut next);
        Ok((next, written, rows_written))
    }

    /// Merges new entity facts into the session's entity tables, rewriting the files of the
    /// kinds that changed. Returns rows written.
    async fn next_entities(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        new: &SessionEntities,
        next: &mut Manifest,
        written: &mut Vec<ObjectKey>,
    ) -> Result<u64, CompactError> {
        let changed_kinds: Vec<EntityKind> = EntityKind::ALL
            .into_iter()
            .filter(|kind| kind.count(new) > 0)
            .collect();
        if changed_kinds.is_empty() {
            return Ok(0);
        }
        let mut stored_files = Vec::new();
        for kind in &changed_kinds {
            if let Some(file) = next.entities.get(kind.table()) {
                let path = self.fetch(std::iter::once(file)).await?;
                stored_files.push((*kind, path));
            }
        }
        let name = Ulid::new().to_string();
        let scratch = self.scratch.clone();
        let new = new.clone();
        let cluster_name = cluster.to_string();
        let session_name = session.to_string();
        let kinds = changed_kinds.clone();
        let outputs = run_blocking(
            move || -> Result<Vec<(EntityKind, PathBuf, u64)>, CompactError> {
                let connection = crate::tables::open_duckdb()?;
                let mut stored = SessionEntities::default();
                for (kind, paths) in &stored_files {
                    for path in paths.files() {
                        entities::read_entities(&connection, *kind, path, &mut stored)?;
                    }
                }
                let mut merged = stored.clone();
                merged.merge(new);
                let mut outputs = Vec::new();
                for kind in kinds {
                    // Unchanged tables keep their file.
                    if stored_files
                        .iter()
                        .any(|(stored_kind, _)| *stored_kind == kind)
                        && kind_equal(kind, &stored, &merged)
                    {
                        continue;
                    }
                    let path = scratch.join(format!("{}-{name}.parquet", kind.table()));
                    let rows = entities::write_entities(
                        &connection,
                        kind,
                        &cluster_name,
                        &session_name,
                        &merged,
                        &path,
                    )?;
                    outputs.push((kind, path, rows));
                }
                Ok(outputs)
            },
        )
        .await?;
        let mut rows_written = 0;
        let now = now_ms();
        for (kind, path, rows) in outputs {
            let key = table_file_key(
                Table::Entity(kind),
                cluster,
                session,
                TableFile::Whole,
                Ulid::new(),
            )?;
            let bytes = self.upload(&path, &key).await?;
            let _ = tokio::fs::remove_file(&path).await;
            written.push(key.clone());
            let replaced = next.entities.insert(
                kind.table().to_owned(),
                DataFile {
                    key: key.clone(),
                    rows,
                    bytes,
                    deletes: None,
                    rollup: None,
                    rollup_format: None,
                    rollup_covers: None,
                    key_index: None,
                },
            );
            if let Some(old) = replaced {
                next.retired.push(RetiredFile {
                    key: old.key,
                    retired_at_ms: now,
                });
            }
            rows_written += rows;
        }
        Ok(rows_written)
    }

    /// Folds every live file into one new base file, the newest version of each key
    /// ([`task_attempts::write_newest`]: the sorted files merged, or sorted by DuckDB when they
    /// cannot be): the rows never become merge state, so a base of millions of attempts costs
    /// a pass over its files, not memory for every attempt.
    async fn merge_base(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        manifest: &Manifest,
    ) -> Result<DataFile, CompactError> {
        let table = &manifest.task_attempts;
        let base = self.fetch(table.base.iter()).await?;
        let deltas = self.fetch(table.deltas.iter()).await?;
        // Each delta's vector, with the position of the delta that wrote it.
        let vectors: Vec<(usize, &ObjectKey, u64)> = table
            .deltas
            .iter()
            .enumerate()
            .filter_map(|(offset, delta)| {
                let deletes = delta.deletes.as_ref()?;
                Some((
                    table.base.len() + offset,
                    deletes.key.as_ref()?,
                    deletes.rows,
                ))
            })
            .collect();
        let vector_files = self
            .fetch_keys(vectors.iter().map(|(_, key, _)| *key))
            .await?;
        let deletes = table.has_deletion_vectors().then(|| {
            vectors
                .iter()
                .zip(vector_files.files())
                .map(|((position, _, rows), path)| LocalDeletes {
                    path: path.clone(),
                    rows: *rows,
                    // One session, every file fetched: positions are read indices.
                    files: (0..*position).map(Some).collect(),
                })
                .collect()
        });
        let attempts = LocalFiles {
            base: base.files().clone(),
            deltas: deltas.files().clone(),
            one_session: true,
            deletes,
        };
        // The new base's rollup is summed from the rollups that add up to the files it
        // replaces. Those are an optimization: any that cannot be fetched only means the base
        // is counted.
        let replaced = match table.rollups() {
            Some(keys) if table.has_deletion_vectors() => {
                match self.fetch_keys(keys.into_iter()).await {
                    Ok(replaced) => Some(replaced),
                    Err(err) => {
                        tracing::warn!(error = %err, "rollups not fetched; the new base is counted");
                        None
                    }
                }
            }
            _ => None,
        };
        let replaced_paths = replaced
            .as_ref()
            .map(|replaced| replaced.files().clone())
            .unwrap_or_default();
        let (key, path) = self.new_attempts_file(cluster, session, TableFile::Base)?;
        let write_path = path.clone();
        let (rollup_key, rollup_path) =
            self.new_attempts_file(cluster, session, TableFile::Rollup)?;
        let write_rollup_path = rollup_path.clone();
        let (index_key, index_path) =
            self.new_attempts_file(cluster, session, TableFile::KeyIndex)?;
        let write_index_path = index_path.clone();
        let spill = self.scratch.join("duckdb-spill");
        let memory_limit = self.settings.memory_limit_mib;
        let (rows, summed) = run_blocking(move || -> Result<(u64, bool), CompactError> {
            let connection = crate::tables::open_duckdb()?;
            let mut setup = format!(
                "SET temp_directory = {};",
                crate::tables::newest::path_literal(&spill)
            );
            if let Some(memory) = memory_limit {
                setup.push_str(&format!(" SET memory_limit = '{memory}MiB';"));
            }
            connection.execute_batch(&setup).map_err(TableError::from)?;
            let started = Instant::now();
            let (rows, index) =
                task_attempts::write_newest(&connection, &attempts.files(), &write_path)?;
            let written = started.elapsed();
            let recounted = write_base_rollup(
                &connection,
                &write_path,
                &replaced_paths,
                &write_rollup_path,
            )?;
            let summed = recounted.is_some();
            let rolled_up = started.elapsed();
            match index {
                Some(index) => index.write(&write_index_path)?,
                None => {
                    key_index::write_key_index(&connection, &write_path, rows, &write_index_path)?
                }
            };
            // Where a fold's time goes, as for a run's files (`the run's files written`).
            tracing::debug!(
                rows,
                rollups = replaced_paths.len(),
                summed,
                recounted = ?recounted.unwrap_or_default(),
                base_ms = written.as_millis(),
                rollup_ms = (rolled_up - written).as_millis(),
                key_index_ms = (started.elapsed() - rolled_up).as_millis(),
                "the fold's files written"
            );
            Ok((rows, summed))
        })
        .await?;
        if summed {
            self.folds_summed.fetch_add(1, Ordering::Relaxed);
        }
        // The rollups summed stay in the cache until the sum is done.
        drop(replaced);
        // The rollup and key index first: a base is only ever installed with them.
        self.upload(&rollup_path, &rollup_key).await?;
        let _ = tokio::fs::remove_file(&rollup_path).await;
        self.upload(&index_path, &index_key).await?;
        let _ = tokio::fs::remove_file(&index_path).await;
        let bytes = self.upload(&path, &key).await?;
        let _ = tokio::fs::remove_file(&path).await;
        Ok(DataFile {
            key,
            rows,
            bytes,
            deletes: None,
            rollup: Some(rollup_key),
            rollup_format: Some(rollup::FORMAT),
            rollup_covers: None,
            key_index: Some(index_key),
        })
    }

    /// Local copies of live data files (they are immutable, so a cached copy is current),
    /// kept in the cache while the answer lives.
    async fn fetch<'a>(
        &self,
        files: impl Iterator<Item = &'a DataFile>,
    ) -> Result<CachedFiles<Vec<PathBuf>>, CompactError> {
        self.fetch_keys(files.map(|file| &file.key)).await
    }

    /// Local copies of the objects at `keys` (immutable table files).
    async fn fetch_keys<'a>(
        &self,
        keys: impl Iterator<Item = &'a ObjectKey>,
    ) -> Result<CachedFiles<Vec<PathBuf>>, CompactError> {
        let keys: Vec<ObjectKey> = keys.cloned().collect();
        Ok(self.cache.files(&keys).await?)
    }

    /// A new `task_attempts` file of this session: its key, and the scratch path it is
    /// written to before the upload.
    fn new_attempts_file(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        file: TableFile,
    ) -> Result<(ObjectKey, PathBuf), CompactError> {
        let id = Ulid::new();
        let key = table_file_key(Table::TaskAttempts, cluster, session, file, id)?;
        let name = key
            .as_str()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        Ok((key, self.scratch.join(name)))
    }

    async fn upload(&self, path: &Path, key: &ObjectKey) -> Result<u64, CompactError> {
        let (_, bytes) = self.storage.put_file(key, path, PutMode::Create).await?;
        Ok(bytes)
    }

    /// Deletes files written for a change that [`Commit::Lost`]: no manifest names them.
    async fn delete_unreferenced(&self, written: &[ObjectKey]) {
        for key in written {
            if let Err(err) = self.storage.delete(key).await {
                tracing::warn!(key = %key, error = %err, "could not delete an unreferenced file");
            }
        }
    }

    /// Deletes the files `previous` named and the landed `next` no longer does: retired files
    /// whose grace period ended (and, with no grace period, the files `next` replaced).
    async fn delete_expired(&self, next: &Manifest, previous: &Manifest) {
        let still: BTreeSet<&ObjectKey> = next.keys().collect();
        for key in previous.keys().filter(|key| !still.contains(key)) {
            self.cache.forget(key).await;
            if let Err(err) = self.storage.delete(key).await {
                tracing::warn!(error = %err, "could not delete a retired file; it stays harmless");
            }
        }
    }
}

/// A session's commit: rows written, races lost first, and the manifest's new sequence.
struct Landed {
    rows: u64,
    retries: usize,
    sequence: u64,
    took: RunTimes,
}

/// One session's events of a run, folded as their objects are read.
#[derive(Default)]
struct SessionFold {
    tasks: SessionTasks,
    entities: SessionEntities,
    /// The time span of the events.
    span: SessionStats,
    /// The objects that held them, by position in the run's keys.
    objects: Vec<usize>,
}

impl SessionFold {
    fn fold(&mut self, events: Vec<RayEvent>) {
        for event in events {
            let at = event.timestamp.map_or(0, |timestamp| timestamp.nanos());
            self.entities.apply(at, &event.payload);
            if let Some(timestamp) = event.timestamp {
                self.span
                    .include_span(Some(timestamp.millis()), Some(timestamp.millis()));
            }
            // Last: the attempt takes what it keeps of the event.
            self.tasks.apply(event);
        }
    }
}

/// One session's share of a compaction run.
struct SessionBatch<'a> {
    /// Shared with the blocking write, which reads it without a copy.
    tasks: &'a Arc<SessionTasks>,
    entities: &'a SessionEntities,
    /// The time span of the batch's events.
    span: &'a SessionStats,
    /// ULID time of the oldest raw object of the session's cluster in this run.
    oldest_raw_ms: Option<u64>,
}

/// True when `kind`'s records are the same in both.
fn kind_equal(kind: EntityKind, a: &SessionEntities, b: &SessionEntities) -> bool {
    match kind {
        EntityKind::Jobs => a.jobs == b.jobs,
        EntityKind::Actors => a.actors == b.actors,
        EntityKind::Nodes => a.nodes == b.nodes,
        EntityKind::Workers => a.workers == b.workers,
        EntityKind::PlacementGroups => a.placement_groups == b.placement_groups,
    }
}

/// `events` by session name, in order; one vector, not copied, when they share one session
/// (as every body Ray sends does).
fn by_session(mut events: Vec<RayEvent>) -> Vec<(String, Vec<RayEvent>)> {
    let Some(first) = events.first().map(|event| event.session_name.clone()) else {
        return Vec::new();
    };
    if events.iter().all(|event| event.session_name == first) {
        return vec![(first, events)];
    }
    let mut groups: Vec<(String, Vec<RayEvent>)> = Vec::new();
    for event in events.drain(..) {
        match groups
            .iter_mut()
            .find(|(name, _)| *name == event.session_name)
        {
            Some((_, group)) => group.push(event),
            None => groups.push((event.session_name.clone(), vec![event])),
        }
    }
    groups
}

/// Writes the rollup of the delta at `path` (minus the stored versions `live` it supersedes),
/// adding in the stored rollups `previous`; `covers` is how many deltas the rollup counts
/// with them added in. Returns how many deltas the rollup written counts: an earlier rollup
/// that cannot be read must not wedge the session, so then the delta's rollup counts the delta
/// alone (1).
fn write_delta_rollup(
    connection: &duckdb::Connection,
    path: &Path,
    live: &RowsByFile,
    previous: &[PathBuf],
    covers: usize,
    rollup_path: &Path,
) -> Result<usize, CompactError> {
    match rollup::write_rollup(connection, path, live, previous, rollup_path) {
        Ok(_) => Ok(covers),
        Err(err) if previous.is_empty() => Err(err.into()),
        Err(err) => {
            tracing::warn!(error = %err, "earlier rollups not added in; this delta's counts itself");
            rollup::write_rollup(connection, path, live, &[], rollup_path)?;
            Ok(1)
        }
    }
}

/// Writes the rollup of a fold's new base at `path` to `rollup_path`: summed from the rollups
/// `replaced` when there are any ([`rollup::write_summed_rollup`]), else counted. Rollups that
/// do not add up must not wedge the session, so the base is then counted. Returns the slices
/// counted again after a sum, or `None` when the whole base was counted.
fn write_base_rollup(
    connection: &duckdb::Connection,
    path: &Path,
    replaced: &[PathBuf],
    rollup_path: &Path,
) -> Result<Option<Vec<rollup::Slice>>, CompactError> {
    if !replaced.is_empty() {
        match rollup::write_summed_rollup(connection, path, replaced, rollup_path) {
            Ok(summed) => return Ok(Some(summed.recounted)),
            Err(err) => {
                tracing::warn!(error = %err, "rollups not summed; the new base is counted");
            }
        }
    }
    rollup::write_rollup(connection, path, &RowsByFile::new(), &[], rollup_path)?;
    Ok(None)
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, CompactError> + Send + 'static,
) -> Result<T, CompactError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| CompactError::Worker(err.to_string()))?
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use async_trait::async_trait;
    use bytes::Bytes;

    use super::*;
    use crate::storage::{ETag, LocalDirStorage, ObjectMeta, PutMode, StoredObject};

    /// A local store that counts the objects read from it.
    #[derive(Debug)]
    struct CountsGets {
        inner: LocalDirStorage,
        gets: AtomicUsize,
    }

    #[async_trait]
    impl Storage for CountsGets {
        async fn put(
            &self,
            key: &ObjectKey,
            body: Bytes,
            mode: PutMode,
        ) -> Result<ETag, StorageError> {
            self.inner.put(key, body, mode).await
        }

        async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
            self.gets.fetch_add(1, Ordering::SeqCst);
            self.inner.get(key).await
        }

        async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError> {
            self.inner.list(prefix).await
        }

        async fn delete(&self, key: &ObjectKey) -> Result<(), StorageError> {
            self.inner.delete(key).await
        }

        fn location(&self) -> String {
            self.inner.location()
        }
    }

    /// While the fold is busy with the first object, the objects after it are parsed only a
    /// few ahead: [`parse_turns`] objects hold a turn (the one being folded among them) and
    /// [`READ_PARALLELISM`] reads wait for one, so exactly that many are read, and no more
    /// however long the fold takes. Parsed without turns, every object would be read: the run
    /// has twice as many as the bound, on any number of cores.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn objects_are_parsed_only_a_few_ahead_of_the_fold()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let storage = Arc::new(CountsGets {
            inner: LocalDirStorage::open(dir.path().join("store"))?,
            gets: AtomicUsize::new(0),
        });
        // A body Ray 2.60 sent, as ingest stores it.
        let body = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../tests/fixtures/ray-2.60/basic-workload/bodies/0001.json"),
        )?;
        let events = crate::event::split_batch(&body)?;
        let raw = Bytes::from(crate::ingest::encode_ndjson_gz(&events, body.len())?);
        let cluster = ClusterName::new("ahead")?;
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let bound = READ_PARALLELISM + parse_turns(cores);
        let mut keys = Vec::new();
        for _ in 0..2 * bound {
            let key = layout::raw_object_key(&cluster, ulid::Ulid::new())?;
            storage.put(&key, raw.clone(), PutMode::Overwrite).await?;
            keys.push(key);
        }
        let compactor = Compactor::new(
            Arc::clone(&storage) as Arc<dyn Storage>,
            CompactSettings::default(),
            dir.path().join("scratch"),
        );
        let mut read_while_folding = None;
        let mut taken = 0;
        compactor
            .read_each(&keys, |_, read| {
                assert!(read.is_ok_and(|object| !object.events.is_empty()));
                taken += 1;
                if read_while_folding.is_none() {
                    // The fold of the first object, slow: it lasts until the reads beside it
                    // have reached the bound (or a deadline), then a while longer, for any
                    // read past the bound to show.
                    let reads = || storage.gets.load(Ordering::SeqCst);
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while reads() < bound && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    let settled = Instant::now() + Duration::from_millis(300);
                    while reads() <= bound && Instant::now() < settled {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    read_while_folding = Some(reads());
                }
            })
            .await?;
        assert_eq!(taken, keys.len());
        assert_eq!(
            read_while_folding,
            Some(bound),
            "objects read while the first of {} was folded",
            keys.len()
        );
        Ok(())
    }
}
