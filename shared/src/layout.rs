//! Where things live in storage: the key layout of DESIGN §2–3, in one place.
//!
//! `raw/{cluster}/{yyyy}/{mm}/{dd}/{hh}/{ulid}.ndjson.gz` holds each accepted ingest request.

use chrono::{DateTime, Datelike, Timelike, Utc};
use ulid::Ulid;

use crate::storage::{InvalidKey, ObjectKey};

/// Top-level prefix of raw ingest objects.
pub const RAW_PREFIX: &str = "raw/";

/// Suffix of raw ingest objects (the S3 notification filter uses it too).
pub const RAW_SUFFIX: &str = ".ndjson.gz";

/// The name of a Ray cluster, taken from the export URL (`/v1/events/{cluster}`).
///
/// Ray's events carry a session but no cluster id, so the URL names the cluster. It becomes a
/// key segment, hence the strict alphabet: 1–64 of `A–Z a–z 0–9 - _ .`, not starting with `.`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterName(String);

/// A cluster name that breaks the rules.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid cluster name {0:?}: use 1-64 characters from A-Z a-z 0-9 - _ . (not starting with '.')"
)]
pub struct InvalidClusterName(String);

impl ClusterName {
    /// Checks a cluster name.
    pub fn new(name: &str) -> Result<Self, InvalidClusterName> {
        let valid = (1..=64).contains(&name.len())
            && !name.starts_with('.')
            && name
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || b"-_.".contains(&byte));
        if valid {
            Ok(Self(name.to_owned()))
        } else {
            Err(InvalidClusterName(name.to_owned()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ClusterName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

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

    #[test]
    fn raw_keys_follow_the_hour_layout() -> Result<(), Box<dyn std::error::Error>> {
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
    fn cluster_names_are_single_safe_segments() {
        for bad in ["", ".hidden", "a/b", "..", "spa ce", "ü", &"x".repeat(65)] {
            assert!(ClusterName::new(bad).is_err(), "{bad:?}");
        }
        assert!(ClusterName::new(&"x".repeat(64)).is_ok());
    }
}
