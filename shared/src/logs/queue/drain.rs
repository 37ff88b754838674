//! The log store function's work: a batch of queued requests stored at once, one
//! [`put_pieces`] per node, so a node's requests of a whole batch window become one segment and
//! one index write.

use std::collections::BTreeMap;

use futures_util::{StreamExt as _, stream};

use super::message::QueuedPieces;
use crate::keys::{LogFileName, NodeLogs};
use crate::logs::store::{PieceOutcome, ReadPiece, put_pieces};
use crate::storage::Storage;

/// Nodes stored at once: each is a few storage requests in a row.
const NODES_AT_ONCE: usize = 16;

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
    /// Pieces refused: bytes that differ from ones stored first.
    pub refused: usize,
}

/// Stores every message of a batch: the pieces of each node in the order they were sent,
/// adjacent pieces of one file joined, in one [`put_pieces`].
#[tracing::instrument(name = "log_drain", skip_all, fields(messages = messages.len()))]
pub async fn store_batch(storage: &dyn Storage, messages: &[Received<'_>]) -> Drained {
    let mut drained = Drained::default();
    let mut by_node: BTreeMap<NodeLogs, Vec<(u64, &str, QueuedPieces)>> = BTreeMap::new();
    for message in messages {
        match QueuedPieces::decode(message.body) {
            Ok(queued) => by_node.entry(queued.node.clone()).or_default().push((
                queued.sent_ms,
                message.id,
                queued,
            )),
            Err(err) => {
                tracing::error!(id = message.id, error = %err, "a queued log message cannot be read; it goes to the dead-letter queue");
                drained.redeliver.push(message.id.to_owned());
            }
        }
    }
    let stored: Vec<(Vec<String>, Result<usize, String>)> = stream::iter(by_node)
        .map(|(node, mut queued)| async move {
            queued.sort_by_key(|(sent_ms, ..)| *sent_ms);
            let ids = queued.iter().map(|(_, id, _)| (*id).to_owned()).collect();
            (ids, store_node(storage, &node, &queued).await)
        })
        .buffer_unordered(NODES_AT_ONCE)
        .collect()
        .await;
    for (ids, result) in stored {
        match result {
            Ok(refused) => {
                drained.nodes += 1;
                drained.refused += refused;
            }
            Err(reason) => {
                tracing::error!(%reason, messages = ids.len(), "a node's queued log pieces were not stored; they are delivered again");
                drained.redeliver.extend(ids);
            }
        }
    }
    drained
}

/// Stores one node's queued requests; returns how many pieces were refused.
async fn store_node(
    storage: &dyn Storage,
    node: &NodeLogs,
    queued: &[(u64, &str, QueuedPieces)],
) -> Result<usize, String> {
    let mut joined: Vec<(LogFileName, u64, Vec<u8>)> = Vec::new();
    let mut open: BTreeMap<LogFileName, usize> = BTreeMap::new();
    for (.., message) in queued {
        for piece in message.pieces().map_err(|err| err.to_string())? {
            let end_of_open = open
                .get(&piece.file)
                .and_then(|&at| joined.get(at))
                .map(|(_, start, bytes)| start.saturating_add(bytes.len() as u64));
            match open.get(&piece.file).copied() {
                Some(at) if end_of_open == Some(piece.offset) => {
                    if let Some((.., bytes)) = joined.get_mut(at) {
                        bytes.extend_from_slice(piece.bytes);
                    }
                }
                _ => {
                    open.insert(piece.file.clone(), joined.len());
                    joined.push((piece.file, piece.offset, piece.bytes.to_vec()));
                }
            }
        }
    }
    let pieces: Vec<ReadPiece<'_>> = joined
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
