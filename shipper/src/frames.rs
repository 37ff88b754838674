//! The body of one log request (`POST /v1/logs/{cluster}?session=…&node_id=…`): every piece a
//! node sends in one interval, framed, and the answer the store gives for each piece.
//!
//! A piece is a header line, `{"file":NAME,"offset":O,"len":L}` and `\n`, followed by exactly `L`
//! bytes of the file from offset `O`. The bytes are raw (a log line may hold anything), so the
//! length, not a delimiter, ends them. A body is pieces back to back and nothing else.

use serde::{Deserialize, Serialize};

use crate::names::LogFileName;

/// Largest request body: API Gateway base64-encodes a binary body, and Lambda's synchronous
/// payload limit is 6 MB.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Smallest body a [`Body`] is made with: room for the longest header line and more.
pub const MIN_BODY_BYTES: usize = 1024;

/// Most pieces one body may hold.
pub const MAX_PIECES: usize = 10_000;

/// Longest header line: a file name is at most 255 bytes, the rest is numbers.
const MAX_HEADER_BYTES: usize = 1024;

/// One piece of a body: bytes of `file` from `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece<'a> {
    /// The file's name in the session's `logs/`.
    pub file: &'a LogFileName,
    /// Where `bytes` start in the (stored) file.
    pub offset: u64,
    /// The bytes.
    pub bytes: &'a [u8],
}

#[derive(Serialize, Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    file: &'a str,
    offset: u64,
    len: usize,
}

/// A body being filled: pieces are appended until it holds [`Body::room`] no more.
#[derive(Debug)]
pub struct Body {
    bytes: Vec<u8>,
    pieces: usize,
    limit: usize,
}

impl Body {
    /// An empty body that will hold at most `limit` bytes (headers included), kept between
    /// [`MIN_BODY_BYTES`] and [`MAX_BODY_BYTES`].
    pub fn new(limit: usize) -> Self {
        Self {
            bytes: Vec::new(),
            pieces: 0,
            limit: limit.clamp(MIN_BODY_BYTES, MAX_BODY_BYTES),
        }
    }

    /// How many bytes of `file` a piece appended now may carry (0 when the body is full).
    pub fn room(&self, file: &LogFileName) -> usize {
        if self.pieces >= MAX_PIECES {
            return 0;
        }
        // The header for the longest offset and length, so what `room` allows always fits.
        let header = header_line(file, u64::MAX, usize::MAX).len();
        self.limit.saturating_sub(self.bytes.len() + header)
    }

    /// Appends a piece. The caller keeps `bytes.len()` within [`Body::room`]; a longer piece is
    /// still framed correctly and only makes the body exceed its limit.
    pub fn push(&mut self, piece: Piece<'_>) {
        self.bytes
            .extend_from_slice(&header_line(piece.file, piece.offset, piece.bytes.len()));
        self.bytes.extend_from_slice(piece.bytes);
        self.pieces += 1;
    }

    /// Pieces held.
    pub fn pieces(&self) -> usize {
        self.pieces
    }

    /// Whether no piece was appended.
    pub fn is_empty(&self) -> bool {
        self.pieces == 0
    }

    /// The framed bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

fn header_line(file: &LogFileName, offset: u64, len: usize) -> Vec<u8> {
    let header = Header {
        file: file.as_str(),
        offset,
        len,
    };
    // A struct of a string and two numbers always serializes.
    let mut line = serde_json::to_vec(&header).unwrap_or_default();
    line.push(b'\n');
    line
}

/// A piece read from a body, owning its checked file name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadPiece<'a> {
    /// The file's name.
    pub file: LogFileName,
    /// Where `bytes` start in the file.
    pub offset: u64,
    /// The bytes.
    pub bytes: &'a [u8],
}

/// Why a body could not be read. Nothing of such a body is stored.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A header line is missing its newline, too long, or not the header.
    #[error(
        "piece {index}: the header line at byte {at} is not {{\"file\",\"offset\",\"len\"}}: {reason}"
    )]
    Header {
        /// The piece's position in the body.
        index: usize,
        /// Where its header starts.
        at: usize,
        /// What is wrong.
        reason: String,
    },
    /// The file name cannot be stored.
    #[error("piece {index}: {reason}")]
    FileName {
        /// The piece's position in the body.
        index: usize,
        /// Why the name is refused.
        reason: String,
    },
    /// The body ends before the piece's bytes do.
    #[error("piece {index} says {len} bytes, but the body ends after {left}")]
    Truncated {
        /// The piece's position in the body.
        index: usize,
        /// The length its header gives.
        len: usize,
        /// What is left of the body.
        left: usize,
    },
    /// More pieces than [`MAX_PIECES`].
    #[error("a body holds at most {MAX_PIECES} pieces")]
    TooManyPieces,
}

/// Reads every piece of `body`, checking each header before trusting its length.
pub fn read_body(body: &[u8]) -> Result<Vec<ReadPiece<'_>>, FrameError> {
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let index = pieces.len();
        if index >= MAX_PIECES {
            return Err(FrameError::TooManyPieces);
        }
        let rest = body.get(at..).unwrap_or_default();
        let header_error = |reason: String| FrameError::Header { index, at, reason };
        let window = rest.get(..MAX_HEADER_BYTES.min(rest.len())).unwrap_or(rest);
        let newline = window
            .iter()
            .position(|byte| *byte == b'\n')
            .ok_or_else(|| {
                header_error(format!("no newline in its first {} bytes", window.len()))
            })?;
        let (line, after) = rest.split_at(newline);
        let header: Header<'_> =
            serde_json::from_slice(line).map_err(|err| header_error(err.to_string()))?;
        let file = LogFileName::new(header.file).map_err(|err| FrameError::FileName {
            index,
            reason: err.to_string(),
        })?;
        let after = after.get(1..).unwrap_or_default();
        let bytes = after.get(..header.len).ok_or(FrameError::Truncated {
            index,
            len: header.len,
            left: after.len(),
        })?;
        pieces.push(ReadPiece {
            file,
            offset: header.offset,
            bytes,
        });
        at += newline + 1 + header.len;
    }
    Ok(pieces)
}

/// What the store did with one piece, in the body's order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceAnswer {
    /// The piece's file.
    pub file: String,
    /// The piece's offset.
    pub offset: u64,
    /// What became of it.
    #[serde(flatten)]
    pub outcome: PieceOutcome,
}

/// What became of a piece.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PieceOutcome {
    /// Durable: its bytes are stored, or were already, equal.
    Stored {
        /// Bytes newly stored (0 for a complete re-send).
        stored: usize,
        /// The offset just past the piece: where the shipper continues.
        end: u64,
    },
    /// Durable in the endpoint's queue, stored within its batch window (a minute): the shipper
    /// continues at `end` as for a stored piece. Only a piece that overlaps no stored bytes is
    /// queued; its overlaps with other queued pieces are checked when they are stored.
    Queued {
        /// The offset just past the piece: where the shipper continues.
        end: u64,
    },
    /// Refused for good: its bytes differ from the ones stored at the same offsets (the file
    /// was rewritten under the same name). What preceded the difference is stored.
    Refused {
        /// Why, for the shipper's log.
        reason: String,
    },
}

/// The answer to a body: one [`PieceAnswer`] per piece.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BodyAnswer {
    /// In the body's order.
    pub pieces: Vec<PieceAnswer>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_reads_back_as_written_whatever_the_bytes() -> Result<(), Box<dyn std::error::Error>> {
        let (out, err) = (LogFileName::new("a.out")?, LogFileName::new("a.err")?);
        let mut body = Body::new(MAX_BODY_BYTES);
        body.push(Piece {
            file: &out,
            offset: 7,
            bytes: b"line\n{\"file\":\"x\"}\n\0\xff",
        });
        body.push(Piece {
            file: &err,
            offset: 0,
            bytes: b"",
        });
        let bytes = body.into_bytes();
        let read = read_body(&bytes)?;
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].file, out);
        assert_eq!(read[0].offset, 7);
        assert_eq!(read[0].bytes, b"line\n{\"file\":\"x\"}\n\0\xff");
        assert_eq!((read[1].offset, read[1].bytes), (0, &b""[..]));
        Ok(())
    }

    #[test]
    fn room_leaves_space_for_the_header() -> Result<(), Box<dyn std::error::Error>> {
        let file = LogFileName::new("raylet.out")?;
        let mut body = Body::new(MIN_BODY_BYTES);
        let room = body.room(&file);
        assert!(room > 0 && room < MIN_BODY_BYTES);
        body.push(Piece {
            file: &file,
            offset: u64::MAX / 2,
            bytes: &vec![b'x'; room],
        });
        assert!(body.into_bytes().len() <= MIN_BODY_BYTES);
        Ok(())
    }

    #[test]
    fn a_damaged_body_is_refused_not_guessed() -> Result<(), Box<dyn std::error::Error>> {
        let file = LogFileName::new("raylet.out")?;
        let mut body = Body::new(MAX_BODY_BYTES);
        body.push(Piece {
            file: &file,
            offset: 0,
            bytes: b"0123456789",
        });
        let bytes = body.into_bytes();
        let short = bytes.get(..bytes.len() - 1).ok_or("empty")?;
        assert!(matches!(
            read_body(short),
            Err(FrameError::Truncated {
                len: 10,
                left: 9,
                ..
            })
        ));
        assert!(matches!(
            read_body(b"no header here"),
            Err(FrameError::Header { index: 0, .. })
        ));
        assert!(matches!(
            read_body(b"{\"file\":\"../x\",\"offset\":0,\"len\":0}\n"),
            Err(FrameError::FileName { index: 0, .. })
        ));
        let mut huge = b"{\"file\":\"a\",\"offset\":0,\"len\":0}".to_vec();
        huge.extend(std::iter::repeat_n(b' ', MAX_HEADER_BYTES));
        huge.push(b'\n');
        assert!(matches!(read_body(&huge), Err(FrameError::Header { .. })));
        Ok(())
    }

    #[test]
    fn answers_say_what_became_of_each_piece() -> Result<(), serde_json::Error> {
        let answer = BodyAnswer {
            pieces: vec![
                PieceAnswer {
                    file: "a.out".into(),
                    offset: 0,
                    outcome: PieceOutcome::Stored { stored: 3, end: 3 },
                },
                PieceAnswer {
                    file: "b.out".into(),
                    offset: 5,
                    outcome: PieceOutcome::Refused {
                        reason: "differs".into(),
                    },
                },
            ],
        };
        let text = serde_json::to_string(&answer)?;
        assert_eq!(
            text,
            r#"{"pieces":[{"file":"a.out","offset":0,"outcome":"stored","stored":3,"end":3},{"file":"b.out","offset":5,"outcome":"refused","reason":"differs"}]}"#
        );
        assert_eq!(serde_json::from_str::<BodyAnswer>(&text)?, answer);
        Ok(())
    }
}
