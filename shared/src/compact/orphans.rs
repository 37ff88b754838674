//! Orphan files: table files no manifest names. A run cut off between writing its files and
//! committing them (a Lambda deadline, a crash, a storage error whose outcome was unknown)
//! leaves them behind, and nothing reads them. They are collected per session, by what the
//! session's manifest names (live or retired) and by how old the store says they are.

use std::time::SystemTime;

use super::{CompactError, Compactor};
use crate::keys::{self, ClusterName, SessionName, Table, table_prefix};
use crate::tables::manifest;

impl Compactor {
    /// Deletes the files in `session`'s table folders that its manifest does not name and that
    /// are older than [`super::CompactSettings::orphan_age`]; returns how many.
    #[tracing::instrument(name = "orphans", skip(self), fields(cluster = %cluster, session = %session))]
    pub async fn collect_orphans(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
    ) -> Result<usize, CompactError> {
        let storage = &**self.storage();
        let key = keys::manifest_key(cluster, session)?;
        let current = manifest::load(storage, &key).await?.manifest;
        let now = SystemTime::now();
        let mut orphans = Vec::new();
        for table in Table::all() {
            for meta in storage.list(&table_prefix(table, cluster, session)).await? {
                // A file the store dates in the future (clock trouble) is left alone.
                let old = now
                    .duration_since(meta.modified)
                    .is_ok_and(|age| age >= self.settings.orphan_age);
                if old && !current.names(&meta.key) {
                    orphans.push(meta.key);
                }
            }
        }
        storage.delete_all(&orphans).await?;
        let collected = orphans.len();
        if collected > 0 {
            tracing::info!(collected, %session, "orphan table files deleted");
        }
        Ok(collected)
    }
}
