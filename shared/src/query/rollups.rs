//! The summary and the aggregates from rollups (see [`crate::tables::rollup`]) instead of a
//! scan, for the filters rollups keep apart: scope, job, state, type, and whether the
//! definition was exported.
//!
//! Counts add up exactly, and so do the extremes (shortest and longest duration, first and last
//! time) while a newest row still holds them; when none does, that extreme alone is found by
//! a scan of its columns.

use serde::Deserialize;

use super::aggregates::GroupRow;
use super::json::query_as;
use super::params::TaskFilter;
use super::sql::{Relation, Sql, kind_conditions, task_conditions};
use super::tasks::{Summary, filtered_relation};
use super::{QueryEngine, QueryError};
use crate::tables::rollup::{GROUPINGS, TOTALS};

/// True when rollups keep apart everything `filter` selects by, and `grouping` (a column)
/// if there is one.
pub(super) fn answer(filter: &TaskFilter, grouping: Option<&str>) -> bool {
    let TaskFilter {
        scope: _,
        job_id: _,
        states: _,
        task_type: _,
        include_drivers: _,
        include_incomplete: _,
        name,
        func_or_class_name,
        error_type,
        node_id,
        worker_id,
        actor_id,
        parent_task_id,
        since_ms,
        until_ms,
        search,
        error_fingerprint,
        min_attempt,
        min_duration_ms,
        min_wait_ms,
        latest_attempt,
    } = filter;
    grouping.is_none_or(|column| GROUPINGS.contains(&column))
        && name.is_none()
        && func_or_class_name.is_none()
        && error_type.is_none()
        && node_id.is_none()
        && worker_id.is_none()
        && actor_id.is_none()
        && parent_task_id.is_none()
        && since_ms.is_none()
        && until_ms.is_none()
        && search.is_none()
        && error_fingerprint.is_none()
        && min_attempt.is_none()
        && min_duration_ms.is_none()
        && min_wait_ms.is_none()
        && !latest_attempt
}

/// The rollup rows of one grouping that `filter` selects (the session scope chose the files).
fn rows_of(rollups: &Relation, grouping: &'static str, filter: &TaskFilter) -> Sql {
    let mut sql = Sql::default();
    sql.push("(SELECT * FROM ")
        .relation(rollups)
        .push(" WHERE grouping = '")
        .push(grouping)
        .push("'")
        .append(kind_conditions(filter, "complete"))
        .push(")");
    sql
}

/// The extremes over the rollup rows `rows` (an `r` relation) by `level`: for each, the smallest
/// duration `min`, the largest `max`, the earliest creation `first_ms` and the latest time
/// `last_ms` of every stored version, each with `…_live`, how many of the newest rows hold
/// it (see [`crate::tables::rollup`]: plus rows counted at it less minus rows counted at it).
pub(super) fn extremes(level: &'static str) -> Sql {
    let mut sql = Sql::default();
    sql.push(
        "SELECT level, min, max, first_ms, last_ms, \
         (sum(sign * d_min_n) FILTER (WHERE d_min = min))::BIGINT AS min_live, \
         (sum(sign * d_max_n) FILTER (WHERE d_max = max))::BIGINT AS max_live, \
         (sum(sign * c_min_n) FILTER (WHERE c_min = first_ms))::BIGINT AS first_ms_live, \
         (sum(sign * l_max_n) FILTER (WHERE l_max = last_ms))::BIGINT AS last_ms_live \
         FROM (SELECT *, ",
    )
    .push(level)
    .push(
        " AS level, \
             min(CASE WHEN sign > 0 THEN d_min END) OVER level AS min, \
             max(CASE WHEN sign > 0 THEN d_max END) OVER level AS max, \
             min(CASE WHEN sign > 0 THEN c_min END) OVER level AS first_ms, \
             max(CASE WHEN sign > 0 THEN l_max END) OVER level AS last_ms \
             FROM r WINDOW level AS (PARTITION BY ",
    )
    .push(level)
    .push(")) GROUP BY ALL");
    sql
}

/// One level's extremes, as [`extremes`] selects them.
#[derive(Debug, Deserialize)]
pub(super) struct Extremes {
    /// The level's value.
    pub level: Option<String>,
    /// The smallest measure.
    pub min: Option<i64>,
    /// Newest rows holding it.
    pub min_live: Option<i64>,
    /// The largest measure.
    pub max: Option<i64>,
    /// Newest rows holding it.
    pub max_live: Option<i64>,
    /// The earliest creation.
    pub first_ms: Option<i64>,
    /// Newest rows holding it.
    pub first_ms_live: Option<i64>,
    /// The latest time.
    pub last_ms: Option<i64>,
    /// Newest rows holding it.
    pub last_ms_live: Option<i64>,
}

/// `value` if a newest row still holds it; `Err(())` if none does (the next one is unknown).
pub(super) fn known(value: Option<i64>, live: Option<i64>) -> Result<Option<i64>, ()> {
    match value {
        None => Ok(None),
        Some(value) if live.unwrap_or(0) > 0 => Ok(Some(value)),
        Some(_) => Err(()),
    }
}

/// The summary from `rollups` (see [`super::tasks::counted`]).
pub(super) async fn summary(
    engine: &QueryEngine,
    rollups: &Relation,
    filter: &TaskFilter,
) -> Result<Summary, QueryError> {
    let rows = rows_of(rollups, TOTALS, filter);
    let mut counts = Sql::default();
    counts
        .push("SELECT state, sum(sign * n)::BIGINT AS n FROM ")
        .append(rows.clone())
        .push(" GROUP BY state HAVING sum(sign * n) <> 0 ORDER BY state");
    let mut ends = Sql::default();
    ends.push("WITH r AS ")
        .append(rows)
        .push(" ")
        .append(extremes("NULL::VARCHAR"));
    /// One state's attempts.
    #[derive(Deserialize)]
    struct StateCount {
        state: Option<String>,
        n: i64,
    }
    let (states, ends) = engine
        .run(move |connection| {
            let states: Vec<StateCount> = query_as(connection, &counts.text, &counts.params)?;
            let ends: Vec<Extremes> = query_as(connection, &ends.text, &ends.params)?;
            Ok((states, ends))
        })
        .await?;
    let (first_ms, last_ms) = match ends.first() {
        None => (None, None),
        Some(ends) => match (
            known(ends.first_ms, ends.first_ms_live),
            known(ends.last_ms, ends.last_ms_live),
        ) {
            (Ok(first_ms), Ok(last_ms)) => (first_ms, last_ms),
            _ => scanned_span(engine, filter).await?,
        },
    };
    engine.count_rollup_answer();
    Ok(Summary {
        by_state: states.into_iter().map(|row| (row.state, row.n)).collect(),
        first_ms,
        last_ms,
    })
}

/// The cells of the aggregation by `column` (one of [`GROUPINGS`]) from `rollups` (see
/// [`super::tasks::counted`]), each carrying its group's shortest and longest duration.
pub(super) async fn group_cells(
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

/// The earliest creation and latest time of the attempts `filter` selects, by a scan of
/// those columns: for when every version at a rolled-up extreme was superseded.
async fn scanned_span(
    engine: &QueryEngine,
    filter: &TaskFilter,
) -> Result<(Option<i64>, Option<i64>), QueryError> {
    tracing::info!("every version at a time extreme was superseded; scanning for it");
    let Some(attempts) = filtered_relation(engine, filter).await? else {
        return Ok((None, None));
    };
    let mut sql = Sql::default();
    sql.push(
        "SELECT min(creation_time_ms) AS first_ms, \
         greatest(max(creation_time_ms), max(start_time_ms), max(end_time_ms)) AS last_ms FROM ",
    )
    .relation(&attempts)
    .push(" WHERE ")
    .append(task_conditions(filter));
    /// The span.
    #[derive(Deserialize)]
    struct Span {
        first_ms: Option<i64>,
        last_ms: Option<i64>,
    }
    let span: Vec<Span> = engine
        .run(move |connection| query_as(connection, &sql.text, &sql.params))
        .await?;
    Ok(span
        .first()
        .map_or((None, None), |span| (span.first_ms, span.last_ms)))
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
    fn an_extreme_is_known_while_a_newest_row_holds_it() {
        assert_eq!(known(Some(5), Some(1)), Ok(Some(5)));
        assert_eq!(known(Some(5), Some(0)), Err(()));
        assert_eq!(known(Some(5), None), Err(()));
        assert_eq!(known(None, None), Ok(None));
    }
}
