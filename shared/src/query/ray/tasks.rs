//! `api/v0/tasks`, `api/v0/tasks/summarize` and `api/v0/tasks/timeline` over `task_attempts`,
//! in Ray 2.60's shapes (`util/state/common.py`: `TaskState`, `TaskSummaries`;
//! `_private/profiling.py`: the trace).
//!
//! Ray keeps at most 10 000 attempts per query at its source; Afterglow filters, sorts and counts
//! every stored attempt, and only the response's size bounds a page.

use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use super::body::{RayBody, ResponseLimit, RowBudget, SPLICE_HERE, list_envelope, state_envelope};
use super::request::{Column, ColumnKind, FilterValue, Predicate, RayQuery};
use super::summary::{self, SummaryActor, SummaryTask};
use crate::query::read::attempts::attempts_relation;
use crate::query::read::counts::attempts_counted;
use crate::query::read::entity_records::records;
use crate::query::read::json::{JsonRow, for_each_row, query_as, query_rows};
use crate::query::read::lookup::task_attempts_indexed;
use crate::query::read::params::{Scope, TaskFilter, parse_hex};
use crate::query::read::sql::Sql;
use crate::query::redaction::redact_serialized_value;
use crate::query::{QueryEngine, QueryError};
use crate::tables::entities::EntityKind;
use crate::tables::report_times;
use crate::tables::task_attempts::status_columns;

/// `TaskState`'s filterable columns (`filterable_columns()` in Ray 2.60).
pub(super) const FILTERABLE: &[Column] = &[
    ("task_id", ColumnKind::Id),
    ("attempt_number", ColumnKind::Integer),
    ("name", ColumnKind::Text),
    ("state", ColumnKind::Enum),
    ("job_id", ColumnKind::Id),
    ("actor_id", ColumnKind::Id),
    ("type", ColumnKind::Enum),
    ("func_or_class_name", ColumnKind::Text),
    ("parent_task_id", ColumnKind::Id),
    ("node_id", ColumnKind::Id),
    ("worker_id", ColumnKind::Id),
    ("worker_pid", ColumnKind::Integer),
    ("error_type", ColumnKind::Enum),
    ("language", ColumnKind::Enum),
    ("placement_group_id", ColumnKind::Id),
    ("is_debugger_paused", ColumnKind::Boolean),
];

/// The columns of a row without `detail`, in `TaskState` order.
const BRIEF: [&str; 13] = [
    "task_id",
    "attempt_number",
    "name",
    "state",
    "job_id",
    "actor_id",
    "type",
    "func_or_class_name",
    "parent_task_id",
    "node_id",
    "worker_id",
    "worker_pid",
    "error_type",
];

/// Stored columns a detail row is built from, beyond [`BRIEF`] and the status times.
const DETAIL_SOURCES: [&str; 12] = [
    "language",
    "required_resources",
    "serialized_runtime_env",
    "placement_group_id",
    "profile_events",
    "error_message",
    "is_debugger_paused",
    "call_site",
    "label_selector",
    "creation_time_ms",
    "start_time_ms",
    "end_time_ms",
];

/// The stored columns of `task_log_info`, which holds those that are set.
const LOG_COLUMNS: [&str; 6] = [
    "stdout_file",
    "stdout_start",
    "stdout_end",
    "stderr_file",
    "stderr_start",
    "stderr_end",
];

/// Most attempts the lineage summary takes (Ray's takes 10 000): it holds every one in memory.
const LINEAGE_ATTEMPTS: usize = 200_000;

/// The attempts Ray's lists show: defined ones (Ray drops events without `task_info`), and no
/// drivers unless asked.
fn source_conditions(exclude_driver: bool) -> Sql {
    let mut sql = Sql::default();
    sql.push(report_times::DEFINED);
    if exclude_driver {
        sql.push(" AND type IS DISTINCT FROM 'DRIVER_TASK'");
    }
    sql
}

/// `GET api/v0/tasks`, with the rows that fit the `response`.
pub(super) async fn list(
    engine: &QueryEngine,
    scope: &Scope,
    pairs: &[(String, String)],
    response: ResponseLimit,
) -> Result<RayBody, QueryError> {
    let query = RayQuery::parse(pairs, FILTERABLE)?;
    if let Some(task_id) = one_task(&query)
        && let Some(answer) = list_one_task(engine, scope, &query, &task_id, response).await?
    {
        return Ok(answer);
    }
    let Some(relation) = attempts_relation(engine, scope).await? else {
        return RayBody::from_json(&list_envelope(0, 0, Vec::new(), Vec::new()));
    };
    let mut counts = Sql::default();
    counts
        .push("SELECT count(*) AS total, count(*) FILTER (WHERE TRUE")
        .append(query.conditions())
        .push(") AS filtered FROM ")
        .relation(&relation)
        .push(" WHERE ")
        .append(source_conditions(query.exclude_driver));
    let mut columns: Vec<&str> = BRIEF.to_vec();
    if query.detail {
        columns.extend(DETAIL_SOURCES);
        columns.extend(LOG_COLUMNS);
        columns.extend(status_columns().map(|(_, column)| column));
    }
    // The task id at which the first `limit` rows end, from a sort of that column alone: with
    // rows only up to it, the sort of whole rows below holds about `limit` of them. DuckDB
    // sorts everything rather than keep a top-N once a limit passes 5 000 rows and 0.7 % of the
    // input (Ray's dashboard asks for 10 000 of a job's attempts), and sorting that many wide
    // rows would take much of the query's memory.
    let mut bound = Sql::default();
    bound
        .push("SELECT task_id FROM ")
        .relation(&relation)
        .push(" WHERE ")
        .append(source_conditions(query.exclude_driver))
        .append(query.conditions())
        .push(" ORDER BY task_id LIMIT 1 OFFSET ")
        .number(query.limit.saturating_sub(1));
    let mut rows = Sql::default();
    rows.push("SELECT ")
        .columns(&columns)
        .push(" FROM ")
        .relation(&relation)
        .push(" WHERE ")
        .append(source_conditions(query.exclude_driver))
        .append(query.conditions());
    let limit = query.limit;
    let detail = query.detail;
    let (counted, kept) = engine
        .run(move |connection| {
            let counted = query_rows(connection, &counts.text, &counts.params)?;
            let last = query_rows(connection, &bound.text, &bound.params)?
                .into_iter()
                .next()
                .and_then(|mut row| match row.remove("task_id") {
                    Some(Json::String(task_id)) => Some(task_id),
                    _ => None,
                });
            if let (Some(last), true) = (last, limit > 0) {
                rows.push(" AND task_id <= ").bind(last);
            }
            // Ray sorts by task id; its source yields a task's newest attempt first.
            rows.push(" ORDER BY task_id, attempt_number DESC LIMIT ")
                .number(limit);
            // Rows become Ray's rows as they are read (and, gzipped, are compressed as they
            // are taken), and reading stops where the response's size would be passed:
            // `limit` bounds what is sorted, the budget what is held.
            let mut kept = RowBudget::new(response, "tasks");
            for_each_row(connection, &rows.text, &rows.params, |row| {
                kept.admit(task_state(row, detail))
            })?;
            Ok((counted, kept))
        })
        .await?;
    let count = |column: &str| {
        counted
            .first()
            .and_then(|row| row.get(column))
            .and_then(Json::as_u64)
            .unwrap_or(0)
    };
    let filtered = count("filtered");
    let listed = usize::try_from(filtered).map_or(limit, |filtered| filtered.min(limit));
    kept.into_list(count("total"), filtered, listed)
}

/// The task id `query` asks for alone (`filter_keys=task_id`, `=`, a hex id, and no other
/// filter): what Ray's dashboard task page and `ray get tasks` send.
fn one_task(query: &RayQuery) -> Option<String> {
    let [filter] = query.filters.as_slice() else {
        return None;
    };
    match (&filter.column, &filter.predicate, &filter.value) {
        (&"task_id", Predicate::Equal, FilterValue::Text(id)) => parse_hex("task_id", id).ok(),
        _ => None,
    }
}

/// `api/v0/tasks` for one task id: its attempts found as `/api/tasks/{id}` finds them (key
/// indexes, or rows held in memory) instead of by a scan, which grows with the session,
/// and `total` counted as the summary counts it (from rollups). `None` when the lookup would
/// have to scan (see `task_attempts_indexed`).
async fn list_one_task(
    engine: &QueryEngine,
    scope: &Scope,
    query: &RayQuery,
    task_id: &str,
    response: ResponseLimit,
) -> Result<Option<RayBody>, QueryError> {
    // What Ray's lists show ([`source_conditions`]) as a task filter.
    let filter = TaskFilter {
        scope: scope.clone(),
        include_drivers: !query.exclude_driver,
        include_incomplete: false,
        ..TaskFilter::default()
    };
    let Some(mut found) = task_attempts_indexed(engine, &filter, task_id).await? else {
        return Ok(None);
    };
    let total = attempts_counted(engine, &filter).await?;
    // Ray's order: by task id, a task's newest attempt first.
    found.sort_by_key(|row| std::cmp::Reverse(row.get("attempt_number").and_then(Json::as_i64)));
    let filtered = found.len() as u64;
    found.truncate(query.limit);
    let listed = found.len();
    let mut kept = RowBudget::new(response, "tasks");
    kept.admit_leading(found.into_iter().map(|row| task_state(row, query.detail)));
    kept.into_list(total, filtered, listed).map(Some)
}

/// A stored attempt as Ray's `TaskState` row: the brief columns, and with `detail` the rest, as
/// `protobuf_to_task_state_dict` builds them.
fn task_state(mut row: JsonRow, detail: bool) -> Json {
    let mut state = Map::new();
    let state_name = row
        .get("state")
        .and_then(Json::as_str)
        .unwrap_or_default()
        .to_owned();
    let failed = state_name == "FAILED";
    for column in BRIEF {
        let value = row.remove(column).unwrap_or(Json::Null);
        // Required strings of `TaskState`: a null would fail Ray's own client.
        let value = match (column, value) {
            ("name" | "job_id" | "func_or_class_name" | "parent_task_id", Json::Null) => {
                Json::String(String::new())
            }
            ("error_type", _) if !failed => Json::Null,
            (_, value) => value,
        };
        state.insert(column.to_owned(), value);
    }
    if !detail {
        return Json::Object(state);
    }
    let mut take = |column: &str| row.remove(column).unwrap_or(Json::Null);
    let parsed = |value: Json| match value {
        Json::String(text) => serde_json::from_str(&text).unwrap_or(Json::Null),
        other => other,
    };
    let language = take("language");
    let required_resources = match parsed(take("required_resources")) {
        // The task page lists these with `Object.entries`: never null.
        Json::Null => json!({}),
        resources => resources,
    };
    // `env_vars` values masked, as Ray's state API masks them for its dashboard.
    let runtime_env = redact_serialized_value(take("serialized_runtime_env"));
    let placement_group_id = take("placement_group_id");
    let profile = parsed(take("profile_events"));
    let mut log_info = Map::new();
    for column in LOG_COLUMNS {
        let value = take(column);
        if !value.is_null() {
            log_info.insert(column.to_owned(), value);
        }
    }
    let error_message = take("error_message");
    let is_debugger_paused = take("is_debugger_paused");
    let call_site = take("call_site");
    let label_selector = match parsed(take("label_selector")) {
        Json::Null => json!({}),
        selector => selector,
    };
    // The times are the stored ones, which follow Ray's rules (including failures Ray
    // synthesizes at job end or worker death, which have no exported transition).
    #[allow(clippy::cast_precision_loss)]
    let mut time = |column: &str| {
        take(column)
            .as_i64()
            .map_or(Json::Null, |ms| json!(ms as f64))
    };
    let (creation, start, end) = (
        time("creation_time_ms"),
        time("start_time_ms"),
        time("end_time_ms"),
    );
    let mut events = Vec::new();
    let mut terminal_seen = false;
    for (status, column) in status_columns() {
        let Some(ns) = take(column).as_i64() else {
            continue;
        };
        terminal_seen |= status.as_str() == state_name;
        events.push(json!({"state": status.as_str(), "created_ms": ray_ms(ns)}));
    }
    if failed && !terminal_seen && !end.is_null() {
        events.push(json!({"state": "FAILED", "created_ms": end}));
    }
    state.insert("language".into(), language);
    state.insert("required_resources".into(), required_resources);
    state.insert(
        "runtime_env_info".into(),
        json!({ "serialized_runtime_env": runtime_env }),
    );
    state.insert("placement_group_id".into(), placement_group_id);
    state.insert("events".into(), Json::Array(events));
    state.insert("profiling_data".into(), profiling_data(&profile));
    state.insert("creation_time_ms".into(), creation);
    state.insert("start_time_ms".into(), start);
    state.insert("end_time_ms".into(), end);
    state.insert(
        "task_log_info".into(),
        if log_info.is_empty() {
            Json::Null
        } else {
            Json::Object(log_info)
        },
    );
    state.insert(
        "error_message".into(),
        if failed { error_message } else { Json::Null },
    );
    state.insert("is_debugger_paused".into(), is_debugger_paused);
    state.insert("call_site".into(), call_site);
    state.insert("label_selector".into(), label_selector);
    state.insert("fallback_strategy".into(), Json::Null);
    Json::Object(state)
}

/// Nanoseconds as Ray shows milliseconds: `int(ns) // 1e6`, a float floor division (so the
/// value is rounded to a double first, as Python does).
fn ray_ms(ns: i64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let x = ns as f64;
    let remainder = x % 1e6;
    let remainder = if remainder < 0.0 {
        remainder + 1e6
    } else {
        remainder
    };
    let quotient = (x - remainder) / 1e6;
    let floor = quotient.floor();
    if quotient - floor > 0.5 {
        floor + 1.0
    } else {
        floor
    }
}

/// The stored profile spans (`ProfileSpan`s as JSON) as Ray's `profiling_data`: the recording
/// component and its events in float milliseconds, or `{}` when none were exported.
fn profiling_data(spans: &Json) -> Json {
    let Some(spans) = spans.as_array().filter(|spans| !spans.is_empty()) else {
        return json!({});
    };
    let field = |span: &Json, name: &str| span.get(name).cloned().unwrap_or(Json::Null);
    let first = spans.first().cloned().unwrap_or(Json::Null);
    #[allow(clippy::cast_precision_loss)]
    let ms = |span: &Json, name: &str| {
        span.get(name)
            .and_then(Json::as_i64)
            .map(|ns| ns as f64 / 1e6)
    };
    let events: Vec<Json> = spans
        .iter()
        .map(|span| {
            let extra = span
                .get("extra_data")
                .and_then(Json::as_str)
                .and_then(|text| serde_json::from_str(text).ok())
                .unwrap_or_else(|| json!({}));
            json!({
                "start_time": ms(span, "start_ns"),
                "end_time": ms(span, "end_ns"),
                "extra_data": extra,
                "event_name": field(span, "event_name"),
            })
        })
        .collect();
    json!({
        "component_type": field(&first, "component_type"),
        "component_id": field(&first, "component_id"),
        "node_ip_address": field(&first, "node_ip_address"),
        "events": events,
    })
}

/// `GET api/v0/tasks/summarize`: by function name (what `ray summary tasks` reads) or, with
/// `summary_by=lineage`, as the job page's tree.
pub(super) async fn summarize(
    engine: &QueryEngine,
    scope: &Scope,
    pairs: &[(String, String)],
) -> Result<RayBody, QueryError> {
    // Ray's summaries take filters only; drivers are always left out.
    let filter_pairs: Vec<(String, String)> = pairs
        .iter()
        .filter(|(key, _)| key.starts_with("filter_"))
        .cloned()
        .collect();
    let query = RayQuery::parse(&filter_pairs, FILTERABLE)?;
    let by = pairs
        .iter()
        .find(|(key, _)| key == "summary_by")
        .map_or("func_name", |(_, value)| value.as_str());
    let lineage = match by {
        "func_name" | "task_name" => false,
        "lineage" => true,
        _ => {
            return Err(QueryError::BadRequest(
                "summary_by must be one of \"func_name\", \"task_name\", or \"lineage\".".into(),
            ));
        }
    };
    let Some(relation) = attempts_relation(engine, scope).await? else {
        let empty = if lineage {
            summary::by_lineage(&[], &[])
        } else {
            summary::by_func_name(&[])
        };
        return cluster_summary(0, 0, &empty, Vec::new());
    };
    let mut sql = Sql::default();
    // Ray reads a missing text as "" here.
    sql.push(
        "SELECT task_id, coalesce(name, '') AS name, \
         coalesce(func_or_class_name, '') AS func_or_class_name, \
         coalesce(type, '') AS task_type, coalesce(state, '') AS state, actor_id, \
         parent_task_id, creation_time_ms, count(*) OVER () AS filtered FROM ",
    )
    .relation(&relation)
    .push(" WHERE ")
    .append(source_conditions(true))
    .append(query.conditions())
    .push(" ORDER BY task_id, attempt_number DESC");
    if lineage {
        sql.push(" LIMIT ").number(LINEAGE_ATTEMPTS);
    }
    let rows: Vec<SummaryRow> = engine
        .run(move |connection| query_as(connection, &sql.text, &sql.params))
        .await?;
    let filtered = rows.first().map_or(0, |row| row.filtered);
    let tasks: Vec<SummaryTask> = rows.into_iter().map(|row| row.task).collect();
    let mut warnings = Vec::new();
    let result = if lineage {
        if filtered > tasks.len() as u64 {
            warnings.push(format!(
                "The lineage summary covers the first {} of {filtered} attempts (by task id); \
                 filter by job to see all of a job's.",
                tasks.len()
            ));
        }
        let actors = summary_actors(engine, scope).await?;
        summary::by_lineage(&tasks, &actors)
    } else {
        summary::by_func_name(&tasks)
    };
    cluster_summary(filtered, tasks.len() as u64, &result, warnings)
}

/// The actors as the lineage summary names them.
async fn summary_actors(
    engine: &QueryEngine,
    scope: &Scope,
) -> Result<Vec<SummaryActor>, QueryError> {
    let entities = records(engine, scope, EntityKind::Actors).await?;
    Ok(entities
        .actors
        .values()
        .map(|actor| {
            let class = actor
                .definition
                .as_ref()
                .map(|reported| reported.value.class_name.as_str());
            SummaryActor {
                actor_id: actor.id.clone(),
                repr_name: Some(actor.repr_name()).filter(|name| !name.is_empty()),
                class_name: class.map(str::to_owned),
            }
        })
        .collect())
}

/// The envelope around a summary (JSON text): Ray's summaries are per "node" and always under
/// the one key `cluster`.
fn cluster_summary(
    filtered: u64,
    counted: u64,
    summary: &str,
    warnings: Vec<String>,
) -> Result<RayBody, QueryError> {
    let envelope = state_envelope(
        filtered,
        filtered,
        counted,
        json!({ "node_id_to_summary": { "cluster": SPLICE_HERE } }),
        warnings,
    );
    RayBody::spliced(&envelope, summary)
}

/// A summary's input row: the attempt, and how many attempts the filter matched.
#[derive(Deserialize)]
struct SummaryRow {
    #[serde(flatten)]
    task: SummaryTask,
    filtered: u64,
}

/// `GET api/v0/tasks/timeline` (`?job_id=`): Ray's Chrome trace of the exported profile spans
/// (`chrome_tracing_dump`): one process per node IP, one thread per worker, an `X` event per
/// span. Empty when the cluster exported no profile events.
pub(super) async fn timeline(
    engine: &QueryEngine,
    scope: &Scope,
    pairs: &[(String, String)],
) -> Result<Json, QueryError> {
    let job_id = pairs
        .iter()
        .find(|(key, value)| key == "job_id" && !value.is_empty())
        .map(|(_, value)| parse_hex("job_id", value))
        .transpose()?;
    let Some(relation) = attempts_relation(engine, scope).await? else {
        return Ok(json!([]));
    };
    let mut sql = Sql::default();
    sql.push(
        "SELECT task_id, job_id, attempt_number, func_or_class_name, actor_id, profile_events \
         FROM ",
    )
    .relation(&relation)
    .push(" WHERE ")
    .append(source_conditions(true))
    .push(" AND profile_events IS NOT NULL AND profile_events <> '[]'");
    if let Some(job_id) = job_id {
        sql.push(" AND job_id = ").bind(job_id);
    }
    sql.push(" ORDER BY task_id, attempt_number DESC");
    let rows = engine
        .run(move |connection| query_rows(connection, &sql.text, &sql.params))
        .await?;
    Ok(Json::Array(chrome_trace(rows)))
}

fn chrome_trace(rows: Vec<JsonRow>) -> Vec<Json> {
    let mut nodes: Vec<String> = Vec::new();
    let mut threads: Vec<(usize, String)> = Vec::new();
    let mut events = Vec::new();
    for row in rows {
        let spans = row
            .get("profile_events")
            .and_then(Json::as_str)
            .and_then(|text| serde_json::from_str::<Json>(text).ok())
            .unwrap_or(Json::Null);
        let Some(spans) = spans.as_array() else {
            continue;
        };
        for span in spans {
            let text = |name: &str| span.get(name).and_then(Json::as_str).unwrap_or_default();
            let component_type = text("component_type");
            if component_type != "worker" && component_type != "driver" {
                continue;
            }
            let ip = text("node_ip_address").to_owned();
            let pid = nodes
                .iter()
                .position(|known| *known == ip)
                .unwrap_or_else(|| {
                    nodes.push(ip);
                    nodes.len() - 1
                });
            let thread = format!("{component_type}:{}", text("component_id"));
            let tid = threads
                .iter()
                .position(|known| known.0 == pid && known.1 == thread)
                .unwrap_or_else(|| {
                    threads.push((pid, thread));
                    threads.len() - 1
                });
            let event_name = text("event_name");
            let mut args = span
                .get("extra_data")
                .and_then(Json::as_str)
                .and_then(|text| serde_json::from_str::<Map<String, Json>>(text).ok())
                .unwrap_or_default();
            let name = args
                .get("name")
                .and_then(Json::as_str)
                .unwrap_or(event_name)
                .to_owned();
            let cname = args
                .get("cname")
                .and_then(Json::as_str)
                .unwrap_or("generic_work")
                .to_owned();
            for column in [
                "task_id",
                "job_id",
                "attempt_number",
                "func_or_class_name",
                "actor_id",
            ] {
                args.insert(
                    column.to_owned(),
                    row.get(column).cloned().unwrap_or(Json::Null),
                );
            }
            #[allow(clippy::cast_precision_loss)]
            let us = |name: &str| {
                span.get(name)
                    .and_then(Json::as_i64)
                    .map_or(0.0, |ns| ns as f64 / 1e3)
            };
            events.push(json!({
                "cat": event_name,
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": us("start_ns"),
                "dur": us("end_ns") - us("start_ns"),
                "cname": cname,
                "args": args,
                "ph": "X",
            }));
        }
    }
    for (pid, ip) in nodes.iter().enumerate() {
        events.push(
            json!({"name": "process_name", "args": {"name": format!("Node {ip}")},
            "pid": pid, "tid": null, "ph": "M"}),
        );
    }
    for (tid, (pid, thread)) in threads.iter().enumerate() {
        events.push(json!({"name": "thread_name", "args": {"name": thread},
            "pid": pid, "tid": tid, "ph": "M"}));
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_round_like_pythons_float_floor_division() {
        assert_eq!(ray_ms(1_700_000_000_123_456_789), 1_700_000_000_123.0);
        // The nanoseconds are a double first: this one rounds up to a whole second.
        assert_eq!(ray_ms(1_700_000_002_999_999_999), 1_700_000_003_000.0);
    }
}
