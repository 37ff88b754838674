//! `GET /api/...`: the dashboard API onto [`QueryEngine::answer`], behind an optional bearer
//! token. On AWS, API Gateway's IAM authorizer guards these routes; the token is for `serve`
//! off loopback and for deployments that choose bearer mode.

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use shared::auth::AccessToken;
use shared::query::{ApiRoute, QueryEngine, QueryError};
use shared::tables::entities::EntityKind;

use crate::http::{AppState, error_response};

/// The query engine and who may use it.
#[derive(Debug)]
pub struct QueryService {
    /// Answers requests.
    pub engine: QueryEngine,
    /// When set, every request must carry `Authorization: Bearer <token>`.
    pub token: Option<AccessToken>,
}

type Pairs = Result<Query<Vec<(String, String)>>, QueryRejection>;

/// The dashboard API's routes.
pub fn routes() -> Router<Arc<AppState>> {
    fn fixed(route: ApiRoute) -> axum::routing::MethodRouter<Arc<AppState>> {
        get(
            move |State(state): State<Arc<AppState>>, headers: HeaderMap, pairs: Pairs| async move {
                answer(&state, route, &headers, pairs).await
            },
        )
    }
    let mut router = Router::new()
        .route("/api/clusters", fixed(ApiRoute::Clusters))
        .route("/api/summary", fixed(ApiRoute::Summary))
        .route("/api/aggregates", fixed(ApiRoute::Aggregates))
        .route("/api/tasks", fixed(ApiRoute::Tasks))
        .route("/api/timeline", fixed(ApiRoute::Timeline))
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
    let Some(service) = &state.query else {
        return error_response(
            StatusCode::NOT_FOUND,
            "this function does not serve queries",
        );
    };
    if let Some(token) = &service.token {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        match presented {
            None => {
                let mut response = error_response(
                    StatusCode::UNAUTHORIZED,
                    "this API requires `Authorization: Bearer <AFTERGLOW_QUERY_TOKEN>`",
                );
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return response;
            }
            Some(presented) if !token.matches(presented) => {
                return error_response(StatusCode::FORBIDDEN, "wrong bearer token");
            }
            Some(_) => {}
        }
    }
    let pairs = match pairs {
        Ok(Query(pairs)) => pairs,
        Err(rejection) => return error_response(StatusCode::BAD_REQUEST, rejection.body_text()),
    };
    match service.engine.answer(&route, &pairs).await {
        Ok(body) => {
            let mut response = (StatusCode::OK, axum::Json(body)).into_response();
            response
                .headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        Err(err) => query_error_response(&err),
    }
}

/// The one place query errors become HTTP statuses.
fn query_error_response(err: &QueryError) -> Response {
    let status = match err {
        QueryError::BadRequest(_) => StatusCode::BAD_REQUEST,
        QueryError::NotFound(_) => StatusCode::NOT_FOUND,
        QueryError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        QueryError::Storage(_) | QueryError::Manifest(_) => StatusCode::BAD_GATEWAY,
        QueryError::DuckDb(_) | QueryError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status.is_server_error() {
        tracing::error!(error = %err, "query failed");
    } else {
        tracing::info!(error = %err, "query refused");
    }
    error_response(status, err.to_string())
}
