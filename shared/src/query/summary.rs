//! `GET /api/summary`: attempt counts by state, the total and the time span, counted from
//! rollups when they answer the filter (see `read::counts`).

use serde_json::{Map, Value as Json, json};

use super::read::counts::summarized;
use super::read::params::{Params, TaskFilter};
use super::{QueryEngine, QueryError};

/// `GET /api/summary`: attempt counts by state, the total and the time span.
pub(super) async fn summary(
    engine: &QueryEngine,
    params: &[(String, String)],
) -> Result<Json, QueryError> {
    let params = Params::parse(params, &TaskFilter::PARAMS)?;
    let filter = TaskFilter::from_params(&params)?;
    let Some(summary) = summarized(engine, &filter).await? else {
        return Ok(json!({"total": 0, "by_state": {}, "first_ms": null, "last_ms": null}));
    };
    let mut by_state = Map::new();
    let mut total = 0_i64;
    for (state, n) in summary.by_state {
        total += n;
        if let Some(state) = state {
            by_state.insert(state, n.into());
        }
    }
    Ok(json!({
        "total": total, "by_state": by_state,
        "first_ms": summary.first_ms, "last_ms": summary.last_ms,
    }))
}
