//! Request parameters: parsed once, validated strictly, and turned into typed filters.
//!
//! Every value a client sends ends up either as a bound SQL parameter or as one of a fixed set
//! of identifiers chosen here, never as SQL text. Anything unexpected — an unknown parameter, an
//! id that is not hex, a page size over the limit — is a [`QueryError::BadRequest`] that says
//! what was wrong.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

use crate::event::common::{TaskStatus, TaskType};
use crate::keys::ClusterName;
use crate::query::QueryError;
use crate::tables::manifest::SessionStats;
use crate::tables::report_times;

/// Default page size of list routes.
pub const DEFAULT_LIMIT: usize = 100;
/// Largest page size of list routes.
pub const MAX_LIMIT: usize = 1000;
/// Longest accepted free-text value (`q`, names).
const MAX_TEXT: usize = 256;
/// Longest accepted id (task ids are 24 bytes, node and worker ids 28: 56 hex digits).
const MAX_HEX: usize = 64;

/// A request's query-string parameters, each allowed at most once.
#[derive(Debug)]
pub struct Params {
    values: BTreeMap<String, String>,
}

impl Params {
    /// Reads `pairs`, refusing parameters outside `allowed` and repeated ones.
    pub fn parse(pairs: &[(String, String)], allowed: &[&str]) -> Result<Self, QueryError> {
        let mut values = BTreeMap::new();
        for (name, value) in pairs {
            if !allowed.contains(&name.as_str()) {
                return Err(QueryError::BadRequest(format!(
                    "unknown parameter `{name}`; this route takes: {}",
                    allowed.join(", ")
                )));
            }
            if values.insert(name.clone(), value.clone()).is_some() {
                return Err(QueryError::BadRequest(format!(
                    "parameter `{name}` is given twice"
                )));
            }
        }
        Ok(Self { values })
    }

    fn raw(&self, name: &str) -> Option<&str> {
        self.values
            .get(name)
            .map(String::as_str)
            .filter(|value| !value.is_empty())
    }

    /// Free text of at most 256 characters.
    pub fn text(&self, name: &str) -> Result<Option<String>, QueryError> {
        match self.raw(name) {
            None => Ok(None),
            Some(value) if value.chars().count() > MAX_TEXT => Err(QueryError::BadRequest(
                format!("`{name}` is longer than {MAX_TEXT} characters"),
            )),
            Some(value) => Ok(Some(value.to_owned())),
        }
    }

    /// A Ray id: hex digits, returned lowercase (the form the tables store).
    pub fn hex(&self, name: &str) -> Result<Option<String>, QueryError> {
        match self.raw(name) {
            None => Ok(None),
            Some(value) => parse_hex(name, value).map(Some),
        }
    }

    /// A whole number.
    pub fn integer(&self, name: &str) -> Result<Option<i64>, QueryError> {
        self.raw(name)
            .map(|value| {
                value.parse::<i64>().map_err(|_| {
                    QueryError::BadRequest(format!("`{name}` must be an integer, not {value:?}"))
                })
            })
            .transpose()
    }

    /// `true` or `false`.
    pub fn flag(&self, name: &str) -> Result<bool, QueryError> {
        match self.raw(name) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(other) => Err(QueryError::BadRequest(format!(
                "`{name}` must be true or false, not {other:?}"
            ))),
        }
    }

    /// One of `choices`, or `default` when absent.
    pub fn choice<'a>(
        &self,
        name: &str,
        choices: &[&'a str],
        default: &'a str,
    ) -> Result<&'a str, QueryError> {
        match self.raw(name) {
            None => Ok(default),
            Some(value) => choices
                .iter()
                .find(|choice| **choice == value)
                .copied()
                .ok_or_else(|| {
                    QueryError::BadRequest(format!(
                        "`{name}` must be one of {}, not {value:?}",
                        choices.join(", ")
                    ))
                }),
        }
    }

    /// The page size: 1 to [`MAX_LIMIT`], default [`DEFAULT_LIMIT`].
    pub fn limit(&self) -> Result<usize, QueryError> {
        match self.integer("limit")? {
            None => Ok(DEFAULT_LIMIT),
            Some(limit) if (1..=MAX_LIMIT as i64).contains(&limit) => {
                Ok(usize::try_from(limit).unwrap_or(DEFAULT_LIMIT))
            }
            Some(limit) => Err(QueryError::BadRequest(format!(
                "`limit` must be between 1 and {MAX_LIMIT}, not {limit}"
            ))),
        }
    }

    /// The keyset cursor a previous page returned as `next`, checked against `kind`.
    pub fn cursor(&self, kind: &str) -> Result<Option<Cursor>, QueryError> {
        self.raw("cursor")
            .map(|text| Cursor::decode(text, kind))
            .transpose()
    }
}

/// Lowercase hex of `value`, or a 400 naming `name`.
pub fn parse_hex(name: &str, value: &str) -> Result<String, QueryError> {
    if value.is_empty()
        || value.len() > MAX_HEX
        || !value.bytes().all(|byte| byte.is_ascii_hexdigit())
    {
        return Err(QueryError::BadRequest(format!(
            "`{name}` must be a hex id of at most {MAX_HEX} digits, not {value:?}"
        )));
    }
    Ok(value.to_ascii_lowercase())
}

/// Which sessions a request reads: all of them unless narrowed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    /// Only this cluster.
    pub cluster: Option<ClusterName>,
    /// Only sessions of this name.
    pub session: Option<String>,
    /// Only attempts created in this range; a session none of whose attempts was is not read
    /// at all (see [`SessionStats::may_have_created`]).
    pub created: Created,
}

/// Creation times `[since_ms, until_ms)`, either end open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Created {
    /// Created at or after (ms since the epoch).
    pub since_ms: Option<i64>,
    /// Created before (ms since the epoch).
    pub until_ms: Option<i64>,
}

impl Created {
    /// True when neither end is set.
    pub fn is_unbounded(&self) -> bool {
        self.since_ms.is_none() && self.until_ms.is_none()
    }

    /// Reads `since_ms` and `until_ms`.
    fn from_params(params: &Params) -> Result<Self, QueryError> {
        let since_ms = params.integer("since_ms")?;
        let until_ms = params.integer("until_ms")?;
        if let (Some(since), Some(until)) = (since_ms, until_ms)
            && since > until
        {
            return Err(QueryError::BadRequest(format!(
                "`since_ms` ({since}) is after `until_ms` ({until})"
            )));
        }
        Ok(Self { since_ms, until_ms })
    }
}

impl Scope {
    /// Parameters every table route accepts for its scope.
    pub const PARAMS: [&'static str; 2] = ["cluster", "session"];

    /// Reads `cluster` and `session`.
    pub fn from_params(params: &Params) -> Result<Self, QueryError> {
        let cluster = params
            .raw("cluster")
            .map(|name| {
                ClusterName::new(name)
                    .map_err(|err| QueryError::BadRequest(format!("`cluster`: {err}")))
            })
            .transpose()?;
        let session = params.text("session")?;
        Ok(Self {
            cluster,
            session,
            created: Created::default(),
        })
    }

    /// True when `(cluster, session)`, whose statistics are `stats`, may hold attempts in
    /// scope.
    pub fn selects(&self, cluster: &str, session: &str, stats: &SessionStats) -> bool {
        self.includes(cluster, session)
            && stats.may_have_created(self.created.since_ms, self.created.until_ms)
    }

    /// True when `(cluster, session)` is in scope.
    pub fn includes(&self, cluster: &str, session: &str) -> bool {
        self.cluster
            .as_ref()
            .is_none_or(|wanted| wanted.as_str() == cluster)
            && self
                .session
                .as_deref()
                .is_none_or(|wanted| wanted == session)
    }
}

/// Filters on task attempts, shared by the summary, aggregates, table and timeline routes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// Sessions read.
    pub scope: Scope,
    /// `job_id`.
    pub job_id: Option<String>,
    /// `state`: any of these (comma-separated in the request).
    pub states: Vec<String>,
    /// `name`, exactly.
    pub name: Option<String>,
    /// `func_or_class_name`, exactly.
    pub func_or_class_name: Option<String>,
    /// `type`, exactly.
    pub task_type: Option<String>,
    /// `error_type`, exactly.
    pub error_type: Option<String>,
    /// `node_id`.
    pub node_id: Option<String>,
    /// `worker_id`.
    pub worker_id: Option<String>,
    /// `actor_id`.
    pub actor_id: Option<String>,
    /// `parent_task_id`.
    pub parent_task_id: Option<String>,
    /// Case-insensitive text searched in ids, names and error messages with stack traces.
    pub search: Option<String>,
    /// `error_fingerprint`: the error's message with numbers, ids and addresses masked, hashed
    /// ([`super::sql::ERROR_FINGERPRINT`]): one failure cluster of `/api/insights`.
    pub error_fingerprint: Option<String>,
    /// `min_attempt`: attempt numbers from this one (1: retries only).
    pub min_attempt: Option<i64>,
    /// `min_duration_ms`: attempts that ran at least this long.
    pub min_duration_ms: Option<i64>,
    /// `min_wait_ms`: attempts that waited at least this long from submission to running.
    pub min_wait_ms: Option<i64>,
    /// `latest_attempt`: only each task's latest attempt (a task's outcome, not its history).
    pub latest_attempt: bool,
    /// Also driver tasks, which Ray's own lists hide by default.
    pub include_drivers: bool,
    /// Also attempts whose definition event was never exported (an actor's restarted creation
    /// task, events the agent dropped). Ray's own lists omit them.
    pub include_incomplete: bool,
}

impl TaskFilter {
    /// Every attempt in `scope`, drivers and attempts without a definition too.
    pub fn everything_in(scope: Scope) -> Self {
        Self {
            scope,
            include_drivers: true,
            include_incomplete: true,
            ..Self::default()
        }
    }

    /// Whether [`Self::passes_stored`] decides this filter (on every row), rather than SQL.
    pub fn decided_in_rust(&self) -> bool {
        self.passes_stored(&serde_json::Map::new()).is_some()
    }

    /// Whether a stored `task_attempts` row (as JSON) passes this filter, for a filter of a
    /// scope and which kinds of attempts only (drivers, attempts without a definition), as
    /// [`super::sql::task_conditions`] decides it in SQL; `None` for a filter on anything
    /// else.
    pub fn passes_stored(&self, row: &serde_json::Map<String, serde_json::Value>) -> Option<bool> {
        let kinds = Self {
            scope: Scope {
                created: Created::default(),
                ..self.scope.clone()
            },
            include_drivers: self.include_drivers,
            include_incomplete: self.include_incomplete,
            ..Self::default()
        };
        if *self != kinds {
            return None;
        }
        let text = |column: &str| row.get(column).and_then(serde_json::Value::as_str);
        Some(
            self.scope.includes(
                text("cluster").unwrap_or_default(),
                text("session_name").unwrap_or_default(),
            ) && (self.include_drivers || text("type") != Some("DRIVER_TASK"))
                && (self.include_incomplete || text(report_times::DEFINED_COLUMN).is_some()),
        )
    }
}

impl TaskFilter {
    /// The parameters [`TaskFilter::from_params`] reads.
    pub const PARAMS: [&'static str; 22] = [
        "cluster",
        "session",
        "job_id",
        "state",
        "name",
        "func_or_class_name",
        "type",
        "error_type",
        "node_id",
        "worker_id",
        "actor_id",
        "parent_task_id",
        "since_ms",
        "until_ms",
        "q",
        "include_drivers",
        "include_incomplete",
        "error_fingerprint",
        "min_attempt",
        "min_duration_ms",
        "min_wait_ms",
        "latest_attempt",
    ];

    /// Reads the filter parameters.
    pub fn from_params(params: &Params) -> Result<Self, QueryError> {
        let states = match params.text("state")? {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|state| {
                    let state = state.trim();
                    match TaskStatus::from_name(state) {
                        TaskStatus::Unknown(_) => Err(QueryError::BadRequest(format!(
                            "`state` {state:?} is not a Ray task state (FINISHED, FAILED, RUNNING, …)"
                        ))),
                        known => Ok(known.as_str().to_owned()),
                    }
                })
                .collect::<Result<_, _>>()?,
        };
        let task_type = params
            .text("type")?
            .map(|name| match TaskType::from_name(&name) {
                TaskType::Unknown(_) => Err(QueryError::BadRequest(format!(
                    "`type` {name:?} is not a Ray task type (NORMAL_TASK, ACTOR_TASK, …)"
                ))),
                known => Ok(known.as_str().to_owned()),
            })
            .transpose()?;
        Ok(Self {
            scope: Scope {
                created: Created::from_params(params)?,
                ..Scope::from_params(params)?
            },
            job_id: params.hex("job_id")?,
            states,
            name: params.text("name")?,
            func_or_class_name: params.text("func_or_class_name")?,
            task_type,
            error_type: params.text("error_type")?,
            node_id: params.hex("node_id")?,
            worker_id: params.hex("worker_id")?,
            actor_id: params.hex("actor_id")?,
            parent_task_id: params.hex("parent_task_id")?,
            search: params.text("q")?,
            include_drivers: params.flag("include_drivers")?,
            include_incomplete: params.flag("include_incomplete")?,
            error_fingerprint: params.hex("error_fingerprint")?,
            min_attempt: params.integer("min_attempt")?,
            min_duration_ms: params.integer("min_duration_ms")?,
            min_wait_ms: params.integer("min_wait_ms")?,
            latest_attempt: params.flag("latest_attempt")?,
        })
    }
}

/// A keyset position: the sort values of the last row of a page, plus what they sort by, so a
/// cursor from one ordering is never applied to another.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cursor {
    /// What the cursor belongs to (route and ordering).
    pub kind: String,
    /// The last row's sort key.
    pub after: Vec<serde_json::Value>,
}

impl Cursor {
    /// The opaque text clients send back.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    fn decode(text: &str, kind: &str) -> Result<Self, QueryError> {
        let invalid =
            || QueryError::BadRequest("`cursor` is not a cursor this route returned".into());
        let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| invalid())?;
        let cursor: Self = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
        if cursor.kind != kind {
            return Err(QueryError::BadRequest(format!(
                "`cursor` belongs to another ordering ({}), not {kind}",
                cursor.kind
            )));
        }
        Ok(cursor)
    }
}
