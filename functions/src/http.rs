//! The HTTP surface: one axum [`Router`] for every route, served by `serve` locally and by
//! `lambda_http` behind API Gateway, plus the per-request tracing span.

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
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
            .route("/v1/logs/{cluster}", post(crate::ingest::post_log_chunk));
    }
    if state.query.is_some() {
        router = router
            .merge(crate::query::routes())
            .merge(crate::page::routes());
    }
    router
        .fallback(not_found)
        .layer(middleware::from_fn(request_span))
        .with_state(state)
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
fn is_loopback_host(host: &str) -> bool {
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

#[cfg(test)]
mod tests {
    use super::is_loopback_host;

    #[test]
    fn only_loopback_names_pass() {
        for host in [
            "localhost",
            "LOCALHOST:8700",
            "127.0.0.1",
            "127.0.0.1:8700",
            "127.1.2.3:1",
            "[::1]",
            "[::1]:8700",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8700",
            "localhost.evil.example",
            "10.0.0.1:8700",
            "[::2]:8700",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
