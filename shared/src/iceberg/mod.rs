//! The published tables (see [`crate::tables::published`]) as Apache Iceberg v2 tables over the
//! files compaction wrote, so that any Iceberg engine (Athena, Spark, Trino, PyIceberg, DuckDB,
//! Ray Data) reads the whole history as our API does.
//!
//! Our manifests stay the truth; Iceberg metadata is a projection of them, made again after
//! every change (`sync`). Every data file is registered in place, read by the field ids it was
//! written with (or by name, through the table's name mapping, where an older file has none).
//! Each session is one partition `(cluster, session_name)` with its own manifests, named by the
//! version of our manifest they reflect: a sync rewrites only the sessions that changed, and
//! finds what the current snapshot reflects by reading its manifest list. A delta's deletion
//! vector becomes position-delete files (`position_deletes`).
//!
//! - `schema`: a table's Iceberg schema, partition spec and name mapping.
//! - `avro`: manifests and manifest lists.
//! - `column_stats`: a data file's column statistics, from its Parquet footer.
//! - `position_deletes`: deletion vectors as position-delete files.
//! - `metadata`: the table metadata document and its snapshots.
//! - `sync`: the snapshot producer.
//! - `glue`: the tables in the AWS Glue Data Catalog.
//! - `publish`: each table synced, then pointed at in the catalog.
//! - `retired`: the Iceberg files a commit stopped naming, deleted after a grace period.
//! - `sync_queue`: the requests the compact function sends the catalog-sync function.

mod avro;
mod column_stats;
mod glue;
mod metadata;
mod position_deletes;
mod publish;
mod retired;
mod schema;
mod sessions;
mod sync;
mod sync_queue;

pub use self::glue::{GlueCatalog, Pointed};
pub use self::metadata::{PRODUCER_KEY, RETIRED_FILE_GRACE, SNAPSHOT_RETENTION_MS, TableMetadata};
pub use self::publish::{Cataloged, publish};
pub use self::retired::delete_retired;
pub use self::schema::TableSchema;
pub use self::sessions::Reads;
pub use self::sync::{Published, sync_table, sync_tables};
pub use self::sync_queue::{SyncQueue, SyncRequest};

use crate::keys;
use crate::storage::{InvalidKey, Storage, StorageError};
use crate::tables::manifest::ManifestError;

/// Where `table`'s newest metadata version is, as a reader given a metadata file opens it:
/// the version the hint names (the newest, unless a commit was cut short just before writing
/// it).
pub async fn metadata_location(storage: &dyn Storage, table: &str) -> Result<String, IcebergError> {
    let hint = storage.get(&keys::iceberg_version_hint_key(table)?).await?;
    let version: u64 = std::str::from_utf8(&hint.body)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| {
            IcebergError::Unreadable(format!("the version hint of {table} is not a number"))
        })?;
    Ok(storage.uri(&keys::iceberg_metadata_key(table, version)?))
}

/// Why a table could not be published.
#[derive(Debug, thiserror::Error)]
pub enum IcebergError {
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A manifest or the catalog could not be read.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// A key could not be formed.
    #[error(transparent)]
    Key(#[from] InvalidKey),
    /// An Avro file could not be written or read.
    #[error("Iceberg manifest: {0}")]
    Avro(#[from] apache_avro::Error),
    /// A Parquet file could not be written or read.
    #[error("Iceberg position deletes: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Arrow refused a batch.
    #[error("Iceberg position deletes: {0}")]
    Arrow(#[from] duckdb::arrow::error::ArrowError),
    /// A metadata document could not be written or read.
    #[error("Iceberg table metadata: {0}")]
    Json(#[from] serde_json::Error),
    /// One of our files is not what its manifest says.
    #[error("{0}")]
    Unreadable(String),
    /// A table cannot be described in Iceberg's terms.
    #[error("{0}")]
    Unpublishable(String),
    /// The table's current snapshot was committed by something else (an `OPTIMIZE`, a
    /// compaction job): it is reported, never overwritten.
    #[error(
        "{0}; Afterglow publishes its tables from its own manifests and does not overwrite \
         another writer's snapshot: roll the table back to Afterglow's last snapshot, or drop \
         its metadata to have it published again"
    )]
    Foreign(String),
    /// The Glue Data Catalog refused or could not be reached.
    #[error("Glue Data Catalog: {0}")]
    Catalog(String),
    /// Every attempt to commit lost a race with another commit.
    #[error("table {table}: {races} commits in a row lost a race with another; try again")]
    Contended {
        /// The table.
        table: String,
        /// Attempts made.
        races: usize,
    },
}
