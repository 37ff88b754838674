//! `GET /api/clusters`: clusters and their sessions, newest first, a page at a time, from the
//! catalog alone (see [`super::read::catalog::catalog_page`]).

use serde_json::{Value as Json, json};

use super::read::catalog::{catalog_page, cursor_kind};
use super::read::params::{Cursor, Params, Scope};
use super::{QueryEngine, QueryError};

/// The parameters `GET /api/clusters` takes.
const PARAMS: [&str; 4] = ["cluster", "session", "limit", "cursor"];

/// `GET /api/clusters`: a page of at most `limit` sessions, clusters newest first and each
/// cluster's sessions newest first; `next` continues it.
pub(super) async fn clusters(
    engine: &QueryEngine,
    params: &[(String, String)],
) -> Result<Json, QueryError> {
    let params = Params::parse(params, &PARAMS)?;
    let scope = Scope::from_params(&params)?;
    let limit = params.limit()?;
    // A cursor of one cluster's pages has no place among clusters, so each scope takes only
    // its own kind: another is a 400, as a cursor that does not decode is.
    let cursor = params.cursor(cursor_kind(&scope))?;
    let page = catalog_page(engine.storage(), &scope, limit, cursor.as_ref()).await?;
    let clusters: Vec<Json> = page
        .clusters
        .into_iter()
        .map(|paged| {
            let sessions: Vec<Json> = paged
                .sessions
                .into_iter()
                .map(|(session, stats)| {
                    json!({
                        "session_name": session,
                        "attempts": stats.attempts,
                        "first_ms": stats.first_ms,
                        "last_ms": stats.last_ms,
                    })
                })
                .collect();
            json!({
                "cluster": paged.cluster,
                "attempts": paged.attempts,
                "session_count": paged.session_count,
                "sessions": sessions,
            })
        })
        .collect();
    Ok(json!({
        "clusters": clusters,
        "next": page.next.as_ref().map(Cursor::encode),
    }))
}
