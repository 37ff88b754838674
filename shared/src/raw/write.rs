//! Writing a raw object: a batch of events as gzip-compressed NDJSON ([`encode_ndjson_gz`]),
//! stored under a fresh key that no other object can take ([`store`]).

use std::io::Write;

use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::value::RawValue;
use ulid::Ulid;

use super::key::raw_object_key;
use crate::keys::ClusterName;
use crate::storage::{InvalidKey, ObjectKey, PutMode, Storage, StorageError};

/// Why a raw object was not stored.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The object key could not be formed (a bug, never the caller's fault).
    #[error(transparent)]
    Key(#[from] InvalidKey),
    /// Compression failed (out of memory; never the caller's fault).
    #[error("could not compress the batch: {0}")]
    Encode(#[source] std::io::Error),
    /// Storage refused or failed the write; it should be retried.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A raw object stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// Its key.
    pub key: ObjectKey,
    /// Compressed bytes written.
    pub bytes: usize,
}

/// Stores `events` (a body of `size_hint` bytes) as one new raw object of `cluster`, returning
/// only once it is durable.
pub async fn store(
    storage: &dyn Storage,
    cluster: &ClusterName,
    events: &[&RawValue],
    size_hint: usize,
) -> Result<Stored, WriteError> {
    let object = encode_ndjson_gz(events, size_hint).map_err(WriteError::Encode)?;
    let bytes = object.len();
    let key = raw_object_key(cluster, Ulid::new())?;
    // A fresh ULID never collides; `Create` makes sure a clash could never overwrite data.
    storage
        .put(&key, Bytes::from(object), PutMode::Create)
        .await?;
    Ok(Stored { key, bytes })
}

/// Encodes events as gzip-compressed NDJSON: one event per line, each exactly as received.
///
/// A raw newline can only be insignificant whitespace in valid JSON (inside strings it must be
/// escaped), so replacing one with a space keeps every event byte-for-byte equivalent while
/// keeping one event per line.
pub fn encode_ndjson_gz(events: &[&RawValue], size_hint: usize) -> std::io::Result<Vec<u8>> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(size_hint / 6), Compression::fast());
    let mut line = Vec::new();
    for event in events {
        let text = event.get().as_bytes();
        if text.contains(&b'\n') || text.contains(&b'\r') {
            line.clear();
            line.extend(text.iter().map(|&byte| match byte {
                b'\n' | b'\r' => b' ',
                other => other,
            }));
            encoder.write_all(&line)?;
        } else {
            encoder.write_all(text)?;
        }
        encoder.write_all(b"\n")?;
    }
    encoder.finish()
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::event::split_batch;

    fn gunzip(bytes: &[u8]) -> std::io::Result<String> {
        let mut text = String::new();
        flate2::read::GzDecoder::new(bytes).read_to_string(&mut text)?;
        Ok(text)
    }

    #[test]
    fn ndjson_keeps_each_event_verbatim_on_its_own_line() -> Result<(), Box<dyn std::error::Error>>
    {
        let body = br#"[{"a": "x\ny", "b": 1},
            {"c":
              [2]}]"#;
        let events = split_batch(body)?;
        let text = gunzip(&encode_ndjson_gz(&events, body.len())?)?;
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0], r#"{"a": "x\ny", "b": 1}"#);
        let second: serde_json::Value = serde_json::from_str(lines[1])?;
        assert_eq!(second, serde_json::json!({"c": [2]}));
        assert!(text.ends_with('\n'));
        Ok(())
    }
}
