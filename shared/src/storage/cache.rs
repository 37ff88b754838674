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

    /// Local files holding `keys`, in the same order, fetching the ones not cached yet.
    pub async fn files(&self, keys: &[ObjectKey]) -> Result<Vec<PathBuf>, StorageError> {
        let mut paths = Vec::with_capacity(keys.len());
        let mut missing = Vec::new();
        for key in keys {
            if let Some(path) = self.storage.local_path(key) {
                paths.push(path);
                continue;
            }
            let path = self.dir.join(key.as_str().replace('/', "~"));
            if tokio::fs::metadata(&path).await.is_err() {
                missing.push((key.clone(), path.clone()));
            }
            paths.push(path);
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
                let Some((key, path)) = pending.next() else {
                    break;
                };
                fetches.spawn(fetch(Arc::clone(&self.storage), key, path));
            }
            match fetches.join_next().await {
                None => break,
                Some(joined) => {
                    joined.map_err(|err| StorageError::backend(self.dir.display(), err))??
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
