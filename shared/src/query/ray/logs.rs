//! `api/v0/logs` and `api/v0/logs/file` over the shipped log files (see docs/architecture.md,
//! "Logs"), as Ray 2.60's `StateHead.list_logs` and `get_logs` answer them: a node's files
//! grouped by Ray's categories, and a file's last lines or a task's own output as plain text.
//!
//! A task's output, a node's files and a file's tail are read through the engine's log methods
//! (`QueryEngine::task_log`, `log_files`, `log_tail`), which the dashboard API's log routes use
//! too.

use serde_json::{Map, Value as Json, json};

use super::body::RayBody;
use super::value;
use crate::keys::{ClusterName, LogFile, LogFileName, NodeId, SessionName};
use crate::query::read::entity_records::records;
use crate::query::read::params::Scope;
use crate::query::{QueryEngine, QueryError};
use crate::tables::entities::EntityKind;

/// Ray's `DEFAULT_LOG_LIMIT`: lines of a file answered when `lines` is not given.
const DEFAULT_LINES: usize = 1000;

/// `GET api/v0/logs?node_id=…[&glob=…]`.
pub(super) async fn index(
    engine: &QueryEngine,
    scope: &Scope,
    pairs: &[(String, String)],
) -> Result<Json, QueryError> {
    let node_id = node_of(pairs)?;
    let glob = value(pairs, "glob").unwrap_or("*");
    let (cluster, session) = place(scope)?;
    let files = engine.log_files(&cluster, &session, &node_id).await?;
    let mut groups: Map<String, Json> = Map::new();
    for file in files {
        let name = file.name.as_str();
        if !glob_matches(glob, name) {
            continue;
        }
        let names = groups
            .entry(category(name))
            .or_insert_with(|| Json::Array(Vec::new()));
        if let Json::Array(names) = names {
            names.push(Json::from(name));
        }
    }
    Ok(json!({"result": true, "msg": "", "data": {"result": groups}}))
}

/// `GET api/v0/logs/file?node_id=…&filename=…[&lines=N]`, or `?task_id=…[&attempt_number=N]
/// [&suffix=out|err]`.
pub(super) async fn file(
    engine: &QueryEngine,
    scope: &Scope,
    pairs: &[(String, String)],
) -> Result<RayBody, QueryError> {
    let (cluster, session) = place(scope)?;
    if let Some(task_id) = value(pairs, "task_id") {
        let stream = match value(pairs, "suffix").unwrap_or("out") {
            "out" => "stdout",
            "err" => "stderr",
            other => {
                return Err(QueryError::BadRequest(format!(
                    "suffix must be out or err, not {other:?}"
                )));
            }
        };
        let query = [
            ("cluster".to_owned(), cluster.to_string()),
            ("session".to_owned(), session.to_string()),
            (
                "attempt".to_owned(),
                value(pairs, "attempt_number").unwrap_or("0").to_owned(),
            ),
            ("stream".to_owned(), stream.to_owned()),
        ];
        let log = engine.task_log(task_id, &query).await?;
        return Ok(RayBody::text(filtered(pairs, log.bytes)));
    }
    let file = match (value(pairs, "actor_id"), value(pairs, "filename")) {
        (Some(actor_id), _) => actor_file(engine, scope, actor_id, pairs).await?,
        (None, Some(filename)) => LogFile {
            cluster,
            session,
            node_id: node_of(pairs)?,
            file: LogFileName::new(filename.rsplit('/').next().unwrap_or(filename))
                .map_err(|err| QueryError::BadRequest(err.to_string()))?,
        },
        (None, None) => {
            return Err(QueryError::BadRequest(
                "Afterglow finds a log by task_id (with attempt_number and suffix), by actor_id \
                 (and suffix), or by node_id and filename; pid and submission_id are not kept"
                    .into(),
            ));
        }
    };
    let lines = match value(pairs, "lines") {
        None => Some(DEFAULT_LINES),
        Some(text) => match text.parse::<i64>() {
            Ok(lines) if lines < 0 => None,
            Ok(lines) => Some(usize::try_from(lines).unwrap_or(usize::MAX)),
            Err(_) => {
                return Err(QueryError::BadRequest(format!(
                    "lines must be a number (-1 for all), not {text:?}"
                )));
            }
        },
    };
    let tail = engine.log_tail(&file, lines).await?;
    Ok(RayBody::text(filtered(pairs, tail.bytes)))
}

/// The bytes, without colour codes when `filter_ansi_code=true` asks (the dashboard does).
fn filtered(pairs: &[(String, String)], bytes: Vec<u8>) -> Vec<u8> {
    if value(pairs, "filter_ansi_code").is_some_and(|flag| flag.eq_ignore_ascii_case("true")) {
        strip_ansi(&bytes)
    } else {
        bytes
    }
}

/// Removes what Ray's `ANSI_ESC_PATTERN` matches: ESC `[`, one or more of `0-9 ; ( )`, `m`.
fn strip_ansi(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(byte) = bytes.get(at) {
        if *byte == 0x1b && bytes.get(at + 1) == Some(&b'[') {
            let body = bytes
                .get(at + 2..)
                .unwrap_or_default()
                .iter()
                .take_while(|b| b.is_ascii_digit() || matches!(b, b';' | b'(' | b')'))
                .count();
            if body > 0 && bytes.get(at + 2 + body) == Some(&b'm') {
                at += 3 + body;
                continue;
            }
        }
        out.push(*byte);
        at += 1;
    }
    out
}

/// The stdout (`suffix=out`) or stderr file of the worker an actor last ran in:
/// `worker-{worker_id}-{job_id}-{pid}.{suffix}` on its node.
async fn actor_file(
    engine: &QueryEngine,
    scope: &Scope,
    actor_id: &str,
    pairs: &[(String, String)],
) -> Result<LogFile, QueryError> {
    let suffix = match value(pairs, "suffix").unwrap_or("out") {
        suffix @ ("out" | "err") => suffix,
        other => {
            return Err(QueryError::BadRequest(format!(
                "suffix must be out or err, not {other:?}"
            )));
        }
    };
    let (cluster, session) = place(scope)?;
    let (node, pid) = actor_worker(engine, scope, actor_id).await?;
    let node_id = NodeId::new(&node).map_err(|err| QueryError::NotFound(err.to_string()))?;
    let ending = format!("-{pid}.{suffix}");
    let files = engine.log_files(&cluster, &session, &node_id).await?;
    let file = files
        .into_iter()
        .map(|file| file.name)
        .find(|name| name.as_str().starts_with("worker-") && name.as_str().ends_with(&ending))
        .ok_or_else(|| {
            QueryError::NotFound(format!(
                "no log of actor {actor_id}'s worker (pid {pid}) was shipped from node \
                 {node_id}: run the log shipper (`afterglow-ship-logs`) next to `ray start` on \
                 every node"
            ))
        })?;
    Ok(LogFile {
        cluster,
        session,
        node_id,
        file,
    })
}

/// Where an actor last ran: its node and pid (what names its worker's log files).
async fn actor_worker(
    engine: &QueryEngine,
    scope: &Scope,
    id: &str,
) -> Result<(String, u32), QueryError> {
    let entities = records(engine, scope, EntityKind::Actors).await?;
    let actor = entities
        .actors
        .get(&id.to_ascii_lowercase())
        .ok_or_else(|| QueryError::NotFound(format!("no actor {id}")))?;
    match (actor.node_id(), actor.pid()) {
        (Some(node_id), Some(pid)) => Ok((node_id, pid)),
        _ => Err(QueryError::NotFound(format!(
            "actor {id} never reported the node and process it ran in"
        ))),
    }
}

/// The node a log request names; Ray's own words when it names none.
fn node_of(pairs: &[(String, String)]) -> Result<NodeId, QueryError> {
    match (value(pairs, "node_id"), value(pairs, "node_ip")) {
        (Some(id), _) => NodeId::new(&id.to_ascii_lowercase())
            .map_err(|err| QueryError::BadRequest(err.to_string())),
        (None, Some(_)) => Err(QueryError::BadRequest(
            "Afterglow finds a node's logs by node_id (see `ray list nodes`), not node_ip".into(),
        )),
        (None, None) => Err(QueryError::BadRequest(
            "Both node id and node ip are not provided. Please provide at least one of them."
                .into(),
        )),
    }
}

/// The cluster and session a resolved scope names.
pub(super) fn place(scope: &Scope) -> Result<(ClusterName, SessionName), QueryError> {
    let (Some(cluster), Some(session)) = (&scope.cluster, &scope.session) else {
        return Err(QueryError::Internal(
            "a Ray route without its session".into(),
        ));
    };
    let session = SessionName::new(session).map_err(|err| QueryError::NotFound(err.to_string()))?;
    Ok((cluster.clone(), session))
}

/// Ray 2.60's `_categorize_log_files`, in its order of tests.
fn category(name: &str) -> String {
    let category = if name.contains("worker") && name.ends_with(".out") {
        "worker_out"
    } else if name.contains("worker") && name.ends_with(".err") {
        "worker_err"
    } else if name.contains("core-worker") && name.ends_with(".log") {
        "core_worker"
    } else if name.contains("core-driver") && name.ends_with(".log") {
        "driver"
    } else if name.contains("raylet.") {
        "raylet"
    } else if name.contains("gcs_server.") {
        "gcs_server"
    } else if name.contains("log_monitor") {
        "internal"
    } else if name.contains("monitor") {
        "autoscaler"
    } else if name.contains("agent.") {
        "agent"
    } else if name.contains("dashboard.") {
        "dashboard"
    } else {
        "internal"
    };
    category.to_owned()
}

/// `fnmatch` with `*` and `?` (Ray's `glob` filter; no character classes).
fn glob_matches(pattern: &str, name: &str) -> bool {
    let (pattern, name): (Vec<char>, Vec<char>) =
        (pattern.chars().collect(), name.chars().collect());
    let (mut p, mut n) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some('*') => {
                backtrack = Some((p, n));
                p += 1;
            }
            Some(&c) if c == '?' || Some(&c) == name.get(n) => {
                p += 1;
                n += 1;
            }
            _ => match backtrack {
                Some((star, matched)) => {
                    p = star + 1;
                    n = matched + 1;
                    backtrack = Some((star, matched + 1));
                }
                None => return false,
            },
        }
    }
    pattern
        .get(p..)
        .is_some_and(|rest| rest.iter().all(|c| *c == '*'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_fall_in_rays_categories() {
        for (name, expected) in [
            ("worker-ab-01000000-7.out", "worker_out"),
            ("worker-ab-01000000-7.err", "worker_err"),
            ("python-core-worker-ab_7.log", "core_worker"),
            ("python-core-driver-01000000_7.log", "driver"),
            ("raylet.out", "raylet"),
            ("gcs_server.err", "gcs_server"),
            ("log_monitor.log", "internal"),
            ("monitor.log", "autoscaler"),
            ("dashboard_agent.log", "agent"),
            ("dashboard.log", "dashboard"),
            ("debug_state.txt", "internal"),
        ] {
            assert_eq!(category(name), expected, "{name}");
        }
    }

    #[test]
    fn colour_codes_go_as_rays_pattern_says() {
        let coloured = b"\x1b[31mred\x1b[0m \x1b[1;32mbold\x1b[m \x1b[2Jclear";
        assert_eq!(
            strip_ansi(coloured),
            b"red bold\x1b[m \x1b[2Jclear".to_vec()
        );
    }

    #[test]
    fn globs_match_like_fnmatch() {
        for (pattern, name, expected) in [
            ("*", "raylet.out", true),
            ("*worker*", "worker-a.out", true),
            ("*worker*", "raylet.out", false),
            ("raylet.???", "raylet.out", true),
            ("raylet.??", "raylet.out", false),
            ("*.out", "a.out.1", false),
            ("a*b*c", "aXbYbZc", true),
            ("", "", true),
        ] {
            assert_eq!(glob_matches(pattern, name), expected, "{pattern} {name}");
        }
    }
}
