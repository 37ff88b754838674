//! Reading shipped logs back (docs/architecture.md, "Logs"): any byte range of a file, its last
//! lines, and a node's files. Each read loads the node's index once and fetches only the
//! extents it needs, each with one ranged read, stopping at its byte limit: nothing lists, and
//! nothing loads more than it returns plus one extent.

use super::index::{self, Extent};
use super::inline::Inline;
use super::metadata::CLUSTER_METADATA_FILE;
use super::store::LogError;
use crate::keys::{LogFile, LogFileName, NodeLogs};
use crate::storage::Storage;

/// Bytes `start..end` of a file, as far as they were shipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRange {
    /// The bytes, from `start` on.
    pub bytes: Vec<u8>,
    /// False when some of the range was never stored: the shipper had not sent it (yet), or the
    /// node was lost before it could. `bytes` then ends where the stored bytes stop.
    pub complete: bool,
}

/// The extents stored of `file`, by offset, and the index's inline members, which may hold
/// some of them.
async fn extents_of(
    storage: &dyn Storage,
    file: &LogFile,
) -> Result<(Vec<Extent>, Option<Inline>), LogError> {
    let mut index = index::load(storage, &file.node()).await?.index;
    let extents = index.files.remove(file.file.as_str()).unwrap_or_default();
    Ok((extents, index.inline))
}

/// Reads bytes `start..end` of `file` (`end: None` for everything from `start`), at most
/// `limit` of them: no extent past the limit is fetched, and a range that reaches the limit
/// before its end is not `complete` (nor is one without an end that reaches it: whether more
/// was stored is not read).
#[tracing::instrument(name = "log_range", skip(storage), fields(file = %file))]
pub async fn read_range(
    storage: &dyn Storage,
    file: &LogFile,
    start: u64,
    end: Option<u64>,
    limit: usize,
) -> Result<LogRange, LogError> {
    let cut = start.saturating_add(u64::try_from(limit).unwrap_or(u64::MAX));
    let stop = end.map_or(cut, |end| end.min(cut));
    let (extents, inline) = extents_of(storage, file).await?;
    // The extents the range needs: up to its stop, or the first bytes never stored.
    let mut needed = Vec::new();
    let mut reach = start;
    // Whether bytes past a gap were stored: then the range is not all there even without `end`.
    let mut stopped_at_gap = false;
    let first = extents.partition_point(|extent| extent.end <= start);
    for extent in extents.get(first..).unwrap_or_default() {
        if reach >= stop {
            break;
        }
        if extent.start > reach {
            stopped_at_gap = true;
            break;
        }
        needed.push(extent);
        reach = extent.end;
    }
    let fetched = index::extents_bytes(storage, &file.node(), inline.as_ref(), &needed).await?;
    let mut bytes = Vec::new();
    let mut position = start;
    for (extent, stored) in needed.iter().zip(&fetched) {
        let from = usize::try_from(position - extent.start).unwrap_or(usize::MAX);
        let to = usize::try_from(stop.min(extent.end) - extent.start).unwrap_or(usize::MAX);
        let taken = stored.get(from..to).unwrap_or_default();
        bytes.extend_from_slice(taken);
        position += taken.len() as u64;
    }
    let limited = position >= cut && end.is_none_or(|end| end > cut);
    let complete = !stopped_at_gap && !limited && end.is_none_or(|end| position >= end);
    Ok(LogRange { bytes, complete })
}

/// The last `lines` lines of `file` as shipped (a final line without a newline counts), read
/// from its last extent backwards, and at most its last `limit` bytes: no extent before those is
/// fetched, and at most a batch more than the lines need. `complete` is false when fewer lines were found: the limit was reached first, or
/// the file was not stored from its start.
#[tracing::instrument(name = "log_tail", skip(storage), fields(file = %file))]
pub async fn read_tail(
    storage: &dyn Storage,
    file: &LogFile,
    lines: usize,
    limit: usize,
) -> Result<LogRange, LogError> {
    let (extents, inline) = extents_of(storage, file).await?;
    let stored = Stored {
        node: &file.node(),
        inline: inline.as_ref(),
    };
    tail_of(storage, stored, &extents, lines, limit).await
}

/// The last `lines` lines of each of `node`'s files that `wanted` picks, as [`read_tail`] reads
/// one, by name, with one read of the node's index: at most `limit` bytes in all, the files
/// read in name order until it is spent.
#[tracing::instrument(name = "log_tails", skip(storage, wanted), fields(node = %node.prefix()))]
pub async fn read_tails(
    storage: &dyn Storage,
    node: &NodeLogs,
    wanted: impl Fn(&str) -> bool,
    lines: usize,
    limit: usize,
) -> Result<Vec<(LogFileName, LogRange)>, LogError> {
    let index = index::load(storage, node).await?.index;
    let mut tails = Vec::new();
    let mut left = limit;
    for (name, extents) in &index.files {
        if left == 0 {
            break;
        }
        let Ok(file) = LogFileName::new(name) else {
            continue;
        };
        if !wanted(name) {
            continue;
        }
        let stored = Stored {
            node,
            inline: index.inline.as_ref(),
        };
        let tail = tail_of(storage, stored, extents, lines, left).await?;
        left = left.saturating_sub(tail.bytes.len());
        tails.push((file, tail));
    }
    Ok(tails)
}

/// Where a node's extents are read from: its segments, and its index's inline members.
#[derive(Clone, Copy)]
struct Stored<'a> {
    node: &'a NodeLogs,
    inline: Option<&'a Inline>,
}

/// [`read_tail`] of a file whose extents are known.
async fn tail_of(
    storage: &dyn Storage,
    stored: Stored<'_>,
    extents: &[Extent],
    lines: usize,
    limit: usize,
) -> Result<LogRange, LogError> {
    let mut pieces: Vec<Vec<u8>> = Vec::new();
    let mut newlines = 0;
    let mut reached_start = false;
    let mut read = 0_usize;
    let mut from_end = extents.iter().rev().peekable();
    // Extents are read a batch at a time, the batches doubling: a short tail costs one read,
    // a long one a few rounds.
    let mut width = 1;
    // A gap: what lies before it is not contiguous with what was read.
    let mut gap = false;
    'reading: loop {
        let mut batch = Vec::new();
        let mut planned = read;
        while !gap && batch.len() < width && planned < limit {
            let Some(extent) = from_end.next() else { break };
            planned =
                planned.saturating_add(usize::try_from(extent.file_bytes()).unwrap_or(usize::MAX));
            batch.push(extent);
            gap = from_end
                .peek()
                .is_some_and(|before| before.end < extent.start);
        }
        if batch.is_empty() {
            break;
        }
        for (extent, stored) in batch
            .iter()
            .zip(index::extents_bytes(storage, stored.node, stored.inline, &batch).await?)
        {
            newlines += stored.iter().filter(|byte| **byte == b'\n').count();
            read += stored.len();
            pieces.push(stored);
            reached_start = extent.start == 0;
            // One newline more than lines wanted marks where the first wanted line starts.
            if newlines > lines || read >= limit {
                break 'reading;
            }
        }
        width = (width * 2).min(index::PARALLEL_READS);
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

/// A file shipped from a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShippedFile {
    /// Its name in the session's `logs/`.
    pub name: LogFileName,
    /// Bytes stored of it.
    pub bytes: u64,
}

/// The files shipped from `node`, sorted by name: Ray's log files, without the cluster's
/// [`super::metadata`], which no Ray node lists.
#[tracing::instrument(name = "log_files", skip(storage), fields(node = %node.prefix()))]
pub async fn list_files(
    storage: &dyn Storage,
    node: &NodeLogs,
) -> Result<Vec<ShippedFile>, LogError> {
    let index = index::load(storage, node).await?.index;
    Ok(index
        .files
        .iter()
        .filter(|(name, _)| name.as_str() != CLUSTER_METADATA_FILE)
        .filter_map(|(name, extents)| {
            Some(ShippedFile {
                name: LogFileName::new(name).ok()?,
                bytes: extents.iter().map(Extent::file_bytes).sum(),
            })
        })
        .collect())
}

/// Whether any byte of `file` was shipped.
pub async fn is_shipped(storage: &dyn Storage, file: &LogFile) -> Result<bool, LogError> {
    Ok(!extents_of(storage, file).await?.0.is_empty())
}
