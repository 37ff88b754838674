//! Gzip as Afterglow writes it: at the fastest level, where the point is fewer bytes to move
//! (log chunks in storage, answers on the wire) rather than the smallest file. Whole buffers
//! go through [`gzip`]; an answer that must stop before a compressed size is compressed as it is
//! built ([`Deflating`]) and framed around what is only known at its end ([`gzip_around`]). Raw
//! ingest objects stream their lines into their own encoder (see [`crate::raw::write`]).
//! What another party wrote is unpacked within a limit ([`gunzip_within`]).

use std::io::{Read as _, Write as _};

use flate2::read::GzDecoder;
use flate2::write::{DeflateEncoder, GzEncoder};
use flate2::{Compression, Crc};

/// `bytes` as one gzip member, at the fastest level: most of what a higher level would save,
/// for a fraction of its CPU.
pub fn gzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(bytes.len() / 6), Compression::fast());
    encoder.write_all(bytes)?;
    encoder.finish()
}

/// Why [`gunzip_within`] gave no bytes.
#[derive(Debug, thiserror::Error)]
pub enum GunzipError {
    /// Not gzip, or cut short.
    #[error("{0}")]
    Invalid(#[from] std::io::Error),
    /// More bytes than the limit.
    #[error("it unpacks past {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
}

/// `member` unpacked, if it unpacks to at most `limit` bytes. Never more than one byte past
/// the limit is inflated, so a few bytes that would unpack to gigabytes cost the limit.
pub fn gunzip_within(member: &[u8], limit: u64) -> Result<Vec<u8>, GunzipError> {
    let mut bytes = Vec::new();
    GzDecoder::new(member)
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(GunzipError::TooLarge { limit });
    }
    Ok(bytes)
}

/// The most bytes deflate writes for `n` bytes of input, the sync flush that ends them
/// included.
///
/// No input byte costs more than 9 bits: that is the longest fixed literal code, and a match
/// of 3 or more bytes costs at most 31 bits, never more than the literals it stands for; a
/// block's own codes are chosen because they cost less than the fixed ones, and a block that
/// would grow is stored (5 bytes of header). On top of that, a block's header and code tables
/// take at most 300 bytes; deflate ends a block of its own accord only after 16 KiB of input
/// or more (so a block for each 16 KiB, and one more); and the flush adds an empty 5-byte
/// block after up to 7 bits of padding.
pub fn deflated_at_most(n: usize) -> usize {
    n.saturating_add(n.div_ceil(8))
        .saturating_add((n / 16_384 + 1).saturating_mul(300))
        .saturating_add(6)
}

/// Text deflated as it is written (the fastest level, as [`gzip`]), for the middle of a gzip
/// member ([`gzip_around`]): its compressed size is known as it grows, so a caller can stop
/// before a limit.
///
/// The compressor holds back part of what it was given until it ends a block, so between
/// flushes the size is a bound ([`Self::at_most`]); [`Self::flush`] writes out what is held,
/// after which the bound is the size plus [`deflated_at_most`]`(0)`.
#[derive(Debug)]
pub struct Deflating {
    encoder: DeflateEncoder<Vec<u8>>,
    crc: Crc,
    /// Compressed bytes out by the last flush: everything written before it.
    flushed: usize,
    /// Bytes written since the last flush.
    unflushed: usize,
}

impl Default for Deflating {
    fn default() -> Self {
        Self {
            encoder: DeflateEncoder::new(Vec::new(), Compression::fast()),
            crc: Crc::new(),
            flushed: 0,
            unflushed: 0,
        }
    }
}

impl Deflating {
    /// Deflates `text` after what was written before.
    pub fn write(&mut self, text: &[u8]) -> std::io::Result<()> {
        self.encoder.write_all(text)?;
        self.crc.update(text);
        self.unflushed = self.unflushed.saturating_add(text.len());
        Ok(())
    }

    /// Writes out what the compressor holds (a sync flush: the output ends on a byte boundary,
    /// where more blocks may follow), so that the size is exact again. Does nothing when
    /// nothing was written since the last flush.
    pub fn flush(&mut self) -> std::io::Result<()> {
        if self.unflushed == 0 {
            return Ok(());
        }
        self.encoder.flush()?;
        self.flushed = self.encoder.get_ref().len();
        self.unflushed = 0;
        Ok(())
    }

    /// The most compressed bytes there will be once flushed, were `more` bytes written first.
    pub fn at_most(&self, more: usize) -> usize {
        self.flushed
            .saturating_add(deflated_at_most(self.unflushed.saturating_add(more)))
    }

    /// Flushed, its compressed bytes and the CRC of its text.
    fn into_parts(mut self) -> std::io::Result<(Vec<u8>, Crc)> {
        self.flush()?;
        // Taken rather than finished: finishing would add a last block, and more follows.
        let bytes = std::mem::take(self.encoder.get_mut());
        Ok((bytes, self.crc))
    }
}

/// The first bytes of a gzip member: no name, time or comment; the fastest level; no OS.
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 255];

/// What a gzip member adds around its deflated text: its header, and the CRC and length at
/// its end.
pub const GZIP_FRAME: usize = GZIP_HEADER.len() + 8;

/// One gzip member of `head`, the text of `middle` and `tail`, in that order, at most
/// [`GZIP_FRAME`] bytes more than `middle`'s [`Deflating::at_most`]`(0)` and
/// [`deflated_at_most`] of `head` and of `tail`.
///
/// `middle` is used as it was compressed: `head` and `tail` are deflated on their own and the
/// three joined, since deflate blocks may follow one another wherever a sync flush ended one,
/// and `middle`'s back-references never reach before its own first byte.
pub fn gzip_around(head: &[u8], middle: Deflating, tail: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut first = DeflateEncoder::new(Vec::new(), Compression::fast());
    first.write_all(head)?;
    // Flushed, not finished: the blocks that follow are not the last.
    let first = first.flush_finish()?;
    let (middle, middle_crc) = middle.into_parts()?;
    let mut last = DeflateEncoder::new(Vec::new(), Compression::fast());
    last.write_all(tail)?;
    let last = last.finish()?;

    let mut crc = Crc::new();
    crc.update(head);
    crc.combine(&middle_crc);
    crc.update(tail);
    let mut member = Vec::with_capacity(GZIP_FRAME + first.len() + middle.len() + last.len());
    member.extend_from_slice(&GZIP_HEADER);
    member.extend_from_slice(&first);
    member.extend_from_slice(&middle);
    member.extend_from_slice(&last);
    member.extend_from_slice(&crc.sum().to_le_bytes());
    // The length modulo 2^32, as gzip keeps it.
    member.extend_from_slice(&crc.amount().to_le_bytes());
    Ok(member)
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use flate2::read::GzDecoder;

    use super::*;

    /// `len` bytes of deterministic noise: deflate cannot shorten them.
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[0]
            })
            .collect()
    }

    /// Decoded as one gzip member (its CRC and length checked), with nothing after it.
    fn gunzip_one_member(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut decoder = flate2::bufread::GzDecoder::new(bytes);
        let mut text = Vec::new();
        decoder.read_to_end(&mut text)?;
        let mut rest = Vec::new();
        decoder.into_inner().read_to_end(&mut rest)?;
        assert!(rest.is_empty(), "{} bytes after the member", rest.len());
        Ok(text)
    }

    #[test]
    fn a_gzipped_buffer_reads_back_whole() -> std::io::Result<()> {
        for text in [String::new(), "{\"a\": 1}".repeat(10_000)] {
            let packed = super::gzip(text.as_bytes())?;
            let mut unpacked = String::new();
            GzDecoder::new(packed.as_slice()).read_to_string(&mut unpacked)?;
            assert_eq!(unpacked, text);
        }
        Ok(())
    }

    #[test]
    fn a_member_around_a_deflated_middle_reads_back_whole() -> std::io::Result<()> {
        let texts: [Vec<u8>; 4] = [
            Vec::new(),
            b"{\"a\": 1}".repeat(20_000),
            noise(3, 70_000),
            [noise(5, 3_000), b"the same words ".repeat(400)].concat(),
        ];
        for middle_text in &texts {
            let mut middle = Deflating::default();
            for (index, piece) in middle_text.chunks(999).enumerate() {
                middle.write(piece)?;
                if index % 7 == 3 {
                    middle.flush()?;
                }
            }
            let bound = middle.at_most(0);
            let (head, tail) = (b"{\"rows\": [".as_slice(), b"], \"more\": null}".as_slice());
            let member = gzip_around(head, middle, tail)?;
            assert!(
                member.len()
                    <= GZIP_FRAME
                        + bound
                        + deflated_at_most(head.len())
                        + deflated_at_most(tail.len()),
                "{} bytes",
                member.len()
            );
            assert_eq!(
                gunzip_one_member(&member)?,
                [head, middle_text.as_slice(), tail].concat()
            );
        }
        Ok(())
    }

    #[test]
    fn a_flush_never_passes_the_bound() -> std::io::Result<()> {
        // Noise (stored or fixed codes), repeats (long matches) and the two mixed, written in
        // pieces of several sizes between flushes.
        let texts: [Vec<u8>; 3] = [
            noise(7, 200_000),
            b"abc".repeat(100_000),
            noise(11, 100_000)
                .chunks(16)
                .flat_map(|chunk| [chunk, b"-repeated-".as_slice()].concat())
                .collect(),
        ];
        for text in &texts {
            for piece_len in [1, 40, 1_000, 50_000] {
                let mut deflating = Deflating::default();
                for piece in text.chunks(piece_len).take(40) {
                    let bound = deflating.at_most(piece.len());
                    deflating.write(piece)?;
                    deflating.flush()?;
                    let size = deflating.encoder.get_ref().len();
                    assert!(size <= bound, "{size} > {bound} in pieces of {piece_len}");
                }
            }
        }
        Ok(())
    }
}
