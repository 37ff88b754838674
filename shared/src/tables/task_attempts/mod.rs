//! The `task_attempts` table: one row per `(task_id, attempt_number)` of a session, holding both
//! the state-API view (what queries read) and the merge state (what the next compaction merges
//! into), so a row can always be turned back into the [`TaskAttempt`] it came from.
//!
//! - `columns`: the schema: every column with its field id and type, and which are stored
//!   by reference.
//! - `write`: attempts into a delta file (rows sorted in Rust, built on threads, written by
//!   the parquet crate) and a delta's deletion vector.
//! - `read`: stored rows back into merge state: finding the versions a filter selects, and
//!   turning a row back into the attempt it came from.

use std::path::{Path, PathBuf};

use duckdb::Connection;

mod columns;
mod read;
mod write;

pub use self::columns::status_columns;
pub(crate) use self::columns::{COLUMNS, STORED_COLUMNS};
#[cfg(test)]
use self::read::query_attempts;
pub use self::read::{
    Located, RowFilter, StoredRows, read_attempts, read_located, unfinished_keys,
};
pub use self::write::{write_deletes, write_delta};

use super::TableError;
use super::newest::path_literal;
use super::parquet::Layout;

/// The order of rows in every file, ascending with NULLs last: by job, then creation, so
/// row-group statistics let a job filter skip other jobs and a newest-first page skip older
/// row groups. A delta's rows are put in this order in Rust (`write::row_order`); a fold
/// interleaves the files in it ([`crate::compact::fold`]).
pub(crate) const SORT_KEY: [&str; 4] = ["job_id", "creation_time_ms", "task_id", "attempt_number"];

/// [`SORT_KEY`] as SQL's `ORDER BY` list.
pub(crate) fn sort_order() -> String {
    SORT_KEY.join(", ")
}

/// How DuckDB writes a fold's base when it folds (the files the interleave of
/// [`crate::compact::fold`] declines); the parquet crate writes the others with the same
/// compression, row groups and integer encoding ([`LAYOUT`], [`super::parquet`]).
/// ZSTD at DuckDB's default level (3): a lower level writes files hardly smaller that answer
/// pages and lookups slower.
pub(crate) const PARQUET_OPTIONS: &str =
    "FORMAT parquet, COMPRESSION zstd, PARQUET_VERSION V2, ROW_GROUP_SIZE 122880";

/// How the parquet crate writes `task_attempts` files (deltas, and the bases a fold
/// interleaves): in [`ROW_GROUP_ROWS`], task ids by length then bytes as DuckDB wrote them.
pub(crate) const LAYOUT: Layout = Layout {
    row_group_rows: ROW_GROUP_ROWS as usize,
    unique: &["task_id"],
    ordered: &[],
    columns: &STORED_COLUMNS,
};

/// Rows per row group of every `task_attempts` file ([`PARQUET_OPTIONS`], [`write_delta`]): a key
/// index names blocks of this many rows (see [`super::key_index`]).
pub const ROW_GROUP_ROWS: u64 = 122_880;

/// The rows of the `task_attempts` file at `path` as a relation of its columns and
/// `row_number`, each row's position in the file (from 0): what describes a file just written
/// (its rollup and its key index) reads.
pub fn file_rows(path: &Path) -> String {
    format!(
        "(SELECT * EXCLUDE (file_row_number), file_row_number AS row_number FROM {})",
        super::newest::read_parquet(&[path], ", file_row_number = true")
    )
}

/// Compressed bytes per column over `files`, largest first, from the Parquet footers.
pub fn column_bytes(
    connection: &Connection,
    files: &[PathBuf],
) -> Result<Vec<(String, u64)>, TableError> {
    if files.is_empty() {
        return Ok(Vec::new());
    }
    let list: Vec<String> = files.iter().map(|path| path_literal(path)).collect();
    let sql = format!(
        "SELECT path_in_schema, sum(total_compressed_size)::UBIGINT AS bytes
         FROM parquet_metadata([{}]) GROUP BY path_in_schema ORDER BY bytes DESC",
        list.join(", ")
    );
    let mut statement = connection.prepare(&sql)?;
    let rows = statement.query_map([], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, u64>(1)?))
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::event::common::TaskStatus;
    use crate::event::encoding::Id;
    use crate::merge::{FailureContext, Reported, ReportedError, TaskAttempt};
    use crate::tables::key_index::KeyIndex;

    #[test]
    fn key_index_blocks_are_the_row_groups_files_are_written_with() {
        assert!(
            PARQUET_OPTIONS.ends_with(&format!("ROW_GROUP_SIZE {ROW_GROUP_ROWS}")),
            "{PARQUET_OPTIONS}"
        );
    }

    /// An attempt whose sort columns vary the ways real rows do: jobs from an event or from
    /// the task id, or none (a task id too short to hold one); creation times that tie to the
    /// millisecond but not the nanosecond, or are missing.
    pub(crate) fn attempt(n: u64) -> TaskAttempt {
        // A multiplicative hash, so that neither task ids nor jobs come in creation order.
        let mixed = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // Some task ids share their first eight digits, some are too short to name a job;
        // some jobs are longer than eight digits.
        let task_hex = match (n % 97, n % 11) {
            (0, _) => format!("{:04x}", mixed & 0xffff),
            (_, 0) => format!("00000000{:08x}{:08x}", mixed >> 32, n % 5),
            _ => format!("{mixed:016x}{:08x}", n % 5),
        };
        let job_hex = match n % 12 {
            0 => Some(format!("{:010x}", n % 7)),
            4 | 8 => Some(format!("{:08x}", n % 7)),
            _ => None,
        };
        let mut attempt = TaskAttempt {
            task_id: Id::from_hex(&task_hex),
            attempt_number: i32::try_from(mixed % 3).unwrap_or_default(),
            job_id: job_hex.as_deref().and_then(Id::from_hex),
            ..TaskAttempt::default()
        };
        if !n.is_multiple_of(13) {
            let created = 1_700_000_000_000_000_000
                + i64::try_from(mixed % 50_000_000_000).unwrap_or_default();
            let pending = TaskStatus::PENDING_ARGS_AVAIL.number().unwrap_or_default();
            attempt.status_times.insert(pending, created);
            // Facts reported as Ray reports them, so that their times are stored by
            // reference: node, worker, pid and log position at RUNNING; an error at FAILED;
            // and, for some, a node and worker reported at no transition (stored as they are).
            let running = TaskStatus::RUNNING.number().unwrap_or_default();
            let failed = TaskStatus::FAILED.number().unwrap_or_default();
            let reported_at = match n % 3 {
                0 => Some(created + 10),
                1 => Some(created + 7),
                _ => None,
            };
            if n.is_multiple_of(3) {
                attempt.status_times.insert(running, created + 10);
                attempt.worker_pid = Some(Reported {
                    at: created + 10,
                    value: 4_000 + (n % 100) as u32,
                });
                attempt.log_info.stdout_file = Some(Reported {
                    at: created + 10,
                    value: format!("worker-{}.out", n % 7),
                });
            }
            if let Some(at) = reported_at {
                attempt.node_id =
                    Id::from_hex(&format!("{:056x}", n % 16)).map(|value| Reported { at, value });
                attempt.worker_id =
                    Id::from_hex(&format!("{:056x}", n % 64)).map(|value| Reported { at, value });
            }
            if n.is_multiple_of(5) {
                attempt.status_times.insert(failed, created + 20);
                attempt.error = Some(Reported {
                    at: created + 20,
                    value: ReportedError {
                        error_type: "TASK_EXECUTION_EXCEPTION".to_owned(),
                        message: format!("ValueError: bad input {n}"),
                    },
                });
            }
        }
        attempt
    }

    /// `rows` synthetic attempts written as a delta in a new temporary directory (returned, so
    /// it lives as long as the test): the delta, a database to read it with, and its key index.
    fn written_delta(rows: u64) -> (tempfile::TempDir, PathBuf, Connection, KeyIndex) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("delta.parquet");
        let attempts: Vec<TaskAttempt> = (0..rows).map(attempt).collect();
        let references: Vec<&TaskAttempt> = attempts.iter().collect();
        let failures = FailureContext::default();
        let (written, index) =
            write_delta(&path, "c", "s", &references, &failures).expect("the delta is written");
        assert_eq!(written, rows);
        let connection = Connection::open_in_memory().expect("DuckDB opens");
        (dir, path, connection, index)
    }

    #[test]
    fn a_delta_is_written_in_the_order_duckdb_sorts_it() {
        // More rows than one batch or one row group, so that rows are built on several threads
        // and order is kept across batches and row groups.
        let (_dir, path, connection, _) = written_delta(300_000);
        let order = |by: &str| -> Vec<(Option<String>, i32)> {
            let sql = format!(
                "SELECT task_id, attempt_number FROM read_parquet({}, file_row_number = true) \
                 ORDER BY {by}",
                path_literal(&path)
            );
            let mut statement = connection.prepare(&sql).expect("prepares");
            statement
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
                .expect("reads")
                .collect::<Result<_, _>>()
                .expect("rows")
        };
        let written = order("file_row_number");
        let sorted = order(&sort_order());
        let nulls = |column: &str| -> i64 {
            connection
                .query_row(
                    &format!(
                        "SELECT count(*) FROM read_parquet({}) WHERE {column} IS NULL",
                        path_literal(&path)
                    ),
                    [],
                    |row| row.get(0),
                )
                .expect("counts")
        };
        for column in ["job_id", "creation_time_ms"] {
            let nulls = nulls(column);
            assert!(nulls > 0 && nulls < 300_000, "{nulls} NULL {column}s");
        }
        let first_out_of_order = written.iter().zip(&sorted).position(|(w, s)| w != s);
        assert_eq!(
            first_out_of_order,
            None,
            "the file is not in {} order",
            sort_order()
        );
    }

    #[test]
    fn a_delta_reads_back_as_the_attempts_written_in_row_groups_a_key_index_names()
    -> Result<(), Box<dyn std::error::Error>> {
        // Several batches and row groups, so row numbers cross both.
        let rows = 2 * ROW_GROUP_ROWS + 1_000;
        let (dir, path, connection, index) = written_delta(rows);
        let groups: Vec<(i64, i64)> = connection
            .prepare(&format!(
                "SELECT row_group_id, row_group_num_rows FROM parquet_metadata({}) \
                 GROUP BY ALL ORDER BY row_group_id",
                path_literal(&path)
            ))?
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect::<Result<_, _>>()?;
        let full = i64::try_from(ROW_GROUP_ROWS)?;
        assert_eq!(groups, [(0, full), (1, full), (2, 1_000)]);
        let numbers: (i64, i64, i64) = connection.query_row(
            &format!(
                "SELECT count(*), min(row_number), max(row_number) FROM {}",
                file_rows(&path)
            ),
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )?;
        let count = i64::try_from(rows)?;
        assert_eq!(numbers, (count, 0, count - 1));
        // The key index built as the rows were written is the one DuckDB computes from them.
        super::super::key_index::indexed_as_duckdb(&connection, index, &path, rows, dir.path())?;
        // Report times are stored by reference where they equal another time of their row,
        // their codes as UTINYINT, and as themselves where they equal none.
        let file = crate::tables::newest::read_parquet(&[path.as_path()], "");
        for (column, kind) in crate::tables::columns(&connection, &file)? {
            if column.ends_with("_ref") {
                assert_eq!(kind, "UTINYINT", "{column}");
            }
        }
        let stored: (i64, i64, i64, i64, i64) = connection.query_row(
            &format!(
                "SELECT count(node_id_at_ref), count(worker_id_at_ref), count(worker_pid_at_ref), \
                 count(reported_error_at_ref), count(node_id_at) FROM {file}"
            ),
            [],
            |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                ))
            },
        )?;
        assert!(
            stored.0 > 0 && stored.1 > stored.0 && stored.2 > 0 && stored.3 > 0 && stored.4 > 0,
            "report times stored by reference and as themselves: {stored:?}"
        );
        // Read back as compaction reads stored versions: every attempt as it was written, its
        // job the one its row names (from the task id when no event named one).
        let mut read = query_attempts(&connection, &format!("SELECT * FROM {file}"))?;
        let mut written: Vec<TaskAttempt> = (0..rows)
            .map(|n| {
                let mut written = attempt(n);
                written.job_id = written.job_hex().and_then(Id::from_hex);
                written
            })
            .collect();
        let key = |attempt: &TaskAttempt| (attempt.task_id.clone(), attempt.attempt_number);
        read.sort_by_key(key);
        written.sort_by_key(key);
        assert_eq!(read.len(), written.len());
        let differing = read
            .iter()
            .zip(&written)
            .find(|(read, written)| read != written);
        assert!(differing.is_none(), "read back otherwise: {differing:?}");
        Ok(())
    }
}
