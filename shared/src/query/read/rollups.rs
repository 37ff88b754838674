//! Rollups (see [`crate::tables::rollup`]) read instead of the attempts, for the filters they
//! keep apart: scope, job, state, type, and whether the definition was exported. Within a time
//! range, a session created wholly inside it is counted by its rollups' dated rows, and the
//! others by the same rows computed from their attempts created in it
//! ([`super::sql::Relation::rollups_within`]).
//!
//! Counts add up exactly, and so do the extremes (shortest and longest duration, first and last
//! time) while a newest row still holds them; when none does ([`known`] says so), the reader
//! finds that extreme alone by a scan of its columns.

use serde::Deserialize;

use super::params::TaskFilter;
use super::sql::{Relation, Sql, kind_conditions};
use crate::tables::rollup::GROUPINGS;

/// True when rollups keep apart everything `filter` selects by, and `grouping` (a column)
/// if there is one.
pub(crate) fn answer(filter: &TaskFilter, grouping: Option<&str>) -> bool {
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
        && search.is_none()
        && error_fingerprint.is_none()
        && min_attempt.is_none()
        && min_duration_ms.is_none()
        && min_wait_ms.is_none()
        && !latest_attempt
}

/// The rollup rows of one grouping that `filter` selects (the session scope chose the files).
pub(crate) fn rows_of(rollups: &Relation, grouping: &'static str, filter: &TaskFilter) -> Sql {
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
pub(crate) fn extremes(level: &'static str) -> Sql {
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
pub(crate) struct Extremes {
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
pub(crate) fn known(value: Option<i64>, live: Option<i64>) -> Result<Option<i64>, ()> {
    match value {
        None => Ok(None),
        Some(value) if live.unwrap_or(0) > 0 => Ok(Some(value)),
        Some(_) => Err(()),
    }
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
