//! The catalog: every `(cluster, session)` that has tables, with its vital statistics, kept as
//! a document per cluster and a small list of the clusters (docs/architecture.md, "The commit
//! protocol").
//!
//! Readers start here, so "which sessions does this cluster have" costs one GET of that
//! cluster's document and "which clusters are there" one GET of the list, never a bucket LIST.
//! Compaction records a session after each manifest commit by a conditional replace of its own
//! cluster's document, redone when another writer got there first: a commit rewrites as much
//! catalog as its cluster has, whatever the number of clusters, and concurrent compactions never
//! drop each other's entries. The list changes only when a cluster is first recorded, and a
//! cluster is listed before its document is first written, so a reader that starts from the
//! list finds every document. The catalog is derived data: `rebuild` recreates it from the raw
//! objects.
//!
//! # The single document
//!
//! A store may hold the catalog's older format, one document for every cluster
//! ([`crate::keys::SINGLE_CATALOG_KEY`]). Whether the list exists says which format a store is
//! in: without it, readers read the single document (the query function may not write, so
//! reading cannot move it). The first writer that needs the list moves the single document: it
//! creates the list from the single document's clusters, writes its own cluster's document,
//! then a document for each of the others (its own record is stored before the many writes of
//! the move, which a deadline may cut off). A cluster document created later starts from the
//! single document's entry too, and a reader that finds a listed cluster without a document
//! reads that entry, so a move that was cut off loses nothing; it is finished cluster by
//! cluster as they are recorded. The single document is left as it was: nothing reads it once
//! the list exists.
//!
//! Nothing here decides what a page of the catalog is: [`crate::query::read::catalog`] does.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use super::cluster_rollup::ClusterRollup;
use super::manifest::{Document, ManifestError, SessionStats, document, load_document};
use crate::keys::{self, CATALOG_PREFIX, ClusterName, SessionName};
use crate::storage::{ObjectKey, PutMode, Storage, StorageError};

/// Most lost races an update redoes before giving up (each redo is one GET and one PUT).
const MAX_RACES: usize = 50;

/// How many cluster documents are read or written at once.
pub const PARALLEL_DOCUMENTS: usize = 16;

/// The whole catalog: every cluster's sessions. Also the single document's format (see the
/// module's doc), which holds exactly this.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    /// Format version of this document.
    pub format: u32,
    /// Cluster → session → statistics.
    pub clusters: BTreeMap<String, BTreeMap<String, SessionStats>>,
    /// Cluster → ULID time (ms) of the oldest raw object ever compacted into its tables: a
    /// rebuild needs it still stored (see `Compactor::ensure_rebuildable`).
    #[serde(default)]
    pub raw_from: BTreeMap<String, u64>,
}

document!(Catalog, 1);

/// One cluster's catalog document (`tables/catalog/cluster={c}.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterCatalog {
    /// Format version of this document.
    pub format: u32,
    /// Session → statistics.
    pub sessions: BTreeMap<String, SessionStats>,
    /// ULID time (ms) of the oldest raw object ever compacted into the cluster's tables (see
    /// [`Catalog::raw_from`]); `None` once the cluster has no session left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_from: Option<u64>,
    /// The cluster's rollup, if one was written: its ended sessions' counts in one file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollup: Option<ClusterRollup>,
}

document!(ClusterCatalog, 1);

/// The list of the clusters that have a catalog document (`tables/catalog/clusters.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterList {
    /// Format version of this document.
    pub format: u32,
    /// Cluster → what the list keeps of it.
    pub clusters: BTreeMap<String, ListedCluster>,
}

document!(ClusterList, 1);

/// What the list keeps of a cluster: only what is known when it is first recorded, since the
/// list is not rewritten after that.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedCluster {
    /// The earliest event time (ms since the epoch) of the cluster's sessions when it was first
    /// recorded: clusters are listed newest first by it.
    pub since_ms: Option<i64>,
}

/// The catalog as a reader finds it.
#[derive(Clone, Debug)]
pub enum Listing {
    /// The list of clusters; each cluster's sessions are in its own document.
    PerCluster(ClusterList),
    /// No list: the single document, holding every cluster (or nothing was recorded yet).
    Single(Catalog),
}

impl Listing {
    /// The clusters, newest first: by [`ListedCluster::since_ms`], latest first (unknown
    /// last), then by name, last first. For the single document, a cluster's `since_ms` is the
    /// earliest event time of its sessions.
    pub fn newest_first(&self) -> Vec<(String, ListedCluster)> {
        let clusters = match self {
            Self::PerCluster(list) => list.clusters.clone(),
            Self::Single(single) => list_of(single).clusters,
        };
        let mut ordered: Vec<(String, ListedCluster)> = clusters.into_iter().collect();
        ordered.sort_by(|a, b| (b.1.since_ms, &b.0).cmp(&(a.1.since_ms, &a.0)));
        ordered
    }

    /// The documents of `clusters` (names from this listing), in that order: read from storage
    /// [`PARALLEL_DOCUMENTS`] at a time, or taken from the single document.
    pub async fn documents(
        &self,
        storage: &Arc<dyn Storage>,
        clusters: &[String],
    ) -> Result<Vec<ClusterCatalog>, ManifestError> {
        match self {
            Self::Single(single) => Ok(clusters
                .iter()
                .map(|cluster| single_entry(single, cluster))
                .collect()),
            Self::PerCluster(_) => load_listed(storage, clusters).await,
        }
    }
}

/// `sessions` newest first: by first event time, latest first (unknown last), then by name,
/// last first. The first is the session that started last, which Ray's `latest` names.
pub fn newest_first(sessions: &BTreeMap<String, SessionStats>) -> Vec<(&String, &SessionStats)> {
    let mut ordered: Vec<(&String, &SessionStats)> = sessions.iter().collect();
    ordered.sort_by(|a, b| (b.1.first_ms, b.0).cmp(&(a.1.first_ms, a.0)));
    ordered
}

/// How the catalog is stored: the list of clusters, or the single document when there is no
/// list. One GET, two when there is no list.
pub async fn listing(storage: &dyn Storage) -> Result<Listing, ManifestError> {
    match load_list(storage).await? {
        Some(list) => Ok(Listing::PerCluster(list)),
        None => Ok(Listing::Single(load_single(storage).await?)),
    }
}

/// One cluster's sessions: its document (one GET), or, when it has none, its entry in the
/// single document where that is still read; empty for a cluster never recorded.
pub async fn load_cluster(
    storage: &dyn Storage,
    cluster: &ClusterName,
) -> Result<ClusterCatalog, ManifestError> {
    if let Some(document) = load_cluster_document(storage, cluster).await? {
        return Ok(document);
    }
    match listing(storage).await? {
        Listing::Single(single) => Ok(single_entry(&single, cluster.as_str())),
        Listing::PerCluster(list) if list.clusters.contains_key(cluster.as_str()) => {
            Ok(single_entry(&load_single(storage).await?, cluster.as_str()))
        }
        Listing::PerCluster(_) => Ok(ClusterCatalog::empty()),
    }
}

/// The whole catalog: the list and every listed cluster's document ([`PARALLEL_DOCUMENTS`] at
/// a time), or the single document when there is no list. A cluster without sessions is left
/// out. For expiry and `rebuild`, which look at every cluster; a reader of one cluster or of a
/// page reads less ([`load_cluster`], [`Listing::documents`]).
pub async fn load(storage: &Arc<dyn Storage>) -> Result<Catalog, ManifestError> {
    let list = match listing(&**storage).await? {
        Listing::Single(single) => return Ok(single),
        Listing::PerCluster(list) => list,
    };
    let names: Vec<String> = list.clusters.into_keys().collect();
    let documents = load_listed(storage, &names).await?;
    let mut catalog = Catalog::empty();
    for (name, document) in names.into_iter().zip(documents) {
        if let Some(from) = document.raw_from {
            catalog.raw_from.insert(name.clone(), from);
        }
        if !document.sessions.is_empty() {
            catalog.clusters.insert(name, document.sessions);
        }
    }
    Ok(catalog)
}

/// Every cluster's document, by name: the listed clusters' documents ([`PARALLEL_DOCUMENTS`] at
/// a time), or the single document's entries when there is no list. For readers of every
/// cluster that need more of a document than its sessions (its rollup).
pub async fn load_documents(
    storage: &Arc<dyn Storage>,
) -> Result<BTreeMap<String, ClusterCatalog>, ManifestError> {
    match listing(&**storage).await? {
        Listing::Single(single) => Ok(single
            .clusters
            .keys()
            .map(|cluster| (cluster.clone(), single_entry(&single, cluster)))
            .collect()),
        Listing::PerCluster(list) => {
            let names: Vec<String> = list.clusters.into_keys().collect();
            let documents = load_listed(storage, &names).await?;
            Ok(names.into_iter().zip(documents).collect())
        }
    }
}

/// Records `stats` for `(cluster, session)`, and that raw objects of the cluster as old as
/// `oldest_raw_ms` (ULID time) went into its tables, in one conditional replace of the
/// cluster's document, redone when another writer got there first. The first record of a
/// cluster also lists it first (and, in a store that still has the single document, moves that
/// once this record is stored: see the module's doc).
///
/// Two compactions of a session may record in either order, so the entry only ever grows
/// ([`newest_of`]): an older commit's statistics, recorded last, cannot replace a newer one's.
#[tracing::instrument(name = "catalog.record", skip(storage, stats), fields(cluster = %cluster, session = %session))]
pub async fn record(
    storage: &Arc<dyn Storage>,
    cluster: &ClusterName,
    session: &SessionName,
    stats: &SessionStats,
    oldest_raw_ms: Option<u64>,
) -> Result<(), ManifestError> {
    update(storage, cluster, |document| {
        let mut changed = false;
        let newest = match document.sessions.get(session.as_str()) {
            Some(known) => newest_of(known, stats),
            None => stats.clone(),
        };
        if document.sessions.get(session.as_str()) != Some(&newest) {
            document.sessions.insert(session.to_string(), newest);
            changed = true;
        }
        if let Some(oldest) = oldest_raw_ms
            && document.raw_from.is_none_or(|from| from > oldest)
        {
            document.raw_from = Some(oldest);
            changed = true;
        }
        changed
    })
    .await
}

/// What the catalog keeps of two records of one session: each commit only adds attempts and
/// widens the span of event times, so the newer commit's statistics are the larger ones.
fn newest_of(known: &SessionStats, recorded: &SessionStats) -> SessionStats {
    let mut newest = known.clone();
    newest.attempts = known.attempts.max(recorded.attempts);
    newest.include_span(recorded.first_ms, recorded.last_ms);
    newest.include_created(recorded.first_created_ms, recorded.last_created_ms);
    newest.sequence = known.sequence.max(recorded.sequence);
    newest.manifest_sequence = known.manifest_sequence.max(recorded.manifest_sequence);
    // A session's entity tables only gain rows (an expiry forgets the session whole).
    newest.entity_tables = match (&known.entity_tables, &recorded.entity_tables) {
        (Some(known), Some(recorded)) => Some(known.union(recorded).cloned().collect()),
        (known, recorded) => known.clone().or_else(|| recorded.clone()),
    };
    newest
}

/// Names `next` as the cluster's rollup (or none) in its document, if the document still names
/// `read`, the rollup its caller read when it started: two roll-ups of a cluster at once never
/// replace each other's newer one with an older one. Returns whether `next` is named now.
#[tracing::instrument(name = "catalog.name_rollup", skip_all, fields(cluster = %cluster))]
pub async fn name_rollup(
    storage: &Arc<dyn Storage>,
    cluster: &ClusterName,
    read: Option<&ObjectKey>,
    next: Option<&ClusterRollup>,
) -> Result<bool, ManifestError> {
    let mut named = false;
    update(storage, cluster, |document| {
        let current = document.rollup.as_ref().map(|rollup| &rollup.key);
        // A redo after a lost response finds its own rollup named already.
        if current == next.map(|rollup| &rollup.key) {
            named = true;
            return false;
        }
        if current != read {
            named = false;
            return false;
        }
        document.rollup = next.cloned();
        named = true;
        true
    })
    .await?;
    Ok(named)
}

/// Removes `(cluster, session)` from the cluster's document the same way, unless its newest
/// event is at or after `before_ms`: a compaction that recorded new events meanwhile keeps its
/// session listed. A cluster left without sessions keeps its (empty) document and its place in
/// the list, and readers skip it; its `raw_from` goes, as a rebuild no longer needs its raw
/// objects.
#[tracing::instrument(name = "catalog.forget", skip(storage), fields(cluster = %cluster, session = %session))]
pub async fn forget(
    storage: &Arc<dyn Storage>,
    cluster: &ClusterName,
    session: &SessionName,
    before_ms: i64,
) -> Result<(), ManifestError> {
    update(storage, cluster, |document| {
        if document
            .sessions
            .get(session.as_str())
            .is_none_or(|stats| stats.last_ms.is_some_and(|last| last >= before_ms))
        {
            return false;
        }
        document.sessions.remove(session.as_str());
        if document.sessions.is_empty() {
            document.raw_from = None;
        }
        true
    })
    .await
}

/// Records that the manifest of `(cluster, session)` is at `manifest_sequence` now (a tidy
/// moved it without changing the session's statistics), if the cluster's document lists the
/// session: one that expiry removed stays removed.
#[tracing::instrument(name = "catalog.note_manifest", skip(storage), fields(cluster = %cluster, session = %session))]
pub async fn note_manifest(
    storage: &Arc<dyn Storage>,
    cluster: &ClusterName,
    session: &SessionName,
    manifest_sequence: u64,
) -> Result<(), ManifestError> {
    update(storage, cluster, |document| {
        match document.sessions.get_mut(session.as_str()) {
            Some(stats) if stats.manifest_sequence < Some(manifest_sequence) => {
                stats.manifest_sequence = Some(manifest_sequence);
                true
            }
            _ => false,
        }
    })
    .await
}

/// Applies `change` to the cluster's current document and replaces it conditionally, redoing
/// both when another writer got there first. `change` says whether it changed anything; when it
/// did not, nothing is written (which also makes a change whose write response was lost a no-op
/// on the redo).
///
/// A cluster without a document starts from its entry in the single document, if any, and is
/// listed (when the list does not have it yet) before its document is created: a document exists
/// only for a listed cluster. It is listed since the earliest event of the sessions its first
/// document holds, the same time [`list_of`] gives the single document's clusters.
///
/// When this update is the one that lists the single document's clusters, their documents are
/// written only once this update's own document is stored ([`move_single`]): moving a large
/// single document takes many writes, and the commit that triggered it must be recorded first
/// whatever becomes of them (a Lambda may time out meanwhile).
async fn update(
    storage: &Arc<dyn Storage>,
    cluster: &ClusterName,
    mut change: impl FnMut(&mut ClusterCatalog) -> bool,
) -> Result<(), ManifestError> {
    let key = keys::cluster_catalog_key(cluster)?;
    let mut last_error = None;
    let mut to_move: Option<Catalog> = None;
    for _ in 0..MAX_RACES {
        let (mut document, etag) = load_document::<ClusterCatalog>(&**storage, &key).await?;
        let mode = match etag {
            Some(etag) => PutMode::Update(etag),
            None => {
                document = single_entry(&load_single(&**storage).await?, cluster.as_str());
                PutMode::Create
            }
        };
        if !change(&mut document) {
            // A redo finding its change already stored (a lost response) still owes the move.
            if let Some(single) = &to_move {
                move_single(storage, single, cluster).await;
            }
            return Ok(());
        }
        if mode == PutMode::Create {
            let since_ms = document
                .sessions
                .values()
                .filter_map(|stats| stats.first_ms)
                .min();
            if let Some(single) = ensure_listed(storage, cluster, since_ms).await? {
                to_move = Some(single);
            }
        }
        match storage.put(&key, body(&key, &document)?, mode).await {
            Ok(_) => {
                if let Some(single) = &to_move {
                    move_single(storage, single, cluster).await;
                }
                return Ok(());
            }
            // The catalog is re-read and the change applied again: a write still in flight
            // is as harmless to that as one that won.
            Err(err @ (StorageError::Precondition { .. } | StorageError::Conflict { .. })) => {
                last_error = Some(err)
            }
            Err(err) => return Err(err.into()),
        }
    }
    Err(last_error
        .unwrap_or(StorageError::Precondition { key })
        .into())
}

/// Adds `cluster` to the list unless it is there, by a conditional replace redone when another
/// writer got there first. A store without a list gets one, holding the single document's
/// clusters too; the single document is then returned, for its caller to move
/// ([`move_single`]) once its own document is written.
///
/// The single document read for an attempt to create the list is kept across redos: a create
/// whose response was lost (it landed, and the SDK's retry got 412 or 409) looks like a race
/// lost to another writer, and the redo then finds the cluster listed. Moving in both cases is
/// safe, as every document the move writes is create-only and from the same single document.
async fn ensure_listed(
    storage: &Arc<dyn Storage>,
    cluster: &ClusterName,
    since_ms: Option<i64>,
) -> Result<Option<Catalog>, ManifestError> {
    let key = keys::cluster_list_key()?;
    let mut last_error = None;
    let mut tried: Option<Catalog> = None;
    for _ in 0..MAX_RACES {
        let (mut list, etag) = load_document::<ClusterList>(&**storage, &key).await?;
        let mode = match etag {
            Some(etag) => PutMode::Update(etag),
            None => {
                let single = load_single(&**storage).await?;
                list = list_of(&single);
                tried = Some(single);
                PutMode::Create
            }
        };
        let added = match list.clusters.entry(cluster.to_string()) {
            Entry::Vacant(vacant) => {
                vacant.insert(ListedCluster { since_ms });
                true
            }
            Entry::Occupied(_) => false,
        };
        // A list created from the single document may hold the cluster already, and must
        // still be written.
        if !added && mode != PutMode::Create {
            return Ok(tried);
        }
        match storage.put(&key, body(&key, &list)?, mode).await {
            Ok(_) => return Ok(tried),
            Err(err @ (StorageError::Precondition { .. } | StorageError::Conflict { .. })) => {
                last_error = Some(err)
            }
            Err(err) => return Err(err.into()),
        }
    }
    Err(last_error
        .unwrap_or(StorageError::Precondition { key })
        .into())
}

/// Writes a document for every cluster of the single document but `except` (whose document its
/// caller has written), [`PARALLEL_DOCUMENTS`] at a time, each only if absent: one that exists
/// was created by a record, which started from the same entry. A write that fails is left for
/// later: the cluster is listed, so readers read its entry in the single document, and its next
/// record writes its document.
async fn move_single(storage: &Arc<dyn Storage>, single: &Catalog, except: &ClusterName) {
    // A store that never had a single document has nothing to move, and nothing to log.
    if single.clusters.is_empty() {
        return;
    }
    let clusters: Vec<ClusterName> = single
        .clusters
        .keys()
        .filter(|name| name.as_str() != except.as_str())
        .filter_map(|name| match ClusterName::new(name) {
            Ok(cluster) => Some(cluster),
            Err(err) => {
                tracing::warn!(error = %err, "the single catalog document names an invalid cluster; not moved");
                None
            }
        })
        .collect();
    for batch in clusters.chunks(PARALLEL_DOCUMENTS) {
        let mut writes = JoinSet::new();
        for cluster in batch {
            let storage = Arc::clone(storage);
            let cluster = cluster.clone();
            let document = single_entry(single, cluster.as_str());
            writes.spawn(async move {
                let written = create_document(&*storage, &cluster, &document).await;
                (cluster, written)
            });
        }
        while let Some(joined) = writes.join_next().await {
            match joined {
                Ok((_, Ok(()))) => {}
                Ok((cluster, Err(err))) => {
                    tracing::warn!(%cluster, error = %err, "could not move a cluster out of the single catalog document; read from it until recorded");
                }
                Err(err) => {
                    tracing::warn!(error = %err, "a catalog move was cut off");
                }
            }
        }
    }
    tracing::info!(
        clusters = single.clusters.len(),
        "the single catalog document was moved into a document per cluster"
    );
}

/// Writes `document` as the cluster's document unless it has one.
async fn create_document(
    storage: &dyn Storage,
    cluster: &ClusterName,
    document: &ClusterCatalog,
) -> Result<(), ManifestError> {
    let key = keys::cluster_catalog_key(cluster)?;
    match storage
        .put(&key, body(&key, document)?, PutMode::Create)
        .await
    {
        Ok(_) | Err(StorageError::Precondition { .. }) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// The list, or `None` when the store has none.
async fn load_list(storage: &dyn Storage) -> Result<Option<ClusterList>, ManifestError> {
    let (list, etag) = load_document::<ClusterList>(storage, &keys::cluster_list_key()?).await?;
    Ok(etag.map(|_| list))
}

/// The single document (empty when the store has none).
async fn load_single(storage: &dyn Storage) -> Result<Catalog, ManifestError> {
    Ok(load_document(storage, &keys::single_catalog_key()?)
        .await?
        .0)
}

/// The cluster's document, or `None` when it has none.
async fn load_cluster_document(
    storage: &dyn Storage,
    cluster: &ClusterName,
) -> Result<Option<ClusterCatalog>, ManifestError> {
    let key = keys::cluster_catalog_key(cluster)?;
    let (document, etag) = load_document::<ClusterCatalog>(storage, &key).await?;
    Ok(etag.map(|_| document))
}

/// The documents of listed clusters, in the order given, [`PARALLEL_DOCUMENTS`] at a time. A
/// listed cluster without a document (its first record, or a move of the single document,
/// under way or cut off) is read from the single document, fetched once for all of them.
async fn load_listed(
    storage: &Arc<dyn Storage>,
    clusters: &[String],
) -> Result<Vec<ClusterCatalog>, ManifestError> {
    let mut found: Vec<Option<ClusterCatalog>> = Vec::with_capacity(clusters.len());
    for batch in clusters.chunks(PARALLEL_DOCUMENTS) {
        let mut loads = JoinSet::new();
        for (index, name) in batch.iter().enumerate() {
            let storage = Arc::clone(storage);
            let name = name.clone();
            loads.spawn(async move {
                let Ok(cluster) = ClusterName::new(&name) else {
                    tracing::warn!(cluster = %name, "the list of clusters names an invalid cluster; skipped");
                    return Ok::<_, ManifestError>((index, Some(ClusterCatalog::empty())));
                };
                let document = load_cluster_document(&*storage, &cluster).await?;
                Ok::<_, ManifestError>((index, document))
            });
        }
        let mut loaded = Vec::with_capacity(batch.len());
        while let Some(joined) = loads.join_next().await {
            loaded.push(
                joined.map_err(|err| StorageError::backend(CATALOG_PREFIX, err.to_string()))??,
            );
        }
        loaded.sort_by_key(|(index, _)| *index);
        found.extend(loaded.into_iter().map(|(_, document)| document));
    }
    if found.iter().all(Option::is_some) {
        return Ok(found.into_iter().flatten().collect());
    }
    let single = load_single(&**storage).await?;
    Ok(found
        .into_iter()
        .zip(clusters)
        .map(|(document, name)| document.unwrap_or_else(|| single_entry(&single, name)))
        .collect())
}

/// The single document's entry for `cluster`, as a cluster document (empty when it has none).
fn single_entry(single: &Catalog, cluster: &str) -> ClusterCatalog {
    ClusterCatalog {
        sessions: single.clusters.get(cluster).cloned().unwrap_or_default(),
        raw_from: single.raw_from.get(cluster).copied(),
        ..ClusterCatalog::empty()
    }
}

/// The list of the single document's clusters, each since the earliest event of its sessions.
fn list_of(single: &Catalog) -> ClusterList {
    ClusterList {
        clusters: single
            .clusters
            .iter()
            .map(|(name, sessions)| {
                let since_ms = sessions.values().filter_map(|stats| stats.first_ms).min();
                (name.clone(), ListedCluster { since_ms })
            })
            .collect(),
        ..ClusterList::empty()
    }
}

/// A document's JSON, to be put at `key`.
fn body(key: &ObjectKey, document: &impl Serialize) -> Result<Bytes, ManifestError> {
    serde_json::to_vec(document)
        .map(Bytes::from)
        .map_err(|err| ManifestError::Unreadable {
            key: key.clone(),
            reason: err.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::LocalDirStorage;

    fn stats(attempts: u64, first_ms: i64, last_ms: i64) -> SessionStats {
        SessionStats {
            attempts,
            first_ms: Some(first_ms),
            last_ms: Some(last_ms),
            ..SessionStats::default()
        }
    }

    /// Compactions of one session record in whatever order they finish: the commit that landed
    /// first can record last, and its statistics must not replace the newer commit's.
    #[tokio::test]
    async fn an_older_commit_recorded_last_keeps_the_newer_statistics()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let storage: Arc<dyn Storage> = Arc::new(LocalDirStorage::open(dir.path())?);
        let cluster = ClusterName::new("racing")?;
        let session = SessionName::new("session_2026-12-01_00-00-00_000000_1")?;
        let newer = stats(150, 1_000, 9_000);
        let older = stats(100, 1_000, 5_000);
        record(&storage, &cluster, &session, &newer, None).await?;
        record(&storage, &cluster, &session, &older, None).await?;
        let document = load_cluster(&*storage, &cluster).await?;
        assert_eq!(
            document.sessions.get(session.as_str()),
            Some(&newer),
            "the older commit's statistics replaced the newer ones"
        );
        // A commit that saw an earlier event widens the span without losing attempts.
        record(&storage, &cluster, &session, &stats(160, 500, 9_500), None).await?;
        let document = load_cluster(&*storage, &cluster).await?;
        assert_eq!(
            document.sessions.get(session.as_str()),
            Some(&stats(160, 500, 9_500))
        );
        Ok(())
    }

    /// A record writes only its own cluster's document (and the list, once per cluster), and
    /// every cluster is listed with the time of its first session: newest first is by that
    /// time, not by name (`zulu`, recorded earlier, comes after `alpha`).
    #[tokio::test]
    async fn a_record_writes_its_own_cluster_document() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let storage: Arc<dyn Storage> = Arc::new(LocalDirStorage::open(dir.path())?);
        let session = SessionName::new("session_2026-12-01_00-00-00_000000_1")?;
        let (early, late) = (ClusterName::new("zulu")?, ClusterName::new("alpha")?);
        record(&storage, &early, &session, &stats(1, 1_000, 2_000), Some(7)).await?;
        record(&storage, &late, &session, &stats(2, 5_000, 6_000), None).await?;
        let before = storage.get(&keys::cluster_catalog_key(&early)?).await?;
        let list = storage.get(&keys::cluster_list_key()?).await?;
        record(&storage, &late, &session, &stats(3, 5_000, 7_000), None).await?;
        assert_eq!(
            storage.get(&keys::cluster_catalog_key(&early)?).await?.etag,
            before.etag,
            "another cluster's record rewrote this cluster's document"
        );
        assert_eq!(
            storage.get(&keys::cluster_list_key()?).await?.etag,
            list.etag,
            "a record of a listed cluster rewrote the list"
        );
        let listed = listing(&*storage).await?;
        assert!(
            matches!(listed, Listing::PerCluster(_)),
            "no list of clusters"
        );
        let order: Vec<String> = listed
            .newest_first()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(order, ["alpha", "zulu"]);
        let catalog = load(&storage).await?;
        assert_eq!(catalog.raw_from.get("zulu"), Some(&7));
        assert_eq!(catalog.clusters.len(), 2);
        Ok(())
    }

    /// A store with the single document only: readers read it; the first record moves every
    /// cluster into a document of its own, and forgetting a session then works on those.
    #[tokio::test]
    async fn the_single_document_is_read_then_moved() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let storage: Arc<dyn Storage> = Arc::new(LocalDirStorage::open(dir.path())?);
        let old = ClusterName::new("old")?;
        let session = SessionName::new("session_2026-12-01_00-00-00_000000_1")?;
        let mut single = Catalog::empty();
        single.clusters.insert(
            "old".into(),
            BTreeMap::from([(session.to_string(), stats(5, 1_000, 2_000))]),
        );
        single.raw_from.insert("old".into(), 9);
        let key = keys::single_catalog_key()?;
        storage
            .put(&key, body(&key, &single)?, PutMode::Create)
            .await?;
        assert_eq!(load(&storage).await?, single);
        assert_eq!(load_cluster(&*storage, &old).await?.raw_from, Some(9));

        let new = ClusterName::new("new")?;
        record(&storage, &new, &session, &stats(1, 3_000, 4_000), None).await?;
        assert!(
            load_cluster_document(&*storage, &old).await?.is_some(),
            "the single document's cluster has no document of its own"
        );
        let catalog = load(&storage).await?;
        assert_eq!(catalog.clusters.len(), 2);
        assert_eq!(catalog.raw_from.get("old"), Some(&9));

        forget(&storage, &old, &session, 3_000).await?;
        let catalog = load(&storage).await?;
        assert!(!catalog.clusters.contains_key("old"));
        assert!(!catalog.raw_from.contains_key("old"));
        Ok(())
    }
}
