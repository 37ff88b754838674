//! What `serve` had stored but not compacted when it last stopped.
//!
//! On AWS, SQS holds every notification until the compact function succeeds (or dead-letters
//! it). `serve` queues in memory, so a crash, a kill, or a stop while runs were failing (their
//! keys parked) would leave raw objects that are safe in storage (Ray got its 200) but missing
//! from every table. The queue therefore records, after each successful run, exactly which raw
//! objects it compacted (a small object under [`COMPACTED_RECORDS_PREFIX`]), and `serve`
//! compacts at start every raw object that no record names.
//!
//! The rule compares names, never times: a raw object whose ULID came from a clock that was
//! stepped back, or whose write stalled while newer ones landed, is found all the same (a
//! ULID-time watermark would skip such objects for good).

use std::collections::HashSet;

use bytes::Bytes;
use ulid::Ulid;

use crate::keys::{COMPACTED_RECORDS_PREFIX, compacted_record_key};
use crate::raw::key::{RAW_PREFIX, raw_object_time_ms};
use crate::storage::{ObjectKey, PutMode, Storage, StorageError};

/// A new record's key.
fn record_key() -> Result<ObjectKey, StorageError> {
    compacted_record_key(Ulid::new())
        .map_err(|err| StorageError::backend(COMPACTED_RECORDS_PREFIX, err))
}

/// Records that `keys` are compacted: one new object naming them, a key per line.
pub async fn record(storage: &dyn Storage, keys: &[ObjectKey]) -> Result<(), StorageError> {
    if keys.is_empty() {
        return Ok(());
    }
    let mut body = String::new();
    for key in keys {
        body.push_str(key.as_str());
        body.push('\n');
    }
    storage
        .put(&record_key()?, Bytes::from(body), PutMode::Create)
        .await?;
    Ok(())
}

/// Every raw key some record names, and the records read.
async fn recorded(
    storage: &dyn Storage,
) -> Result<(HashSet<String>, Vec<ObjectKey>), StorageError> {
    let mut done = HashSet::new();
    let mut records = Vec::new();
    for meta in storage.list(COMPACTED_RECORDS_PREFIX).await? {
        let object = match storage.get(&meta.key).await {
            Ok(object) => object,
            // Consolidated away by a concurrent start: its keys are in the new record.
            Err(StorageError::NotFound { .. }) => continue,
            Err(err) => return Err(err),
        };
        match std::str::from_utf8(&object.body) {
            Ok(text) => done.extend(text.lines().map(str::to_owned)),
            // Unreadable: its keys count as not compacted (more work, never a lost object).
            Err(err) => {
                tracing::warn!(key = %meta.key, error = %err, "unreadable compaction record")
            }
        }
        records.push(meta.key);
    }
    Ok((done, records))
}

/// Raw objects no record names, oldest first (by ULID time, then key).
#[tracing::instrument(name = "backlog", skip(storage))]
pub async fn uncompacted(storage: &dyn Storage) -> Result<Vec<ObjectKey>, StorageError> {
    let (done, _) = recorded(storage).await?;
    let mut keys: Vec<(u64, ObjectKey)> = storage
        .list(RAW_PREFIX)
        .await?
        .into_iter()
        .filter(|meta| !done.contains(meta.key.as_str()))
        .map(|meta| (raw_object_time_ms(&meta.key).unwrap_or(0), meta.key))
        .collect();
    keys.sort();
    Ok(keys.into_iter().map(|(_, key)| key).collect())
}

/// Replaces the records with one that names the raw objects still stored, so that starts stay
/// cheap however many runs came before. The new record is written before the old ones are
/// deleted: a crash in between leaves both, which only repeats names.
pub async fn consolidate(storage: &dyn Storage) -> Result<(), StorageError> {
    let (done, records) = recorded(storage).await?;
    if records.len() <= 1 {
        return Ok(());
    }
    let stored: Vec<ObjectKey> = storage
        .list(RAW_PREFIX)
        .await?
        .into_iter()
        .map(|meta| meta.key)
        .filter(|key| done.contains(key.as_str()))
        .collect();
    record(storage, &stored).await?;
    for key in records {
        storage.delete(&key).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::ClusterName;
    use crate::raw::key::raw_object_key;
    use crate::storage::LocalDirStorage;

    #[tokio::test]
    async fn the_backlog_is_every_raw_object_no_record_names()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let storage = LocalDirStorage::open(dir.path())?;
        let cluster = ClusterName::new("c")?;
        let now: u64 = 1_795_328_094_627;
        // Seconds relative to now, in a shuffled order (a clock stepped back an hour, a write
        // that stalled), and whether a run compacted the object.
        let objects: [(i64, bool); 6] = [
            (5, true),
            (-3600, false),
            (-61, true),
            (0, false),
            (-59, true),
            (-1, true),
        ];
        let mut all = Vec::new();
        let mut compacted = Vec::new();
        let mut left = Vec::new();
        for (n, (offset, done)) in objects.iter().enumerate() {
            let at = now.checked_add_signed(offset * 1000).ok_or("time")?;
            let key = raw_object_key(&cluster, Ulid::from_parts(at, n as u128))?;
            storage
                .put(&key, Bytes::from_static(b"x"), PutMode::Create)
                .await?;
            all.push((at, key.clone()));
            if *done {
                compacted.push(key);
            } else {
                left.push((at, key));
            }
        }
        all.sort();
        left.sort();
        let all: Vec<ObjectKey> = all.into_iter().map(|(_, key)| key).collect();
        let left: Vec<ObjectKey> = left.into_iter().map(|(_, key)| key).collect();

        // No record yet: everything, oldest first.
        assert_eq!(uncompacted(&storage).await?, all);

        // Two runs' records; the hour-old object and the one at `now` were never compacted.
        let (first, second) = compacted.split_at(2);
        record(&storage, first).await?;
        record(&storage, second).await?;
        assert_eq!(uncompacted(&storage).await?, left);

        // Consolidated into one record: the same answer.
        consolidate(&storage).await?;
        assert_eq!(storage.list(COMPACTED_RECORDS_PREFIX).await?.len(), 1);
        assert_eq!(uncompacted(&storage).await?, left);

        // An unreadable record means "compact again", never "skip".
        for meta in storage.list(COMPACTED_RECORDS_PREFIX).await? {
            storage
                .put(
                    &meta.key,
                    Bytes::from_static(b"\xff\xfe"),
                    PutMode::Overwrite,
                )
                .await?;
        }
        assert_eq!(uncompacted(&storage).await?, all);
        Ok(())
    }
}
