//! Attempts into a `task_attempts` delta: rows ordered by [`super::SORT_KEY`] in Rust, built into
//! Arrow batches on threads while the previous group is written, each with its report times by
//! reference; and the delta's deletion vector, the stored rows it supersedes.

use std::path::Path;

use duckdb::arrow::record_batch::RecordBatch;
use duckdb::{Connection, params};

use super::columns::STATUS_COLUMNS;
use super::{COLUMNS, LAYOUT};
use crate::event::common::{Language, TaskType};
use crate::event::encoding::Id;
use crate::merge::{FailureContext, Reported, TaskAttempt, TaskView};
use crate::tables::TableError;
use crate::tables::columns::names_and_types;
use crate::tables::key_index::KeyIndex;
use crate::tables::newest::path_literal;
use crate::tables::parquet::{ArrowRows, ParquetFile};
use crate::tables::report_times;

fn hex(id: Option<&Id>) -> Option<&str> {
    id.map(Id::as_hex)
}

fn at<T>(reported: Option<&Reported<T>>) -> Option<i64> {
    reported.map(|reported| reported.at)
}

/// Where a fresh attempt's row goes in [`super::SORT_KEY`], as DuckDB orders it: ascending, NULLs
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
            .column_by_name(crate::tables::key_index::TASK_ID)
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
