//! Rollups: beside each `task_attempts` base and delta, its attempts counted by grouping value,
//! job, state, type, error type, retry and rounded measure (duration, or for the waits the
//! time to start), so the summary, the aggregates and the insights read thousands of rows
//! instead of every attempt.
//!
//! `complete` is whether the attempt's definition was exported (Ray's lists omit those that
//! were not, and so do ours by default); `retried` whether it is a retry (attempt ≥ 1); `dated`
//! whether it has a creation time, which a time range selects by (an attempt without one is in
//! no range), so a session created wholly within a range is counted by its rollups' dated rows.
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
/// the deltas before it too ([`crate::tables::manifest::DataFile::rollup_covers`]), and every
/// cell keyed by `dated` as well. Builds that read format 2 alone would count those deltas
/// twice, so they scan instead. A session with a file whose rollup has a format this build
/// does not read (or none) is counted by scanning until its next base rewrites them all.
pub const FORMAT: u32 = 4;

/// The format that keeps apart, in format 3's cells, the rows with a creation time (`dated`).
/// Only a session whose every rollup has it answers a time range from them; a rollup adds in
/// or sums only rollups of its own format, so that none of its cells is of unknown `dated`.
pub const DATED: u32 = 4;

/// Whether this build reads rollups of `format`: format 2's are format 3's that count their
/// own file alone, and format 3's are [`DATED`]'s without `dated`.
pub fn reads_format(format: u32) -> bool {
    (2..=FORMAT).contains(&format)
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

/// The grouping sets a cluster's rollup keeps ([`crate::tables::cluster_rollup`]): those whose
/// groups recur from session to session (code, jobs, errors, and the totals). A node or a
/// worker belongs to one session, so their sets would only lay every session's rows side by
/// side; reads by node or worker read the sessions' own rollups.
pub const CLUSTER_GROUPINGS: [&str; 7] = [
    "name",
    "func_or_class_name",
    "error_type",
    "job_id",
    TOTALS,
    WAITS,
    FAILURES,
];

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
const CELL: [&str; 10] = [
    "group_key",
    "job_id",
    "state",
    "type",
    "complete",
    "error_type",
    "retried",
    "dated",
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
             attempt_number >= 1 AS retried, creation_time_ms IS NOT NULL AS dated, \
             {rounded} AS rounded, sign, \
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

/// Writes to `path` the stored rollups `stored` (every rollup of the sessions it counts, or an
/// earlier sum of them) summed over [`CLUSTER_GROUPINGS`]: a cluster's rollup. Returns its row
/// count; an error when they do not sum exactly (an extreme only a superseded version held),
/// and the sessions are then read by their own rollups.
pub fn write_cluster_sum(
    connection: &Connection,
    stored: &[PathBuf],
    path: &Path,
) -> Result<u64, TableError> {
    cells::write_sum(connection, stored, &CLUSTER_GROUPINGS, path, every_core())
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
mod tests;
