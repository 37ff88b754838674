//! Gzip as Afterglow writes it: whole buffers at the fastest level, where the point is
//! fewer bytes to move (log chunks in storage, answers on the wire) rather than the smallest
//! file. Raw ingest objects stream their lines into their own encoder (see [`crate::raw::write`]).

use std::io::Write as _;

use flate2::Compression;
use flate2::write::GzEncoder;

/// `bytes` as one gzip member, at the fastest level: most of what a higher level would save,
/// for a fraction of its CPU.
pub fn gzip(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(bytes.len() / 6), Compression::fast());
    encoder.write_all(bytes)?;
    encoder.finish()
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use flate2::read::GzDecoder;

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
}
