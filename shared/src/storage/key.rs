//! Validated object keys: the same rules for both backends, so that a key that works locally
//! also works on S3 and can never escape the local data directory.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A relative, `/`-separated object key.
///
/// Invariants: non-empty, at most 1024 bytes, no leading or trailing `/`, no empty, `.` or `..`
/// segment, and only the characters `A–Z a–z 0–9 - _ . = /`.
///
/// Stored in manifests as its text; a manifest naming a key that breaks the rules does not
/// parse, so no reader ever builds a path from one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ObjectKey(String);

/// A string that breaks an [`ObjectKey`] rule.
#[derive(Debug, thiserror::Error)]
#[error("invalid object key {key:?}: {reason}")]
pub struct InvalidKey {
    key: String,
    reason: &'static str,
}

impl ObjectKey {
    /// Checks `key` against the rules.
    pub fn new(key: impl Into<String>) -> Result<Self, InvalidKey> {
        let key = key.into();
        let reason = if key.is_empty() {
            Some("empty")
        } else if key.len() > 1024 {
            Some("longer than 1024 bytes")
        } else if !key
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"-_.=/".contains(&byte))
        {
            Some("only A-Z a-z 0-9 - _ . = / are allowed")
        } else if key
            .split('/')
            .any(|segment| segment.is_empty() || segment == "." || segment == "..")
        {
            Some("empty, '.' or '..' path segment")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(InvalidKey { key, reason }),
            None => Ok(Self(key)),
        }
    }

    /// The key text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ObjectKey {
    type Error = InvalidKey;

    fn try_from(key: String) -> Result<Self, InvalidKey> {
        Self::new(key)
    }
}

impl From<ObjectKey> for String {
    fn from(key: ObjectKey) -> Self {
        key.0
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_storage_keys() {
        for key in [
            "raw/prod/2026/11/22/06/01J0000000000000000000000.ndjson.gz",
            "tables/task_attempts/cluster=prod/session=session_2026-11-22_06-14-46_050039_15318/x.parquet",
            "a",
        ] {
            assert!(ObjectKey::new(key).is_ok(), "{key}");
        }
    }

    #[test]
    fn refuses_keys_that_could_escape_or_differ_between_backends() {
        for key in [
            "",
            "/abs",
            "trailing/",
            "a//b",
            "../up",
            "a/./b",
            "a/../b",
            "sp ace",
            "new\nline",
            "q?x",
            "ü",
        ] {
            assert!(ObjectKey::new(key).is_err(), "{key:?}");
        }
        assert!(ObjectKey::new("k".repeat(1025)).is_err());
    }

    #[test]
    fn a_stored_key_that_breaks_the_rules_does_not_parse() -> Result<(), serde_json::Error> {
        let key: ObjectKey = serde_json::from_str("\"tables/x.parquet\"")?;
        assert_eq!(serde_json::to_string(&key)?, "\"tables/x.parquet\"");
        assert!(serde_json::from_str::<ObjectKey>("\"tables/../../etc/passwd\"").is_err());
        Ok(())
    }
}
