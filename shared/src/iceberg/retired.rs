//! The Iceberg files a commit stopped naming — a changed or removed session's earlier manifests
//! and position-delete files, the manifest lists of the snapshots it expired, the metadata
//! versions its log let go — recorded with the commit (`retired/v{n}.json`) and deleted once
//! nothing can still read them: after [`RETIRED_FILE_GRACE`], the longest a snapshot naming
//! them stays kept, plus the sweep and the longest query. Without this, every commit would
//! leave its metadata behind for good.
//!
//! A record is written after its commit has landed, so it never names a file the table still
//! names; a crash between the two leaves that commit's retired files in place (a few small
//! objects). Deleting only ever touches the table's own Iceberg folder.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::IcebergError;
use super::avro::{Content, ListedManifest, Partition};
use super::metadata::{RETIRED_FILE_GRACE, TableMetadata};
use super::sync::{PublishedSession, key_of};
use crate::keys::{self, ClusterName, ICEBERG_PREFIX, SessionName};
use crate::storage::{ObjectKey, PutMode, Storage, StorageError};

/// What one commit stopped naming.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Retired {
    /// When the commit landed (ms since the epoch).
    pub(super) retired_at_ms: i64,
    /// Objects no longer named.
    pub(super) keys: Vec<ObjectKey>,
    /// Folders (ending in `/`) none of whose objects is named any more: a session's
    /// position-delete files of one version.
    pub(super) folders: Vec<String>,
}

impl Retired {
    /// Nothing retired yet, by a commit at `now_ms`.
    pub(super) fn at(now_ms: i64) -> Self {
        Self {
            retired_at_ms: now_ms,
            ..Self::default()
        }
    }

    /// True when the commit retired nothing.
    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.folders.is_empty()
    }
}

/// What a commit from `previous` (whose current snapshot publishes `published`) to `next`
/// (listing `listed`) stops naming: the manifests of the sessions that changed or left, with
/// their position-delete files, and what `next` expired or let out of its log.
pub(super) fn retired_by(
    storage: &Arc<dyn Storage>,
    table: &str,
    published: &BTreeMap<Partition, PublishedSession>,
    listed: &[ListedManifest],
    previous: &TableMetadata,
    next: &TableMetadata,
) -> Retired {
    let still: BTreeSet<&str> = listed
        .iter()
        .map(|manifest| manifest.path.as_str())
        .collect();
    let mut retired = Retired::at(next.last_updated_ms);
    for (partition, session) in published {
        for manifest in &session.manifests {
            if still.contains(manifest.path.as_str()) {
                continue;
            }
            retired.keys.extend(key_of(storage, &manifest.path).ok());
            if manifest.content == Content::PositionDeletes
                && let (Ok(cluster), Ok(name)) = (
                    ClusterName::new(&partition.cluster),
                    SessionName::new(&partition.session),
                )
            {
                retired.folders.push(keys::iceberg_deletes_folder(
                    table,
                    &cluster,
                    &name,
                    session.versions.0,
                ));
            }
        }
    }
    let dropped = previous.dropped_by(next);
    retired
        .keys
        .extend(dropped.iter().filter_map(|uri| key_of(storage, uri).ok()));
    retired
}

/// Records what version `version` of `table` stopped naming (nothing, when it retired nothing).
pub(super) async fn record(
    storage: &Arc<dyn Storage>,
    table: &str,
    version: u64,
    retired: &Retired,
) -> Result<(), IcebergError> {
    if retired.is_empty() {
        return Ok(());
    }
    let body = serde_json::to_vec(retired)?;
    storage
        .put(
            &keys::iceberg_retired_key(table, version)?,
            Bytes::from(body),
            PutMode::Overwrite,
        )
        .await?;
    Ok(())
}

/// Deletes the files `table`'s commits retired more than [`RETIRED_FILE_GRACE`] before `now_ms`,
/// then their records; returns how many files were deleted. A record that cannot be read is
/// left alone, and so is anything it names outside the table's Iceberg folder.
#[tracing::instrument(name = "iceberg_delete_retired", skip(storage))]
pub async fn delete_retired(
    storage: &Arc<dyn Storage>,
    table: &str,
    now_ms: i64,
) -> Result<usize, IcebergError> {
    let grace = i64::try_from(RETIRED_FILE_GRACE.as_millis()).unwrap_or(i64::MAX);
    let cutoff = now_ms.saturating_sub(grace);
    let own = format!("{ICEBERG_PREFIX}{table}/");
    let own_deletes = format!("{own}deletes/");
    let mut deleted = 0;
    for meta in storage.list(&keys::iceberg_retired_prefix(table)).await? {
        let stored = match storage.get(&meta.key).await {
            Ok(stored) => stored,
            // Another sweep of the table (the catalog function's, beside a request's) deleted
            // the record, and its files before it.
            Err(StorageError::NotFound { .. }) => continue,
            Err(err) => return Err(err.into()),
        };
        let retired: Retired = match serde_json::from_slice(&stored.body) {
            Ok(retired) => retired,
            Err(err) => {
                tracing::warn!(record = %meta.key, error = %err, "an unreadable record of retired files; left alone");
                continue;
            }
        };
        if retired.retired_at_ms > cutoff {
            continue;
        }
        let mut files: Vec<ObjectKey> = retired
            .keys
            .iter()
            .filter(|key| key.as_str().starts_with(&own))
            .cloned()
            .collect();
        for folder in &retired.folders {
            if !(folder.starts_with(&own_deletes) && folder.ends_with('/')) {
                continue;
            }
            files.extend(storage.list(folder).await?.into_iter().map(|file| file.key));
        }
        // The files before their record: a sweep that stops between finds the record again.
        storage.delete_all(&files).await?;
        deleted += files.len();
        storage.delete(&meta.key).await?;
    }
    if deleted > 0 {
        tracing::info!(table, deleted, "retired Iceberg files deleted");
    }
    Ok(deleted)
}
