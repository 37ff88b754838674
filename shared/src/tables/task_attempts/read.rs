//! Stored `task_attempts` rows back into merge state: which versions a [`RowFilter`] selects
//! (by scanning the stored keys, or at positions known beforehand), and each row turned back
//! into the [`TaskAttempt`] it came from.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use duckdb::{Connection, params};

use super::columns::STATUS_COLUMNS;
use crate::event::common::{Language, TaskType};
use crate::event::encoding::Id;
use crate::merge::{DefinitionSlot, LogInfo, Reported, ReportedError, TaskAttempt, TaskDefinition};
use crate::tables::TableError;
use crate::tables::newest::{path_literal, rows_at};
use crate::tables::report_times;
use crate::tables::rollup::RowsByFile;

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
/// Finding the rows scans every stored task id; [`crate::tables::stored_keys::StoredKeys`] finds them
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

/// Runs a query selecting stored `task_attempts` columns and reads each row back as merge
/// state.
pub(super) fn query_attempts(
    connection: &Connection,
    sql: &str,
) -> Result<Vec<TaskAttempt>, TableError> {
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
