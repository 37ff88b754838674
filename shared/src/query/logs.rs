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
use crate::keys::{ClusterName, LogFile, LogFileName, NodeId, NodeLogs, SessionName};
use crate::logs::markers::{Known, before_next_task, own_output};
use crate::logs::read::{LogRange, ShippedFile, is_shipped, list_files, read_range, read_tail};
use crate::logs::store::LogError;

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
    /// Ray never reported where this attempt's output is (it exported no `RUNNING` event for
    /// it, or its worker died first: `os._exit`, a crash, the OOM killer), so the range was
    /// inferred: between the attempts around it on the worker that have offsets, cut at the
    /// marker lines Ray's worker writes before each task (see [`crate::logs::markers`]).
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
            "SELECT cluster, session_name, task_id, attempt_number, name, node_id, worker_id, ",
        )
        .push(RAN_AT)
        .push(" AS ran_at, ")
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
        let inferred = match &reported {
            Some(_) => None,
            None => Some(
                self.inferred_place(&relation, &row, stream)
                    .await?
                    .ok_or_else(|| {
                        QueryError::NotFound(format!(
                            "attempt {attempt} of task {task_id} has no {} location: Ray \
                             reports one (taskLogInfo) once the attempt runs on a worker, so \
                             drivers and attempts that never ran have none",
                            file_column.trim_end_matches("_file")
                        ))
                    })?,
            ),
        };
        let (name, start, end) = match (reported, &inferred) {
            (Some(place), _) => place,
            (None, Some(inferred)) => (inferred.file.clone(), inferred.start, inferred.end),
            (None, None) => return Err(missing()),
        };
        let file = log_file(&row, &name).map_err(|reason| {
            QueryError::NotFound(format!(
                "attempt {attempt} of task {task_id} names no log file Afterglow can keep: {reason}"
            ))
        })?;
        // One byte past the response's size tells a range that does not fit from one that does.
        let cap = self.settings.response_bytes.saturating_add(1);
        let range = read_range(&**self.storage(), &file, start, end, cap)
            .await
            .map_err(log_error)?;
        // An empty range is also what a file never shipped gives: say which it is.
        let shipped = !range.bytes.is_empty()
            || is_shipped(&**self.storage(), &file)
                .await
                .map_err(log_error)?;
        if !shipped {
            return Err(QueryError::NotFound(format!(
                "no log of {name} was shipped from node {}: run the log shipper \
                 (`afterglow-ship-logs`) next to `ray start` on every node to keep tasks' output",
                file.node_id
            )));
        }
        let cut = range.bytes.len() >= cap;
        let mut bytes = match &inferred {
            // Ray reports no end while the attempt runs, or when its worker died: its output
            // ends where the worker's next task begins, if one did.
            None if end.is_none() => before_next_task(&range.bytes),
            None => range.bytes,
            Some(inferred) => {
                let known = Known {
                    clean_start: inferred.clean_start,
                    next_reported: end.is_some() && !cut,
                    ordered: inferred.ordered,
                };
                own_output(&range.bytes, &inferred.ran, inferred.asked, known).map_err(
                    |unbounded| {
                        let why = if cut {
                            format!(
                                "the part of {name} its output lies in is over {} bytes",
                                self.settings.response_bytes
                            )
                        } else {
                            unbounded.to_string()
                        };
                        QueryError::NotFound(format!(
                            "Ray reported no offsets for attempt {attempt} of task {task_id} \
                             in {name}, and they cannot be inferred exactly: {why}"
                        ))
                    },
                )?
            }
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
            inferred: inferred.is_some(),
        })
    }

    /// Where an attempt Ray reported no `taskLogInfo` for wrote: its worker's file (found by
    /// the worker id in its name, among the files its node shipped), from where the last
    /// attempt before it on the worker with reported offsets ended to where the next one
    /// started, with every attempt that ran on the worker in between (this one among them) for
    /// [`own_output`] to tell their output apart. `None` without a worker or its file.
    async fn inferred_place(
        &self,
        relation: &Relation,
        row: &JsonRow,
        stream: Stream,
    ) -> Result<Option<Inferred>, QueryError> {
        let text = |column: &str| row.get(column).and_then(Json::as_str).map(str::to_owned);
        let (Some(cluster), Some(session), Some(node_id), Some(worker_id), Some(task_id)) = (
            text("cluster"),
            text("session_name"),
            text("node_id"),
            text("worker_id"),
            text("task_id"),
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
        let Some(file) = files
            .into_iter()
            .map(|file| file.name.as_str().to_owned())
            .find(|name| name.starts_with(&prefix) && name.ends_with(suffix))
        else {
            return Ok(None);
        };
        let ran_at = row.get("ran_at").and_then(Json::as_i64).unwrap_or(i64::MAX);
        let attempt = row
            .get("attempt_number")
            .and_then(Json::as_i64)
            .unwrap_or(0);
        let [_, start_column, end_column] = stream.columns();
        // The worker's attempts with what the range needs of each: when it ran, its offsets.
        let on_worker = |sql: &mut Sql| {
            sql.push("(SELECT task_id, attempt_number, name, ")
                .push(RAN_AT)
                .push(" AS ran_at, ts_submitted_to_worker IS NOT NULL AS submitted, ")
                .push(start_column)
                .push(" AS start, ")
                .push(end_column)
                .push(" AS stop FROM ")
                .relation(relation)
                .push(" WHERE cluster = ")
                .bind(cluster.clone())
                .push(" AND session_name = ")
                .bind(session.clone())
                .push(" AND worker_id = ")
                .bind(worker_id.clone())
                .push(")");
        };
        let mut bounds = Sql::default();
        bounds
            .push("SELECT max(ran_at) FILTER (WHERE start IS NOT NULL AND ran_at < ")
            .bind(ran_at)
            .push(") AS earlier, min(ran_at) FILTER (WHERE start IS NOT NULL AND ran_at > ")
            .bind(ran_at)
            .push(") AS later, max(stop) FILTER (WHERE start IS NOT NULL AND ran_at < ")
            .bind(ran_at)
            .push(") AS after_stop, max(start) FILTER (WHERE start IS NOT NULL AND ran_at < ")
            .bind(ran_at)
            .push(") AS after_start, min(start) FILTER (WHERE start IS NOT NULL AND ran_at > ")
            .bind(ran_at)
            .push(") AS before FROM ");
        on_worker(&mut bounds);
        let mut between = Sql::default();
        between.push("SELECT task_id, attempt_number, name, ran_at, submitted FROM ");
        on_worker(&mut between);
        between.push(" WHERE start IS NULL");
        let (bounds, ran) = self
            .run(move |connection| {
                let bounds = query_rows(connection, &bounds.text, &bounds.params)?;
                let number = |column: &str| {
                    bounds
                        .first()
                        .and_then(|row| row.get(column))
                        .and_then(Json::as_i64)
                };
                between
                    .push(" AND ran_at > ")
                    .bind(number("earlier").unwrap_or(i64::MIN))
                    .push(" AND ran_at < ")
                    .bind(number("later").unwrap_or(i64::MAX))
                    .push(" ORDER BY ran_at, task_id, attempt_number LIMIT ")
                    .number(MAX_INFERRED_ATTEMPTS);
                let ran = query_rows(connection, &between.text, &between.params)?;
                Ok((bounds, ran))
            })
            .await?;
        let bound = |column: &str| {
            bounds
                .first()
                .and_then(|row| row.get(column))
                .and_then(Json::as_u64)
        };
        let Some(asked) = ran.iter().position(|other| {
            other.get("task_id").and_then(Json::as_str) == Some(task_id.as_str())
                && other.get("attempt_number").and_then(Json::as_i64) == Some(attempt)
        }) else {
            // Ray exported none of its times (so it has no place in the worker's order), or
            // it lies past the attempts read.
            return Err(QueryError::NotFound(format!(
                "Ray reported no {} offsets for attempt {attempt} of task {task_id}, and they \
                 cannot be inferred: Ray exported no time to place it among its worker's \
                 attempts, or over {MAX_INFERRED_ATTEMPTS} attempts without offsets ran there",
                start_column.trim_end_matches("_start"),
            )));
        };
        let (after_stop, after_start) = (bound("after_stop"), bound("after_start"));
        let ran_at: Vec<Option<i64>> = ran
            .iter()
            .map(|other| other.get("ran_at").and_then(Json::as_i64))
            .collect();
        let ordered = ran
            .iter()
            .all(|other| other.get("submitted").and_then(Json::as_bool) == Some(true))
            && ran_at.windows(2).all(|pair| pair[0] < pair[1]);
        Ok(Some(Inferred {
            file,
            start: after_stop.max(after_start).unwrap_or(0),
            end: bound("before"),
            clean_start: after_start.is_none_or(|start| after_stop >= Some(start)),
            ordered,
            ran: ran
                .iter()
                .map(|other| other.get("name").and_then(Json::as_str).map(str::to_owned))
                .collect(),
            asked,
        }))
    }
}

/// When an attempt ran on its worker (ns), to order a worker's attempts: Ray pushes a worker
/// one task at a time, so the times it submitted them to the worker order them; the time one
/// ran, or else its creation, stands in where that was not exported.
const RAN_AT: &str = "coalesce(ts_submitted_to_worker, ts_running, creation_time_ms * 1000000)";

/// The most attempts without offsets an inferred range is cut among.
const MAX_INFERRED_ATTEMPTS: usize = 10_000;

/// The place of an attempt's output that Ray did not report (see
/// [`QueryEngine::inferred_place`]).
struct Inferred {
    /// The worker's file.
    file: String,
    /// Where the last attempt before it with offsets ended (or started, when its end is not
    /// known; 0 without one).
    start: u64,
    /// Where the next attempt with offsets started (the file's end without one).
    end: Option<u64>,
    /// The names of the attempts that ran in the range, in the order they ran.
    ran: Vec<Option<String>>,
    /// This attempt's place among them.
    asked: usize,
    /// The range starts where the attempt before it is known to end (see [`Known`]).
    clean_start: bool,
    /// The order of `ran` is the order they ran (see [`Known`]).
    ordered: bool,
}

impl QueryEngine {
    /// The files shipped from `node_id` in `session`, by name.
    pub async fn log_files(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        node_id: &NodeId,
    ) -> Result<Vec<ShippedFile>, QueryError> {
        let node = NodeLogs {
            cluster: cluster.clone(),
            session: session.clone(),
            node_id: node_id.clone(),
        };
        list_files(&**self.storage(), &node)
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
        let budget = self.settings.response_bytes;
        // One byte past the response's size tells a tail that does not fit from one that does.
        let tail = read_tail(
            &**self.storage(),
            file,
            lines.unwrap_or(usize::MAX),
            budget.saturating_add(1),
        )
        .await
        .map_err(log_error)?;
        if tail.bytes.is_empty() && !tail.complete {
            return Err(QueryError::NotFound(format!(
                "no log {} was shipped from node {} in {}",
                file.file, file.node_id, file.session
            )));
        }
        // The end is what a tail is for: past the response limit, its start goes.
        if tail.bytes.len() > budget {
            let cut = tail.bytes.len() - budget;
            return Ok(LogRange {
                bytes: tail.bytes.get(cut..).unwrap_or_default().to_vec(),
                complete: false,
            });
        }
        Ok(tail)
    }

    /// `GET /api/logs?cluster=…&session=…&node_id=…`: `{"files": [{"file", "bytes"}]}`.
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
                .map(|file| serde_json::json!({"file": file.name.as_str(), "bytes": file.bytes}))
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
