//! `POST /v1/events/{cluster}?token=…`: Ray's export traffic onto [`Ingestor::ingest`].

use std::sync::Arc;

use axum::Json;
use axum::body::to_bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use shared::ingest::{IngestError, IngestReceipt, Ingestor};
use shared::layout::ClusterName;

use crate::http::{AppState, error_response};

/// The query string Ray sends back verbatim from the export URL.
#[derive(Debug, Deserialize)]
pub struct IngestQuery {
    token: Option<String>,
}

/// Authorizes first, then reads the body up to the limit, then stores it. Answers 200 only
/// after the raw object is durable.
pub async fn post_events(
    State(state): State<Arc<AppState>>,
    Path(cluster): Path<String>,
    Query(query): Query<IngestQuery>,
    request: Request,
) -> Response {
    let Some(ingestor) = &state.ingestor else {
        return error_response(StatusCode::NOT_FOUND, "this function does not ingest");
    };
    match ingest(ingestor, &cluster, query.token.as_deref(), request).await {
        Ok(receipt) => {
            if let (Some(queue), Some(key)) = (&state.compaction, &receipt.key) {
                queue.notify(key.clone());
            }
            let body = serde_json::json!({
                "accepted": receipt.events,
                "object": receipt.key.map(|key| key.to_string()),
            });
            (StatusCode::OK, Json(body)).into_response()
        }
        Err(Refusal::Cluster(message)) => error_response(StatusCode::BAD_REQUEST, message),
        Err(Refusal::Ingest(err)) => ingest_error_response(&err),
    }
}

enum Refusal {
    Cluster(String),
    Ingest(IngestError),
}

async fn ingest(
    ingestor: &Ingestor,
    cluster: &str,
    token: Option<&str>,
    request: Request,
) -> Result<IngestReceipt, Refusal> {
    let cluster = ClusterName::new(cluster).map_err(|err| Refusal::Cluster(err.to_string()))?;
    ingestor.authorize(token).map_err(Refusal::Ingest)?;
    let limit = ingestor.limits().max_body_bytes;
    // Reading stops one byte past the limit, so an oversized body never sits in memory whole.
    let body = to_bytes(request.into_body(), limit.saturating_add(1))
        .await
        .map_err(|_| {
            Refusal::Ingest(IngestError::BodyTooLarge {
                bytes: limit.saturating_add(1),
                limit,
            })
        })?;
    ingestor
        .ingest(&cluster, &body)
        .await
        .map_err(Refusal::Ingest)
}

/// The one place ingest errors become HTTP statuses. Ray retries anything ≥ 400, so only what
/// a retry cannot fix is a 4xx; storage trouble is a 503 so that Ray retries.
fn ingest_error_response(err: &IngestError) -> Response {
    let status = match err {
        IngestError::MissingToken => StatusCode::UNAUTHORIZED,
        IngestError::WrongToken => StatusCode::FORBIDDEN,
        IngestError::BodyTooLarge { .. } | IngestError::TooManyEvents { .. } => {
            StatusCode::PAYLOAD_TOO_LARGE
        }
        IngestError::NotABatch(_) => StatusCode::BAD_REQUEST,
        IngestError::Storage(_) => StatusCode::SERVICE_UNAVAILABLE,
        IngestError::Key(_) | IngestError::Encode(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status.is_server_error() {
        tracing::error!(error = %err, "ingest failed; Ray will retry");
    } else {
        tracing::warn!(error = %err, "ingest refused");
    }
    error_response(status, err.to_string())
}
