//! Immutable objects as local files, for DuckDB to read.
//!
//! Data files are never rewritten once stored, so a local copy never goes stale: the cache
//! fetches each file at most once and serves it from disk afterwards. A backend that already
//! keeps objects as files ([`Storage::local_path`]) is read in place.
//!
//! With a size limit, the least recently used copies are deleted once the cache holds more:
//! a warm Lambda sandbox keeps its `/tmp` between invocations, and without a bound the files
//! of every session it ever answered (and of every base a fold replaced) would fill it. Files
//! a caller still reads are pinned ([`CachedFiles`]) and never deleted under it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;

use super::{ObjectKey, Storage, StorageError};

/// Local copies of immutable objects under one directory.
#[derive(Clone, Debug)]
pub struct FileCache {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    parallelism: usize,
    limit: Option<u64>,
    held: Arc<Mutex<Held>>,
}

/// What the cache directory holds, for eviction.
#[derive(Debug, Default)]
struct Held {
    /// Cached copy → its size and when it was last asked for (a counter, not a clock).
    files: HashMap<PathBuf, (u64, u64)>,
    /// Bytes in `files`.
    bytes: u64,
    /// The last use handed out.
    clock: u64,
    /// Copies callers still read → how many callers.
    pins: HashMap<PathBuf, usize>,
}

/// Local files a caller reads, kept in the cache (not evicted) while this lives.
#[derive(Debug)]
pub struct CachedFiles<T> {
    files: T,
    pinned: Vec<PathBuf>,
    held: Arc<Mutex<Held>>,
    copied: u64,
}

impl<T> CachedFiles<T> {
    /// The files.
    pub fn files(&self) -> &T {
        &self.files
    }

    /// Bytes this call copied from storage (the files that were not cached yet).
    pub fn copied(&self) -> u64 {
        self.copied
    }
}

impl<T> Drop for CachedFiles<T> {
    fn drop(&mut self) {
        let mut held = lock(&self.held);
        for path in &self.pinned {
            if let Some(count) = held.pins.get_mut(path) {
                *count -= 1;
                if *count == 0 {
                    held.pins.remove(path);
                }
            }
        }
    }
}

/// The cache's bookkeeping; a panic while holding it leaves nothing half-updated that matters
/// (at worst a size is off until the file is fetched again), so a poisoned lock is used as is.
/// Removes and returns the entry of `held` used least recently (each entry is a value and
/// when it was last used, on its holder's clock): the in-memory caches of stored files
/// (the query's resident rows, compaction's stored keys) make room with it.
pub(crate) fn take_least_recent<T>(held: &mut HashMap<ObjectKey, (T, u64)>) -> Option<T> {
    let oldest = held
        .iter()
        .min_by_key(|(_, (_, used))| *used)
        .map(|(key, _)| key.clone())?;
    held.remove(&oldest).map(|(value, _)| value)
}

fn lock(held: &Mutex<Held>) -> std::sync::MutexGuard<'_, Held> {
    held.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl FileCache {
    /// A cache of `storage`'s objects under `dir`, fetching up to `parallelism` at once, with
    /// no size limit.
    pub fn new(storage: Arc<dyn Storage>, dir: PathBuf, parallelism: usize) -> Self {
        Self::bounded(storage, dir, parallelism, None)
    }

    /// A cache holding at most `limit` bytes of copies (beyond it only while callers pin
    /// them). Copies an earlier process left in `dir` count, oldest first.
    pub fn bounded(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        parallelism: usize,
        limit: Option<u64>,
    ) -> Self {
        let mut held = Held::default();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            let mut found: Vec<(std::time::SystemTime, PathBuf, u64)> = entries
                .flatten()
                .filter_map(|entry| {
                    let metadata = entry.metadata().ok()?;
                    metadata.is_file().then(|| {
                        let used = metadata
                            .accessed()
                            .or_else(|_| metadata.modified())
                            .unwrap_or(std::time::UNIX_EPOCH);
                        (used, entry.path(), metadata.len())
                    })
                })
                .collect();
            found.sort();
            for (_, path, size) in found {
                held.clock += 1;
                held.bytes += size;
                held.files.insert(path, (size, held.clock));
            }
        }
        Self {
            storage,
            dir,
            parallelism: parallelism.max(1),
            limit,
            held: Arc::new(Mutex::new(held)),
        }
    }

    /// Bytes of copies the cache holds.
    pub fn held_bytes(&self) -> u64 {
        lock(&self.held).bytes
    }

    /// Deletes the copy of `key`, if there is one (the object was deleted: it is never asked
    /// for again). A pinned copy is left for the eviction after its caller is done.
    pub async fn forget(&self, key: &ObjectKey) {
        let path = self.path_of(key);
        let removed = {
            let mut held = lock(&self.held);
            if held.pins.contains_key(&path) {
                false
            } else if let Some((size, _)) = held.files.remove(&path) {
                held.bytes -= size;
                true
            } else {
                false
            }
        };
        if removed {
            let _ = tokio::fs::remove_file(&path).await;
        }
    }

    fn path_of(&self, key: &ObjectKey) -> PathBuf {
        self.dir.join(key.as_str().replace('/', "~"))
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Local files holding `keys`, in the same order, fetching the ones not cached yet, kept
    /// while the answer lives. A missing object is an error: writers (compaction) must never
    /// merge around a lost file.
    pub async fn files(
        &self,
        keys: &[ObjectKey],
    ) -> Result<CachedFiles<Vec<PathBuf>>, StorageError> {
        let mut fetched = self.fetch_all(keys).await?;
        let mut paths = Vec::with_capacity(keys.len());
        for (key, path) in keys.iter().zip(&fetched.files) {
            paths.push(
                path.clone()
                    .ok_or_else(|| StorageError::NotFound { key: key.clone() })?,
            );
        }
        Ok(CachedFiles {
            files: paths,
            pinned: std::mem::take(&mut fetched.pinned),
            held: Arc::clone(&self.held),
            copied: fetched.copied,
        })
    }

    /// Like [`Self::files`], but an object that is gone is `None` (and logged) instead of an
    /// error: readers then answer from the rest of a session rather than failing all of it.
    pub async fn files_if_present(
        &self,
        keys: &[ObjectKey],
    ) -> Result<CachedFiles<Vec<Option<PathBuf>>>, StorageError> {
        let fetched = self.fetch_all(keys).await?;
        for (key, path) in keys.iter().zip(&fetched.files) {
            if path.is_none() {
                tracing::warn!(key = %key, "a file the manifest names is gone; answering without it");
            }
        }
        Ok(fetched)
    }

    /// Local files for `keys`, `None` where the object does not exist; the cached ones pinned.
    async fn fetch_all(
        &self,
        keys: &[ObjectKey],
    ) -> Result<CachedFiles<Vec<Option<PathBuf>>>, StorageError> {
        let mut paths = Vec::with_capacity(keys.len());
        let mut missing = Vec::new();
        // Pinned before anything is fetched, so that this call's evictions spare them.
        let mut answer = CachedFiles {
            files: Vec::new(),
            pinned: Vec::new(),
            held: Arc::clone(&self.held),
            copied: 0,
        };
        for key in keys {
            if let Some(path) = self.storage.local_path(key) {
                let exists = tokio::fs::try_exists(&path).await.unwrap_or(false);
                paths.push(exists.then_some(path));
                continue;
            }
            let path = self.path_of(key);
            {
                let mut held = lock(&self.held);
                *held.pins.entry(path.clone()).or_default() += 1;
                held.clock += 1;
                let now = held.clock;
                if let Some(entry) = held.files.get_mut(&path) {
                    entry.1 = now;
                }
            }
            answer.pinned.push(path.clone());
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
                        Ok(size) => {
                            answer.copied += size;
                            if let Some(Some(path)) = paths.get(index) {
                                let mut held = lock(&self.held);
                                held.clock += 1;
                                let now = held.clock;
                                if let Some((old, _)) = held.files.insert(path.clone(), (size, now))
                                {
                                    held.bytes -= old;
                                }
                                held.bytes += size;
                            }
                        }
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
        self.evict().await;
        answer.files = paths;
        Ok(answer)
    }

    /// Deletes the least recently used unpinned copies while the cache holds more than its
    /// limit. Pinned copies stay, even over the limit: a caller is reading them.
    async fn evict(&self) {
        let Some(limit) = self.limit else {
            return;
        };
        let doomed: Vec<PathBuf> = {
            let mut held = lock(&self.held);
            if held.bytes <= limit {
                return;
            }
            let mut candidates: Vec<(u64, PathBuf, u64)> = held
                .files
                .iter()
                .filter(|(path, _)| !held.pins.contains_key(*path))
                .map(|(path, (size, used))| (*used, path.clone(), *size))
                .collect();
            candidates.sort();
            let mut doomed = Vec::new();
            for (_, path, size) in candidates {
                if held.bytes <= limit {
                    break;
                }
                held.files.remove(&path);
                held.bytes -= size;
                doomed.push(path);
            }
            if held.bytes > limit {
                tracing::warn!(
                    held = held.bytes,
                    limit,
                    "the cache is over its limit with files in use"
                );
            }
            doomed
        };
        for path in doomed {
            if let Err(err) = tokio::fs::remove_file(&path).await {
                tracing::warn!(path = %path.display(), error = %err, "could not evict a cached file");
            }
        }
    }
}

/// Copies one object to `path` through a temporary name, so a reader never sees half a file.
#[tracing::instrument(name = "cache.fetch", skip(storage, path), fields(key = %key))]
async fn fetch(
    storage: Arc<dyn Storage>,
    key: ObjectKey,
    path: PathBuf,
) -> Result<u64, StorageError> {
    let object = storage.get(&key).await?;
    let size = object.body.len() as u64;
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
    Ok(size)
}
