//! One log request as a queue message: whose pieces they are, when they were sent, and the
//! framed pieces themselves, gzip-compressed and base64-encoded (a message body is text).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

use crate::gzip::gunzip_within;
use crate::keys::{ClusterName, NodeId, NodeLogs, SessionName};
use crate::logs::frames::{Body, MAX_BODY_BYTES, Piece, ReadPiece, read_body};

/// SQS's largest message body. A request whose message would be larger is stored at once.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// Why a message could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    /// Not the JSON this module writes.
    #[error("not a log message: {0}")]
    NotAMessage(#[source] serde_json::Error),
    /// The node it names is not a valid one.
    #[error("the log message names no valid node: {0}")]
    Node(String),
    /// The pieces are not base64, gzip, or framing, or unpack past [`MAX_BODY_BYTES`].
    #[error("the log message's pieces cannot be read: {0}")]
    Pieces(String),
}

/// One request's pieces, as queued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedPieces {
    /// Whose logs.
    pub node: NodeLogs,
    /// When ingest queued them (milliseconds since the epoch): pieces of one node are stored in
    /// this order, so of two that differ, the first sent is the one kept.
    pub sent_ms: u64,
    /// The pieces, framed as the shipper frames a body.
    pub body: Vec<u8>,
}

/// The message as JSON.
#[derive(Serialize, Deserialize)]
struct Wire<'a> {
    cluster: &'a str,
    session: &'a str,
    node_id: &'a str,
    sent_ms: u64,
    /// base64 of the gzip-compressed framed body.
    pieces: &'a str,
}

impl QueuedPieces {
    /// `pieces` of `node`, framed, sent at `sent_ms`.
    pub fn new(node: NodeLogs, sent_ms: u64, pieces: &[ReadPiece<'_>]) -> Self {
        let mut body = Body::new(MAX_BODY_BYTES);
        for piece in pieces {
            body.push(Piece {
                file: &piece.file,
                offset: piece.offset,
                bytes: piece.bytes,
            });
        }
        Self {
            node,
            sent_ms,
            body: body.into_bytes(),
        }
    }

    /// The pieces, in the order sent.
    pub fn pieces(&self) -> Result<Vec<ReadPiece<'_>>, MessageError> {
        read_body(&self.body).map_err(|err| MessageError::Pieces(err.to_string()))
    }

    /// The message body.
    pub fn encode(&self) -> std::io::Result<String> {
        let packed = STANDARD.encode(crate::gzip::gzip(&self.body)?);
        let wire = Wire {
            cluster: self.node.cluster.as_str(),
            session: self.node.session.as_str(),
            node_id: self.node.node_id.as_str(),
            sent_ms: self.sent_ms,
            pieces: &packed,
        };
        serde_json::to_string(&wire).map_err(std::io::Error::other)
    }

    /// Reads a message body back, unpacking at most [`MAX_BODY_BYTES`] of pieces.
    pub fn decode(text: &str) -> Result<Self, MessageError> {
        Packed::read(text)?.unpack()
    }
}

/// A message read but not unpacked: a batch's messages are grouped by node and unpacked a few
/// nodes at a time, so a batch of compressible output is never held unpacked whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packed {
    /// Whose logs.
    pub node: NodeLogs,
    /// When ingest queued them (milliseconds since the epoch).
    pub sent_ms: u64,
    /// The framed pieces, gzip-compressed.
    compressed: Vec<u8>,
}

impl Packed {
    /// Reads a message body's node and time, and its pieces still compressed.
    pub fn read(text: &str) -> Result<Self, MessageError> {
        let wire: Wire<'_> = serde_json::from_str(text).map_err(MessageError::NotAMessage)?;
        let node = NodeLogs {
            cluster: ClusterName::new(wire.cluster)
                .map_err(|err| MessageError::Node(err.to_string()))?,
            session: SessionName::new(wire.session)
                .map_err(|err| MessageError::Node(err.to_string()))?,
            node_id: NodeId::new(wire.node_id)
                .map_err(|err| MessageError::Node(err.to_string()))?,
        };
        let compressed = STANDARD
            .decode(wire.pieces)
            .map_err(|err| MessageError::Pieces(err.to_string()))?;
        Ok(Self {
            node,
            sent_ms: wire.sent_ms,
            compressed,
        })
    }

    /// The pieces, unpacked: at most [`MAX_BODY_BYTES`].
    pub fn unpack(self) -> Result<QueuedPieces, MessageError> {
        let body = gunzip_within(&self.compressed, MAX_BODY_BYTES as u64)
            .map_err(|err| MessageError::Pieces(err.to_string()))?;
        Ok(QueuedPieces {
            node: self.node,
            sent_ms: self.sent_ms,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::LogFileName;

    type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

    fn node() -> TestResult<NodeLogs> {
        Ok(NodeLogs {
            cluster: ClusterName::new("prod")?,
            session: SessionName::new("session_2026-12-01_00-00-00_000000_1")?,
            node_id: NodeId::new(&"a".repeat(56))?,
        })
    }

    #[test]
    fn a_message_reads_back_as_the_pieces_queued() -> TestResult {
        let (out, err) = (
            LogFileName::new("worker-1.out")?,
            LogFileName::new("worker-1.err")?,
        );
        let binary: Vec<u8> = (0..=255).collect();
        let pieces = [
            ReadPiece {
                file: out.clone(),
                offset: 7,
                bytes: b"line one\n",
            },
            ReadPiece {
                file: err.clone(),
                offset: 0,
                bytes: &binary,
            },
            ReadPiece {
                file: out,
                offset: 16,
                bytes: b"",
            },
        ];
        let queued = QueuedPieces::new(node()?, 1_764_547_200_000, &pieces);
        let text = queued.encode()?;
        let back = QueuedPieces::decode(&text)?;
        assert_eq!(back, queued);
        let read = back.pieces()?;
        assert_eq!(read.len(), 3);
        for (read, sent) in read.iter().zip(&pieces) {
            assert_eq!(
                (&read.file, read.offset, read.bytes),
                (&sent.file, sent.offset, sent.bytes)
            );
        }
        Ok(())
    }

    #[test]
    fn bad_messages_are_named_not_stored() -> TestResult {
        let good = QueuedPieces::new(node()?, 1, &[]).encode()?;
        let mut wire: serde_json::Value = serde_json::from_str(&good)?;
        assert!(matches!(
            QueuedPieces::decode("{}"),
            Err(MessageError::NotAMessage(_))
        ));
        wire["node_id"] = "../etc".into();
        assert!(matches!(
            QueuedPieces::decode(&wire.to_string()),
            Err(MessageError::Node(_))
        ));
        // A gzip bomb: a few KB that unpack past the body limit.
        let bomb = crate::gzip::gzip(&vec![b'x'; MAX_BODY_BYTES + 1])?;
        let mut wire: serde_json::Value = serde_json::from_str(&good)?;
        wire["pieces"] = STANDARD.encode(bomb).into();
        let Err(MessageError::Pieces(reason)) = QueuedPieces::decode(&wire.to_string()) else {
            return Err("a body past the limit was read".into());
        };
        assert!(reason.contains("unpacks past"), "{reason}");
        Ok(())
    }
}
