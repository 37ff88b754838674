//! `POST /v1/events/{cluster}?token=…`: Ray's export traffic onto [`Ingestor::ingest`], and
//! `POST /v1/logs/{cluster}?token=…&session=…&node_id=…&file=…&offset=…`: pieces of log files
//! from `afterglow ship-logs` onto [`Ingestor::ingest_log_chunk`].

use std::sync::Arc;

use axum::Json;
use axum::body::to_bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use shared::ingest::{IngestError, IngestReceipt, Ingestor};
use shared::keys::{ClusterName, LogFile, LogFileName, NodeId, SessionName};
use shared::logs::store::{LogError, MAX_CHUNK_BYTES};
use shared::raw::write::WriteError;

use crate::state::{AppState, error_response};

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
    ingestor
        .authorize(&cluster, token)
        .await
        .map_err(Refusal::Ingest)?;
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
/// a retry cannot fix is a 4xx, besides a cluster starting sessions too fast (429, which a
/// retry after `Retry-After` seconds passes); storage trouble is a 503 so that Ray retries.
fn ingest_error_response(err: &IngestError) -> Response {
    let status = match err {
        IngestError::MissingToken => StatusCode::UNAUTHORIZED,
        IngestError::WrongToken => StatusCode::FORBIDDEN,
        IngestError::BodyTooLarge { .. } | IngestError::TooManyEvents { .. } => {
            StatusCode::PAYLOAD_TOO_LARGE
        }
        IngestError::NotABatch(_) | IngestError::TooManySessions { .. } => StatusCode::BAD_REQUEST,
        IngestError::SessionFlood { .. } => StatusCode::TOO_MANY_REQUESTS,
        IngestError::Write(WriteError::Storage(_)) => StatusCode::SERVICE_UNAVAILABLE,
        IngestError::Write(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status.is_server_error() {
        tracing::error!(error = %err, "ingest failed; Ray will retry");
    } else {
        tracing::warn!(error = %err, "ingest refused");
    }
    let mut response = error_response(status, err.to_string());
    if let IngestError::SessionFlood {
        retry_after_secs, ..
    } = err
    {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
    }
    response
}

/// The query string of a log chunk: the token as for events, and where the bytes belong.
#[derive(Debug, Deserialize)]
pub struct LogChunkQuery {
    token: Option<String>,
    session: Option<String>,
    node_id: Option<String>,
    file: Option<String>,
    offset: Option<String>,
}

/// Authorizes first, then checks where the bytes belong, then reads the body up to the limit
/// and stores it. Answers 200 only after the chunk is durable.
pub async fn post_log_chunk(
    State(state): State<Arc<AppState>>,
    Path(cluster): Path<String>,
    Query(query): Query<LogChunkQuery>,
    request: Request,
) -> Response {
    let Some(ingestor) = &state.ingestor else {
        return error_response(StatusCode::NOT_FOUND, "this function does not ingest");
    };
    let cluster = match ClusterName::new(&cluster) {
        Ok(cluster) => cluster,
        Err(err) => return error_response(StatusCode::BAD_REQUEST, err.to_string()),
    };
    if let Err(err) = ingestor.authorize(&cluster, query.token.as_deref()).await {
        return ingest_error_response(&err);
    }
    let (file, offset) = match chunk_place(cluster, &query) {
        Ok(place) => place,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, message),
    };
    let Ok(body) = to_bytes(request.into_body(), MAX_CHUNK_BYTES.saturating_add(1)).await else {
        return log_error_response(&LogError::TooLarge {
            bytes: MAX_CHUNK_BYTES.saturating_add(1),
            limit: MAX_CHUNK_BYTES,
        });
    };
    match ingestor.ingest_log_chunk(&file, offset, &body).await {
        Ok(receipt) => {
            let body = serde_json::json!({"stored": receipt.stored, "end": receipt.end});
            (StatusCode::OK, Json(body)).into_response()
        }
        Err(err) => log_error_response(&err),
    }
}

/// The file and offset a log chunk names, or what is wrong with them.
fn chunk_place(cluster: ClusterName, query: &LogChunkQuery) -> Result<(LogFile, u64), String> {
    fn required<'a>(value: &'a Option<String>, name: &str) -> Result<&'a str, String> {
        value
            .as_deref()
            .ok_or_else(|| format!("missing query parameter `{name}`"))
    }
    let file = LogFile {
        cluster,
        session: SessionName::new(required(&query.session, "session")?)
            .map_err(|err| err.to_string())?,
        node_id: NodeId::new(required(&query.node_id, "node_id")?)
            .map_err(|err| err.to_string())?,
        file: LogFileName::new(required(&query.file, "file")?).map_err(|err| err.to_string())?,
    };
    let offset = required(&query.offset, "offset")?;
    let offset = offset
        .parse()
        .map_err(|_| format!("offset {offset:?} is not a byte offset (0 or more)"))?;
    Ok((file, offset))
}

/// The one place log-chunk errors become HTTP statuses. The shipper retries 5xx; a 4xx makes it
/// stop sending that file, so only what a retry cannot fix is a 4xx.
fn log_error_response(err: &LogError) -> Response {
    let status = match err {
        LogError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        LogError::OffsetOverflow { .. } => StatusCode::BAD_REQUEST,
        LogError::Conflict { .. } | LogError::Unreadable { .. } => StatusCode::CONFLICT,
        LogError::Storage(_) => StatusCode::SERVICE_UNAVAILABLE,
        LogError::Key(_) | LogError::Encode(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status.is_server_error() {
        tracing::error!(error = %err, "log chunk not stored; the shipper will retry");
    } else {
        tracing::warn!(error = %err, "log chunk refused");
    }
    error_response(status, err.to_string())
}
