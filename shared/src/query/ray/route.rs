//! Which Ray route a request under `/ray/` names: the cluster and session in the URL, then the
//! path the Ray 2.60 dashboard frontend or state CLI would send to its own dashboard.
//!
//! Paths that are not data routes (the UI's own files, `/`) are `None`: the HTTP layer answers
//! 404 so that Ray's dashboard proxy falls back to serving its own UI.

use crate::keys::ClusterName;
use crate::tables::entities::EntityKind;

/// Which session of a cluster the URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionChoice {
    /// `latest`, or no session segment: the session that started last.
    Latest,
    /// A Ray session name (`session_2026-11-23_14-37-40_123456_1234`).
    Named(String),
}

/// The cluster and session a Ray route reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RayTarget {
    /// The cluster, as named in the export URL.
    pub cluster: ClusterName,
    /// The session.
    pub session: SessionChoice,
}

/// The state-API resources of `GET api/v0/{resource}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateResource {
    /// Task attempts.
    Tasks,
    /// One of the entity tables.
    Entity(EntityKind),
    /// What the export does not carry (objects, runtime envs, cluster events): always empty.
    Unexported,
}

/// Answers that do not depend on stored data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FixedRoute {
    /// `api/v0/cluster_metadata`.
    ClusterMetadata,
    /// `timezone`.
    Timezone,
    /// `api/version`.
    Version,
    /// `api/authentication_mode`.
    AuthenticationMode,
    /// `POST api/authenticate`.
    Authenticate,
    /// `usage_stats_enabled`.
    UsageStats,
    /// `api/profiling_enabled`.
    ProfilingEnabled,
    /// `api/v0/runtime_env_redaction`.
    RuntimeEnvRedaction,
    /// `api/grafana_health`.
    GrafanaHealth,
    /// `api/prometheus_health`.
    PrometheusHealth,
    /// `api/serve/applications/`.
    ServeApplications,
    /// `api/data/datasets/{job}`.
    Datasets,
    /// `api/v0/objects/summarize`.
    ObjectSummary,
}

/// A route of Ray's dashboard, under a [`RayTarget`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RayRoute {
    /// `GET api/v0/{resource}`: a state-API list.
    List(StateResource),
    /// `GET api/v0/tasks/summarize`.
    SummarizeTasks,
    /// `GET api/v0/actors/summarize`.
    SummarizeActors,
    /// `GET api/v0/tasks/timeline`: Chrome trace JSON.
    Timeline,
    /// `GET api/jobs/`: the jobs page's bare array.
    Jobs,
    /// `GET api/jobs/{id}`.
    Job(String),
    /// `GET api/jobs/{id}/logs`: a submission's driver log (`ray job logs`).
    JobLogs(String),
    /// `GET logical/actors`.
    LogicalActors,
    /// `GET logical/actors/{id}`.
    LogicalActor(String),
    /// `GET nodes` (`?view=summary`).
    Nodes,
    /// `GET nodes/{id}`.
    Node(String),
    /// `GET api/cluster_status` (`?format=1`): the overview's node and resource cards.
    ClusterStatus,
    /// `GET events` (`?job_id=`).
    Events,
    /// `GET api/v0/logs?node_id=`: a node's shipped log files, by Ray's categories.
    LogIndex,
    /// `GET api/v0/logs/file` (and `stream`): a file's last lines, or a task's own output.
    LogFile,
    /// Job submission, stopping, deleting: writes a history cannot do (HTTP 400).
    ReadOnly,
    /// Answers that need no table.
    Fixed(FixedRoute),
    /// `GET grafana/{path}`: Ray's metrics pages framing Grafana at the `grafanaHost` Afterglow
    /// names ([`FixedRoute::GrafanaHealth`]): a page sending the frame on to the configured
    /// Grafana's `{path}`, over the session's time range.
    Grafana(String),
    /// `GET /` or `index.html`: the dashboard's page. Ray serves its own for a stored session
    /// (a 404 sends its proxy to the local files); for a cluster or session that is not stored,
    /// a page saying so, since after any 404 Ray's proxy would show its own empty cluster.
    Page,
}

/// A parsed request under `/ray/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RayRequest {
    /// Whose history.
    pub target: RayTarget,
    /// What is asked.
    pub route: RayRoute,
}

/// Why a `/ray/` path names nothing of Afterglow's.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RayPathError {
    /// The first segment is not a valid cluster name.
    #[error("`{0}` is not a cluster name: /ray/{{cluster}}/{{session|latest}}/… expected")]
    Cluster(String),
    /// Not a data route: Ray serves it itself (its UI's files).
    #[error("no such Ray route")]
    NotARoute,
}

impl RayRequest {
    /// Parses `path`, the part after `/ray/` (no query string), sent with `method`.
    ///
    /// The segment after the cluster names the session when it is `latest` or a Ray session name
    /// (they all start with `session_`); otherwise the path goes straight on to the route and
    /// the latest session is meant.
    pub fn parse(method: &str, path: &str) -> Result<Self, RayPathError> {
        let (cluster, rest) = path.split_once('/').unwrap_or((path, ""));
        let cluster =
            ClusterName::new(cluster).map_err(|_| RayPathError::Cluster(cluster.to_owned()))?;
        let (first, after) = rest.split_once('/').unwrap_or((rest, ""));
        let (session, route) = if first == "latest" {
            (SessionChoice::Latest, after)
        } else if first.starts_with("session_") {
            (SessionChoice::Named(first.to_owned()), after)
        } else {
            (SessionChoice::Latest, rest)
        };
        let route = route_of(method, route).ok_or(RayPathError::NotARoute)?;
        Ok(Self {
            target: RayTarget { cluster, session },
            route,
        })
    }
}

/// The route `path` names (relative to the dashboard root), when it is a data route.
fn route_of(method: &str, path: &str) -> Option<RayRoute> {
    let segments: Vec<&str> = path.split('/').collect();
    let read = matches!(method, "GET" | "HEAD");
    let fixed = |route: FixedRoute| Some(RayRoute::Fixed(route));
    if !read {
        return match (method, segments.as_slice()) {
            ("POST", ["api", "authenticate"]) => fixed(FixedRoute::Authenticate),
            // Job submission, stopping, deleting: a history has nothing to act on.
            ("POST" | "PUT" | "DELETE", ["api", "jobs", ..] | ["api", "v0", ..]) => {
                Some(RayRoute::ReadOnly)
            }
            _ => None,
        };
    }
    let route = match segments.as_slice() {
        [""] | ["index.html"] => RayRoute::Page,
        ["api", "v0", "tasks"] => RayRoute::List(StateResource::Tasks),
        ["api", "v0", "tasks", "summarize"] => RayRoute::SummarizeTasks,
        ["api", "v0", "tasks", "timeline"] => RayRoute::Timeline,
        ["api", "v0", "actors", "summarize"] => RayRoute::SummarizeActors,
        ["api", "v0", "objects", "summarize"] => RayRoute::Fixed(FixedRoute::ObjectSummary),
        ["api", "v0", resource] => RayRoute::List(match *resource {
            "actors" => StateResource::Entity(EntityKind::Actors),
            "jobs" => StateResource::Entity(EntityKind::Jobs),
            "nodes" => StateResource::Entity(EntityKind::Nodes),
            "workers" => StateResource::Entity(EntityKind::Workers),
            "placement_groups" => StateResource::Entity(EntityKind::PlacementGroups),
            "objects" | "runtime_envs" | "cluster_events" => StateResource::Unexported,
            "cluster_metadata" => return fixed(FixedRoute::ClusterMetadata),
            "runtime_env_redaction" => return fixed(FixedRoute::RuntimeEnvRedaction),
            // Off by default in Ray (`RAY_DASHBOARD_INGEST_PLATFORM_EVENTS`): a 404 keeps the
            // tab hidden, as on the cluster.
            "platform_events" => return None,
            "logs" => return Some(RayRoute::LogIndex),
            _ => return None,
        }),
        ["api", "v0", "logs", "file" | "stream"] => RayRoute::LogFile,
        ["api", "jobs", ""] | ["api", "jobs"] => RayRoute::Jobs,
        ["api", "jobs", id] | ["api", "jobs", id, ""] => RayRoute::Job((*id).to_owned()),
        ["api", "jobs", id, "logs"] => RayRoute::JobLogs((*id).to_owned()),
        ["logical", "actors"] | ["logical", "actors", ""] => RayRoute::LogicalActors,
        ["logical", "actors", id] => RayRoute::LogicalActor((*id).to_owned()),
        ["nodes"] | ["nodes", ""] => RayRoute::Nodes,
        ["nodes", id] => RayRoute::Node((*id).to_owned()),
        ["events"] => RayRoute::Events,
        ["timezone"] => RayRoute::Fixed(FixedRoute::Timezone),
        ["usage_stats_enabled"] => RayRoute::Fixed(FixedRoute::UsageStats),
        ["api", "version"] => RayRoute::Fixed(FixedRoute::Version),
        ["api", "authentication_mode"] => RayRoute::Fixed(FixedRoute::AuthenticationMode),
        ["api", "profiling_enabled"] => RayRoute::Fixed(FixedRoute::ProfilingEnabled),
        ["api", "grafana_health"] => RayRoute::Fixed(FixedRoute::GrafanaHealth),
        ["api", "prometheus_health"] => RayRoute::Fixed(FixedRoute::PrometheusHealth),
        ["api", "cluster_status"] => RayRoute::ClusterStatus,
        ["api", "serve", "applications", ..] => RayRoute::Fixed(FixedRoute::ServeApplications),
        ["api", "data", "datasets", ..] => RayRoute::Fixed(FixedRoute::Datasets),
        ["grafana", path @ ..] => RayRoute::Grafana(path.join("/")),
        _ => return None,
    };
    Some(route)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(path: &str) -> Result<RayRequest, RayPathError> {
        RayRequest::parse("GET", path)
    }

    #[test]
    fn the_session_segment_is_optional_and_latest_by_default() -> Result<(), RayPathError> {
        let named = parse("prod/session_2026-11-23_14-37-40_1_2/api/v0/tasks")?;
        assert_eq!(
            named.target.session,
            SessionChoice::Named("session_2026-11-23_14-37-40_1_2".into())
        );
        assert_eq!(named.route, RayRoute::List(StateResource::Tasks));
        for path in ["prod/latest/api/v0/tasks", "prod/api/v0/tasks"] {
            let latest = parse(path)?;
            assert_eq!(latest.target.cluster.as_str(), "prod");
            assert_eq!(latest.target.session, SessionChoice::Latest);
            assert_eq!(latest.route, RayRoute::List(StateResource::Tasks));
        }
        Ok(())
    }

    #[test]
    fn data_routes_and_the_page_are_recognized_and_ui_files_are_not() -> Result<(), RayPathError> {
        assert_eq!(
            parse("c/latest/api/jobs/")?.route,
            RayRoute::Jobs,
            "the jobs page asks with a trailing slash"
        );
        assert_eq!(
            parse("c/latest/api/jobs/02000000")?.route,
            RayRoute::Job("02000000".into())
        );
        assert_eq!(
            parse("c/latest/api/jobs/raysubmit_1/logs")?.route,
            RayRoute::JobLogs("raysubmit_1".into()),
            "`ray job logs`"
        );
        assert_eq!(
            parse("c/latest/api/v0/tasks/summarize")?.route,
            RayRoute::SummarizeTasks
        );
        assert_eq!(
            parse("c/latest/nodes/abc")?.route,
            RayRoute::Node("abc".into())
        );
        for path in ["c/latest/", "c/", "c", "c/latest/index.html"] {
            assert_eq!(parse(path)?.route, RayRoute::Page, "{path}");
        }
        for path in [
            "c/latest/static/js/main.js",
            "c/latest/favicon.ico",
            "c/latest/api/v0/bogus",
        ] {
            assert_eq!(parse(path), Err(RayPathError::NotARoute), "{path}");
        }
        assert!(matches!(
            parse("no spaces/latest/api/v0/tasks"),
            Err(RayPathError::Cluster(_))
        ));
        Ok(())
    }

    #[test]
    fn writes_get_a_read_only_answer_not_a_fallback() -> Result<(), RayPathError> {
        assert_eq!(
            RayRequest::parse("POST", "c/latest/api/jobs/")?.route,
            RayRoute::ReadOnly
        );
        assert_eq!(
            RayRequest::parse("POST", "c/latest/api/authenticate")?.route,
            RayRoute::Fixed(FixedRoute::Authenticate)
        );
        assert_eq!(
            RayRequest::parse("POST", "c/latest/static/x"),
            Err(RayPathError::NotARoute)
        );
        Ok(())
    }
}
