//! `GET /api/tasks`, one page of the task table, and `GET /api/tasks/{task_id}`, every attempt
//! of one task in detail.

use serde_json::{Map, Value as Json, json};

use super::read::attempts::attempts_relation;
use super::read::json::{JsonRow, query_rows};
use super::read::lookup::task_attempts_indexed;
use super::read::params::{Params, Scope, TaskFilter, parse_hex};
use super::read::session_walk::WalkedPage;
use super::read::sql::{Relation, Sql, task_conditions};
use super::read::task_page::TaskSort;
use super::redaction::redact_serialized_value;
use super::{QueryEngine, QueryError};
use crate::tables::task_attempts::status_columns;

/// The fields of a task-table row (see docs/architecture.md, "Queries"), by Ray's state-API
/// names.
const ROW_COLUMNS: &[&str] = &[
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
    let mut columns: Vec<&'static str> = ROW_COLUMNS.to_vec();
    if with_error {
        columns.push("error_message");
    }
    let page = WalkedPage {
        filter: &filter,
        sort,
        descending,
        limit,
        columns: &columns,
        kind: &kind,
    };
    let (mut rows, next) = page.read(engine, cursor.as_ref()).await?;
    for row in &mut rows {
        row.remove("sort_key");
    }
    Ok(json!({"tasks": rows, "next": next}))
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
        None => match attempts_relation(engine, &filter.scope).await? {
            Some(relation) => {
                let mut sql = task_by_scan(&relation, &task_id, &filter);
                sql.push(" ORDER BY cluster, session_name, attempt_number");
                engine
                    .run(move |connection| query_rows(connection, &sql.text, &sql.params))
                    .await?
            }
            None => Vec::new(),
        },
    };
    if rows.is_empty() {
        return Err(QueryError::NotFound(format!("no task {task_id}")));
    }
    let attempts: Vec<Json> = rows.into_iter().map(attempt_detail).collect();
    Ok(json!({"task_id": task_id, "attempts": attempts}))
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
    // `env_vars` values are masked, as Ray's dashboard masks them (see `query::redaction`).
    detail.insert(
        "runtime_env_info".into(),
        json!({"serialized_runtime_env": redact_serialized_value(text("serialized_runtime_env"))}),
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
