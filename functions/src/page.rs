//! The dashboard page: plain HTML, CSS and JS modules embedded in the binary and served by the
//! query function (and `serve`) at `/`. The page calls the API with relative URLs, so a
//! dashboard proxy can front both under any prefix.

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::state::AppState;

const INDEX: &str = include_str!("page/index.html");
const APP: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/style.css");

/// `/`, `/assets/app.js`, `/assets/style.css`.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/assets/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP) }),
        )
        .route(
            "/assets/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The page changes only with the binary; a short cache keeps deploys visible.
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=300"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'",
        ),
    );
    response
}
