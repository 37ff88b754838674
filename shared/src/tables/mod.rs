//! The Parquet tables compaction writes and queries read, via embedded DuckDB. Each table
//! module owns its schema and the mapping between rows and the merge model; [`newest`] is the
//! log-structured read over a table's base and delta files; [`manifest`] and [`catalog`] are the
//! commit protocol both sides share (compaction replaces them conditionally, queries read them).

mod arrow_rows;
pub mod catalog;
pub mod entities;
pub mod key_index;
pub mod manifest;
pub mod newest;
pub mod report_times;
pub mod rollup;
pub mod task_attempts;

/// An in-memory DuckDB with nothing downloaded or auto-loaded: the one way compaction and
/// queries open it.
pub fn open_duckdb() -> Result<duckdb::Connection, task_attempts::TableError> {
    let config = duckdb::Config::default().enable_autoload_extension(false)?;
    Ok(duckdb::Connection::open_in_memory_with_flags(config)?)
}
