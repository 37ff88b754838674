//! The `task_attempts` table: one row per `(task_id, attempt_number)` of a session, holding both
//! the state-API view (what queries read) and the merge state (what the next compaction merges
//! into), so a row can always be turned back into the [`TaskAttempt`] it came from.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use duckdb::arrow::record_batch::RecordBatch;
use duckdb::{Connection, params};

mod columns;

use self::columns::STATUS_COLUMNS;
pub use self::columns::status_columns;
pub(crate) use self::columns::{COLUMNS, STORED_COLUMNS};

use super::TableError;
use super::columns::names_and_types;
use super::key_index::KeyIndex;
use super::newest::{path_literal, rows_at};
use super::parquet::{ArrowRows, Layout, ParquetFile};
use super::report_times;
use super::rollup::RowsByFile;

use crate::event::common::{Language, TaskType};
use crate::event::encoding::Id;
use crate::merge::{
    DefinitionSlot, FailureContext, LogInfo, Reported, ReportedError, TaskAttempt, TaskDefinition,
    TaskView,
};

/// The order of rows in every file, ascending with NULLs last: by job, then creation, so
/// row-group statistics let a job filter skip other jobs and a newest-first page skip older
/// row groups. A delta's rows are put in this order in Rust ([`row_order`]); a fold
/// interleaves the files in it ([`crate::compact::fold`]).
pub(crate) const SORT_KEY: [&str; 4] = ["job_id", "creation_time_ms", "task_id", "attempt_number"];

/// [`SORT_KEY`] as SQL's `ORDER BY` list.
pub(crate) fn sort_order() -> String {
    SORT_KEY.join(", ")
}

/// Where a fresh attempt's row goes in [`SORT_KEY`], as DuckDB orders it: ascending, NULLs
/// last (DuckDB's default), text by its bytes. Sorting references to the attempts before
/// their rows are built spares sorting the wide rows, as DuckDB would. Each id's first eight
/// bytes are held inline, so that comparing two keys rarely follows a pointer into an attempt,
/// which would make the sort several times slower. The job and creation time are the ones
/// [`TaskAttempt::view`] writes in the row; the test compares the file with DuckDB's
/// `ORDER BY` of it.
fn row_order(attempt: &TaskAttempt) -> impl Ord + '_ {
    let created = attempt.creation_time_ms();
    (
        inline_text(attempt.job_hex()),
        (created.is_none(), created),
        inline_text(attempt.task_id.as_ref().map(Id::as_hex)),
        attempt.attempt_number,
    )
}

/// Text ordered by its bytes, NULL last, its first eight bytes packed into an integer that
/// orders as they do (ids are hex: no NUL byte ties with the padding).
fn inline_text(text: Option<&str>) -> (bool, u64, &[u8]) {
    let Some(text) = text else {
        return (true, 0, &[]);
    };
    let (head, rest) = text.as_bytes().split_at(text.len().min(8));
    let mut packed = [0u8; 8];
    for (slot, byte) in packed.iter_mut().zip(head) {
        *slot = *byte;
    }
    (false, u64::from_be_bytes(packed), rest)
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

fn hex(id: Option<&Id>) -> Option<&str> {
    id.map(Id::as_hex)
}

fn at<T>(reported: Option<&Reported<T>>) -> Option<i64> {
    reported.map(|reported| reported.at)
}

/// Rows built at most at a time: a write holds at most two groups of batches (one being
/// written, the next being built) as Arrow columns.
const ROWS_PER_BATCH: usize = 122_880;

/// Groups of batches (a batch per core in each) a file's rows are split into, unless they are
/// too few or too many: [`write_delta`] writes one group while it builds the next.
const GROUPS: usize = 4;

/// Writes `attempts` as a `task_attempts` file at `path`, sorted by job and creation time (so
/// a table page's top-N skips row groups by their statistics), with their views under
/// `failures` and their report times by reference ([`report_times::encode`]). Returns the rows
/// written and their key index, to be written beside them; with no rows, no file is written.
pub fn write_delta(
    path: &Path,
    cluster: &str,
    session: &str,
    attempts: &[&TaskAttempt],
    failures: &FailureContext,
) -> Result<(u64, KeyIndex), TableError> {
    if attempts.is_empty() {
        return Ok((0, KeyIndex::default()));
    }
    let mut ordered = attempts.to_vec();
    ordered.sort_by_cached_key(|attempt| row_order(attempt));
    let attempts = ordered.as_slice();
    let mut index = KeyIndex::with_capacity(attempts.len());
    let builders = std::thread::available_parallelism().map_or(1, usize::from);
    // Several groups, so that writing one (encoding and compressing, one core) overlaps
    // building the next (a core per chunk).
    let per_batch = attempts
        .len()
        .div_ceil(builders * GROUPS)
        .clamp(1, ROWS_PER_BATCH);
    let chunks: Vec<&[&TaskAttempt]> = attempts.chunks(per_batch).collect();
    // Each batch with the keys of its task ids, taken from its column on the thread that built
    // it: read from the attempts on this thread, they would be a cache miss each.
    let encoded = |chunk: &&[&TaskAttempt]| -> Result<(RecordBatch, Vec<u32>), TableError> {
        let batch = batch_of(chunk, cluster, session, failures)?;
        let task_ids = batch
            .column_by_name(super::key_index::TASK_ID)
            .ok_or_else(|| TableError::Corrupt("a delta's rows without task ids".into()))?;
        let keys = KeyIndex::keys_of(task_ids)?;
        Ok((report_times::encode(&batch)?, keys))
    };
    let mut file: Option<ParquetFile> = None;
    let mut write = |batches: Vec<(RecordBatch, Vec<u32>)>| -> Result<(), TableError> {
        for (batch, keys) in batches {
            let open = match file.as_mut() {
                Some(open) => open,
                None => file.insert(ParquetFile::create(path, batch.schema(), &LAYOUT)?),
            };
            open.write(&batch)?;
            index.push_keys(&keys);
        }
        Ok(())
    };
    let mut built = Vec::new();
    for group in chunks.chunks(builders) {
        let (next, written) = on_threads(group, encoded, || write(std::mem::take(&mut built)));
        written?;
        built = next?;
    }
    write(built)?;
    let rows = match file {
        Some(file) => file.finish()?,
        None => 0,
    };
    Ok((rows, index))
}

/// The rows of the `task_attempts` file at `path` as a relation of its columns and
/// `row_number`, each row's position in the file (from 0): what describes a file just written
/// (its rollup and its key index) reads.
pub fn file_rows(path: &Path) -> String {
    format!(
        "(SELECT * EXCLUDE (file_row_number), file_row_number AS row_number FROM {})",
        super::newest::read_parquet(&[path], ", file_row_number = true")
    )
}

/// `work` over each of `items`, each on its own thread, the results in order, while
/// `meanwhile` runs on this thread.
fn on_threads<I: Sync, T: Send, M>(
    items: &[I],
    work: impl Fn(&I) -> Result<T, TableError> + Sync,
    meanwhile: impl FnOnce() -> M,
) -> (Result<Vec<T>, TableError>, M) {
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .iter()
            .map(|item| scope.spawn(|| work(item)))
            .collect();
        let done = meanwhile();
        let results = handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err(TableError::Corrupt("a row builder panicked".into())))
            })
            .collect();
        (results, done)
    })
}

/// The rows of `chunk` as one Arrow batch.
fn batch_of(
    chunk: &[&TaskAttempt],
    cluster: &str,
    session: &str,
    failures: &FailureContext,
) -> Result<RecordBatch, TableError> {
    let mut rows = ArrowRows::new(&names_and_types(COLUMNS), chunk.len())?;
    for attempt in chunk {
        append(
            &mut rows,
            cluster,
            session,
            &attempt.view(failures),
            attempt,
        )?;
    }
    rows.finish()
}

/// Appends the row of one attempt (and its view), its values in [`COLUMNS`] order.
fn append(
    rows: &mut ArrowRows,
    cluster: &str,
    session: &str,
    view: &TaskView,
    attempt: &TaskAttempt,
) -> Result<(), TableError> {
    let definition = attempt
        .definition
        .as_ref()
        .map(|reported| &reported.value.0);
    let required_resources = definition
        .map(|definition| serde_json::to_string(&definition.required_resources))
        .transpose()
        .map_err(|err| TableError::Corrupt(err.to_string()))?;
    let label_selector = definition
        .map(|definition| serde_json::to_string(&definition.label_selector))
        .transpose()
        .map_err(|err| TableError::Corrupt(err.to_string()))?;
    let profile = if attempt.profile.is_empty() {
        None
    } else {
        Some(
            serde_json::to_string(&attempt.profile)
                .map_err(|err| TableError::Corrupt(err.to_string()))?,
        )
    };
    let duration_ms = match (view.start_time_ms, view.end_time_ms) {
        (Some(start), Some(end)) => Some(end - start),
        _ => None,
    };
    let worker_pid = view
        .worker_pid
        .map(i32::try_from)
        .transpose()
        .map_err(|_| TableError::Corrupt(format!("worker pid {:?}", view.worker_pid)))?;
    let log = &attempt.log_info;
    let error = attempt.error.as_ref();
    rows.text(Some(cluster))?;
    rows.text(Some(session))?;
    rows.text(hex(view.task_id.as_ref()))?;
    rows.integer(Some(view.attempt_number))?;
    rows.text(hex(view.job_id.as_ref()))?;
    rows.text(Some(view.state.as_str()))?;
    rows.boolean(Some(view.synthesized_failure))?;
    rows.text(view.name.as_deref())?;
    rows.text(view.func_or_class_name.as_deref())?;
    rows.text(view.task_type.as_ref().map(TaskType::as_str))?;
    rows.text(view.language.as_ref().map(Language::as_str))?;
    rows.text(hex(view.actor_id.as_ref()))?;
    rows.text(hex(view.parent_task_id.as_ref()))?;
    rows.text(hex(view.placement_group_id.as_ref()))?;
    rows.text(hex(view.node_id.as_ref()))?;
    rows.text(hex(view.worker_id.as_ref()))?;
    rows.integer(worker_pid)?;
    rows.text(view.error_type.as_deref())?;
    rows.text(view.error_message.as_deref())?;
    rows.big_int(view.creation_time_ms)?;
    rows.big_int(view.start_time_ms)?;
    rows.big_int(view.end_time_ms)?;
    rows.big_int(duration_ms)?;
    for (number, _) in STATUS_COLUMNS {
        rows.big_int(attempt.status_times.get(&number).copied())?;
    }
    rows.big_int(at(attempt.node_id.as_ref()))?;
    rows.big_int(at(attempt.worker_id.as_ref()))?;
    rows.big_int(at(attempt.worker_pid.as_ref()))?;
    rows.text(error.map(|error| error.value.error_type.as_str()))?;
    rows.text(error.map(|error| error.value.message.as_str()))?;
    rows.big_int(at(error))?;
    rows.text(
        attempt
            .actor_repr_name
            .as_ref()
            .map(|repr| repr.value.as_str()),
    )?;
    rows.big_int(at(attempt.actor_repr_name.as_ref()))?;
    rows.boolean(
        attempt
            .is_debugger_paused
            .as_ref()
            .map(|paused| paused.value),
    )?;
    rows.big_int(at(attempt.is_debugger_paused.as_ref()))?;
    for file in [&log.stdout_file, &log.stderr_file] {
        rows.text(file.as_ref().map(|file| file.value.as_str()))?;
        rows.big_int(at(file.as_ref()))?;
    }
    for offset in [
        &log.stdout_start,
        &log.stdout_end,
        &log.stderr_start,
        &log.stderr_end,
    ] {
        rows.big_int(offset.as_ref().map(|offset| offset.value))?;
        rows.big_int(at(offset.as_ref()))?;
    }
    rows.big_int(at(attempt.definition.as_ref()))?;
    rows.text(definition.map(|definition| definition.name.as_str()))?;
    rows.text(definition.map(|definition| definition.module_name.as_str()))?;
    rows.text(definition.map(|definition| definition.class_name.as_str()))?;
    rows.text(definition.map(|definition| definition.function_name.as_str()))?;
    rows.text(hex(
        definition.and_then(|definition| definition.actor_id.as_ref())
    ))?;
    rows.text(required_resources.as_deref())?;
    rows.text(definition.map(|definition| definition.serialized_runtime_env.as_str()))?;
    rows.text(definition.and_then(|definition| definition.call_site.as_deref()))?;
    rows.text(label_selector.as_deref())?;
    rows.text(profile.as_deref())?;
    rows.end_row()
}

/// Which stored rows [`read_attempts`] returns.
#[derive(Clone, Debug, Default)]
pub struct RowFilter {
    /// These attempts, by `(task id hex, attempt number)`.
    pub keys: Vec<(String, i32)>,
    /// Plus every attempt of these jobs (hex) that is not finished or only failed by synthesis.
    pub unfinished_of_jobs: Vec<String>,
    /// Plus every such attempt that ran on these workers (hex).
    pub unfinished_on_workers: Vec<String>,
}

impl RowFilter {
    /// True when it selects unfinished attempts of some job or worker, besides its keys.
    pub fn names_unfinished(&self) -> bool {
        !self.unfinished_of_jobs.is_empty() || !self.unfinished_on_workers.is_empty()
    }
}

/// Reads the stored rows `filter` selects from `files`, as merge state. Every version of a
/// selected attempt comes back (one per file that has it), never just the versions that match:
/// an old version may still look unfinished after a newer one finished. Merging all versions is
/// harmless (merges are idempotent) and gives the newest state.
///
/// Finding the rows scans every stored task id; [`super::stored_keys::StoredKeys`] finds them
/// from positions it keeps, and reads them with [`read_located`].
pub fn read_attempts(
    connection: &Connection,
    files: &[PathBuf],
    filter: &RowFilter,
) -> Result<StoredRows, TableError> {
    if files.is_empty() {
        return Ok(StoredRows::default());
    }
    let located = locate(connection, files, filter)?;
    read_located(connection, files, &located)
}

/// Where the stored rows a [`RowFilter`] selects are: by file (its index among the files
/// read), the row numbers of every version, ascending, and those of the live versions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Located {
    /// Every version's row number, by file.
    pub rows: BTreeMap<usize, Vec<i64>>,
    /// The live versions' (each attempt's version in the newest file that has it).
    pub live: BTreeMap<usize, Vec<i64>>,
}

/// The rows of every job and worker `filter` names as unfinished, that are not finished, or
/// failed only by synthesis: the attempts an end or death may fail.
const UNFINISHED: &str = "(t.state NOT IN ('FINISHED', 'FAILED') OR t.synthesized_failure)
           AND (t.job_id IN (SELECT job_id FROM wanted_jobs)
                OR t.worker_id IN (SELECT worker_id FROM wanted_workers))";

/// Stages the jobs and workers of `filter` (and its keys, when `keys`) in temporary tables
/// the statements of [`locate`] and [`unfinished_keys`] read.
fn stage_filter(connection: &Connection, filter: &RowFilter, keys: bool) -> Result<(), TableError> {
    connection.execute_batch(
        "DROP TABLE IF EXISTS wanted_keys; DROP TABLE IF EXISTS wanted_jobs; DROP TABLE IF EXISTS wanted_workers;
         CREATE TEMP TABLE wanted_keys (task_id VARCHAR, attempt_number INTEGER);
         CREATE TEMP TABLE wanted_jobs (job_id VARCHAR);
         CREATE TEMP TABLE wanted_workers (worker_id VARCHAR);",
    )?;
    if keys {
        let mut appender = connection.appender("wanted_keys")?;
        for (task, attempt) in &filter.keys {
            appender.append_row(params![task, attempt])?;
        }
        appender.flush()?;
    }
    let mut jobs = connection.appender("wanted_jobs")?;
    for job in &filter.unfinished_of_jobs {
        jobs.append_row(params![job])?;
    }
    jobs.flush()?;
    let mut workers = connection.appender("wanted_workers")?;
    for worker in &filter.unfinished_on_workers {
        workers.append_row(params![worker])?;
    }
    workers.flush()?;
    Ok(())
}

/// Finds the rows `filter` selects in `files` by scanning their keys.
fn locate(
    connection: &Connection,
    files: &[PathBuf],
    filter: &RowFilter,
) -> Result<Located, TableError> {
    stage_filter(connection, filter, true)?;
    // Two steps, so a session's millions of stored rows are never read whole: a narrow scan
    // (keys and the few columns the filter needs) finds where the wanted rows are, then only
    // the row groups holding them are read in full.
    let list: Vec<String> = files.iter().map(|path| path_literal(path)).collect();
    let unfinished = if filter.names_unfinished() {
        format!("UNION SELECT task_id, attempt_number FROM t WHERE {UNFINISHED}")
    } else {
        String::new()
    };
    let locate = format!(
        "WITH t AS (SELECT task_id, attempt_number, state, synthesized_failure, job_id, worker_id,
                           file_index::BIGINT AS file_index, file_row_number
                    FROM read_parquet([{files}], hive_partitioning = false,
                                      union_by_name = true, file_row_number = true)),
              k AS (SELECT task_id, attempt_number FROM wanted_keys {unfinished})
         SELECT file_index, file_row_number,
                file_index = max(file_index) OVER (PARTITION BY task_id, attempt_number) AS live
         FROM t
         WHERE EXISTS (SELECT 1 FROM k
                       WHERE k.task_id = t.task_id AND k.attempt_number = t.attempt_number)
         ORDER BY file_index, file_row_number",
        files = list.join(", ")
    );
    let mut located = Located::default();
    let mut statement = connection.prepare(&locate)?;
    let rows = statement.query_map([], |row| {
        Ok((
            row.get::<_, i64>(0)?,
            row.get::<_, i64>(1)?,
            row.get::<_, bool>(2)?,
        ))
    })?;
    for row in rows {
        let (file, number, live) = row?;
        let file = usize::try_from(file).map_err(|err| TableError::Corrupt(err.to_string()))?;
        located.rows.entry(file).or_default().push(number);
        if live {
            located.live.entry(file).or_default().push(number);
        }
    }
    Ok(located)
}

/// The attempts in `files` that `filter` names as unfinished (see [`RowFilter`]), each once.
pub fn unfinished_keys(
    connection: &Connection,
    files: &[PathBuf],
    filter: &RowFilter,
) -> Result<Vec<(String, i32)>, TableError> {
    if files.is_empty() || !filter.names_unfinished() {
        return Ok(Vec::new());
    }
    stage_filter(connection, filter, false)?;
    let list: Vec<String> = files.iter().map(|path| path_literal(path)).collect();
    let sql = format!(
        "SELECT DISTINCT task_id, attempt_number
         FROM read_parquet([{files}], hive_partitioning = false, union_by_name = true) t
         WHERE {UNFINISHED} AND task_id IS NOT NULL AND attempt_number IS NOT NULL",
        files = list.join(", ")
    );
    let mut statement = connection.prepare(&sql)?;
    let keys = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
    Ok(keys.collect::<Result<_, _>>()?)
}

/// Reads the rows at `located` in `files` (as [`read_attempts`] returns them).
pub fn read_located(
    connection: &Connection,
    files: &[PathBuf],
    located: &Located,
) -> Result<StoredRows, TableError> {
    let mut stored = StoredRows::default();
    for (index, numbers) in &located.rows {
        let Some(file) = files.get(*index) else {
            return Err(TableError::Corrupt(format!("no file number {index}")));
        };
        // Every column, by name: files of an older format lack the `…_ref` columns (report
        // times stored by reference).
        for sql in rows_at(file, numbers, "*") {
            stored.attempts.extend(query_attempts(connection, &sql)?);
        }
        stored
            .positions
            .extend(numbers.iter().map(|&number| (*index as i64, number)));
    }
    for (index, numbers) in &located.live {
        if let Some(file) = files.get(*index) {
            stored.live.push((file.clone(), numbers.clone()));
        }
    }
    Ok(stored)
}

/// Stored rows read back by [`read_attempts`], and where they were.
#[derive(Debug, Default)]
pub struct StoredRows {
    /// Every version of each selected attempt, as merge state.
    pub attempts: Vec<TaskAttempt>,
    /// Those versions' `(file index, row number)`: the rows a delta holding the attempts'
    /// merges supersedes.
    pub positions: Vec<(i64, i64)>,
    /// The versions among them that were live (each attempt's newest, the others being
    /// superseded already): what the delta's rollup subtracts.
    pub live: RowsByFile,
}

/// Writes the deletion vector of a delta: the `(file, row)` positions it supersedes, sorted,
/// to `path`. Returns the pairs written; with none, nothing is written.
pub fn write_deletes(
    connection: &Connection,
    positions: &[(i64, i64)],
    path: &Path,
) -> Result<u64, TableError> {
    if positions.is_empty() {
        return Ok(0);
    }
    connection.execute_batch(
        "DROP TABLE IF EXISTS staged_deletes;
         CREATE TEMP TABLE staged_deletes (file BIGINT, row BIGINT);",
    )?;
    {
        let mut appender = connection.appender("staged_deletes")?;
        for (file, row) in positions {
            appender.append_row(params![file, row])?;
        }
        appender.flush()?;
    }
    let copy = format!(
        "COPY (SELECT DISTINCT file, row FROM staged_deletes ORDER BY file, row) TO {} \
         (FORMAT parquet, COMPRESSION zstd)",
        path_literal(path)
    );
    let written = connection.execute(&copy, [])? as u64;
    connection.execute_batch("DROP TABLE staged_deletes;")?;
    Ok(written)
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

/// Runs a query selecting stored `task_attempts` columns and reads each row back as merge
/// state.
fn query_attempts(connection: &Connection, sql: &str) -> Result<Vec<TaskAttempt>, TableError> {
    let mut statement = connection.prepare(sql)?;
    let mut rows = statement.query([])?;
    let columns: HashMap<String, usize> = rows
        .as_ref()
        .map(|statement| statement.column_names())
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(index, name)| (name, index))
        .collect();
    let mut attempts = Vec::new();
    while let Some(row) = rows.next()? {
        attempts.push(attempt_from_row(row, &columns)?);
    }
    Ok(attempts)
}

/// A JSON map column; empty when null.
fn parse_json<T: serde::de::DeserializeOwned + Default>(
    name: &str,
    text: Option<String>,
) -> Result<T, TableError> {
    text.map(|json| serde_json::from_str(&json))
        .transpose()
        .map_err(|err| TableError::Corrupt(format!("{name}: {err}")))
        .map(Option::unwrap_or_default)
}

fn attempt_from_row(
    row: &duckdb::Row<'_>,
    columns: &HashMap<String, usize>,
) -> Result<TaskAttempt, TableError> {
    let column_index = |name: &str| -> Result<usize, TableError> {
        columns
            .get(name)
            .copied()
            .ok_or_else(|| TableError::Corrupt(format!("no column {name}")))
    };
    let text = |name: &str| -> Result<Option<String>, TableError> {
        Ok(row.get::<_, Option<String>>(column_index(name)?)?)
    };
    let number = |name: &str| -> Result<Option<i64>, TableError> {
        Ok(row.get::<_, Option<i64>>(column_index(name)?)?)
    };
    // Report times, resolved from their references (see `report_times`).
    let mut unreadable = None;
    let times = report_times::decode(|name| match columns.get(name) {
        None => None,
        Some(index) => row.get::<_, Option<i64>>(*index).unwrap_or_else(|err| {
            unreadable = Some(err);
            None
        }),
    })
    .map_err(|err| TableError::Corrupt(err.to_string()))?;
    if let Some(err) = unreadable {
        return Err(err.into());
    }
    let time = |name: &str| -> Option<i64> {
        times
            .iter()
            .find(|(column, _)| *column == name)
            .and_then(|(_, time)| *time)
    };
    let flag = |name: &str| -> Result<Option<bool>, TableError> {
        Ok(row.get::<_, Option<bool>>(column_index(name)?)?)
    };
    let id = |name: &str| -> Result<Option<Id>, TableError> {
        match text(name)? {
            None => Ok(None),
            Some(hex) => Id::from_hex(&hex)
                .map(Some)
                .ok_or_else(|| TableError::Corrupt(format!("{name} is not hex: {hex:?}"))),
        }
    };
    fn reported<T>(value: Option<T>, at: Option<i64>) -> Option<Reported<T>> {
        match (value, at) {
            (Some(value), Some(at)) => Some(Reported { at, value }),
            _ => None,
        }
    }

    let mut status_times = BTreeMap::new();
    for (status, column) in STATUS_COLUMNS {
        if let Some(at) = number(column)? {
            status_times.insert(status, at);
        }
    }
    let attempt_number = row
        .get::<_, Option<i32>>(column_index("attempt_number")?)?
        .ok_or_else(|| TableError::Corrupt("attempt_number is null".to_owned()))?;
    let definition = match time("definition_at") {
        None => None,
        Some(definition_at) => Some(Reported {
            at: definition_at,
            value: DefinitionSlot(TaskDefinition {
                name: text("def_name")?.unwrap_or_default(),
                task_type: text("type")?
                    .map_or_else(TaskType::default, |name| TaskType::from_name(&name)),
                language: text("language")?
                    .map_or_else(Language::default, |name| Language::from_name(&name)),
                module_name: text("module_name")?.unwrap_or_default(),
                class_name: text("class_name")?.unwrap_or_default(),
                function_name: text("function_name")?.unwrap_or_default(),
                parent_task_id: id("parent_task_id")?,
                actor_id: id("def_actor_id")?,
                placement_group_id: id("placement_group_id")?,
                required_resources: parse_json("required_resources", text("required_resources")?)?,
                serialized_runtime_env: text("serialized_runtime_env")?.unwrap_or_default(),
                call_site: text("call_site")?,
                label_selector: parse_json("label_selector", text("label_selector")?)?,
            }),
        }),
    };
    let error = match (
        text("reported_error_type")?,
        text("reported_error_message")?,
        time("reported_error_at"),
    ) {
        (Some(error_type), Some(message), Some(at)) => Some(Reported {
            at,
            value: ReportedError {
                error_type,
                message,
            },
        }),
        _ => None,
    };
    let worker_pid = match row.get::<_, Option<i64>>(column_index("worker_pid")?)? {
        Some(pid) => {
            Some(u32::try_from(pid).map_err(|_| TableError::Corrupt(format!("worker_pid {pid}")))?)
        }
        None => None,
    };
    Ok(TaskAttempt {
        task_id: id("task_id")?,
        attempt_number,
        job_id: id("job_id")?,
        definition,
        status_times,
        node_id: reported(id("node_id")?, time("node_id_at")),
        worker_id: reported(id("worker_id")?, time("worker_id_at")),
        worker_pid: reported(worker_pid, time("worker_pid_at")),
        error,
        actor_repr_name: reported(text("actor_repr_name")?, number("actor_repr_name_at")?),
        is_debugger_paused: reported(
            flag("is_debugger_paused")?,
            number("is_debugger_paused_at")?,
        ),
        log_info: LogInfo {
            stdout_file: reported(text("stdout_file")?, time("stdout_file_at")),
            stderr_file: reported(text("stderr_file")?, time("stderr_file_at")),
            stdout_start: reported(number("stdout_start")?, time("stdout_start_at")),
            stdout_end: reported(number("stdout_end")?, time("stdout_end_at")),
            stderr_start: reported(number("stderr_start")?, time("stderr_start_at")),
            stderr_end: reported(number("stderr_end")?, time("stderr_end_at")),
        },
        profile: parse_json("profile_events", text("profile_events")?)?,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::event::common::TaskStatus;

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
