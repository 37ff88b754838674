use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use shared::storage::{ETag, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject};

/// Conditional writes under a prefix whose response is lost after they were applied: the write
/// lands in the inner store, and the caller gets the 412 that the SDK's automatic retry of the
/// same request would get. The first `losses` such writes are affected.
#[derive(Debug)]
pub struct LosesConditionalResponses {
    inner: Arc<dyn Storage>,
    prefix: &'static str,
    remaining: AtomicUsize,
    lost: AtomicUsize,
}

impl LosesConditionalResponses {
    /// Wraps `inner`, losing the responses of the first `losses` conditional writes of keys
    /// under `prefix`.
    pub fn new(inner: Arc<dyn Storage>, prefix: &'static str, losses: usize) -> Self {
        Self {
            inner,
            prefix,
            remaining: AtomicUsize::new(losses),
            lost: AtomicUsize::new(0),
        }
    }

    /// Losing the responses of manifest writes.
    pub fn of_manifests(inner: Arc<dyn Storage>, losses: usize) -> Self {
        Self::new(inner, "tables/manifests/", losses)
    }

    /// How many responses were lost so far (each after its write landed).
    pub fn lost(&self) -> usize {
        self.lost.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Storage for LosesConditionalResponses {
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError> {
        let conditional = !matches!(mode, PutMode::Overwrite);
        let etag = self.inner.put(key, body, mode).await?;
        if conditional
            && key.as_str().starts_with(self.prefix)
            && self
                .remaining
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            self.lost.fetch_add(1, Ordering::SeqCst);
            return Err(StorageError::Precondition { key: key.clone() });
        }
        Ok(etag)
    }

    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
        self.inner.get(key).await
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
