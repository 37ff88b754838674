//! Immutable objects as local files, for DuckDB to read.
//!
//! Data files are never rewritten once stored, so a local copy never goes stale: the cache
//! fetches each file at most once and serves it from disk afterwards. A backend that already
//! keeps objects as files ([`Storage::local_path`]) is read in place.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::task::JoinSet;

use super::{ObjectKey, Storage, StorageError};

/// Local copies of immutable objects under one directory.
#[derive(Clone, Debug)]
pub struct FileCache {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    parallelism: usize,
}

impl FileCache {
    /// A cache of `storage`'s objects under `dir`, fetching up to `parallelism` at once.
    pub fn new(storage: Arc<dyn Storage>, dir: PathBuf, parallelism: usize) -> Self {
        Self {
            storage,
            dir,
            parallelism: parallelism.max(1),
        }
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Local files holding `keys`, in the same order, fetching the ones not cached yet. A
    /// missing object is an error: writers (compaction) must never merge around a lost file.
    pub async fn files(&self, keys: &[ObjectKey]) -> Result<Vec<PathBuf>, StorageError> {
        let mut paths = Vec::with_capacity(keys.len());
        for (key, path) in keys.iter().zip(self.fetch_all(keys).await?) {
            paths.push(path.ok_or_else(|| StorageError::NotFound { key: key.clone() })?);
        }
        Ok(paths)
    }

    /// Like [`Self::files`], but an object that is gone is `None` (and logged) instead of an
    /// error: readers then answer from the rest of a session rather than failing all of it.
    pub async fn files_if_present(
        &self,
        keys: &[ObjectKey],
    ) -> Result<Vec<Option<PathBuf>>, StorageError> {
        let paths = self.fetch_all(keys).await?;
        for (key, path) in keys.iter().zip(&paths) {
            if path.is_none() {
                tracing::warn!(key = %key, "a file the manifest names is gone; answering without it");
            }
        }
        Ok(paths)
    }

    /// Local files for `keys`, `None` where the object does not exist.
    async fn fetch_all(&self, keys: &[ObjectKey]) -> Result<Vec<Option<PathBuf>>, StorageError> {
        let mut paths = Vec::with_capacity(keys.len());
        let mut missing = Vec::new();
        for key in keys {
            if let Some(path) = self.storage.local_path(key) {
                let exists = tokio::fs::try_exists(&path).await.unwrap_or(false);
                paths.push(exists.then_some(path));
                continue;
            }
            let path = self.dir.join(key.as_str().replace('/', "~"));
            if tokio::fs::metadata(&path).await.is_err() {
                missing.push((paths.len(), key.clone(), path.clone()));
            }
            paths.push(Some(path));
        }
        if !missing.is_empty() {
            tokio::fs::create_dir_all(&self.dir)
                .await
                .map_err(|err| StorageError::backend(self.dir.display(), err))?;
        }
        let mut fetches = JoinSet::new();
        let mut pending = missing.into_iter();
        loop {
            while fetches.len() < self.parallelism {
                let Some((index, key, path)) = pending.next() else {
                    break;
                };
                let storage = Arc::clone(&self.storage);
                fetches.spawn(async move { (index, fetch(storage, key, path).await) });
            }
            match fetches.join_next().await {
                None => break,
                Some(joined) => {
                    let (index, fetched) =
                        joined.map_err(|err| StorageError::backend(self.dir.display(), err))?;
                    match fetched {
                        Ok(()) => {}
                        Err(StorageError::NotFound { .. }) => {
                            if let Some(slot) = paths.get_mut(index) {
                                *slot = None;
                            }
                        }
                        Err(err) => return Err(err),
                    }
                }
            }
        }
        Ok(paths)
    }
}

/// Copies one object to `path` through a temporary name, so a reader never sees half a file.
#[tracing::instrument(name = "cache.fetch", skip(storage, path), fields(key = %key))]
async fn fetch(
    storage: Arc<dyn Storage>,
    key: ObjectKey,
    path: PathBuf,
) -> Result<(), StorageError> {
    let object = storage.get(&key).await?;
    let partial = path.with_extension(format!("partial-{}", ulid::Ulid::new()));
    let written = async {
        tokio::fs::write(&partial, &object.body).await?;
        tokio::fs::rename(&partial, &path).await
    }
    .await;
    if let Err(err) = written {
        let _ = tokio::fs::remove_file(&partial).await;
        return Err(StorageError::backend(&key, err));
    }
    Ok(())
}
