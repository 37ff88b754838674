//! The tables compaction writes and queries read, and the commit protocol both sides share.
//!
//! Each table module owns its schema and the mapping between rows and the merge model:
//! [`task_attempts`] (one row per task attempt), [`entities`] (jobs, actors, nodes, workers,
//! placement groups), and beside each `task_attempts` file its [`rollup`] (counts for the
//! dashboard's aggregates), [`key_index`] (where each task's rows are) and [`report_times`]
//! (status times by reference). [`newest`] is the log-structured read over a table's base and
//! delta files; [`task_block`] reads one task's rows from a block its key index names;
//! [`stored_keys`] is where compaction finds the stored versions of the attempts it merges.
//! [`published`] names the tables as other engines and `afterglow sql` read them.
//! [`manifest`] and [`catalog`] are the commit protocol (compaction replaces them
//! conditionally, queries read them; docs/architecture.md, "The commit protocol").
//!
//! Most files are written with the parquet crate from Arrow columns (`parquet`: the Parquet
//! mechanics); DuckDB reads every file, and writes the rest (deletion vectors, entity tables,
//! and a fold's base when the interleave declines its files). [`open_duckdb`] is the one way
//! compaction and queries open DuckDB.

pub mod catalog;
pub mod cluster_rollup;
pub mod columns;
pub mod entities;
pub mod key_index;
pub mod manifest;
pub mod newest;
pub(crate) mod parquet;
pub mod published;
pub mod report_times;
pub mod rollup;
pub mod stored_keys;
pub mod task_attempts;
pub mod task_block;

use std::path::PathBuf;

/// Why a table file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// DuckDB failed.
    #[error("DuckDB: {0}")]
    DuckDb(#[from] duckdb::Error),
    /// A stored row is not one this build wrote.
    #[error("corrupt task_attempts row: {0}")]
    Corrupt(String),
    /// A file could not be written by the parquet crate (a delta, a rollup, a key index or a
    /// fold's base; see [`task_attempts::write_delta`]).
    #[error("writing {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: ::parquet::errors::ParquetError,
    },
    /// A file could not be read by the parquet crate (a fold's inputs, see
    /// [`crate::compact::fold`]).
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: ::parquet::errors::ParquetError,
    },
    /// Arrow refused rows this build built or read: a column missing, or not of the type
    /// expected.
    #[error("Arrow: {0}")]
    Encode(#[from] duckdb::arrow::error::ArrowError),
}

/// An in-memory DuckDB with nothing downloaded or auto-loaded, keeping the Parquet footers it
/// has parsed: the one way compaction and queries open it.
pub fn open_duckdb() -> Result<duckdb::Connection, TableError> {
    // A request reads the same files in several statements (a page's bound, then its rows),
    // and without the cache each statement parses every footer again: a large base's holds
    // statistics for dozens of row groups of ~75 columns. Our files never change under a name, and
    // DuckDB checks a cached footer against the file's modification time anyway.
    // Global, for the connections queries clone from this one; set after opening, as it is
    // the Parquet extension's, which loads after the database's configuration.
    let config = duckdb::Config::default().enable_autoload_extension(false)?;
    let connection = duckdb::Connection::open_in_memory_with_flags(config)?;
    connection.execute_batch("SET GLOBAL parquet_metadata_cache = true")?;
    Ok(connection)
}

/// The columns of `relation` (SQL) with their DuckDB types, as `DESCRIBE` lists them: what
/// tests compare files of two writers by.
#[cfg(test)]
pub(crate) fn columns(
    connection: &duckdb::Connection,
    relation: &str,
) -> duckdb::Result<Vec<(String, String)>> {
    let mut statement = connection.prepare(&format!("DESCRIBE SELECT * FROM {relation}"))?;
    let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    /// DuckDB renamed the footer cache's setting and still accepts the old name, without
    /// effect: `SET enable_object_cache = true` left it off. A plain `SET` would hold only on
    /// the connection that ran it, not on those a query clones from it.
    #[test]
    fn duckdb_opens_with_the_parquet_footer_cache_on() -> Result<(), Box<dyn std::error::Error>> {
        let connection = super::open_duckdb()?;
        for connection in [&connection, &connection.try_clone()?] {
            let on: bool = connection.query_row(
                "SELECT current_setting('parquet_metadata_cache')",
                [],
                |row| row.get(0),
            )?;
            assert!(on, "parquet_metadata_cache is off");
        }
        Ok(())
    }
}
