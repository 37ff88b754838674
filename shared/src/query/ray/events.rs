//! `GET events`, the cluster events Ray's overview lists (a worker that died, a node removed, a
//! job started and ended), from the event files the shipper sends from every node's
//! `logs/events/` (`event_GCS.log`, `event_RAYLET.log`, `event_JOBS.log`, …), answered as Ray
//! 2.60's `EventHead` answers from the same files: one JSON object per line, grouped by the job
//! id in its custom fields (`global` without one), the same event id once, every key
//! camel-cased (`rest_response`'s `to_google_style`).

use futures_util::{StreamExt as _, stream};
use serde_json::{Map, Value as Json, json};

use super::logs::place;
use super::value;
use crate::keys::{NodeId, NodeLogs};
use crate::logs::read::read_tails;
use crate::query::read::entity_records::records;
use crate::query::read::params::Scope;
use crate::query::{QueryEngine, QueryError};
use crate::tables::entities::EntityKind;

/// Ray's `RAY_DASHBOARD_MAX_EVENTS_TO_CACHE`: the newest events kept per job (and of no job),
/// and so the most lines read from the end of each file.
const EVENTS_PER_JOB: usize = 10_000;

/// Nodes whose event files are read at a time.
const NODES_AT_ONCE: usize = 8;

/// Whether a shipped file holds cluster events: the names Ray's event writers give their files
/// (`event_{SOURCE}.log`, rotated as `event_{SOURCE}.{n}.log`).
fn holds_events(name: &str) -> bool {
    name.starts_with("event_") && name.ends_with(".log")
}

/// `GET events[?job_id=…]`.
pub(super) async fn events(
    engine: &QueryEngine,
    scope: &Scope,
    pairs: &[(String, String)],
) -> Result<Json, QueryError> {
    let by_job = by_job(&event_lines(engine, scope).await?);
    Ok(match value(pairs, "job_id") {
        Some(job_id) => json!({"result": true, "msg": "Job events fetched.",
            "data": {"jobId": job_id, "events": by_job.get(job_id).cloned().unwrap_or_default()}}),
        None => json!({"result": true, "msg": "All events fetched.",
            "data": {"events": Json::Object(by_job)}}),
    })
}

/// The session's shipped event files, node by node, each file's last [`EVENTS_PER_JOB`] lines,
/// at most the response size in all. [`NODES_AT_ONCE`] nodes are read at a time, each up to the
/// response size, and taken in order until it is spent: a cluster of hundreds of nodes costs
/// its index reads side by side, and at most that many responses' bytes are held at once.
async fn event_lines(engine: &QueryEngine, scope: &Scope) -> Result<Vec<u8>, QueryError> {
    let (cluster, session) = place(scope)?;
    let nodes = records(engine, scope, EntityKind::Nodes).await?.nodes;
    let limit = engine.settings.response_bytes;
    let storage = &**engine.storage();
    // Owned ids: a stream of futures over borrowed records is not `Send` for every lifetime.
    let node_ids: Vec<NodeId> = nodes
        .values()
        .filter_map(|node| NodeId::new(&node.id).ok())
        .collect();
    let reads = node_ids.into_iter().map(|node_id| {
        let node = NodeLogs {
            cluster: cluster.clone(),
            session: session.clone(),
            node_id,
        };
        async move { read_tails(storage, &node, holds_events, EVENTS_PER_JOB, limit).await }
    });
    let mut tails = stream::iter(reads).buffered(NODES_AT_ONCE);
    let mut left = limit;
    let mut lines = Vec::new();
    while left > 0
        && let Some(node_tails) = tails.next().await
    {
        let node_tails = node_tails
            .map_err(|err| QueryError::Internal(format!("reading the cluster events: {err}")))?;
        for (_, tail) in node_tails {
            let taken = tail.bytes.len().min(left);
            // A tail past what is left loses its oldest lines, as each node's read does.
            let bytes = tail
                .bytes
                .get(tail.bytes.len() - taken..)
                .unwrap_or_default();
            left -= taken;
            lines.extend_from_slice(bytes);
            if !lines.ends_with(b"\n") {
                lines.push(b'\n');
            }
            if left == 0 {
                break;
            }
        }
    }
    Ok(lines)
}

/// The events of `lines` by job, as Ray's `EventHead._update_events` keeps them: an event id
/// seen again replaces the earlier event in its place, and each job keeps its newest
/// [`EVENTS_PER_JOB`]. A line that is not a JSON object is left out, as Ray leaves it out.
fn by_job(lines: &[u8]) -> Map<String, Json> {
    let mut jobs: Map<String, Json> = Map::new();
    let mut places: std::collections::HashMap<(String, String), usize> = Default::default();
    for line in lines.split(|byte| *byte == b'\n') {
        let Ok(Json::Object(mut event)) = serde_json::from_slice::<Json>(line) else {
            continue;
        };
        if let Some(Json::String(message)) = event.get_mut("message") {
            *message = message.replace("\\n", "\n").replace("\\r", "\n");
        }
        let job = event
            .get("custom_fields")
            .and_then(|fields| fields.get("job_id"))
            .and_then(Json::as_str)
            .filter(|job| !job.is_empty())
            .unwrap_or("global")
            .to_owned();
        let id = event
            .get("event_id")
            .map(|id| id.to_string())
            .unwrap_or_default();
        let Json::Array(events) = jobs
            .entry(job.clone())
            .or_insert_with(|| Json::Array(Vec::new()))
        else {
            continue;
        };
        let event = google_style(Json::Object(event));
        match places.get(&(job.clone(), id.clone())) {
            Some(&at) if at < events.len() => events[at] = event,
            _ => {
                places.insert((job, id), events.len());
                events.push(event);
            }
        }
    }
    for events in jobs.values_mut() {
        if let Json::Array(events) = events {
            let over = events.len().saturating_sub(EVENTS_PER_JOB);
            events.drain(..over);
        }
    }
    jobs
}

/// Ray's `to_google_style`: every key of an object camel-cased, in objects within objects and
/// within arrays (but not arrays within arrays).
fn google_style(value: Json) -> Json {
    match value {
        Json::Object(map) => Json::Object(
            map.into_iter()
                .map(|(key, inner)| {
                    let inner = match inner {
                        Json::Array(items) => Json::Array(
                            items
                                .into_iter()
                                .map(|item| match item {
                                    Json::Object(_) => google_style(item),
                                    other => other,
                                })
                                .collect(),
                        ),
                        other => google_style(other),
                    };
                    (camel_case(&key), inner)
                })
                .collect(),
        ),
        other => other,
    }
}

/// Ray's `to_camel_case`: the parts between underscores after the first, each as Python's
/// `str.title` writes it (a letter after a letter lower case, any other upper case).
fn camel_case(key: &str) -> String {
    let mut parts = key.split('_');
    let mut camel = parts.next().unwrap_or_default().to_owned();
    for part in parts {
        let mut after_letter = false;
        for c in part.chars() {
            if after_letter {
                camel.extend(c.to_lowercase());
            } else {
                camel.extend(c.to_uppercase());
            }
            after_letter = c.is_alphabetic();
        }
    }
    camel
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_camel_cased_as_python_titles_them() {
        assert_eq!(camel_case("event_id"), "eventId");
        assert_eq!(camel_case("custom_fields"), "customFields");
        assert_eq!(camel_case("global"), "global");
        assert_eq!(camel_case("01000000"), "01000000");
        // "x_ID2x".title() is "Id2X"; a leading underscore keeps an empty first part.
        assert_eq!(camel_case("x_ID2x"), "xId2X");
        assert_eq!(camel_case("_private"), "Private");
    }

    #[test]
    fn events_group_by_job_and_an_id_seen_again_replaces_the_first() {
        let lines = concat!(
            r#"{"event_id":"a","source_type":"RAYLET","message":"died\\nhere","custom_fields":{"job_id":"01000000","worker_id":"w"}}"#,
            "\n",
            r#"{"event_id":"b","source_type":"JOBS","message":"Started","custom_fields":{"submission_id":"s"}}"#,
            "\nnot json\n",
            r#"{"event_id":"a","source_type":"RAYLET","message":"again","custom_fields":{"job_id":"01000000"}}"#,
            "\n",
            r#"{"event_id":"c","source_type":"GCS","message":"no fields"}"#,
        );
        let jobs = by_job(lines.as_bytes());
        assert_eq!(
            Json::Object(jobs),
            json!({
                "01000000": [{"eventId": "a", "sourceType": "RAYLET", "message": "again",
                    "customFields": {"jobId": "01000000"}}],
                "global": [
                    {"eventId": "b", "sourceType": "JOBS", "message": "Started",
                        "customFields": {"submissionId": "s"}},
                    {"eventId": "c", "sourceType": "GCS", "message": "no fields"},
                ],
            })
        );
        let first = by_job(lines.lines().next().unwrap_or_default().as_bytes());
        assert_eq!(first["01000000"][0]["message"], "died\nhere");
    }
}
