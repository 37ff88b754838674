//! `/api/aggregates?by=…`: per group, counts by state and the duration distribution.
//!
//! One scan groups the rows by (group, state, duration rounded *up* to two significant digits)
//! and counts them (or the rollups hold those counts already, see `read::rollups`);
//! everything else is computed from that small result. Rounding up keeps the
//! histogram exact: its buckets are a fixed 1-2-5 series of inclusive upper bounds (1 ms …
//! 50 000 s, then overflow), each a multiple of the rounding step of every duration below it,
//! so a rounded duration is within a bound exactly when the duration is. Percentiles come from
//! the rounded values, so they are upper bounds within 10 % (5 % typically) of the exact ones; min
//! and max are exact. Exact percentiles would need a sort per group, where this is a hash
//! aggregate. The buckets line up across groups, pages and sessions, so histograms add up.

use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use super::read::attempts::filtered_relation;
use super::read::counts::{Counted, counted};
use super::read::json::query_as;
use super::read::page::page_cursor;
use super::read::params::{Cursor, Params, TaskFilter};
use super::read::rollups::{Extremes, extremes, known, rows_of};
use super::read::sql::{Relation, Sql, task_conditions};
use super::{QueryEngine, QueryError};
use crate::tables::rollup::{GROUPINGS, ROUNDED_DURATION};

/// Upper bounds (ms, inclusive) of the duration histogram's buckets; longer is overflow.
pub const BUCKET_BOUNDS_MS: [i64; 24] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000,
    200_000, 500_000, 1_000_000, 2_000_000, 5_000_000, 10_000_000, 20_000_000, 50_000_000,
];

/// One group's numbers, built from its rows of the grouped scan.
#[derive(Debug, Default)]
struct Group {
    total: i64,
    task_type: Json,
    by_state: Map<String, Json>,
    /// (rounded duration, count), for attempts that have a duration.
    durations: Vec<(i64, i64)>,
    min: Option<i64>,
    max: Option<i64>,
}

/// One cell of the aggregation: a group's attempts of one state and rounded duration.
#[derive(Debug, Deserialize)]
struct GroupRow {
    /// The group (`''` for none).
    group_key: String,
    /// Their state.
    state: Option<String>,
    /// Their rounded duration.
    rounded: Option<i64>,
    /// How many.
    n: i64,
    /// A type among them.
    #[serde(rename = "type")]
    task_type: Option<String>,
    /// Shortest duration (from rollups: of the whole group).
    #[serde(default)]
    min: Option<i64>,
    /// Longest duration (from rollups: of the whole group).
    #[serde(default)]
    max: Option<i64>,
}

impl Group {
    fn add(&mut self, row: &GroupRow) {
        let count = row.n;
        self.total += count;
        if self.task_type.is_null()
            && let Some(task_type) = &row.task_type
        {
            self.task_type = Json::String(task_type.clone());
        }
        if let Some(state) = &row.state {
            let before = self
                .by_state
                .get(state.as_str())
                .and_then(Json::as_i64)
                .unwrap_or(0);
            self.by_state.insert(state.clone(), (before + count).into());
        }
        if let Some(rounded) = row.rounded {
            self.durations.push((rounded, count));
        }
        if let Some(min) = row.min {
            self.min = Some(self.min.map_or(min, |old| old.min(min)));
        }
        if let Some(max) = row.max {
            self.max = Some(self.max.map_or(max, |old| old.max(max)));
        }
    }

    /// The rounded duration at quantile `q` (the smallest value whose cumulative count reaches
    /// `q` of all, as `quantile_disc` picks).
    fn quantile(durations: &[(i64, i64)], with_duration: i64, q: f64) -> Option<i64> {
        let rank = ((with_duration as f64) * q).ceil().max(1.0) as i64;
        let mut seen = 0;
        durations.iter().find_map(|(value, count)| {
            seen += count;
            (seen >= rank).then_some(*value)
        })
    }

    fn duration_json(mut self) -> Json {
        self.durations.sort_unstable();
        let with_duration: i64 = self.durations.iter().map(|(_, count)| count).sum();
        let mut histogram: Vec<(Option<i64>, i64)> = Vec::new();
        for (value, count) in &self.durations {
            let le = BUCKET_BOUNDS_MS
                .iter()
                .copied()
                .find(|bound| value <= bound);
            match histogram.last_mut() {
                Some((last, total)) if *last == le => *total += count,
                _ => histogram.push((le, *count)),
            }
        }
        let quantile = |q| Self::quantile(&self.durations, with_duration, q);
        json!({
            "min": self.min, "p50": quantile(0.5), "p90": quantile(0.9), "p99": quantile(0.99),
            "max": self.max,
            "histogram": histogram.into_iter()
                .map(|(le, count)| json!({"le": le, "count": count}))
                .collect::<Vec<_>>(),
        })
    }
}

/// `GET /api/aggregates`.
pub(super) async fn aggregates(
    engine: &QueryEngine,
    params: &[(String, String)],
) -> Result<Json, QueryError> {
    let mut allowed = TaskFilter::PARAMS.to_vec();
    allowed.extend(["by", "limit", "cursor"]);
    let params = Params::parse(params, &allowed)?;
    // The groupings offered are the columns rollups group by, named as they are.
    let column = params.choice("by", &GROUPINGS, "name")?;
    let filter = TaskFilter::from_params(&params)?;
    let limit = params.limit()?;
    let kind = format!("aggregates:{column}");
    let after = match params.cursor(&kind)? {
        None => None,
        Some(cursor) => Some(group_position(&cursor.after)?),
    };
    let rows = match counted(engine, &filter, Some(column)).await? {
        None => return Ok(json!({"by": column, "groups": [], "next": null})),
        Some(Counted::Rollups(rollups)) => rollup_cells(engine, &rollups, &filter, column).await?,
        Some(Counted::Attempts(attempts)) => {
            scanned_cells(engine, &attempts, &filter, column).await?
        }
    };

    let mut by_key: std::collections::BTreeMap<String, Group> = Default::default();
    for row in &rows {
        by_key.entry(row.group_key.clone()).or_default().add(row);
    }
    // Largest groups first, then by key: the order the cursor continues.
    let mut ordered: Vec<(String, Group)> = by_key
        .into_iter()
        .filter(|(key, group)| match &after {
            None => true,
            Some((total, after_key)) => {
                group.total < *total || (group.total == *total && key > after_key)
            }
        })
        .collect();
    ordered.sort_by(|(a_key, a), (b_key, b)| b.total.cmp(&a.total).then_with(|| a_key.cmp(b_key)));
    ordered.truncate(limit + 1);

    let mut page: Vec<Map<String, Json>> = ordered
        .into_iter()
        .map(|(key, group)| {
            let mut out = Map::new();
            out.insert("group_key".into(), key.clone().into());
            out.insert(
                "key".into(),
                if key.is_empty() {
                    Json::Null
                } else {
                    key.into()
                },
            );
            out.insert("total".into(), group.total.into());
            if column == "name" || column == "func_or_class_name" {
                out.insert("type".into(), group.task_type.clone());
            }
            out.insert("by_state".into(), Json::Object(group.by_state.clone()));
            out.insert("duration_ms".into(), group.duration_json());
            out
        })
        .collect();
    let next = page_cursor(&mut page, limit, |last| Cursor {
        kind: kind.clone(),
        after: vec![last["total"].clone(), last["group_key"].clone()],
    });
    for group in &mut page {
        group.remove("group_key");
    }
    Ok(json!({"by": column, "groups": page, "next": next}))
}

/// A group cursor's values, checked: `[total, group key]`.
fn group_position(after: &[Json]) -> Result<(i64, String), QueryError> {
    let invalid = || QueryError::BadRequest("`cursor` is not a cursor this route returned".into());
    let [Json::Number(total), Json::String(key)] = after else {
        return Err(invalid());
    };
    Ok((total.as_i64().ok_or_else(invalid)?, key.clone()))
}

/// The cells of the aggregation by `column`, by scanning the attempts.
async fn scanned_cells(
    engine: &QueryEngine,
    relation: &Relation,
    filter: &TaskFilter,
    column: &'static str,
) -> Result<Vec<GroupRow>, QueryError> {
    // Rows without an error have no error type: they are not a group of errors.
    let mut conditions = task_conditions(filter);
    if column == "error_type" {
        conditions.push(" AND error_type IS NOT NULL");
    }
    let mut sql = Sql::default();
    sql.push("SELECT coalesce(")
        .push(column)
        .push(", '') AS group_key, state, ")
        .push(&ROUNDED_DURATION)
        .push(" AS rounded, count(*) AS n, any_value(type) AS type, ")
        .push("min(duration_ms) AS min, max(duration_ms) AS max FROM ")
        .relation(relation)
        .push(" WHERE ")
        .append(conditions)
        .push(" GROUP BY ALL");
    engine
        .run(move |connection| query_as(connection, &sql.text, &sql.params))
        .await
}

/// The cells of the aggregation by `column` (one of [`GROUPINGS`]) from `rollups` (see
/// [`counted`]), each carrying its group's shortest and longest duration.
async fn rollup_cells(
    engine: &QueryEngine,
    rollups: &Relation,
    filter: &TaskFilter,
    column: &'static str,
) -> Result<Vec<GroupRow>, QueryError> {
    let mut rows = rows_of(rollups, column, filter);
    // Rows without an error have no error type: they are not a group of errors.
    if column == "error_type" {
        let mut narrowed = Sql::default();
        narrowed
            .push("(SELECT * FROM ")
            .append(rows)
            .push(" WHERE group_key IS NOT NULL)");
        rows = narrowed;
    }
    let mut cells = Sql::default();
    cells
        .push(
            "SELECT coalesce(group_key, '') AS group_key, state, rounded, \
             sum(sign * n)::BIGINT AS n, any_value(type) FILTER (WHERE sign > 0) AS type FROM ",
        )
        .append(rows.clone())
        .push(" GROUP BY ALL HAVING sum(sign * n) <> 0");
    let mut ends = Sql::default();
    ends.push("WITH r AS (SELECT coalesce(group_key, '') AS key, * FROM ")
        .append(rows)
        .push(") ")
        .append(extremes("key"));
    let (mut cells, ends) = engine
        .run(move |connection| {
            let cells: Vec<GroupRow> = query_as(connection, &cells.text, &cells.params)?;
            let ends: Vec<Extremes> = query_as(connection, &ends.text, &ends.params)?;
            Ok((cells, ends))
        })
        .await?;
    let mut by_group = std::collections::HashMap::new();
    let mut unknown = Vec::new();
    for ends in ends {
        let group = ends.level.unwrap_or_default();
        match (
            known(ends.min, ends.min_live),
            known(ends.max, ends.max_live),
        ) {
            (Ok(min), Ok(max)) => {
                by_group.insert(group, (min, max));
            }
            _ => unknown.push(group),
        }
    }
    if !unknown.is_empty() {
        by_group.extend(scanned_durations(engine, filter, column, unknown).await?);
    }
    for cell in &mut cells {
        (cell.min, cell.max) = by_group.get(&cell.group_key).copied().unwrap_or_default();
    }
    engine.count_rollup_answer();
    Ok(cells)
}

/// The shortest and longest durations of `groups` (by `column`) among the attempts `filter`
/// selects, by a scan: for groups where every version at a rolled-up extreme was superseded.
async fn scanned_durations(
    engine: &QueryEngine,
    filter: &TaskFilter,
    column: &'static str,
    groups: Vec<String>,
) -> Result<Vec<(String, (Option<i64>, Option<i64>))>, QueryError> {
    tracing::info!(
        groups = groups.len(),
        "every version at a duration extreme was superseded; scanning for it"
    );
    let Some(attempts) = filtered_relation(engine, filter).await? else {
        return Ok(Vec::new());
    };
    let mut sql = Sql::default();
    sql.push("SELECT coalesce(")
        .push(column)
        .push(", '') AS group_key, min(duration_ms) AS min, max(duration_ms) AS max FROM ")
        .relation(&attempts)
        .push(" WHERE ")
        .append(task_conditions(filter));
    if column == "error_type" {
        sql.push(" AND error_type IS NOT NULL");
    }
    sql.push(" AND coalesce(")
        .push(column)
        .push(", '') IN ")
        .bind_list(&groups)
        .push(" GROUP BY 1");
    /// One group's durations.
    #[derive(Deserialize)]
    struct Durations {
        group_key: String,
        min: Option<i64>,
        max: Option<i64>,
    }
    let rows: Vec<Durations> = engine
        .run(move |connection| query_as(connection, &sql.text, &sql.params))
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.group_key, (row.min, row.max)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_pick_like_quantile_disc() {
        let durations = [(10, 1), (20, 2), (30, 1)];
        assert_eq!(Group::quantile(&durations, 4, 0.5), Some(20));
        assert_eq!(Group::quantile(&durations, 4, 0.25), Some(10));
        assert_eq!(Group::quantile(&durations, 4, 0.99), Some(30));
        assert_eq!(Group::quantile(&[], 0, 0.5), None);
    }

    #[test]
    fn rounding_up_never_moves_a_duration_across_a_bucket_bound()
    -> Result<(), Box<dyn std::error::Error>> {
        let connection = crate::tables::open_duckdb()?;
        let mut durations: Vec<i64> = vec![-5, 0, 99, 100, 101, 12_345, 987_654_321];
        for bound in BUCKET_BOUNDS_MS {
            durations.extend([bound - 1, bound, bound + 1, bound * 3 + 7]);
        }
        let values: Vec<String> = durations.iter().map(|d| format!("({d})")).collect();
        let sql = format!(
            "SELECT duration_ms, {} FROM (VALUES {}) t(duration_ms)",
            *ROUNDED_DURATION,
            values.join(", ")
        );
        let mut statement = connection.prepare(&sql)?;
        let rows =
            statement.query_map([], |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)))?;
        for row in rows {
            let (duration, rounded) = row?;
            assert!(rounded >= duration, "{duration} rounded down to {rounded}");
            assert!(
                (rounded - duration) * 10 <= duration.max(100),
                "{duration} → {rounded}"
            );
            for bound in BUCKET_BOUNDS_MS {
                assert_eq!(
                    duration <= bound,
                    rounded <= bound,
                    "{duration} → {rounded}, bound {bound}"
                );
            }
        }
        Ok(())
    }
}
