//! What `afterglow rebuild` needs of compaction: the check that no raw history is gone, every
//! raw object's key, and dropping every table file (and emptying every manifest) before
//! compacting again.

use std::collections::BTreeMap;

use futures_util::{StreamExt as _, TryStreamExt as _};

use super::{CompactError, Compactor};
use crate::keys::{self, CATALOG_PREFIX, MANIFESTS_PREFIX, SINGLE_CATALOG_KEY, TABLES_PREFIX};
use crate::raw;
use crate::storage::ObjectKey;
use crate::tables::catalog;
use crate::tables::manifest;

/// Manifests emptied at once: a history holds thousands.
const MANIFESTS_AT_ONCE: usize = 64;

impl Compactor {
    /// Checks that `rebuild` would lose nothing: for every cluster, the oldest raw object ever
    /// compacted (the catalog records it) must still be stored. Raw objects expire after
    /// `RawRetentionDays` while tables may be kept longer; rebuilding then would drop the
    /// history only the tables still hold.
    pub async fn ensure_rebuildable(&self) -> Result<(), CompactError> {
        let catalog = catalog::load(&self.storage).await?;
        let mut stored: BTreeMap<String, u64> = BTreeMap::new();
        for meta in self.storage.list(raw::key::RAW_PREFIX).await? {
            if let (Some(cluster), Some(at)) = (
                raw::key::raw_object_cluster(&meta.key),
                raw::key::raw_object_time_ms(&meta.key),
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
        Ok(raw::list::list_keys(&*self.storage).await?)
    }

    /// Empties every session's manifest ([`manifest::Manifest::dropped`]) and deletes every
    /// table file and catalog document (raw objects stay), for `rebuild`. Returns how many
    /// objects were deleted or emptied.
    pub async fn drop_tables(&self) -> Result<usize, CompactError> {
        let objects = self.storage.list(TABLES_PREFIX).await?;
        // Manifests first (emptied), so no reader is ever pointed at a deleted file. The
        // catalog last, and its list of clusters after the rest of it: a writer lists a cluster
        // only when it finds no document for it, and starts a list from the single document
        // when it finds none, so neither may outlive the list.
        let list = keys::cluster_list_key()?;
        let rank = |key: &ObjectKey| {
            let key_text = key.as_str();
            if key_text.starts_with(MANIFESTS_PREFIX) {
                0
            } else if *key == list {
                3
            } else if key_text.starts_with(CATALOG_PREFIX) || key_text == SINGLE_CATALOG_KEY {
                2
            } else {
                1
            }
        };
        let mut ranked: [Vec<ObjectKey>; 4] = Default::default();
        let count = objects.len();
        for meta in objects {
            if let Some(keys) = ranked.get_mut(rank(&meta.key)) {
                keys.push(meta.key);
            }
        }
        let [manifests, rest @ ..] = &ranked;
        futures_util::stream::iter(manifests.iter().map(|key| self.empty_manifest(key)))
            .buffer_unordered(MANIFESTS_AT_ONCE)
            .try_collect::<()>()
            .await?;
        for keys in rest {
            self.storage.delete_all(keys).await?;
        }
        Ok(count)
    }

    /// Writes the manifest at `key` as [`manifest::Manifest::dropped`], unless a commit changed
    /// it since it was read (a compaction running beside the rebuild: an error).
    async fn empty_manifest(&self, key: &ObjectKey) -> Result<(), CompactError> {
        let current = manifest::load(&*self.storage, key).await?;
        manifest::store(
            &*self.storage,
            key,
            &current.manifest.dropped(),
            current.etag.as_ref(),
        )
        .await?;
        Ok(())
    }
}
