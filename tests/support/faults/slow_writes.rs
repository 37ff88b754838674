use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use shared::storage::{ETag, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject};

/// Storage whose writes (puts and deletes) of keys under a prefix each take `delay` longer,
/// recording the most clusters that had such a write in flight at once: work for two clusters
/// done at the same time shows as two, however the work of one cluster overlaps itself.
#[derive(Debug)]
pub struct SlowWrites {
    inner: Arc<dyn Storage>,
    prefix: &'static str,
    delay: std::time::Duration,
    /// Writes in flight, by cluster.
    in_flight: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
    most: AtomicUsize,
    writes: AtomicUsize,
}

impl SlowWrites {
    /// Wraps `inner`, slowing every write of a key under `prefix` by `delay`.
    pub fn under(
        inner: Arc<dyn Storage>,
        prefix: &'static str,
        delay: std::time::Duration,
    ) -> Self {
        Self {
            inner,
            prefix,
            delay,
            in_flight: std::sync::Mutex::default(),
            most: AtomicUsize::new(0),
            writes: AtomicUsize::new(0),
        }
    }

    /// The most clusters that had a write in flight at the same moment.
    pub fn most_clusters_at_once(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    /// How many writes were slowed.
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    /// Runs `write` of `key`, slowed and counted when it is under the prefix.
    async fn write<T>(&self, key: &ObjectKey, write: impl std::future::Future<Output = T>) -> T {
        let cluster = key
            .as_str()
            .strip_prefix(self.prefix)
            .and_then(|rest| {
                rest.split('/')
                    .find_map(|part| part.strip_prefix("cluster="))
            })
            .map(str::to_owned);
        let Some(cluster) = cluster else {
            return write.await;
        };
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.enter(&cluster, true);
        // Counted out even if the write is dropped half way.
        let _in_flight = InFlight {
            writes: self,
            cluster,
        };
        tokio::time::sleep(self.delay).await;
        write.await
    }

    /// Counts a write of `cluster` in (`starts`) or out.
    fn enter(&self, cluster: &str, starts: bool) {
        // A poisoned lock means a test already panicked; its count no longer matters.
        let Ok(mut in_flight) = self.in_flight.lock() else {
            return;
        };
        if starts {
            *in_flight.entry(cluster.to_owned()).or_default() += 1;
            self.most.fetch_max(in_flight.len(), Ordering::SeqCst);
        } else if let Some(count) = in_flight.get_mut(cluster) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(cluster);
            }
        }
    }
}

/// A write of [`SlowWrites`] in flight, counted out when dropped.
struct InFlight<'a> {
    writes: &'a SlowWrites,
    cluster: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.writes.enter(&self.cluster, false);
    }
}

#[async_trait]
impl Storage for SlowWrites {
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError> {
        self.write(key, self.inner.put(key, body, mode)).await
    }

    async fn put_file(
        &self,
        key: &ObjectKey,
        path: &std::path::Path,
        mode: PutMode,
    ) -> Result<(ETag, u64), StorageError> {
        self.write(key, self.inner.put_file(key, path, mode)).await
    }

    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
        self.inner.get(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError> {
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &ObjectKey) -> Result<(), StorageError> {
        self.write(key, self.inner.delete(key)).await
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
