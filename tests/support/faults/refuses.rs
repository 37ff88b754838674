use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use shared::storage::{ETag, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject};

/// Storage refusing, until [`Refuses::clear`], what a full disk or an outage refuses: writes of
/// keys under a prefix, or reads of chosen keys. Everything else, and everything after the
/// fault clears, reaches the real store.
#[derive(Debug)]
pub struct Refuses {
    inner: Arc<dyn Storage>,
    writes_under: Option<&'static str>,
    reads_of: Vec<ObjectKey>,
    on: AtomicBool,
    refused: AtomicUsize,
}

impl Refuses {
    /// Wraps `inner`, refusing every write of a key under `prefix` as a full disk does.
    pub fn writes_under(inner: Arc<dyn Storage>, prefix: &'static str) -> Self {
        Self {
            inner,
            writes_under: Some(prefix),
            reads_of: Vec::new(),
            on: AtomicBool::new(true),
            refused: AtomicUsize::new(0),
        }
    }

    /// Wraps `inner`, refusing every read of `keys`.
    pub fn reads_of(inner: Arc<dyn Storage>, keys: Vec<ObjectKey>) -> Self {
        Self {
            inner,
            writes_under: None,
            reads_of: keys,
            on: AtomicBool::new(true),
            refused: AtomicUsize::new(0),
        }
    }

    /// Ends the fault: from now on every call reaches the real store.
    pub fn clear(&self) {
        self.on.store(false, Ordering::SeqCst);
    }

    /// How many calls were refused so far.
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    fn refuse(&self, key: &ObjectKey, refused: bool, as_full: bool) -> Result<(), StorageError> {
        if !(refused && self.on.load(Ordering::SeqCst)) {
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::SeqCst);
        let error = if as_full {
            std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "injected fault: no space left on device",
            )
        } else {
            std::io::Error::other("injected fault: read refused")
        };
        Err(StorageError::Backend {
            key: key.to_string(),
            source: Box::new(error),
        })
    }

    fn refuses_write(&self, key: &ObjectKey) -> bool {
        self.writes_under
            .is_some_and(|prefix| key.as_str().starts_with(prefix))
    }
}

#[async_trait]
impl Storage for Refuses {
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError> {
        self.refuse(key, self.refuses_write(key), true)?;
        self.inner.put(key, body, mode).await
    }

    async fn put_file(
        &self,
        key: &ObjectKey,
        path: &std::path::Path,
        mode: PutMode,
    ) -> Result<(ETag, u64), StorageError> {
        self.refuse(key, self.refuses_write(key), true)?;
        self.inner.put_file(key, path, mode).await
    }

    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
        self.refuse(key, self.reads_of.contains(key), false)?;
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
        // A read refused must not be bypassed by reading the file in place.
        if self.reads_of.contains(key) && self.on.load(Ordering::SeqCst) {
            return None;
        }
        self.inner.local_path(key)
    }
}
