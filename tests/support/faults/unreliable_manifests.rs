use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use shared::storage::{ETag, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject};

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
