//! Where a run's table files are while it works on them: local copies of stored files fetched
//! through the cache, new files written under the scratch directory and then uploaded, and the
//! blocking threads the DuckDB and Parquet work runs on.

use std::path::{Path, PathBuf};

use ulid::Ulid;

use super::{CompactError, Compactor};
use crate::keys::{ClusterName, SessionName, Table, TableFile, table_file_key};
use crate::storage::{CachedFiles, ObjectKey, PutMode};
use crate::tables::manifest::DataFile;

impl Compactor {
    /// Local copies of live data files (they are immutable, so a cached copy is current),
    /// kept in the cache while the answer lives.
    pub(super) async fn fetch<'a>(
        &self,
        files: impl Iterator<Item = &'a DataFile>,
    ) -> Result<CachedFiles<Vec<PathBuf>>, CompactError> {
        self.fetch_keys(files.map(|file| &file.key)).await
    }

    /// Local copies of the objects at `keys` (immutable table files).
    pub(super) async fn fetch_keys<'a>(
        &self,
        keys: impl Iterator<Item = &'a ObjectKey>,
    ) -> Result<CachedFiles<Vec<PathBuf>>, CompactError> {
        let keys: Vec<ObjectKey> = keys.cloned().collect();
        Ok(self.cache.files(&keys).await?)
    }

    /// A new `task_attempts` file of this session: its key, and the scratch path it is
    /// written to before the upload.
    pub(super) fn new_attempts_file(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        file: TableFile,
    ) -> Result<(ObjectKey, PathBuf), CompactError> {
        let id = Ulid::new();
        let key = table_file_key(Table::TaskAttempts, cluster, session, file, id)?;
        let name = key
            .as_str()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        Ok((key, self.scratch.join(name)))
    }

    /// Uploads the local file at `path` to `key` (never replacing an object); returns its
    /// size in bytes.
    pub(super) async fn upload(&self, path: &Path, key: &ObjectKey) -> Result<u64, CompactError> {
        let (_, bytes) = self.storage.put_file(key, path, PutMode::Create).await?;
        Ok(bytes)
    }
}

/// Runs `work` on a blocking thread (DuckDB and Parquet work is CPU-bound and synchronous).
pub(super) async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, CompactError> + Send + 'static,
) -> Result<T, CompactError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| CompactError::Worker(err.to_string()))?
}
