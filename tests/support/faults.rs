//! Storage that fails the way S3 fails in production, wrapped around a real backend: the
//! faults are injected at the `Storage` boundary, the objects still live in the real store.
//! Beside them, storage that only watches ([`RecordsGets`]) or holds reads back.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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

/// What happens to one conditional manifest write under [`UnreliableManifestWrites`]: each is a
/// way S3 and its SDK end a `PutObject` in production.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WriteFate {
    /// Written, answered.
    Answered,
    /// Written, the answer lost: the SDK's retry of the same request gets 412.
    AnswerLost,
    /// Timed out before reaching the store: not written.
    TimedOutBefore,
    /// Timed out after the store wrote it: written, the caller sees an error.
    TimedOutAfter,
    /// The SDK's retry met the first attempt still in flight (409), and the first attempt then
    /// landed: written just after the caller's next read of the key.
    InFlightLands,
    /// The same 409, and the first attempt then failed: not written.
    InFlightFails,
}

/// Conditional writes of manifests meeting every [`WriteFate`], chosen by a seeded generator:
/// a seed is one reproducible sequence of timeouts, retries and conflicts. A write that lands
/// late ([`WriteFate::InFlightLands`]) is applied to the real store right after the next read
/// of its key has read the version before it, which is the moment its outcome can fool a
/// caller that takes the 409 for a lost race. [`WriteFate::InFlightFails`], whose caller can
/// only wait out its reading again (seconds), happens at most once, and only when asked for.
/// Files go through the trait's own `put_file`, so manifests written from a file meet the same
/// fates.
#[derive(Debug)]
pub struct UnreliableManifestWrites {
    inner: Arc<dyn Storage>,
    state: std::sync::Mutex<Unreliable>,
}

#[derive(Debug)]
struct Unreliable {
    seed: u64,
    stuck_left: bool,
    held: Option<(ObjectKey, Bytes, PutMode)>,
    fates: std::collections::BTreeMap<WriteFate, usize>,
    deleted: Vec<ObjectKey>,
}

impl UnreliableManifestWrites {
    const PREFIX: &'static str = "tables/manifests/";

    /// Wraps `inner`; `seed` picks the fates, one of which may be
    /// [`WriteFate::InFlightFails`] when `stuck` says so.
    pub fn new(inner: Arc<dyn Storage>, seed: u64, stuck: bool) -> Self {
        Self {
            inner,
            state: std::sync::Mutex::new(Unreliable {
                seed,
                stuck_left: stuck,
                held: None,
                fates: std::collections::BTreeMap::new(),
                deleted: Vec::new(),
            }),
        }
    }

    /// How many manifest writes met each fate so far.
    pub fn fates(&self) -> std::collections::BTreeMap<WriteFate, usize> {
        self.lock().fates.clone()
    }

    /// Every key deleted through this wrapper so far.
    pub fn deleted(&self) -> Vec<ObjectKey> {
        self.lock().deleted.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Unreliable> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next fate (splitmix64 over the seed); a write in flight is held one at a time.
    fn fate(&self) -> WriteFate {
        let mut state = self.lock();
        state.seed = state.seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state.seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let fate = match (z ^ (z >> 31)) % 20 {
            0..=6 => WriteFate::Answered,
            7..=9 => WriteFate::AnswerLost,
            10..=11 => WriteFate::TimedOutBefore,
            12..=13 => WriteFate::TimedOutAfter,
            14..=18 => WriteFate::InFlightLands,
            _ => WriteFate::InFlightFails,
        };
        let fate = match fate {
            WriteFate::InFlightLands if state.held.is_some() => WriteFate::Answered,
            WriteFate::InFlightFails if !state.stuck_left => WriteFate::Answered,
            other => other,
        };
        if fate == WriteFate::InFlightFails {
            state.stuck_left = false;
        }
        *state.fates.entry(fate).or_default() += 1;
        fate
    }

    fn timeout(key: &ObjectKey) -> StorageError {
        StorageError::Backend {
            key: key.to_string(),
            source: Box::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "injected fault: the request timed out",
            )),
        }
    }
}

#[async_trait]
impl Storage for UnreliableManifestWrites {
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError> {
        if mode == PutMode::Overwrite || !key.as_str().starts_with(Self::PREFIX) {
            return self.inner.put(key, body, mode).await;
        }
        match self.fate() {
            WriteFate::Answered => self.inner.put(key, body, mode).await,
            WriteFate::AnswerLost => {
                self.inner.put(key, body, mode).await?;
                Err(StorageError::Precondition { key: key.clone() })
            }
            WriteFate::TimedOutBefore => Err(Self::timeout(key)),
            WriteFate::TimedOutAfter => {
                self.inner.put(key, body, mode).await?;
                Err(Self::timeout(key))
            }
            WriteFate::InFlightLands => {
                self.lock().held = Some((key.clone(), body, mode));
                Err(StorageError::Conflict { key: key.clone() })
            }
            WriteFate::InFlightFails => Err(StorageError::Conflict { key: key.clone() }),
        }
    }

    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
        let read = self.inner.get(key).await;
        let held = {
            let mut state = self.lock();
            match &state.held {
                Some((held, ..)) if held == key => state.held.take(),
                _ => None,
            }
        };
        if let Some((key, body, mode)) = held {
            // The write in flight ends now: it lands if its condition still holds.
            let _ = self.inner.put(&key, body, mode).await;
        }
        read
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError> {
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &ObjectKey) -> Result<(), StorageError> {
        self.lock().deleted.push(key.clone());
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
