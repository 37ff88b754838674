//! Object storage: one small trait, two backends.
//!
//! Everything Afterglow keeps lives in a flat key space of immutable objects plus a few small
//! objects replaced under a condition (manifests). [`Storage`] is that contract;
//! [`S3Storage`] is the deployed backend and [`LocalDirStorage`] the embedded default of `serve`.
//! Both pass the same conformance suite (`tests/storage.rs`). Nothing here knows what the
//! objects contain.

mod cache;
mod key;
mod local;
mod s3;

use std::fmt;
use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;

pub(crate) use self::cache::take_least_recent;
pub use self::cache::{CachedFiles, FileCache};
pub use self::key::{InvalidKey, ObjectKey};
pub use self::local::LocalDirStorage;
pub use self::s3::{S3Settings, S3Storage};

/// An object version tag: opaque, compared only for equality.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ETag(String);

impl ETag {
    /// Wraps a backend's tag.
    pub fn new(tag: impl Into<String>) -> Self {
        Self(tag.into())
    }

    /// The tag as the backend wrote it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How a [`Storage::put`] treats an object that may already exist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutMode {
    /// Write whatever is there.
    Overwrite,
    /// Write only if no object exists at the key (S3 `If-None-Match: *`).
    Create,
    /// Write only if the current object has this tag (S3 `If-Match`).
    Update(ETag),
}

/// An object's bytes and version.
#[derive(Clone, Debug)]
pub struct StoredObject {
    /// The whole object.
    pub body: Bytes,
    /// Its version, for a later [`PutMode::Update`].
    pub etag: ETag,
}

/// What a listing says about one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The key, without any backend prefix.
    pub key: ObjectKey,
    /// Size in bytes.
    pub size: u64,
    /// When the store last wrote it, by the store's clock (S3's `LastModified`, the file's
    /// mtime), so that age decisions do not depend on a writer's clock.
    pub modified: std::time::SystemTime,
}

/// Why a storage call failed. Every variant names the key involved.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// No object at the key.
    #[error("no object at {key}")]
    NotFound {
        /// The key asked for.
        key: ObjectKey,
    },
    /// A conditional put lost: the object exists ([`PutMode::Create`]) or changed or vanished
    /// ([`PutMode::Update`]). Re-read and retry.
    #[error("the object at {key} changed (conditional write refused)")]
    Precondition {
        /// The key written.
        key: ObjectKey,
    },
    /// A conditional put met another conditional write to the same key still in flight (S3's
    /// `409 ConditionalRequestConflict`), which may be this caller's own earlier attempt of the
    /// same request: the SDK retries a write whose response timed out. Either write may still
    /// land, so this is not a lost race: read the key again once the other write has ended
    /// before deciding what happened.
    #[error("another write to {key} was in flight (the conditional write was not decided)")]
    Conflict {
        /// The key written.
        key: ObjectKey,
    },
    /// An object larger than its reader takes ([`Storage::get_within`]).
    #[error("the object at {key} is {bytes} bytes, more than the {limit} its reader takes")]
    TooLarge {
        /// The key read.
        key: ObjectKey,
        /// Its size.
        bytes: u64,
        /// The most the read takes.
        limit: u64,
    },
    /// The backend failed (network, permissions, disk). Nothing is known to be written.
    #[error("storage failed at {key}: {source}")]
    Backend {
        /// The key (or prefix) involved.
        key: String,
        /// What the backend said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StorageError {
    pub(crate) fn backend(
        key: impl fmt::Display,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Backend {
            key: key.to_string(),
            source: source.into(),
        }
    }
}

/// Why a range read was refused: it runs past the object's end.
pub(crate) fn past_the_end(range: &Range<u64>, size: u64) -> String {
    format!(
        "bytes {}..{} run past the object's {size} bytes",
        range.start, range.end
    )
}

/// Most keys one [`Storage::delete_all`] request deletes: S3's limit for a batch delete.
pub const MAX_KEYS_PER_DELETE: usize = 1000;

/// `Ok` when an object of `bytes` is at most `limit`, else [`StorageError::TooLarge`].
pub(crate) fn within(key: &ObjectKey, bytes: u64, limit: u64) -> Result<(), StorageError> {
    if bytes > limit {
        return Err(StorageError::TooLarge {
            key: key.clone(),
            bytes,
            limit,
        });
    }
    Ok(())
}

/// A flat store of objects addressed by [`ObjectKey`].
///
/// Contract, for every implementation:
/// - `put` is atomic: no reader ever sees a partially written object, and when it returns `Ok`
///   the object is durable (it survives a crash of this process).
/// - Conditional puts are linearizable per key: of two racing `Update`s with the same tag, at
///   most one succeeds; the loser gets [`StorageError::Precondition`], or
///   [`StorageError::Conflict`] while the winner is still in flight (whose outcome the loser
///   then learns only by reading the key again).
/// - `list` returns keys in lexicographic order.
/// - `delete` of a missing key succeeds.
#[async_trait]
pub trait Storage: Send + Sync + fmt::Debug {
    /// Writes `body` at `key` under `mode`, returning the new version's tag.
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError>;

    /// Writes the file at `path` at `key` under `mode`, as [`Storage::put`] writes a body
    /// (atomic, the same conditions and errors; a file that cannot be read is
    /// [`StorageError::Backend`]), returning the new version's tag and the bytes written.
    /// The file is the caller's, written for this and not changed afterwards: a local store
    /// links it rather than copying it (and dates it now). It may be removed afterwards. This
    /// default reads it whole and puts it; backends stream it instead (a fold's base may be
    /// hundreds of megabytes).
    async fn put_file(
        &self,
        key: &ObjectKey,
        path: &std::path::Path,
        mode: PutMode,
    ) -> Result<(ETag, u64), StorageError> {
        let body = tokio::fs::read(path)
            .await
            .map_err(|err| StorageError::backend(key, err))?;
        let bytes = body.len() as u64;
        Ok((self.put(key, Bytes::from(body), mode).await?, bytes))
    }

    /// Reads a whole object. [`StorageError::NotFound`] if absent.
    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError>;

    /// Reads a whole object of at most `limit` bytes, as [`Storage::get`] does; a larger one
    /// is [`StorageError::TooLarge`]. This default reads it and then checks; backends refuse it
    /// by its size before reading its body.
    async fn get_within(&self, key: &ObjectKey, limit: u64) -> Result<StoredObject, StorageError> {
        let object = self.get(key).await?;
        within(key, object.body.len() as u64, limit)?;
        Ok(object)
    }

    /// Reads the bytes `range` of an object (a Parquet file's footer, without the file).
    /// [`StorageError::NotFound`] if absent; a range that runs past the object's end is
    /// [`StorageError::Backend`]. This default reads the whole object; backends read only
    /// the range.
    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        let body = self.get(key).await?.body;
        let within = usize::try_from(range.start)
            .ok()
            .zip(usize::try_from(range.end).ok())
            .filter(|(start, end)| start <= end && *end <= body.len());
        match within {
            Some((start, end)) => Ok(body.slice(start..end)),
            None => Err(StorageError::backend(
                key,
                past_the_end(&range, body.len() as u64),
            )),
        }
    }

    /// Lists every object whose key starts with `prefix`, in key order.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError>;

    /// Deletes an object; a missing one is not an error.
    async fn delete(&self, key: &ObjectKey) -> Result<(), StorageError>;

    /// Deletes every object of `keys` (missing ones are not an error) in as few requests as
    /// the backend allows: a session's thousands of log objects, or a fold's retired files,
    /// go in a few requests rather than one each. On an error some may be deleted. This
    /// default deletes them one at a time; backends with a batch delete use it.
    async fn delete_all(&self, keys: &[ObjectKey]) -> Result<(), StorageError> {
        for key in keys {
            self.delete(key).await?;
        }
        Ok(())
    }

    /// Where the objects live, for people (`s3://bucket/prefix`, a directory path).
    fn location(&self) -> String;

    /// The object's address for other programs that read the store (an Iceberg reader):
    /// `s3://bucket/prefix/key`, or a local object's absolute path.
    fn uri(&self, key: &ObjectKey) -> String {
        format!("{}/{}", self.location(), key.as_str())
    }

    /// The object's own file, when the backend keeps objects as local files: readers of
    /// immutable objects then use it in place instead of copying it.
    fn local_path(&self, _key: &ObjectKey) -> Option<std::path::PathBuf> {
        None
    }
}
