//! Ray's own routes over the history (see docs/architecture.md, "Ray's own tools"): what the
//! Ray 2.60 dashboard frontend and the state CLI (`ray list`, `ray summary`, `ray get`,
//! `ray job list`) request, answered from the same tables and read code as `/api/`, in Ray's
//! envelopes and field names.
//!
//! The URL names the history: `/ray/{cluster}/{session|latest}/…` ([`route`]). Each data route
//! answers a valid body, empty when the export does not carry its data (metrics, Serve,
//! datasets), because Ray's dashboard proxy falls back to its own (empty) cluster on a 404;
//! only paths that are not data routes — the UI's own files — are left to 404. Log routes read
//! what `afterglow ship-logs` sent.
//!
//! Ray caps every list at 10 000 rows; Afterglow has no cap of its own, only the response's
//! size ([`QuerySettings::response_bytes`](crate::query::QuerySettings)), and says so in
//! `warnings` when a list is cut. For a client that takes gzip
//! ([`QueryEngine::answer_ray_gzipped`]) that size counts compressed bytes: rows are
//! compressed as they are taken, and the list stops where the compressed answer would pass
//! it. On Lambda (6 MB answers) the stock dashboard's job page of 10 000 attempts with every
//! detail field fits only gzipped.
//!
//! # Layout
//!
//! This module resolves the history a URL names and dispatches to a route's module: `tasks`
//! (the task list, its summaries and timeline), `entities` (jobs, actors, nodes, workers,
//! placement groups), `logs`, and `fixed` (answers that need no table). The routes share
//! [`request`] (Ray's query string), [`summary`] (Ray's task summaries), `body` (the answer and
//! its envelopes) and the dashboard API's read code ([`crate::query::read`]), never each other.

mod body;
mod entities;
mod fixed;
mod logs;
pub mod request;
pub mod route;
pub mod summary;
mod tasks;

pub use self::body::RayBody;
use self::body::{ResponseLimit, list_envelope};
use self::fixed::{events, fixed_answer};
use self::route::StateResource;
pub use self::route::{RayPathError, RayRequest, RayRoute, RayTarget, SessionChoice};
use crate::query::read::params::Scope;
use crate::query::read::snapshot::session_stats;
use crate::query::{QueryEngine, QueryError};

/// The Ray release whose routes and shapes are served.
pub const RAY_VERSION: &str = "2.60.0";

impl QueryEngine {
    /// Answers a Ray route with the query-string `pairs` (repeated keys allowed, as Ray's
    /// filters repeat them).
    #[tracing::instrument(name = "ray_query", skip(self, pairs), fields(route = ?request.route))]
    pub async fn answer_ray(
        &self,
        request: &RayRequest,
        pairs: &[(String, String)],
    ) -> Result<RayBody, QueryError> {
        let limit = ResponseLimit {
            bytes: self.settings.response_bytes,
            gzipped: false,
        };
        self.answer_ray_within(request, pairs, limit).await
    }

    /// [`Self::answer_ray`] for a client that takes gzip, compressed. A list is cut where its
    /// compressed answer (rather than its JSON) would pass the response size, so it holds about
    /// as many times more rows as its rows compress; it is compressed as it is built, once.
    #[tracing::instrument(name = "ray_query", skip(self, pairs), fields(route = ?request.route, gzip = true))]
    pub async fn answer_ray_gzipped(
        &self,
        request: &RayRequest,
        pairs: &[(String, String)],
    ) -> Result<RayBody, QueryError> {
        let limit = ResponseLimit {
            bytes: self.settings.response_bytes,
            gzipped: true,
        };
        self.answer_ray_within(request, pairs, limit)
            .await?
            .gzipped()
    }

    /// [`Self::answer_ray`] with lists cut to `limit` (a list's answer is gzipped already
    /// when the limit counts gzipped bytes; other answers are not).
    async fn answer_ray_within(
        &self,
        request: &RayRequest,
        pairs: &[(String, String)],
        limit: ResponseLimit,
    ) -> Result<RayBody, QueryError> {
        let (scope, session) = self.resolve(&request.target).await?;
        let answer = match &request.route {
            RayRoute::List(StateResource::Tasks) => {
                return tasks::list(self, &scope, pairs, limit).await;
            }
            RayRoute::List(StateResource::Entity(kind)) => {
                return entities::list(self, &scope, *kind, pairs, limit).await;
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
}
