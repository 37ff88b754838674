//! Turning configuration into the parts every command and function runs on: the store, a
//! compactor with its scratch directory, the ingest secrets.

use std::sync::Arc;

use anyhow::Context as _;
use shared::auth::ingest::{IngestKeys, RefreshPolicy};
use shared::compact::fold::FoldPolicy;
use shared::compact::{CompactSettings, Compactor};
use shared::config::{Config, StorageConfig};
use shared::storage::{LocalDirStorage, S3Storage, Storage};

/// Opens the storage `config` names, with `data_dir` taking precedence.
pub async fn open_storage(
    config: &Config,
    data_dir: Option<std::path::PathBuf>,
) -> anyhow::Result<Arc<dyn Storage>> {
    let local_dir = match (data_dir, &config.storage) {
        (Some(dir), _) => dir,
        (None, StorageConfig::LocalDir(dir)) => dir.clone(),
        (None, StorageConfig::S3(settings)) => {
            return Ok(Arc::new(S3Storage::connect(settings.clone()).await));
        }
    };
    let storage = LocalDirStorage::open(&local_dir)
        .with_context(|| format!("cannot use data directory {}", local_dir.display()))?;
    let storage: Arc<dyn Storage> = Arc::new(storage);
    Ok(storage)
}

/// A compactor over `storage` with a private scratch directory, removed when the returned guard
/// drops; retention from `config`.
pub fn compactor_with_scratch(
    storage: Arc<dyn Storage>,
    config: &Config,
) -> anyhow::Result<(Compactor, tempfile::TempDir)> {
    let scratch = tempfile::Builder::new()
        .prefix("afterglow-")
        .tempdir()
        .context("cannot create a scratch directory")?;
    let settings = CompactSettings {
        retention: config.tables_retention,
        stored_keys_bytes: config.stored_keys_bytes,
        fold: FoldPolicy {
            quiet: config.fold_quiet,
            ..FoldPolicy::default()
        },
        ..CompactSettings::default()
    };
    let compactor = Compactor::new(storage, settings, scratch.path().to_path_buf());
    Ok((compactor, scratch))
}

/// The ingest secrets `config` names, read now (from Secrets Manager, when it names a secret).
pub async fn ingest_keys(config: &Config) -> anyhow::Result<Option<Arc<IngestKeys>>> {
    let Some(source) = config.ingest_secret.clone() else {
        return Ok(None);
    };
    let keys = IngestKeys::load(source, RefreshPolicy::default())
        .await
        .context("cannot read the ingest secret")?;
    Ok(Some(Arc::new(keys)))
}
