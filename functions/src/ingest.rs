//! `POST /v1/events/{cluster}?token=…`: Ray's export traffic onto [`Ingestor::ingest`], and
//! `POST /v1/logs/{cluster}?token=…&session=…&node_id=…`: one framed body of log pieces from
//! `afterglow-ship-logs` onto [`Ingestor::ingest_log_pieces`] (with `&file=…&offset=…`, the body
//! is one file's bytes: the form of shippers that do not frame their bodies).

use std::sync::Arc;

use ::ship_logs::frames::{BodyAnswer, PieceAnswer, read_body};
use axum::Json;
use axum::body::to_bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use shared::ingest::{IngestError, IngestReceipt, Ingestor};
use shared::keys::{ClusterName, LogFileName, NodeId, NodeLogs, SessionName};
use shared::logs::store::{LogError, MAX_BODY_BYTES, PieceOutcome, ReadPiece};
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

/// The query string of a log request: the token as for events, and whose logs the body holds.
#[derive(Debug, Deserialize)]
pub struct LogQuery {
    token: Option<String>,
    session: Option<String>,
    node_id: Option<String>,
    /// With `offset`: the body is this one file's bytes, not framed pieces.
    file: Option<String>,
    offset: Option<String>,
}

/// Authorizes first, then checks whose logs they are, then reads the body up to the limit and
/// stores or queues its pieces. Answers 200, with what became of each piece, only once they are
/// durable.
pub async fn post_logs(
    State(state): State<Arc<AppState>>,
    Path(cluster): Path<String>,
    Query(query): Query<LogQuery>,
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
    let node = match node_of(cluster, &query) {
        Ok(node) => node,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, message),
    };
    let one_file = match one_file(&query) {
        Ok(one_file) => one_file,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, message),
    };
    // Reading stops one byte past the limit, so an oversized body never sits in memory whole.
    let body = match to_bytes(request.into_body(), MAX_BODY_BYTES.saturating_add(1)).await {
        Ok(body) if body.len() <= MAX_BODY_BYTES => body,
        _ => {
            return log_error_response(&LogError::TooLarge {
                bytes: MAX_BODY_BYTES.saturating_add(1),
                limit: MAX_BODY_BYTES,
            });
        }
    };
    let pieces = match &one_file {
        Some((file, offset)) => vec![ReadPiece {
            file: file.clone(),
            offset: *offset,
            bytes: &body,
        }],
        None => match read_body(&body) {
            Ok(pieces) => pieces,
            Err(err) => return error_response(StatusCode::BAD_REQUEST, err.to_string()),
        },
    };
    let outcomes = match ingestor.ingest_log_pieces(&node, &pieces).await {
        Ok(outcomes) => outcomes,
        Err(err) => return log_error_response(&err),
    };
    if one_file.is_some() {
        // The single-file form answers with the receipt, or 409.
        return match outcomes.into_iter().next() {
            Some(PieceOutcome::Stored { stored, end }) => (
                StatusCode::OK,
                Json(serde_json::json!({"stored": stored, "end": end})),
            )
                .into_response(),
            Some(PieceOutcome::Queued { end }) => (
                StatusCode::ACCEPTED,
                Json(serde_json::json!({"queued": true, "end": end})),
            )
                .into_response(),
            Some(PieceOutcome::Refused { reason }) => {
                tracing::warn!(%reason, "log piece refused");
                error_response(StatusCode::CONFLICT, reason)
            }
            None => error_response(StatusCode::INTERNAL_SERVER_ERROR, "no answer for the piece"),
        };
    }
    let answer = BodyAnswer {
        pieces: pieces
            .iter()
            .zip(outcomes)
            .map(|(piece, outcome)| {
                if let PieceOutcome::Refused { reason } = &outcome {
                    tracing::warn!(file = %piece.file, offset = piece.offset, %reason, "log piece refused");
                }
                PieceAnswer {
                    file: piece.file.to_string(),
                    offset: piece.offset,
                    outcome,
                }
            })
            .collect(),
    };
    (StatusCode::OK, Json(answer)).into_response()
}

/// The node a log request names, or what is wrong with it.
fn node_of(cluster: ClusterName, query: &LogQuery) -> Result<NodeLogs, String> {
    Ok(NodeLogs {
        cluster,
        session: SessionName::new(required(&query.session, "session")?)
            .map_err(|err| err.to_string())?,
        node_id: NodeId::new(required(&query.node_id, "node_id")?)
            .map_err(|err| err.to_string())?,
    })
}

/// The file and offset of a single-file request; `None` for a framed body.
fn one_file(query: &LogQuery) -> Result<Option<(LogFileName, u64)>, String> {
    if query.file.is_none() && query.offset.is_none() {
        return Ok(None);
    }
    let file = LogFileName::new(required(&query.file, "file")?).map_err(|err| err.to_string())?;
    let offset = required(&query.offset, "offset")?;
    let offset = offset
        .parse()
        .map_err(|_| format!("offset {offset:?} is not a byte offset (0 or more)"))?;
    Ok(Some((file, offset)))
}

fn required<'a>(value: &'a Option<String>, name: &str) -> Result<&'a str, String> {
    value
        .as_deref()
        .ok_or_else(|| format!("missing query parameter `{name}`"))
}

/// The one place errors of a whole log request become HTTP statuses (a refused piece is answered
/// in the body). The shipper retries every failed request, so what the store cannot do now is a
/// 5xx.
fn log_error_response(err: &LogError) -> Response {
    let status = match err {
        LogError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        LogError::OffsetOverflow { .. } => StatusCode::BAD_REQUEST,
        LogError::Conflict { .. } => StatusCode::CONFLICT,
        LogError::Storage(_) | LogError::Contended { .. } | LogError::Queue(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        LogError::Unreadable { .. }
        | LogError::BadIndex { .. }
        | LogError::Key(_)
        | LogError::Encode(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status.is_server_error() {
        tracing::error!(error = %err, "log pieces not stored; the shipper will retry");
    } else {
        tracing::warn!(error = %err, "log request refused");
    }
    error_response(status, err.to_string())
}
