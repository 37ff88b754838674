use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use shared::storage::{ETag, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject};

/// Another writer committing to a manifest right after it is read: the first read of a key
/// under `prefix` returns the version read, and before it returns, the stored manifest is
/// replaced by one with a new sequence number and `last_ms` (what a compaction of new events
/// commits). The caller then holds a version that is no longer current.
#[derive(Debug)]
pub struct CommitsAfterRead {
    inner: Arc<dyn Storage>,
    prefix: &'static str,
    last_ms: i64,
    remaining: AtomicUsize,
}

impl CommitsAfterRead {
    /// Wraps `inner`; the first read of a manifest under `prefix` meets a commit of events up
    /// to `last_ms`.
    pub fn new(inner: Arc<dyn Storage>, prefix: &'static str, last_ms: i64) -> Self {
        Self {
            inner,
            prefix,
            last_ms,
            remaining: AtomicUsize::new(1),
        }
    }

    /// True once the concurrent commit happened.
    pub fn committed(&self) -> bool {
        self.remaining.load(Ordering::SeqCst) == 0
    }
}

#[async_trait]
impl Storage for CommitsAfterRead {
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError> {
        self.inner.put(key, body, mode).await
    }

    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
        let read = self.inner.get(key).await?;
        if key.as_str().starts_with(self.prefix)
            && self
                .remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            let mut manifest: serde_json::Value =
                serde_json::from_slice(&read.body).map_err(|err| StorageError::Backend {
                    key: key.to_string(),
                    source: Box::new(err),
                })?;
            let sequence = manifest["sequence"].as_u64().unwrap_or_default();
            manifest["sequence"] = (sequence + 1).into();
            manifest["stats"]["last_ms"] = self.last_ms.into();
            let body = Bytes::from(manifest.to_string());
            self.inner
                .put(key, body, PutMode::Update(read.etag.clone()))
                .await?;
        }
        Ok(read)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError> {
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

    fn local_path(&self, key: &ObjectKey) -> Option<std::path::PathBuf> {
        self.inner.local_path(key)
    }
}
