//! `/api/timeline`: the attempts that ran, as Chrome trace JSON (the format Perfetto and
//! `chrome://tracing` open, and the one `ray timeline` writes).
//!
//! Each node is a process and each worker a thread. An attempt is one complete (`"ph": "X"`)
//! event from RUNNING to its end; its profile spans (`task:execute`, …), when Ray exported them,
//! are nested events on the same thread.

use std::collections::BTreeMap;

use serde_json::{Value as Json, json};

use super::json::query_rows;
use super::params::{Cursor, Params, TaskFilter};
use super::sql::{Sql, keyset_after, task_conditions};
use super::tasks::{PAGE_BYTES, attempts_relation, task_position};
use super::{QueryEngine, QueryError};
use crate::merge::ProfileSpan;

/// Default and largest number of attempts drawn.
const DEFAULT_ATTEMPTS: i64 = 10_000;
const MAX_ATTEMPTS: i64 = 100_000;
/// Bytes of trace events after which no further attempt is drawn (the metadata events naming
/// nodes and workers come on top): like a page of rows, within Lambda's 6 MB response.
const TRACE_BYTES: usize = PAGE_BYTES;
const CURSOR_KIND: &str = "timeline";

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
    let Some(relation) = attempts_relation(engine, &filter.scope).await? else {
        return Ok(trace(Vec::new(), None));
    };
    let mut sql = Sql::default();
    sql.push(
        "SELECT * FROM (SELECT cluster, session_name, task_id, attempt_number, name, state, \
         job_id, error_type, node_id, worker_id, worker_pid, start_time_ms, end_time_ms, \
         ts_running, ts_finished, ts_failed, profile_events, start_time_ms AS sort_key FROM ",
    )
    .push(&relation)
    .push(" WHERE ")
    .append(task_conditions(&filter))
    .push(" AND start_time_ms IS NOT NULL AND end_time_ms IS NOT NULL)");
    if let Some(cursor) = &cursor {
        sql.push(" WHERE ").append(keyset_after(
            &task_position(&cursor.after)?
                .into_iter()
                .map(|(column, value)| (column, value, false))
                .collect::<Vec<_>>(),
        ));
    }
    sql.push(&format!(
        " ORDER BY sort_key, cluster, session_name, task_id, attempt_number LIMIT {}",
        limit + 1
    ));
    let rows = engine
        .run(move |connection| query_rows(connection, &sql.text, &sql.params))
        .await?;
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    // The position of the last attempt drawn, for the cursor when the trace is cut short.
    let position = |row: &super::json::JsonRow| Cursor {
        kind: CURSOR_KIND.to_owned(),
        after: [
            "sort_key",
            "cluster",
            "session_name",
            "task_id",
            "attempt_number",
        ]
        .iter()
        .map(|column| row.get(*column).cloned().unwrap_or(Json::Null))
        .collect(),
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
        let node = row["node_id"].as_str().unwrap_or("unknown").to_owned();
        let next_pid = processes.len() + 1;
        let pid = *processes.entry(node).or_insert(next_pid);
        let worker = row["worker_id"].as_str().unwrap_or("unknown").to_owned();
        let next_tid = threads.len() + 1;
        let tid = threads
            .entry((pid, worker))
            .or_insert((next_tid, row["worker_pid"].clone()))
            .0;
        // Nanosecond stamps where kept, for µs precision; the ms columns otherwise.
        let start_us = row["ts_running"]
            .as_i64()
            .map(|ns| ns as f64 / 1000.0)
            .or_else(|| row["start_time_ms"].as_i64().map(|ms| ms as f64 * 1000.0));
        let end_us = row["ts_finished"]
            .as_i64()
            .or_else(|| row["ts_failed"].as_i64())
            .map(|ns| ns as f64 / 1000.0)
            .or_else(|| row["end_time_ms"].as_i64().map(|ms| ms as f64 * 1000.0));
        let (Some(start_us), Some(end_us)) = (start_us, end_us) else {
            continue;
        };
        events.push(json!({
            "name": row["name"],
            "cat": "task",
            "ph": "X",
            "ts": start_us,
            "dur": (end_us - start_us).max(0.0),
            "pid": pid,
            "tid": tid,
            "args": {
                "task_id": row["task_id"],
                "attempt_number": row["attempt_number"],
                "state": row["state"],
                "job_id": row["job_id"],
                "error_type": row["error_type"],
            },
        }));
        if let Some(text) = row["profile_events"].as_str() {
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
