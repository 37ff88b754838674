//! `GET /api/...`: the dashboard API onto
//! [`QueryEngine::answer`](shared::query::QueryEngine::answer), and Ray's own routes under
//! `/ray/...` onto [`QueryEngine::answer_ray`](shared::query::QueryEngine::answer_ray), behind
//! an optional bearer token. On AWS, API Gateway's IAM authorizer guards these routes; the
//! token is for `serve` off loopback and for deployments that choose bearer mode.

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use shared::auth::{BearerRefusal, check_bearer};
use shared::query::ray::{RayPathError, RayRequest, RayRoute};
use shared::query::{ApiRoute, QueryError};
use shared::tables::entities::EntityKind;

use crate::state::{AppState, QueryService, error_response};

type Pairs = Result<Query<Vec<(String, String)>>, QueryRejection>;

/// The dashboard API's routes, and Ray's own under `/ray/`.
pub fn routes() -> Router<Arc<AppState>> {
    fn fixed(route: ApiRoute) -> axum::routing::MethodRouter<Arc<AppState>> {
        get(
            move |State(state): State<Arc<AppState>>, headers: HeaderMap, pairs: Pairs| async move {
                answer(&state, route, &headers, pairs).await
            },
        )
    }
    let mut router = Router::new()
        .route("/ray/{*path}", any(answer_ray))
        .route("/api/clusters", fixed(ApiRoute::Clusters))
        .route("/api/summary", fixed(ApiRoute::Summary))
        .route("/api/aggregates", fixed(ApiRoute::Aggregates))
        .route("/api/tasks", fixed(ApiRoute::Tasks))
        .route("/api/timeline", fixed(ApiRoute::Timeline))
        .route("/api/insights", fixed(ApiRoute::Insights))
        .route("/api/tasks/{task_id}/logs", get(task_log))
        .route("/api/logs", fixed(ApiRoute::LogFiles))
        .route("/api/logs/file", get(log_file))
        .route(
            "/api/tasks/{task_id}",
            get(
                |State(state): State<Arc<AppState>>,
                 Path(task_id): Path<String>,
                 headers: HeaderMap,
                 pairs: Pairs| async move {
                    answer(&state, ApiRoute::Task(task_id), &headers, pairs).await
                },
            ),
        );
    for kind in EntityKind::ALL {
        router = router.route(
            &format!("/api/{}", kind.table()),
            fixed(ApiRoute::Entities(kind)),
        );
    }
    router
}

async fn answer(state: &AppState, route: ApiRoute, headers: &HeaderMap, pairs: Pairs) -> Response {
    let (service, pairs) = match authorized_pairs(state, headers, pairs) {
        Ok(ready) => ready,
        Err(refusal) => return *refusal,
    };
    match service.engine.answer(&route, &pairs).await {
        Ok(body) => json_response(body),
        Err(err) => error_response(status_of(&err), err.to_string()),
    }
}

/// `false` when the end of a task's output was never shipped.
pub const LOG_COMPLETE: header::HeaderName =
    header::HeaderName::from_static("x-afterglow-log-complete");
/// `inferred` when Ray never reported where a task's output is, `reported` otherwise.
pub const LOG_RANGE: header::HeaderName = header::HeaderName::from_static("x-afterglow-log-range");

/// `GET /api/tasks/{task_id}/logs`: the attempt's own output as `text/plain`, exactly the bytes
/// it wrote; `X-Afterglow-Log-Complete: false` when its end was not shipped,
/// `X-Afterglow-Log-Range: inferred` when Ray never reported where it is.
async fn task_log(
    State(state): State<Arc<AppState>>,
    Path(task_id): Path<String>,
    headers: HeaderMap,
    pairs: Pairs,
) -> Response {
    let (service, pairs) = match authorized_pairs(&state, &headers, pairs) {
        Ok(ready) => ready,
        Err(refusal) => return *refusal,
    };
    match service.engine.task_log(&task_id, &pairs).await {
        Ok(log) => {
            let mut response = text_response(log.bytes, log.complete);
            response.headers_mut().insert(
                LOG_RANGE,
                HeaderValue::from_static(if log.inferred { "inferred" } else { "reported" }),
            );
            response
        }
        Err(err) => error_response(status_of(&err), err.to_string()),
    }
}

/// `GET /api/logs/file`: a shipped file's last lines as `text/plain`.
async fn log_file(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    pairs: Pairs,
) -> Response {
    let (service, pairs) = match authorized_pairs(&state, &headers, pairs) {
        Ok(ready) => ready,
        Err(refusal) => return *refusal,
    };
    match service.engine.answer_log_file(&pairs).await {
        Ok(tail) => text_response(tail.bytes, tail.complete),
        Err(err) => error_response(status_of(&err), err.to_string()),
    }
}

/// The query service and the query pairs, when the request may use it; else the refusal.
type Admitted<'a> = Result<(&'a QueryService, Vec<(String, String)>), Box<Response>>;

/// The query service and the query pairs, when the request may use it.
fn authorized_pairs<'a>(state: &'a AppState, headers: &HeaderMap, pairs: Pairs) -> Admitted<'a> {
    let service = authorized(state, headers)?;
    match pairs {
        Ok(Query(pairs)) => Ok((service, pairs)),
        Err(rejection) => Err(Box::new(error_response(
            StatusCode::BAD_REQUEST,
            rejection.body_text(),
        ))),
    }
}

/// Log bytes as `text/plain`, saying whether they reach as far as asked.
fn text_response(bytes: Vec<u8>, complete: bool) -> Response {
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                LOG_COMPLETE,
                HeaderValue::from_static(if complete { "true" } else { "false" }),
            ),
        ],
        bytes,
    )
        .into_response()
}

/// `/ray/{cluster}/{session|latest}/…`: Ray's own routes (docs/architecture.md, "Ray's own
/// tools"), for Ray's dashboard (`--proxy-server-url`) and state CLI (`--address`). Errors come
/// in Ray's envelope; a path that is not a data route is a bare 404, so Ray's dashboard serves
/// its own UI files.
async fn answer_ray(
    State(state): State<Arc<AppState>>,
    method: Method,
    Path(path): Path<String>,
    headers: HeaderMap,
    pairs: Pairs,
) -> Response {
    let service = match authorized(&state, &headers) {
        Ok(service) => service,
        Err(refusal) => return *refusal,
    };
    let request = match RayRequest::parse(method.as_str(), &path) {
        Ok(request) => request,
        Err(RayPathError::NotARoute) => return StatusCode::NOT_FOUND.into_response(),
        Err(err @ RayPathError::Cluster(_)) => {
            return ray_error(StatusCode::NOT_FOUND, &err.to_string());
        }
    };
    let pairs = match pairs {
        Ok(Query(pairs)) => pairs,
        Err(rejection) => return ray_error(StatusCode::BAD_REQUEST, &rejection.body_text()),
    };
    // A client that takes gzip gets longer lists, compressed to fit the response limit.
    let answer = if crate::http::accepts_gzip(&headers) {
        service.engine.answer_ray_gzipped(&request, &pairs).await
    } else {
        service.engine.answer_ray(&request, &pairs).await
    };
    match answer {
        Ok(body) => {
            let encoding = body.content_encoding();
            let disposition = body
                .content_disposition()
                .and_then(|value| HeaderValue::from_str(&value).ok());
            let failed = body.failed();
            let mut response = body_response(body.content_type(), body.into_bytes());
            if failed {
                *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            }
            let headers = response.headers_mut();
            if let Some(encoding) = encoding {
                headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static(encoding));
                headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
            }
            if let Some(disposition) = disposition {
                headers.insert(header::CONTENT_DISPOSITION, disposition);
            }
            response
        }
        // Ray's own page for a stored session: a bare 404, so Ray's dashboard serves it.
        Err(QueryError::NotFound(_)) if request.route == RayRoute::Page => {
            StatusCode::NOT_FOUND.into_response()
        }
        Err(err) => ray_error(status_of(&err), &err.to_string()),
    }
}

/// Ray's error body: `{"result": false, "msg": …, "data": {"result": null}}`.
fn ray_error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({"result": false, "msg": message, "data": {"result": null}});
    (status, axum::Json(body)).into_response()
}

fn json_response(body: serde_json::Value) -> Response {
    body_response("application/json", body.to_string().into_bytes())
}

fn body_response(content_type: &'static str, body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response()
}

/// The query service, when the request may use it; otherwise the refusal to send.
fn authorized<'a>(
    state: &'a AppState,
    headers: &HeaderMap,
) -> Result<&'a QueryService, Box<Response>> {
    let Some(service) = &state.query else {
        return Err(Box::new(error_response(
            StatusCode::NOT_FOUND,
            "this function does not serve queries",
        )));
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    match check_bearer(service.token.as_ref(), presented) {
        Ok(()) => {}
        Err(refusal @ BearerRefusal::Missing) => {
            let mut response = error_response(StatusCode::UNAUTHORIZED, refusal.to_string());
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return Err(Box::new(response));
        }
        Err(refusal @ BearerRefusal::Wrong) => {
            return Err(Box::new(error_response(
                StatusCode::FORBIDDEN,
                refusal.to_string(),
            )));
        }
    }
    Ok(service)
}

/// The one place query errors become HTTP statuses (and are logged).
fn status_of(err: &QueryError) -> StatusCode {
    let status = match err {
        QueryError::BadRequest(_) => StatusCode::BAD_REQUEST,
        QueryError::NotFound(_) => StatusCode::NOT_FOUND,
        QueryError::Ambiguous(_) => StatusCode::CONFLICT,
        QueryError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        QueryError::Storage(_) | QueryError::Manifest(_) => StatusCode::BAD_GATEWAY,
        QueryError::DuckDb(_) | QueryError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status.is_server_error() {
        tracing::error!(error = %err, "query failed");
    } else {
        tracing::info!(error = %err, "query refused");
    }
    status
}
