//! Ray's own routes over the history (DESIGN §4b): what the Ray 2.60 dashboard frontend and
//! the state CLI (`ray list`, `ray summary`, `ray get`, `ray job list`) request, answered from
//! the same tables and snapshot code as `/api/`, in Ray's envelopes and field names.
//!
//! The URL names the history: `/ray/{cluster}/{session|latest}/…` ([`route`]). Each data route
//! answers a valid body, empty when the export does not carry its data (metrics, Serve,
//! datasets), because Ray's dashboard proxy falls back to its own (empty) cluster on a 404;
//! only paths that are not data routes — the UI's own files — are left to 404. Log routes read
//! what `afterglow ship-logs` sent.
//!
//! Ray caps every list at 10 000 rows; Afterglow has no cap of its own, only the response's
//! size ([`QuerySettings::response_bytes`](super::QuerySettings)), and says so in `warnings`
//! when a list is cut. A client that takes gzip ([`QueryEngine::answer_ray_gzipped`]) gets
//! lists [`GZIPPED_ROWS`] times that size, compressed, whenever they then fit: on Lambda
//! (6 MB answers) the stock dashboard's job page of 10 000 attempts with every detail field,
//! 15.6 MB of JSON, is 2.3 MB gzipped.

mod entities;
mod logs;
pub mod request;
pub mod route;
pub mod summary;
mod tasks;

use serde_json::{Value as Json, json};

use self::route::{FixedRoute, StateResource};
pub use self::route::{RayPathError, RayRequest, RayRoute, RayTarget, SessionChoice};
use super::params::Scope;
use super::snapshot::session_stats;
use super::{QueryEngine, QueryError};

/// The Ray release whose routes and shapes are served.
pub const RAY_VERSION: &str = "2.60.0";

/// How many times the response size a gzipped answer's lists may hold before compression:
/// Ray's task rows compress 6.8 times at gzip's fastest level, and an answer that still does
/// not fit is answered again within the plain size (see [`QueryEngine::answer_ray_gzipped`]).
pub const GZIPPED_ROWS: usize = 6;

impl QueryEngine {
    /// Answers a Ray route with the query-string `pairs` (repeated keys allowed, as Ray's
    /// filters repeat them).
    #[tracing::instrument(name = "ray_query", skip(self, pairs), fields(route = ?request.route))]
    pub async fn answer_ray(
        &self,
        request: &RayRequest,
        pairs: &[(String, String)],
    ) -> Result<RayBody, QueryError> {
        self.answer_ray_within(request, pairs, self.settings.response_bytes)
            .await
    }

    /// [`Self::answer_ray`] for a client that takes gzip: compressed, with lists of up to
    /// [`GZIPPED_ROWS`] times the response size when the compressed answer then fits in it;
    /// otherwise the plain answer, compressed.
    #[tracing::instrument(name = "ray_query", skip(self, pairs), fields(route = ?request.route, gzip = true))]
    pub async fn answer_ray_gzipped(
        &self,
        request: &RayRequest,
        pairs: &[(String, String)],
    ) -> Result<RayBody, QueryError> {
        let limit = self.settings.response_bytes;
        let larger = self
            .answer_ray_within(request, pairs, limit.saturating_mul(GZIPPED_ROWS))
            .await?
            .gzipped()?;
        if larger.bytes.len() <= limit {
            return Ok(larger);
        }
        tracing::info!(
            gzipped = larger.bytes.len(),
            limit,
            "a gzipped Ray answer does not fit; answering within the plain size"
        );
        self.answer_ray_within(request, pairs, limit)
            .await?
            .gzipped()
    }

    /// [`Self::answer_ray`] with lists of at most `response_bytes` of rows.
    async fn answer_ray_within(
        &self,
        request: &RayRequest,
        pairs: &[(String, String)],
        response_bytes: usize,
    ) -> Result<RayBody, QueryError> {
        let (scope, session) = self.resolve(&request.target).await?;
        let answer = match &request.route {
            RayRoute::List(StateResource::Tasks) => {
                tasks::list(self, &scope, pairs, response_bytes).await
            }
            RayRoute::List(StateResource::Entity(kind)) => {
                entities::list(self, &scope, *kind, pairs, response_bytes).await
            }
            RayRoute::List(StateResource::Unexported) => {
                Ok(list_envelope(0, 0, Vec::new(), Vec::new()))
            }
            RayRoute::SummarizeTasks => return tasks::summarize(self, &scope, pairs).await,
            RayRoute::LogIndex => logs::index(self, &scope, pairs).await,
            RayRoute::LogFile => return logs::file(self, &scope, pairs).await,
            RayRoute::SummarizeActors => entities::summarize_actors(self, &scope).await,
            RayRoute::Timeline => tasks::timeline(self, &scope, pairs).await,
            RayRoute::Jobs => entities::jobs(self, &scope).await,
            RayRoute::Job(id) => entities::job(self, &scope, id).await,
            RayRoute::LogicalActors => entities::logical_actors(self, &scope, pairs).await,
            RayRoute::LogicalActor(id) => entities::logical_actor(self, &scope, id).await,
            RayRoute::Nodes => entities::nodes(self, &scope).await,
            RayRoute::Node(id) => entities::node(self, &scope, id).await,
            RayRoute::ClusterStatus => entities::cluster_status(self, &scope, &session).await,
            RayRoute::Events => Ok(events(pairs)),
            RayRoute::ReadOnly => Err(QueryError::BadRequest(
                "This is a history kept by Afterglow: jobs cannot be submitted, stopped or \
                 deleted here."
                    .into(),
            )),
            RayRoute::Fixed(fixed) => Ok(fixed_answer(*fixed, &session)),
        };
        RayBody::from_json(&answer?)
    }

    /// The scope of one session: the named one, or the one that started last. A cluster or
    /// session that is not stored is a 404 naming what is.
    async fn resolve(&self, target: &RayTarget) -> Result<(Scope, String), QueryError> {
        let cluster = target.cluster.to_string();
        let mut clusters = session_stats(
            &**self.storage(),
            &Scope {
                cluster: Some(target.cluster.clone()),
                session: None,
            },
        )
        .await?;
        let Some(sessions) = clusters.remove(&cluster) else {
            let known = session_stats(&**self.storage(), &Scope::default()).await?;
            let names: Vec<&str> = known.keys().map(String::as_str).collect();
            return Err(QueryError::NotFound(format!(
                "no cluster `{cluster}` in this Afterglow (clusters: {})",
                if names.is_empty() {
                    "none yet".to_owned()
                } else {
                    names.join(", ")
                }
            )));
        };
        let session = match &target.session {
            SessionChoice::Named(name) if sessions.contains_key(name) => name.clone(),
            SessionChoice::Named(name) => {
                return Err(QueryError::NotFound(format!(
                    "cluster `{cluster}` has no session `{name}` (sessions: {})",
                    sessions.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
            SessionChoice::Latest => sessions
                .iter()
                .max_by(|a, b| (a.1.first_ms, a.0).cmp(&(b.1.first_ms, b.0)))
                .map(|(name, _)| name.clone())
                .ok_or_else(|| {
                    QueryError::NotFound(format!("cluster `{cluster}` has no sessions yet"))
                })?,
        };
        Ok((
            Scope {
                cluster: Some(target.cluster.clone()),
                session: Some(session.clone()),
            },
            session,
        ))
    }

    /// Keeps the leading `rows` that fit in `budget` bytes, with a warning when some did not.
    fn within_response(
        &self,
        mut rows: Vec<Json>,
        what: &str,
        budget: usize,
    ) -> (Vec<Json>, Vec<String>) {
        let mut bytes = 0;
        let mut keep = 0;
        for row in &rows {
            bytes += serde_json::to_vec(row).map_or(0, |text| text.len()) + 2;
            if keep > 0 && bytes > budget {
                break;
            }
            keep += 1;
        }
        if keep == rows.len() {
            return (rows, Vec::new());
        }
        let total = rows.len();
        rows.truncate(keep);
        tracing::info!(rows = keep, budget, "Ray list cut short by its size");
        let warning = format!(
            "Afterglow returned the first {keep} of {total} {what}: more would exceed this \
             deployment's response size limit of {budget} bytes (of JSON). Narrow the list with filters \
             (--filter) or a lower limit."
        );
        (rows, vec![warning])
    }
}

/// A Ray route's answer: the bytes to send, their media type and whether they are gzipped.
///
/// JSON is kept as text rather than a `serde_json::Value` because a lineage summary is as deep
/// as the task tree, and a `Value` that deep cannot be serialized or even dropped without
/// overflowing the stack ([`summary`] writes it as text). Log routes answer plain text.
#[derive(Clone, Debug)]
pub struct RayBody {
    bytes: Vec<u8>,
    content_type: &'static str,
    gzipped: bool,
}

impl RayBody {
    /// The media type (`application/json`, or `text/plain` for log files).
    pub fn content_type(&self) -> &'static str {
        self.content_type
    }

    /// `gzip` when the body is gzipped ([`QueryEngine::answer_ray_gzipped`]), to be sent as
    /// its `Content-Encoding`.
    pub fn content_encoding(&self) -> Option<&'static str> {
        self.gzipped.then_some("gzip")
    }

    /// The body.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The body, owned.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    fn from_json(value: &Json) -> Result<Self, QueryError> {
        serde_json::to_vec(value)
            .map(|bytes| Self {
                bytes,
                content_type: "application/json",
                gzipped: false,
            })
            .map_err(|err| QueryError::Internal(format!("writing a Ray answer: {err}")))
    }

    fn text(bytes: Vec<u8>) -> Self {
        Self {
            bytes,
            content_type: "text/plain; charset=utf-8",
            gzipped: false,
        }
    }

    /// The same body gzipped (once: a gzipped body is returned as it is).
    fn gzipped(self) -> Result<Self, QueryError> {
        if self.gzipped {
            return Ok(self);
        }
        let bytes = crate::gzip::gzip(&self.bytes)
            .map_err(|err| QueryError::Internal(format!("compressing a Ray answer: {err}")))?;
        Ok(Self {
            bytes,
            gzipped: true,
            ..self
        })
    }

    /// `envelope` with the JSON text `inner` in place of the string [`SPLICE_HERE`] (which
    /// must occur once), so that one function still defines each envelope.
    fn spliced(envelope: &Json, inner: &str) -> Result<Self, QueryError> {
        let outer = serde_json::to_string(envelope)
            .map_err(|err| QueryError::Internal(format!("writing a Ray answer: {err}")))?;
        let marker = Json::from(SPLICE_HERE).to_string();
        let Some((before, after)) = outer.split_once(&marker) else {
            return Err(QueryError::Internal("a Ray envelope lost its place".into()));
        };
        let mut bytes = Vec::with_capacity(outer.len() + inner.len());
        bytes.extend_from_slice(before.as_bytes());
        bytes.extend_from_slice(inner.as_bytes());
        bytes.extend_from_slice(after.as_bytes());
        Ok(Self {
            bytes,
            content_type: "application/json",
            gzipped: false,
        })
    }
}

/// Where [`RayBody::spliced`] puts a value written as text. The NULs keep it out of any
/// envelope's own strings, which are ours.
const SPLICE_HERE: &str = "\u{0}afterglow: spliced here\u{0}";

/// The state API's envelope around a list: Ray's `ListApiResponse`. Nothing is truncated at a
/// source, so `num_after_truncation` is the total.
fn list_envelope(total: u64, filtered: u64, rows: Vec<Json>, warnings: Vec<String>) -> Json {
    state_envelope(total, total, filtered, Json::Array(rows), warnings)
}

/// `{"result": true, "msg": "", "data": {"result": {counts…, "result": …}}}`.
fn state_envelope(
    total: u64,
    after_truncation: u64,
    filtered: u64,
    result: Json,
    warnings: Vec<String>,
) -> Json {
    json!({
        "result": true,
        "msg": "",
        "data": {"result": {
            "total": total,
            "num_after_truncation": after_truncation,
            "num_filtered": filtered,
            "result": result,
            "partial_failure_warning": "",
            "warnings": if warnings.is_empty() { Json::Null } else { json!(warnings) },
        }},
    })
}

/// `GET events`: the export carries no cluster event log, so no events, in the shape the
/// overview and job pages read.
fn events(pairs: &[(String, String)]) -> Json {
    match pairs.iter().find(|(key, _)| key == "job_id") {
        Some((_, job_id)) => json!({"result": true, "msg": "Job events fetched.",
            "data": {"jobId": job_id, "events": []}}),
        None => json!({"result": true, "msg": "All events fetched.", "data": {"events": {}}}),
    }
}

/// Routes answered without the tables: what a history can say about metrics, profiling, Serve
/// and the rest of a cluster that is gone.
fn fixed_answer(route: FixedRoute, session: &str) -> Json {
    let ok = |msg: &str, data: Json| json!({"result": true, "msg": msg, "data": data});
    match route {
        FixedRoute::ClusterMetadata => ok(
            "",
            json!({"rayVersion": RAY_VERSION, "pythonVersion": "", "rayInitCluster": false}),
        ),
        FixedRoute::Timezone => json!({"offset": "+00:00", "value": "UTC"}),
        FixedRoute::Version => json!({"version": "4", "ray_version": RAY_VERSION,
            "ray_commit": "", "session_name": session}),
        FixedRoute::AuthenticationMode => json!({"authentication_mode": "disabled"}),
        FixedRoute::Authenticate => ok("Authentication is not needed for a history.", json!({})),
        FixedRoute::UsageStats => ok(
            "Fetched usage stats enabled",
            json!({"usageStatsEnabled": false, "usageStatsPromptEnabled": false}),
        ),
        FixedRoute::ProfilingEnabled => ok("", json!({"profilingEnabled": false})),
        FixedRoute::RuntimeEnvRedaction => ok("", json!({"redactionEnabled": true})),
        // "Disabled" hides the metrics cards instead of showing an error.
        FixedRoute::GrafanaHealth => ok("Grafana disabled", json!({"grafanaHost": "DISABLED"})),
        FixedRoute::PrometheusHealth => ok("prometheus running", json!({})),
        FixedRoute::ServeApplications => json!({"controller_info": {}, "proxies": {},
            "applications": {}, "target_capacity": null}),
        FixedRoute::Datasets => json!({"datasets": []}),
        FixedRoute::ObjectSummary => state_envelope(
            0,
            0,
            0,
            json!({"node_id_to_summary": {"cluster": {"summary": {}, "total_objects": 0,
                "total_size_mb": 0.0, "callsite_enabled": true, "summary_by": "callsite"}}}),
            Vec::new(),
        ),
    }
}
