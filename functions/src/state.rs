//! What the HTTP handlers share, in a module that depends on none of them (the router, the
//! ingest and query handlers and the page all use it).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use shared::auth::AccessToken;
use shared::compact::schedule::queue::CompactionQueue;
use shared::ingest::Ingestor;
use shared::query::QueryEngine;

/// What the handlers share: built once per process, borrowed by every request. A Lambda function
/// carries only its own service; `serve` carries all of them.
#[derive(Debug, Default)]
pub struct AppState {
    /// The ingest service.
    pub ingestor: Option<Ingestor>,
    /// In `serve`, where stored raw objects are queued for compaction (on AWS, S3 notifies).
    pub compaction: Option<CompactionQueue>,
    /// The dashboard API.
    pub query: Option<QueryService>,
}

/// The query engine and who may use it.
#[derive(Debug)]
pub struct QueryService {
    /// Answers requests.
    pub engine: QueryEngine,
    /// When set, every request must carry `Authorization: Bearer <token>`.
    pub token: Option<AccessToken>,
}

/// A JSON error body: `{"error": "…"}`.
pub fn error_response(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into() });
    (status, axum::Json(body)).into_response()
}
