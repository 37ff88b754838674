//! The catalog: every `(cluster, session)` that has tables, with its vital statistics.
//!
//! Readers start here, so answering "which clusters and sessions exist" costs one GET instead of
//! a bucket LIST. Compaction records a session after each manifest commit, by a conditional
//! replace like the manifests', so concurrent compactions of different sessions never drop each
//! other's entries. The catalog is derived data: `rebuild` recreates it from the raw objects.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::manifest::{Document, ManifestError, SessionStats, load_document};
use crate::layout::ClusterName;
use crate::storage::{ETag, ObjectKey, PutMode, Storage, StorageError};

/// Where the catalog lives.
pub const CATALOG_KEY: &str = "tables/catalog.json";

/// Most lost races [`record`] redoes before giving up (each redo is one GET and one PUT).
const MAX_RACES: usize = 50;

/// The catalog document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    /// Format version of this document.
    pub format: u32,
    /// Cluster → session → statistics.
    pub clusters: BTreeMap<String, BTreeMap<String, SessionStats>>,
}

impl Document for Catalog {
    const FORMAT: u32 = 1;

    fn format(&self) -> u32 {
        self.format
    }

    fn empty() -> Self {
        Self {
            format: Self::FORMAT,
            ..Self::default()
        }
    }
}

fn catalog_key() -> Result<ObjectKey, ManifestError> {
    Ok(ObjectKey::new(CATALOG_KEY)?)
}

/// Reads the catalog (empty when nothing was compacted yet) and its version.
pub async fn load(storage: &dyn Storage) -> Result<(Catalog, Option<ETag>), ManifestError> {
    load_document(storage, &catalog_key()?).await
}

/// Records `stats` for `(cluster, session)`, replacing the catalog conditionally and redoing
/// the change when another writer got there first.
#[tracing::instrument(name = "catalog.record", skip(storage, stats), fields(cluster = %cluster, session = %session))]
pub async fn record(
    storage: &dyn Storage,
    cluster: &ClusterName,
    session: &str,
    stats: &SessionStats,
) -> Result<(), ManifestError> {
    let key = catalog_key()?;
    let mut last_error = None;
    for _ in 0..MAX_RACES {
        let (mut catalog, etag) = load(storage).await?;
        let sessions = catalog.clusters.entry(cluster.to_string()).or_default();
        if sessions.get(session) == Some(stats) {
            return Ok(());
        }
        sessions.insert(session.to_owned(), stats.clone());
        let body = serde_json::to_vec(&catalog).map_err(|err| ManifestError::Unreadable {
            key: key.clone(),
            reason: err.to_string(),
        })?;
        let mode = etag.map_or(PutMode::Create, PutMode::Update);
        match storage.put(&key, Bytes::from(body), mode).await {
            Ok(_) => return Ok(()),
            Err(err @ StorageError::Precondition { .. }) => last_error = Some(err),
            Err(err) => return Err(err.into()),
        }
    }
    Err(last_error
        .unwrap_or(StorageError::Precondition { key })
        .into())
}
