//! The dashboard API: JSON answers from embedded DuckDB over the compacted Parquet tables, for
//! our own routes (`/api/…`) and for Ray's (`/ray/…`, see [`ray`]).
//!
//! It only reads: it never writes a table. It knows nothing about HTTP either: the binary maps
//! an [`ApiRoute`] and query pairs to a call of [`QueryEngine::answer`] (a Ray path to
//! [`QueryEngine::answer_ray`]) and a [`QueryError`] to a status code.
//!
//! # Layout
//!
//! - [`QueryEngine`] (`engine.rs`): the settings, the process's DuckDB database, the file cache
//!   and the deadline every query runs under.
//! - [`read`]: the read code the routes share, one concept per file: request parameters and
//!   filters, the snapshot of the files in scope, SQL and relations, the attempts in scope,
//!   counts (from rollups or a scan), pages and cursors, the task lookup through key indexes.
//! - A module per route of ours, dispatched by [`QueryEngine::answer`]: `clusters`, `summary`,
//!   `tasks` (the task table and one task), `aggregates`, `insights`, `timeline`, `entities`,
//!   and `logs` (the engine's log methods: a task's output, a node's shipped files).
//! - [`ray`]: Ray's own routes, with their own request parsing and envelopes.
//! - `ad_hoc`: a query of the user's over the published tables (`afterglow sql`), outside the
//!   dashboard API.
//! - [`redaction`]: the secrets of runtime envs (`env_vars` values), masked in every answer of
//!   ours and Ray's as Ray's dashboard masks them; what is stored keeps them as sent.
//!
//! A route imports [`read`], [`redaction`] and the engine, never another route.
//!
//! # A request
//!
//! 1. [`read::params`]: the query string is parsed strictly into typed filters (a bad value is
//!    a 400 that names the parameter).
//! 2. [`read::snapshot`]: the catalog names the sessions in scope, their manifests name the
//!    live files, and a [`FileCache`](crate::storage::FileCache) makes local copies of the
//!    files not seen before (they are immutable, so a copy never goes stale). Nothing is listed.
//! 3. [`read::sql`]: SQL is assembled from allow-listed identifiers and bound parameters; base
//!    and delta files are read together, each row's newest version taken, the rule compaction
//!    itself applies.
//! 4. The route's module runs it on a pooled DuckDB connection under a deadline and shapes the
//!    JSON (see docs/architecture.md, "Queries", and `openapi.yaml`).

mod ad_hoc;
mod aggregates;
mod clusters;
mod engine;
mod entities;
mod insights;
mod logs;
pub mod ray;
pub mod read;
pub mod redaction;
mod summary;
mod tasks;
mod timeline;

pub use self::ad_hoc::{AnswerColumn, AnswerSink};
pub use self::aggregates::BUCKET_BOUNDS_MS;
pub use self::engine::{COPY_BUDGET_BYTES, QueryEngine, QuerySettings};
pub use self::logs::TaskLog;

use std::time::Duration;

use serde_json::Value as Json;

use crate::storage::StorageError;
use crate::tables::entities::EntityKind;
use crate::tables::manifest::ManifestError;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The request is wrong; the message says how (HTTP 400).
    #[error("{0}")]
    BadRequest(String),
    /// Nothing has that id (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// More than one thing has that id, and the request must say which (HTTP 409).
    #[error("{0}")]
    Ambiguous(String),
    /// The query ran out of time and was interrupted (HTTP 504).
    #[error("the query took longer than {0:?} and was stopped; narrow it with filters")]
    Timeout(Duration),
    /// Storage failed (HTTP 502).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A manifest or the catalog could not be read (HTTP 502).
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// DuckDB failed (HTTP 500).
    #[error("DuckDB: {0}")]
    DuckDb(#[from] duckdb::Error),
    /// A bug or a corrupt file (HTTP 500).
    #[error("{0}")]
    Internal(String),
}

/// The routes of the dashboard API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiRoute {
    /// `GET /api/clusters`.
    Clusters,
    /// `GET /api/summary`.
    Summary,
    /// `GET /api/aggregates`.
    Aggregates,
    /// `GET /api/tasks`.
    Tasks,
    /// `GET /api/tasks/{task_id}`.
    Task(String),
    /// `GET /api/jobs`, `/api/actors`, `/api/nodes`, `/api/workers`, `/api/placement_groups`.
    Entities(EntityKind),
    /// `GET /api/timeline`.
    Timeline,
    /// `GET /api/insights`.
    Insights,
    /// `GET /api/logs`: the log files a node shipped.
    LogFiles,
}

impl QueryEngine {
    /// Answers `route` with the query-string `params`.
    #[tracing::instrument(name = "query", skip(self, params), fields(route = ?route))]
    pub async fn answer(
        &self,
        route: &ApiRoute,
        params: &[(String, String)],
    ) -> Result<Json, QueryError> {
        match route {
            ApiRoute::Clusters => clusters::clusters(self, params).await,
            ApiRoute::Summary => summary::summary(self, params).await,
            ApiRoute::Aggregates => aggregates::aggregates(self, params).await,
            ApiRoute::Tasks => tasks::tasks(self, params).await,
            ApiRoute::Task(task_id) => tasks::task(self, task_id, params).await,
            ApiRoute::Entities(kind) => entities::entities(self, *kind, params).await,
            ApiRoute::Timeline => timeline::timeline(self, params).await,
            ApiRoute::Insights => insights::insights(self, params).await,
            ApiRoute::LogFiles => self.answer_log_files(params).await,
        }
    }
}
