//! The local-directory backend: the embedded default of `afterglow serve`.
//!
//! Objects are files under the root, at their key's path. Every put is written to a staging file,
//! synced and renamed into place under an exclusive file lock, so readers never see partial
//! objects and conditional puts are linearizable even across processes sharing the directory.
//! The staging directory and lock file carry a `~`, which no [`ObjectKey`] may contain, so they
//! can never collide with an object.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;

use super::{ETag, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject};

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

/// A version tag from file metadata. Every put renames a fresh staging file into place, so a
/// new version always has a new inode and modification time.
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
    let backend = |err: io::Error| StorageError::backend(key, err);
    let dest = root.join(key.as_str());
    let parent = dest.parent().unwrap_or(root);
    fs::create_dir_all(parent).map_err(backend)?;

    let staging = root.join(STAGING_DIR).join(ulid::Ulid::new().to_string());
    let mut file = File::create(&staging).map_err(backend)?;
    let written = file
        .write_all(body)
        .and_then(|()| file.sync_all())
        .and_then(|()| file.metadata());
    let metadata = match written {
        Ok(metadata) => metadata,
        Err(err) => {
            let _ = fs::remove_file(&staging);
            return Err(backend(err));
        }
    };

    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join(LOCK_FILE))
        .map_err(backend)?;
    lock.lock().map_err(backend)?;
    let allowed = match mode {
        PutMode::Overwrite => Ok(()),
        PutMode::Create => match current_etag(&dest).map_err(backend)? {
            None => Ok(()),
            Some(_) => Err(StorageError::Precondition { key: key.clone() }),
        },
        PutMode::Update(expected) => match current_etag(&dest).map_err(backend)? {
            Some(current) if &current == expected => Ok(()),
            _ => Err(StorageError::Precondition { key: key.clone() }),
        },
    };
    let outcome = allowed.and_then(|()| {
        fs::rename(&staging, &dest)
            .and_then(|()| sync_dir(parent))
            .map_err(backend)
    });
    drop(lock);
    if outcome.is_err() {
        let _ = fs::remove_file(&staging);
    }
    outcome.map(|()| etag_of(&metadata))
}

fn get_blocking(root: &Path, key: &ObjectKey) -> Result<StoredObject, StorageError> {
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
    let mut body = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
    io::Read::read_to_end(&mut file, &mut body).map_err(not_found_or_backend)?;
    Ok(StoredObject {
        body: Bytes::from(body),
        etag: etag_of(&metadata),
    })
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

    #[tracing::instrument(name = "local.get", skip(self), fields(key = %key))]
    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
        let key = key.clone();
        self.blocking(key.clone().as_str(), move |root| get_blocking(root, &key))
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
}
