//! Ray's cluster metadata (the Ray and Python versions the cluster ran, as the dashboard's
//! `api/v0/cluster_metadata` answers them), which the export does not carry: on the head node
//! the shipper reads it once per session and stores Ray's answer beside the node's logs, as the
//! one line of [`CLUSTER_METADATA_FILE`]. Ray's routes over the history answer it again; the
//! log listings leave the file out, since Ray's node has no such file.

use crate::frames::{Body, MAX_BODY_BYTES, Piece};
use crate::names::LogFileName;

/// The shipped file holding the head node's `api/v0/cluster_metadata` answer.
pub const CLUSTER_METADATA_FILE: &str = "afterglow-cluster-metadata.json";

/// The longest answer kept: Ray's is a few hundred bytes.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;

/// Why an answer is not stored.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// Not a JSON object with `data`: not the dashboard's answer.
    #[error("the dashboard's cluster metadata is not Ray's answer: {0}")]
    NotRays(String),
    /// Longer than [`MAX_METADATA_BYTES`].
    #[error("the dashboard's cluster metadata is {0} bytes, more than {MAX_METADATA_BYTES}")]
    TooLong(usize),
}

/// The framed body storing `answer` (the dashboard's response): one piece of
/// [`CLUSTER_METADATA_FILE`] at offset 0 holding the answer as one line, so a shipper that sends
/// it again (after a restart) sends the same bytes, which the store takes as a re-send.
pub fn metadata_body(answer: &[u8]) -> Result<Vec<u8>, MetadataError> {
    if answer.len() > MAX_METADATA_BYTES {
        return Err(MetadataError::TooLong(answer.len()));
    }
    let value: serde_json::Value =
        serde_json::from_slice(answer).map_err(|err| MetadataError::NotRays(err.to_string()))?;
    if !value.get("data").is_some_and(serde_json::Value::is_object) {
        return Err(MetadataError::NotRays("no `data` object".into()));
    }
    // One line whatever the dashboard's formatting, so the file's last line is the answer: in
    // JSON a line break can only be white space between tokens.
    let mut line: Vec<u8> = answer
        .iter()
        .map(|byte| match byte {
            b'\n' | b'\r' => b' ',
            other => *other,
        })
        .collect();
    line.push(b'\n');
    let file = LogFileName::new(CLUSTER_METADATA_FILE)
        .map_err(|err| MetadataError::NotRays(err.to_string()))?;
    let mut body = Body::new(MAX_BODY_BYTES);
    body.push(Piece {
        file: &file,
        offset: 0,
        bytes: &line,
    });
    Ok(body.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::read_body;

    #[test]
    fn rays_answer_is_one_line_at_the_start_of_the_file() -> Result<(), Box<dyn std::error::Error>>
    {
        let answer = b"{\"result\": true, \"msg\": \"\",\n \"data\": {\"rayVersion\": \"2.60.0\", \
            \"pythonVersion\": \"3.11.7\", \"rayInitCluster\": false}}";
        let body = metadata_body(answer)?;
        let pieces = read_body(&body)?;
        assert_eq!(pieces.len(), 1);
        let piece = pieces.first().ok_or("no piece")?;
        assert_eq!(
            (piece.file.as_str(), piece.offset),
            (CLUSTER_METADATA_FILE, 0)
        );
        assert_eq!(
            piece.bytes,
            b"{\"result\": true, \"msg\": \"\",  \"data\": {\"rayVersion\": \"2.60.0\", \
            \"pythonVersion\": \"3.11.7\", \"rayInitCluster\": false}}\n"
        );
        assert!(matches!(
            metadata_body(b"<html>"),
            Err(MetadataError::NotRays(_))
        ));
        Ok(())
    }
}
