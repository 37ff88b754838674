//! `GET /api/insights`: what went wrong, before anyone reads a table.
//!
//! Each finding names the attempts behind it as `filter`, the `/api/tasks` parameters that list
//! exactly its `count` attempts (the request's own filters included), so a click on a finding
//! shows them. Every detector is one aggregate over the attempts in the request's filter.

use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use super::json::query_as;
use super::params::{Params, TaskFilter};
use super::sql::{ERROR_FINGERPRINT, Relation, Sql, WAIT_MS, task_conditions};
use super::tasks::filtered_relation;
use super::{QueryEngine, QueryError};

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

/// `GET /api/insights`.
pub(super) async fn insights(
    engine: &QueryEngine,
    params: &[(String, String)],
) -> Result<Json, QueryError> {
    let parsed = Params::parse(params, &TaskFilter::PARAMS)?;
    let filter = TaskFilter::from_params(&parsed)?;
    let Some(relation) = filtered_relation(engine, &filter).await? else {
        return Ok(json!({ "findings": [] }));
    };
    // The request's own filters, carried into every finding's filter.
    let base: Map<String, Json> = params
        .iter()
        .filter(|(name, _)| TaskFilter::PARAMS.contains(&name.as_str()))
        .map(|(name, value)| (name.clone(), Json::String(value.clone())))
        .collect();
    let scope = Scope {
        engine,
        relation: &relation,
        filter: &filter,
        base: &base,
    };
    // One after another: side by side, each would build its own copy of the read's hash
    // tables (measured: 2.2 GiB peak at 1 M attempts, against 1.2 GiB).
    let mut findings = scope.failure_clusters().await?;
    findings.extend(scope.stragglers().await?);
    findings.extend(scope.retry_storms().await?);
    findings.extend(scope.exhausted_retries().await?);
    findings.extend(scope.scheduling_waits().await?);
    for column in ["node_id", "worker_id"] {
        findings.extend(scope.hot_spots(column).await?);
    }
    Ok(json!({ "findings": findings }))
}

/// What every detector reads: the attempts in the request's filter, and that filter as query
/// parameters for the findings.
struct Scope<'a> {
    engine: &'a QueryEngine,
    relation: &'a Relation,
    filter: &'a TaskFilter,
    base: &'a Map<String, Json>,
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

/// Runs `sql` and reads its rows as `T`.
async fn rows<T: serde::de::DeserializeOwned + Send + 'static>(
    engine: &QueryEngine,
    sql: Sql,
) -> Result<Vec<T>, QueryError> {
    engine
        .run(move |connection| query_as(connection, &sql.text, &sql.params))
        .await
}

/// Error types a task's own code or its caller causes; the others (a worker, node or actor
/// dying, memory, disk, lost objects) point at a place.
const APPLICATION_ERRORS: &str = "('TASK_EXECUTION_EXCEPTION', 'TASK_CANCELLED', 'ACTOR_CREATION_FAILED', \
     'END_OF_STREAMING_GENERATOR')";

impl Scope<'_> {
    /// Failed attempts grouped by error type and fingerprint, largest first.
    async fn failure_clusters(&self) -> Result<Vec<Json>, QueryError> {
        #[derive(Deserialize)]
        struct Cluster {
            error_type: String,
            fingerprint: String,
            n: i64,
            first_ms: Option<i64>,
            last_ms: Option<i64>,
            example: Option<String>,
        }
        let mut sql = Sql::default();
        sql.push("SELECT error_type, ")
            .push(ERROR_FINGERPRINT)
            .push(
                " AS fingerprint, count(*) AS n, min(coalesce(end_time_ms, creation_time_ms)) AS \
             first_ms, max(coalesce(end_time_ms, creation_time_ms)) AS last_ms, \
             min(error_message) AS example FROM ",
            )
            .relation(self.relation)
            .push(" WHERE ")
            .append(task_conditions(self.filter))
            .push(
                " AND state = 'FAILED' AND error_type IS NOT NULL GROUP BY ALL \
             ORDER BY n DESC, error_type, fingerprint LIMIT ",
            )
            .number(MAX_CLUSTERS);
        let clusters: Vec<Cluster> = rows(self.engine, sql).await?;
        Ok(clusters
            .into_iter()
            .map(|cluster| {
                let headline = cluster
                    .example
                    .as_deref()
                    .and_then(|text| text.lines().rev().find(|line| !line.trim().is_empty()))
                    .unwrap_or_default()
                    .trim()
                    .chars()
                    .take(200)
                    .collect::<String>();
                json!({
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
                    "first_ms": cluster.first_ms,
                    "last_ms": cluster.last_ms,
                    "example": cluster.example,
                    "filter": with(self.base, &[
                        ("state", json!("FAILED")),
                        ("error_type", json!(cluster.error_type)),
                        ("error_fingerprint", json!(cluster.fingerprint)),
                    ]),
                })
            })
            .collect())
    }

    /// Per function: attempts that ran [`STRAGGLER_FACTOR`]× its median or longer.
    async fn stragglers(&self) -> Result<Vec<Json>, QueryError> {
        #[derive(Deserialize)]
        struct Slow {
            function: String,
            p50: i64,
            n: i64,
            threshold: i64,
            slow: i64,
            slowest: i64,
        }
        let mut sql = Sql::default();
        sql.push("WITH scope AS (SELECT * FROM ")
        .relation(self.relation)
        .push(" WHERE ")
        .append(task_conditions(self.filter))
        .push(
            " AND duration_ms IS NOT NULL AND func_or_class_name IS NOT NULL), \
             typical AS (SELECT func_or_class_name AS function, \
             quantile_disc(duration_ms, 0.5) AS p50, count(*) AS n FROM scope GROUP BY 1 \
             HAVING count(*) >= ",
        )
        .number(MIN_SAMPLE)
        .push("), bounds AS (SELECT *, greatest(")
        .number(STRAGGLER_FACTOR)
        .push(" * p50, p50 + ")
        .number(STRAGGLER_MIN_EXTRA_MS)
        .push(
            ") AS threshold FROM typical) SELECT function, p50, n, threshold, count(*) AS slow, \
             max(duration_ms) AS slowest FROM scope JOIN bounds \
             ON scope.func_or_class_name = bounds.function \
             WHERE duration_ms >= threshold GROUP BY ALL ORDER BY slow DESC, function",
        );
        let found: Vec<Slow> = rows(self.engine, sql).await?;
        Ok(found
        .into_iter()
        .map(|slow| {
            json!({
                "kind": "straggler",
                "severity": "warning",
                "title": format!(
                    "{} of {} attempts of {} ran {STRAGGLER_FACTOR}x their median ({} ms) or \
                     longer, up to {} ms",
                    slow.slow, slow.n, slow.function, slow.p50, slow.slowest
                ),
                "count": slow.slow,
                "func_or_class_name": slow.function,
                "median_ms": slow.p50,
                "factor": STRAGGLER_FACTOR,
                "threshold_ms": slow.threshold,
                "max_ms": slow.slowest,
                "filter": with(self.base, &[
                    ("func_or_class_name", json!(slow.function)),
                    ("min_duration_ms", json!(at_least(slow.threshold, self.filter.min_duration_ms))),
                ]),
            })
        })
        .collect())
    }

    /// Functions whose attempts are mostly retries.
    async fn retry_storms(&self) -> Result<Vec<Json>, QueryError> {
        #[derive(Deserialize)]
        struct Storm {
            function: String,
            n: i64,
            retries: i64,
            failed: i64,
        }
        let mut sql = Sql::default();
        sql.push(
            "SELECT func_or_class_name AS function, count(*) AS n, \
         count(*) FILTER (WHERE attempt_number >= 1) AS retries, \
         count(*) FILTER (WHERE state = 'FAILED') AS failed FROM ",
        )
        .relation(self.relation)
        .push(" WHERE ")
        .append(task_conditions(self.filter))
        .push(" AND func_or_class_name IS NOT NULL GROUP BY 1 HAVING count(*) >= ")
        .number(MIN_SAMPLE / 2)
        .push(
            " AND 2 * count(*) FILTER (WHERE attempt_number >= 1) >= count(*) \
         ORDER BY retries DESC, function",
        );
        let found: Vec<Storm> = rows(self.engine, sql).await?;
        Ok(found
            .into_iter()
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
            .collect())
    }

    /// Per function: tasks that were retried and whose latest attempt still failed. Ray's
    /// events do not carry `max_retries`, but Ray stops retrying only at the limit (or on an
    /// error it does not retry), so a failed latest attempt after retries is a task that gave up.
    async fn exhausted_retries(&self) -> Result<Vec<Json>, QueryError> {
        #[derive(Deserialize)]
        struct GaveUp {
            function: String,
            n: i64,
            most: i64,
        }
        // A task that was retried has its latest attempt among its retries: choosing it there
        // spares a window over every attempt.
        let latest = self.relation.clone().latest_retries();
        let mut sql = Sql::default();
        sql.push(
            "SELECT func_or_class_name AS function, count(*) AS n, max(attempt_number) AS most \
             FROM ",
        )
        .relation(&latest)
        .push(" WHERE ")
        .append(task_conditions(self.filter))
        .push(
            " AND state = 'FAILED' AND attempt_number >= 1 AND func_or_class_name IS NOT NULL \
             GROUP BY 1 ORDER BY n DESC, function LIMIT ",
        )
        .number(MAX_CLUSTERS);
        let found: Vec<GaveUp> = rows(self.engine, sql).await?;
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
    async fn scheduling_waits(&self) -> Result<Vec<Json>, QueryError> {
        #[derive(Deserialize)]
        struct Wait {
            job_id: String,
            p50: i64,
            n: i64,
            threshold: i64,
            waited: i64,
            longest: i64,
        }
        let mut sql = Sql::default();
        sql.push("WITH scope AS (SELECT *, ")
            .push(WAIT_MS)
            .push(" AS wait_ms FROM ")
            .relation(self.relation)
            .push(" WHERE ")
            .append(task_conditions(self.filter))
            .push(
                " AND start_time_ms IS NOT NULL AND creation_time_ms IS NOT NULL \
             AND job_id IS NOT NULL), \
             typical AS (SELECT job_id AS job, quantile_disc(wait_ms, 0.5) AS p50, \
             count(*) AS n FROM scope GROUP BY 1 HAVING count(*) >= ",
            )
            .number(MIN_SAMPLE)
            .push("), bounds AS (SELECT *, greatest(")
            .number(WAIT_FACTOR)
            .push(" * p50, p50 + ")
            .number(WAIT_MIN_EXTRA_MS)
            .push(
                ") AS threshold FROM typical) SELECT job AS job_id, p50, n, threshold, \
             count(*) AS waited, max(wait_ms) AS longest FROM scope JOIN bounds \
             ON scope.job_id = bounds.job WHERE wait_ms >= threshold GROUP BY ALL \
             ORDER BY waited DESC, job_id",
            );
        let found: Vec<Wait> = rows(self.engine, sql).await?;
        Ok(found
            .into_iter()
            .map(|wait| {
                json!({
                    "kind": "scheduling_wait",
                    "severity": "warning",
                    "title": format!(
                        "{} of {} attempts of job {} waited {} ms or more to start (the job's \
                         median wait is {} ms), up to {} ms",
                        wait.waited, wait.n, wait.job_id, wait.threshold, wait.p50, wait.longest
                    ),
                    "count": wait.waited,
                    "job_id": wait.job_id,
                    "median_ms": wait.p50,
                    "threshold_ms": wait.threshold,
                    "max_ms": wait.longest,
                    "filter": with(self.base, &[
                        ("job_id", json!(wait.job_id)),
                        ("min_wait_ms", json!(at_least(wait.threshold, self.filter.min_wait_ms))),
                    ]),
                })
            })
            .collect())
    }

    /// A node or worker with most of the failures of one system error type (a worker or node that
    /// died, ran out of memory…), failing that way at twice the rate of the rest.
    async fn hot_spots(&self, column: &'static str) -> Result<Vec<Json>, QueryError> {
        #[derive(Deserialize)]
        struct Place {
            place: String,
            error_type: Option<String>,
            failed: i64,
            n: i64,
        }
        // Every (place, error type) with its attempts: rows without a failure carry the place's
        // attempt count (error type null).
        let mut sql = Sql::default();
        sql.push("SELECT ")
            .push(column)
            .push(" AS place, CASE WHEN state = 'FAILED' AND error_type NOT IN ")
            .push(APPLICATION_ERRORS)
            .push(
                " THEN error_type END AS error_type, \
             count(*) FILTER (WHERE state = 'FAILED' AND error_type NOT IN ",
            )
            .push(APPLICATION_ERRORS)
            .push(") AS failed, count(*) AS n FROM ")
            .relation(self.relation)
            .push(" WHERE ")
            .append(task_conditions(self.filter))
            .push(" AND ")
            .push(column)
            .push(" IS NOT NULL GROUP BY ALL");
        let rows: Vec<Place> = rows(self.engine, sql).await?;
        let mut attempts: std::collections::BTreeMap<&str, i64> = Default::default();
        let mut failures: std::collections::BTreeMap<&str, Vec<(&str, i64)>> = Default::default();
        for row in &rows {
            *attempts.entry(row.place.as_str()).or_default() += row.n;
            if let Some(error_type) = &row.error_type {
                failures
                    .entry(error_type.as_str())
                    .or_default()
                    .push((row.place.as_str(), row.failed));
            }
        }
        if attempts.len() < 2 {
            return Ok(Vec::new());
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
        Ok(found)
    }
}
