//! What one request reads: the sessions in scope, their manifests, and local copies of the live
//! files those manifests name. Nothing is listed: the catalog names the sessions
//! ([`super::catalog`]) and each manifest names its files, so a request costs the catalog's
//! documents in scope (one, for a cluster), one GET per manifest, and the files not cached.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::catalog::{documents_in_scope, session_stats};
use super::params::Scope;
use crate::keys::{ClusterName, SessionName};
use crate::query::QueryError;
use crate::storage::{CachedFiles, FileCache, ObjectKey, Storage};
use crate::tables::catalog::ClusterCatalog;
use crate::tables::cluster_rollup::ClusterRollup;
use crate::tables::entities::EntityKind;
use crate::tables::manifest::{self, Manifest, SessionStats};
use crate::tables::newest::{LocalDeletes, LocalFiles};

/// One session's manifest.
#[derive(Clone, Debug)]
pub struct SessionManifest {
    /// Cluster.
    pub cluster: String,
    /// Session.
    pub session: String,
    /// Its manifest.
    pub manifest: Manifest,
}

/// The tables of every session in scope, as local files.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// `task_attempts`.
    pub task_attempts: LocalFiles,
    /// The rollups that add up to the counts of every `task_attempts` file in scope
    /// ([`crate::tables::manifest::TableFiles::rollups`]), when asked for and every file has
    /// one (see [`crate::tables::rollup`]); `None` to count by scanning. Within a time range,
    /// only the sessions created wholly inside it are counted by their rollups (their dated
    /// rows, [`crate::tables::manifest::TableFiles::dated_rollups`]), and the attempts of the
    /// others are in [`Self::task_attempts`].
    pub rollups: Option<Vec<PathBuf>>,
    /// The key index of every `task_attempts` file in scope, session by session and within
    /// one in manifest order (base files, then deltas oldest first), when asked for and every
    /// file has one (see [`crate::tables::key_index`]); `None` to look up by scanning. The data
    /// files themselves are fetched only when [`Needs::attempts`] asks for them too.
    pub key_indexes: Option<Vec<IndexedFile>>,
    /// Entity tables: one file per session each.
    pub entities: BTreeMap<EntityKind, Vec<PathBuf>>,
    /// Keeps the files in the cache while a query may read them.
    pub pins: Option<Pins>,
}

/// A `task_attempts` file's key index, fetched, and the key of the data file it indexes.
#[derive(Clone, Debug)]
pub struct IndexedFile {
    /// The index's local copy.
    pub index: PathBuf,
    /// The data file.
    pub data: ObjectKey,
    /// Rows in the data file.
    pub rows: u64,
}

/// Cached files held for a query (see [`CachedFiles`]).
pub type Pins = Arc<CachedFiles<Vec<Option<PathBuf>>>>;

/// The manifests of every session in `scope`, fetched in parallel.
pub async fn manifests(
    storage: &Arc<dyn Storage>,
    scope: &Scope,
) -> Result<Vec<SessionManifest>, QueryError> {
    manifests_of(storage, &session_stats(storage, scope).await?).await
}

/// The manifests of `sessions` (cluster → session → statistics), fetched in parallel.
#[tracing::instrument(name = "manifests", skip_all, fields(sessions = tracing::field::Empty))]
async fn manifests_of(
    storage: &Arc<dyn Storage>,
    sessions: &BTreeMap<String, BTreeMap<String, SessionStats>>,
) -> Result<Vec<SessionManifest>, QueryError> {
    let mut named = Vec::new();
    for (cluster, sessions) in sessions {
        for session in sessions.keys() {
            let name = ClusterName::new(cluster)
                .map_err(|err| QueryError::Internal(format!("catalog: {err}")))?;
            let session_name = SessionName::new(session)
                .map_err(|err| QueryError::Internal(format!("catalog: {err}")))?;
            named.push((name, session_name));
        }
    }
    let manifests = manifest::load_each(storage, &named).await?;
    let mut found: Vec<SessionManifest> = named
        .into_iter()
        .zip(manifests)
        .map(|((cluster, session), manifest)| SessionManifest {
            cluster: cluster.as_str().to_owned(),
            session: session.as_str().to_owned(),
            manifest,
        })
        .collect();
    found.sort_by(|a, b| (&a.cluster, &a.session).cmp(&(&b.cluster, &b.session)));
    tracing::Span::current().record("sessions", found.len());
    Ok(found)
}

/// Which tables a request needs, so it fetches nothing else.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// `task_attempts` (which also holds each attempt's profile spans).
    pub attempts: bool,
    /// One entity table.
    pub entity: Option<EntityKind>,
    /// The rollups of `task_attempts` (see [`Snapshot::rollups`]).
    pub rollups: bool,
    /// The key indexes of `task_attempts` (see [`Snapshot::key_indexes`]).
    pub key_indexes: bool,
    /// With [`Needs::rollups`] alone: the rollups are read only by groupings a cluster's
    /// rollup keeps ([`crate::tables::rollup::CLUSTER_GROUPINGS`]), so a scope of whole
    /// clusters may read the sessions a cluster's rollup counts from it.
    pub cluster_rollups: bool,
}

/// Local copies of the files `needs` names, for every session in `scope`. A scope of several
/// sessions is refused before anything is fetched when the files that are not local would
/// come to more than `copy_budget` bytes (cached or not, so that an answer does not depend on
/// what earlier requests left in the cache); one session, the narrowest scope there is, is
/// always read.
#[tracing::instrument(name = "snapshot", skip_all, fields(copied_bytes = tracing::field::Empty, cluster_rollups = tracing::field::Empty))]
pub async fn snapshot(
    storage: &Arc<dyn Storage>,
    cache: &FileCache,
    scope: &Scope,
    needs: Needs,
    copy_budget: u64,
) -> Result<Snapshot, QueryError> {
    let mut in_scope = documents_in_scope(storage, scope).await?;
    let in_cluster_rollups = take_cluster_rollups(&mut in_scope, scope, needs);
    let counted_apart: usize = in_cluster_rollups
        .iter()
        .map(|rollup| rollup.counts.len())
        .sum();
    let stats: BTreeMap<String, BTreeMap<String, SessionStats>> = in_scope
        .into_iter()
        .map(|(cluster, document)| (cluster, document.sessions))
        .collect();
    let sessions = manifests_of(storage, &stats).await?;
    let session_count = sessions.len() + counted_apart;
    tracing::Span::current().record("cluster_rollups", in_cluster_rollups.len());
    let mut keys: Vec<ObjectKey> = Vec::new();
    let mut plan: Vec<(Slot, usize)> = Vec::new();
    // The data file of each key index asked for, by (session ordinal, position).
    let mut data_keys: BTreeMap<(usize, usize), (ObjectKey, u64)> = BTreeMap::new();
    let mut to_copy: u64 = 0;
    // Whether each session's attempts are read (by its ordinal), and whether each in a range
    // read by rollups is counted by them.
    let mut scanned = vec![needs.attempts; sessions.len()];
    let mut by_rollups = vec![needs.rollups; sessions.len()];
    for rollup in &in_cluster_rollups {
        if storage.local_path(&rollup.key).is_none() {
            to_copy = to_copy.saturating_add(rollup.bytes);
        }
        plan.push((Slot::Rollup, keys.len()));
        keys.push(rollup.key.clone());
    }
    for (ordinal, session) in sessions.iter().enumerate() {
        let manifest = &session.manifest;
        let table = &manifest.task_attempts;
        let sizes: BTreeMap<&ObjectKey, u64> = table
            .all()
            .chain(manifest.entities.values())
            .flat_map(|file| file.keys().map(|key| (key, file.size_of(key))))
            .collect();
        let mut add = |slot: Slot, key: &ObjectKey| {
            if storage.local_path(key).is_none() {
                to_copy = to_copy.saturating_add(sizes.get(key).copied().unwrap_or(0));
            }
            plan.push((slot, keys.len()));
            keys.push(key.clone());
        };
        if needs.rollups && scope.created.is_unbounded() {
            for key in table.rollups().unwrap_or_default() {
                add(Slot::Rollup, key);
            }
        } else if needs.rollups {
            // The manifest's own statistics, which the catalog's may lag.
            let within = manifest
                .stats
                .created_within(scope.created.since_ms, scope.created.until_ms);
            match table.dated_rollups().filter(|_| within) {
                Some(keys) => keys.into_iter().for_each(|key| add(Slot::Rollup, key)),
                None => {
                    by_rollups[ordinal] = false;
                    scanned[ordinal] = true;
                }
            }
        }
        if scanned[ordinal] {
            for (position, file) in table.base.iter().enumerate() {
                add(Slot::Base { ordinal, position }, &file.key);
            }
            for (offset, file) in table.deltas.iter().enumerate() {
                let position = table.base.len() + offset;
                add(Slot::Delta { ordinal, position }, &file.key);
                if let Some(deletes) = &file.deletes
                    && let Some(key) = &deletes.key
                {
                    let rows = deletes.rows;
                    add(
                        Slot::Deletes {
                            ordinal,
                            position,
                            rows,
                        },
                        key,
                    );
                }
            }
        }
        if needs.key_indexes {
            for (position, file) in table.all().enumerate() {
                if let Some(key) = &file.key_index {
                    add(Slot::KeyIndex { ordinal, position }, key);
                    data_keys.insert((ordinal, position), (file.key.clone(), file.rows));
                }
            }
        }
        if let Some(kind) = needs.entity
            && let Some(file) = manifest.entities.get(kind.table())
        {
            add(Slot::Entity(kind), &file.key);
        }
    }
    if session_count > 1 && to_copy > copy_budget {
        return Err(QueryError::BadRequest(format!(
            "this request reads {} MiB of table files from {} sessions, more than the {} MiB one \
             request may copy; narrow it to a session (`session`), a cluster (`cluster`) or \
             a time range (`since_ms`, `until_ms`)",
            to_copy.div_ceil(1 << 20),
            session_count,
            copy_budget >> 20,
        )));
    }
    // A file that is gone (deleted by hand, expired by a lifecycle rule) costs its rows, not
    // the session: the rest is still answered.
    let fetched = cache.files_if_present(&keys).await?;
    tracing::Span::current().record("copied_bytes", fetched.copied());
    let paths = fetched.files();
    let mut snapshot = Snapshot::default();
    snapshot.task_attempts.one_session = session_count <= 1;
    // Where each (session, file position) landed among the files read, and each session's
    // deletion vectors by the position of the delta that wrote them.
    let mut read: BTreeMap<(usize, usize), FileRead> = BTreeMap::new();
    let mut vectors: Vec<(usize, usize, u64, PathBuf)> = Vec::new();
    let mut vectors_complete = true;
    let mut rollups = Vec::new();
    let mut rollups_complete = true;
    let mut key_indexes: BTreeMap<(usize, usize), PathBuf> = BTreeMap::new();
    for (slot, index) in plan {
        let present = paths.get(index).cloned().flatten();
        match (slot, present) {
            (Slot::Base { ordinal, position }, Some(path)) => {
                read.insert(
                    (ordinal, position),
                    FileRead::Base(snapshot.task_attempts.base.len()),
                );
                snapshot.task_attempts.base.push(path);
            }
            (Slot::Delta { ordinal, position }, Some(path)) => {
                read.insert(
                    (ordinal, position),
                    FileRead::Delta(snapshot.task_attempts.deltas.len()),
                );
                snapshot.task_attempts.deltas.push(path);
            }
            (
                Slot::Deletes {
                    ordinal,
                    position,
                    rows,
                },
                Some(path),
            ) => {
                vectors.push((ordinal, position, rows, path));
            }
            (Slot::Deletes { .. }, None) => vectors_complete = false,
            (Slot::Rollup, Some(path)) => rollups.push(path),
            (Slot::Rollup, None) => rollups_complete = false,
            (Slot::KeyIndex { ordinal, position }, Some(path)) => {
                key_indexes.insert((ordinal, position), path);
            }
            (Slot::Entity(kind), Some(path)) => {
                snapshot.entities.entry(kind).or_default().push(path);
            }
            (_, None) => {}
        }
    }
    let every_delta_has_one = sessions
        .iter()
        .zip(&scanned)
        .filter(|(_, scanned)| **scanned)
        .all(|(session, _)| session.manifest.task_attempts.has_deletion_vectors());
    if scanned.contains(&true) && vectors_complete && every_delta_has_one {
        let bases = snapshot.task_attempts.base.len();
        snapshot.task_attempts.deletes = Some(
            vectors
                .into_iter()
                // The vector of a delta that is gone goes with it: the rows it superseded
                // are then the newest there are.
                .filter(|(ordinal, position, _, _)| read.contains_key(&(*ordinal, *position)))
                .map(|(ordinal, position, rows, path)| LocalDeletes {
                    path,
                    rows,
                    files: (0..position)
                        .map(|earlier| read.get(&(ordinal, earlier)).map(|file| file.index(bases)))
                        .collect(),
                })
                .collect(),
        );
    }
    // Rollups add up to a session's counts only when every file has one this build reads, with
    // known spans, and all are here.
    let every_file_has_one = sessions
        .iter()
        .zip(&by_rollups)
        .filter(|(_, by_rollups)| **by_rollups)
        .all(|(session, _)| session.manifest.task_attempts.rollups().is_some());
    if needs.rollups && rollups_complete && every_file_has_one {
        snapshot.rollups = Some(rollups);
    }
    // Key indexes stand in for their files only when every file has one, and all are here.
    let every_file_has_one = sessions
        .iter()
        .all(|session| session.manifest.task_attempts.has_key_indexes());
    if needs.key_indexes && every_file_has_one && key_indexes.len() == data_keys.len() {
        snapshot.key_indexes = Some(
            data_keys
                .into_iter()
                .filter_map(|(place, (data, rows))| {
                    key_indexes
                        .remove(&place)
                        .map(|index| IndexedFile { index, data, rows })
                })
                .collect(),
        );
    }
    snapshot.pins = Some(Arc::new(fetched));
    Ok(snapshot)
}

/// The rollups of the clusters in `in_scope` that count their sessions there as they are now,
/// when `needs` asks for rollups alone and by [`Needs::cluster_rollups`] and `scope` takes
/// whole clusters (no session, no time range); the sessions each counts are taken out of
/// `in_scope`, so their manifests are never fetched.
fn take_cluster_rollups(
    in_scope: &mut BTreeMap<String, ClusterCatalog>,
    scope: &Scope,
    needs: Needs,
) -> Vec<ClusterRollup> {
    let rollups_alone = Needs {
        rollups: true,
        cluster_rollups: true,
        ..Needs::default()
    };
    let whole_clusters = scope.session.is_none() && scope.created.is_unbounded();
    if !whole_clusters || needs != rollups_alone {
        return Vec::new();
    }
    let mut taken = Vec::new();
    for document in in_scope.values_mut() {
        let Some(rollup) = document.rollup.take() else {
            continue;
        };
        if rollup.counts.is_empty() || !rollup.holds(&document.sessions) {
            continue;
        }
        document
            .sessions
            .retain(|session, _| !rollup.counts.contains_key(session));
        taken.push(rollup);
    }
    in_scope.retain(|_, document| !document.sessions.is_empty());
    taken
}

/// Where a `task_attempts` file is among the files a snapshot reads.
#[derive(Clone, Copy, Debug)]
enum FileRead {
    Base(usize),
    Delta(usize),
}

impl FileRead {
    /// Its index among every file read, base files first (`bases` of them).
    fn index(self, bases: usize) -> usize {
        match self {
            Self::Base(index) => index,
            Self::Delta(index) => bases + index,
        }
    }
}

/// Where a fetched file goes in the [`Snapshot`]: `task_attempts` files by their session (its
/// place in the snapshot) and position in its manifest, which deletion vectors refer to.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Base {
        ordinal: usize,
        position: usize,
    },
    Delta {
        ordinal: usize,
        position: usize,
    },
    Deletes {
        ordinal: usize,
        position: usize,
        rows: u64,
    },
    Rollup,
    KeyIndex {
        ordinal: usize,
        position: usize,
    },
    Entity(EntityKind),
}
