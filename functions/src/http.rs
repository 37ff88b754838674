//! The HTTP surface: one axum [`Router`] for every route, served by `serve` locally and by
//! `lambda_http` behind API Gateway, plus the per-request tracing span and gzip for clients
//! that take it (browsers, Ray's dashboard and CLI, `afterglow proxy`): a page of task rows is
//! large JSON that compresses well, and over API Gateway every byte also counts against
//! Lambda's 6 MB answer (`lambda_http` sends a gzipped body base64-encoded).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use tracing::Instrument as _;

use crate::state::{AppState, error_response};

/// Every route of the services `state` carries.
pub fn router(state: Arc<AppState>) -> Router {
    let mut router = Router::new();
    if state.ingestor.is_some() {
        router = router
            .route("/v1/events/{cluster}", post(crate::ingest::post_events))
            .route("/v1/logs/{cluster}", post(crate::ingest::post_logs));
    }
    if state.query.is_some() {
        router = router
            .merge(crate::query::routes())
            .merge(crate::page::routes());
    }
    router
        .fallback(not_found)
        .layer(middleware::from_fn(gzip_answers))
        .layer(middleware::from_fn(request_span))
        .with_state(state)
}

/// Answers smaller than this are sent as they are: gzip's header and the client's work cost
/// more than the bytes saved.
const GZIP_FROM_BYTES: usize = 1024;

/// Whether a request's `Accept-Encoding` takes gzip: `gzip` (or `x-gzip`) or `*` listed with a
/// weight above zero, and gzip not refused by name (`gzip;q=0`).
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    let mut any = false;
    for value in headers.get_all(header::ACCEPT_ENCODING) {
        let Ok(value) = value.to_str() else { continue };
        for item in value.split(',') {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or_default().trim();
            let weighted = parts
                .filter_map(|part| part.trim().strip_prefix("q="))
                .next()
                .map(|weight| weight.trim().parse::<f32>().unwrap_or(0.0) > 0.0)
                .unwrap_or(true);
            if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                return weighted;
            }
            any |= coding == "*" && weighted;
        }
    }
    any
}

/// Whether an answer of this media type is text that gzip shrinks.
fn compressible(headers: &HeaderMap) -> bool {
    let Some(Ok(media)) = headers.get(header::CONTENT_TYPE).map(HeaderValue::to_str) else {
        return false;
    };
    let media = media.split(';').next().unwrap_or_default().trim();
    media.starts_with("text/")
        || matches!(
            media,
            "application/json" | "application/javascript" | "image/svg+xml"
        )
        || media.ends_with("+json")
}

/// Gzips an answer for a client that takes gzip, when it is text of some size and not encoded
/// already (Ray's routes gzip their own, see `query::answer_ray`).
async fn gzip_answers(request: Request, next: Next) -> Response {
    let gzip = accepts_gzip(request.headers());
    let response = next.run(request).await;
    if !compressible(response.headers())
        || response.headers().contains_key(header::CONTENT_ENCODING)
    {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    parts
        .headers
        .append(header::VARY, HeaderValue::from_static("accept-encoding"));
    // Every answer is built in memory: this reads it, nothing more.
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(err) => {
            return error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading an answer: {err}"),
            );
        }
    };
    if !gzip || bytes.len() < GZIP_FROM_BYTES {
        return Response::from_parts(parts, Body::from(bytes));
    }
    match shared::gzip::gzip(&bytes) {
        Ok(packed) => {
            parts.headers.remove(header::CONTENT_LENGTH);
            parts
                .headers
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            Response::from_parts(parts, Body::from(packed))
        }
        Err(err) => {
            tracing::warn!(error = %err, "could not gzip an answer; sending it as it is");
            Response::from_parts(parts, Body::from(bytes))
        }
    }
}

/// Refuses requests addressed to any host but a loopback name, for a server that listens on
/// loopback. A web page on another site can make the browser resolve its own name to 127.0.0.1
/// (DNS rebinding) and then read an open loopback API; its requests still carry its own name
/// in `Host`, so they are refused here.
pub async fn loopback_hosts_only(request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(axum::http::header::HOST)
        .map(|value| value.to_str().unwrap_or("\u{fffd}"));
    match host {
        Some(host) if !is_loopback_host(host) => error_response(
            StatusCode::FORBIDDEN,
            "this Afterglow listens on loopback and answers only requests addressed to \
             localhost, 127.0.0.1 or [::1] (the Host header names another host)",
        ),
        _ => next.run(request).await,
    }
}

/// True for `localhost`, an IPv4 loopback address or `[::1]`, with or without a port.
pub fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split_once(']').map_or(host, |(inside, _)| inside)
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

async fn not_found() -> Response {
    error_response(StatusCode::NOT_FOUND, "no such route")
}

/// Wraps each request in a span with an id (Lambda's request id there, a ULID locally), the
/// method and the path. The query string is never recorded: it holds the ingest token.
async fn request_span(request: Request, next: Next) -> Response {
    let request_id = request
        .extensions()
        .get::<lambda_http::Context>()
        .map_or_else(
            || ulid::Ulid::new().to_string(),
            |context| context.request_id.clone(),
        );
    let span = tracing::info_span!(
        "request",
        request_id = %request_id,
        method = %request.method(),
        path = %request.uri().path(),
        status = tracing::field::Empty,
    );
    async move {
        let response = next.run(request).await;
        tracing::Span::current().record("status", response.status().as_u16());
        tracing::debug!("answered");
        response
    }
    .instrument(span)
    .await
}
