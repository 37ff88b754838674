//! The local-directory backend: the embedded default of `afterglow serve`.
//!
//! Objects are files under the root, at their key's path. Every put is written to a staging file,
//! synced and renamed into place under an exclusive file lock, so readers never see partial
//! objects and conditional puts are linearizable even across processes sharing the directory.
//! The staging directory and lock file carry a `~`, which no [`ObjectKey`] may contain, so they
//! can never collide with an object.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;

use super::{
    ETag, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject, past_the_end, within,
};

const STAGING_DIR: &str = "~staging";
const LOCK_FILE: &str = "~lock";

/// Objects as files under one directory.
#[derive(Clone, Debug)]
pub struct LocalDirStorage {
    root: PathBuf,
}

impl LocalDirStorage {
    /// Uses (and creates, if needed) `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StorageError> {
        let root = root.into();
        fs::create_dir_all(root.join(STAGING_DIR))
            .map_err(|err| StorageError::backend(root.display(), err))?;
        Ok(Self { root })
    }

    /// The directory objects live in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Runs blocking file work off the async executor.
    async fn blocking<T: Send + 'static>(
        &self,
        key: &str,
        work: impl FnOnce(&Path) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || work(&root))
            .await
            .map_err(|err| StorageError::backend(key, err))?
    }
}

/// A version tag from file metadata. Every put renames a staging file into place that no other
/// object shares (a fresh file, or one linked from a file with no other name) and that is
/// dated when it was staged, so a new version always has a new inode and modification time.
fn etag_of(metadata: &fs::Metadata) -> ETag {
    ETag::new(format!(
        "{:x}-{:x}.{:x}-{:x}",
        metadata.ino(),
        metadata.mtime(),
        metadata.mtime_nsec(),
        metadata.len()
    ))
}

fn current_etag(path: &Path) -> io::Result<Option<ETag>> {
    match fs::metadata(path) {
        Ok(metadata) => Ok(Some(etag_of(&metadata))),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn put_blocking(
    root: &Path,
    key: &ObjectKey,
    body: &[u8],
    mode: &PutMode,
) -> Result<ETag, StorageError> {
    let staging = staging_path(root);
    let staged = File::create(&staging).and_then(|mut file| {
        file.write_all(body)?;
        file.sync_all()?;
        file.metadata()
    });
    commit_staged(root, key, &staging, staged, mode).map(|(etag, _)| etag)
}

/// A new name in the staging directory.
fn staging_path(root: &Path) -> PathBuf {
    root.join(STAGING_DIR).join(ulid::Ulid::new().to_string())
}

/// [`put_blocking`] of the file at `source`: linked into the staging directory rather than copied
/// (a fold's base of a large session is hundreds of megabytes: copying it would take seconds, and
/// reading it whole first as much memory), unless it has another name already (it may be an object:
/// re-dating it would change that object's tag) or is on another filesystem. Returns the new
/// version's tag and its bytes.
fn put_file_blocking(
    root: &Path,
    key: &ObjectKey,
    source: &Path,
    mode: &PutMode,
) -> Result<(ETag, u64), StorageError> {
    let staging = staging_path(root);
    let linked = fs::metadata(source)
        .and_then(|metadata| match metadata.nlink() {
            1 => fs::hard_link(source, &staging),
            _ => Err(io::Error::other("the file has other names")),
        })
        .is_ok();
    let staged = if linked {
        Ok(())
    } else {
        fs::copy(source, &staging).map(drop)
    }
    .and_then(|()| File::open(&staging))
    .and_then(|file| {
        // Dated now, as a put's file is: a new version's tag changes, and orphans are aged
        // from when they were stored.
        file.set_modified(std::time::SystemTime::now())?;
        file.sync_all()?;
        file.metadata()
    });
    commit_staged(root, key, &staging, staged, mode)
}

/// Renames the file `staging` (its metadata `staged`, or why it could not be staged) into
/// place at `key` if `mode` allows, under the lock; removes it otherwise. Returns the new
/// version's tag and its bytes.
fn commit_staged(
    root: &Path,
    key: &ObjectKey,
    staging: &Path,
    staged: io::Result<fs::Metadata>,
    mode: &PutMode,
) -> Result<(ETag, u64), StorageError> {
    let backend = |err: io::Error| StorageError::backend(key, err);
    let dest = root.join(key.as_str());
    let parent = dest.parent().unwrap_or(root);
    let renamed = || -> Result<fs::Metadata, StorageError> {
        let metadata = staged.map_err(backend)?;
        fs::create_dir_all(parent).map_err(backend)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join(LOCK_FILE))
            .map_err(backend)?;
        lock.lock().map_err(backend)?;
        let current = current_etag(&dest).map_err(backend)?;
        let allowed = match (mode, current) {
            (PutMode::Overwrite, _) | (PutMode::Create, None) => true,
            (PutMode::Update(expected), Some(current)) => &current == expected,
            (PutMode::Create, Some(_)) | (PutMode::Update(_), None) => false,
        };
        if !allowed {
            return Err(StorageError::Precondition { key: key.clone() });
        }
        fs::rename(staging, &dest)
            .and_then(|()| sync_dir(parent))
            .map_err(backend)?;
        Ok(metadata)
    };
    let outcome = renamed();
    if outcome.is_err() {
        // Whatever failed, the staging name goes: nothing else would ever remove it.
        let _ = fs::remove_file(staging);
    }
    outcome.map(|metadata| (etag_of(&metadata), metadata.len()))
}

/// The object at `key`, if it is at most `limit` bytes: a larger one is refused by its size,
/// before its bytes are read.
fn get_blocking(root: &Path, key: &ObjectKey, limit: u64) -> Result<StoredObject, StorageError> {
    let not_found_or_backend = |err: io::Error| {
        if err.kind() == io::ErrorKind::NotFound {
            StorageError::NotFound { key: key.clone() }
        } else {
            StorageError::backend(key, err)
        }
    };
    let path = root.join(key.as_str());
    let mut file = File::open(&path).map_err(not_found_or_backend)?;
    // Tag and bytes come from the same open file, so they always describe one version.
    let metadata = file.metadata().map_err(not_found_or_backend)?;
    if metadata.is_dir() {
        return Err(StorageError::NotFound { key: key.clone() });
    }
    within(key, metadata.len(), limit)?;
    let mut body = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
    io::Read::read_to_end(&mut file, &mut body).map_err(not_found_or_backend)?;
    Ok(StoredObject {
        body: Bytes::from(body),
        etag: etag_of(&metadata),
    })
}

fn get_range_blocking(
    root: &Path,
    key: &ObjectKey,
    range: &Range<u64>,
) -> Result<Bytes, StorageError> {
    let not_found_or_backend = |err: io::Error| {
        if err.kind() == io::ErrorKind::NotFound {
            StorageError::NotFound { key: key.clone() }
        } else {
            StorageError::backend(key, err)
        }
    };
    let mut file = File::open(root.join(key.as_str())).map_err(not_found_or_backend)?;
    let metadata = file.metadata().map_err(not_found_or_backend)?;
    if metadata.is_dir() {
        return Err(StorageError::NotFound { key: key.clone() });
    }
    let length = range
        .end
        .checked_sub(range.start)
        .filter(|_| range.end <= metadata.len())
        .and_then(|length| usize::try_from(length).ok())
        .ok_or_else(|| StorageError::backend(key, past_the_end(range, metadata.len())))?;
    file.seek(SeekFrom::Start(range.start))
        .map_err(not_found_or_backend)?;
    let mut body = vec![0; length];
    file.read_exact(&mut body).map_err(not_found_or_backend)?;
    Ok(Bytes::from(body))
}

fn list_blocking(root: &Path, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError> {
    // Walk from the deepest directory the prefix names; the rest of it filters names.
    let start = match prefix.rsplit_once('/') {
        Some((dir, _)) => root.join(dir),
        None => root.to_path_buf(),
    };
    let mut found = Vec::new();
    let mut pending = vec![start];
    while let Some(dir) = pending.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(StorageError::backend(prefix, err)),
        };
        for entry in entries {
            let entry = entry.map_err(|err| StorageError::backend(prefix, err))?;
            let file_type = entry
                .file_type()
                .map_err(|err| StorageError::backend(prefix, err))?;
            let path = entry.path();
            let Some(relative) = path
                .strip_prefix(root)
                .ok()
                .and_then(|relative| relative.to_str())
            else {
                continue;
            };
            if file_type.is_dir() {
                if relative.starts_with(prefix) || prefix.starts_with(&format!("{relative}/")) {
                    pending.push(path);
                }
            } else if relative.starts_with(prefix) {
                // Names that are not keys (the staging dir, the lock, stray files) are skipped.
                if let Ok(key) = ObjectKey::new(relative) {
                    let metadata = entry
                        .metadata()
                        .map_err(|err| StorageError::backend(&key, err))?;
                    let modified = metadata
                        .modified()
                        .map_err(|err| StorageError::backend(&key, err))?;
                    found.push(ObjectMeta {
                        key,
                        size: metadata.len(),
                        modified,
                    });
                }
            }
        }
    }
    found.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(found)
}

#[async_trait]
impl Storage for LocalDirStorage {
    #[tracing::instrument(name = "local.put", skip(self, body), fields(key = %key, bytes = body.len()))]
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError> {
        let key = key.clone();
        self.blocking(key.clone().as_str(), move |root| {
            put_blocking(root, &key, &body, &mode)
        })
        .await
    }

    #[tracing::instrument(name = "local.put_file", skip(self, path), fields(key = %key))]
    async fn put_file(
        &self,
        key: &ObjectKey,
        path: &Path,
        mode: PutMode,
    ) -> Result<(ETag, u64), StorageError> {
        let (key, path) = (key.clone(), path.to_owned());
        self.blocking(key.clone().as_str(), move |root| {
            put_file_blocking(root, &key, &path, &mode)
        })
        .await
    }

    #[tracing::instrument(name = "local.get", skip(self), fields(key = %key))]
    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
        let key = key.clone();
        self.blocking(key.clone().as_str(), move |root| {
            get_blocking(root, &key, u64::MAX)
        })
        .await
    }

    #[tracing::instrument(name = "local.get_within", skip(self), fields(key = %key))]
    async fn get_within(&self, key: &ObjectKey, limit: u64) -> Result<StoredObject, StorageError> {
        let key = key.clone();
        self.blocking(key.clone().as_str(), move |root| {
            get_blocking(root, &key, limit)
        })
        .await
    }

    #[tracing::instrument(name = "local.get_range", skip(self), fields(key = %key))]
    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        let key = key.clone();
        self.blocking(key.clone().as_str(), move |root| {
            get_range_blocking(root, &key, &range)
        })
        .await
    }

    #[tracing::instrument(name = "local.list", skip(self))]
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError> {
        let owned = prefix.to_owned();
        self.blocking(prefix, move |root| list_blocking(root, &owned))
            .await
    }

    #[tracing::instrument(name = "local.delete", skip(self), fields(key = %key))]
    async fn delete(&self, key: &ObjectKey) -> Result<(), StorageError> {
        let key = key.clone();
        self.blocking(key.clone().as_str(), move |root| {
            match fs::remove_file(root.join(key.as_str())) {
                Ok(()) => Ok(()),
                Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(err) => Err(StorageError::backend(&key, err)),
            }
        })
        .await
    }

    fn location(&self) -> String {
        self.root.display().to_string()
    }

    fn local_path(&self, key: &ObjectKey) -> Option<PathBuf> {
        Some(self.root.join(key.as_str()))
    }

    fn uri(&self, key: &ObjectKey) -> String {
        let path = self.root.join(key.as_str());
        std::path::absolute(&path)
            .unwrap_or(path)
            .display()
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    /// A file on the store's filesystem is linked into place, not copied (a fold's base may be
    /// hundreds of megabytes), and dated when it was stored, not when it was written.
    #[tokio::test]
    async fn a_file_on_the_stores_filesystem_is_linked_and_dated_now()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let storage = LocalDirStorage::open(dir.path().join("store"))?;
        let path = dir.path().join("base.parquet");
        fs::write(&path, b"rows")?;
        let written = SystemTime::now() - std::time::Duration::from_secs(3_600);
        File::options()
            .write(true)
            .open(&path)?
            .set_modified(written)?;
        let key = ObjectKey::new("tables/t/base-1.parquet")?;
        let (_, bytes) = storage.put_file(&key, &path, PutMode::Create).await?;
        assert_eq!(bytes, 4);
        let stored = fs::metadata(dir.path().join("store").join(key.as_str()))?;
        assert_eq!(
            stored.ino(),
            fs::metadata(&path)?.ino(),
            "linked, not copied"
        );
        let age = SystemTime::now().duration_since(stored.modified()?)?;
        assert!(age.as_secs() < 60, "dated {age:?} ago");

        // Now that the file has two names (one an object's), a second put copies it: linked,
        // re-dating it would change the first object's tag.
        let first = storage.get(&key).await?.etag;
        let again = ObjectKey::new("tables/t/base-2.parquet")?;
        storage.put_file(&again, &path, PutMode::Create).await?;
        let copied = fs::metadata(dir.path().join("store").join(again.as_str()))?;
        assert_ne!(copied.ino(), stored.ino(), "copied, not linked");
        assert_eq!(
            storage.get(&key).await?.etag,
            first,
            "the first object is as it was"
        );
        Ok(())
    }

    /// A put that fails after its file was staged (here the lock cannot be opened: its name is
    /// a directory) or that has nothing to stage (a file that is not there) leaves nothing in
    /// the staging directory, which nothing else would ever empty.
    #[tokio::test]
    async fn a_failed_put_leaves_no_staged_file() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("store");
        let storage = LocalDirStorage::open(&root)?;
        let staged =
            || -> std::io::Result<usize> { Ok(fs::read_dir(root.join(STAGING_DIR))?.count()) };
        let key = ObjectKey::new("tables/t/delta-1.parquet")?;
        let missing = storage
            .put_file(&key, &dir.path().join("no-such.parquet"), PutMode::Create)
            .await;
        assert!(
            matches!(missing, Err(StorageError::Backend { .. })),
            "{missing:?}"
        );
        assert_eq!(staged()?, 0, "a file that is not there staged nothing");

        fs::create_dir(root.join(LOCK_FILE))?;
        let path = dir.path().join("delta.parquet");
        fs::write(&path, b"rows")?;
        let put = storage
            .put(&key, Bytes::from_static(b"rows"), PutMode::Create)
            .await;
        assert!(matches!(put, Err(StorageError::Backend { .. })), "{put:?}");
        let put_file = storage.put_file(&key, &path, PutMode::Create).await;
        assert!(
            matches!(put_file, Err(StorageError::Backend { .. })),
            "{put_file:?}"
        );
        assert_eq!(staged()?, 0, "the staged files were removed");
        assert_eq!(fs::read(&path)?, b"rows", "the caller's file is as it was");
        assert!(matches!(
            storage.get(&key).await,
            Err(StorageError::NotFound { .. })
        ));
        Ok(())
    }
}
