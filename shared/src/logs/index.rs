//! A node's log index (docs/architecture.md, "Logs"): for each of the node's files, the byte
//! ranges stored (extents) and where each one's bytes are, one gzip member inside a segment or
//! [`Inline`] in the index itself.
//! Reads find their bytes here and fetch exactly those members with ranged reads: nothing on
//! the read path lists. Ingest replaces the index conditionally on the version it read, as
//! compaction does the tables' manifests.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use bytes::Bytes;
use futures_util::{StreamExt as _, TryStreamExt as _, stream};
use serde::{Deserialize, Serialize};
use ulid::Ulid;

use super::inline::Inline;
use super::store::LogError;
use crate::gzip::gunzip_within;
use crate::keys::NodeLogs;
use crate::storage::{ETag, ObjectKey, PutMode, Storage, StorageError};

/// Most bytes of one extent: a read fetches at most this much more than it returns.
pub const EXTENT_BYTES: u64 = 1024 * 1024;

/// Largest index read: a node's index holds a few extents per file.
const MAX_INDEX_BYTES: u64 = 64 * 1024 * 1024;

/// Bytes `start..end` of a file, stored as the gzip member at `at..at + size` of a segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ExtentRow", into = "ExtentRow")]
pub struct Extent {
    /// The file offset of the first byte.
    pub start: u64,
    /// The file offset just past the last byte.
    pub end: u64,
    /// The segment holding them.
    pub segment: Ulid,
    /// Where their member starts in the segment.
    pub at: u64,
    /// The member's compressed size.
    pub size: u64,
    /// How many merges made it: extents of one level are merged into one of the next
    /// ([`super::store`]), so each byte is rewritten only a few times.
    pub level: u8,
}

impl Extent {
    /// How many bytes of the file it holds.
    pub fn file_bytes(&self) -> u64 {
        self.end - self.start
    }
}

/// An extent as the index writes it: a short array rather than an object, since a node's index
/// holds many.
type ExtentRow = (u64, u64, String, u64, u64, u8);

impl TryFrom<ExtentRow> for Extent {
    type Error = String;

    fn try_from((start, end, segment, at, size, level): ExtentRow) -> Result<Self, String> {
        if end < start || end - start > EXTENT_BYTES {
            return Err(format!(
                "extent {start}..{end} is not 0 to {EXTENT_BYTES} bytes long"
            ));
        }
        let segment =
            Ulid::from_string(&segment).map_err(|err| format!("segment id {segment:?}: {err}"))?;
        Ok(Self {
            start,
            end,
            segment,
            at,
            size,
            level,
        })
    }
}

impl From<Extent> for ExtentRow {
    fn from(extent: Extent) -> Self {
        (
            extent.start,
            extent.end,
            extent.segment.to_string(),
            extent.at,
            extent.size,
            extent.level,
        )
    }
}

/// What is stored of each of a node's files, by name: extents sorted by offset, not
/// overlapping (gaps are bytes never stored).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogIndex {
    /// Extents of each file.
    #[serde(default)]
    pub files: BTreeMap<String, Vec<Extent>>,
    /// Files found rewritten under the same name, with the offset where the bytes sent first
    /// differed from the stored ones: nothing of the file from there on is stored, so a file
    /// never goes on with the bytes of the file that replaced it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rewritten: BTreeMap<String, u64>,
    /// The node's newest small members, carried here rather than in a segment ([`Inline`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<Inline>,
}

/// An index as read, with the version a replacement must find.
#[derive(Clone, Debug, Default)]
pub struct LoadedIndex {
    /// The index (empty when none is stored).
    pub index: LogIndex,
    /// Its version; `None` when none is stored.
    pub version: Option<ETag>,
}

/// Reads `node`'s index; an empty one when the node never shipped.
pub async fn load(storage: &dyn Storage, node: &NodeLogs) -> Result<LoadedIndex, LogError> {
    let key = node.index_key()?;
    let object = match storage.get_within(&key, MAX_INDEX_BYTES).await {
        Ok(object) => object,
        Err(StorageError::NotFound { .. }) => return Ok(LoadedIndex::default()),
        // Refused by its size, before it was read.
        Err(StorageError::TooLarge { bytes, .. }) => {
            return Err(LogError::BadIndex {
                key,
                reason: format!("{bytes} bytes, over {MAX_INDEX_BYTES}"),
            });
        }
        Err(err) => return Err(err.into()),
    };
    let index = serde_json::from_slice(&object.body).map_err(|err| LogError::BadIndex {
        key,
        reason: err.to_string(),
    })?;
    Ok(LoadedIndex {
        index,
        version: Some(object.etag),
    })
}

/// Replaces `node`'s index with `index` if it is still at `version`; `false` when another
/// request replaced it first.
pub async fn commit(
    storage: &dyn Storage,
    node: &NodeLogs,
    index: &LogIndex,
    version: Option<&ETag>,
) -> Result<bool, LogError> {
    let key = node.index_key()?;
    let body = serde_json::to_vec(index).map_err(|err| LogError::Encode(err.into()))?;
    let mode = version.map_or(PutMode::Create, |version| PutMode::Update(version.clone()));
    match storage.put(&key, body.into(), mode).await {
        Ok(_) => Ok(true),
        Err(StorageError::Precondition { .. }) => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// Segments read at once.
pub const PARALLEL_READS: usize = 8;

/// The bytes of each of `extents`, in their order: one ranged read per segment, spanning the
/// members wanted from it (a request's segment holds every file's extents of that request, so
/// one read serves them all), at most [`PARALLEL_READS`] at a time, and none for the `inline`
/// members. A segment that is gone (an S3 age rule removed it) is an error.
pub async fn extents_bytes(
    storage: &dyn Storage,
    node: &NodeLogs,
    inline: Option<&Inline>,
    extents: &[&Extent],
) -> Result<Vec<Vec<u8>>, LogError> {
    extents_bytes_found(storage, node, inline, extents)
        .await?
        .into_iter()
        .zip(extents)
        .map(|(bytes, extent)| {
            bytes.ok_or_else(|| {
                let key = node.segment_key(extent.segment);
                match key {
                    Ok(key) => unreadable(&key, "the segment is gone (expired by age?)"),
                    Err(err) => err.into(),
                }
            })
        })
        .collect()
}

/// [`extents_bytes`], with `None` for an extent whose segment is gone. The `inline` members
/// are read from the index in hand, with no request.
pub async fn extents_bytes_found(
    storage: &dyn Storage,
    node: &NodeLogs,
    inline: Option<&Inline>,
    extents: &[&Extent],
) -> Result<Vec<Option<Vec<u8>>>, LogError> {
    let is_inline = |extent: &Extent| inline.is_some_and(|inline| inline.id == extent.segment);
    let mut spans: BTreeMap<Ulid, Range<u64>> = BTreeMap::new();
    for extent in extents.iter().filter(|extent| !is_inline(extent)) {
        let member = extent.at..extent.at.saturating_add(extent.size);
        spans
            .entry(extent.segment)
            .and_modify(|span| {
                span.start = span.start.min(member.start);
                span.end = span.end.max(member.end);
            })
            .or_insert(member);
    }
    let read: HashMap<Ulid, Option<(u64, Bytes)>> = stream::iter(spans)
        .map(|(segment, span)| async move {
            let key = node.segment_key(segment)?;
            match storage.get_range(&key, span.clone()).await {
                Ok(bytes) => Ok::<_, LogError>((segment, Some((span.start, bytes)))),
                Err(StorageError::NotFound { .. }) => Ok((segment, None)),
                Err(err) => Err(err.into()),
            }
        })
        .buffered(PARALLEL_READS)
        .try_collect()
        .await?;
    extents
        .iter()
        .map(|extent| {
            let key = node.segment_key(extent.segment)?;
            let (start, bytes): (u64, &[u8]) = match inline {
                Some(inline) if is_inline(extent) => (0, &inline.members),
                _ => match read.get(&extent.segment) {
                    Some(Some((start, bytes))) => (*start, bytes),
                    _ => return Ok(None),
                },
            };
            let from = usize::try_from(extent.at - start).unwrap_or(usize::MAX);
            let to =
                usize::try_from(extent.size).map_or(usize::MAX, |size| from.saturating_add(size));
            let member = bytes
                .get(from..to)
                .ok_or_else(|| unreadable(&key, "the segment is shorter than its index says"))?;
            decode(&key, member, extent.file_bytes()).map(Some)
        })
        .collect()
}

/// The bytes of one extent.
pub async fn extent_bytes(
    storage: &dyn Storage,
    node: &NodeLogs,
    inline: Option<&Inline>,
    extent: &Extent,
) -> Result<Vec<u8>, LogError> {
    let mut bytes = extents_bytes(storage, node, inline, &[extent]).await?;
    Ok(bytes.pop().unwrap_or_default())
}

/// A member's `len` bytes, decompressed no further than one byte past them.
fn decode(key: &ObjectKey, member: &[u8], len: u64) -> Result<Vec<u8>, LogError> {
    let bytes = gunzip_within(member, len)
        .map_err(|err| unreadable(key, &format!("{err}, the index says {len}")))?;
    if bytes.len() as u64 != len {
        return Err(unreadable(
            key,
            &format!(
                "the member holds {} bytes, the index says {len}",
                bytes.len()
            ),
        ));
    }
    Ok(bytes)
}

fn unreadable(key: &ObjectKey, reason: &str) -> LogError {
    LogError::Unreadable {
        key: key.clone(),
        source: std::io::Error::other(reason.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_reads_back_as_written_and_refuses_nonsense() -> Result<(), serde_json::Error> {
        let mut index = LogIndex::default();
        index.files.insert(
            "raylet.out".into(),
            vec![Extent {
                start: 0,
                end: 10,
                segment: Ulid::nil(),
                at: 0,
                size: 30,
                level: 1,
            }],
        );
        let text = serde_json::to_string(&index)?;
        assert_eq!(
            text,
            r#"{"files":{"raylet.out":[[0,10,"00000000000000000000000000",0,30,1]]}}"#
        );
        assert_eq!(serde_json::from_str::<LogIndex>(&text)?, index);
        for bad in [
            r#"{"files":{"a":[[10,0,"00000000000000000000000000",0,30,0]]}}"#,
            r#"{"files":{"a":[[0,10,"not a ulid",0,30,0]]}}"#,
            r#"{"files":{"a":[[0,18446744073709551615,"00000000000000000000000000",0,30,0]]}}"#,
        ] {
            assert!(serde_json::from_str::<LogIndex>(bad).is_err(), "{bad}");
        }
        Ok(())
    }
}
