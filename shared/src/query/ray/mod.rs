//! Ray's own routes over the history (see docs/architecture.md, "Ray's own tools"): what the
//! Ray 2.60 dashboard frontend and the state CLI (`ray list`, `ray summary`, `ray get`,
//! `ray job list`) request, answered from the same tables and read code as `/api/`, in Ray's
//! envelopes and field names.
//!
//! The URL names the history: `/ray/{cluster}/{session|latest}/…` ([`route`]). Each data route
//! answers a valid body, empty when the export does not carry its data (Serve, datasets, and
//! metrics unless a Grafana is configured: `grafana`), because Ray's dashboard proxy falls back to its own (empty) cluster on a 404;
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
//! placement groups), `logs`, `fixed` (answers that need no table) and `grafana` (Ray's metrics
//! pages framing the configured Grafana over the session). The routes share
//! [`request`] (Ray's query string), [`summary`] (Ray's task summaries), `body` (the answer and
//! its envelopes) and the dashboard API's read code ([`crate::query::read`]), never each other.

mod body;
mod cluster_metadata;
mod entities;
mod events;
mod fixed;
mod grafana;
mod logs;
mod missing_page;
pub mod request;
pub mod route;
pub mod summary;
mod tasks;

pub use self::body::RayBody;
use self::body::{ResponseLimit, list_envelope};
use self::fixed::{answered_as_failure, fixed_answer};
use self::missing_page::missing_page;
use self::route::{FixedRoute, StateResource};
pub use self::route::{RayPathError, RayRequest, RayRoute, RayTarget, SessionChoice};
use crate::query::read::params::{Created, Scope};
use crate::query::{QueryEngine, QueryError};
use crate::tables::catalog::{self, PARALLEL_DOCUMENTS};

/// The Ray release whose routes and shapes are served.
pub const RAY_VERSION: &str = "2.60.0";

/// The value of the query-string parameter `key` (the first, when it repeats).
fn value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(name, _)| name == key)
        .map(|(_, value)| value.as_str())
}

/// The file name Ray's dashboard saves a download as, as Ray 2.60 names it: a log file always
/// (`download_filename`, by default `file.txt`), a timeline when asked with `download=1`
/// (`timeline-{job_id}-{time}.json`, the time in UTC where Ray uses its head node's clock).
fn download_name(
    route: &RayRoute,
    pairs: &[(String, String)],
    now: chrono::DateTime<chrono::Utc>,
) -> Option<String> {
    let param = |key: &str| value(pairs, key);
    match route {
        RayRoute::LogFile => Some(param("download_filename").unwrap_or("file.txt").to_owned()),
        RayRoute::Timeline if param("download") == Some("1") => Some(format!(
            "timeline-{}-{}.json",
            param("job_id").unwrap_or("None"),
            now.format("%Y-%m-%d_%H-%M-%S")
        )),
        _ => None,
    }
}

/// Most names a 404 lists of the clusters or sessions that are stored, newest first.
const NAMED_IN_NOT_FOUND: usize = 20;

/// Most cluster documents a 404 for a cluster reads to find clusters with sessions to name: a
/// mistyped URL must not cost a read of every cluster's document.
const READ_FOR_NOT_FOUND: usize = 64;

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
        let body = self.answer_ray_body(request, pairs, limit).await?;
        let Some(name) = download_name(&request.route, pairs, chrono::Utc::now()) else {
            return Ok(body);
        };
        Ok(body.attached_as(&name))
    }

    /// [`Self::answer_ray_within`]'s body, before it is named as a download.
    async fn answer_ray_body(
        &self,
        request: &RayRequest,
        pairs: &[(String, String)],
        limit: ResponseLimit,
    ) -> Result<RayBody, QueryError> {
        if request.route == RayRoute::Page {
            return match self.resolve(&request.target).await {
                Ok(_) => Err(QueryError::NotFound(
                    "Ray's dashboard serves its own page".into(),
                )),
                Err(QueryError::NotFound(message)) => Ok(RayBody::html(missing_page(&message))),
                Err(err) => Err(err),
            };
        }
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
            RayRoute::Jobs => entities::jobs::jobs(self, &scope).await,
            RayRoute::Job(id) => entities::jobs::job(self, &scope, id).await,
            RayRoute::JobLogs(id) => entities::jobs::job_logs(self, &scope, id).await,
            RayRoute::LogicalActors => entities::logical_actors(self, &scope, pairs).await,
            RayRoute::LogicalActor(id) => entities::logical_actor(self, &scope, id).await,
            RayRoute::Nodes => entities::nodes(self, &scope).await,
            RayRoute::Node(id) => entities::node(self, &scope, id).await,
            RayRoute::ClusterStatus => entities::cluster_status(self, &scope, &session).await,
            RayRoute::Events => events::events(self, &scope, pairs).await,
            RayRoute::ReadOnly => Err(QueryError::BadRequest(
                "This is a history kept by Afterglow: jobs cannot be submitted, stopped or \
                 deleted here."
                    .into(),
            )),
            // Answered before the session is resolved, above.
            RayRoute::Page => Err(QueryError::Internal("the page is answered apart".into())),
            RayRoute::Grafana(path) => {
                let Some(grafana) = self.grafana_url() else {
                    return Err(QueryError::NotFound(
                        "no Grafana is configured (AFTERGLOW_GRAFANA_URL)".into(),
                    ));
                };
                let sessions = catalog::load_cluster(&**self.storage(), &request.target.cluster)
                    .await?
                    .sessions;
                let page = grafana::frame(grafana, path, pairs, &session, sessions.get(&session));
                return Ok(RayBody::html(page));
            }
            RayRoute::Fixed(FixedRoute::ClusterMetadata) => {
                cluster_metadata::answer(self, &scope, &session).await
            }
            RayRoute::Fixed(fixed) => {
                let grafana = self.grafana_url();
                let body = RayBody::from_json(&fixed_answer(*fixed, &session, grafana))?;
                return Ok(if answered_as_failure(*fixed, grafana) {
                    body.into_failure()
                } else {
                    body
                });
            }
        };
        RayBody::from_json(&answer?)
    }

    /// The scope of one session: the named one, or the one that started last, from the
    /// cluster's catalog document alone. A cluster or session that is not stored is a 404
    /// naming some that are.
    async fn resolve(&self, target: &RayTarget) -> Result<(Scope, String), QueryError> {
        let cluster = target.cluster.to_string();
        let sessions = catalog::load_cluster(&**self.storage(), &target.cluster)
            .await?
            .sessions;
        if sessions.is_empty() {
            return Err(QueryError::NotFound(format!(
                "no cluster `{cluster}` in this Afterglow (clusters: {})",
                self.other_clusters(&cluster).await?
            )));
        }
        let newest_first = catalog::newest_first(&sessions);
        let session = match &target.session {
            SessionChoice::Named(name) if sessions.contains_key(name) => name.clone(),
            SessionChoice::Named(name) => {
                return Err(QueryError::NotFound(format!(
                    "cluster `{cluster}` has no session `{name}` (sessions: {})",
                    some_names(
                        newest_first.iter().map(|(stored, _)| stored.as_str()),
                        newest_first.len()
                    )
                )));
            }
            SessionChoice::Latest => newest_first
                .first()
                .map(|(latest, _)| (*latest).clone())
                .ok_or_else(|| {
                    QueryError::NotFound(format!("cluster `{cluster}` has no sessions yet"))
                })?,
        };
        Ok((
            Scope {
                cluster: Some(target.cluster.clone()),
                session: Some(session.clone()),
                created: Created::default(),
            },
            session,
        ))
    }

    /// For a 404's message, the clusters other than `asked` that have sessions, newest first:
    /// the first [`NAMED_IN_NOT_FOUND`] found among the newest [`READ_FOR_NOT_FOUND`] clusters,
    /// then how many more there are, or may be among those not read. A cluster whose sessions
    /// all expired is listed still, and is left out like one never recorded.
    async fn other_clusters(&self, asked: &str) -> Result<String, QueryError> {
        let listing = catalog::listing(&**self.storage()).await?;
        let others: Vec<String> = listing
            .newest_first()
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| name != asked)
            .collect();
        let mut named: Vec<String> = Vec::new();
        let mut read = 0;
        for batch in others.chunks(PARALLEL_DOCUMENTS) {
            if named.len() >= NAMED_IN_NOT_FOUND || read >= READ_FOR_NOT_FOUND {
                break;
            }
            let documents = listing.documents(self.storage(), batch).await?;
            read += batch.len();
            named.extend(
                batch
                    .iter()
                    .zip(&documents)
                    .filter(|(_, document)| !document.sessions.is_empty())
                    .map(|(name, _)| name.clone()),
            );
        }
        let unread = others.len().saturating_sub(read);
        if unread == 0 {
            return Ok(some_names(named.iter().map(String::as_str), named.len()));
        }
        let shown: Vec<&str> = named
            .iter()
            .take(NAMED_IN_NOT_FOUND)
            .map(String::as_str)
            .collect();
        let more = named.len().saturating_sub(shown.len()) + unread;
        if shown.is_empty() {
            return Ok(format!("none among the newest {read}, up to {more} more"));
        }
        Ok(format!("{}, and up to {more} more", shown.join(", ")))
    }
}

/// `names` (of `count`) for a 404's message: the first [`NAMED_IN_NOT_FOUND`], then how many
/// more there are.
fn some_names<'a>(names: impl Iterator<Item = &'a str>, count: usize) -> String {
    if count == 0 {
        return "none yet".to_owned();
    }
    let named: Vec<&str> = names.take(NAMED_IN_NOT_FOUND).collect();
    match count.saturating_sub(named.len()) {
        0 => named.join(", "),
        more => format!("{}, and {more} more", named.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(query: &[(&str, &str)]) -> Vec<(String, String)> {
        query
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn a_download_names_what_it_was_asked_to_and_nothing_breaks_the_header() {
        let now = chrono::DateTime::from_timestamp(1_764_650_000, 0).unwrap_or_default();
        let log = |query: &[(&str, &str)]| {
            let name = download_name(&RayRoute::LogFile, &pairs(query), now)?;
            RayBody::text(Vec::new())
                .attached_as(&name)
                .content_disposition()
        };
        assert_eq!(
            log(&[]).as_deref(),
            Some("attachment; filename=\"file.txt\"")
        );
        assert_eq!(
            log(&[("download_filename", "a\"b\\c\r\nSet-Cookie: x.log")]).as_deref(),
            Some("attachment; filename=\"a_b_c__Set-Cookie: x.log\"")
        );
        assert_eq!(
            download_name(&RayRoute::Timeline, &pairs(&[("job_id", "01000000")]), now),
            None
        );
        assert_eq!(
            download_name(
                &RayRoute::Timeline,
                &pairs(&[("job_id", "01000000"), ("download", "1")]),
                now
            )
            .as_deref(),
            Some("timeline-01000000-2025-12-02_04-33-20.json")
        );
    }
}
