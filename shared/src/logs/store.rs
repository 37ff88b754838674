//! Storing one request's log pieces (docs/architecture.md, "Logs"): so that a re-send is
//! idempotent, a rewritten file is refused, and the node's index says where every stored byte
//! is.
//!
//! A request becomes one new version of the node's index ([`super::index`]), and one segment
//! object when its bytes do not fit [`super::inline`] in the index. A piece's bytes that overlap stored ones must equal them, wherever the
//! overlap falls; only the bytes no extent covers are stored, so extents never overlap, and a
//! re-send costs one ranged read per segment it meets (never more than its own bytes). A file
//! whose bytes differ is marked rewritten in the index from the first difference, and nothing of
//! it from there on is stored later.
//!
//! Small extents are merged as they accumulate: when a file has [`MERGE_RUN`] adjacent small
//! extents of one level, they become extents of the next level, written into the same
//! request's segment, at most [`MERGE_BYTES`] a request. A file shipped a line at a time thus
//! keeps a few dozen extents, not one per request, and each byte is rewritten about once per
//! level.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;

use bytes::Bytes;
use ulid::Ulid;

use super::index::{self, EXTENT_BYTES, Extent, LogIndex};
use super::inline;
use crate::keys::NodeLogs;
use crate::storage::{InvalidKey, ObjectKey, PutMode, Storage, StorageError};

pub use ship_logs::frames::{MAX_BODY_BYTES, PieceOutcome, ReadPiece};

/// Why log bytes were not stored, or a range not read.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The body is larger than [`MAX_BODY_BYTES`].
    #[error("log body of {bytes} bytes exceeds the limit of {limit} bytes; send smaller bodies")]
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
        /// The piece's length.
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
    /// A stored segment's member is not the gzip stream its index says (written by something
    /// else, or damaged).
    #[error("the stored log segment {key} cannot be read: {source}")]
    Unreadable {
        /// The segment.
        key: ObjectKey,
        /// What decoding said.
        #[source]
        source: std::io::Error,
    },
    /// The node's index is not one this build wrote.
    #[error("the log index {key} cannot be read: {reason}")]
    BadIndex {
        /// The index.
        key: ObjectKey,
        /// Why.
        reason: String,
    },
    /// Other requests replaced the node's index every time this one tried.
    #[error("the log index of {node} kept changing under this request; retry")]
    Contended {
        /// The node's prefix.
        node: String,
    },
    /// The pieces could not be queued; the request should be retried.
    #[error(transparent)]
    Queue(#[from] super::queue::QueueError),
    /// Compression failed (out of memory; never the caller's fault).
    #[error("could not compress the log bytes: {0}")]
    Encode(#[source] std::io::Error),
    /// The key could not be formed (a bug, never the caller's fault).
    #[error(transparent)]
    Key(#[from] InvalidKey),
    /// Storage failed; the request should be retried.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// How many adjacent small extents of one level a file keeps before they are merged into
/// extents of the next level.
pub const MERGE_RUN: usize = 16;

/// An extent shorter than this is small: merged with its neighbours.
const SMALL_EXTENT: u64 = EXTENT_BYTES / 2;

/// Most bytes one request merges: what it holds in memory and writes beyond its own pieces.
pub const MERGE_BYTES: u64 = 8 * 1024 * 1024;

/// Times a request re-plans after another replaced the node's index first.
const COMMIT_ATTEMPTS: usize = 8;

/// Stores every piece of one request from `node`, returning what became of each, in order, once
/// the request's bytes and the node's index naming them are durable.
///
/// A piece's bytes that overlap stored ones must equal them (wherever the overlap falls); a
/// difference refuses the piece ([`PieceOutcome::Refused`]), and of it only the new bytes before
/// the difference are stored. The stored bytes every piece overlaps are read first, all at once,
/// one ranged read per segment: the cost of a re-send is its own length, never the number of
/// pieces stored before it. A stored extent whose segment is gone (an S3 age rule removed it)
/// leaves the index, and its range is a gap the pieces may fill again.
///
/// A difference also marks the file rewritten from there, so that later pieces of it are
/// refused too: the stored history keeps the first version ([`OnDifference::MarkRewritten`]).
pub async fn put_pieces(
    storage: &dyn Storage,
    node: &NodeLogs,
    pieces: &[ReadPiece<'_>],
) -> Result<Vec<PieceOutcome>, LogError> {
    put_pieces_with(storage, node, pieces, OnDifference::MarkRewritten).await
}

/// What a piece whose bytes differ from stored ones does besides being refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDifference {
    /// Marks its file rewritten from the difference: a shipper is sending another version of
    /// the file, and nothing more of it may be stored.
    MarkRewritten,
    /// Nothing more: the piece is a stale copy (an older layout's), and the file as shipped
    /// goes on being stored.
    RefuseOnly,
}

/// [`put_pieces`], with what a difference does besides refusing its piece.
#[tracing::instrument(name = "log_pieces", skip_all, fields(node = %node.prefix(), pieces = pieces.len()))]
pub async fn put_pieces_with(
    storage: &dyn Storage,
    node: &NodeLogs,
    pieces: &[ReadPiece<'_>],
    on_difference: OnDifference,
) -> Result<Vec<PieceOutcome>, LogError> {
    for _ in 0..COMMIT_ATTEMPTS {
        let loaded = index::load(storage, node).await?;
        let mut plan = Plan::new(storage, node, loaded.index, on_difference);
        plan.prefetch_overlaps(pieces).await?;
        let mut outcomes = Vec::with_capacity(pieces.len());
        for piece in pieces {
            outcomes.push(plan.add(piece).await?);
        }
        plan.merge_small().await?;
        let Some(written) = plan.finish()? else {
            return Ok(outcomes); // every byte was stored already
        };
        // A fresh id per request: nothing else writes this key.
        let key = node.segment_key(written.id)?;
        let has_segment = written.segment.is_some();
        if let Some(body) = written.segment {
            storage
                .put(&key, Bytes::from(body), PutMode::Overwrite)
                .await?;
        }
        let landed = index::commit(storage, node, &written.index, loaded.version.as_ref()).await?
            // Refused because this very write landed and its response was lost (the SDK's
            // retry then finds the new version): the index names the request's id, or (when
            // only a rewrite was found) holds its mark.
            || {
                let now = index::load(storage, node).await?.index;
                if written.stores_bytes {
                    names_segment(&now, written.id)
                } else {
                    marks_all(&now, &written.index)
                }
            };
        if landed {
            tracing::info!(id = %written.id, has_segment, new_bytes = written.new_bytes, "stored log pieces");
            return Ok(outcomes);
        }
        // Another request replaced the index first: this segment is named by none.
        if !has_segment {
            continue;
        }
        if let Err(err) = storage.delete(&key).await {
            tracing::warn!(segment = %key, error = %err, "could not delete an unused log segment");
        }
    }
    Err(LogError::Contended {
        node: node.prefix(),
    })
}

/// Where a planned extent's bytes are.
#[derive(Clone, Debug)]
enum Source {
    /// Already stored.
    Stored(Extent),
    /// In the request's buffer.
    New(Range<usize>),
}

/// One extent of a file as the request will leave it.
#[derive(Clone, Debug)]
struct Planned {
    start: u64,
    end: u64,
    level: u8,
    source: Source,
}

impl Planned {
    fn is_small(&self) -> bool {
        self.end - self.start < SMALL_EXTENT
    }
}

/// What one request writes: the index, and a segment when its bytes did not fit inline.
struct Written {
    /// The id the request's new extents name: their segment's, or the inline members'.
    id: Ulid,
    /// Whether the request stores bytes (else it only marks a file rewritten).
    stores_bytes: bool,
    /// The segment `id`, written before the index.
    segment: Option<Vec<u8>>,
    index: LogIndex,
    new_bytes: usize,
}

/// One request's changes, planned over the index it read.
struct Plan<'a> {
    storage: &'a dyn Storage,
    node: &'a NodeLogs,
    index: LogIndex,
    /// The files this request touches, with their extents as they will be.
    files: BTreeMap<String, Vec<Planned>>,
    /// Bytes no stored extent holds.
    buffer: Vec<u8>,
    /// Stored extents read so far, by segment and member.
    read: HashMap<(Ulid, u64), Vec<u8>>,
    /// Stored extents whose segment is gone (an S3 age rule removed it): their ranges are gaps.
    gone: HashSet<(Ulid, u64)>,
    /// Bytes of the pieces stored by this request (not merges).
    new_bytes: usize,
    /// Whether this request found a file rewritten that the index did not mark yet.
    marked: bool,
    on_difference: OnDifference,
}

impl<'a> Plan<'a> {
    fn new(
        storage: &'a dyn Storage,
        node: &'a NodeLogs,
        index: LogIndex,
        on_difference: OnDifference,
    ) -> Self {
        Self {
            storage,
            node,
            index,
            on_difference,
            files: BTreeMap::new(),
            buffer: Vec::new(),
            read: HashMap::new(),
            gone: HashSet::new(),
            new_bytes: 0,
            marked: false,
        }
    }

    fn extents(&mut self, file: &str) -> &mut Vec<Planned> {
        let stored = &self.index;
        self.files.entry(file.to_owned()).or_insert_with(|| {
            stored
                .files
                .get(file)
                .map(|extents| {
                    extents
                        .iter()
                        .map(|extent| Planned {
                            start: extent.start,
                            end: extent.end,
                            level: extent.level,
                            source: Source::Stored(extent.clone()),
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
    }

    /// Reads the stored ones of `planned` not read yet, all at once
    /// ([`index::extents_bytes_found`]). Those whose segment is gone leave the plan: their
    /// ranges become gaps, which the pieces may fill again. Returns whether any left.
    async fn prefetch<'p>(
        &mut self,
        planned: impl IntoIterator<Item = &'p Planned>,
    ) -> Result<bool, LogError> {
        let wanted: Vec<&Extent> = planned
            .into_iter()
            .filter_map(|planned| match &planned.source {
                Source::Stored(extent) if !self.read.contains_key(&(extent.segment, extent.at)) => {
                    Some(extent)
                }
                _ => None,
            })
            .collect();
        if wanted.is_empty() {
            return Ok(false);
        }
        let inline = self.index.inline.as_ref();
        let fetched = index::extents_bytes_found(self.storage, self.node, inline, &wanted).await?;
        let mut left = false;
        for (extent, bytes) in wanted.iter().zip(fetched) {
            let member = (extent.segment, extent.at);
            match bytes {
                Some(bytes) => {
                    self.read.insert(member, bytes);
                }
                None => left |= self.gone.insert(member),
            }
        }
        if left {
            tracing::warn!(
                gone = self.gone.len(),
                "log segments the index names are gone (an age rule?); their ranges are gaps"
            );
            let gone = &self.gone;
            for extents in self.files.values_mut() {
                extents.retain(|planned| match &planned.source {
                    Source::Stored(extent) => !gone.contains(&(extent.segment, extent.at)),
                    Source::New(_) => true,
                });
            }
        }
        Ok(left)
    }

    /// The planned extents of `file` that overlap `start..end`.
    fn overlapping(&mut self, file: &str, start: u64, end: u64) -> Vec<Planned> {
        self.extents(file)
            .iter()
            .filter(|extent| extent.start < end && extent.end > start)
            .cloned()
            .collect()
    }

    /// Reads every stored extent the pieces overlap, all at once, before they are checked one
    /// by one.
    async fn prefetch_overlaps(&mut self, pieces: &[ReadPiece<'_>]) -> Result<(), LogError> {
        let mut wanted = Vec::new();
        for piece in pieces {
            let end = piece.offset.saturating_add(piece.bytes.len() as u64);
            wanted.extend(self.overlapping(piece.file.as_str(), piece.offset, end));
        }
        self.prefetch(&wanted).await?;
        Ok(())
    }

    /// The bytes of `planned`, read before by [`Plan::prefetch`] if stored.
    async fn bytes_of(&mut self, planned: &Planned) -> Result<Vec<u8>, LogError> {
        match &planned.source {
            Source::New(range) => Ok(self.buffer.get(range.clone()).unwrap_or_default().to_vec()),
            Source::Stored(extent) => {
                let member = (extent.segment, extent.at);
                if let Some(bytes) = self.read.get(&member) {
                    return Ok(bytes.clone());
                }
                let inline = self.index.inline.as_ref();
                let bytes = index::extent_bytes(self.storage, self.node, inline, extent).await?;
                self.read.insert(member, bytes.clone());
                Ok(bytes)
            }
        }
    }

    /// Checks `piece` against what is stored and plans its new bytes.
    async fn add(&mut self, piece: &ReadPiece<'_>) -> Result<PieceOutcome, LogError> {
        let refused = |err: LogError| PieceOutcome::Refused {
            reason: err.to_string(),
        };
        let (start, bytes) = (piece.offset, piece.bytes);
        let Some(end) = u64::try_from(bytes.len())
            .ok()
            .and_then(|len| start.checked_add(len))
        else {
            return Ok(refused(LogError::OffsetOverflow {
                offset: start,
                len: bytes.len(),
            }));
        };
        let name = piece.file.as_str();
        // Of a file found rewritten, nothing from the first difference on is stored.
        let mut conflict = None;
        let checked_end = match self.index.rewritten.get(name) {
            Some(&from) if end > from => {
                let at = from.max(start);
                conflict = Some(LogError::Conflict {
                    file: format!("{}{}", self.node.prefix(), name),
                    start: at,
                    end,
                });
                at
            }
            _ => end,
        };
        let mut overlapping = self.overlapping(name, start, checked_end);
        if self.prefetch(&overlapping).await? {
            overlapping = self.overlapping(name, start, checked_end);
        }
        let mut cursor = start;
        let mut new_parts = Vec::new();
        let mut differs = false;
        for extent in overlapping {
            if extent.start > cursor {
                new_parts.push(cursor..extent.start);
            }
            let (low, high) = (extent.start.max(start), extent.end.min(checked_end));
            let stored = self.bytes_of(&extent).await?;
            let theirs = slice(&stored, low - extent.start, high - extent.start);
            let ours = slice(bytes, low - start, high - start);
            if theirs != ours {
                let differs_at = low + first_difference(theirs, ours);
                if self.on_difference == OnDifference::MarkRewritten {
                    self.mark_rewritten(name, differs_at);
                }
                conflict = Some(LogError::Conflict {
                    file: format!("{}{}", self.node.prefix(), name),
                    start: differs_at,
                    end: high,
                });
                differs = true;
                break;
            }
            cursor = high;
        }
        // Bytes past a difference are not stored; bytes before a mark are, gaps included.
        if !differs && cursor < checked_end {
            new_parts.push(cursor..checked_end);
        }
        let mut stored = 0;
        for part in new_parts {
            stored += self.plan_new(
                name,
                part.start,
                slice(bytes, part.start - start, part.end - start),
                0,
            );
        }
        self.new_bytes += stored;
        Ok(match conflict {
            Some(err) => refused(err),
            None => PieceOutcome::Stored { stored, end },
        })
    }

    /// Marks `file` rewritten from `offset` (or from an earlier offset it is marked at).
    fn mark_rewritten(&mut self, file: &str, offset: u64) {
        let mark = self
            .index
            .rewritten
            .entry(file.to_owned())
            .or_insert(offset);
        if offset <= *mark {
            *mark = offset;
            self.marked = true;
        }
    }

    /// Plans `bytes` as new extents of `file` from `start`, at most [`EXTENT_BYTES`] each;
    /// returns their length.
    fn plan_new(&mut self, file: &str, start: u64, bytes: &[u8], level: u8) -> usize {
        let mut offset = start;
        for part in bytes.chunks(usize::try_from(EXTENT_BYTES).unwrap_or(usize::MAX)) {
            let from = self.buffer.len();
            self.buffer.extend_from_slice(part);
            let planned = Planned {
                start: offset,
                end: offset + part.len() as u64,
                level,
                source: Source::New(from..self.buffer.len()),
            };
            offset = planned.end;
            let extents = self.extents(file);
            let at = extents.partition_point(|extent| extent.start < planned.start);
            extents.insert(at, planned);
        }
        bytes.len()
    }

    /// Merges every run of [`MERGE_RUN`] or more adjacent small extents of one level, in the
    /// files this request touches, into extents of the next level; and with them the first
    /// shorter run of each of those files, so that files growing together are merged in the same
    /// requests and one read of each earlier segment serves them all. At most
    /// [`MERGE_BYTES`] are merged per request; what is left waits for the next.
    async fn merge_small(&mut self) -> Result<(), LogError> {
        let mut budget = MERGE_BYTES;
        while self
            .files
            .values()
            .any(|extents| small_run(extents, MERGE_RUN).is_some())
        {
            let mut runs: Vec<(String, Range<usize>)> = Vec::new();
            for (name, extents) in &self.files {
                let Some(run) = small_run(extents, 2) else {
                    continue;
                };
                let bytes: u64 = extents
                    .get(run.clone())
                    .unwrap_or_default()
                    .iter()
                    .map(|extent| extent.end - extent.start)
                    .sum();
                if bytes <= budget {
                    budget -= bytes;
                    runs.push((name.clone(), run));
                }
            }
            if runs.is_empty() {
                break;
            }
            let members: Vec<Planned> = runs
                .iter()
                .filter_map(|(name, run)| self.files.get(name)?.get(run.clone()))
                .flatten()
                .cloned()
                .collect();
            if self.prefetch(&members).await? {
                continue; // extents left the plan: find the runs again
            }
            for (name, run) in runs {
                let merged: Vec<Planned> = self
                    .files
                    .get_mut(&name)
                    .map(|extents| extents.drain(run).collect())
                    .unwrap_or_default();
                let Some((start, level)) = merged.first().map(|first| (first.start, first.level))
                else {
                    continue;
                };
                let mut bytes = Vec::new();
                for extent in &merged {
                    bytes.extend(self.bytes_of(extent).await?);
                }
                self.plan_new(&name, start, &bytes, level.saturating_add(1));
            }
        }
        Ok(())
    }

    /// The index naming every planned new extent, placed inline in it or in a segment of the
    /// request's own ([`inline::place`]); `None` when there is nothing new.
    fn finish(self) -> Result<Option<Written>, LogError> {
        let id = Ulid::new();
        let mut body = Vec::new();
        let mut index = self.index;
        for (name, planned) in self.files {
            let mut extents = Vec::with_capacity(planned.len());
            for extent in planned {
                let stored = match extent.source {
                    Source::Stored(stored) => stored,
                    Source::New(range) => {
                        let member = gzip(self.buffer.get(range).unwrap_or_default())?;
                        let at = body.len() as u64;
                        body.extend_from_slice(&member);
                        Extent {
                            start: extent.start,
                            end: extent.end,
                            segment: id,
                            at,
                            size: member.len() as u64,
                            level: extent.level,
                        }
                    }
                };
                extents.push(stored);
            }
            index.files.insert(name, extents);
        }
        let stores_bytes = !body.is_empty();
        if !stores_bytes && !self.marked {
            return Ok(None);
        }
        let segment = if stores_bytes {
            inline::place(&mut index, id, body)
        } else {
            None
        };
        Ok(Some(Written {
            id,
            stores_bytes,
            segment,
            index,
            new_bytes: self.new_bytes,
        }))
    }
}

/// Whether any extent of `index` is in `segment`.
fn names_segment(index: &LogIndex, segment: Ulid) -> bool {
    index
        .files
        .values()
        .flatten()
        .any(|extent| extent.segment == segment)
}

/// Whether `index` marks every file `written` marks rewritten, at the same offset or earlier.
fn marks_all(index: &LogIndex, written: &LogIndex) -> bool {
    written.rewritten.iter().all(|(file, from)| {
        index
            .rewritten
            .get(file)
            .is_some_and(|marked| marked <= from)
    })
}

/// The first run of `at_least` or more adjacent small extents of one level.
fn small_run(extents: &[Planned], at_least: usize) -> Option<Range<usize>> {
    let mut first = 0;
    for at in 1..=extents.len() {
        let joins = match (extents.get(at - 1), extents.get(at)) {
            (Some(before), Some(this)) => {
                before.is_small()
                    && this.is_small()
                    && before.end == this.start
                    && before.level == this.level
            }
            _ => false,
        };
        if !joins {
            if at - first >= at_least && extents.get(first).is_some_and(Planned::is_small) {
                return Some(first..at);
            }
            first = at;
        }
    }
    None
}

/// Bytes `from..to` of `bytes` (offsets within it), empty past its end.
fn slice(bytes: &[u8], from: u64, to: u64) -> &[u8] {
    let (Ok(from), Ok(to)) = (usize::try_from(from), usize::try_from(to)) else {
        return &[];
    };
    bytes.get(from..to).unwrap_or_default()
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>, LogError> {
    crate::gzip::gzip(bytes).map_err(LogError::Encode)
}

/// Where two byte strings first differ (the shorter one's length when one is a prefix).
fn first_difference(a: &[u8], b: &[u8]) -> u64 {
    let same = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    same as u64
}
