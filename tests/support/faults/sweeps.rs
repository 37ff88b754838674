use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use shared::storage::{ETag, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject};

/// Another `delete_retired` of the same table running to its end between this one's listing
/// of the table's retired records and its reads of them, as the catalog function's sweep and
/// a request's sync may: the first listing under the records' prefix is answered as it was
/// before the other deleted every record whose grace period is over, at `now_ms`.
#[derive(Debug)]
pub struct SweepsBetweenListAndRead {
    inner: Arc<dyn Storage>,
    table: &'static str,
    now_ms: i64,
    swept: AtomicUsize,
}

impl SweepsBetweenListAndRead {
    /// Wraps `inner` for `table`'s records.
    pub fn new(inner: Arc<dyn Storage>, table: &'static str, now_ms: i64) -> Self {
        Self {
            inner,
            table,
            now_ms,
            swept: AtomicUsize::new(0),
        }
    }

    /// Files the other sweep deleted (0 until it ran).
    pub fn swept(&self) -> usize {
        self.swept.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Storage for SweepsBetweenListAndRead {
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError> {
        self.inner.put(key, body, mode).await
    }

    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
        self.inner.get(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError> {
        let listed = self.inner.list(prefix).await?;
        let records = shared::keys::iceberg_retired_prefix(self.table);
        if prefix == records && self.swept() == 0 {
            let swept = shared::iceberg::delete_retired(&self.inner, self.table, self.now_ms)
                .await
                .map_err(|err| StorageError::Backend {
                    key: records.clone(),
                    source: err.to_string().into(),
                })?;
            self.swept.store(swept.max(1), Ordering::SeqCst);
        }
        Ok(listed)
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
