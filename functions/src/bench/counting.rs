//! A storage wrapper that counts requests and bytes, so the cost model uses measured numbers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;
use shared::storage::{
    ETag, MAX_KEYS_PER_DELETE, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject,
};

/// Request counters of one phase.
#[derive(Debug, Default)]
pub(super) struct Counters {
    puts: AtomicU64,
    put_bytes: AtomicU64,
    gets: AtomicU64,
    lists: AtomicU64,
    deletes: AtomicU64,
}

/// The requests of one phase, as the report gives them.
#[derive(Debug, Default, Serialize)]
pub(super) struct RequestCounts {
    /// PUTs, conditional ones that failed included.
    pub(super) puts: u64,
    /// Bytes PUT.
    pub(super) put_bytes: u64,
    /// GETs, whole and ranged.
    pub(super) gets: u64,
    /// LISTs.
    pub(super) lists: u64,
    /// DELETEs.
    pub(super) deletes: u64,
}

impl Counters {
    /// The counts so far.
    pub(super) fn counts(&self) -> RequestCounts {
        RequestCounts {
            puts: self.puts.load(Ordering::Relaxed),
            put_bytes: self.put_bytes.load(Ordering::Relaxed),
            gets: self.gets.load(Ordering::Relaxed),
            lists: self.lists.load(Ordering::Relaxed),
            deletes: self.deletes.load(Ordering::Relaxed),
        }
    }
}

/// Forwards every call to `inner`, counting it in `counters`.
#[derive(Debug)]
pub(super) struct CountingStorage {
    pub(super) inner: Arc<dyn Storage>,
    pub(super) counters: Arc<Counters>,
}

#[async_trait]
impl Storage for CountingStorage {
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError> {
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        self.counters
            .put_bytes
            .fetch_add(body.len() as u64, Ordering::Relaxed);
        self.inner.put(key, body, mode).await
    }

    async fn put_file(
        &self,
        key: &ObjectKey,
        path: &std::path::Path,
        mode: PutMode,
    ) -> Result<(ETag, u64), StorageError> {
        // Counted before, as `put` counts: a conditional put that fails is still a request.
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        let (etag, bytes) = self.inner.put_file(key, path, mode).await?;
        self.counters.put_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok((etag, bytes))
    }

    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        self.inner.get(key).await
    }

    async fn get_range(
        &self,
        key: &ObjectKey,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, StorageError> {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        self.inner.get_range(key, range).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError> {
        self.counters.lists.fetch_add(1, Ordering::Relaxed);
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &ObjectKey) -> Result<(), StorageError> {
        self.counters.deletes.fetch_add(1, Ordering::Relaxed);
        self.inner.delete(key).await
    }

    async fn delete_all(&self, keys: &[ObjectKey]) -> Result<(), StorageError> {
        let requests = keys.len().div_ceil(MAX_KEYS_PER_DELETE) as u64;
        self.counters.deletes.fetch_add(requests, Ordering::Relaxed);
        self.inner.delete_all(keys).await
    }

    fn location(&self) -> String {
        self.inner.location()
    }

    fn local_path(&self, key: &ObjectKey) -> Option<std::path::PathBuf> {
        // Files read in place: on S3 these would be one GET each, once per warm container.
        self.inner.local_path(key)
    }
}
