//! `/api/timeline`: the attempts that ran, as Chrome trace JSON (the format Perfetto and
//! `chrome://tracing` open, and the one `ray timeline` writes).
//!
//! Each node is a process and each worker a thread. An attempt is one complete (`"ph": "X"`)
//! event from RUNNING to its end; its profile spans (`task:execute`, …), when Ray exported them,
//! are nested events on the same thread.

use std::collections::BTreeMap;

use serde_json::{Value as Json, json};

use super::read::attempts::filtered_relation;
use super::read::json::query_as;
use super::read::page::{PAGE_BYTES, task_position};
use super::read::params::{Cursor, Params, TaskFilter};
use super::read::sql::{Sql, keyset_after, task_conditions};
use super::{QueryEngine, QueryError};
use crate::merge::ProfileSpan;

/// Default and largest number of attempts drawn.
const DEFAULT_ATTEMPTS: i64 = 10_000;
const MAX_ATTEMPTS: i64 = 100_000;
/// Bytes of trace events after which no further attempt is drawn (the metadata events naming
/// nodes and workers come on top): like a page of rows, within Lambda's 6 MB response.
const TRACE_BYTES: usize = PAGE_BYTES;
const CURSOR_KIND: &str = "timeline";

/// One attempt of the trace, as selected.
#[derive(Debug, serde::Deserialize)]
struct TraceRow {
    cluster: String,
    session_name: String,
    task_id: String,
    attempt_number: i64,
    name: Option<String>,
    state: Option<String>,
    job_id: Option<String>,
    error_type: Option<String>,
    node_id: Option<String>,
    worker_id: Option<String>,
    worker_pid: Option<i64>,
    start_time_ms: Option<i64>,
    end_time_ms: Option<i64>,
    ts_running: Option<i64>,
    ts_finished: Option<i64>,
    ts_failed: Option<i64>,
    profile_events: Option<String>,
    sort_key: i64,
}

/// Where the first attempts of a trace end (see [`timeline`]).
#[derive(Debug, serde::Deserialize)]
struct SortKey {
    sort_key: i64,
}

/// `GET /api/timeline`.
pub(super) async fn timeline(
    engine: &QueryEngine,
    params: &[(String, String)],
) -> Result<Json, QueryError> {
    let mut allowed = TaskFilter::PARAMS.to_vec();
    allowed.extend(["limit", "cursor"]);
    let params = Params::parse(params, &allowed)?;
    let filter = TaskFilter::from_params(&params)?;
    let limit = match params.integer("limit")? {
        None => DEFAULT_ATTEMPTS,
        Some(limit) if (1..=MAX_ATTEMPTS).contains(&limit) => limit,
        Some(limit) => {
            return Err(QueryError::BadRequest(format!(
                "`limit` must be between 1 and {MAX_ATTEMPTS}, not {limit}"
            )));
        }
    };
    let cursor = params.cursor(CURSOR_KIND)?;
    let Some(relation) = filtered_relation(engine, &filter).await? else {
        return Ok(trace(Vec::new(), None));
    };
    let after = cursor
        .as_ref()
        .map(|cursor| task_position(&cursor.after))
        .transpose()?;
    // The attempts to draw, from the cursor on (`columns` of them).
    let drawn = |columns: &'static str| -> Sql {
        let mut sql = Sql::default();
        sql.push("SELECT ")
            .push(columns)
            .push(" FROM (SELECT cluster, session_name, task_id, attempt_number, ")
            .push(if columns == "*" {
                "name, state, job_id, error_type, node_id, worker_id, worker_pid, \
                 start_time_ms, end_time_ms, ts_running, ts_finished, ts_failed, \
                 profile_events, "
            } else {
                ""
            })
            .push("start_time_ms AS sort_key FROM ")
            .relation(&relation)
            .push(" WHERE ")
            .append(task_conditions(&filter))
            .push(" AND start_time_ms IS NOT NULL AND end_time_ms IS NOT NULL) WHERE TRUE");
        if let Some(after) = &after {
            sql.push(" AND ").append(keyset_after(
                &after
                    .iter()
                    .map(|(column, value)| (*column, value.clone(), false))
                    .collect::<Vec<_>>(),
            ));
        }
        sql
    };
    // The start time at which the first `limit + 1` attempts end, from a sort of that column
    // alone: DuckDB sorts every row rather than keep a top-N once a limit passes 5 000 rows
    // and 0.7 % of the input, and whole rows are wide (profile spans). See Ray's task list
    // (`ray/tasks.rs`).
    let mut bound = drawn("sort_key");
    bound
        .push(" ORDER BY sort_key LIMIT 1 OFFSET ")
        .number(limit);
    let mut sql = drawn("*");
    let rows: Vec<TraceRow> = engine
        .run(move |connection| {
            let last: Vec<SortKey> = query_as(connection, &bound.text, &bound.params)?;
            if let Some(last) = last.into_iter().next() {
                sql.push(" AND sort_key <= ").bind(last.sort_key);
            }
            sql.push(" ORDER BY sort_key, cluster, session_name, task_id, attempt_number LIMIT ")
                .number(limit + 1);
            query_as(connection, &sql.text, &sql.params)
        })
        .await?;
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    // The position of the last attempt drawn, for the cursor when the trace is cut short.
    let position = |row: &TraceRow| Cursor {
        kind: CURSOR_KIND.to_owned(),
        after: vec![
            json!(row.sort_key),
            json!(row.cluster),
            json!(row.session_name),
            json!(row.task_id),
            json!(row.attempt_number),
        ],
    };
    let mut next = None;
    let mut bytes = 0;

    let mut processes: BTreeMap<String, usize> = BTreeMap::new();
    let mut threads: BTreeMap<(usize, String), (usize, Json)> = BTreeMap::new();
    let mut events = Vec::new();
    for (index, row) in rows.iter().enumerate() {
        if index == limit || (index > 0 && bytes > TRACE_BYTES) {
            // More attempts match than this answer may hold: the next request starts after
            // the last one drawn.
            next = index
                .checked_sub(1)
                .and_then(|last| rows.get(last))
                .map(|last| position(last).encode());
            break;
        }
        let drawn = events.len();
        let node = row.node_id.as_deref().unwrap_or("unknown").to_owned();
        let next_pid = processes.len() + 1;
        let pid = *processes.entry(node).or_insert(next_pid);
        let worker = row.worker_id.as_deref().unwrap_or("unknown").to_owned();
        let next_tid = threads.len() + 1;
        let tid = threads
            .entry((pid, worker))
            .or_insert((next_tid, json!(row.worker_pid)))
            .0;
        // Nanosecond stamps where kept, for µs precision; the ms columns otherwise.
        let start_us = row
            .ts_running
            .map(|ns| ns as f64 / 1000.0)
            .or_else(|| row.start_time_ms.map(|ms| ms as f64 * 1000.0));
        let end_us = row
            .ts_finished
            .or(row.ts_failed)
            .map(|ns| ns as f64 / 1000.0)
            .or_else(|| row.end_time_ms.map(|ms| ms as f64 * 1000.0));
        let (Some(start_us), Some(end_us)) = (start_us, end_us) else {
            continue;
        };
        events.push(json!({
            "name": row.name,
            "cat": "task",
            "ph": "X",
            "ts": start_us,
            "dur": (end_us - start_us).max(0.0),
            "pid": pid,
            "tid": tid,
            "args": {
                "task_id": row.task_id,
                "attempt_number": row.attempt_number,
                "state": row.state,
                "job_id": row.job_id,
                "error_type": row.error_type,
            },
        }));
        if let Some(text) = &row.profile_events {
            let spans: Vec<ProfileSpan> = serde_json::from_str(text)
                .map_err(|err| QueryError::Internal(format!("corrupt profile_events: {err}")))?;
            for span in spans {
                events.push(json!({
                    "name": span.event_name,
                    "cat": "profile",
                    "ph": "X",
                    "ts": span.start_ns as f64 / 1000.0,
                    "dur": (span.end_ns - span.start_ns).max(0) as f64 / 1000.0,
                    "pid": pid,
                    "tid": tid,
                }));
            }
        }
        bytes += events
            .get(drawn..)
            .unwrap_or_default()
            .iter()
            .map(|event| serde_json::to_vec(event).map_or(0, |text| text.len()) + 1)
            .sum::<usize>();
    }
    for (node, pid) in &processes {
        events.push(json!({
            "name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": {"name": format!("node {node}")},
        }));
    }
    for ((pid, worker), (tid, worker_pid)) in &threads {
        let label = match worker_pid.as_i64() {
            Some(process) => format!("worker {worker} (pid {process})"),
            None => format!("worker {worker}"),
        };
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
            "args": {"name": label},
        }));
    }
    Ok(trace(events, next))
}

/// The trace document. When attempts were left out (by `limit`, or to keep the answer within
/// Lambda's response size), `otherData.truncated` says so and `otherData.next` is the cursor
/// of the rest.
fn trace(events: Vec<Json>, next: Option<String>) -> Json {
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"source": "afterglow", "truncated": next.is_some(), "next": next},
    })
}
