//! The manifest of one `(cluster, session)`: which immutable data files are live, plus the small
//! facts every compaction needs (job ends, worker deaths). It is the only object ever replaced,
//! always by a conditional put, so two compactions can never lose each other's work. The files
//! a table has are in `files`, what a session holds in `stats`.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::event::encoding::Id;
use crate::merge::{FailureContext, WorkerDeath};
use tokio::task::JoinSet;

use crate::keys::{self, ClusterName, SessionName};
use crate::storage::{ETag, InvalidKey, ObjectKey, PutMode, Storage, StorageError};

mod files;
mod stats;

pub use self::files::{DataFile, Deletes, TableFiles};
pub use self::stats::SessionStats;

/// A file no longer live, kept until readers that started before can no longer need it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredFile {
    /// Its key.
    pub key: ObjectKey,
    /// When it left the manifest (ms since the epoch).
    pub retired_at_ms: i64,
}

/// A worker's death as the manifest keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredWorkerDeath {
    /// End time (ns).
    pub at: i64,
    /// `WorkerExitType` number.
    pub exit_type_number: i32,
    /// Exit detail.
    pub detail: String,
}

/// The manifest document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version of this document.
    pub format: u32,
    /// Commits so far.
    pub sequence: u64,
    /// The `task_attempts` table.
    pub task_attempts: TableFiles,
    /// `task_profile` files of an older format (a profile span table nothing read: the spans
    /// are on each attempt, `profile_events`). Never written now; the next base retires them.
    #[serde(default)]
    pub task_profile: TableFiles,
    /// The entity tables (`jobs`, `actors`, `nodes`, `workers`): one whole file each.
    #[serde(default)]
    pub entities: BTreeMap<String, DataFile>,
    /// Job id (hex) → end time (ns).
    pub job_ends: BTreeMap<String, i64>,
    /// Worker id (hex) → death.
    pub worker_deaths: BTreeMap<String, StoredWorkerDeath>,
    /// Files waiting out the grace period before deletion.
    pub retired: Vec<RetiredFile>,
    /// What the session holds.
    #[serde(default)]
    pub stats: SessionStats,
    /// The sequence a quiet check found when it wrote this version; `None` when a compaction
    /// run wrote it. The same check delivered again (its follow-up could not be queued) is
    /// then recognized as the one that tidied, not taken for a stale one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tidied_from: Option<u64>,
}

impl Manifest {
    /// What the catalog records of the session this manifest holds: its statistics, with the
    /// manifest's sequence and the entity tables it has rows in.
    pub fn catalog_stats(&self) -> SessionStats {
        SessionStats {
            manifest_sequence: Some(self.sequence),
            entity_tables: Some(self.entities.keys().cloned().collect()),
            ..self.stats.clone()
        }
    }

    /// The version after this one, as a compaction run writes it.
    pub fn next_run(&self) -> Self {
        Self {
            sequence: self.sequence + 1,
            tidied_from: None,
            ..self.clone()
        }
    }

    /// The version after this one, as the quiet check of this one writes it.
    pub fn next_tidy(&self) -> Self {
        Self {
            sequence: self.sequence + 1,
            tidied_from: Some(self.sequence),
            ..self.clone()
        }
    }

    /// Whether a quiet check of version `sequence` still finds the session as it left it:
    /// unchanged, or changed only by that same check's tidy.
    pub fn quiet_since(&self, sequence: u64) -> bool {
        self.sequence == sequence || self.tidied_from == Some(sequence)
    }

    /// Makes `base` the session's only `task_attempts` file, retiring every file it replaces
    /// at `now_ms`; returns its keys (data, rollup and key index).
    pub fn install_base(&mut self, base: DataFile, now_ms: i64) -> Vec<ObjectKey> {
        let installed = base.keys().cloned().collect();
        let replaced: Vec<RetiredFile> = self
            .task_attempts
            .all()
            .chain(self.task_profile.all())
            .flat_map(DataFile::keys)
            .map(|key| RetiredFile {
                key: key.clone(),
                retired_at_ms: now_ms,
            })
            .collect();
        self.retired.extend(replaced);
        self.task_attempts = TableFiles {
            base: vec![base],
            deltas: Vec::new(),
        };
        self.task_profile = TableFiles::default();
        installed
    }

    /// The session's manifest once it has expired: the next version, with no live file and
    /// every file this one names retired, those live here at `now_ms` (the retired keep their
    /// time). Readers already under way, and Iceberg snapshots that name the files, keep them
    /// through the grace period.
    pub fn expired(&self, now_ms: i64) -> Self {
        let live = self
            .task_attempts
            .all()
            .chain(self.task_profile.all())
            .chain(self.entities.values())
            .flat_map(DataFile::keys)
            .map(|key| RetiredFile {
                key: key.clone(),
                retired_at_ms: now_ms,
            });
        Self {
            sequence: self.sequence.saturating_add(1),
            retired: self.retired.iter().cloned().chain(live).collect(),
            ..Self::empty()
        }
    }

    /// The session's manifest once `rebuild` has dropped its tables: the next version, with no
    /// file at all (a rebuild deletes them at once). It keeps the session's sequence, so that
    /// compacting the session again continues past every version published before: Iceberg
    /// never takes a session back to an older version of its manifest.
    pub fn dropped(&self) -> Self {
        Self {
            sequence: self.sequence.saturating_add(1),
            ..Self::empty()
        }
    }

    /// Every file this manifest names, live or retired.
    pub fn keys(&self) -> impl Iterator<Item = &ObjectKey> {
        self.task_attempts
            .all()
            .chain(self.task_profile.all())
            .chain(self.entities.values())
            .flat_map(DataFile::keys)
            .chain(self.retired.iter().map(|file| &file.key))
    }

    /// True when `key` is one of this manifest's files, live or retired.
    pub fn names(&self, key: &ObjectKey) -> bool {
        self.keys().any(|file| file == key)
    }

    /// What failure synthesis knows so far.
    pub fn failures(&self) -> FailureContext {
        let mut context = FailureContext::default();
        for (job, &end) in &self.job_ends {
            if let Some(id) = Id::from_hex(job) {
                context.job_ends.insert(id, end);
            }
        }
        for (worker, death) in &self.worker_deaths {
            if let Some(id) = Id::from_hex(worker) {
                context.worker_deaths.insert(
                    id,
                    WorkerDeath {
                        at: death.at,
                        exit_type_number: death.exit_type_number,
                        detail: death.detail.clone(),
                    },
                );
            }
        }
        context
    }

    /// Records what failure synthesis knows.
    pub fn set_failures(&mut self, context: &FailureContext) {
        self.job_ends = context
            .job_ends
            .iter()
            .map(|(job, &end)| (job.to_string(), end))
            .collect();
        self.worker_deaths = context
            .worker_deaths
            .iter()
            .map(|(worker, death)| {
                (
                    worker.to_string(),
                    StoredWorkerDeath {
                        at: death.at,
                        exit_type_number: death.exit_type_number,
                        detail: death.detail.clone(),
                    },
                )
            })
            .collect();
    }
}

/// Why a manifest could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Storage failed (including a lost conditional write: [`StorageError::Precondition`]).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The stored document is not a manifest this build reads.
    #[error("manifest {key} is unreadable: {reason}")]
    Unreadable {
        /// The manifest's key.
        key: ObjectKey,
        /// What is wrong.
        reason: String,
    },
    /// The key could not be formed.
    #[error(transparent)]
    Key(#[from] InvalidKey),
}

/// A manifest as read, with the version a conditional update must name.
#[derive(Clone, Debug)]
pub struct VersionedManifest {
    /// The document (empty when none exists yet).
    pub manifest: Manifest,
    /// Its version; `None` when it does not exist yet.
    pub etag: Option<ETag>,
}

/// A small JSON document replaced by conditional writes (a manifest, the catalog).
pub(crate) trait Document: Serialize + serde::de::DeserializeOwned {
    /// The format this build writes.
    const FORMAT: u32;
    /// The oldest format this build still reads (those in between, too).
    const OLDEST: u32;
    /// The document's format field.
    fn format(&self) -> u32;
    /// The document as this build writes it: an older format it reads holds nothing this
    /// format cannot, so it is carried on at `FORMAT`.
    fn into_current(self) -> Self;
    /// The document before anything was written.
    fn empty() -> Self;
}

/// Implements [`Document`] for a `Default` struct with a `format: u32` field, written at
/// `FORMAT` and read from `OLDEST` on.
macro_rules! document {
    ($type:ty, $format:literal) => {
        document!($type, $format, $format);
    };
    ($type:ty, $format:literal, $oldest:literal) => {
        impl $crate::tables::manifest::Document for $type {
            const FORMAT: u32 = $format;
            const OLDEST: u32 = $oldest;

            fn format(&self) -> u32 {
                self.format
            }

            fn into_current(self) -> Self {
                Self {
                    format: $format,
                    ..self
                }
            }

            fn empty() -> Self {
                Self {
                    format: $format,
                    ..Self::default()
                }
            }
        }
    };
}
pub(crate) use document;

/// Reads the document at `key` and its version, or the empty document when there is none.
pub(crate) async fn load_document<T: Document>(
    storage: &dyn Storage,
    key: &ObjectKey,
) -> Result<(T, Option<ETag>), ManifestError> {
    match storage.get(key).await {
        Ok(stored) => {
            let document: T =
                serde_json::from_slice(&stored.body).map_err(|err| ManifestError::Unreadable {
                    key: key.clone(),
                    reason: err.to_string(),
                })?;
            if !(T::OLDEST..=T::FORMAT).contains(&document.format()) {
                return Err(ManifestError::Unreadable {
                    key: key.clone(),
                    reason: format!(
                        "format {} (this build reads {} to {})",
                        document.format(),
                        T::OLDEST,
                        T::FORMAT
                    ),
                });
            }
            Ok((document.into_current(), Some(stored.etag)))
        }
        Err(StorageError::NotFound { .. }) => Ok((T::empty(), None)),
        Err(err) => Err(err.into()),
    }
}

// Format 2: its `task_attempts` files may store report times by reference
// (`tables::report_times`), which a build reading format 1 would take for missing times and
// merge away; such a build refuses format 2 instead (a deploy that overlaps or rolls back
// fails loudly rather than losing facts). Format 1 manifests are read and rewritten as 2.
document!(Manifest, 2, 1);

/// Reads the manifest at `key`, or an empty one.
pub async fn load(
    storage: &dyn Storage,
    key: &ObjectKey,
) -> Result<VersionedManifest, ManifestError> {
    let (manifest, etag) = load_document(storage, key).await?;
    Ok(VersionedManifest { manifest, etag })
}

/// Manifests [`load_each`] reads at once.
const PARALLEL_LOADS: usize = 64;

/// The manifests of `sessions`, in the order given (an absent one empty), read
/// [`PARALLEL_LOADS`] at a time: every session's, for a whole-history read, is thousands.
pub async fn load_each(
    storage: &Arc<dyn Storage>,
    sessions: &[(ClusterName, SessionName)],
) -> Result<Vec<Manifest>, ManifestError> {
    let mut loaded: Vec<(usize, Manifest)> = Vec::with_capacity(sessions.len());
    let mut loads = JoinSet::new();
    let mut next = sessions.iter().enumerate();
    loop {
        while loads.len() < PARALLEL_LOADS
            && let Some((index, (cluster, session))) = next.next()
        {
            let storage = Arc::clone(storage);
            let key = keys::manifest_key(cluster, session)?;
            loads.spawn(async move {
                let read = load(&*storage, &key).await;
                (index, read.map(|read| read.manifest))
            });
        }
        let Some(joined) = loads.join_next().await else {
            break;
        };
        let (index, manifest) =
            joined.map_err(|err| StorageError::backend(keys::MANIFESTS_PREFIX, err.to_string()))?;
        loaded.push((index, manifest?));
    }
    loaded.sort_by_key(|(index, _)| *index);
    Ok(loaded.into_iter().map(|(_, manifest)| manifest).collect())
}

/// Replaces the manifest only if it is still the version read (or still absent). A lost race is
/// `ManifestError::Storage(StorageError::Precondition)`: re-read and redo.
pub async fn store(
    storage: &dyn Storage,
    key: &ObjectKey,
    manifest: &Manifest,
    read_version: Option<&ETag>,
) -> Result<ETag, ManifestError> {
    let body = serde_json::to_vec(manifest).map_err(|err| ManifestError::Unreadable {
        key: key.clone(),
        reason: err.to_string(),
    })?;
    let mode = match read_version {
        Some(etag) => PutMode::Update(etag.clone()),
        None => PutMode::Create,
    };
    Ok(storage.put(key, Bytes::from(body), mode).await?)
}

/// How a conditional manifest replacement ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Commit {
    /// The manifest holds the change.
    Landed,
    /// Another writer replaced the manifest first: the change is not in it and can no longer
    /// land (its condition names a version that is gone), so the files written for it are
    /// referenced by nothing.
    Lost,
}

/// Replaces the manifest with `next` if it is still the version read, and says whether the
/// change landed.
///
/// A refused conditional write is not always a lost race: when the response to a write that
/// succeeded is lost, the SDK retries it, and the retry is refused because the first attempt
/// already changed the version. So a refusal is checked by reading the manifest again: the
/// change landed when the manifest names a file `written` for it (keys are unique, so no other
/// change names them, and a later fold keeps them in `retired` through the grace period), or,
/// for a change that wrote no file, when the manifest is `next` itself.
///
/// A write that met another one in flight ([`StorageError::Conflict`]) is undecided while the
/// manifest is still the version read: the write in flight may be this change's own first
/// attempt, which can still land. It is read again, a little later each time, until the
/// version moves on ([`SETTLE_DELAYS`]); one that never moves on is the error itself. Any error
/// is an outcome unknown: callers must then leave the written files alone.
#[tracing::instrument(name = "manifest.commit", skip_all, fields(key = %key))]
pub async fn commit(
    storage: &dyn Storage,
    key: &ObjectKey,
    next: &Manifest,
    read_version: Option<&ETag>,
    written: &[ObjectKey],
) -> Result<Commit, ManifestError> {
    match store(storage, key, next, read_version).await {
        Ok(_) => Ok(Commit::Landed),
        Err(ManifestError::Storage(StorageError::Precondition { .. })) => {
            let now = load(storage, key).await?;
            Ok(decided(&now, next, written))
        }
        Err(ManifestError::Storage(conflict @ StorageError::Conflict { .. })) => {
            for delay in SETTLE_DELAYS {
                let now = load(storage, key).await?;
                if now.etag.as_ref() != read_version {
                    return Ok(decided(&now, next, written));
                }
                tracing::info!(?delay, "another manifest write is in flight; reading again");
                tokio::time::sleep(delay).await;
            }
            let now = load(storage, key).await?;
            if now.etag.as_ref() != read_version {
                return Ok(decided(&now, next, written));
            }
            Err(conflict.into())
        }
        Err(err) => Err(err),
    }
}

/// How long a commit that met a write in flight waits, between readings, for the manifest's
/// version to move on: about six seconds in all, longer than a manifest PUT takes unless S3
/// itself is failing.
pub const SETTLE_DELAYS: [std::time::Duration; 6] = [
    std::time::Duration::from_millis(100),
    std::time::Duration::from_millis(200),
    std::time::Duration::from_millis(400),
    std::time::Duration::from_millis(800),
    std::time::Duration::from_millis(1600),
    std::time::Duration::from_millis(3200),
];

/// Whether a change refused under a version that has since moved on landed: its condition names
/// a version that is gone, so it can no longer land later.
fn decided(now: &VersionedManifest, next: &Manifest, written: &[ObjectKey]) -> Commit {
    let landed = if written.is_empty() {
        now.manifest == *next
    } else {
        written.iter().any(|file| now.manifest.names(file))
    };
    if landed {
        tracing::info!("the manifest write was refused, but holds this change already");
        Commit::Landed
    } else {
        Commit::Lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_check_is_quiet_after_its_own_tidy_and_not_after_a_run() {
        let checked = Manifest {
            sequence: 7,
            ..Manifest::default()
        };
        assert!(checked.quiet_since(7));
        let tidied = checked.next_tidy();
        assert_eq!(tidied.sequence, 8);
        assert!(tidied.quiet_since(7), "the same check, delivered again");
        assert!(tidied.quiet_since(8), "its follow-up");
        assert!(!tidied.quiet_since(6), "an older check");
        let run = tidied.next_run();
        assert_eq!(run.sequence, 9);
        assert!(
            !run.quiet_since(7) && !run.quiet_since(8),
            "a run came since"
        );
        assert!(run.quiet_since(9));
    }

    #[test]
    fn manifests_without_a_tidy_mark_read_and_write_as_before() {
        let json = serde_json::to_value(Manifest::default().next_run()).expect("serialized");
        assert!(json.get("tidied_from").is_none(), "{json}");
        let read: Manifest = serde_json::from_value(json).expect("read back");
        assert_eq!(read.tidied_from, None);
    }
}
