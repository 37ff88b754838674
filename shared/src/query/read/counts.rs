//! Counting attempts: attempts by state with their first and last time, what the summary shows
//! and what Ray's task list gives as its `total`. The rollups of the files in scope answer when
//! they keep apart what the filter selects by; otherwise the attempts are scanned.

use std::path::PathBuf;

use serde::Deserialize;

use super::attempts::{filtered_relation, newest_of};
use super::json::query_as;
use super::params::TaskFilter;
use super::rollups::{self, Extremes, extremes, known, rows_of};
use super::snapshot::Needs;
use super::sql::{Relation, Sql, read_parquet, task_conditions};
use crate::query::{QueryEngine, QueryError};
use crate::tables::rollup::{CLUSTER_GROUPINGS, TOTALS};

/// What a counting route reads for `filter`: the rollups of its files when they answer it,
/// else the attempts themselves.
pub(crate) enum Counted {
    /// The rollups (see [`rollups`]); the attempts files are not even fetched.
    Rollups(Relation),
    /// The attempts (as [`filtered_relation`]).
    Attempts(Relation),
}

/// See [`Counted`]: rollups when they keep apart what `filter` selects by and what the route
/// groups by (`grouping`, a column, if any); `None` when no session in scope has attempts. The
/// route reads the rollups' summary set, or `grouping`'s.
pub(crate) async fn counted(
    engine: &QueryEngine,
    filter: &TaskFilter,
    grouping: Option<&str>,
) -> Result<Option<Counted>, QueryError> {
    let reads = [grouping.unwrap_or(TOTALS)];
    counted_reading(engine, filter, grouping, &reads).await
}

/// [`counted`] for a route that reads the rollups' grouping sets `reads`.
pub(crate) async fn counted_reading(
    engine: &QueryEngine,
    filter: &TaskFilter,
    grouping: Option<&str>,
    reads: &[&str],
) -> Result<Option<Counted>, QueryError> {
    if rollups::answer(filter, grouping) {
        let snapshot = engine
            .snapshot(
                &filter.scope,
                Needs {
                    rollups: true,
                    cluster_rollups: reads.iter().all(|set| CLUSTER_GROUPINGS.contains(set)),
                    ..Needs::default()
                },
            )
            .await?;
        let created = filter.scope.created;
        let ranged = !created.is_unbounded();
        // In a range, the sessions not counted by their rollups are scanned into the same
        // rows; when none is, the attempts answer as they are.
        let scanned = ranged.then(|| newest_of(&snapshot)).flatten();
        if ranged && snapshot.rollups.as_ref().is_some_and(Vec::is_empty) {
            return Ok(scanned.map(Counted::Attempts));
        }
        if let Some(paths) = snapshot
            .rollups
            .as_deref()
            .filter(|paths| !paths.is_empty())
        {
            let paths: Vec<&std::path::Path> = paths.iter().map(PathBuf::as_path).collect();
            let rollups = read_parquet(&paths, "");
            // A rollup that cannot be read (damaged in the bucket) must not fail every count
            // of its session until the next fold rewrites it: the attempts answer instead.
            // Binding the read opens every footer (DuckDB caches them).
            let bound = format!("SELECT * FROM {rollups} LIMIT 0");
            match engine
                .run(move |connection| Ok(connection.prepare(&bound).map(drop)?))
                .await
            {
                Ok(()) if ranged => {
                    return Ok(Some(Counted::Rollups(Relation::rollups_within(
                        rollups,
                        scanned.as_ref(),
                        created,
                        reads,
                        snapshot.pins.clone(),
                    ))));
                }
                Ok(()) => {
                    return Ok(Some(Counted::Rollups(Relation::over_files(
                        rollups,
                        snapshot.pins.clone(),
                    ))));
                }
                Err(err @ QueryError::DuckDb(_)) => {
                    tracing::warn!(error = %err, "rollups not read; the attempts are counted");
                }
                // A timeout or a broken pool is no reason to scan: the scan would fare worse.
                Err(err) => return Err(err),
            }
        }
    }
    Ok(filtered_relation(engine, filter)
        .await?
        .map(Counted::Attempts))
}

/// The summary of the attempts `filter` selects, from rollups when they answer it; `None`
/// when no session in scope has attempts.
pub(crate) async fn summarized(
    engine: &QueryEngine,
    filter: &TaskFilter,
) -> Result<Option<Summary>, QueryError> {
    Ok(match counted(engine, filter, None).await? {
        None => None,
        Some(Counted::Rollups(rollups)) => Some(rollup_summary(engine, &rollups, filter).await?),
        Some(Counted::Attempts(attempts)) => {
            Some(scanned_summary(engine, &attempts, filter).await?)
        }
    })
}

/// How many attempts `filter` selects, counted as the summary counts them.
pub(crate) async fn attempts_counted(
    engine: &QueryEngine,
    filter: &TaskFilter,
) -> Result<u64, QueryError> {
    let total: i64 = summarized(engine, filter)
        .await?
        .map_or(0, |summary| summary.by_state.iter().map(|(_, n)| n).sum());
    Ok(u64::try_from(total).unwrap_or(0))
}

/// The summary's numbers: attempts by state, first and last time.
pub(crate) struct Summary {
    /// (state, attempts), states with none left out.
    pub by_state: Vec<(Option<String>, i64)>,
    /// Earliest creation time.
    pub first_ms: Option<i64>,
    /// Latest time of any attempt.
    pub last_ms: Option<i64>,
}

/// The summary by scanning the attempts.
async fn scanned_summary(
    engine: &QueryEngine,
    relation: &Relation,
    filter: &TaskFilter,
) -> Result<Summary, QueryError> {
    let mut sql = Sql::default();
    sql.push("SELECT state, count(*) AS n, min(creation_time_ms) AS first_ms, ")
        // The maximum of each column, not of a per-row `greatest`: the same value, one pass
        // over three columns instead of an expression per row.
        .push("greatest(max(creation_time_ms), max(start_time_ms), max(end_time_ms)) AS last_ms FROM ")
        .relation(relation)
        .push(" WHERE ")
        .append(task_conditions(filter))
        .push(" GROUP BY state ORDER BY state");
    /// One state's attempts.
    #[derive(serde::Deserialize)]
    struct StateCount {
        state: Option<String>,
        n: i64,
        first_ms: Option<i64>,
        last_ms: Option<i64>,
    }
    let rows: Vec<StateCount> = engine
        .run(move |connection| query_as(connection, &sql.text, &sql.params))
        .await?;
    Ok(Summary {
        first_ms: rows.iter().filter_map(|row| row.first_ms).min(),
        last_ms: rows.iter().filter_map(|row| row.last_ms).max(),
        by_state: rows.into_iter().map(|row| (row.state, row.n)).collect(),
    })
}

/// The summary from `rollups` (see [`counted`]).
async fn rollup_summary(
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
