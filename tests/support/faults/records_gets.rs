use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use shared::storage::{ETag, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject};

/// Storage that records the keys it is asked to get and, unlike a local directory, never lets
/// readers use its files in place: the query cache downloads them, as from S3.
#[derive(Debug)]
pub struct RecordsGets {
    inner: Arc<dyn Storage>,
    gets: std::sync::Mutex<Vec<String>>,
    ranges: std::sync::Mutex<Vec<(String, Range<u64>)>>,
    lists: AtomicUsize,
}

impl RecordsGets {
    /// Wraps `inner`, recording from now on.
    pub fn new(inner: Arc<dyn Storage>) -> Self {
        Self {
            inner,
            gets: std::sync::Mutex::new(Vec::new()),
            ranges: std::sync::Mutex::new(Vec::new()),
            lists: AtomicUsize::new(0),
        }
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
}

#[async_trait]
impl Storage for RecordsGets {
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError> {
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
        self.inner.delete(key).await
    }

    fn location(&self) -> String {
        self.inner.location()
    }

    fn uri(&self, key: &ObjectKey) -> String {
        self.inner.uri(key)
    }
}
