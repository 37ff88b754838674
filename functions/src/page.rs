//! The dashboard page: plain HTML, CSS and JS modules embedded in the binary and served by the
//! query function (and `serve`) at `/`. The page calls the API with relative URLs, so a
//! dashboard proxy can front both under any prefix.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use shared::config::GrafanaUrl;

use crate::state::AppState;

const INDEX: &str = include_str!("page/index.html");
const APP: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/style.css");

/// `/`, `/assets/app.js`, `/assets/style.css`.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/",
            get(|State(state): State<Arc<AppState>>| async move {
                let grafana = state
                    .query
                    .as_ref()
                    .and_then(|query| query.engine.grafana_url());
                asset("text/html; charset=utf-8", index(grafana))
            }),
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

/// The page, telling its script where to link node and worker ids (a `<meta>` the script reads,
/// since the content security policy admits no inline script).
pub fn index(grafana: Option<&GrafanaUrl>) -> String {
    let url = grafana.map_or(String::new(), |url| url.as_str().replace('&', "&amp;"));
    INDEX.replace(
        r#"<meta name="afterglow-grafana-url" content="">"#,
        &format!(r#"<meta name="afterglow-grafana-url" content="{url}">"#),
    )
}

fn asset(content_type: &'static str, body: impl Into<axum::body::Body>) -> Response {
    let mut response = body.into().into_response();
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
