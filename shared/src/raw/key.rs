//! The raw object's key: `raw/{cluster}/{yyyy}/{mm}/{dd}/{hh}/{ulid}.ndjson.gz`, named by the
//! ULID ingest gave it, filed under the hour of that ULID's time. The key alone tells the
//! object's cluster and when it was accepted.

use chrono::{DateTime, Datelike, Timelike, Utc};
use ulid::Ulid;

use crate::keys::ClusterName;
use crate::storage::{InvalidKey, ObjectKey};

/// Top-level prefix of raw ingest objects.
pub const RAW_PREFIX: &str = "raw/";

/// Suffix of raw ingest objects (the S3 notification filter uses it too).
pub const RAW_SUFFIX: &str = ".ndjson.gz";

/// The key of a new raw object for `cluster`, named by `id`. The hour directories come from the
/// ULID's own timestamp, so a key's place and name always agree.
pub fn raw_object_key(cluster: &ClusterName, id: Ulid) -> Result<ObjectKey, InvalidKey> {
    let millis = i64::try_from(id.timestamp_ms()).unwrap_or(i64::MAX);
    let at = DateTime::<Utc>::from_timestamp_millis(millis).unwrap_or_default();
    let key = format!(
        "{RAW_PREFIX}{cluster}/{:04}/{:02}/{:02}/{:02}/{id}{RAW_SUFFIX}",
        at.year(),
        at.month(),
        at.day(),
        at.hour()
    );
    ObjectKey::new(key)
}

/// The prefix of every raw object of `cluster`.
pub fn raw_cluster_prefix(cluster: &ClusterName) -> String {
    format!("{RAW_PREFIX}{cluster}/")
}

/// True for a raw object's key (what the S3 notification filter lets through).
pub fn is_raw_object_key(key: &str) -> bool {
    key.starts_with(RAW_PREFIX) && key.ends_with(RAW_SUFFIX)
}

/// The cluster a raw object's key names; `None` for keys that are not raw objects.
pub fn raw_object_cluster(key: &ObjectKey) -> Option<ClusterName> {
    let (cluster, _) = key.as_str().strip_prefix(RAW_PREFIX)?.split_once('/')?;
    ClusterName::new(cluster).ok()
}

/// The ULID time (ms since the epoch) in a raw object's name: when ingest accepted it.
/// `None` for keys that are not raw objects.
pub fn raw_object_time_ms(key: &ObjectKey) -> Option<u64> {
    let name = key.as_str().strip_prefix(RAW_PREFIX)?.rsplit('/').next()?;
    let id = Ulid::from_string(name.strip_suffix(RAW_SUFFIX)?).ok()?;
    Some(id.timestamp_ms())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{SessionName, Table, TableFile, table_file_key};

    #[test]
    fn raw_keys_are_filed_by_the_hour_they_were_accepted() -> Result<(), Box<dyn std::error::Error>>
    {
        let cluster = ClusterName::new("prod-east_1.a")?;
        // 2026-11-22T06:14:54.627Z
        let id = Ulid::from_parts(1_795_328_094_627, 42);
        assert_eq!(
            raw_object_key(&cluster, id)?.as_str(),
            format!("raw/prod-east_1.a/2026/11/22/06/{id}.ndjson.gz")
        );
        Ok(())
    }

    #[test]
    fn a_raw_key_tells_when_it_was_accepted() -> Result<(), Box<dyn std::error::Error>> {
        let id = Ulid::from_parts(1_795_328_094_627, 7);
        let key = raw_object_key(&ClusterName::new("c")?, id)?;
        assert_eq!(raw_object_time_ms(&key), Some(1_795_328_094_627));
        for other in [
            "tables/x/y.parquet",
            "raw/c/2026/11/22/06/not-a-ulid.ndjson.gz",
        ] {
            assert_eq!(raw_object_time_ms(&ObjectKey::new(other)?), None, "{other}");
        }
        Ok(())
    }

    #[test]
    fn a_raw_key_names_its_cluster_and_is_told_from_a_table_key()
    -> Result<(), Box<dyn std::error::Error>> {
        let cluster = ClusterName::new("prod-1")?;
        let session = SessionName::new("session_2026-11-22_06-11-29_227665_10899")?;
        let id = Ulid::from_parts(1_795_328_094_627, 1);
        let delta = table_file_key(
            Table::TaskAttempts,
            &cluster,
            &session,
            TableFile::Delta,
            id,
        )?;
        let raw = raw_object_key(&cluster, id)?;
        assert!(is_raw_object_key(raw.as_str()));
        assert_eq!(raw_object_cluster(&raw), Some(cluster));
        assert!(!is_raw_object_key(delta.as_str()));
        Ok(())
    }
}
