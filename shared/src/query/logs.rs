//! Shipped log files (see docs/architecture.md, "Logs"): `GET /api/tasks/{task_id}/logs`, one
//! attempt's own stdout or stderr cut from its worker's file at the offsets Ray reported in
//! `taskLogInfo`; `GET /api/logs`, the files a node shipped; `GET /api/logs/file`, a file's
//! last lines.
//!
//! They are methods of the engine, public because the binary calls the byte-answering ones
//! directly and Ray's log routes read through [`QueryEngine::task_log`],
//! [`QueryEngine::log_files`] and [`QueryEngine::log_tail`] too.

use serde_json::Value as Json;

use super::read::attempts::attempts_relation;
use super::read::json::{JsonRow, query_rows};
use super::read::params::{Params, Scope, parse_hex};
use super::read::sql::{Relation, Sql};
use super::{QueryEngine, QueryError};
use crate::keys::{ClusterName, LogFile, LogFileName, NodeId, SessionName};
use crate::logs::store::{LogError, LogRange, ShippedFile, list_files, read_range, read_tail};

/// One attempt's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskLog {
    /// The bytes the attempt wrote to the stream, exactly.
    pub bytes: Vec<u8>,
    /// False when the file was not shipped up to the attempt's end (yet, or ever: a node lost
    /// before it could send its last second).
    pub complete: bool,
    /// The worker's file the bytes come from (its name in the session's `logs/`).
    pub file: String,
    /// Ray never reported where this attempt's output is (its worker died before it could:
    /// `os._exit`, a crash, the OOM killer), so the range was inferred: from where the worker's
    /// previous task ended to where its next began, Ray's own marker lines left out.
    pub inferred: bool,
}

/// Which of an attempt's two streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn columns(self) -> [&'static str; 3] {
        match self {
            Stream::Stdout => ["stdout_file", "stdout_start", "stdout_end"],
            Stream::Stderr => ["stderr_file", "stderr_start", "stderr_end"],
        }
    }
}

impl QueryEngine {
    /// The output of attempt `attempt` (the last one when not given) of `task_id` on `stream`
    /// (`stdout` or `stderr`), from `cluster`/`session` when given.
    #[tracing::instrument(name = "task_log", skip(self, params))]
    pub async fn task_log(
        &self,
        task_id: &str,
        params: &[(String, String)],
    ) -> Result<TaskLog, QueryError> {
        let mut allowed = Scope::PARAMS.to_vec();
        allowed.extend(["attempt", "stream"]);
        let params = Params::parse(params, &allowed)?;
        let scope = Scope::from_params(&params)?;
        let task_id = parse_hex("task_id", task_id)?;
        let attempt = params.integer("attempt")?;
        let stream = match params.choice("stream", &["stdout", "stderr"], "stdout")? {
            "stderr" => Stream::Stderr,
            _ => Stream::Stdout,
        };
        let missing = || QueryError::NotFound(format!("no task {task_id}"));
        let relation = attempts_relation(self, &scope).await?.ok_or_else(missing)?;
        // Task ids repeat across clusters (and a session name alone may too): unless the
        // request names one session, the attempt's place must be the only one.
        let mut places = Sql::default();
        places
            .push("SELECT DISTINCT cluster, session_name FROM ")
            .relation(&relation)
            .push(" WHERE task_id = ")
            .bind(task_id.clone());
        if let Some(attempt) = attempt {
            places.push(" AND attempt_number = ").bind(attempt);
        }
        places
            .push(" ORDER BY cluster, session_name LIMIT ")
            .number(PLACES_LISTED + 1);
        let one_session = scope.cluster.is_some() && scope.session.is_some();
        let [file_column, start_column, end_column] = stream.columns();
        let mut sql = Sql::default();
        sql.push(
            "SELECT cluster, session_name, attempt_number, node_id, worker_id, creation_time_ms, ",
        )
        .push(file_column)
        .push(" AS file, ")
        .push(start_column)
        .push(" AS start, ")
        .push(end_column)
        .push(" AS end FROM ")
        .relation(&relation)
        .push(" WHERE task_id = ")
        .bind(task_id.clone());
        if let Some(attempt) = attempt {
            sql.push(" AND attempt_number = ").bind(attempt);
        }
        sql.push(" ORDER BY attempt_number DESC, session_name DESC LIMIT 1");
        let (places, rows) = self
            .run(move |connection| {
                let places = if one_session {
                    Vec::new()
                } else {
                    query_rows(connection, &places.text, &places.params)?
                };
                Ok((places, query_rows(connection, &sql.text, &sql.params)?))
            })
            .await?;
        if places.len() > 1 {
            return Err(ambiguous(&task_id, &places));
        }
        let row = rows.into_iter().next().ok_or_else(|| match attempt {
            Some(attempt) => {
                QueryError::NotFound(format!("task {task_id} has no attempt {attempt}"))
            }
            None => missing(),
        })?;
        let text = |column: &str| row.get(column).and_then(Json::as_str).map(str::to_owned);
        let number = |column: &str| row.get(column).and_then(Json::as_u64);
        let attempt = number("attempt_number").unwrap_or(0);
        let reported = match (text("file"), number("start")) {
            (Some(path), Some(start)) => Some((
                path.rsplit('/').next().unwrap_or(&path).to_owned(),
                start,
                number("end"),
            )),
            _ => None,
        };
        let inferred = reported.is_none();
        let (name, start, end) = match reported {
            Some(place) => place,
            None => self
                .inferred_place(&relation, &row, stream)
                .await?
                .ok_or_else(|| {
                    QueryError::NotFound(format!(
                        "attempt {attempt} of task {task_id} has no {} location: Ray reports \
                         one (taskLogInfo) once the attempt runs on a worker, so drivers and \
                         attempts that never ran have none",
                        file_column.trim_end_matches("_file")
                    ))
                })?,
        };
        let file = log_file(&row, &name).map_err(|reason| {
            QueryError::NotFound(format!(
                "attempt {attempt} of task {task_id} names no log file Afterglow can keep: {reason}"
            ))
        })?;
        let range = read_range(&**self.storage(), &file, start, end)
            .await
            .map_err(log_error)?;
        // An empty range is also what a file never shipped gives: say which it is.
        let shipped =
            !range.bytes.is_empty() || !self.storage().list(&file.prefix()).await?.is_empty();
        if !shipped {
            return Err(QueryError::NotFound(format!(
                "no log of {name} was shipped from node {}: run `afterglow ship-logs` next to \
                 `ray start` on every node to keep tasks' output",
                file.node_id
            )));
        }
        let mut bytes = if inferred {
            without_markers(&range.bytes)
        } else {
            range.bytes
        };
        let mut complete = range.complete;
        // A task can print more than a response may carry (Lambda's 6 MB): its start is kept.
        if bytes.len() > self.settings.response_bytes {
            bytes.truncate(self.settings.response_bytes);
            complete = false;
        }
        Ok(TaskLog {
            bytes,
            complete,
            file: name,
            inferred,
        })
    }

    /// Where an attempt Ray reported no `taskLogInfo` for wrote: its worker's file (found by
    /// the worker id in its name, among the files its node shipped), from where the worker's
    /// previous attempt ended to where its next began. `None` without a worker or its file.
    async fn inferred_place(
        &self,
        relation: &Relation,
        row: &JsonRow,
        stream: Stream,
    ) -> Result<Option<(String, u64, Option<u64>)>, QueryError> {
        let text = |column: &str| row.get(column).and_then(Json::as_str).map(str::to_owned);
        let (Some(cluster), Some(session), Some(node_id), Some(worker_id)) = (
            text("cluster"),
            text("session_name"),
            text("node_id"),
            text("worker_id"),
        ) else {
            return Ok(None);
        };
        let (Ok(cluster_name), Ok(session_name), Ok(node)) = (
            ClusterName::new(&cluster),
            SessionName::new(&session),
            NodeId::new(&node_id),
        ) else {
            return Ok(None);
        };
        let (prefix, suffix) = (
            format!("worker-{worker_id}-"),
            match stream {
                Stream::Stdout => ".out",
                Stream::Stderr => ".err",
            },
        );
        let files = self.log_files(&cluster_name, &session_name, &node).await?;
        let Some(name) = files
            .into_iter()
            .map(|file| file.name.as_str().to_owned())
            .find(|name| name.starts_with(&prefix) && name.ends_with(suffix))
        else {
            return Ok(None);
        };
        let created = row
            .get("creation_time_ms")
            .and_then(Json::as_i64)
            .unwrap_or(i64::MAX);
        let [_, start_column, end_column] = stream.columns();
        let mut sql = Sql::default();
        sql.push("SELECT max(CASE WHEN creation_time_ms < ")
            .bind(created)
            .push(" THEN coalesce(")
            .push(end_column)
            .push(", ")
            .push(start_column)
            .push(") END) AS after, min(CASE WHEN creation_time_ms > ")
            .bind(created)
            .push(" THEN ")
            .push(start_column)
            .push(" END) AS before FROM ")
            .relation(relation)
            .push(" WHERE cluster = ")
            .bind(cluster)
            .push(" AND session_name = ")
            .bind(session)
            .push(" AND worker_id = ")
            .bind(worker_id);
        let rows = self
            .run(move |connection| query_rows(connection, &sql.text, &sql.params))
            .await?;
        let bound = |column: &str| {
            rows.first()
                .and_then(|row| row.get(column))
                .and_then(Json::as_u64)
        };
        Ok(Some((name, bound("after").unwrap_or(0), bound("before"))))
    }
}

/// `bytes` without the lines Ray's workers write before each task for its log monitor
/// (`:job_id:…`, `:task_name:…`, `:actor_name:…`).
fn without_markers(bytes: &[u8]) -> Vec<u8> {
    const MARKERS: [&[u8]; 3] = [b":job_id:", b":task_name:", b":actor_name:"];
    bytes
        .split_inclusive(|byte| *byte == b'\n')
        .filter(|line| !MARKERS.iter().any(|marker| line.starts_with(marker)))
        .flatten()
        .copied()
        .collect()
}

impl QueryEngine {
    /// The files shipped from `node_id` in `session`, by name.
    pub async fn log_files(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        node_id: &NodeId,
    ) -> Result<Vec<ShippedFile>, QueryError> {
        list_files(&**self.storage(), cluster, session, node_id)
            .await
            .map_err(log_error)
    }

    /// The last `lines` lines of `file`, or all of it (`None`), at most the response size;
    /// 404 when nothing was shipped.
    pub async fn log_tail(
        &self,
        file: &LogFile,
        lines: Option<usize>,
    ) -> Result<LogRange, QueryError> {
        let tail = read_tail(&**self.storage(), file, lines.unwrap_or(usize::MAX))
            .await
            .map_err(log_error)?;
        if tail.bytes.is_empty() && !tail.complete {
            return Err(QueryError::NotFound(format!(
                "no log {} was shipped from node {} in {}",
                file.file, file.node_id, file.session
            )));
        }
        // The end is what a tail is for: past the response limit, its start goes.
        let budget = self.settings.response_bytes;
        if tail.bytes.len() > budget {
            let cut = tail.bytes.len() - budget;
            return Ok(LogRange {
                bytes: tail.bytes.get(cut..).unwrap_or_default().to_vec(),
                complete: false,
            });
        }
        Ok(tail)
    }

    /// `GET /api/logs?cluster=…&session=…&node_id=…`: `{"files": [{"file", "chunks"}]}`.
    pub(super) async fn answer_log_files(
        &self,
        params: &[(String, String)],
    ) -> Result<Json, QueryError> {
        let params = Params::parse(params, &["cluster", "session", "node_id"])?;
        let (cluster, session, node_id) = node_place(&params)?;
        let files = self.log_files(&cluster, &session, &node_id).await?;
        Ok(serde_json::json!({
            "cluster": cluster.as_str(),
            "session": session.as_str(),
            "node_id": node_id.as_str(),
            "files": files
                .iter()
                .map(|file| serde_json::json!({"file": file.name.as_str(), "chunks": file.chunks}))
                .collect::<Vec<_>>(),
        }))
    }

    /// `GET /api/logs/file?cluster=…&session=…&node_id=…&file=…[&lines=N]`: the last `lines`
    /// lines (1000 by default, every line with `-1`).
    pub async fn answer_log_file(
        &self,
        params: &[(String, String)],
    ) -> Result<LogRange, QueryError> {
        let params = Params::parse(params, &["cluster", "session", "node_id", "file", "lines"])?;
        let (cluster, session, node_id) = node_place(&params)?;
        let name = params
            .text("file")?
            .ok_or_else(|| QueryError::BadRequest("`file` is required".into()))?;
        let file = LogFile {
            cluster,
            session,
            node_id,
            file: LogFileName::new(&name).map_err(|err| QueryError::BadRequest(err.to_string()))?,
        };
        let lines = match params.integer("lines")? {
            None => Some(1000),
            Some(lines) if lines < 0 => None,
            Some(lines) => Some(usize::try_from(lines).unwrap_or(usize::MAX)),
        };
        self.log_tail(&file, lines).await
    }
}

/// The most places an ambiguous task id's answer lists.
const PLACES_LISTED: usize = 10;

/// The answer to a task id found in more than one session (`places`: their `cluster` and
/// `session_name`, at most one more than [`PLACES_LISTED`]).
fn ambiguous(task_id: &str, places: &[JsonRow]) -> QueryError {
    let text = |row: &JsonRow, column: &str| {
        row.get(column)
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let listed: Vec<String> = places
        .iter()
        .take(PLACES_LISTED)
        .map(|row| {
            format!(
                "cluster={} session={}",
                text(row, "cluster"),
                text(row, "session_name")
            )
        })
        .collect();
    let more = if places.len() > PLACES_LISTED {
        ", and more"
    } else {
        ""
    };
    QueryError::Ambiguous(format!(
        "task {task_id} ran in more than one session; name one with `cluster` and `session`: \
         {}{more}",
        listed.join("; ")
    ))
}

/// The `cluster`, `session` and `node_id` parameters, all required.
fn node_place(params: &Params) -> Result<(ClusterName, SessionName, NodeId), QueryError> {
    let required = |name: &str| -> Result<String, QueryError> {
        params
            .text(name)?
            .ok_or_else(|| QueryError::BadRequest(format!("`{name}` is required")))
    };
    let bad = |err: &dyn std::fmt::Display| QueryError::BadRequest(err.to_string());
    Ok((
        ClusterName::new(&required("cluster")?).map_err(|err| bad(&err))?,
        SessionName::new(&required("session")?).map_err(|err| bad(&err))?,
        NodeId::new(&required("node_id")?.to_ascii_lowercase()).map_err(|err| bad(&err))?,
    ))
}

fn log_error(err: LogError) -> QueryError {
    match err {
        LogError::Storage(err) => QueryError::Storage(err),
        other => QueryError::Internal(other.to_string()),
    }
}

/// Where a stored attempt's log file is kept.
fn log_file(row: &JsonRow, name: &str) -> Result<LogFile, String> {
    let text = |column: &str| {
        row.get(column)
            .and_then(Json::as_str)
            .ok_or(format!("no {column}"))
    };
    Ok(LogFile {
        cluster: ClusterName::new(text("cluster")?).map_err(|err| err.to_string())?,
        session: SessionName::new(text("session_name")?).map_err(|err| err.to_string())?,
        node_id: NodeId::new(text("node_id")?).map_err(|err| err.to_string())?,
        file: LogFileName::new(name).map_err(|err| err.to_string())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rays_marker_lines_are_left_out_of_an_inferred_range() {
        let written = b":job_id:01000000\n:task_name:prints_then_exits\nlast words\n\
                        :actor_name:A\nsays :task_name: in a line\nno newline";
        assert_eq!(
            without_markers(written),
            b"last words\nsays :task_name: in a line\nno newline".to_vec()
        );
    }
}
