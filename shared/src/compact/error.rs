//! [`CompactError`]: why a compaction run, or a session of it, failed.

use crate::raw::read::RawError;
use crate::storage::{InvalidKey, StorageError};
use crate::tables::TableError;
use crate::tables::manifest::ManifestError;

/// Why a compaction run failed. Raw objects stay the source of truth: a failed run can always
/// be retried, and nothing it half-wrote is ever referenced by a manifest.
#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    /// A raw object could not be read.
    #[error(transparent)]
    Raw(#[from] RawError),
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A manifest could not be read or written.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// Parquet could not be written or read.
    #[error(transparent)]
    Table(#[from] TableError),
    /// A key could not be formed.
    #[error(transparent)]
    Key(#[from] InvalidKey),
    /// Local scratch files failed.
    #[error("scratch directory: {0}")]
    Scratch(#[from] std::io::Error),
    /// Other compactions kept winning the manifest race.
    #[error("gave up on the manifest of {cluster}/{session} after {attempts} lost races")]
    Contended {
        /// Cluster.
        cluster: String,
        /// Session.
        session: String,
        /// Races lost.
        attempts: usize,
    },
    /// The blocking DuckDB task panicked or was cancelled.
    #[error("compaction worker failed: {0}")]
    Worker(String),
    /// Raw objects the tables were built from are gone, so a rebuild would drop history.
    #[error(
        "the tables of cluster {cluster} were built from raw objects since {compacted_from_ms} \
         (ms since the epoch, ULID time), but the oldest stored one is {} (expired by the raw \
         retention?): rebuilding would drop that history",
        .oldest_stored_ms.map_or_else(|| "none".to_owned(), |ms| ms.to_string())
    )]
    RawHistoryGone {
        /// The cluster.
        cluster: String,
        /// ULID time of the oldest raw object ever compacted for it.
        compacted_from_ms: u64,
        /// ULID time of the oldest raw object stored now.
        oldest_stored_ms: Option<u64>,
    },
}
