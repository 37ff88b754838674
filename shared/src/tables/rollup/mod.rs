//! Rollups: beside each `task_attempts` base and delta, its attempts counted by grouping value,
//! job, state, type, error type, retry and rounded measure (duration, or for the waits the
//! time to start), so the summary, the aggregates and the insights read thousands of rows
//! instead of every attempt.
//!
//! `complete` is whether the attempt's definition was exported (Ray's lists omit those that
//! were not, and so do ours by default); `retried` whether it is a retry (attempt ≥ 1).
//!
//! A delta's rollup also holds a *minus* row (`sign = -1`) for each stored version it supersedes,
//! so the rollups of a session's live files add up to the counts of its newest rows, exactly: the
//! same versions its deletion vectors drop. A delta's rollup may also add in the rollups of deltas
//! before it (its manifest entry says how many deltas it counts), and a read then sums it in their
//! place ([`crate::tables::manifest::TableFiles::rollups`]). A superseded version whose replacement
//! has the same values in every rolled-up column (a re-delivered body, a late profile span) changes
//! nothing, so neither row is written.
//!
//! Each row also keeps the smallest and largest measure, the earliest creation time and the
//! latest time of its rows, each with how many rows hold it. Over files these are extremes of
//! every stored version, not just the newest; but a version's minus row carries its own values
//! in the same cell as its plus row, so a superseded version never holds a value below a
//! cell's smallest (or above its largest), and the rows holding an extreme *now* are those
//! counted at it by plus rows less those counted by minus rows. When none are left (every
//! version holding the extreme was replaced by one with other values, say a synthesized
//! failure later reported for real) the reader cannot tell the next one and scans for it
//! (see `query::rollups`). Failure cells also keep one error message as an example (any
//! stored version's: the messages of one fingerprint differ only in numbers and ids).
//!
//! DuckDB picks and derives a rollup's source rows (the versions to subtract, the wait, the
//! fingerprint, the roundings); `cells` counts them into the rollup's rows in one pass.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use duckdb::Connection;

mod cells;

use super::TableError;
use super::newest::{read_parquet, rows_at};
use super::task_attempts::file_rows;

/// The format of the rollups this build writes: format 2's cells, a delta's rollup counting
/// the deltas before it too ([`crate::tables::manifest::DataFile::rollup_covers`]). Builds that
/// read format 2 alone would count those deltas twice, so they scan instead. A session with a
/// file whose rollup has a format this build does not read (or none) is counted by scanning
/// until its next base rewrites them all.
pub const FORMAT: u32 = 3;

/// Whether this build reads rollups of `format`: format 2's are format 3's that count their
/// own file alone.
pub fn reads_format(format: u32) -> bool {
    format == 2 || format == FORMAT
}

/// The columns a rollup groups by with their durations, one grouping set each:
/// `/api/aggregates`' groupings.
pub const GROUPINGS: [&str; 5] = [
    "name",
    "func_or_class_name",
    "error_type",
    "job_id",
    "node_id",
];

/// The grouping set of the summary: no group and no measure (`group_key` and `rounded` are
/// null), so a session's counts by state are a few hundred rows.
pub const TOTALS: &str = "totals";

/// The grouping set of worker hot spots: by worker, no measure.
pub const WORKERS: &str = "worker_id";

/// The grouping set of scheduling waits: by job, measured by [`WAIT_MS`].
pub const WAITS: &str = "wait_by_job";

/// The grouping set of failure clusters: failed attempts with an error type, by
/// [`ERROR_FINGERPRINT`], no measure, with an example message.
pub const FAILURES: &str = "failure";

/// The grouping sets insights read.
pub const INSIGHTS: [&str; 5] = ["func_or_class_name", "node_id", WORKERS, WAITS, FAILURES];

/// An attempt's error, fingerprinted: the message (stack trace included) lower-cased, with
/// hex addresses, long hex ids and every number masked, hashed to 16 hex digits. Attempts that
/// failed the same way on other inputs, workers or retries share it. Rollups store it, so a
/// change here is a change of [`FORMAT`].
pub const ERROR_FINGERPRINT: &str = "substr(md5(regexp_replace(regexp_replace(\
     lower(coalesce(error_message, '')), '0x[0-9a-f]+|[0-9a-f]{8,}', '#', 'g'), \
     '[0-9]+', '#', 'g')), 1, 16)";

/// Milliseconds an attempt waited from submission to running.
pub const WAIT_MS: &str = "(start_time_ms - creation_time_ms)";

/// `value` (SQL) rounded up to two significant digits (below 100: itself). A step of
/// 10^(digits − 2) divides every histogram bound at or above the value, so rounding never
/// moves a value across a bound. [`round_up`] is the same in Rust.
pub fn rounded(value: &str) -> String {
    format!(
        "CASE WHEN {value} < 100 THEN {value} \
         ELSE CAST(ceil({value} / pow(10, floor(log10({value})) - 1)) \
         * pow(10, floor(log10({value})) - 1) AS BIGINT) END"
    )
}

/// `duration_ms`, [`rounded`].
pub static ROUNDED_DURATION: LazyLock<String> = LazyLock::new(|| rounded("duration_ms"));

/// [`rounded`], in Rust.
pub fn round_up(value: i64) -> i64 {
    if value < 100 {
        return value;
    }
    // The step is 10^(digits − 2): 100..=999 by 10, 1000..=9999 by 100, …
    let mut step = 1;
    while value / step >= 100 {
        step *= 10;
    }
    // `value` ≥ 100 here, so the quotient is positive and this is its ceiling.
    (value + step - 1) / step * step
}

/// The smallest value `v ≥ at_least` at which rounded values split: every value rounds to at
/// least `round_up(v)` exactly when it is `≥ v`, so a count of rounded values `≥ v` is a count
/// of the values themselves.
pub fn rounding_bound(at_least: i64) -> i64 {
    round_up(at_least.saturating_sub(1)).saturating_add(1)
}

/// What a rollup reads of a `task_attempts` row: its key (to pair a superseded version with
/// its replacement) and every value a rollup row depends on. `complete` is
/// [`super::report_times::DEFINED`].
pub const SOURCE: &str = "task_id, attempt_number, job_id, state, type, name, \
     func_or_class_name, error_type, node_id, worker_id, def_name IS NOT NULL AS complete, \
     duration_ms, creation_time_ms, greatest(creation_time_ms, start_time_ms, end_time_ms) AS \
     last_ms, start_time_ms, error_message";

/// The values of a row a rollup row depends on: a replacement equal in all of them cancels
/// its superseded version.
const ROLLED_UP: [&str; 14] = [
    "job_id",
    "complete",
    "state",
    "type",
    "name",
    "func_or_class_name",
    "error_type",
    "node_id",
    "worker_id",
    "duration_ms",
    "wait_ms",
    "creation_time_ms",
    "last_ms",
    "fingerprint",
];

/// What a rollup row counts: rows alike in these (`group_key` being the grouping's key and
/// `rounded` its rounded measure).
const CELL: [&str; 9] = [
    "group_key",
    "job_id",
    "state",
    "type",
    "complete",
    "error_type",
    "retried",
    "rounded",
    "sign",
];

/// What a grouping set measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Measure {
    /// `duration_ms`.
    Duration,
    /// [`WAIT_MS`], as `wait_ms`.
    Wait,
    /// Nothing: the rows are only counted.
    Nothing,
}

impl Measure {
    /// The measure's column among the source rows.
    fn column(self) -> Option<&'static str> {
        match self {
            Self::Duration => Some("duration_ms"),
            Self::Wait => Some("wait_ms"),
            Self::Nothing => None,
        }
    }

    /// The measure as SQL over the source rows.
    fn sql(self) -> &'static str {
        self.column().unwrap_or("NULL::BIGINT")
    }
}

/// One grouping set: its name, the source column it is keyed by (none: one group), its measure,
/// and whether it counts only rows with a key (and a measure, if it has one).
#[derive(Clone, Copy, Debug)]
struct GroupingSet {
    name: &'static str,
    key: Option<&'static str>,
    measure: Measure,
    required: bool,
}

impl GroupingSet {
    /// The key as SQL over the source rows.
    fn key_sql(&self) -> &'static str {
        self.key.unwrap_or("NULL::VARCHAR")
    }

    /// Whether its cells keep an example error message (the smallest).
    fn keeps_examples(&self) -> bool {
        self.name == FAILURES
    }

    /// Which source rows the set counts, as SQL.
    fn keep_sql(&self) -> String {
        if !self.required {
            return "TRUE".to_owned();
        }
        let present: Vec<String> = self
            .key
            .into_iter()
            .chain(self.measure.column())
            .map(|column| format!("{column} IS NOT NULL"))
            .collect();
        present.join(" AND ")
    }
}

/// Every grouping set a rollup holds.
fn grouping_sets() -> impl Iterator<Item = GroupingSet> {
    GROUPINGS
        .iter()
        .map(|column| GroupingSet {
            name: column,
            key: Some(column),
            measure: Measure::Duration,
            required: false,
        })
        .chain([
            GroupingSet {
                name: TOTALS,
                key: None,
                measure: Measure::Nothing,
                required: false,
            },
            GroupingSet {
                name: WORKERS,
                key: Some("worker_id"),
                measure: Measure::Nothing,
                required: true,
            },
            GroupingSet {
                name: WAITS,
                key: Some("job_id"),
                measure: Measure::Wait,
                required: true,
            },
            GroupingSet {
                name: FAILURES,
                key: Some("fingerprint"),
                measure: Measure::Nothing,
                required: true,
            },
        ])
}

/// The rows of `source`, a relation of [`SOURCE`] columns plus `sign` (newest versions only),
/// as a rollup's rows for the sets named in `only`, each extreme counted as held once: for rows
/// that are all newest versions only being held at all matters. Stored rollups count every
/// holder ([`cells::write`]).
fn cells(source: &str, only: &[&str]) -> String {
    let grouped: Vec<String> = grouping_sets()
        .filter(|set| only.contains(&set.name))
        .map(|set| {
            let name = set.name;
            let cell = CELL.join(", ");
            format!(
                "SELECT '{name}' AS grouping, {cell}, {aggregates}, 1 AS d_min_n, \
                     1 AS d_max_n, 1 AS c_min_n, 1 AS l_max_n \
                 FROM {rows} GROUP BY ALL",
                aggregates = aggregates(&set),
                rows = cell_rows(&set, source),
            )
        })
        .collect();
    grouped.join(" UNION ALL ")
}

/// The rows of `source` that `set` counts, with its key, measure and cell columns.
fn cell_rows(set: &GroupingSet, source: &str) -> String {
    format!(
        "(SELECT {key} AS group_key, job_id, state, type, complete, error_type, \
             attempt_number >= 1 AS retried, {rounded} AS rounded, sign, \
             {measure} AS measure, creation_time_ms, last_ms, error_message \
         FROM {source} WHERE {keep})",
        key = set.key_sql(),
        measure = set.measure.sql(),
        rounded = rounded(set.measure.sql()),
        keep = set.keep_sql(),
    )
}

/// A cell's aggregates over [`cell_rows`], as SQL.
fn aggregates(set: &GroupingSet) -> String {
    let example = if set.keeps_examples() {
        "min(error_message)"
    } else {
        "NULL::VARCHAR"
    };
    format!(
        "count(*) AS n, min(measure) AS d_min, max(measure) AS d_max, \
         min(creation_time_ms) AS c_min, max(last_ms) AS l_max, {example} AS example"
    )
}

/// The rows of `row` (a relation with [`SOURCE`]'s columns) as rollups read them: with the
/// wait and, on failures with an error type, the fingerprint and message.
fn derived(row: &str) -> String {
    format!(
        "(SELECT * EXCLUDE (start_time_ms, error_message), {WAIT_MS} AS wait_ms, \
             CASE WHEN state = 'FAILED' AND error_type IS NOT NULL \
                 THEN {ERROR_FINGERPRINT} END AS fingerprint, \
             CASE WHEN state = 'FAILED' AND error_type IS NOT NULL \
                 THEN error_message END AS error_message \
         FROM {row})"
    )
}

/// A query of the rollup rows of `source` (a relation of [`SOURCE`] columns and `sign = 1`:
/// newest versions only) for the grouping sets named in `only`: what stored rollups hold for
/// them, computed by a scan.
pub fn newest_cells(source: &str, only: &[&str]) -> String {
    cells(&derived(source), only)
}

/// Stored rows, by file: a file's path and row numbers in it.
pub type RowsByFile = Vec<(PathBuf, Vec<i64>)>;

/// The most threads that count one rollup's rows: each holds cells of its own (a large base's
/// rollup has hundreds of thousands), so more threads than a Lambda's cores would only cost
/// memory.
const MAX_COUNTING_THREADS: usize = 8;

/// Threads to count a rollup on (nothing runs beside it): one per core, up to
/// [`MAX_COUNTING_THREADS`] (DuckDB's threads, streaming the rows to them, take little).
fn every_core() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, MAX_COUNTING_THREADS)
}

/// Writes the rollup of the `task_attempts` file `file` to `path`: its rows, minus the stored
/// versions in `superseded` (the live versions its rows replace), counted on every core
/// ([`every_core`]), plus the rows of the stored rollups `previous` (those of the deltas
/// before it). Returns the rollup's row count.
pub fn write_rollup(
    connection: &Connection,
    file: &Path,
    superseded: &RowsByFile,
    previous: &[PathBuf],
    path: &Path,
) -> Result<u64, TableError> {
    let threads = every_core();
    let plus = derived(&format!("(SELECT {SOURCE} FROM {})", file_rows(file)));
    if superseded.is_empty() {
        // A base, or a delta that replaced nothing: no version to subtract or pair.
        return cells::write(connection, &all_plus(&plus), previous, path, threads);
    }
    connection.execute_batch(&format!(
        "DROP TABLE IF EXISTS rollup_minus;
         CREATE TEMP TABLE rollup_minus AS SELECT * FROM {plus} LIMIT 0;"
    ))?;
    for (stored, numbers) in superseded {
        for select in rows_at(stored, numbers, SOURCE) {
            connection.execute_batch(&format!(
                "INSERT INTO rollup_minus SELECT * FROM {}",
                derived(&format!("({select})"))
            ))?;
        }
    }
    let same: Vec<String> = ROLLED_UP
        .iter()
        .map(|column| format!("p.{column} IS NOT DISTINCT FROM m.{column}"))
        .collect();
    let query = format!(
        "WITH plus AS {plus},
         unchanged AS (
             SELECT p.task_id, p.attempt_number FROM plus p JOIN rollup_minus m
                 ON p.task_id = m.task_id AND p.attempt_number = m.attempt_number
             WHERE {same}),
         source AS (
             SELECT *, 1 AS sign FROM plus ANTI JOIN unchanged USING (task_id, attempt_number)
             UNION ALL
             SELECT *, -1 AS sign FROM rollup_minus
                 ANTI JOIN unchanged USING (task_id, attempt_number))
         SELECT {columns} FROM source",
        same = same.join(" AND "),
        columns = cells::select_list(),
    );
    let written = cells::write(connection, &query, previous, path, threads)?;
    connection.execute_batch("DROP TABLE rollup_minus")?;
    Ok(written)
}

/// Writes the rollup of a fold's new base `file` to `path` by summing the stored rollups `replaced`
/// that add up to the files it replaces ([`crate::tables::manifest::TableFiles::rollups`]),
/// counting again from `file` only the slices whose extremes the sum cannot tell. The rollup is the
/// one [`write_rollup`] writes for `file`, an example message aside (see the module's doc). An
/// error means the rollups do not add up (or could not be read): count `file` with [`write_rollup`]
/// instead.
pub fn write_summed_rollup(
    connection: &Connection,
    file: &Path,
    replaced: &[PathBuf],
    path: &Path,
) -> Result<Summed, TableError> {
    summed_on(connection, file, replaced, path, every_core())
}

/// [`write_summed_rollup`] on `threads` threads.
fn summed_on(
    connection: &Connection,
    file: &Path,
    replaced: &[PathBuf],
    path: &Path,
    threads: usize,
) -> Result<Summed, TableError> {
    let base_rows = rows_by_slice(connection, file)?;
    let recount = |slices: &[Slice]| {
        let filter: Vec<String> = slices.iter().map(Slice::sql).collect();
        all_plus(&derived(&format!(
            "(SELECT {SOURCE} FROM {} WHERE {})",
            file_rows(file),
            filter.join(" OR ")
        )))
    };
    cells::write_summed(connection, replaced, &base_rows, recount, path, threads)
}

/// The rows of the `task_attempts` file `file` by [`Slice`]: two columns read.
fn rows_by_slice(connection: &Connection, file: &Path) -> Result<BTreeMap<Slice, i64>, TableError> {
    let mut statement = connection.prepare(&format!(
        "SELECT state, {} AS complete, count(*) FROM {} GROUP BY ALL",
        super::report_times::DEFINED,
        read_parquet(&[file], "")
    ))?;
    let rows = statement.query_map([], |row| {
        let slice = Slice {
            state: row.get(0)?,
            complete: row.get(1)?,
        };
        Ok((slice, row.get::<_, i64>(2)?))
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// What [`write_summed_rollup`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summed {
    /// The rollup's row count.
    pub rows: u64,
    /// The slices whose cells were counted again from the new base, in order.
    pub recounted: Vec<Slice>,
}

/// The rows of one state (`None`: a null one) and completeness: the parts of a base whose
/// cells a summed rollup counts again, as every cell's key holds both.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Slice {
    /// The rows' state.
    pub state: Option<String>,
    /// Whether their definitions arrived ([`super::report_times::DEFINED`]).
    pub complete: Option<bool>,
}

impl Slice {
    /// SQL over [`SOURCE`]'s stored columns that holds for the slice's rows.
    fn sql(&self) -> String {
        let state = match &self.state {
            Some(state) => format!("state = '{}'", state.replace('\'', "''")),
            None => "state IS NULL".to_owned(),
        };
        let defined = super::report_times::DEFINED;
        match self.complete {
            Some(true) => format!("({state} AND {defined})"),
            Some(false) => format!("({state} AND NOT ({defined}))"),
            // `complete` is never null; a cell whose key says so is every row of the state.
            None => format!("({state})"),
        }
    }
}

/// The query streaming `rows` (derived source rows, [`derived`]) to be counted, each a plus
/// row: nothing superseded among them.
fn all_plus(rows: &str) -> String {
    format!(
        "WITH source AS (SELECT *, 1 AS sign FROM {rows}) SELECT {} FROM source",
        cells::select_list()
    )
}

#[cfg(test)]
mod tests {
    use super::super::newest::path_literal;
    use super::*;

    #[test]
    fn completeness_is_read_as_every_other_reader_reads_it() {
        let complete = format!("{} AS complete", super::super::report_times::DEFINED);
        assert!(SOURCE.contains(&complete), "{SOURCE}");
    }

    /// Values around every power of ten and a spread between.
    fn samples() -> Vec<i64> {
        let mut values: Vec<i64> = vec![-7, 0, 1, 42];
        let mut power = 10;
        while power <= 10_000_000_000 {
            values.extend([power - 1, power, power + 1, power * 3 - 1, power * 3 + 1]);
            power *= 10;
        }
        values.extend((0..2_000).map(|i| i * 97 + 3));
        values
    }

    #[test]
    fn rounding_in_rust_is_rounding_in_sql() -> Result<(), Box<dyn std::error::Error>> {
        let connection = crate::tables::open_duckdb()?;
        let values = samples();
        let rows: Vec<String> = values.iter().map(|value| format!("({value})")).collect();
        let sql = format!(
            "SELECT v, {} FROM (VALUES {}) t(v)",
            rounded("v"),
            rows.join(", ")
        );
        let mut statement = connection.prepare(&sql)?;
        let rows =
            statement.query_map([], |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)))?;
        let mut compared = 0;
        for row in rows {
            let (value, in_sql) = row?;
            assert_eq!(round_up(value), in_sql, "{value}");
            compared += 1;
        }
        assert_eq!(compared, values.len());
        Ok(())
    }

    #[test]
    fn a_rounding_bound_splits_rounded_values_where_the_values_split() {
        let values = samples();
        for at_least in [
            1, 99, 100, 101, 150, 999, 1_000, 1_001, 2_950, 3_000, 12_345,
        ] {
            let bound = rounding_bound(at_least);
            assert!(bound >= at_least, "{at_least} → {bound}");
            // No smaller bound would do: values between at_least and bound share a rounding
            // with values below at_least.
            assert!(
                bound == at_least || round_up(at_least - 1) == round_up(bound - 1),
                "{at_least} → {bound}"
            );
            for &value in &values {
                assert_eq!(
                    value >= bound,
                    round_up(value) >= round_up(bound),
                    "{value} against bound {bound} (at least {at_least})"
                );
            }
        }
    }

    /// DuckDB's count of a set's rollup rows, every holder of an extreme counted by joining
    /// the rows back to their cell (the way [`cells::write`] spares).
    fn joined_cells(source: &str) -> String {
        let grouped: Vec<String> = grouping_sets()
            .map(|set| {
                let rows = cell_rows(&set, source);
                let on: Vec<String> = CELL
                    .iter()
                    .map(|part| format!("s.{part} IS NOT DISTINCT FROM c.{part}"))
                    .collect();
                format!(
                    "SELECT '{name}' AS grouping, c.*,
                            count_if(s.measure = c.d_min) AS d_min_n,
                            count_if(s.measure = c.d_max) AS d_max_n,
                            count_if(s.creation_time_ms = c.c_min) AS c_min_n,
                            count_if(s.last_ms = c.l_max) AS l_max_n
                     FROM {rows} s JOIN (SELECT {cell}, {aggregates} FROM {rows} GROUP BY ALL) c
                         ON {on}
                     GROUP BY ALL",
                    name = set.name,
                    cell = CELL.join(", "),
                    aggregates = aggregates(&set),
                    on = on.join(" AND "),
                )
            })
            .collect();
        grouped.join(" UNION ALL ")
    }

    /// Asserts that the relations `a` and `b` hold the same rows, each as many times.
    fn assert_same_rows(
        connection: &Connection,
        a: &str,
        b: &str,
        what: &str,
    ) -> Result<(), duckdb::Error> {
        for (left, right) in [(a, b), (b, a)] {
            let extra: i64 = connection.query_row(
                &format!(
                    "SELECT count(*) FROM (SELECT * FROM {left} EXCEPT ALL SELECT * FROM {right})"
                ),
                [],
                |row| row.get(0),
            )?;
            assert_eq!(extra, 0, "{what}: rows of {left} not in {right}");
        }
        Ok(())
    }

    /// Rows with nulls in every nullable column, ties at every extreme, both signs, and
    /// failures with messages.
    const SYNTHETIC_SOURCE: &str = "CREATE TABLE source AS SELECT
        'task' || (i % 7000) AS task_id,
        CASE WHEN i % 97 = 0 THEN NULL ELSE (i % 3)::INTEGER END AS attempt_number,
        CASE WHEN i % 11 = 0 THEN NULL ELSE 'job' || (i % 4) END AS job_id,
        ['FINISHED', 'FAILED', 'RUNNING'][1 + i % 3] AS state,
        CASE WHEN i % 7 = 0 THEN NULL ELSE ['NORMAL_TASK', 'ACTOR_TASK'][1 + i % 2] END AS type,
        CASE WHEN i % 13 = 0 THEN NULL ELSE 'f' || (i % 6) END AS name,
        CASE WHEN i % 17 = 0 THEN NULL ELSE 'm.f' || (i % 5) END AS func_or_class_name,
        CASE WHEN i % 3 = 1 AND i % 4 <> 0 THEN 'E' || (i % 2) END AS error_type,
        CASE WHEN i % 19 = 0 THEN NULL ELSE 'node' || (i % 5) END AS node_id,
        CASE WHEN i % 23 = 0 THEN NULL ELSE 'worker' || (i % 29) END AS worker_id,
        i % 9 <> 0 AS complete,
        CASE WHEN i % 10 = 0 THEN NULL ELSE (hash(i) % 40) * 37 END::BIGINT AS duration_ms,
        CASE WHEN i % 31 = 0 THEN NULL ELSE 1000 + (hash(i + 1) % 50) END::BIGINT
            AS creation_time_ms,
        CASE WHEN i % 37 = 0 THEN NULL ELSE 5000 + (hash(i + 2) % 60) END::BIGINT AS last_ms,
        CASE WHEN i % 8 = 0 THEN NULL ELSE (hash(i + 3) % 30) * 113 END::BIGINT AS wait_ms,
        CASE WHEN i % 3 = 1 AND i % 4 <> 0 THEN 'fp' || (i % 3) END AS fingerprint,
        CASE WHEN i % 3 = 1 AND i % 4 <> 0 THEN 'message ' || (hash(i + 4) % 9) END
            AS error_message,
        CASE WHEN i % 5 = 0 THEN -1 ELSE 1 END AS sign
    FROM range(30000) t(i)";

    /// A database whose table `source` holds [`SYNTHETIC_SOURCE`]'s rows.
    fn synthetic_source() -> Result<Connection, TableError> {
        let connection = crate::tables::open_duckdb()?;
        connection.execute_batch(SYNTHETIC_SOURCE)?;
        Ok(connection)
    }

    /// Writes the rollup of `source` to `path` as built ([`cells::write`]). Returns its rows.
    fn count_in_rust(connection: &Connection, path: &Path) -> Result<u64, TableError> {
        cells::write(connection, &source_rows(), &[], path, 1)
    }

    /// The query that streams `source`'s rows to be counted.
    fn source_rows() -> String {
        format!("SELECT {} FROM source", cells::select_list())
    }

    /// Writes the rollup of `source` to `path` as DuckDB's join counts it ([`joined_cells`]).
    fn count_joined(connection: &Connection, path: &Path) -> Result<(), duckdb::Error> {
        connection.execute_batch(&format!(
            "COPY ({}) TO {} (FORMAT parquet, COMPRESSION zstd)",
            joined_cells("source"),
            path_literal(path)
        ))
    }

    #[test]
    fn cells_counted_in_rust_are_the_cells_duckdb_counts() -> Result<(), Box<dyn std::error::Error>>
    {
        // On one thread, and dealt to four whose cells are combined (each counting some rows).
        for threads in [1, 4] {
            let (written, counters) = cells_against_duckdb(threads)?;
            assert_eq!(counters, threads, "threads that counted rows");
            assert!(written > 1_000, "{written} cells");
        }
        Ok(())
    }

    /// Counts [`SYNTHETIC_SOURCE`] on `threads` threads and compares the rollup with DuckDB's
    /// count. Returns the rollup's rows and how many threads counted any.
    fn cells_against_duckdb(threads: usize) -> Result<(u64, usize), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = synthetic_source()?;
        let ours = dir.path().join("ours.parquet");
        let (written, counters) =
            cells::write_on(&connection, &source_rows(), &[], &ours, threads)?;
        let theirs = dir.path().join("theirs.parquet");
        count_joined(&connection, &theirs)?;
        let count = |sql: &str| -> Result<i64, duckdb::Error> {
            connection.query_row(sql, [], |row| row.get::<_, i64>(0))
        };
        let (ours, theirs) = (
            format!("read_parquet({})", path_literal(&ours)),
            format!("read_parquet({})", path_literal(&theirs)),
        );
        let expected = count(&format!("SELECT count(*) FROM {theirs}"))?;
        assert_eq!(written, expected as u64);
        assert_same_rows(&connection, &ours, &theirs, "ours and DuckDB's")?;
        assert_eq!(
            crate::tables::columns(&connection, &ours)?,
            crate::tables::columns(&connection, &theirs)?
        );
        // The synthetic rows reach every case: minus rows, several holders of an extreme,
        // cells with no measure, examples.
        for condition in [
            "sign < 0",
            "d_min_n > 1 AND d_min IS NOT NULL",
            "l_max_n > 1",
            "d_min IS NULL AND n > 0",
            "example IS NOT NULL",
            "group_key IS NULL AND grouping = 'name'",
        ] {
            let rows = count(&format!("SELECT count(*) FROM {ours} WHERE {condition}"))?;
            assert!(rows > 0, "no cell where {condition}");
        }
        Ok((written, counters))
    }

    /// A delta's rollup adds in the stored rollups of the deltas before it: counting the rows
    /// in three parts, each part's rollup adding in the one before, gives the rollup of all the
    /// rows counted at once (which equals DuckDB's count, above), minus rows, tied extremes and
    /// examples included.
    #[test]
    fn a_rollup_that_adds_in_earlier_rollups_counts_their_rows_too()
    -> Result<(), Box<dyn std::error::Error>> {
        // Adding in splits the sets among the threads: on one thread all of them, on eight
        // one thread two of them.
        for threads in [1, 2, 8] {
            adds_in_earlier_rollups(threads)?;
        }
        Ok(())
    }

    /// Counts [`SYNTHETIC_SOURCE`] in three parts on `threads` threads, each part adding in
    /// the one before, and compares the last with the whole counted at once.
    fn adds_in_earlier_rollups(threads: usize) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = synthetic_source()?;
        let whole = dir.path().join("whole.parquet");
        let written = count_in_rust(&connection, &whole)?;
        let mut previous: Vec<PathBuf> = Vec::new();
        let mut parts = Vec::new();
        // Parts that share cells and extremes: rows dealt by `hash`, not in ranges.
        for part in 0..3 {
            let path = dir.path().join(format!("part-{part}.parquet"));
            let query = format!("{} WHERE hash(task_id, sign) % 3 = {part}", source_rows());
            let rows = cells::write(&connection, &query, &previous, &path, threads)?;
            parts.push(rows);
            previous = vec![path];
        }
        let last = previous.first().ok_or("no part written")?;
        let count = |sql: &str| -> Result<i64, duckdb::Error> {
            connection.query_row(sql, [], |row| row.get::<_, i64>(0))
        };
        let (whole, added) = (
            format!("read_parquet({})", path_literal(&whole)),
            format!("read_parquet({})", path_literal(last)),
        );
        assert_same_rows(&connection, &whole, &added, &format!("{threads} threads"))?;
        assert_eq!(parts.last().copied(), Some(written));
        assert!(
            parts.first().is_some_and(|first| *first < written),
            "the first part already held every cell: {parts:?} of {written}"
        );
        // The parts split cells: a cell of the whole counted in more than one part.
        let split = count(&format!(
            "SELECT count(*) FROM read_parquet({}) p JOIN {whole} w
                 USING (grouping, group_key, job_id, state, type, complete, error_type, retried,
                        rounded, sign)
             WHERE p.n < w.n",
            path_literal(&dir.path().join("part-0.parquet"))
        ))?;
        assert!(split > 0, "no cell counted in two parts");
        Ok(())
    }

    #[test]
    fn a_rollup_keeps_each_grouping_set_in_row_groups_of_its_own()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = synthetic_source()?;
        let path = dir.path().join("rollup.parquet");
        let written = count_in_rust(&connection, &path)?;
        let file = path_literal(&path);
        // Each row against the one before it: by grouping set, then job (a null job first).
        let out_of_order: i64 = connection.query_row(
            &format!(
                "SELECT count(*) FROM (
                     SELECT grouping, job_id,
                            lag(grouping) OVER (ORDER BY file_row_number) AS previous,
                            lag(job_id) OVER (ORDER BY file_row_number) AS previous_job
                     FROM read_parquet({file}, file_row_number = true))
                 WHERE grouping < previous
                    OR (grouping = previous AND job_id IS NULL AND previous_job IS NOT NULL)
                    OR (grouping = previous AND job_id < previous_job)"
            ),
            [],
            |row| row.get(0),
        )?;
        assert_eq!(out_of_order, 0, "rollup rows out of (grouping, job) order");
        // Row groups small enough that a set's rows are few of them, and the test's file has
        // several: a read of one set then opens only the row groups its rows are in, the
        // others' `grouping` statistics ruling it out.
        let (groups, largest): (u64, u64) = connection.query_row(
            &format!(
                "SELECT count(*), max(row_group_num_rows)
                 FROM parquet_metadata({file}) WHERE path_in_schema = 'grouping'"
            ),
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?;
        assert!(
            groups >= 3,
            "{written} rows in {groups} row groups: too few to test"
        );
        assert!(
            largest <= cells::ROW_GROUP_ROWS,
            "a row group of {largest} rows"
        );
        let mut statement = connection.prepare(&format!(
            "SELECT s.grouping, s.n,
                    (SELECT count(*) FROM parquet_metadata({file}) m
                     WHERE m.path_in_schema = 'grouping'
                       AND s.grouping BETWEEN m.stats_min_value AND m.stats_max_value)
             FROM (SELECT grouping, count(*) AS n FROM read_parquet({file}) GROUP BY ALL) s"
        ))?;
        let sets = statement.query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, u64>(1)?,
                row.get::<_, u64>(2)?,
            ))
        })?;
        for set in sets {
            let (name, rows, opened) = set?;
            let needed = rows.div_ceil(cells::ROW_GROUP_ROWS) + 1;
            assert!(
                opened <= needed,
                "{name}: {rows} rows, yet {opened} row groups' statistics admit it"
            );
        }
        Ok(())
    }

    /// A counter that fails stops the count with its error; the thread handing it batches
    /// is not left waiting for it.
    #[test]
    fn a_failed_count_on_several_threads_is_an_error() -> Result<(), TableError> {
        let dir = tempfile::tempdir().map_err(|err| TableError::Corrupt(err.to_string()))?;
        let connection = synthetic_source()?;
        let without_sign = source_rows().replace("sign", "1 AS signed");
        let failed = cells::write_on(&connection, &without_sign, &[], &dir.path().join("r"), 4);
        assert!(
            matches!(&failed, Err(TableError::Corrupt(reason)) if reason.contains("sign")),
            "{:?}",
            failed.map(|(rows, _)| rows)
        );
        Ok(())
    }

    /// An earlier rollup that cannot be read fails the count that adds it in, on every
    /// thread count, rather than leaving the threads that take every batch waiting.
    #[test]
    fn an_unreadable_earlier_rollup_is_an_error_whatever_the_threads() -> Result<(), TableError> {
        let dir = tempfile::tempdir().map_err(|err| TableError::Corrupt(err.to_string()))?;
        let connection = synthetic_source()?;
        let damaged = dir.path().join("damaged.parquet");
        std::fs::write(&damaged, b"not a rollup")
            .map_err(|err| TableError::Corrupt(err.to_string()))?;
        // A Parquet file that is not a rollup: a column is missing.
        let other = dir.path().join("other.parquet");
        connection.execute_batch(&format!(
            "COPY (SELECT 1 AS n) TO {} (FORMAT parquet)",
            path_literal(&other)
        ))?;
        for previous in [damaged, other] {
            for threads in [1, 4] {
                let path = dir.path().join("r.parquet");
                let failed = cells::write(
                    &connection,
                    &source_rows(),
                    std::slice::from_ref(&previous),
                    &path,
                    threads,
                );
                assert!(
                    failed.is_err(),
                    "{previous:?} on {threads} threads: {failed:?}"
                );
            }
        }
        Ok(())
    }

    /// A session's versions: 3 000 attempts in a base and three deltas, each delta holding a
    /// new version of about two thirds of them. Versions move between states and extremes;
    /// every fifth attempt's versions are alike (a replacement that changes nothing); attempts
    /// waiting for arguments are in the base alone; a few have no state.
    const SYNTHETIC_SESSION: &str = "CREATE TABLE versions AS
        WITH keys AS (SELECT t, f, CASE WHEN t % 5 = 0 THEN 0 ELSE f END AS g
                      FROM range(3000) a(t), range(4) b(f)
                      WHERE f = 0 OR (t % 7 <> 3 AND hash(t, f) % 3 <> 0)),
        hashed AS (SELECT *, (hash(t, g) % 3)::INTEGER AS h FROM keys)
        SELECT f AS file,
            'task' || (t // 2) AS task_id,
            (t % 2)::INTEGER AS attempt_number,
            'job' || (t % 4) AS job_id,
            CASE WHEN t % 41 = 0 THEN NULL WHEN t % 7 = 3 THEN 'PENDING_ARGS_AVAIL'
                 ELSE ['RUNNING', 'FINISHED', 'FAILED'][1 + h] END AS state,
            'NORMAL_TASK' AS type,
            'f' || (t % 6) AS name,
            'm.f' || (t % 6) AS func_or_class_name,
            CASE WHEN h = 2 THEN 'E' || (t % 2) END AS error_type,
            'node' || (t % 3) AS node_id,
            'worker' || (t % 11) AS worker_id,
            CASE WHEN t % 13 = 0 THEN NULL ELSE 'f' || (t % 6) END AS def_name,
            CASE WHEN g = 0 AND t % 3 = 0 THEN NULL ELSE (hash(t, g, 1) % 20) * 7 END::BIGINT
                AS duration_ms,
            (1000 + t % 50 + g)::BIGINT AS creation_time_ms,
            (1100 + hash(t, g, 2) % 40)::BIGINT AS start_time_ms,
            CASE WHEN g = 0 THEN NULL ELSE 2000 + hash(t, g, 3) % 30 END::BIGINT AS end_time_ms,
            CASE WHEN h = 2 THEN 'message ' || (hash(t, g, 4) % 4) END
                AS error_message
        FROM hashed";

    /// Writes [`SYNTHETIC_SESSION`]'s base and deltas into `dir` with their rollups, as
    /// compaction does: delta 1 counts itself, delta 2 adds in delta 1's rollup, delta 3
    /// counts itself. Returns the new base a fold writes (the newest versions) and the
    /// rollups that add up to the session ([`crate::tables::manifest::TableFiles::rollups`]).
    fn synthetic_session(
        connection: &Connection,
        dir: &Path,
    ) -> Result<(PathBuf, Vec<PathBuf>), Box<dyn std::error::Error>> {
        connection.execute_batch(SYNTHETIC_SESSION)?;
        let columns = "task_id, attempt_number, job_id, state, type, name, func_or_class_name, \
             error_type, node_id, worker_id, def_name, duration_ms, creation_time_ms, \
             start_time_ms, end_time_ms, error_message";
        let files: Vec<PathBuf> = (0..4)
            .map(|file| dir.join(format!("file-{file}.parquet")))
            .collect();
        connection.execute_batch(
            "CREATE TABLE stored (file INTEGER, task_id VARCHAR, attempt_number INTEGER, row BIGINT)",
        )?;
        for (number, path) in files.iter().enumerate() {
            connection.execute_batch(&format!(
                "COPY (SELECT {columns} FROM versions WHERE file = {number}
                       ORDER BY task_id, attempt_number) TO {path} (FORMAT parquet);
                 INSERT INTO stored SELECT {number}, task_id, attempt_number, file_row_number
                     FROM read_parquet({path}, file_row_number = true);",
                path = path_literal(path),
            ))?;
        }
        let mut rollups = Vec::new();
        for (number, path) in files.iter().enumerate() {
            // The stored versions this file's rows replace: each key's newest before it.
            let mut superseded = RowsByFile::new();
            for (earlier, earlier_path) in files.iter().enumerate().take(number) {
                let mut statement = connection.prepare(&format!(
                    "SELECT s.row FROM stored s JOIN stored n USING (task_id, attempt_number)
                     WHERE n.file = {number} AND s.file = {earlier}
                       AND NOT EXISTS (SELECT 1 FROM stored b
                           WHERE b.task_id = s.task_id AND b.attempt_number = s.attempt_number
                             AND b.file > {earlier} AND b.file < {number})
                     ORDER BY s.row"
                ))?;
                let rows = statement
                    .query_map([], |row| row.get::<_, i64>(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                if !rows.is_empty() {
                    superseded.push((earlier_path.clone(), rows));
                }
            }
            let previous: Vec<PathBuf> = if number == 2 {
                rollups.pop().into_iter().collect()
            } else {
                Vec::new()
            };
            let rollup = dir.join(format!("rollup-{number}.parquet"));
            write_rollup(connection, path, &superseded, &previous, &rollup)?;
            rollups.push(rollup);
        }
        let base = dir.join("new-base.parquet");
        connection.execute_batch(&format!(
            "COPY (SELECT {columns} FROM versions v
                   WHERE file = (SELECT max(file) FROM versions w
                       WHERE w.task_id = v.task_id AND w.attempt_number = v.attempt_number)
                   ORDER BY job_id, creation_time_ms) TO {} (FORMAT parquet)",
            path_literal(&base)
        ))?;
        Ok((base, rollups))
    }

    /// A fold's rollup summed from the rollups of the files it replaces is row for row the
    /// rollup counted from its new base: minus cells taken out, extremes held only by
    /// superseded versions counted again by state, the other states' cells summed.
    #[test]
    fn a_folds_rollup_summed_from_the_rollups_it_replaces_is_the_one_counted()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = crate::tables::open_duckdb()?;
        let (base, rollups) = synthetic_session(&connection, dir.path())?;
        assert_eq!(rollups.len(), 3, "base, deltas 1-2 and delta 3");
        let counted = dir.path().join("counted.parquet");
        let rows = write_rollup(&connection, &base, &RowsByFile::new(), &[], &counted)?;
        let count = |sql: &str| -> Result<i64, duckdb::Error> {
            connection.query_row(sql, [], |row| row.get::<_, i64>(0))
        };
        let minus = count(&format!(
            "SELECT count(*) FROM read_parquet([{}]) WHERE sign = -1",
            rollups
                .iter()
                .map(|path| path_literal(path))
                .collect::<Vec<_>>()
                .join(", ")
        ))?;
        assert!(minus > 100, "{minus} minus rows: too few to test");
        for threads in [1, 2, 8] {
            let path = dir.path().join(format!("summed-{threads}.parquet"));
            let summed = summed_on(&connection, &base, &rollups, &path, threads)?;
            assert_eq!(summed.rows, rows, "{threads} threads");
            let (counted, summed_rows) = (
                format!("read_parquet({})", path_literal(&counted)),
                format!("read_parquet({})", path_literal(&path)),
            );
            let what = format!("{threads} threads");
            assert_same_rows(&connection, &counted, &summed_rows, &what)?;
            // Both ways were taken: some slices counted again (of a null state too), and the
            // waiting attempts, never superseded, summed.
            let recounted = |state: Option<&str>| {
                summed
                    .recounted
                    .iter()
                    .any(|slice| slice.state.as_deref() == state)
            };
            assert!(
                recounted(None) && summed.recounted.len() >= 2,
                "{threads} threads: {:?}",
                summed.recounted
            );
            assert!(
                !recounted(Some("PENDING_ARGS_AVAIL")),
                "{threads} threads: {:?}",
                summed.recounted
            );
            let waiting = count(&format!(
                "SELECT count(*) FROM {summed_rows} WHERE state = 'PENDING_ARGS_AVAIL'"
            ))?;
            assert!(waiting > 0, "{threads} threads: no waiting attempts' cells");
        }
        Ok(())
    }

    /// Rollups that do not add up to the session (the base's left out: its versions' minus
    /// rows have nothing to be taken from), or add up to other rows than the new base's, are
    /// an error, for the fold to count instead.
    #[test]
    fn rollups_that_do_not_add_up_are_not_summed() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = crate::tables::open_duckdb()?;
        let (base, rollups) = synthetic_session(&connection, dir.path())?;
        let deltas = rollups.get(1..).ok_or("no deltas")?;
        let path = dir.path().join("summed.parquet");
        let summed = summed_on(&connection, &base, deltas, &path, 2);
        assert!(
            matches!(&summed, Err(TableError::Corrupt(reason)) if reason.contains("never counted")),
            "{summed:?}"
        );
        // Rollups that add up, but to other rows than the base's (the old base's here): the
        // netting finds nothing wrong, the rows by slice do.
        let old_base = dir.path().join("file-0.parquet");
        let summed = summed_on(&connection, &old_base, &rollups, &path, 2);
        assert!(
            matches!(&summed, Err(TableError::Corrupt(reason))
                if reason.contains("state and completeness")),
            "{summed:?}"
        );
        Ok(())
    }

    /// A file with no rows (a fold of nothing) still gets a rollup: empty, with the columns
    /// DuckDB's own count writes, so that readers take its files and the older ones alike.
    #[test]
    fn an_empty_source_counts_into_an_empty_rollup_of_the_same_columns()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = synthetic_source()?;
        connection.execute_batch("DELETE FROM source")?;
        let ours = dir.path().join("ours.parquet");
        let written = count_in_rust(&connection, &ours)?;
        assert_eq!(written, 0);
        let theirs = dir.path().join("theirs.parquet");
        count_joined(&connection, &theirs)?;
        let describe = |file: &Path| {
            crate::tables::columns(
                &connection,
                &format!("read_parquet({})", path_literal(file)),
            )
        };
        assert_eq!(describe(&ours)?, describe(&theirs)?);
        Ok(())
    }
}
