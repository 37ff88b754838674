//! A compaction run: the raw objects it is given read and parsed a few at a time, their events
//! de-duplicated and applied to each session's attempts and entities ([`SessionEvents`]) as the
//! reads finish, then each session committed ([`super::commit`]) on its own, so that one bad
//! object or one failing session costs only its own objects.
//!
//! Parsing runs on every core while applying runs on one; parse turns ([`parse_turns`]) keep
//! the parses only a few objects ahead, so a run holds few parsed objects at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use ulid::Ulid;

use super::commit::SessionBatch;
use super::report::{CompactReport, FailedRun, FailedSession, InRuns, RunOutcome};
use super::schedule::quiet::QuietCheck;
use super::seen::SeenEvents;
use super::{CompactError, Compactor, now_ms};
use crate::event::RayEvent;
use crate::keys::{self, ClusterName, SessionName};
use crate::merge::entities::SessionEntities;
use crate::merge::{SessionTasks, TaskAttempt};
use crate::raw::key::raw_object_time_ms;
use crate::raw::read::{QuarantinedLine, RawError, RawObject, read_raw};
use crate::storage::{ObjectKey, PutMode};
use crate::tables::manifest::SessionStats;

/// Raw objects fetched at once (parsed at most one per core).
const READ_PARALLELISM: usize = 8;

/// Turns to parse a raw object, with `cores` cores: a turn is held from the parse until the
/// object's events have been applied, so while they are, one per parsing thread besides the
/// object being applied.
const fn parse_turns(cores: usize) -> usize {
    cores + 1
}

/// Most raw objects one compaction run takes: the compact function's SQS batch size
/// (template.yaml's `BatchSize`), `serve`'s largest batch, and the bench's default. A run's
/// costs that do not follow its events (locating stored versions, a delta's files and rollup,
/// the share of folds) are paid once per run, so larger runs pay them less often; larger still,
/// a run is no faster and only takes more memory.
pub const RUN_OBJECTS: usize = 1000;

/// One raw object read, or its key and why it could not be.
type RawRead = Result<RawObject, (ObjectKey, RawError)>;

impl Compactor {
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
        let mut sessions: BTreeMap<(ClusterName, SessionName), SessionEvents> = BTreeMap::new();
        // By the object's position in `raw_keys`: objects are applied as their reads finish,
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
            if let Some(at) = raw_object_time_ms(&key) {
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
                        let collected = sessions
                            .entry((object.cluster.clone(), session))
                            .or_default();
                        collected.objects.push(index);
                        collected.apply(events);
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
        for ((cluster, session), collected) in sessions {
            let SessionEvents {
                tasks,
                entities,
                mut span,
                objects,
            } = collected;
            for created in tasks
                .attempts
                .values()
                .filter_map(TaskAttempt::creation_time_ms)
            {
                span.include_created(Some(created), Some(created));
            }
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
            // A run's attempts take a core a while to free: off this task, so the run's last
            // steps and its answer do not wait.
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
        if let Some(retention) = self.settings.retention {
            match self.expire_sessions(retention, now_ms()).await {
                // Each expired session's files go at its quiet check, after their grace.
                Ok(expired) => report.committed.extend(expired),
                // The next run tries again; nothing read depends on it.
                Err(err) => tracing::warn!(error = %err, "could not expire old sessions"),
            }
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
    /// (applying the events, one core's work) overlaps the parsing of the objects after it.
    ///
    /// A parse waits for one of [`parse_turns`] turns, which its object holds until `take`
    /// has returned. Without turns, applying slower than parsing (as it is on two cores) would
    /// leave objects waiting parsed, up to every object of the run, to be applied alone on one
    /// core after the last parse. With them, a run holds a few parsed objects whatever the
    /// pace of applying, so its memory peaks lower at the same speed. A parse waits for its
    /// turn with its body fetched, so fetching goes on while events are being applied, up to
    /// [`READ_PARALLELISM`] objects.
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
                // The object's turn is given back once its events are applied, not before.
                Ok((object, _turn)) => take(index, Ok(object)),
                Err(failed) => take(index, Err(failed)),
            }
        }
        Ok(())
    }

    async fn write_quarantine(&self, lines: &[QuarantinedLine]) -> Result<(), CompactError> {
        let mut body = Vec::new();
        for line in lines {
            serde_json::to_writer(&mut body, line)
                .map_err(|err| CompactError::Scratch(std::io::Error::other(err)))?;
            body.push(b'\n');
        }
        let key = keys::quarantine_key(Ulid::new())?;
        tracing::warn!(lines = lines.len(), key = %key, "quarantined unreadable events");
        self.storage
            .put(&key, Bytes::from(body), PutMode::Create)
            .await?;
        Ok(())
    }
}

/// One session's events of a run, applied to its attempts and entities as their objects are
/// read.
#[derive(Default)]
struct SessionEvents {
    tasks: SessionTasks,
    entities: SessionEntities,
    /// The time span of the events.
    span: SessionStats,
    /// The objects that held them, by position in the run's keys.
    objects: Vec<usize>,
}

impl SessionEvents {
    /// Applies `events` (all of this session) to its attempts, entities and time span.
    fn apply(&mut self, events: Vec<RayEvent>) {
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use bytes::Bytes;

    use super::*;
    use crate::compact::CompactSettings;
    use crate::storage::{
        ETag, LocalDirStorage, ObjectMeta, PutMode, Storage, StorageError, StoredObject,
    };

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

    /// While the first object's events are being applied, the objects after it are parsed
    /// only a few ahead: [`parse_turns`] objects hold a turn (the one being applied among them)
    /// and [`READ_PARALLELISM`] reads wait for one, so exactly that many are read, and no more
    /// however long applying takes. Parsed without turns, every object would be read: the run
    /// has twice as many as the bound, on any number of cores.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn objects_are_parsed_only_a_few_ahead_of_applying_their_events()
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
        let raw = Bytes::from(crate::raw::write::encode_ndjson_gz(&events, body.len())?);
        let cluster = ClusterName::new("ahead")?;
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let bound = READ_PARALLELISM + parse_turns(cores);
        let mut keys = Vec::new();
        for _ in 0..2 * bound {
            let key = crate::raw::key::raw_object_key(&cluster, ulid::Ulid::new())?;
            storage.put(&key, raw.clone(), PutMode::Overwrite).await?;
            keys.push(key);
        }
        let compactor = Compactor::new(
            Arc::clone(&storage) as Arc<dyn Storage>,
            CompactSettings::default(),
            dir.path().join("scratch"),
        );
        let mut read_while_applying = None;
        let mut taken = 0;
        compactor
            .read_each(&keys, |_, read| {
                assert!(read.is_ok_and(|object| !object.events.is_empty()));
                taken += 1;
                if read_while_applying.is_none() {
                    // Applying the first object, slowly: it lasts until the reads beside it
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
                    read_while_applying = Some(reads());
                }
            })
            .await?;
        assert_eq!(taken, keys.len());
        assert_eq!(
            read_while_applying,
            Some(bound),
            "objects read while the first of {} was applied",
            keys.len()
        );
        Ok(())
    }
}
