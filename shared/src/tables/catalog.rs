//! The catalog: every `(cluster, session)` that has tables, with its vital statistics.
//!
//! Readers start here, so answering "which clusters and sessions exist" costs one GET instead of
//! a bucket LIST. Compaction records a session after each manifest commit, by a conditional
//! replace like the manifests', so concurrent compactions of different sessions never drop each
//! other's entries. The catalog is derived data: `rebuild` recreates it from the raw objects.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::manifest::{ManifestError, SessionStats, document, load_document};
use crate::keys::{ClusterName, SessionName};
use crate::storage::{ETag, ObjectKey, PutMode, Storage, StorageError};

/// Most lost races [`record`] redoes before giving up (each redo is one GET and one PUT).
const MAX_RACES: usize = 50;

/// The catalog document.
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

fn catalog_key() -> Result<ObjectKey, ManifestError> {
    Ok(crate::keys::catalog_key()?)
}

/// Reads the catalog (empty when nothing was compacted yet) and its version.
pub async fn load(storage: &dyn Storage) -> Result<(Catalog, Option<ETag>), ManifestError> {
    load_document(storage, &catalog_key()?).await
}

/// Records `stats` for `(cluster, session)`, and that raw objects of the cluster as old as
/// `oldest_raw_ms` (ULID time) went into its tables, in one conditional replace of the catalog,
/// redone when another writer got there first.
///
/// Two compactions of a session may record in either order, so the entry only ever grows
/// ([`newest_of`]): an older commit's statistics, recorded last, cannot replace a newer one's.
#[tracing::instrument(name = "catalog.record", skip(storage, stats), fields(cluster = %cluster, session = %session))]
pub async fn record(
    storage: &dyn Storage,
    cluster: &ClusterName,
    session: &SessionName,
    stats: &SessionStats,
    oldest_raw_ms: Option<u64>,
) -> Result<(), ManifestError> {
    update(storage, |catalog| {
        let mut changed = false;
        let sessions = catalog.clusters.entry(cluster.to_string()).or_default();
        let newest = match sessions.get(session.as_str()) {
            Some(known) => newest_of(known, stats),
            None => stats.clone(),
        };
        if sessions.get(session.as_str()) != Some(&newest) {
            sessions.insert(session.to_string(), newest);
            changed = true;
        }
        if let Some(oldest) = oldest_raw_ms {
            let from = catalog
                .raw_from
                .entry(cluster.to_string())
                .or_insert(u64::MAX);
            if *from > oldest {
                *from = oldest;
                changed = true;
            }
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
    newest
}

/// Removes `(cluster, session)` from the catalog (and the cluster, when it was its last
/// session), the same way, unless its newest event is at or after `before_ms`: a compaction
/// that recorded new events meanwhile keeps its session listed.
#[tracing::instrument(name = "catalog.forget", skip(storage), fields(cluster = %cluster, session = %session))]
pub async fn forget(
    storage: &dyn Storage,
    cluster: &ClusterName,
    session: &SessionName,
    before_ms: i64,
) -> Result<(), ManifestError> {
    let cluster = cluster.to_string();
    update(storage, |catalog| {
        let Some(sessions) = catalog.clusters.get_mut(&cluster) else {
            return false;
        };
        if sessions
            .get(session.as_str())
            .is_none_or(|stats| stats.last_ms.is_some_and(|last| last >= before_ms))
        {
            return false;
        }
        sessions.remove(session.as_str());
        if sessions.is_empty() {
            catalog.clusters.remove(&cluster);
            catalog.raw_from.remove(&cluster);
        }
        true
    })
    .await
}

/// Applies `change` to the current catalog and replaces it conditionally, redoing both when
/// another writer got there first. `change` says whether it changed anything; when it did not,
/// nothing is written (which also makes a change whose write response was lost a no-op on the
/// redo).
async fn update(
    storage: &dyn Storage,
    mut change: impl FnMut(&mut Catalog) -> bool,
) -> Result<(), ManifestError> {
    let key = catalog_key()?;
    let mut last_error = None;
    for _ in 0..MAX_RACES {
        let (mut catalog, etag) = load(storage).await?;
        if !change(&mut catalog) {
            return Ok(());
        }
        let body = serde_json::to_vec(&catalog).map_err(|err| ManifestError::Unreadable {
            key: key.clone(),
            reason: err.to_string(),
        })?;
        let mode = etag.map_or(PutMode::Create, PutMode::Update);
        match storage.put(&key, Bytes::from(body), mode).await {
            Ok(_) => return Ok(()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::LocalDirStorage;

    fn stats(attempts: u64, first_ms: i64, last_ms: i64) -> SessionStats {
        SessionStats {
            attempts,
            first_ms: Some(first_ms),
            last_ms: Some(last_ms),
        }
    }

    /// Compactions of one session record in whatever order they finish: the commit that landed
    /// first can record last, and its statistics must not replace the newer commit's.
    #[tokio::test]
    async fn an_older_commit_recorded_last_keeps_the_newer_statistics()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let storage = LocalDirStorage::open(dir.path())?;
        let cluster = ClusterName::new("racing")?;
        let session = SessionName::new("session_2026-12-01_00-00-00_000000_1")?;
        let newer = stats(150, 1_000, 9_000);
        let older = stats(100, 1_000, 5_000);
        record(&storage, &cluster, &session, &newer, None).await?;
        record(&storage, &cluster, &session, &older, None).await?;
        let (catalog, _) = load(&storage).await?;
        assert_eq!(
            catalog.clusters["racing"][session.as_str()],
            newer,
            "the older commit's statistics replaced the newer ones"
        );
        // A commit that saw an earlier event widens the span without losing attempts.
        record(&storage, &cluster, &session, &stats(160, 500, 9_500), None).await?;
        let (catalog, _) = load(&storage).await?;
        assert_eq!(
            catalog.clusters["racing"][session.as_str()],
            stats(160, 500, 9_500)
        );
        Ok(())
    }
}
