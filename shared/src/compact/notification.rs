//! Which raw objects a notification names. S3 puts object keys in notifications
//! form-URL-encoded (`+` for a space, `%XX` for other bytes); they are decoded here, and keys
//! that are not raw ingest objects are set aside rather than failing the batch.

use crate::raw::key::{RAW_PREFIX, RAW_SUFFIX};
use crate::storage::ObjectKey;

/// Decodes an S3 event key (`application/x-www-form-urlencoded`). `None` if the escapes are
/// malformed or the bytes are not UTF-8.
pub fn decode_s3_key(encoded: &str) -> Option<String> {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while let Some(&byte) = bytes.get(index) {
        match byte {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(index + 1..index + 3)?;
                let text = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(text, 16).ok()?);
                index += 2;
            }
            other => out.push(other),
        }
        index += 1;
    }
    String::from_utf8(out).ok()
}

/// A notified key, checked to be a raw ingest object. A store prefix (`AFTERGLOW_PREFIX`) in
/// front of `raw/` is removed.
pub fn raw_key_from_notification(encoded: &str, prefix: &str) -> Result<ObjectKey, String> {
    let decoded = decode_s3_key(encoded).ok_or_else(|| format!("undecodable key {encoded:?}"))?;
    let prefix = prefix.trim_matches('/');
    let relative = if prefix.is_empty() {
        decoded.as_str()
    } else {
        decoded
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('/'))
            .ok_or_else(|| format!("key {decoded:?} is outside prefix {prefix:?}"))?
    };
    if !relative.starts_with(RAW_PREFIX) || !relative.ends_with(RAW_SUFFIX) {
        return Err(format!("key {decoded:?} is not a raw ingest object"));
    }
    ObjectKey::new(relative).map_err(|err| err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_form_url_encoding() {
        assert_eq!(
            decode_s3_key("raw/a%3Db/x+y.ndjson.gz").as_deref(),
            Some("raw/a=b/x y.ndjson.gz")
        );
        assert_eq!(decode_s3_key("plain/key").as_deref(), Some("plain/key"));
        assert_eq!(decode_s3_key("%E2%9C%93").as_deref(), Some("✓"));
        assert_eq!(decode_s3_key("bad%2"), None);
        assert_eq!(decode_s3_key("bad%zz"), None);
        assert_eq!(decode_s3_key("%FF"), None);
    }

    #[test]
    fn accepts_only_raw_objects_under_the_prefix() {
        let key = "raw/prod/2026/11/22/06/01JD0000000000000000000000.ndjson.gz";
        assert_eq!(
            raw_key_from_notification(key, "").map(|k| k.to_string()),
            Ok(key.to_owned())
        );
        assert_eq!(
            raw_key_from_notification(&format!("team%2Da/{key}"), "team-a").map(|k| k.to_string()),
            Ok(key.to_owned())
        );
        assert!(raw_key_from_notification(key, "team-a").is_err());
        assert!(raw_key_from_notification("tables/x.parquet", "").is_err());
        assert!(raw_key_from_notification("raw/../x.ndjson.gz", "").is_err());
    }
}
