//! Reading raw objects back, for compaction: gzip NDJSON, one Ray event per line, parsed on a
//! blocking thread. A line that cannot be read is set aside with its reason (quarantined); it
//! never costs the rest of the object.

use std::cell::RefCell;
use std::io::Read as _;
use std::sync::Arc;

use flate2::read::GzDecoder;
use tokio::sync::OwnedSemaphorePermit;

use super::key::raw_object_cluster;
use crate::event::RayEvent;
use crate::event::encoding::with_shared_ids;
use crate::keys::ClusterName;
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

/// Reads and parses one raw object. The parse runs on a blocking thread (it is CPU work) once
/// it has one of `turns` and then a permit of `parsers`: more parses at once than cores would
/// only share the cores, and take them from applying the events, which runs beside them. The
/// turn is returned with the object, for the caller to give back once it has applied its
/// events, so that objects are parsed only a few ahead of that (`Compactor::read_each`). The
/// fetch needs neither.
#[tracing::instrument(name = "read_raw", skip(storage, parsers, turns), fields(key = %key))]
pub async fn read_raw(
    storage: &dyn Storage,
    key: &ObjectKey,
    parsers: &tokio::sync::Semaphore,
    turns: &Arc<tokio::sync::Semaphore>,
) -> Result<(RawObject, Option<OwnedSemaphorePermit>), RawError> {
    let cluster = raw_object_cluster(key).ok_or_else(|| RawError::NotRaw(key.clone()))?;
    let stored = storage.get(key).await?;
    // Neither semaphore is ever closed; if one were, parsing without its permit is still
    // correct.
    let turn = Arc::clone(turns).acquire_owned().await.ok();
    let _parsing = parsers.acquire().await.ok();
    let key = key.clone();
    let parse_key = key.clone();
    let object = tokio::task::spawn_blocking(move || parse_raw(parse_key, cluster, &stored.body))
        .await
        .map_err(|err| RawError::Corrupt {
            key,
            source: std::io::Error::other(err.to_string()),
        })??;
    Ok((object, turn))
}

/// The largest body inflated in one piece: a gzip trailer states the size, and a corrupt one
/// must not make us allocate gigabytes.
const MAX_WHOLE_INFLATE: usize = 512 << 20;

/// Inflates a gzip body into `into`, returning its text. libdeflate inflates a whole buffer
/// much faster than a streaming decoder, and inflating is much of compaction's read time; the
/// size comes from the gzip trailer. Whatever it does not take in one piece (a body of
/// several gzip members, a trailer claiming more than [`MAX_WHOLE_INFLATE`], corrupt data)
/// goes through the streaming decoder, which decides what is read and what is an error.
fn inflate<'a>(body: &[u8], into: &'a mut Vec<u8>) -> std::io::Result<&'a str> {
    let stated = body
        .last_chunk::<4>()
        .map_or(0, |trailer| u32::from_le_bytes(*trailer) as usize);
    let mut whole = false;
    if stated <= MAX_WHOLE_INFLATE {
        // Not cleared first: the text is taken only when libdeflate wrote all `stated` bytes
        // (it checks the size and the CRC), so what the last body left is written over and
        // zeroing it would be wasted work.
        into.resize(stated, 0);
        whole = libdeflater::Decompressor::new().gzip_decompress(body, into) == Ok(stated);
    }
    if !whole {
        into.clear();
        GzDecoder::new(body).read_to_end(into)?;
    }
    std::str::from_utf8(into)
        .map_err(|err| std::io::Error::new(std::io::ErrorKind::InvalidData, err))
}

/// The largest inflated text a parsing thread keeps for the next object.
const KEPT_INFLATE: usize = 64 << 20;

thread_local! {
    /// Each parsing thread inflates every object into the same buffer: a fresh one per object
    /// would be memory the kernel has to fault in each time.
    static INFLATED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Parses the bytes of one raw object.
fn parse_raw(key: ObjectKey, cluster: ClusterName, body: &[u8]) -> Result<RawObject, RawError> {
    INFLATED.with_borrow_mut(|buffer| {
        let parsed = with_shared_ids(|| parse_text(key, cluster, body, buffer));
        if buffer.capacity() > KEPT_INFLATE {
            *buffer = Vec::new();
        }
        parsed
    })
}

/// Parses one raw object, inflating it into `buffer`.
fn parse_text(
    key: ObjectKey,
    cluster: ClusterName,
    body: &[u8],
    buffer: &mut Vec<u8>,
) -> Result<RawObject, RawError> {
    let text = inflate(body, buffer).map_err(|source| RawError::Corrupt {
        key: key.clone(),
        source,
    })?;
    let mut events = Vec::new();
    let mut quarantined = Vec::new();
    for (index, line) in lines(text).enumerate() {
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

/// The lines of `text`, as [`str::lines`] splits them (at `\n`, a `\r` before it dropped; no
/// empty line after a final `\n`), found by `memchr`, which searches faster than the standard
/// library on this hot path of every compaction run.
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = (!text.is_empty()).then_some(text);
    std::iter::from_fn(move || {
        let current = rest?;
        let Some(end) = memchr::memchr(b'\n', current.as_bytes()) else {
            rest = None;
            return Some(current);
        };
        // A newline is one byte, so both cuts are at character boundaries.
        let after = current.get(end + 1..).unwrap_or_default();
        rest = (!after.is_empty()).then_some(after);
        let line = current.get(..end).unwrap_or_default();
        Some(line.strip_suffix('\r').unwrap_or(line))
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use flate2::Compression;
    use flate2::write::GzEncoder;

    use super::*;

    fn gzip(text: &str) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
        encoder
            .write_all(text.as_bytes())
            .expect("writes to a vector");
        encoder.finish().expect("writes to a vector")
    }

    fn streamed(body: &[u8]) -> std::io::Result<String> {
        let mut text = String::new();
        GzDecoder::new(body).read_to_string(&mut text)?;
        Ok(text)
    }

    #[test]
    fn lines_are_split_as_the_standard_library_splits_them() {
        let texts = [
            "",
            "\n",
            "\n\n",
            "a",
            "a\n",
            "a\nb",
            "a\r\nb\r\n",
            "a\r",
            "\r",
            "a\r\r\n",
            "\n\r",
            "a\rb\n",
            "\r\n\r\n",
            "é\n\u{1F600}\r\n\n x \n",
            "{\"a\":1}\n  \n{\"b\":2}",
        ];
        for text in texts {
            assert_eq!(
                lines(text).collect::<Vec<_>>(),
                text.lines().collect::<Vec<_>>(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn a_body_is_inflated_whole() {
        let text = "{\"eventId\":\"a\"}\n".repeat(1000);
        assert_eq!(
            inflate(&gzip(&text), &mut Vec::new()).expect("inflates"),
            text
        );
    }

    #[test]
    fn a_reused_buffer_holds_only_the_latest_body() {
        let mut buffer = Vec::new();
        let long = "a long line of text\n".repeat(100);
        assert_eq!(inflate(&gzip(&long), &mut buffer).expect("inflates"), long);
        assert_eq!(
            inflate(&gzip("short\n"), &mut buffer).expect("inflates"),
            "short\n"
        );
        // The same through the streaming decoder (two members).
        inflate(&gzip(&long), &mut buffer).expect("inflates");
        let mut body = gzip("first, the longer member\n");
        body.extend(gzip("second\n"));
        assert_eq!(
            inflate(&body, &mut buffer).expect("inflates"),
            "first, the longer member\n"
        );
    }

    #[test]
    fn a_body_of_two_members_reads_as_the_streaming_decoder_reads_it() {
        // The trailer states the last member's size, which is not the whole text's: the whole
        // inflate is refused and the streaming decoder decides.
        let mut body = gzip("first member, longer than the second\n");
        body.extend(gzip("second\n"));
        let mut buffer = Vec::new();
        let whole = inflate(&body, &mut buffer).expect("inflates");
        assert_eq!(whole, streamed(&body).expect("inflates"));
        assert_eq!(whole, "first member, longer than the second\n");
    }

    #[test]
    fn a_trailer_claiming_gigabytes_is_an_error_not_an_allocation() {
        let mut body = gzip("short\n");
        let size = body.len();
        body[size - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(u32::MAX as usize > MAX_WHOLE_INFLATE);
        let err = inflate(&body, &mut Vec::new()).expect_err("the stated size is wrong");
        assert_eq!(
            err.to_string(),
            streamed(&body).expect_err("the same").to_string()
        );
    }

    #[test]
    fn corrupt_data_and_text_that_is_not_utf8_are_errors() {
        let mut body = gzip(&"x".repeat(4096));
        body[20] ^= 0xff;
        assert!(inflate(&body, &mut Vec::new()).is_err());
        let mut latin1 = GzEncoder::new(Vec::new(), Compression::default());
        latin1.write_all(b"caf\xe9\n").expect("writes to a vector");
        let body = latin1.finish().expect("writes to a vector");
        assert_eq!(
            inflate(&body, &mut Vec::new())
                .expect_err("not UTF-8")
                .kind(),
            std::io::ErrorKind::InvalidData
        );
    }
}
