//! The log store function's work: a batch of queued requests stored at once, one
//! [`put_pieces`] per node, so a node's requests of a whole batch window become one index write
//! (their bytes inline in it, or in a segment once the inline members fill).
//!
//! A batch is at most 6 MB of compressed messages, which log output can unpack to a hundred
//! times that. So messages are grouped by node still compressed, a few nodes are stored at a
//! time, and a node's messages are unpacked in order and stored in parts of at most
//! [`DrainLimits::node_part_bytes`].

use std::collections::BTreeMap;

use futures_util::{StreamExt as _, stream};

use super::message::Packed;
use crate::keys::{LogFileName, NodeLogs};
use crate::logs::store::{PieceOutcome, ReadPiece, put_pieces};
use crate::storage::Storage;

/// How much of a batch is held unpacked at once.
#[derive(Clone, Copy, Debug)]
pub struct DrainLimits {
    /// Nodes stored at once.
    pub nodes_at_once: usize,
    /// Most unpacked bytes of one node stored in one [`put_pieces`]; a node's batch past it is
    /// stored in parts, in the order sent.
    pub node_part_bytes: usize,
}

impl Default for DrainLimits {
    /// Four nodes of 16 MiB each: with the store's own copies, well inside the log store
    /// function's 512 MB.
    fn default() -> Self {
        Self {
            nodes_at_once: 4,
            node_part_bytes: 16 * 1024 * 1024,
        }
    }
}

/// One received message.
#[derive(Clone, Copy, Debug)]
pub struct Received<'a> {
    /// Its id, to ask for it again.
    pub id: &'a str,
    /// Its body.
    pub body: &'a str,
}

/// What became of a batch.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Ids of the messages to deliver again: those whose node could not be stored now, and
    /// those that cannot be read (so the dead-letter queue keeps them).
    pub redeliver: Vec<String>,
    /// Nodes stored.
    pub nodes: usize,
    /// Stores made: one per node, more for a node stored in parts.
    pub stores: usize,
    /// Pieces refused: bytes that differ from ones stored first.
    pub refused: usize,
}

/// What became of one node's messages.
#[derive(Default)]
struct NodeDrained {
    /// Messages that cannot be unpacked.
    unreadable: Vec<String>,
    /// Messages not stored (storage failed): from the first part that failed on.
    unstored: Vec<String>,
    stores: usize,
    refused: usize,
}

/// Stores every message of a batch: the pieces of each node in the order they were sent,
/// adjacent pieces of one file joined, in one [`put_pieces`] (or a few, past `limits`).
#[tracing::instrument(name = "log_drain", skip_all, fields(messages = messages.len()))]
pub async fn store_batch(
    storage: &dyn Storage,
    messages: &[Received<'_>],
    limits: DrainLimits,
) -> Drained {
    let mut drained = Drained::default();
    let mut by_node: BTreeMap<NodeLogs, Vec<(u64, &str, Packed)>> = BTreeMap::new();
    for message in messages {
        match Packed::read(message.body) {
            Ok(packed) => by_node.entry(packed.node.clone()).or_default().push((
                packed.sent_ms,
                message.id,
                packed,
            )),
            Err(err) => unreadable(&mut drained.redeliver, message.id, &err),
        }
    }
    let stored: Vec<NodeDrained> = stream::iter(by_node)
        .map(|(node, mut queued)| async move {
            queued.sort_by_key(|(sent_ms, ..)| *sent_ms);
            store_node(storage, &node, queued, limits.node_part_bytes).await
        })
        .buffer_unordered(limits.nodes_at_once.max(1))
        .collect()
        .await;
    for node in stored {
        drained.redeliver.extend(node.unreadable);
        drained.stores += node.stores;
        drained.refused += node.refused;
        if node.unstored.is_empty() {
            drained.nodes += 1;
        }
        drained.redeliver.extend(node.unstored);
    }
    drained
}

fn unreadable(redeliver: &mut Vec<String>, id: &str, err: &dyn std::fmt::Display) {
    tracing::error!(id, error = %err, "a queued log message cannot be read; it goes to the dead-letter queue");
    redeliver.push(id.to_owned());
}

/// Pieces of one node gathered for one store, adjacent pieces of a file joined.
#[derive(Default)]
struct Part {
    pieces: Vec<(LogFileName, u64, Vec<u8>)>,
    /// Where each file's last piece is in `pieces`.
    open: BTreeMap<LogFileName, usize>,
    bytes: usize,
    ids: Vec<String>,
}

impl Part {
    fn add(&mut self, piece: &ReadPiece<'_>) {
        self.bytes += piece.bytes.len();
        if let Some(&at) = self.open.get(&piece.file)
            && let Some((_, start, bytes)) = self.pieces.get_mut(at)
            && start.saturating_add(bytes.len() as u64) == piece.offset
        {
            bytes.extend_from_slice(piece.bytes);
            return;
        }
        self.open.insert(piece.file.clone(), self.pieces.len());
        self.pieces
            .push((piece.file.clone(), piece.offset, piece.bytes.to_vec()));
    }
}

/// Stores one node's queued requests, in the order sent, in parts of at most `part_bytes`.
async fn store_node(
    storage: &dyn Storage,
    node: &NodeLogs,
    queued: Vec<(u64, &str, Packed)>,
    part_bytes: usize,
) -> NodeDrained {
    let mut drained = NodeDrained::default();
    let mut part = Part::default();
    let mut queued = queued.into_iter();
    while let Some((_, id, packed)) = queued.next() {
        let pieces_read = packed.unpack().and_then(|message| {
            let pieces = message.pieces()?;
            pieces.iter().for_each(|piece| part.add(piece));
            Ok(())
        });
        if let Err(err) = pieces_read {
            unreadable(&mut drained.unreadable, id, &err);
            continue;
        }
        part.ids.push(id.to_owned());
        if part.bytes >= part_bytes
            && !drained
                .store(storage, node, std::mem::take(&mut part))
                .await
        {
            // The rest would be stored past a gap: ask for it all again, in order.
            drained
                .unstored
                .extend(queued.map(|(_, id, _)| id.to_owned()));
            return drained;
        }
    }
    if !part.ids.is_empty() {
        drained.store(storage, node, part).await;
    }
    drained
}

impl NodeDrained {
    /// Stores `part`; whether it was stored (else its messages are to be delivered again).
    async fn store(&mut self, storage: &dyn Storage, node: &NodeLogs, part: Part) -> bool {
        match store_part(storage, node, &part).await {
            Ok(refused) => {
                self.stores += 1;
                self.refused += refused;
                true
            }
            Err(reason) => {
                tracing::error!(%reason, node = %node.prefix(), "a node's queued log pieces were not stored; they are delivered again");
                self.unstored.extend(part.ids);
                false
            }
        }
    }
}

/// Stores one part; returns how many pieces were refused.
async fn store_part(storage: &dyn Storage, node: &NodeLogs, part: &Part) -> Result<usize, String> {
    let pieces: Vec<ReadPiece<'_>> = part
        .pieces
        .iter()
        .map(|(file, offset, bytes)| ReadPiece {
            file: file.clone(),
            offset: *offset,
            bytes,
        })
        .collect();
    let outcomes = put_pieces(storage, node, &pieces)
        .await
        .map_err(|err| err.to_string())?;
    let mut refused = 0;
    for (piece, outcome) in pieces.iter().zip(outcomes) {
        if let PieceOutcome::Refused { reason } = outcome {
            refused += 1;
            tracing::warn!(node = %node.prefix(), file = %piece.file, offset = piece.offset, %reason, "queued log piece refused");
        }
    }
    Ok(refused)
}
