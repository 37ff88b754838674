//! The manifest of one `(cluster, session)`: which immutable data files are live, plus the small
//! facts every compaction needs (job ends, worker deaths). It is the only object ever replaced,
//! always by a conditional put, so two compactions can never lose each other's work.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::event::encoding::Id;
use crate::merge::{FailureContext, WorkerDeath};
use crate::storage::{ETag, InvalidKey, ObjectKey, PutMode, Storage, StorageError};

/// A live data file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataFile {
    /// Its key.
    pub key: ObjectKey,
    /// Rows in it.
    pub rows: u64,
    /// Its size.
    pub bytes: u64,
    /// For a `task_attempts` delta: the stored rows it supersedes, so that a read drops them by
    /// position instead of comparing keys. `None` on bases, entity files, and deltas of an
    /// older format (a session with such a delta is read by key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletes: Option<Deletes>,
    /// For a `task_attempts` base or delta: its rollup (see [`crate::tables::rollup`]). `None`
    /// on entity files and on files of an older format (a session with such a file is counted
    /// by scanning it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollup: Option<ObjectKey>,
    /// The format of `rollup` ([`crate::tables::rollup::FORMAT`] when this build wrote it);
    /// absent for the first format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollup_format: Option<u32>,
    /// For a delta: how many deltas its rollup counts, itself and those just before it.
    /// Compaction adds some earlier deltas' rollups into each new one
    /// ([`TableFiles::rollups_to_add_in`]), so a read sums a few rollups instead of one per
    /// delta. Always written with rollup format 3; a format-3 rollup without it (a build that
    /// knows no such field rewrote the manifest) is not read, as its span is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollup_covers: Option<u32>,
    /// For a `task_attempts` base or delta: its key index (see
    /// [`crate::tables::key_index`]). `None` on entity files and on files of an older format (a
    /// session with such a file is looked up by scanning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_index: Option<ObjectKey>,
    /// The size of `rollup`; `None` when written by a build that did not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollup_bytes: Option<u64>,
    /// The size of `key_index`; `None` when written by a build that did not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_index_bytes: Option<u64>,
}

impl DataFile {
    /// The size of `key`, one of this file's objects ([`Self::keys`]). Where the manifest
    /// does not record it, the data file's own size stands in: every companion object holds
    /// less than the rows it describes, so a read's planned bytes are never underestimated.
    pub fn size_of(&self, key: &ObjectKey) -> u64 {
        let recorded = if self.rollup.as_ref() == Some(key) {
            self.rollup_bytes
        } else if self.key_index.as_ref() == Some(key) {
            self.key_index_bytes
        } else if self
            .deletes
            .as_ref()
            .and_then(|deletes| deletes.key.as_ref())
            == Some(key)
        {
            self.deletes.as_ref().and_then(|deletes| deletes.bytes)
        } else {
            Some(self.bytes)
        };
        recorded.unwrap_or(self.bytes)
    }

    /// The objects this file consists of: its data, and its deletion vector, rollup and key
    /// index if it has them.
    pub fn keys(&self) -> impl Iterator<Item = &ObjectKey> {
        std::iter::once(&self.key)
            .chain(
                self.deletes
                    .as_ref()
                    .and_then(|deletes| deletes.key.as_ref()),
            )
            .chain(self.rollup.as_ref())
            .chain(self.key_index.as_ref())
    }

    /// Its rollup, if it has one in a format this build reads.
    pub fn current_rollup(&self) -> Option<&ObjectKey> {
        self.rollup.as_ref().filter(|_| {
            self.rollup_format
                .is_some_and(crate::tables::rollup::reads_format)
        })
    }

    /// How many deltas its rollup counts ([`DataFile::rollup_covers`]): one for format 2,
    /// which counted its own file alone; `None` when unknown.
    fn rollup_span(&self) -> Option<usize> {
        match self.rollup_format? {
            2 => Some(1),
            crate::tables::rollup::FORMAT => self
                .rollup_covers
                .and_then(|covers| usize::try_from(covers).ok())
                .filter(|covers| *covers >= 1),
            _ => None,
        }
    }
}

/// The rows one delta supersedes: a Parquet file of `(file, row)` pairs, `file` being the
/// superseded row's file as a position in [`TableFiles::all`] when the delta was committed and
/// `row` its row number there. Positions stay valid until the next base, which replaces every
/// file at once (only deltas are appended in between).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deletes {
    /// The vector's key; `None` when the delta supersedes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<ObjectKey>,
    /// Pairs in it.
    pub rows: u64,
    /// The vector's size; `None` when written by a build that did not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

/// The files of one table: one base (possibly several files) and the deltas written
/// since, oldest first. A key's newest row is in the newest file that has it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableFiles {
    /// Files of the base.
    pub base: Vec<DataFile>,
    /// Delta files, oldest first.
    pub deltas: Vec<DataFile>,
}

impl TableFiles {
    /// Every live file, oldest first.
    pub fn all(&self) -> impl Iterator<Item = &DataFile> {
        self.base.iter().chain(&self.deltas)
    }

    /// True when every delta says which rows it supersedes, so the table reads without a
    /// key join (see [`crate::tables::newest`]).
    pub fn has_deletion_vectors(&self) -> bool {
        self.deltas.iter().all(|delta| delta.deletes.is_some())
    }

    /// True when a tidy folds this table: it has deltas, or a base of an older format (its
    /// rollup in an older format, or no key index), which is written again once so that every
    /// session ends up read the fast way.
    pub fn needs_fold(&self) -> bool {
        let current_base = self.has_rollups() && self.has_key_indexes();
        !self.deltas.is_empty() || (!self.base.is_empty() && !current_base)
    }

    /// True when every file has a key index.
    pub fn has_key_indexes(&self) -> bool {
        self.all().all(|file| file.key_index.is_some())
    }

    /// True when every file has a rollup this build reads (they then add up to the table's
    /// counts).
    pub fn has_rollups(&self) -> bool {
        self.all().all(|file| file.current_rollup().is_some())
    }

    /// The rollups whose counts add up to the table's: every base file's, and
    /// [`TableFiles::delta_rollups`]. `None` unless [`TableFiles::has_rollups`].
    pub fn rollups(&self) -> Option<Vec<&ObjectKey>> {
        if !self.has_rollups() {
            return None;
        }
        let mut keys: Vec<&ObjectKey> = self
            .base
            .iter()
            .filter_map(DataFile::current_rollup)
            .collect();
        keys.extend(self.delta_rollups()?);
        Some(keys)
    }

    /// The rollups that count every delta once, oldest first: the newest delta's, then the
    /// rollup of the newest delta it does not cover, and so on. `None` when a delta has no
    /// rollup this build reads.
    pub fn delta_rollups(&self) -> Option<Vec<&ObjectKey>> {
        Some(
            self.delta_rollup_spans()?
                .into_iter()
                .map(|(key, _)| key)
                .collect(),
        )
    }

    /// The rollups a new delta's rollup adds in, oldest first, and how many deltas it then
    /// counts, itself included: the newest of [`TableFiles::delta_rollups`] for as long as
    /// each counts no more deltas than those gathered before it. As with a binary counter's
    /// carries, a delta's cells are rewritten only when the span they are in doubles, so a
    /// run rewrites few cells and a read sums one rollup per bit of the number of deltas.
    /// None to add in (and only itself) when a delta has no rollup this build reads.
    pub fn rollups_to_add_in(&self) -> (Vec<&ObjectKey>, usize) {
        let spans = self.delta_rollup_spans().unwrap_or_default();
        let mut covers = 1;
        let mut keys = Vec::new();
        for (key, span) in spans.into_iter().rev() {
            if span > covers {
                break;
            }
            covers += span;
            keys.push(key);
        }
        keys.reverse();
        (keys, covers)
    }

    /// [`TableFiles::delta_rollups`], each with how many deltas it counts. `None` also when
    /// a rollup's span is unknown or reaches past the first delta (the deltas before it were
    /// folded into the base, which would count them twice).
    fn delta_rollup_spans(&self) -> Option<Vec<(&ObjectKey, usize)>> {
        if self
            .deltas
            .iter()
            .any(|delta| delta.current_rollup().is_none())
        {
            return None;
        }
        let mut spans = Vec::new();
        let mut uncovered = self.deltas.len();
        while let Some(newest) = uncovered.checked_sub(1) {
            let delta = self.deltas.get(newest)?;
            let span = delta.rollup_span()?;
            uncovered = uncovered.checked_sub(span)?;
            spans.push((delta.current_rollup()?, span));
        }
        spans.reverse();
        Some(spans)
    }
}

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

/// What a session holds, kept current by compaction for readers that list sessions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStats {
    /// Distinct task attempts in `task_attempts`.
    pub attempts: u64,
    /// Earliest event time seen (ms since the epoch).
    pub first_ms: Option<i64>,
    /// Latest event time seen (ms since the epoch).
    pub last_ms: Option<i64>,
    /// Earliest creation time (`creation_time_ms`) of an attempt. A time range on creation
    /// leaves out a session whose attempts were all created outside it; `None` (no attempt
    /// with a creation time, or recorded by a build that did not keep it) never does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_created_ms: Option<i64>,
    /// Latest creation time of an attempt (see [`Self::first_created_ms`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_created_ms: Option<i64>,
}

impl SessionStats {
    /// Widens the span of creation times to include `first..=last`.
    pub fn include_created(&mut self, first: Option<i64>, last: Option<i64>) {
        self.first_created_ms = widen(self.first_created_ms, first, i64::min);
        self.last_created_ms = widen(self.last_created_ms, last, i64::max);
    }

    /// True when an attempt may have been created in `[since, until)` (either end open).
    pub fn may_have_created(&self, since: Option<i64>, until: Option<i64>) -> bool {
        let (Some(first), Some(last)) = (self.first_created_ms, self.last_created_ms) else {
            return true;
        };
        since.is_none_or(|since| last >= since) && until.is_none_or(|until| first < until)
    }

    /// Widens the time span to include `first..=last`.
    pub fn include_span(&mut self, first: Option<i64>, last: Option<i64>) {
        self.first_ms = widen(self.first_ms, first, i64::min);
        self.last_ms = widen(self.last_ms, last, i64::max);
    }
}

/// `known` and `seen` combined by `pick`, either alone when the other is unknown.
fn widen(known: Option<i64>, seen: Option<i64>, pick: fn(i64, i64) -> i64) -> Option<i64> {
    match (known, seen) {
        (Some(a), Some(b)) => Some(pick(a, b)),
        (a, b) => a.or(b),
    }
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
    use crate::tables::rollup;

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

    /// A delta with a rollup: `format`, covering `covers` deltas (`None`: unsaid).
    fn delta(name: &str, format: Option<u32>, covers: Option<u32>) -> DataFile {
        let key = |kind: &str| ObjectKey::new(format!("tables/t/{kind}-{name}.parquet"));
        DataFile {
            key: key("delta").expect("a key"),
            rows: 1,
            bytes: 1,
            deletes: None,
            rollup: Some(key("rollup").expect("a key")),
            rollup_format: format,
            rollup_covers: covers,
            key_index: None,
            rollup_bytes: None,
            key_index_bytes: None,
        }
    }

    fn names(keys: &[&ObjectKey]) -> Vec<String> {
        keys.iter()
            .map(|key| key.as_str().trim_start_matches("tables/t/").to_owned())
            .collect()
    }

    #[test]
    fn the_rollups_read_count_each_delta_once_whatever_the_previous_build_wrote() {
        let base = DataFile {
            rollup_covers: None,
            ..delta("base", Some(2), None)
        };
        // Two deltas of a build whose rollups each counted themselves, then this build's: the
        // third counts all three, the fourth all four; the fifth only itself (its run could not
        // read the others' rollups).
        let table = TableFiles {
            base: vec![base],
            deltas: vec![
                delta("1", Some(2), None),
                delta("2", Some(2), None),
                delta("3", Some(rollup::FORMAT), Some(3)),
                delta("4", Some(rollup::FORMAT), Some(4)),
                delta("5", Some(rollup::FORMAT), Some(1)),
            ],
        };
        let read = table.rollups().expect("readable rollups");
        assert_eq!(
            names(&read),
            [
                "rollup-base.parquet",
                "rollup-4.parquet",
                "rollup-5.parquet"
            ]
        );
        // The fourth counting only itself and the third: the two before are read on their own.
        let mut partly = table.clone();
        partly.deltas[3].rollup_covers = Some(2);
        assert_eq!(
            names(&partly.rollups().expect("readable rollups")),
            [
                "rollup-base.parquet",
                "rollup-1.parquet",
                "rollup-2.parquet",
                "rollup-4.parquet",
                "rollup-5.parquet"
            ]
        );
        // A rollup counting more deltas than there are (some were folded since), or a
        // format-3 rollup whose span a build that knows no `rollup_covers` dropped: its span
        // is unknown, so nothing adds up and reads scan.
        for covers in [Some(3), None, Some(0)] {
            let unknown = TableFiles {
                base: Vec::new(),
                deltas: vec![
                    delta("1", Some(2), None),
                    delta("2", Some(rollup::FORMAT), covers),
                ],
            };
            assert!(unknown.delta_rollups().is_none(), "covers {covers:?}");
            assert!(unknown.rollups().is_none(), "covers {covers:?}");
            assert_eq!(unknown.rollups_to_add_in(), (Vec::new(), 1));
        }
        // Runs that each add a delta whose rollup adds in what `rollups_to_add_in` names: after
        // n runs a read sums one rollup per bit of n, each counting a power of two deltas.
        let mut runs = TableFiles::default();
        for run in 1..=40_u32 {
            let (added, covers) = runs.rollups_to_add_in();
            let added = added.len();
            let mut new = delta(&run.to_string(), Some(rollup::FORMAT), None);
            new.rollup_covers = Some(u32::try_from(covers).expect("a small span"));
            runs.deltas.push(new);
            let read = runs.delta_rollups().expect("readable");
            assert_eq!(read.len(), run.count_ones() as usize, "after {run} runs");
            // Adding in takes the rollups of the carried bits: as many as trailing ones.
            assert_eq!(added, (run - 1).trailing_ones() as usize, "run {run}");
            let spans: Vec<usize> = runs
                .delta_rollup_spans()
                .expect("readable")
                .into_iter()
                .map(|(_, span)| span)
                .collect();
            let bits: Vec<usize> = (0..32)
                .rev()
                .map(|bit| 1_usize << bit)
                .filter(|span| run as usize & span != 0)
                .collect();
            assert_eq!(spans, bits, "after {run} runs");
        }
        // A rollup of the first format (or none) anywhere: nothing adds up.
        let mut old = table.clone();
        old.deltas[0].rollup_format = None;
        assert!(old.rollups().is_none() && old.delta_rollups().is_none());
        let mut newer = table;
        newer.deltas[4].rollup_format = Some(rollup::FORMAT + 1);
        assert!(newer.rollups().is_none());
    }
}
