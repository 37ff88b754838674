//! Shipped log chunks in storage (docs/architecture.md, "Logs"): storing one so that a re-send is
//! idempotent and a rewritten file is refused, and reading any byte range of a file back.
//!
//! A chunk is an immutable object holding the bytes of a file from the offset its key names
//! ([`LogFile::chunk_key`]). The shipper resumes only at offsets the ingest acknowledged, so a
//! re-send (a lost response, a restart) starts where a stored chunk starts, and at worst carries
//! more bytes than that chunk: [`put_chunk`] checks the stored bytes it meets and stores only
//! what lies past them. Chunks therefore tile each file from offset 0 without overlapping.

use std::io::Read as _;

use bytes::Bytes;
use flate2::read::GzDecoder;

use crate::keys::{ClusterName, LogFile, LogFileName, NodeId, SessionName, node_logs_prefix};
use crate::storage::{InvalidKey, ObjectKey, PutMode, Storage, StorageError};

pub use ship_logs::ship::MAX_CHUNK_BYTES;

/// Why a chunk was not stored, or a range not read.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The body is larger than [`MAX_CHUNK_BYTES`].
    #[error("log chunk of {bytes} bytes exceeds the limit of {limit} bytes; send smaller pieces")]
    TooLarge {
        /// Body size (or a lower bound of it, when reading stopped at the limit).
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// `offset` plus the length passes the largest offset.
    #[error("offset {offset} plus {len} bytes is past the largest file offset")]
    OffsetOverflow {
        /// The offset given.
        offset: u64,
        /// The chunk's length.
        len: usize,
    },
    /// Stored bytes at the same offsets differ: the file was rewritten under the same name.
    #[error(
        "bytes {start}..{end} of {file} differ from the ones already stored: the file was \
         rewritten under the same name; the stored history keeps the first version"
    )]
    Conflict {
        /// The file (its storage prefix).
        file: String,
        /// First differing range's start.
        start: u64,
        /// Its end.
        end: u64,
    },
    /// A stored chunk is not a gzip stream (written by something else, or damaged).
    #[error("the stored log chunk {key} cannot be read: {source}")]
    Unreadable {
        /// The chunk.
        key: ObjectKey,
        /// What decoding said.
        #[source]
        source: std::io::Error,
    },
    /// Compression failed (out of memory; never the caller's fault).
    #[error("could not compress the chunk: {0}")]
    Encode(#[source] std::io::Error),
    /// The key could not be formed (a bug, never the caller's fault).
    #[error(transparent)]
    Key(#[from] InvalidKey),
    /// Storage failed; the request should be retried.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// What one accepted chunk changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkReceipt {
    /// Bytes newly stored (0 for a complete re-send).
    pub stored: usize,
    /// The offset just past the chunk: where the shipper continues.
    pub end: u64,
}

/// Stores `bytes` as the content of `file` from `offset`, returning once it is durable.
///
/// Bytes already stored from the same offsets must be equal (then they are not stored again);
/// different ones are a [`LogError::Conflict`] and nothing of the chunk is stored past them.
#[tracing::instrument(name = "log_chunk", skip_all, fields(file = %file.prefix(), offset = offset, len = bytes.len()))]
pub async fn put_chunk(
    storage: &dyn Storage,
    file: &LogFile,
    offset: u64,
    bytes: &[u8],
) -> Result<ChunkReceipt, LogError> {
    if bytes.len() > MAX_CHUNK_BYTES {
        return Err(LogError::TooLarge {
            bytes: bytes.len(),
            limit: MAX_CHUNK_BYTES,
        });
    }
    let overflow = LogError::OffsetOverflow {
        offset,
        len: bytes.len(),
    };
    let end = u64::try_from(bytes.len())
        .ok()
        .and_then(|len| offset.checked_add(len))
        .ok_or(overflow)?;
    let (mut start, mut rest) = (offset, bytes);
    let mut stored = 0;
    while !rest.is_empty() {
        let key = file.chunk_key(start)?;
        let body = Bytes::from(gzip(rest)?);
        match storage.put(&key, body, PutMode::Create).await {
            Ok(_) => {
                stored = rest.len();
                break;
            }
            // Stored before (by this re-send's first attempt, or an earlier one): it must
            // agree; what it does not cover continues at its end.
            Err(StorageError::Precondition { .. }) => {
                let existing = read_chunk(storage, &key).await?;
                let common = existing.len().min(rest.len());
                let (same, after) = rest.split_at(common);
                if existing.get(..common) != Some(same) || existing.is_empty() {
                    let differs = first_difference(&existing, same);
                    return Err(LogError::Conflict {
                        file: file.prefix(),
                        start: start + differs,
                        end: start + common as u64,
                    });
                }
                start += common as u64;
                rest = after;
            }
            Err(other) => return Err(other.into()),
        }
    }
    if stored > 0 {
        tracing::info!(stored, end, "stored log chunk");
    }
    Ok(ChunkReceipt { stored, end })
}

/// Bytes `start..end` of a file, as far as they were shipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRange {
    /// The bytes, from `start` on.
    pub bytes: Vec<u8>,
    /// False when some of the range was never stored: the shipper had not sent it (yet), or the
    /// node was lost before it could. `bytes` then ends where the stored bytes stop.
    pub complete: bool,
}

/// Reads bytes `start..end` of `file` (`end: None` for everything from `start`), at most
/// `limit` of them: no piece past the limit is fetched, and a range that reaches the limit
/// before its end is not `complete` (nor is one without an end that reaches it: whether more
/// was stored is not read).
#[tracing::instrument(name = "log_range", skip(storage), fields(file = %file.prefix()))]
pub async fn read_range(
    storage: &dyn Storage,
    file: &LogFile,
    start: u64,
    end: Option<u64>,
    limit: usize,
) -> Result<LogRange, LogError> {
    let cut = start.saturating_add(u64::try_from(limit).unwrap_or(u64::MAX));
    let stop = end.map_or(cut, |end| end.min(cut));
    let chunks = chunk_offsets(storage, file).await?;
    let mut bytes = Vec::new();
    let mut position = start;
    // Whether bytes past a gap were stored: then the range is not all there even without `end`.
    let mut stopped_at_gap = false;
    for (index, (offset, key)) in chunks.iter().enumerate() {
        if position >= stop {
            break;
        }
        // Chunks tile the file: this one ends where the next begins.
        let next = chunks.get(index + 1).map(|(next, _)| *next);
        if next.is_some_and(|next| next <= position) {
            continue;
        }
        if *offset > position {
            stopped_at_gap = true; // bytes never stored
            break;
        }
        let chunk = read_chunk(storage, key).await?;
        let from = usize::try_from(position - offset).unwrap_or(usize::MAX);
        let tail = chunk.get(from..).unwrap_or_default();
        if tail.is_empty() {
            // This chunk ends before `position`, and no later one starts there.
            stopped_at_gap = next.is_some();
            break;
        }
        let wanted =
            usize::try_from(stop - position).map_or(tail.len(), |left| left.min(tail.len()));
        let (taken, _) = tail.split_at(wanted);
        bytes.extend_from_slice(taken);
        position += taken.len() as u64;
    }
    let limited = position >= cut && end.is_none_or(|end| end > cut);
    let complete = !stopped_at_gap && !limited && end.is_none_or(|end| position >= end);
    Ok(LogRange { bytes, complete })
}

/// A file shipped from a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShippedFile {
    /// Its name in the session's `logs/`.
    pub name: LogFileName,
    /// Pieces stored.
    pub chunks: usize,
}

/// The files shipped from `node_id` in `session`, sorted by name.
#[tracing::instrument(name = "log_files", skip(storage))]
pub async fn list_files(
    storage: &dyn Storage,
    cluster: &ClusterName,
    session: &SessionName,
    node_id: &NodeId,
) -> Result<Vec<ShippedFile>, LogError> {
    let prefix = node_logs_prefix(cluster, session, node_id);
    let mut files: Vec<ShippedFile> = Vec::new();
    for meta in storage.list(&prefix).await? {
        let Some((name, _chunk)) = meta
            .key
            .as_str()
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split_once('/'))
        else {
            continue;
        };
        match files.last_mut() {
            Some(last) if last.name.as_str() == name => last.chunks += 1,
            _ => {
                if let Ok(name) = LogFileName::new(name) {
                    files.push(ShippedFile { name, chunks: 1 });
                }
            }
        }
    }
    // Key order groups each file's chunks, but `.` and `-` sort before the `/` after a name.
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// The last `lines` lines of `file` as shipped (a final line without a newline counts), read
/// from its last piece backwards, and at most its last `limit` bytes: no piece before those is
/// fetched. `complete` is false when fewer lines were found: the limit was reached first, or
/// the file was not stored from its start.
#[tracing::instrument(name = "log_tail", skip(storage), fields(file = %file.prefix()))]
pub async fn read_tail(
    storage: &dyn Storage,
    file: &LogFile,
    lines: usize,
    limit: usize,
) -> Result<LogRange, LogError> {
    let chunks = chunk_offsets(storage, file).await?;
    let mut pieces: Vec<Vec<u8>> = Vec::new();
    let mut newlines = 0;
    let mut reached_start = false;
    let mut expected_end: Option<u64> = None;
    let mut read = 0_usize;
    for (offset, key) in chunks.iter().rev() {
        let mut chunk = read_chunk(storage, key).await?;
        let end = *offset + chunk.len() as u64;
        if let Some(expected) = expected_end {
            if end < expected {
                break; // a gap: what lies before it is not contiguous with what was read
            }
            // A longer re-send stored before a later chunk started inside it: the bytes agree
            // (the store checked), so the later chunk's copy is kept.
            chunk.truncate(usize::try_from(expected - offset).unwrap_or(chunk.len()));
        }
        expected_end = Some(*offset);
        newlines += chunk.iter().filter(|byte| **byte == b'\n').count();
        read += chunk.len();
        pieces.push(chunk);
        reached_start = *offset == 0;
        // One newline more than lines wanted marks where the first wanted line starts.
        if newlines > lines || read >= limit {
            break;
        }
    }
    let mut bytes: Vec<u8> = pieces.into_iter().rev().flatten().collect();
    let over = bytes.len().saturating_sub(limit);
    if over > 0 {
        bytes.drain(..over);
        reached_start = false;
    }
    let body = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    let start = if lines == 0 {
        bytes.len()
    } else {
        body.iter()
            .enumerate()
            .rev()
            .filter(|(_, byte)| **byte == b'\n')
            .nth(lines - 1)
            .map_or(0, |(at, _)| at + 1)
    };
    let found_all = start > 0 || reached_start || lines == 0;
    Ok(LogRange {
        bytes: bytes.get(start..).unwrap_or_default().to_vec(),
        complete: found_all,
    })
}

/// The chunks of `file`, by offset.
async fn chunk_offsets(
    storage: &dyn Storage,
    file: &LogFile,
) -> Result<Vec<(u64, ObjectKey)>, LogError> {
    let listed = storage.list(&file.prefix()).await?;
    Ok(listed
        .into_iter()
        .filter_map(|meta| {
            file.chunk_offset(&meta.key)
                .map(|offset| (offset, meta.key))
        })
        .collect())
}

async fn read_chunk(storage: &dyn Storage, key: &ObjectKey) -> Result<Vec<u8>, LogError> {
    let object = storage.get(key).await?;
    let mut bytes = Vec::new();
    GzDecoder::new(object.body.as_ref())
        .read_to_end(&mut bytes)
        .map_err(|source| LogError::Unreadable {
            key: key.clone(),
            source,
        })?;
    Ok(bytes)
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>, LogError> {
    crate::gzip::gzip(bytes).map_err(LogError::Encode)
}

/// Where two byte strings first differ (the shorter one's length when one is a prefix).
fn first_difference(a: &[u8], b: &[u8]) -> u64 {
    let same = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    same as u64
}
