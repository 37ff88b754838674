//! `/api/aggregates?by=…`: per group, counts by state and the duration distribution.
//!
//! Durations are bucketed on a fixed 1-2-5 series of upper bounds (1 ms … 50 000 s, then an
//! overflow bucket), the same for every group and every request, so histograms of different
//! rows, pages and sessions line up and add up.

use duckdb::types::Value;
use serde_json::{Map, Value as Json, json};

use super::json::query_rows;
use super::params::{Cursor, Params, TaskFilter};
use super::sql::{Sql, keyset_after, task_conditions};
use super::tasks::{attempts_relation, page_cursor};
use super::{QueryEngine, QueryError};

/// Upper bounds (ms, inclusive) of the duration histogram's buckets; longer is overflow.
pub const BUCKET_BOUNDS_MS: [i64; 24] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000,
    200_000, 500_000, 1_000_000, 2_000_000, 5_000_000, 10_000_000, 20_000_000, 50_000_000,
];

/// The groupings offered: request value → column.
const GROUPINGS: [(&str, &str); 5] = [
    ("name", "name"),
    ("func_or_class_name", "func_or_class_name"),
    ("error_type", "error_type"),
    ("job_id", "job_id"),
    ("node_id", "node_id"),
];

/// Bucket number of `duration_ms`: index into [`BUCKET_BOUNDS_MS`], or its length for overflow.
fn bucket_expression() -> String {
    let mut case = String::from("CASE");
    for (index, bound) in BUCKET_BOUNDS_MS.iter().enumerate() {
        case.push_str(&format!(" WHEN duration_ms <= {bound} THEN {index}"));
    }
    case.push_str(&format!(" ELSE {} END", BUCKET_BOUNDS_MS.len()));
    case
}

/// `GET /api/aggregates`.
pub(super) async fn aggregates(
    engine: &QueryEngine,
    params: &[(String, String)],
) -> Result<Json, QueryError> {
    let mut allowed = TaskFilter::PARAMS.to_vec();
    allowed.extend(["by", "limit", "cursor"]);
    let params = Params::parse(params, &allowed)?;
    let names: Vec<&str> = GROUPINGS.iter().map(|(name, _)| *name).collect();
    let by = params.choice("by", &names, "name")?;
    let column = GROUPINGS
        .iter()
        .find(|(name, _)| *name == by)
        .map_or("name", |(_, column)| *column);
    let filter = TaskFilter::from_params(&params)?;
    let limit = params.limit()?;
    let kind = format!("aggregates:{by}");
    let cursor = params.cursor(&kind)?;
    let Some(relation) = attempts_relation(engine, &filter.scope).await? else {
        return Ok(json!({"by": by, "groups": [], "next": null}));
    };

    // Rows without an error have no error type: they are not a group of errors.
    let mut conditions = task_conditions(&filter);
    if column == "error_type" {
        conditions.push(" AND error_type IS NOT NULL");
    }
    let filtered = format!("SELECT *, coalesce({column}, '') AS group_key FROM {relation}");

    let mut groups = Sql::default();
    groups
        .push("SELECT * FROM (SELECT group_key, count(*) AS total, any_value(type) AS type, ")
        .push("min(duration_ms) AS min, quantile_disc(duration_ms, 0.5) AS p50, ")
        .push("quantile_disc(duration_ms, 0.9) AS p90, quantile_disc(duration_ms, 0.99) AS p99, ")
        .push("max(duration_ms) AS max FROM (")
        .push(&filtered)
        .push(") WHERE ")
        .append(conditions.clone())
        .push(" GROUP BY group_key)");
    if let Some(cursor) = &cursor {
        let [Json::Number(total), Json::String(key)] = cursor.after.as_slice() else {
            return Err(QueryError::BadRequest(
                "`cursor` is not a cursor this route returned".into(),
            ));
        };
        let total = total.as_i64().ok_or_else(|| {
            QueryError::BadRequest("`cursor` is not a cursor this route returned".into())
        })?;
        groups.push(" WHERE ").append(keyset_after(&[
            ("total", Value::BigInt(total), true),
            ("group_key", Value::Text(key.clone()), false),
        ]));
    }
    groups.push(&format!(
        " ORDER BY total DESC, group_key ASC LIMIT {}",
        limit + 1
    ));

    let bucket = bucket_expression();
    let rows = engine
        .run(move |connection| {
            let mut groups_rows = query_rows(connection, &groups.text, &groups.params)?;
            let next = page_cursor(&mut groups_rows, limit, |last| Cursor {
                kind: kind.clone(),
                after: vec![last["total"].clone(), last["group_key"].clone()],
            });
            if groups_rows.is_empty() {
                return Ok((groups_rows, Vec::new(), next));
            }
            let mut detail = Sql::default();
            detail
                .push("SELECT group_key, state, bucket, count(*) AS n FROM (SELECT group_key, state, ")
                .push("CASE WHEN duration_ms IS NULL THEN NULL ELSE ")
                .push(&bucket)
                .push(" END AS bucket FROM (")
                .push(&filtered)
                .push(") WHERE ")
                .append(conditions)
                .push(" AND group_key IN (");
            for (index, group) in groups_rows.iter().enumerate() {
                if index > 0 {
                    detail.push(", ");
                }
                detail.bind(group["group_key"].as_str().unwrap_or_default().to_owned());
            }
            detail.push(")) GROUP BY GROUPING SETS ((group_key, state), (group_key, bucket))");
            let detail_rows = query_rows(connection, &detail.text, &detail.params)?;
            Ok((groups_rows, detail_rows, next))
        })
        .await?;
    let (group_rows, detail_rows, next) = rows;

    let mut groups: Vec<Map<String, Json>> = Vec::with_capacity(group_rows.len());
    for row in &group_rows {
        let key = row["group_key"].as_str().unwrap_or_default();
        let mut group = Map::new();
        group.insert(
            "key".into(),
            if key.is_empty() {
                Json::Null
            } else {
                key.into()
            },
        );
        group.insert("total".into(), row["total"].clone());
        if column == "name" || column == "func_or_class_name" {
            group.insert("type".into(), row["type"].clone());
        }
        let mut by_state = Map::new();
        let mut histogram: Vec<(i64, i64)> = Vec::new();
        for detail in detail_rows
            .iter()
            .filter(|detail| detail["group_key"].as_str() == Some(key))
        {
            let count = detail["n"].as_i64().unwrap_or(0);
            if let Some(state) = detail["state"].as_str() {
                by_state.insert(state.to_owned(), count.into());
            } else if let Some(bucket) = detail["bucket"].as_i64() {
                histogram.push((bucket, count));
            }
        }
        histogram.sort_unstable();
        let histogram: Vec<Json> = histogram
            .into_iter()
            .map(|(bucket, count)| {
                let le = usize::try_from(bucket)
                    .ok()
                    .and_then(|index| BUCKET_BOUNDS_MS.get(index));
                json!({"le": le, "count": count})
            })
            .collect();
        group.insert("by_state".into(), Json::Object(by_state));
        group.insert(
            "duration_ms".into(),
            json!({
                "min": row["min"], "p50": row["p50"], "p90": row["p90"],
                "p99": row["p99"], "max": row["max"], "histogram": histogram,
            }),
        );
        groups.push(group);
    }
    Ok(json!({"by": by, "groups": groups, "next": next}))
}
