//! The commit protocol of a run's session: merge its new attempts with their stored versions,
//! write a delta with its deletion vector, rollup and key index (and the entity tables that
//! changed), then replace the session's manifest conditionally. A lost race deletes what was
//! written and redoes the merge on the manifest that won, so concurrent runs never lose each
//! other's work; a landed commit deletes the files whose grace period is over and records the
//! session in the catalog. When the fold policy says so, the commit also folds the deltas into a
//! new base ([`super::fold`]). See docs/architecture.md, "The commit protocol".

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ulid::Ulid;

use super::report::RunTimes;
use super::scratch::run_blocking;
use super::{CompactError, Compactor, now_ms};
use crate::keys::{self, ClusterName, SessionName, Table, TableFile, table_file_key};
use crate::merge::entities::SessionEntities;
use crate::merge::{SessionTasks, merge_stored};
use crate::storage::ObjectKey;
use crate::tables::TableError;
use crate::tables::entities::{self, EntityKind};
use crate::tables::manifest::{
    Commit, DataFile, Deletes, Document as _, Manifest, RetiredFile, SessionStats,
    VersionedManifest,
};
use crate::tables::rollup::{self, RowsByFile};
use crate::tables::stored_keys::StoredFile;
use crate::tables::task_attempts::{self, RowFilter};
use crate::tables::{catalog, manifest};

impl Compactor {
    /// Merges one session's new facts into its tables.
    #[tracing::instrument(name = "compact_session", skip(self, batch), fields(cluster = %cluster, session = %session, attempts = batch.tasks.attempts.len()))]
    pub(super) async fn compact_session(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        batch: &SessionBatch<'_>,
    ) -> Result<Landed, CompactError> {
        let manifest_key = keys::manifest_key(cluster, session)?;
        let mut took = RunTimes::default();
        for attempt in 0..self.settings.max_manifest_retries {
            let current = manifest::load(&*self.storage, &manifest_key).await?;
            let (mut next, mut written, mut rows) = self
                .next_manifest(cluster, session, batch.tasks, &current, &mut took)
                .await?;
            next.stats
                .include_span(batch.span.first_ms, batch.span.last_ms);
            next.stats
                .include_created(batch.span.first_created_ms, batch.span.last_created_ms);
            next.stats.sequence = Some(next.sequence);
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
                        &self.storage,
                        cluster,
                        session,
                        &next.catalog_stats(),
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

    /// Builds the manifest that adds `tasks` to `current`, writing the data files it names;
    /// adds where its time went to `took`.
    async fn next_manifest(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        tasks: &Arc<SessionTasks>,
        current: &VersionedManifest,
        took: &mut RunTimes,
    ) -> Result<(Manifest, Vec<ObjectKey>, u64), CompactError> {
        let stored_failures = current.manifest.failures();
        let mut failures = stored_failures.clone();
        failures.merge(&tasks.failures);
        let filter = RowFilter {
            keys: tasks
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
        let tasks = Arc::clone(tasks);
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
                let merged = merge_stored(stored.attempts, &tasks);
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
                    // From the file just written: DuckDB decodes only the few columns these
                    // need.
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
                let bytes = self.upload(&deletes_path, &deletes_key).await?;
                written.push(deletes_key.clone());
                Deletes {
                    key: Some(deletes_key.clone()),
                    rows: superseded,
                    bytes: Some(bytes),
                }
            } else {
                Deletes::default()
            };
            let rollup_bytes = self.upload(&rollup_path, &rollup_key).await?;
            written.push(rollup_key.clone());
            let key_index_bytes = self.upload(&index_path, &index_key).await?;
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
                rollup_bytes: Some(rollup_bytes),
                key_index_bytes: Some(key_index_bytes),
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
            let base = self.fold_base(cluster, session, &next).await?;
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
                    rollup_bytes: None,
                    key_index_bytes: None,
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

    /// Deletes files written for a change that [`Commit::Lost`]: no manifest names them.
    pub(super) async fn delete_unreferenced(&self, written: &[ObjectKey]) {
        if let Err(err) = self.storage.delete_all(written).await {
            tracing::warn!(error = %err, "could not delete the unreferenced files");
        }
    }

    /// Deletes the files `previous` named and the landed `next` no longer does: retired files
    /// whose grace period ended (and, with no grace period, the files `next` replaced).
    pub(super) async fn delete_expired(&self, next: &Manifest, previous: &Manifest) {
        let still: BTreeSet<&ObjectKey> = next.keys().collect();
        let gone: Vec<ObjectKey> = previous
            .keys()
            .filter(|key| !still.contains(key))
            .cloned()
            .collect();
        for key in &gone {
            self.cache.forget(key).await;
        }
        if let Err(err) = self.storage.delete_all(&gone).await {
            tracing::warn!(error = %err, "could not delete the retired files; they stay harmless");
        }
    }
}

/// A session's commit: rows written, races lost first, and the manifest's new sequence.
pub(super) struct Landed {
    pub(super) rows: u64,
    pub(super) retries: usize,
    pub(super) sequence: u64,
    pub(super) took: RunTimes,
}

/// One session's share of a compaction run.
pub(super) struct SessionBatch<'a> {
    /// Its attempts; shared with the blocking write, which reads them without a copy.
    pub(super) tasks: &'a Arc<SessionTasks>,
    /// Its entities.
    pub(super) entities: &'a SessionEntities,
    /// The time span of the batch's events.
    pub(super) span: &'a SessionStats,
    /// ULID time of the oldest raw object of the session's cluster in this run.
    pub(super) oldest_raw_ms: Option<u64>,
}

/// True when `kind`'s records are the same in both.
fn kind_equal(kind: EntityKind, a: &SessionEntities, b: &SessionEntities) -> bool {
    match kind {
        EntityKind::Jobs => a.jobs == b.jobs,
        EntityKind::Actors => a.actors == b.actors,
        EntityKind::Nodes => a.nodes == b.nodes,
        EntityKind::Workers => a.workers == b.workers,
        EntityKind::PlacementGroups => a.placement_groups == b.placement_groups,
        EntityKind::Submissions => a.submissions == b.submissions,
    }
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
