//! The raw stage: each accepted ingest request stored as one immutable object, the source of
//! truth every table is built from (and rebuilt from, by `afterglow rebuild`).
//!
//! - [`key`]: where a raw object lives, `raw/{cluster}/{yyyy}/{mm}/{dd}/{hh}/{ulid}.ndjson.gz`,
//!   and what its key tells (cluster, time accepted).
//! - [`write`]: a batch of events encoded as gzip NDJSON and stored, for ingest.
//! - [`read`]: an object read back and parsed, for compaction; lines that cannot be read are
//!   set aside (quarantined), never the whole object.
//! - [`list`]: every raw object in a store.
//!
//! It knows nothing of HTTP (ingest checks the POST) nor of tables (compaction builds them).

pub mod key;
pub mod list;
pub mod read;
pub mod write;
