//! The Parquet tables compaction writes and queries read, via embedded DuckDB. Each table
//! module owns its schema and the mapping between rows and the merge model; [`newest`] is the
//! log-structured read over a table's base and delta files; [`manifest`] and [`catalog`] are the
//! commit protocol both sides share (compaction replaces them conditionally, queries read them).

mod arrow_rows;
pub mod catalog;
pub mod entities;
pub mod key_index;
pub mod manifest;
mod merged;
pub mod newest;
mod parquet_file;
pub mod report_times;
pub mod rollup;
pub mod stored_keys;
pub mod task_attempts;
pub mod task_block;

/// An in-memory DuckDB with nothing downloaded or auto-loaded, keeping the Parquet footers it
/// has parsed: the one way compaction and queries open it.
pub fn open_duckdb() -> Result<duckdb::Connection, task_attempts::TableError> {
    // A request reads the same files in several statements (a page's bound, then its rows),
    // and without the cache each statement parses every footer again: a 10 M base's holds
    // statistics for ~70 row groups of 75 columns. Our files never change under a name, and
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
