//! What `serve` had stored but not compacted when it last stopped.
//!
//! On AWS, SQS holds every notification until the compact function succeeds (or dead-letters
//! it). `serve` queues in memory, so a crash, a kill or three failed runs would leave raw
//! objects that are safe in storage (Ray got its 200) but missing from every table. The queue
//! therefore records a watermark after each successful run — the ULID time of the newest raw
//! object compacted, held back by any object it gave up on — and `serve` compacts, at start,
//! every raw object newer than the watermark minus [`MARGIN_MS`]. Compaction is idempotent, so
//! the overlap costs time, never correctness.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::layout::{RAW_PREFIX, raw_object_time_ms};
use crate::storage::{ObjectKey, PutMode, Storage, StorageError};

/// Where the watermark is kept, beside the data it describes.
pub const WATERMARK_KEY: &str = "state/serve/compacted-through.json";

/// How far before the watermark the catch-up starts. A raw object's ULID is drawn before its
/// write, so an object compacted later than a newer one is older by at most one ingest request
/// (seconds: the S3 write times out at 2.5 s); a minute covers that with room to spare.
pub const MARGIN_MS: u64 = 60_000;

#[derive(Debug, Serialize, Deserialize)]
struct Watermark {
    /// Every raw object whose ULID time is at most this, minus the margin, is compacted.
    through_ms: u64,
}

fn watermark_key() -> ObjectKey {
    // A constant that satisfies the key rules: checked by the tests below.
    ObjectKey::new(WATERMARK_KEY).unwrap_or_else(|_| unreachable!("WATERMARK_KEY is a valid key"))
}

/// Records that raw objects up to `through_ms` (ULID time) are compacted.
pub async fn save(storage: &dyn Storage, through_ms: u64) -> Result<(), StorageError> {
    let body = serde_json::to_vec(&Watermark { through_ms })
        .map_err(|err| StorageError::backend(WATERMARK_KEY, err))?;
    storage
        .put(&watermark_key(), Bytes::from(body), PutMode::Overwrite)
        .await?;
    Ok(())
}

/// The recorded watermark; `None` when `serve` never finished a run on this store (or the
/// record is unreadable, which is treated the same way: compact everything).
pub async fn load(storage: &dyn Storage) -> Result<Option<u64>, StorageError> {
    match storage.get(&watermark_key()).await {
        Ok(object) => match serde_json::from_slice::<Watermark>(&object.body) {
            Ok(watermark) => Ok(Some(watermark.through_ms)),
            Err(err) => {
                tracing::warn!(key = WATERMARK_KEY, error = %err, "unreadable watermark; compacting every raw object");
                Ok(None)
            }
        },
        Err(StorageError::NotFound { .. }) => Ok(None),
        Err(err) => Err(err),
    }
}

/// Raw objects that may not be compacted yet, oldest first: those newer than the watermark
/// minus the margin, or all of them when there is no watermark.
#[tracing::instrument(name = "backlog", skip(storage))]
pub async fn uncompacted(storage: &dyn Storage) -> Result<Vec<ObjectKey>, StorageError> {
    let since = load(storage)
        .await?
        .map(|through| through.saturating_sub(MARGIN_MS));
    let mut keys: Vec<(u64, ObjectKey)> = storage
        .list(RAW_PREFIX)
        .await?
        .into_iter()
        .filter_map(|meta| Some((raw_object_time_ms(&meta.key)?, meta.key)))
        .filter(|(at, _)| since.is_none_or(|since| *at > since))
        .collect();
    keys.sort();
    Ok(keys.into_iter().map(|(_, key)| key).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{ClusterName, raw_object_key};
    use crate::storage::LocalDirStorage;
    use ulid::Ulid;

    #[test]
    fn the_watermark_key_is_valid() {
        assert!(ObjectKey::new(WATERMARK_KEY).is_ok());
        assert!(!WATERMARK_KEY.starts_with(RAW_PREFIX));
    }

    #[tokio::test]
    async fn the_backlog_starts_one_margin_before_the_watermark()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let storage = LocalDirStorage::open(dir.path())?;
        let cluster = ClusterName::new("c")?;
        let watermark: u64 = 1_795_328_094_627;
        // Seconds relative to the watermark, in a shuffled order, and whether a minute's
        // margin keeps the object in the backlog.
        let objects: [(i64, bool); 6] = [
            (5, true),
            (-3600, false),
            (-61, false),
            (0, true),
            (-59, true),
            (-1, true),
        ];
        let mut keys = Vec::new();
        let mut kept = Vec::new();
        for (n, (offset, in_backlog)) in objects.iter().enumerate() {
            let at = watermark.checked_add_signed(offset * 1000).ok_or("time")?;
            let key = raw_object_key(&cluster, Ulid::from_parts(at, n as u128))?;
            storage
                .put(&key, Bytes::from_static(b"x"), PutMode::Create)
                .await?;
            if *in_backlog {
                kept.push((at, key.clone()));
            }
            keys.push((at, key));
        }

        // No watermark yet: everything, oldest first.
        let mut all = keys.clone();
        all.sort();
        let all: Vec<ObjectKey> = all.into_iter().map(|(_, key)| key).collect();
        assert_eq!(uncompacted(&storage).await?, all);

        save(&storage, watermark).await?;
        assert_eq!(load(&storage).await?, Some(watermark));
        kept.sort();
        let expected: Vec<ObjectKey> = kept.into_iter().map(|(_, key)| key).collect();
        assert_eq!(uncompacted(&storage).await?, expected);

        // An unreadable record means "compact everything", never "compact nothing".
        storage
            .put(
                &watermark_key(),
                Bytes::from_static(b"{"),
                PutMode::Overwrite,
            )
            .await?;
        assert_eq!(uncompacted(&storage).await?, all);
        Ok(())
    }
}
