//! Logs stored in the older layout, moved into the segments and index that reads use
//! (`afterglow migrate-logs`).
//!
//! The older layout kept each shipped piece as an object of its own,
//! `logs/{cluster}/{session}/{node_id}/{file}/{offset:020}.gz`: the file's bytes from `offset`,
//! one gzip stream, the pieces of a file tiling it from 0 without overlapping. Reads never look
//! at those objects. Moving a node's pieces stores them through [`put_pieces`] as a re-send of
//! the same bytes would be stored: bytes the node's index already holds must be equal and are
//! not stored again, so a move cut short is simply run again. A piece is deleted only once its
//! bytes are named by the index; one that cannot be read, or whose bytes differ from indexed
//! ones (the file was shipped again, rewritten, in the current layout), is kept and reported.

use std::collections::BTreeMap;

use futures_util::{StreamExt as _, stream};

use super::store::{LogError, OnDifference, PieceOutcome, ReadPiece, put_pieces_with};
use crate::gzip::{deflated_at_most, gunzip_within};
use crate::keys::{ClusterName, LOGS_PREFIX, LogFileName, NodeId, NodeLogs, SessionName};
use crate::storage::{ObjectKey, Storage, StorageError};

/// The most bytes one older piece holds: the older shipper's limit.
pub const OLDER_PIECE_BYTES: usize = 3 * 1024 * 1024;

/// Most bytes of one node stored by one [`put_pieces`]: the part held in memory at once.
const PART_BYTES: usize = 16 * 1024 * 1024;

/// Older pieces read at once.
const PARALLEL_READS: usize = 8;

/// One stored object of the older layout.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct OlderPiece {
    /// The file it is a piece of.
    pub file: LogFileName,
    /// Where its bytes start in the file.
    pub offset: u64,
    /// The object.
    pub key: ObjectKey,
}

/// The node and piece an older layout's key names; `None` for any other key (an index, a
/// segment).
pub fn older_piece(key: &ObjectKey) -> Option<(NodeLogs, OlderPiece)> {
    let rest = key.as_str().strip_prefix(LOGS_PREFIX)?;
    let [cluster, session, node_id, file, name] = rest.split('/').collect::<Vec<_>>()[..] else {
        return None;
    };
    let digits = name.strip_suffix(".gz")?;
    if digits.len() != 20 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let node = NodeLogs {
        cluster: ClusterName::new(cluster).ok()?,
        session: SessionName::new(session).ok()?,
        node_id: NodeId::new(node_id).ok()?,
    };
    let piece = OlderPiece {
        file: LogFileName::new(file).ok()?,
        offset: digits.parse().ok()?,
        key: key.clone(),
    };
    Some((node, piece))
}

/// Every older piece in `storage`, by node, each node's in file and offset order.
pub async fn find_older_pieces(
    storage: &dyn Storage,
) -> Result<BTreeMap<NodeLogs, Vec<OlderPiece>>, StorageError> {
    let mut by_node: BTreeMap<NodeLogs, Vec<OlderPiece>> = BTreeMap::new();
    for meta in storage.list(LOGS_PREFIX).await? {
        if let Some((node, piece)) = older_piece(&meta.key) {
            by_node.entry(node).or_default().push(piece);
        }
    }
    by_node.values_mut().for_each(|pieces| pieces.sort());
    Ok(by_node)
}

/// What moving one node's older pieces did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Pieces whose bytes the index now names, deleted.
    pub pieces: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Pieces kept, with why: they cannot be read, or differ from bytes stored first.
    pub kept: Vec<(ObjectKey, String)>,
}

impl Moved {
    /// Adds what moving another node did.
    pub fn add(&mut self, other: Moved) {
        self.pieces += other.pieces;
        self.bytes += other.bytes;
        self.kept.extend(other.kept);
    }
}

/// Bytes of adjacent pieces of one file, joined, with the pieces they came from.
struct Joined {
    file: LogFileName,
    offset: u64,
    bytes: Vec<u8>,
    keys: Vec<ObjectKey>,
}

/// Moves `pieces` of `node` (as [`find_older_pieces`] gives them) into the node's segments and
/// index, then deletes them, a part of at most 16 MiB at a time.
#[tracing::instrument(name = "log_migrate", skip_all, fields(node = %node.prefix(), pieces = pieces.len()))]
pub async fn move_node(
    storage: &dyn Storage,
    node: &NodeLogs,
    pieces: Vec<OlderPiece>,
) -> Result<Moved, LogError> {
    let mut moved = Moved::default();
    let mut part: Vec<Joined> = Vec::new();
    let mut part_bytes = 0;
    let mut read = stream::iter(pieces)
        .map(|piece| async move {
            let bytes = read_piece(storage, &piece.key).await;
            (piece, bytes)
        })
        .buffered(PARALLEL_READS);
    while let Some((piece, bytes)) = read.next().await {
        let bytes = match bytes {
            Ok(bytes) => bytes,
            // Moved since it was listed (another run of the command): nothing left to do.
            Err(LogError::Storage(StorageError::NotFound { .. })) => continue,
            Err(err) => {
                moved.kept.push((piece.key, err.to_string()));
                continue;
            }
        };
        part_bytes += bytes.len();
        join(&mut part, piece, bytes);
        if part_bytes >= PART_BYTES {
            store_part(storage, node, std::mem::take(&mut part), &mut moved).await?;
            part_bytes = 0;
        }
    }
    store_part(storage, node, part, &mut moved).await?;
    Ok(moved)
}

/// Adds `piece` to `part`, joined to the part's last bytes when it continues them.
fn join(part: &mut Vec<Joined>, piece: OlderPiece, bytes: Vec<u8>) {
    if let Some(last) = part.last_mut()
        && last.file == piece.file
        && last.offset.checked_add(last.bytes.len() as u64) == Some(piece.offset)
    {
        last.bytes.extend_from_slice(&bytes);
        last.keys.push(piece.key);
        return;
    }
    part.push(Joined {
        file: piece.file,
        offset: piece.offset,
        bytes,
        keys: vec![piece.key],
    });
}

/// Stores `part` as one request, then deletes the pieces whose bytes the index now names.
async fn store_part(
    storage: &dyn Storage,
    node: &NodeLogs,
    part: Vec<Joined>,
    moved: &mut Moved,
) -> Result<(), LogError> {
    if part.is_empty() {
        return Ok(());
    }
    let pieces: Vec<ReadPiece<'_>> = part
        .iter()
        .map(|joined| ReadPiece {
            file: joined.file.clone(),
            offset: joined.offset,
            bytes: &joined.bytes,
        })
        .collect();
    // A piece that differs from what the node's index holds is a stale copy: it is kept, and
    // the file as shipped since goes on being stored.
    let outcomes = put_pieces_with(storage, node, &pieces, OnDifference::RefuseOnly).await?;
    let mut stored = Vec::new();
    for (joined, outcome) in part.iter().zip(outcomes) {
        match outcome {
            PieceOutcome::Stored { .. } => {
                moved.pieces += joined.keys.len();
                moved.bytes += joined.bytes.len() as u64;
                stored.extend(joined.keys.iter().cloned());
            }
            PieceOutcome::Refused { reason } => {
                let kept = joined.keys.iter().map(|key| (key.clone(), reason.clone()));
                moved.kept.extend(kept);
            }
            PieceOutcome::Queued { .. } => {
                let reason = "the store answered `queued`, not `stored`".to_owned();
                moved
                    .kept
                    .extend(joined.keys.iter().map(|key| (key.clone(), reason.clone())));
            }
        }
    }
    storage.delete_all(&stored).await?;
    Ok(())
}

/// The bytes of one older piece, refused by its size before they are read.
async fn read_piece(storage: &dyn Storage, key: &ObjectKey) -> Result<Vec<u8>, LogError> {
    // A piece's gzip stream: its deflated bytes and the member's 18 bytes of frame.
    let limit = deflated_at_most(OLDER_PIECE_BYTES) + 18;
    let object = storage.get_within(key, limit as u64).await?;
    gunzip_within(&object.body, OLDER_PIECE_BYTES as u64).map_err(|err| LogError::Unreadable {
        key: key.clone(),
        source: std::io::Error::other(err),
    })
}

/// Moves every node of `nodes` ([`find_older_pieces`]), `at_once` at a time, telling `each` of
/// every node as it is done; a node that fails leaves its pieces for the next run.
pub async fn move_all(
    storage: &dyn Storage,
    nodes: BTreeMap<NodeLogs, Vec<OlderPiece>>,
    at_once: usize,
    mut each: impl FnMut(&NodeLogs, &Result<Moved, LogError>),
) -> Vec<(NodeLogs, Result<Moved, LogError>)> {
    stream::iter(nodes)
        .map(|(node, pieces)| async move {
            let moved = move_node(storage, &node, pieces).await;
            (node, moved)
        })
        .buffer_unordered(at_once.max(1))
        .inspect(|(node, moved)| each(node, moved))
        .collect()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::InvalidKey;

    #[test]
    fn only_the_older_layouts_keys_name_a_piece() -> Result<(), InvalidKey> {
        let node = format!("logs/c/session_x/{}/", "ab".repeat(28));
        let key = ObjectKey::new(format!("{node}worker.out/00000000000000001234.gz"))?;
        let found = older_piece(&key);
        let (node_logs, piece) = found.as_ref().map(|(n, p)| (n.prefix(), p)).unzip();
        assert_eq!(node_logs.as_deref(), Some(node.as_str()));
        assert_eq!(
            piece.map(|p| (p.file.as_str(), p.offset)),
            Some(("worker.out", 1234))
        );
        for other in [
            format!("{node}index.json"),
            format!("{node}segments/01JD0000000000000000000000.gz"),
            format!("{node}worker.out/1234.gz"),
            format!("{node}worker.out/0000000000000000123x.gz"),
            format!("{node}old/worker.out/00000000000000001234.gz"),
        ] {
            assert!(
                older_piece(&ObjectKey::new(other.clone())?).is_none(),
                "{other}"
            );
        }
        Ok(())
    }
}
