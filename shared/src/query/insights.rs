//! `GET /api/insights`: what went wrong, before anyone reads a table.
//!
//! Each finding names the attempts behind it as `filter`, the `/api/tasks` parameters that list
//! exactly its `count` attempts (the request's own filters included), so a click on a finding
//! shows them.
//!
//! The detectors read rollup rows (see [`crate::tables::rollup`]): the rollups of the session's
//! files when they keep apart what the request filters by, else the same rows computed by one
//! scan of the attempts. Medians are of durations (and waits) rounded up to two significant
//! digits, and thresholds fall where rounded values split
//! ([`rollup::rounding_bound`]), so a count read from rounded values is exact.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use duckdb::types::Value;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value as Json, json};

use super::read::attempts::filtered_relation;
use super::read::counts::{Counted, counted_reading};
use super::read::json::query_as;
use super::read::params::{Params, TaskFilter};
use super::read::rollups::{Extremes, extremes, known};
use super::read::sql::{Relation, Sql, kind_conditions, task_conditions};
use super::{QueryEngine, QueryError};
use crate::tables::rollup::{self, FAILURES, INSIGHTS, WAITS, WORKERS};

/// Failure clusters reported at most.
const MAX_CLUSTERS: usize = 10;

/// A running time this many times its function's median makes a straggler…
const STRAGGLER_FACTOR: i64 = 3;
/// …and at least this much longer than the median (sub-second noise is no finding).
const STRAGGLER_MIN_EXTRA_MS: i64 = 1_000;
/// A wait to start this many times its job's median is a scheduling wait…
const WAIT_FACTOR: i64 = 5;
/// …and at least this much longer.
const WAIT_MIN_EXTRA_MS: i64 = 10_000;
/// Attempts a function or job needs before its median means anything.
const MIN_SAMPLE: i64 = 20;
/// Failures of one type on one node or worker before it can be a hot spot.
const MIN_HOT_FAILURES: i64 = 3;

/// Error types a task's own code or its caller causes; the others (a worker, node or actor
/// dying, memory, disk, lost objects) point at a place.
const APPLICATION_ERRORS: &str = "('TASK_EXECUTION_EXCEPTION', 'TASK_CANCELLED', 'ACTOR_CREATION_FAILED', \
     'END_OF_STREAMING_GENERATOR')";

/// The temporary table of rollup rows computed by a scan, when no stored rollups answer (one
/// per connection, dropped after the request).
const CELLS: &str = "insight_cells";

/// The rollup rows of the insights' grouping sets over the relation `source` (newest
/// attempts, [`rollup::SOURCE`] columns and `sign`).
static SCANNED_CELLS: LazyLock<String> =
    LazyLock::new(|| rollup::newest_cells("source", &INSIGHTS));

/// `GET /api/insights`.
pub(super) async fn insights(
    engine: &QueryEngine,
    params: &[(String, String)],
) -> Result<Json, QueryError> {
    let parsed = Params::parse(params, &TaskFilter::PARAMS)?;
    let filter = TaskFilter::from_params(&parsed)?;
    // The request's own filters, carried into every finding's filter.
    let base: Map<String, Json> = params
        .iter()
        .filter(|(name, _)| TaskFilter::PARAMS.contains(&name.as_str()))
        .map(|(name, value)| (name.clone(), Json::String(value.clone())))
        .collect();
    let scope = Scope {
        filter: &filter,
        base: &base,
    };
    let attempts = match counted_reading(engine, &filter, None, &INSIGHTS).await? {
        None => None,
        Some(Counted::Rollups(rollups)) => {
            let kind = kind_conditions(&filter, "complete");
            let found = read(engine, Cells::Stored(rollups, kind)).await?;
            if let Ok(findings) = scope.findings(&found) {
                engine.count_rollup_answer();
                return scope.answer(engine, &found, findings).await;
            }
            tracing::info!("every version at an extreme was superseded; scanning");
            filtered_relation(engine, &filter).await?
        }
        Some(Counted::Attempts(attempts)) => Some(attempts),
    };
    let Some(attempts) = attempts else {
        return Ok(json!({ "findings": [] }));
    };
    let found = read(engine, Cells::Scanned(scanned_cells(&attempts, &filter))).await?;
    let findings = scope.findings(&found).map_err(|Unknown| {
        QueryError::Internal("a scan's rollup rows hold every extreme".into())
    })?;
    scope.answer(engine, &found, findings).await
}

/// What the detectors read: the request's filter, and that filter as query parameters for
/// the findings.
struct Scope<'a> {
    filter: &'a TaskFilter,
    base: &'a Map<String, Json>,
}

/// An extreme no newest row holds any more (see [`known`]): the rollups cannot tell the next.
#[derive(Debug)]
struct Unknown;

/// Where the detectors' rollup rows come from.
enum Cells {
    /// Stored rollups, and the request's filter on them.
    Stored(Relation, Sql),
    /// SQL computing them into [`CELLS`] by a scan.
    Scanned(Sql),
}

impl Cells {
    /// Appends the relation of rollup rows, and ` WHERE ` with the filter on them.
    fn rows_where(&self, sql: &mut Sql) {
        match self {
            Self::Stored(rollups, kind) => {
                sql.relation(rollups)
                    .push(" WHERE TRUE")
                    .append(kind.clone());
            }
            Self::Scanned(_) => {
                sql.push(CELLS).push(" WHERE TRUE");
            }
        }
    }
}

/// SQL creating [`CELLS`] by a scan of `attempts`.
fn scanned_cells(attempts: &Relation, filter: &TaskFilter) -> Sql {
    let mut sql = Sql::default();
    sql.push("CREATE OR REPLACE TEMP TABLE ")
        .push(CELLS)
        .push(" AS WITH source AS (SELECT ")
        .push(rollup::SOURCE)
        .push(", 1 AS sign FROM ")
        .relation(attempts)
        .push(" WHERE ")
        .append(task_conditions(filter))
        .push(") ")
        .push(&SCANNED_CELLS);
    sql
}

/// One rounded measure of a group, and how many newest attempts have it.
#[derive(Deserialize)]
struct Bucket {
    grouping: String,
    group_key: String,
    rounded: i64,
    n: i64,
}

/// A function's attempts, retries and failures.
#[derive(Deserialize)]
struct FunctionCounts {
    function: String,
    n: i64,
    retries: i64,
    failed: i64,
    failed_retries: i64,
}

/// Attempts at one place (node or worker), failed with one system error type or not.
#[derive(Deserialize)]
struct PlaceCount {
    grouping: String,
    place: String,
    error_type: Option<String>,
    n: i64,
}

/// A failure cluster: failed attempts of one error type and fingerprint.
#[derive(Deserialize)]
struct Cluster {
    error_type: String,
    fingerprint: String,
    n: i64,
    example: Option<String>,
}

/// The rollup rows the detectors read, summed over files.
struct Found {
    buckets: Vec<Bucket>,
    functions: Vec<FunctionCounts>,
    places: Vec<PlaceCount>,
    clusters: Vec<Cluster>,
    /// Extremes of the groups with a finding, by (grouping set, group).
    extremes: BTreeMap<(String, String), Extremes>,
}

/// The grouping sets measured, with what makes an outlier there: `factor`× the median and
/// `extra` above it, or more.
const MEASURED: [(&str, i64, i64); 2] = [
    (
        "func_or_class_name",
        STRAGGLER_FACTOR,
        STRAGGLER_MIN_EXTRA_MS,
    ),
    (WAITS, WAIT_FACTOR, WAIT_MIN_EXTRA_MS),
];

/// Rollup rows summed over files, jobs and types: what the detectors count.
const COUNTS: &str = "insight_counts";

/// Reads what the detectors need from `cells`.
async fn read(engine: &QueryEngine, cells: Cells) -> Result<Found, QueryError> {
    engine
        .run(move |connection| {
            let found = read_cells(connection, &cells);
            connection.execute_batch(&format!(
                "DROP TABLE IF EXISTS {CELLS}; DROP TABLE IF EXISTS {COUNTS}"
            ))?;
            found
        })
        .await
}

/// Runs `sql` and reads its rows as `T`.
fn rows<T: DeserializeOwned>(
    connection: &duckdb::Connection,
    sql: &Sql,
) -> Result<Vec<T>, QueryError> {
    query_as(connection, &sql.text, &sql.params)
}

/// Runs `text` (no parameters) and reads its rows as `T`.
fn rows_of<T: DeserializeOwned>(
    connection: &duckdb::Connection,
    text: &str,
) -> Result<Vec<T>, QueryError> {
    query_as(connection, text, &[] as &[Value])
}

/// See [`read`]: the rollup rows summed into [`COUNTS`] (a few thousand rows), the detectors'
/// counts from there, and the extremes of only the groups with a finding.
fn read_cells(connection: &duckdb::Connection, cells: &Cells) -> Result<Found, QueryError> {
    if let Cells::Scanned(create) = cells {
        connection.execute(&create.text, duckdb::params_from_iter(create.params.iter()))?;
    }
    let sets: Vec<String> = INSIGHTS.iter().map(|set| (*set).to_owned()).collect();
    let mut counts = Sql::default();
    counts
        .push("CREATE OR REPLACE TEMP TABLE ")
        .push(COUNTS)
        .push(
            " AS SELECT grouping, group_key, state, error_type, retried, rounded, \
             sum(sign * n)::BIGINT AS n, min(example) FILTER (WHERE sign > 0) AS example FROM ",
        );
    cells.rows_where(&mut counts);
    counts
        .push(" AND grouping IN ")
        .bind_list(&sets)
        .push(" GROUP BY ALL HAVING sum(sign * n) <> 0");
    connection.execute(&counts.text, duckdb::params_from_iter(counts.params.iter()))?;
    let measured = format!("'func_or_class_name', '{WAITS}'");
    let buckets = rows_of(
        connection,
        &format!(
            "SELECT grouping, group_key, rounded, sum(n)::BIGINT AS n FROM {COUNTS} \
             WHERE grouping IN ({measured}) AND group_key IS NOT NULL AND rounded IS NOT NULL \
             GROUP BY ALL HAVING sum(n) <> 0 ORDER BY grouping, group_key, rounded"
        ),
    )?;
    let functions = rows_of(
        connection,
        &format!(
            "SELECT group_key AS function, sum(n)::BIGINT AS n, \
             coalesce(sum(n) FILTER (WHERE retried), 0)::BIGINT AS retries, \
             coalesce(sum(n) FILTER (WHERE state = 'FAILED'), 0)::BIGINT AS failed, \
             coalesce(sum(n) FILTER (WHERE retried AND state = 'FAILED'), 0)::BIGINT \
                 AS failed_retries \
             FROM {COUNTS} WHERE grouping = 'func_or_class_name' AND group_key IS NOT NULL \
             GROUP BY 1 HAVING sum(n) <> 0 ORDER BY retries DESC, function"
        ),
    )?;
    let places = rows_of(
        connection,
        &format!(
            "SELECT grouping, group_key AS place, CASE WHEN state = 'FAILED' AND error_type \
             NOT IN {APPLICATION_ERRORS} THEN error_type END AS error_type, \
             sum(n)::BIGINT AS n FROM {COUNTS} \
             WHERE grouping IN ('node_id', '{WORKERS}') AND group_key IS NOT NULL \
             GROUP BY ALL HAVING sum(n) <> 0"
        ),
    )?;
    let clusters: Vec<Cluster> = rows_of(
        connection,
        &format!(
            "SELECT error_type, group_key AS fingerprint, sum(n)::BIGINT AS n, \
             min(example) AS example FROM {COUNTS} \
             WHERE grouping = '{FAILURES}' GROUP BY ALL HAVING sum(n) > 0 \
             ORDER BY n DESC, error_type, fingerprint LIMIT {MAX_CLUSTERS}"
        ),
    )?;
    let mut found = Found {
        buckets,
        functions,
        places,
        clusters,
        extremes: BTreeMap::new(),
    };
    // Only the groups with a finding show an extreme: read those alone.
    let mut wanted: Vec<(&'static str, &'static str, Vec<String>)> = MEASURED
        .iter()
        .map(|&(grouping, factor, extra)| {
            let groups = found
                .outliers(grouping, factor, extra)
                .into_iter()
                .map(|outliers| outliers.group.to_owned())
                .collect();
            (grouping, "group_key", groups)
        })
        .collect();
    wanted.push((
        FAILURES,
        "error_type || '/' || group_key",
        found
            .clusters
            .iter()
            .map(|cluster| format!("{}/{}", cluster.error_type, cluster.fingerprint))
            .collect(),
    ));
    for (grouping, level, groups) in wanted {
        if groups.is_empty() {
            continue;
        }
        let mut sql = Sql::default();
        sql.push("WITH r AS (SELECT *, ")
            .push(level)
            .push(" AS insight_level FROM ");
        cells.rows_where(&mut sql);
        sql.push(" AND grouping = ")
            .bind(grouping.to_owned())
            .push(" AND ")
            .push(level)
            .push(" IN ")
            .bind_list(&groups)
            .push(") ")
            .append(extremes("insight_level"));
        for ends in rows::<Extremes>(connection, &sql)? {
            if let Some(level) = ends.level.clone() {
                found.extremes.insert((grouping.to_owned(), level), ends);
            }
        }
    }
    Ok(found)
}

/// `base` with `extra` set on top.
fn with(base: &Map<String, Json>, extra: &[(&str, Json)]) -> Json {
    let mut filter = base.clone();
    for (name, value) in extra {
        filter.insert((*name).to_owned(), value.clone());
    }
    Json::Object(filter)
}

/// The larger of a detector's bound and the request's own, as the text a query string carries:
/// the attempts counted met both.
fn at_least(bound: i64, requested: Option<i64>) -> String {
    bound.max(requested.unwrap_or(i64::MIN)).to_string()
}

/// Attempts of one group whose measure is far above the group's median.
struct Outliers<'a> {
    group: &'a str,
    /// The group's attempts with a measure.
    n: i64,
    /// The median, rounded up to two significant digits.
    p50: i64,
    /// The measure from which an attempt counts.
    threshold: i64,
    /// Attempts at or above `threshold`.
    count: i64,
    /// The largest measure.
    max: Option<i64>,
}

impl Found {
    /// Per group of `grouping` with [`MIN_SAMPLE`] measures or more: those at `factor`× the
    /// median and `extra` above it, or more, largest count first (`max` not yet known).
    fn outliers(&self, grouping: &str, factor: i64, extra: i64) -> Vec<Outliers<'_>> {
        let mut groups: BTreeMap<&str, Vec<&Bucket>> = BTreeMap::new();
        for bucket in self.buckets.iter().filter(|b| b.grouping == grouping) {
            groups.entry(&bucket.group_key).or_default().push(bucket);
        }
        let mut found = Vec::new();
        for (group, buckets) in groups {
            let n: i64 = buckets.iter().map(|bucket| bucket.n).sum();
            if n < MIN_SAMPLE {
                continue;
            }
            // The lower median, as `quantile_disc(…, 0.5)` picks it: the ((n - 1) / 2)-th value.
            let middle = (n - 1) / 2;
            let mut seen = 0;
            let Some(p50) = buckets.iter().find_map(|bucket| {
                seen += bucket.n;
                (seen > middle).then_some(bucket.rounded)
            }) else {
                continue;
            };
            let threshold = rollup::rounding_bound((factor * p50).max(p50 + extra));
            let from = rollup::round_up(threshold);
            let count: i64 = buckets
                .iter()
                .filter(|bucket| bucket.rounded >= from)
                .map(|bucket| bucket.n)
                .sum();
            if count > 0 {
                found.push(Outliers {
                    group,
                    n,
                    p50,
                    threshold,
                    count,
                    max: None,
                });
            }
        }
        found.sort_by(|a, b| b.count.cmp(&a.count).then(a.group.cmp(b.group)));
        found
    }

    /// [`Self::outliers`] with each group's largest measure.
    fn outliers_with_max(
        &self,
        grouping: &str,
        factor: i64,
        extra: i64,
    ) -> Result<Vec<Outliers<'_>>, Unknown> {
        self.outliers(grouping, factor, extra)
            .into_iter()
            .map(|outliers| {
                let ends = self
                    .extremes
                    .get(&(grouping.to_owned(), outliers.group.to_owned()))
                    .ok_or(Unknown)?;
                let max = known(ends.max, ends.max_live).map_err(|()| Unknown)?;
                Ok(Outliers { max, ..outliers })
            })
            .collect()
    }
}

impl Scope<'_> {
    /// The answer: `findings`, and the exhausted retries `found` points at.
    async fn answer(
        &self,
        engine: &QueryEngine,
        found: &Found,
        mut findings: Vec<Json>,
    ) -> Result<Json, QueryError> {
        findings.extend(self.exhausted_retries(engine, &found.functions).await?);
        Ok(json!({ "findings": findings }))
    }

    /// Every finding `found` shows, but exhausted retries (they need the attempts).
    fn findings(&self, found: &Found) -> Result<Vec<Json>, Unknown> {
        let mut findings = self.failure_clusters(found)?;
        findings.extend(self.stragglers(found)?);
        findings.extend(self.retry_storms(found));
        findings.extend(self.scheduling_waits(found)?);
        for (grouping, column) in [("node_id", "node_id"), (WORKERS, "worker_id")] {
            findings.extend(self.hot_spots(found, grouping, column));
        }
        Ok(findings)
    }

    /// Failed attempts grouped by error type and fingerprint, largest first, with when the
    /// first of them was created and when the last was last seen.
    fn failure_clusters(&self, found: &Found) -> Result<Vec<Json>, Unknown> {
        found
            .clusters
            .iter()
            .map(|cluster| {
                let level = format!("{}/{}", cluster.error_type, cluster.fingerprint);
                let (first_ms, last_ms) = match found.extremes.get(&(FAILURES.to_owned(), level)) {
                    Some(ends) => (
                        known(ends.first_ms, ends.first_ms_live).map_err(|()| Unknown)?,
                        known(ends.last_ms, ends.last_ms_live).map_err(|()| Unknown)?,
                    ),
                    None => (None, None),
                };
                let headline = cluster
                    .example
                    .as_deref()
                    .and_then(|text| text.lines().rev().find(|line| !line.trim().is_empty()))
                    .unwrap_or_default()
                    .trim()
                    .chars()
                    .take(200)
                    .collect::<String>();
                Ok(json!({
                    "kind": "failure_cluster",
                    "severity": "error",
                    "title": format!(
                        "{} attempt{} failed with {}: {headline}",
                        cluster.n,
                        if cluster.n == 1 { "" } else { "s" },
                        cluster.error_type
                    ),
                    "count": cluster.n,
                    "error_type": cluster.error_type,
                    "fingerprint": cluster.fingerprint,
                    "first_ms": first_ms,
                    "last_ms": last_ms,
                    "example": cluster.example,
                    "filter": with(self.base, &[
                        ("state", json!("FAILED")),
                        ("error_type", json!(cluster.error_type)),
                        ("error_fingerprint", json!(cluster.fingerprint)),
                    ]),
                }))
            })
            .collect()
    }

    /// Per function: attempts that ran [`STRAGGLER_FACTOR`]× its median or longer.
    fn stragglers(&self, found: &Found) -> Result<Vec<Json>, Unknown> {
        let slow = found.outliers_with_max(
            "func_or_class_name",
            STRAGGLER_FACTOR,
            STRAGGLER_MIN_EXTRA_MS,
        )?;
        Ok(slow
            .into_iter()
            .map(|slow| {
                json!({
                    "kind": "straggler",
                    "severity": "warning",
                    "title": format!(
                        "{} of {} attempts of {} ran {} ms or longer ({STRAGGLER_FACTOR}x their \
                         median of {} ms), up to {} ms",
                        slow.count, slow.n, slow.group, slow.threshold, slow.p50,
                        slow.max.unwrap_or_default()
                    ),
                    "count": slow.count,
                    "func_or_class_name": slow.group,
                    "median_ms": slow.p50,
                    "factor": STRAGGLER_FACTOR,
                    "threshold_ms": slow.threshold,
                    "max_ms": slow.max,
                    "filter": with(self.base, &[
                        ("func_or_class_name", json!(slow.group)),
                        ("min_duration_ms", json!(at_least(slow.threshold, self.filter.min_duration_ms))),
                    ]),
                })
            })
            .collect())
    }

    /// Functions whose attempts are mostly retries.
    fn retry_storms(&self, found: &Found) -> Vec<Json> {
        found
            .functions
            .iter()
            .filter(|storm| storm.n >= MIN_SAMPLE / 2 && 2 * storm.retries >= storm.n)
            .map(|storm| {
                json!({
                    "kind": "retry_storm",
                    "severity": "warning",
                    "title": format!(
                        "{} of {} attempts of {} are retries ({} attempts failed)",
                        storm.retries, storm.n, storm.function, storm.failed
                    ),
                    "count": storm.retries,
                    "func_or_class_name": storm.function,
                    "attempts": storm.n,
                    "failed": storm.failed,
                    "filter": with(self.base, &[
                        ("func_or_class_name", json!(storm.function)),
                        ("min_attempt", json!(at_least(1, self.filter.min_attempt))),
                    ]),
                })
            })
            .collect()
    }

    /// Per function: tasks that were retried and whose latest attempt still failed. Ray's
    /// events do not carry `max_retries`, but Ray stops retrying only at the limit (or on an
    /// error it does not retry), so a failed latest attempt after retries is a task that gave
    /// up. Only functions with a failed retry can have one, and only they are read: a session
    /// without failed retries reads no attempts for this.
    async fn exhausted_retries(
        &self,
        engine: &QueryEngine,
        functions: &[FunctionCounts],
    ) -> Result<Vec<Json>, QueryError> {
        #[derive(Deserialize)]
        struct GaveUp {
            function: String,
            n: i64,
            most: i64,
        }
        let suspects: Vec<String> = functions
            .iter()
            .filter(|function| function.failed_retries > 0)
            .map(|function| function.function.clone())
            .collect();
        if suspects.is_empty() {
            return Ok(Vec::new());
        }
        let Some(attempts) = filtered_relation(engine, self.filter).await? else {
            return Ok(Vec::new());
        };
        // A task that was retried has its latest attempt among its retries: choosing it there
        // spares a window over every attempt.
        let latest = attempts.latest_retries();
        let mut sql = Sql::default();
        sql.push(
            "SELECT func_or_class_name AS function, count(*) AS n, max(attempt_number) AS most \
             FROM ",
        )
        .relation(&latest)
        .push(" WHERE ")
        .append(task_conditions(self.filter))
        .push(" AND state = 'FAILED' AND attempt_number >= 1 AND func_or_class_name IN ")
        .bind_list(&suspects)
        .push(" GROUP BY 1 ORDER BY n DESC, function LIMIT ")
        .number(MAX_CLUSTERS);
        let found: Vec<GaveUp> = engine
            .run(move |connection| query_as(connection, &sql.text, &sql.params))
            .await?;
        Ok(found
            .into_iter()
            .map(|gave_up| {
                json!({
                    "kind": "retry_storm",
                    "severity": "error",
                    "title": format!(
                        "{} task{} of {} failed on every retry (up to {} retr{})",
                        gave_up.n,
                        if gave_up.n == 1 { "" } else { "s" },
                        gave_up.function,
                        gave_up.most,
                        if gave_up.most == 1 { "y" } else { "ies" },
                    ),
                    "count": gave_up.n,
                    "func_or_class_name": gave_up.function,
                    "retries_exhausted": true,
                    "max_retries_seen": gave_up.most,
                    "filter": with(self.base, &[
                        ("func_or_class_name", json!(gave_up.function)),
                        ("state", json!("FAILED")),
                        ("min_attempt", json!(at_least(1, self.filter.min_attempt))),
                        ("latest_attempt", json!("true")),
                    ]),
                })
            })
            .collect())
    }

    /// Per job: attempts that waited [`WAIT_FACTOR`]× its median wait to start, or longer.
    fn scheduling_waits(&self, found: &Found) -> Result<Vec<Json>, Unknown> {
        let waits = found.outliers_with_max(WAITS, WAIT_FACTOR, WAIT_MIN_EXTRA_MS)?;
        Ok(waits
            .into_iter()
            .map(|wait| {
                json!({
                    "kind": "scheduling_wait",
                    "severity": "warning",
                    "title": format!(
                        "{} of {} attempts of job {} waited {} ms or more to start (the job's \
                         median wait is {} ms), up to {} ms",
                        wait.count, wait.n, wait.group, wait.threshold, wait.p50,
                        wait.max.unwrap_or_default()
                    ),
                    "count": wait.count,
                    "job_id": wait.group,
                    "median_ms": wait.p50,
                    "threshold_ms": wait.threshold,
                    "max_ms": wait.max,
                    "filter": with(self.base, &[
                        ("job_id", json!(wait.group)),
                        ("min_wait_ms", json!(at_least(wait.threshold, self.filter.min_wait_ms))),
                    ]),
                })
            })
            .collect())
    }

    /// A node or worker with most of the failures of one system error type (a worker or node that
    /// died, ran out of memory…), failing that way at twice the rate of the rest.
    fn hot_spots(&self, found: &Found, grouping: &str, column: &'static str) -> Vec<Json> {
        let mut attempts: BTreeMap<&str, i64> = BTreeMap::new();
        let mut failures: BTreeMap<&str, Vec<(&str, i64)>> = BTreeMap::new();
        for row in found.places.iter().filter(|row| row.grouping == grouping) {
            *attempts.entry(row.place.as_str()).or_default() += row.n;
            if let Some(error_type) = &row.error_type {
                failures
                    .entry(error_type.as_str())
                    .or_default()
                    .push((row.place.as_str(), row.n));
            }
        }
        if attempts.len() < 2 {
            return Vec::new();
        }
        let all: i64 = attempts.values().sum();
        let what = if column == "node_id" {
            "node"
        } else {
            "worker"
        };
        let mut found = Vec::new();
        for (error_type, places) in &failures {
            let of_type: i64 = places.iter().map(|(_, failed)| failed).sum();
            for (place, failed) in places {
                let n = attempts.get(place).copied().unwrap_or(0);
                let (rest_failed, rest) = (of_type - failed, all - n);
                // Most of this type's failures, at least twice the rate of the rest:
                // failed / n >= 2 * rest_failed / rest.
                if *failed >= MIN_HOT_FAILURES
                    && 2 * failed >= of_type
                    && failed * rest >= 2 * rest_failed * n
                {
                    found.push(json!({
                        "kind": "hot_spot",
                        "severity": "error",
                        "title": format!(
                            "{failed} of {of_type} {error_type} failures were on {what} {place} \
                             ({n} attempts ran there)"
                        ),
                        "count": failed,
                        column: place,
                        "error_type": error_type,
                        "attempts": n,
                        "failures_of_type": of_type,
                        "filter": with(self.base, &[
                            (column, json!(place)),
                            ("state", json!("FAILED")),
                            ("error_type", json!(error_type)),
                        ]),
                    }));
                }
            }
        }
        found
    }
}
