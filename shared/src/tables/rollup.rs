//! Rollups: beside each `task_attempts` base and delta, its attempts counted by grouping value,
//! job, state, type and rounded duration, so the summary and the aggregates read thousands of
//! rows instead of every attempt.
//!
//! `complete` is whether the attempt's definition was exported (Ray's lists omit those that
//! were not, and so do ours by default).
//!
//! A delta's rollup also holds a *minus* row (`sign = -1`) for each stored version it
//! supersedes, so the rollups of a session's live files add up to the counts of its newest
//! rows, exactly: the same versions its deletion vectors drop. A superseded version whose
//! replacement has the same values in every rolled-up column (a re-delivered body, a late
//! profile span) changes nothing, so neither row is written.
//!
//! Each row also keeps the smallest and largest duration, the earliest creation time and the
//! latest time of its rows, each with how many rows hold it. Over files these are extremes of
//! every stored version, not just the newest; but a version's minus row carries its own values
//! in the same cell as its plus row, so a superseded version never holds a value below a
//! cell's smallest (or above its largest), and the rows holding an extreme *now* are those
//! counted at it by plus rows less those counted by minus rows. When none are left (every
//! version holding the extreme was replaced by one with other values, say a synthesized
//! failure later reported for real) the reader cannot tell the next one and scans for it
//! (see `query::rollups`).

use std::path::{Path, PathBuf};

use duckdb::Connection;

use super::newest::{path_literal, rows_at};
use super::task_attempts::TableError;

/// The columns a rollup groups by, one grouping set each: `/api/aggregates`' groupings.
pub const GROUPINGS: [&str; 5] = [
    "name",
    "func_or_class_name",
    "error_type",
    "job_id",
    "node_id",
];

/// The grouping set of the summary: no group and no duration (`group_key` and `rounded` are
/// null), so a session's counts by state are a few hundred rows.
pub const TOTALS: &str = "totals";

/// `duration_ms` rounded up to two significant digits (below 100 ms: itself). A step of
/// 10^(digits − 2) divides every histogram bound at or above the duration, so rounding never
/// moves a duration across a bound.
pub const ROUNDED_DURATION: &str = "CASE WHEN duration_ms < 100 THEN duration_ms \
     ELSE CAST(ceil(duration_ms / pow(10, floor(log10(duration_ms)) - 1)) \
     * pow(10, floor(log10(duration_ms)) - 1) AS BIGINT) END";

/// What a rollup reads of a row: its key (to pair a superseded version with its replacement)
/// and every value a rollup row depends on.
const SOURCE: &str = "task_id, attempt_number, job_id, state, type, name, func_or_class_name, \
     error_type, node_id, definition_at IS NOT NULL AS complete, duration_ms, creation_time_ms, \
     greatest(creation_time_ms, start_time_ms, end_time_ms) AS last_ms";

/// The values of [`SOURCE`] a rollup row depends on: a replacement equal in all of them
/// cancels its superseded version.
const ROLLED_UP: [&str; 11] = [
    "job_id",
    "complete",
    "state",
    "type",
    "name",
    "func_or_class_name",
    "error_type",
    "node_id",
    "duration_ms",
    "creation_time_ms",
    "last_ms",
];

/// What a rollup row counts: rows alike in these (`group_key` being the grouping's column).
const CELL: [&str; 7] = [
    "group_key",
    "job_id",
    "state",
    "type",
    "complete",
    "rounded",
    "sign",
];

/// Stored rows, by file: a file's path and row numbers in it.
pub type RowsByFile = Vec<(PathBuf, Vec<i64>)>;

/// Writes the rollup of the `task_attempts` file at `file` to `path`: its rows, minus the
/// stored versions in `superseded` (the live versions its rows replace). Returns the rollup's
/// row count.
pub fn write_rollup(
    connection: &Connection,
    file: &Path,
    superseded: &RowsByFile,
    path: &Path,
) -> Result<u64, TableError> {
    connection.execute_batch(&format!(
        "DROP TABLE IF EXISTS rollup_minus;
         CREATE TEMP TABLE rollup_minus AS
             SELECT {SOURCE} FROM read_parquet({file}) LIMIT 0;",
        file = path_literal(file)
    ))?;
    for (stored, numbers) in superseded {
        for select in rows_at(stored, numbers, SOURCE) {
            connection.execute_batch(&format!("INSERT INTO rollup_minus {select}"))?;
        }
    }
    let same: Vec<String> = ROLLED_UP
        .iter()
        .map(|column| format!("p.{column} IS NOT DISTINCT FROM m.{column}"))
        .collect();
    // Per cell: its count, and each extreme with how many rows hold it (the extremes found
    // first, then counted by joining the rows to their cell).
    let sets = GROUPINGS
        .iter()
        .map(|column| (*column, *column, "rounded"))
        .chain([(TOTALS, "NULL::VARCHAR", "NULL::BIGINT")]);
    let grouped: Vec<String> = sets
        .map(|(grouping, column, rounded)| {
            let cells = format!(
                "(SELECT {column} AS group_key, * REPLACE ({rounded} AS rounded) FROM source)"
            );
            let on: Vec<String> = CELL
                .iter()
                .map(|part| format!("s.{part} IS NOT DISTINCT FROM c.{part}"))
                .collect();
            format!(
                "SELECT '{grouping}' AS grouping, c.*,
                        count_if(s.duration_ms = c.d_min) AS d_min_n,
                        count_if(s.duration_ms = c.d_max) AS d_max_n,
                        count_if(s.creation_time_ms = c.c_min) AS c_min_n,
                        count_if(s.last_ms = c.l_max) AS l_max_n
                 FROM {cells} s JOIN (
                     SELECT {cell}, count(*) AS n,
                            min(duration_ms) AS d_min, max(duration_ms) AS d_max,
                            min(creation_time_ms) AS c_min, max(last_ms) AS l_max
                     FROM {cells} GROUP BY ALL) c ON {on}
                 GROUP BY ALL",
                cell = CELL.join(", "),
                on = on.join(" AND "),
            )
        })
        .collect();
    let copy = format!(
        "COPY (
             WITH plus AS (SELECT {SOURCE} FROM read_parquet({file})),
             unchanged AS (
                 SELECT p.task_id, p.attempt_number FROM plus p JOIN rollup_minus m
                     ON p.task_id = m.task_id AND p.attempt_number = m.attempt_number
                 WHERE {same}),
             source AS MATERIALIZED (
                 SELECT *, {ROUNDED_DURATION} AS rounded FROM (
                     SELECT *, 1 AS sign FROM plus ANTI JOIN unchanged USING (task_id, attempt_number)
                     UNION ALL
                     SELECT *, -1 AS sign FROM rollup_minus
                         ANTI JOIN unchanged USING (task_id, attempt_number)))
             {grouped}
         ) TO {path} (FORMAT parquet, COMPRESSION zstd)",
        file = path_literal(file),
        same = same.join(" AND "),
        grouped = grouped.join(" UNION ALL "),
        path = path_literal(path),
    );
    let written = connection.execute(&copy, [])? as u64;
    connection.execute_batch("DROP TABLE rollup_minus")?;
    Ok(written)
}
