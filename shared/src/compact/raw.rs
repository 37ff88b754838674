//! Reading raw ingest objects back: gzip NDJSON, one Ray event per line. A line that cannot be
//! read is set aside with its reason (quarantined); it never costs the rest of the object.

use std::io::Read as _;

use flate2::read::GzDecoder;

use crate::event::RayEvent;
use crate::layout::{ClusterName, raw_object_cluster};
use crate::storage::{ObjectKey, Storage, StorageError};

/// One raw object, read.
#[derive(Debug)]
pub struct RawObject {
    /// Where it came from.
    pub key: ObjectKey,
    /// The cluster named in its key.
    pub cluster: ClusterName,
    /// The events that parsed.
    pub events: Vec<RayEvent>,
    /// The lines that did not.
    pub quarantined: Vec<QuarantinedLine>,
}

/// A line compaction could not use, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct QuarantinedLine {
    /// The raw object it is in.
    pub source: String,
    /// 1-based line number.
    pub line: usize,
    /// Why it was set aside.
    pub reason: String,
    /// The line itself (cut to 64 KiB).
    pub text: String,
}

/// Why a raw object could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum RawError {
    /// The key is not `raw/{cluster}/…`.
    #[error("{0} is not a raw ingest object key")]
    NotRaw(ObjectKey),
    /// Storage failed or the object is gone.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Not gzip, or not UTF-8 text.
    #[error("raw object {key} is not gzip-compressed UTF-8 text: {source}")]
    Corrupt {
        /// The object.
        key: ObjectKey,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

const MAX_QUARANTINED_TEXT: usize = 64 * 1024;

/// Reads and parses one raw object (the parse runs on a blocking thread: it is CPU work).
#[tracing::instrument(name = "read_raw", skip(storage), fields(key = %key))]
pub async fn read_raw(storage: &dyn Storage, key: &ObjectKey) -> Result<RawObject, RawError> {
    let cluster = raw_object_cluster(key).ok_or_else(|| RawError::NotRaw(key.clone()))?;
    let stored = storage.get(key).await?;
    let key = key.clone();
    let parse_key = key.clone();
    tokio::task::spawn_blocking(move || parse_raw(parse_key, cluster, &stored.body))
        .await
        .map_err(|err| RawError::Corrupt {
            key,
            source: std::io::Error::other(err.to_string()),
        })?
}

/// Parses the bytes of one raw object.
fn parse_raw(key: ObjectKey, cluster: ClusterName, body: &[u8]) -> Result<RawObject, RawError> {
    let mut text = String::new();
    GzDecoder::new(body)
        .read_to_string(&mut text)
        .map_err(|source| RawError::Corrupt {
            key: key.clone(),
            source,
        })?;
    let mut events = Vec::new();
    let mut quarantined = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match RayEvent::from_json(line) {
            Ok(event) => events.push(event),
            Err(err) => {
                let mut cut = line.len().min(MAX_QUARANTINED_TEXT);
                while !line.is_char_boundary(cut) {
                    cut -= 1;
                }
                quarantined.push(QuarantinedLine {
                    source: key.to_string(),
                    line: index + 1,
                    reason: err.to_string(),
                    text: line.get(..cut).unwrap_or_default().to_owned(),
                });
            }
        }
    }
    Ok(RawObject {
        key,
        cluster,
        events,
        quarantined,
    })
}
