//! `GET /api/clusters`: every cluster and its sessions, from the catalog alone.

use serde_json::{Value as Json, json};

use super::read::params::{Params, Scope};
use super::read::snapshot::session_stats;
use super::{QueryEngine, QueryError};

/// `GET /api/clusters`: every cluster and its sessions, from the catalog alone.
pub(super) async fn clusters(
    engine: &QueryEngine,
    params: &[(String, String)],
) -> Result<Json, QueryError> {
    let params = Params::parse(params, &Scope::PARAMS)?;
    let scope = Scope::from_params(&params)?;
    let clusters = session_stats(&**engine.storage(), &scope).await?;
    let clusters: Vec<Json> = clusters
        .into_iter()
        .map(|(cluster, sessions)| {
            let attempts: u64 = sessions.values().map(|stats| stats.attempts).sum();
            let sessions: Vec<Json> = sessions
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
            json!({"cluster": cluster, "attempts": attempts, "sessions": sessions})
        })
        .collect();
    Ok(json!({ "clusters": clusters }))
}
