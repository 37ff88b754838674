use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use shared::storage::{
    ETag, MAX_KEYS_PER_DELETE, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject,
};

/// Storage that records the writes, reads, listings and deletes it is asked for and, unlike a local
/// directory, never lets readers use its files in place: the query cache downloads them, as
/// from S3.
#[derive(Debug)]
pub struct RecordsRequests {
    inner: Arc<dyn Storage>,
    puts: std::sync::Mutex<Vec<String>>,
    gets: std::sync::Mutex<Vec<String>>,
    ranges: std::sync::Mutex<Vec<(String, Range<u64>)>>,
    lists: AtomicUsize,
    deletes: AtomicUsize,
    batch_deletes: AtomicUsize,
}

impl RecordsRequests {
    /// Wraps `inner`, recording from now on.
    pub fn new(inner: Arc<dyn Storage>) -> Self {
        Self {
            inner,
            puts: std::sync::Mutex::new(Vec::new()),
            gets: std::sync::Mutex::new(Vec::new()),
            ranges: std::sync::Mutex::new(Vec::new()),
            lists: AtomicUsize::new(0),
            deletes: AtomicUsize::new(0),
            batch_deletes: AtomicUsize::new(0),
        }
    }

    /// Every key written so far, in the order written.
    pub fn puts(&self) -> Vec<String> {
        self.puts
            .lock()
            .map(|puts| puts.clone())
            .unwrap_or_default()
    }

    /// Every key asked for whole so far, in the order asked.
    pub fn gets(&self) -> Vec<String> {
        self.gets
            .lock()
            .map(|gets| gets.clone())
            .unwrap_or_default()
    }

    /// Every ranged read so far, in the order asked.
    pub fn ranges(&self) -> Vec<(String, Range<u64>)> {
        self.ranges
            .lock()
            .map(|ranges| ranges.clone())
            .unwrap_or_default()
    }

    /// Listings so far.
    pub fn lists(&self) -> usize {
        self.lists.load(Ordering::SeqCst)
    }

    /// Objects deleted one at a time so far.
    pub fn deletes(&self) -> usize {
        self.deletes.load(Ordering::SeqCst)
    }

    /// Batch delete requests so far, as S3 would take them (at most
    /// [`MAX_KEYS_PER_DELETE`] keys each).
    pub fn batch_deletes(&self) -> usize {
        self.batch_deletes.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Storage for RecordsRequests {
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError> {
        if let Ok(mut puts) = self.puts.lock() {
            puts.push(key.to_string());
        }
        self.inner.put(key, body, mode).await
    }

    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
        if let Ok(mut gets) = self.gets.lock() {
            gets.push(key.to_string());
        }
        self.inner.get(key).await
    }

    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        if let Ok(mut ranges) = self.ranges.lock() {
            ranges.push((key.to_string(), range.clone()));
        }
        self.inner.get_range(key, range).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &ObjectKey) -> Result<(), StorageError> {
        self.deletes.fetch_add(1, Ordering::SeqCst);
        self.inner.delete(key).await
    }

    async fn delete_all(&self, keys: &[ObjectKey]) -> Result<(), StorageError> {
        self.batch_deletes
            .fetch_add(keys.len().div_ceil(MAX_KEYS_PER_DELETE), Ordering::SeqCst);
        self.inner.delete_all(keys).await
    }

    fn location(&self) -> String {
        self.inner.location()
    }

    fn uri(&self, key: &ObjectKey) -> String {
        self.inner.uri(key)
    }
}
