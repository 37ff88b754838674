//! `/api/clusters`, `/api/summary`, `/api/tasks` and `/api/tasks/{task_id}`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use duckdb::types::Value;
use serde_json::{Map, Value as Json, json};

use super::json::{JsonRow, arrow_row, query_as, query_rows};
use super::params::{Cursor, Params, Scope, TaskFilter, parse_hex};
use super::rollups;
use super::snapshot::{IndexedFile, Needs, Snapshot, session_stats};
use super::sql::{Relation, Sql, SupersededRead, newest_rows, read_parquet, task_conditions};
use super::task_page::{TIE_BREAK, TaskPage, TaskSort};
use super::{QueryEngine, QueryError};
use crate::tables::task_attempts::status_columns;
use crate::tables::{key_index, task_block};

/// The fields of a task-table row (DESIGN §4), by Ray's state-API names.
pub(super) const ROW_COLUMNS: &[&str] = &[
    "cluster",
    "session_name",
    "task_id",
    "attempt_number",
    "name",
    "func_or_class_name",
    "type",
    "language",
    "state",
    "job_id",
    "actor_id",
    "parent_task_id",
    "placement_group_id",
    "node_id",
    "worker_id",
    "worker_pid",
    "error_type",
    "creation_time_ms",
    "start_time_ms",
    "end_time_ms",
    "duration_ms",
    "synthesized_failure",
];

/// The newest rows of `task_attempts` in scope, or `None` when there are none.
pub(super) async fn attempts_relation(
    engine: &QueryEngine,
    scope: &Scope,
) -> Result<Option<Relation>, QueryError> {
    let snapshot = engine
        .snapshot(
            scope,
            Needs {
                attempts: true,
                ..Needs::default()
            },
        )
        .await?;
    Ok(newest_of(&snapshot))
}

/// The newest rows of the `task_attempts` files in `snapshot`.
fn newest_of(snapshot: &Snapshot) -> Option<Relation> {
    let files = snapshot.task_attempts.files();
    if let Some(read) = SupersededRead::of(&files) {
        return Some(Relation::over_superseded_read(read, snapshot.pins.clone()));
    }
    newest_rows(&files).map(|text| Relation::over_files(text, snapshot.pins.clone()))
}

/// What a counting route reads for `filter`: the rollups of its files when they answer it,
/// else the attempts themselves.
pub(super) enum Counted {
    /// The rollups (see [`super::rollups`]); the attempts files are not even fetched.
    Rollups(Relation),
    /// The attempts (as [`filtered_relation`]).
    Attempts(Relation),
}

/// See [`Counted`]: rollups when they keep apart what `filter` selects by and what the route
/// groups by (`grouping`, a column, if any); `None` when no session in scope has attempts.
pub(super) async fn counted(
    engine: &QueryEngine,
    filter: &TaskFilter,
    grouping: Option<&str>,
) -> Result<Option<Counted>, QueryError> {
    if rollups::answer(filter, grouping) {
        let snapshot = engine
            .snapshot(
                &filter.scope,
                Needs {
                    rollups: true,
                    ..Needs::default()
                },
            )
            .await?;
        if let Some(paths) = snapshot
            .rollups
            .as_deref()
            .filter(|paths| !paths.is_empty())
        {
            let paths: Vec<&std::path::Path> = paths.iter().map(PathBuf::as_path).collect();
            let rollups = read_parquet(&paths, "");
            // A rollup that cannot be read (damaged in the bucket) must not fail every count
            // of its session until the next fold rewrites it: the attempts answer instead.
            // Binding the read opens every footer (DuckDB caches them).
            let bound = format!("SELECT * FROM {rollups} LIMIT 0");
            match engine
                .run(move |connection| Ok(connection.prepare(&bound).map(drop)?))
                .await
            {
                Ok(()) => {
                    return Ok(Some(Counted::Rollups(Relation::over_files(
                        rollups,
                        snapshot.pins.clone(),
                    ))));
                }
                Err(err @ QueryError::DuckDb(_)) => {
                    tracing::warn!(error = %err, "rollups not read; the attempts are counted");
                }
                // A timeout or a broken pool is no reason to scan: the scan would fare worse.
                Err(err) => return Err(err),
            }
        }
    }
    Ok(filtered_relation(engine, filter)
        .await?
        .map(Counted::Attempts))
}

/// The attempts a task filter reads: those of its sessions, or with `latest_attempt` each
/// task's latest only. `None` when no session in scope has any.
pub(super) async fn filtered_relation(
    engine: &QueryEngine,
    filter: &TaskFilter,
) -> Result<Option<Relation>, QueryError> {
    let relation = attempts_relation(engine, &filter.scope).await?;
    Ok(if filter.latest_attempt {
        relation.map(Relation::latest_attempts)
    } else {
        relation
    })
}

/// `GET /api/clusters`: every cluster and its sessions, from the catalog alone.
pub(super) async fn clusters(
    engine: &QueryEngine,
    params: &[(String, String)],
) -> Result<Json, QueryError> {
    let params = Params::parse(params, &Scope::PARAMS)?;
    let scope = Scope::from_params(&params)?;
    let clusters = session_stats(&**engine.storage(), &scope).await?;
    let clusters: Vec<Json> = clusters
        .into_iter()
        .map(|(cluster, sessions)| {
            let attempts: u64 = sessions.values().map(|stats| stats.attempts).sum();
            let sessions: Vec<Json> = sessions
                .into_iter()
                .map(|(session, stats)| {
                    json!({
                        "session_name": session,
                        "attempts": stats.attempts,
                        "first_ms": stats.first_ms,
                        "last_ms": stats.last_ms,
                    })
                })
                .collect();
            json!({"cluster": cluster, "attempts": attempts, "sessions": sessions})
        })
        .collect();
    Ok(json!({ "clusters": clusters }))
}

/// `GET /api/summary`: attempt counts by state, the total and the time span.
pub(super) async fn summary(
    engine: &QueryEngine,
    params: &[(String, String)],
) -> Result<Json, QueryError> {
    let params = Params::parse(params, &TaskFilter::PARAMS)?;
    let filter = TaskFilter::from_params(&params)?;
    let Some(summary) = summarized(engine, &filter).await? else {
        return Ok(json!({"total": 0, "by_state": {}, "first_ms": null, "last_ms": null}));
    };
    let mut by_state = Map::new();
    let mut total = 0_i64;
    for (state, n) in summary.by_state {
        total += n;
        if let Some(state) = state {
            by_state.insert(state, n.into());
        }
    }
    Ok(json!({
        "total": total, "by_state": by_state,
        "first_ms": summary.first_ms, "last_ms": summary.last_ms,
    }))
}

/// The summary of the attempts `filter` selects, from rollups when they answer it; `None`
/// when no session in scope has attempts.
async fn summarized(
    engine: &QueryEngine,
    filter: &TaskFilter,
) -> Result<Option<Summary>, QueryError> {
    Ok(match counted(engine, filter, None).await? {
        None => None,
        Some(Counted::Rollups(rollups)) => Some(rollups::summary(engine, &rollups, filter).await?),
        Some(Counted::Attempts(attempts)) => {
            Some(scanned_summary(engine, &attempts, filter).await?)
        }
    })
}

/// How many attempts `filter` selects, counted as the summary counts them.
pub(super) async fn attempts_counted(
    engine: &QueryEngine,
    filter: &TaskFilter,
) -> Result<u64, QueryError> {
    let total: i64 = summarized(engine, filter)
        .await?
        .map_or(0, |summary| summary.by_state.iter().map(|(_, n)| n).sum());
    Ok(u64::try_from(total).unwrap_or(0))
}

/// The summary's numbers: attempts by state, first and last time.
pub(super) struct Summary {
    /// (state, attempts), states with none left out.
    pub by_state: Vec<(Option<String>, i64)>,
    /// Earliest creation time.
    pub first_ms: Option<i64>,
    /// Latest time of any attempt.
    pub last_ms: Option<i64>,
}

/// The summary by scanning the attempts.
async fn scanned_summary(
    engine: &QueryEngine,
    relation: &Relation,
    filter: &TaskFilter,
) -> Result<Summary, QueryError> {
    let mut sql = Sql::default();
    sql.push("SELECT state, count(*) AS n, min(creation_time_ms) AS first_ms, ")
        // The maximum of each column, not of a per-row `greatest`: the same value, one pass
        // over three columns instead of an expression per row.
        .push("greatest(max(creation_time_ms), max(start_time_ms), max(end_time_ms)) AS last_ms FROM ")
        .relation(relation)
        .push(" WHERE ")
        .append(task_conditions(filter))
        .push(" GROUP BY state ORDER BY state");
    /// One state's attempts.
    #[derive(serde::Deserialize)]
    struct StateCount {
        state: Option<String>,
        n: i64,
        first_ms: Option<i64>,
        last_ms: Option<i64>,
    }
    let rows: Vec<StateCount> = engine
        .run(move |connection| query_as(connection, &sql.text, &sql.params))
        .await?;
    Ok(Summary {
        first_ms: rows.iter().filter_map(|row| row.first_ms).min(),
        last_ms: rows.iter().filter_map(|row| row.last_ms).max(),
        by_state: rows.into_iter().map(|row| (row.state, row.n)).collect(),
    })
}

/// `GET /api/tasks`: one page of the task table.
pub(super) async fn tasks(
    engine: &QueryEngine,
    params: &[(String, String)],
) -> Result<Json, QueryError> {
    let mut allowed = TaskFilter::PARAMS.to_vec();
    allowed.extend(["sort", "order", "limit", "cursor", "include_error_message"]);
    let params = Params::parse(params, &allowed)?;
    let filter = TaskFilter::from_params(&params)?;
    let sort = match params.choice("sort", &["creation", "duration"], "creation")? {
        "duration" => TaskSort::Duration,
        _ => TaskSort::Creation,
    };
    let descending = params.choice("order", &["desc", "asc"], "desc")? == "desc";
    let limit = params.limit()?;
    let with_error = params.flag("include_error_message")?;
    let kind = format!(
        "tasks:{}:{}",
        sort.name(),
        if descending { "desc" } else { "asc" }
    );
    let cursor = params.cursor(&kind)?;
    let Some(relation) = filtered_relation(engine, &filter).await? else {
        return Ok(json!({"tasks": [], "next": null}));
    };
    let mut columns: Vec<&'static str> = ROW_COLUMNS.to_vec();
    if with_error {
        columns.push("error_message");
    }
    let after = cursor
        .as_ref()
        .map(|cursor| task_position(&cursor.after))
        .transpose()?;
    let page = TaskPage {
        filter: &filter,
        sort,
        descending,
        limit,
        after,
        columns: &columns,
    };
    let mut rows = page.rows(engine, &relation).await?;
    let next = page_cursor(&mut rows, limit, |last| Cursor {
        kind: kind.clone(),
        after: std::iter::once("sort_key")
            .chain(TIE_BREAK)
            .map(|column| last.get(column).cloned().unwrap_or(Json::Null))
            .collect(),
    });
    for row in &mut rows {
        row.remove("sort_key");
    }
    Ok(json!({"tasks": rows, "next": next}))
}

/// Most bytes of rows in one page. Lambda refuses a response over 6 MB, and it carries the body
/// as an escaped JSON string: a page of long stack traces must end early instead of failing.
pub(super) const PAGE_BYTES: usize = 4 * 1024 * 1024;

/// Trims a page fetched with one extra row, to `limit` rows and at most [`PAGE_BYTES`] (always
/// at least one row), and returns the cursor of the page's last row when there is more.
pub(super) fn page_cursor(
    rows: &mut Vec<JsonRow>,
    limit: usize,
    cursor_of: impl Fn(&JsonRow) -> Cursor,
) -> Option<String> {
    page_cursor_within(rows, limit, PAGE_BYTES, cursor_of)
}

fn page_cursor_within(
    rows: &mut Vec<JsonRow>,
    limit: usize,
    max_bytes: usize,
    cursor_of: impl Fn(&JsonRow) -> Cursor,
) -> Option<String> {
    let mut bytes = 0;
    let mut keep = 0;
    for row in rows.iter().take(limit) {
        bytes += serde_json::to_vec(row).map_or(0, |text| text.len()) + 1;
        if keep > 0 && bytes > max_bytes {
            tracing::info!(rows = keep, max_bytes, "page cut short by its size");
            break;
        }
        keep += 1;
    }
    if rows.len() <= keep {
        return None;
    }
    rows.truncate(keep);
    rows.last().map(|last| cursor_of(last).encode())
}

/// A task-table cursor's values, checked: `[sort value, cluster, session, task id, attempt]`.
pub(super) fn task_position(after: &[Json]) -> Result<Vec<(&'static str, Value)>, QueryError> {
    let invalid = || QueryError::BadRequest("`cursor` is not a cursor this route returned".into());
    let [sort_value, cluster, session, task_id, attempt] = after else {
        return Err(invalid());
    };
    let number = |value: &Json| value.as_i64().map(Value::BigInt).ok_or_else(invalid);
    let text = |value: &Json| {
        value
            .as_str()
            .map(|text| Value::Text(text.to_owned()))
            .ok_or_else(invalid)
    };
    Ok(vec![
        ("sort_key", number(sort_value)?),
        ("cluster", text(cluster)?),
        ("session_name", text(session)?),
        ("task_id", text(task_id)?),
        ("attempt_number", number(attempt)?),
    ])
}

/// `GET /api/tasks/{task_id}`: every attempt of a task, in every session in scope.
pub(super) async fn task(
    engine: &QueryEngine,
    task_id: &str,
    params: &[(String, String)],
) -> Result<Json, QueryError> {
    let params = Params::parse(params, &Scope::PARAMS)?;
    let scope = Scope::from_params(&params)?;
    let task_id = parse_hex("task_id", task_id)?;
    let filter = TaskFilter::everything_in(scope);
    let rows = match task_attempts_indexed(engine, &filter, &task_id).await? {
        Some(rows) => rows,
        None => {
            let snapshot = engine
                .snapshot(
                    &filter.scope,
                    Needs {
                        attempts: true,
                        ..Needs::default()
                    },
                )
                .await?;
            match newest_of(&snapshot) {
                Some(relation) => {
                    let mut sql = task_by_scan(&relation, &task_id, &filter);
                    sql.push(" ORDER BY cluster, session_name, attempt_number");
                    engine
                        .run(move |connection| query_rows(connection, &sql.text, &sql.params))
                        .await?
                }
                None => Vec::new(),
            }
        }
    };
    if rows.is_empty() {
        return Err(QueryError::NotFound(format!("no task {task_id}")));
    }
    let attempts: Vec<Json> = rows.into_iter().map(attempt_detail).collect();
    Ok(json!({"task_id": task_id, "attempts": attempts}))
}

/// The attempts of `task_id` that `filter` selects, in attempt order, found through the key
/// indexes of the files in scope (or in the rows held in memory, which a lookup through them
/// has the engine load when the scope is small); `None`, to scan instead, when a file in scope
/// has no key index, `filter` is not one decided in Rust, or a block is one the parquet crate
/// cannot read.
pub(super) async fn task_attempts_indexed(
    engine: &QueryEngine,
    filter: &TaskFilter,
    task_id: &str,
) -> Result<Option<Vec<JsonRow>>, QueryError> {
    // The rows found are checked in Rust, whether held in memory or read from their block.
    if !filter.decided_in_rust() {
        return Ok(None);
    }
    // The key indexes first, alone: a cold Lambda then downloads them and the few files they
    // name, not the session's base.
    let indexed = engine
        .snapshot(
            &filter.scope,
            Needs {
                key_indexes: true,
                ..Needs::default()
            },
        )
        .await?;
    let Some(indexes) = indexed.key_indexes else {
        return Ok(None);
    };
    let Some(rows) = task_in_indexed_files(engine, &indexes, task_id, filter).await? else {
        return Ok(None);
    };
    let files: Vec<_> = indexes
        .iter()
        .map(|file| (file.data.clone(), file.rows))
        .collect();
    engine.keep_resident(&files);
    Ok(Some(rows))
}

/// The attempts of `task_id` that `filter` selects among the newest rows of `relation`,
/// compared row by row.
fn task_by_scan(relation: &Relation, task_id: &str, filter: &TaskFilter) -> Sql {
    let mut sql = Sql::default();
    sql.push("SELECT * FROM ")
        .relation(relation)
        .push(" WHERE ")
        .append(task_conditions(filter))
        .push(" AND task_id = ")
        .bind(task_id.to_owned());
    // A task id ends with its job id: naming the job lets row groups of other jobs be skipped
    // (files are sorted by job first).
    if let Some(job_id) = job_of_task(task_id) {
        sql.push(" AND job_id = ").bind(job_id.to_owned());
    }
    sql
}

/// The attempts of `task_id` that `filter` (one [`TaskFilter::decided_in_rust`]) selects among
/// the `indexes` in scope, in attempt order: each attempt's version in the newest file that has
/// it is its newest (see [`crate::tables::newest`]). Files held in memory
/// ([`super::resident`]) are read there; the others through their key indexes. `None` when a
/// block is one the parquet crate cannot read.
pub(super) async fn task_in_indexed_files(
    engine: &QueryEngine,
    indexes: &[IndexedFile],
    task_id: &str,
    filter: &TaskFilter,
) -> Result<Option<Vec<JsonRow>>, QueryError> {
    let held: Vec<_> = indexes
        .iter()
        .map(|file| engine.resident.get(&file.data))
        .collect();
    let mut versions = Vec::new();
    for (position, rows) in held.iter().enumerate() {
        let Some(rows) = rows else { continue };
        engine.count_resident_read();
        for row in rows.rows_of(task_id)? {
            versions.push(version(row, position, filter));
        }
    }
    // Positions (in `indexes`) of the files read from disk.
    let unheld: Vec<usize> = (0..indexes.len())
        .filter(|position| held[*position].is_none())
        .collect();
    if !unheld.is_empty() {
        let paths: Vec<PathBuf> = unheld
            .iter()
            .map(|position| indexes[*position].index.clone())
            .collect();
        let id = task_id.to_owned();
        let blocks = engine
            .run(move |connection| {
                let paths: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
                key_index::blocks_of(connection, &paths, &id)
                    .map_err(|err| QueryError::Internal(err.to_string()))
            })
            .await?;
        engine.count_key_index_lookup();
        let blocks: Vec<(usize, u32)> = blocks
            .into_iter()
            .filter_map(|(at, block)| unheld.get(at).map(|position| (*position, block)))
            .collect();
        let Some(read) = task_in_blocks(engine, indexes, &blocks, task_id, filter).await? else {
            return Ok(None);
        };
        versions.extend(read);
    }
    Ok(Some(newest_passing(versions)))
}

/// Every version of `task_id`'s attempts in the `blocks` (position in `indexes`, block) its
/// key indexes name, each made a [`version`]. Only the files named are fetched; one that is
/// gone costs its rows. The parquet crate reads them: the block's task ids, and of the other
/// columns only the pages that hold the task's rows ([`task_block`]). `None` when it cannot
/// read one (logged): the lookup then scans with DuckDB, as a fold falls back to DuckDB for
/// files the crate cannot merge. The reads keep the deadline of each of the engine's calls
/// (`QuerySettings::timeout`), as DuckDB's statements do.
async fn task_in_blocks(
    engine: &QueryEngine,
    indexes: &[IndexedFile],
    blocks: &[(usize, u32)],
    task_id: &str,
    filter: &TaskFilter,
) -> Result<Option<Vec<JsonRow>>, QueryError> {
    let mut named: Vec<usize> = blocks.iter().map(|(file, _)| *file).collect();
    named.sort_unstable();
    named.dedup();
    let keys = named
        .iter()
        .map(|file| {
            indexes
                .get(*file)
                .map(|indexed| indexed.data.clone())
                .ok_or_else(|| {
                    QueryError::Internal(format!(
                        "a key index names file {file} of the {} in scope",
                        indexes.len()
                    ))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pins = engine.fetch(&keys).await?;
    // Each block to read: (position in `indexes`, local file, its rows).
    let reads: Vec<(usize, PathBuf, (u64, u64))> = blocks
        .iter()
        .filter_map(|(file, block)| {
            let path = named
                .iter()
                .position(|named| named == file)
                .and_then(|at| pins.files().get(at).cloned().flatten())?;
            Some((*file, path, key_index::block_rows(*block)))
        })
        .collect();
    let footers = Arc::clone(&engine.footers);
    let (task_id, filter) = (task_id.to_owned(), filter.clone());
    engine
        .run_stoppable(move |stop| {
            // Pinned, the files stay in the cache until every block is read.
            let _pins = pins;
            read_blocks(&footers, &reads, &task_id, &filter, stop)
        })
        .await
}

/// Every version of `task_id`'s attempts in the `reads` (position in scope, local file, its
/// block's rows), each made a [`version`]; `None` when the parquet crate cannot read one
/// (logged). Once `stop` is set (the deadline passed, or the request is gone) it reads no
/// further block.
fn read_blocks(
    footers: &task_block::Footers,
    reads: &[(usize, PathBuf, (u64, u64))],
    task_id: &str,
    filter: &TaskFilter,
    stop: &AtomicBool,
) -> Result<Option<Vec<JsonRow>>, QueryError> {
    let mut versions = Vec::new();
    for (file, path, rows) in reads {
        if stop.load(Ordering::Relaxed) {
            return Err(QueryError::Internal(
                "the lookup's block reads were stopped at its deadline".into(),
            ));
        }
        let batches = match task_block::task_rows(footers, path, *rows, task_id) {
            Ok(batches) => batches,
            Err(err) => {
                tracing::warn!(error = %err, "a block the parquet crate cannot read: the lookup scans");
                return Ok(None);
            }
        };
        for batch in &batches {
            for row in 0..batch.num_rows() {
                versions.push(version(arrow_row(batch, row)?, *file, filter));
            }
        }
    }
    Ok(Some(versions))
}

/// A stored version of an attempt, saying which file it came from (`file_position`, its
/// position in scope) and whether it passes `filter` (`passes`), for [`newest_passing`].
fn version(mut row: JsonRow, file_position: usize, filter: &TaskFilter) -> JsonRow {
    let passes = filter.passes_stored(&row);
    row.insert("file_position".to_owned(), json!(file_position));
    row.insert("passes".to_owned(), json!(passes));
    row
}

/// Each attempt's newest version (from the file latest in the manifest), in attempt order,
/// kept when it passes the filter, without the columns that said which and whether.
fn newest_passing(mut versions: Vec<JsonRow>) -> Vec<JsonRow> {
    let text = |row: &JsonRow, column: &str| {
        row.get(column)
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let number = |row: &JsonRow, column: &str| row.get(column).and_then(Json::as_i64);
    let attempt = |row: &JsonRow| {
        (
            text(row, "cluster"),
            text(row, "session_name"),
            number(row, "attempt_number"),
        )
    };
    versions.sort_by_cached_key(|row| {
        (
            attempt(row),
            std::cmp::Reverse(number(row, "file_position")),
        )
    });
    let mut newest: Vec<JsonRow> = Vec::new();
    let mut previous = None;
    for mut row in versions {
        let this = attempt(&row);
        if previous.as_ref() == Some(&this) {
            continue;
        }
        previous = Some(this);
        let passes = row.remove("passes").and_then(|passes| passes.as_bool());
        row.remove("file_position");
        if passes == Some(true) {
            newest.push(row);
        }
    }
    newest
}

/// The job id (last 4 bytes) of a 24-byte task id in hex.
fn job_of_task(task_id: &str) -> Option<&str> {
    if task_id.len() == 48 {
        task_id.get(40..)
    } else {
        None
    }
}

/// One stored row as the detail of an attempt: the table row, the error, the state
/// transitions in time order, and what the definition and logs say.
fn attempt_detail(row: JsonRow) -> Json {
    let mut detail = Map::new();
    for column in ROW_COLUMNS.iter().chain(&["error_message"]) {
        detail.insert(
            (*column).to_owned(),
            row.get(*column).cloned().unwrap_or(Json::Null),
        );
    }
    let mut events: Vec<(i64, String)> = status_columns()
        .filter_map(|(status, column)| {
            row.get(column)
                .and_then(Json::as_i64)
                .map(|ns| (ns, status.as_str().to_owned()))
        })
        .collect();
    events.sort();
    detail.insert(
        "events".into(),
        events
            .into_iter()
            .map(|(ns, state)| json!({"state": state, "created_ms": ns.div_euclid(1_000_000)}))
            .collect(),
    );
    let text = |column: &str| row.get(column).cloned().unwrap_or(Json::Null);
    let parsed = |column: &str| match row.get(column).and_then(Json::as_str) {
        Some(text) => serde_json::from_str(text).unwrap_or(Json::Null),
        None => Json::Null,
    };
    detail.insert("required_resources".into(), parsed("required_resources"));
    detail.insert("label_selector".into(), parsed("label_selector"));
    detail.insert("profile_events".into(), parsed("profile_events"));
    detail.insert("call_site".into(), text("call_site"));
    detail.insert(
        "runtime_env_info".into(),
        json!({"serialized_runtime_env": text("serialized_runtime_env")}),
    );
    detail.insert(
        "task_log_info".into(),
        json!({
            "stdout_file": text("stdout_file"),
            "stderr_file": text("stderr_file"),
            "stdout_start": text("stdout_start"),
            "stdout_end": text("stdout_end"),
            "stderr_start": text("stderr_start"),
            "stderr_end": text("stderr_end"),
        }),
    );
    for column in [
        "module_name",
        "class_name",
        "function_name",
        "actor_repr_name",
        "is_debugger_paused",
    ] {
        detail.insert(column.into(), text(column));
    }
    Json::Object(detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(sizes: &[usize]) -> Vec<JsonRow> {
        sizes
            .iter()
            .enumerate()
            .map(|(index, size)| {
                let mut row = JsonRow::new();
                row.insert("n".into(), json!(index));
                row.insert("text".into(), json!("x".repeat(*size)));
                row
            })
            .collect()
    }

    fn cursor_after(row: &JsonRow) -> Cursor {
        Cursor {
            kind: "test".into(),
            after: vec![row.get("n").cloned().unwrap_or(Json::Null)],
        }
    }

    fn kept(rows: &[JsonRow]) -> Vec<i64> {
        rows.iter()
            .filter_map(|row| row.get("n").and_then(Json::as_i64))
            .collect()
    }

    /// Past the deadline no block is read: the read stops instead of going on to a file (here
    /// one that is gone, which a read would report as a block the crate cannot read).
    #[test]
    fn block_reads_stop_at_the_deadline() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let reads = [(0, dir.path().join("gone.parquet"), (0, 122_879))];
        let footers = task_block::Footers::default();
        let filter = TaskFilter::default();
        let task_id = "ab".repeat(24);
        let on_time = read_blocks(&footers, &reads, &task_id, &filter, &AtomicBool::new(false));
        assert!(matches!(on_time, Ok(None)), "{on_time:?}");
        let late = read_blocks(&footers, &reads, &task_id, &filter, &AtomicBool::new(true));
        assert!(matches!(late, Err(QueryError::Internal(_))), "{late:?}");
        Ok(())
    }

    #[test]
    fn a_page_ends_at_its_byte_budget_with_a_cursor_to_the_rest() {
        // Each row is ~120 bytes of JSON: three fit in 400.
        let mut page = rows(&[100; 6]);
        let next = page_cursor_within(&mut page, 10, 400, cursor_after);
        assert_eq!(kept(&page), [0, 1, 2]);
        assert_eq!(next, Some(cursor_after(&page[2]).encode()));
    }

    #[test]
    fn a_row_larger_than_the_budget_is_still_served_alone() {
        let mut page = rows(&[1000, 10]);
        let next = page_cursor_within(&mut page, 10, 400, cursor_after);
        assert_eq!(kept(&page), [0]);
        assert!(next.is_some());
    }

    #[test]
    fn the_extra_row_means_more_and_a_short_page_means_the_end() {
        let mut page = rows(&[10; 4]);
        let next = page_cursor_within(&mut page, 3, PAGE_BYTES, cursor_after);
        assert_eq!(kept(&page), [0, 1, 2]);
        assert!(next.is_some());
        let mut last = rows(&[10; 2]);
        assert_eq!(
            page_cursor_within(&mut last, 3, PAGE_BYTES, cursor_after),
            None
        );
        assert_eq!(kept(&last), [0, 1]);
    }
}
