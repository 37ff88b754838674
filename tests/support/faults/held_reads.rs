use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use shared::storage::{ETag, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject};

/// Storage whose reads of keys under a prefix wait until [`HeldReads::release`]: a slow
/// bucket, as seen by whoever must not wait for those reads.
#[derive(Debug)]
pub struct HeldReads {
    inner: Arc<dyn Storage>,
    prefix: &'static str,
    released: tokio::sync::watch::Sender<bool>,
}

impl HeldReads {
    /// Wraps `inner`, holding every read of a key under `prefix`.
    pub fn under(inner: Arc<dyn Storage>, prefix: &'static str) -> Self {
        Self {
            inner,
            prefix,
            released: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Lets every held read, and every later one, through.
    pub fn release(&self) {
        self.released.send_replace(true);
    }
}

#[async_trait]
impl Storage for HeldReads {
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError> {
        self.inner.put(key, body, mode).await
    }

    async fn put_file(
        &self,
        key: &ObjectKey,
        path: &std::path::Path,
        mode: PutMode,
    ) -> Result<(ETag, u64), StorageError> {
        self.inner.put_file(key, path, mode).await
    }

    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
        if key.as_str().starts_with(self.prefix) {
            // The sender lives as long as `self`: the wait ends only on release.
            let _ = self
                .released
                .subscribe()
                .wait_for(|released| *released)
                .await;
        }
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
        // A read held must not be bypassed by reading the file in place.
        if key.as_str().starts_with(self.prefix) && !*self.released.borrow() {
            return None;
        }
        self.inner.local_path(key)
    }
}
