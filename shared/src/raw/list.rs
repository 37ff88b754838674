//! Listing the raw objects in a store.

use super::key::{RAW_PREFIX, RAW_SUFFIX};
use crate::storage::{ObjectKey, Storage, StorageError};

/// Every raw object's key in `storage`, in listing order (by cluster, then time).
pub async fn list_keys(storage: &dyn Storage) -> Result<Vec<ObjectKey>, StorageError> {
    Ok(storage
        .list(RAW_PREFIX)
        .await?
        .into_iter()
        .map(|meta| meta.key)
        .filter(|key| key.as_str().ends_with(RAW_SUFFIX))
        .collect())
}
