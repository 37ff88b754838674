//! The routes the bench times: a probe per dashboard and Ray request, each asked cold and
//! warm over the session a run left, in a process whose peak memory is the query figure.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use serde_json::Value;
use shared::query::ray::RayRequest;
use shared::query::{ApiRoute, QueryEngine, QuerySettings};
use shared::storage::Storage;

use super::CLUSTER;
use super::report::{QueryReport, RouteTimes};
use super::stats::{Stats, memory, ms};
use crate::progress;

/// One dashboard request of the benchmark.
struct Probe {
    name: &'static str,
    route: Route,
    params: Vec<(String, String)>,
}

/// Which API a probe asks.
enum Route {
    /// Afterglow's own.
    Api(ApiRoute),
    /// Ray's, as its dashboard and CLI ask it through Afterglow.
    Ray(RayRequest),
}

fn probe(name: &'static str, route: ApiRoute, params: &[(&str, &str)]) -> Probe {
    Probe {
        name,
        route: Route::Api(route),
        params: params
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect(),
    }
}

impl Probe {
    /// Asks `engine` once.
    async fn ask(&self, engine: &QueryEngine) -> anyhow::Result<()> {
        match &self.route {
            Route::Api(route) => {
                engine.answer(route, &self.params).await?;
            }
            Route::Ray(request) => {
                engine.answer_ray(request, &self.params).await?;
            }
        }
        Ok(())
    }
}

/// Times every route cold and warm, and the peak memory while doing it.
pub(super) async fn query_phase(
    storage: Arc<dyn Storage>,
    work: &Path,
    session: &str,
    repeat: usize,
) -> anyhow::Result<QueryReport> {
    let rss_before = memory::current_mib();
    let settings = QuerySettings::under(&work.join("query"));
    let engine = QueryEngine::open(Arc::clone(&storage), settings.clone())?;
    // Pick real ids to look up: a failed attempt's task and job.
    let failed = engine
        .answer(
            &ApiRoute::Tasks,
            &[
                ("state".to_owned(), "FAILED".to_owned()),
                ("limit".to_owned(), "1".to_owned()),
            ],
        )
        .await?;
    let sample = failed
        .pointer("/tasks/0")
        .context("the benchmark's data has no failed attempt")?;
    let task_id = text(sample, "task_id")?;
    let job_id = text(sample, "job_id")?;
    // And the session's oldest failed attempt: while the session streams, the newest one is
    // in a small delta and the oldest in the base, whose block a lookup decodes whole.
    let oldest = engine
        .answer(
            &ApiRoute::Tasks,
            &[
                ("state".to_owned(), "FAILED".to_owned()),
                ("limit".to_owned(), "1".to_owned()),
                ("order".to_owned(), "asc".to_owned()),
            ],
        )
        .await?;
    let oldest_task_id = text(
        oldest
            .pointer("/tasks/0")
            .context("the benchmark's data has no failed attempt")?,
        "task_id",
    )?;
    let scoped = [("cluster", CLUSTER), ("session", session)];
    let with_scope = |extra: &[(&'static str, &'static str)]| -> Vec<(&str, &str)> {
        scoped.iter().chain(extra).copied().collect()
    };
    let job: &'static str = Box::leak(job_id.into_boxed_str());
    // What Ray's own dashboard asks on a job's page, through Afterglow's Ray routes.
    let ray_tasks = Probe {
        route: Route::Ray(RayRequest::parse(
            "GET",
            &format!("{CLUSTER}/{session}/api/v0/tasks"),
        )?),
        ..probe(
            "ray_job_tasks",
            ApiRoute::Tasks,
            &[
                ("detail", "1"),
                ("limit", "10000"),
                ("filter_keys", "job_id"),
                ("filter_predicates", "="),
                ("filter_values", job),
            ],
        )
    };
    let probes = vec![
        probe("summary", ApiRoute::Summary, &with_scope(&[])),
        probe(
            "aggregates_by_name",
            ApiRoute::Aggregates,
            &with_scope(&[("by", "name")]),
        ),
        probe(
            "aggregates_by_error_type",
            ApiRoute::Aggregates,
            &with_scope(&[("by", "error_type")]),
        ),
        probe("insights", ApiRoute::Insights, &with_scope(&[])),
        probe(
            "table_page",
            ApiRoute::Tasks,
            &with_scope(&[("limit", "100")]),
        ),
        probe(
            "table_page_job_failed",
            ApiRoute::Tasks,
            &with_scope(&[("limit", "100"), ("job_id", job), ("state", "FAILED")]),
        ),
        probe("point_lookup", ApiRoute::Task(task_id), &with_scope(&[])),
        probe(
            "point_lookup_oldest",
            ApiRoute::Task(oldest_task_id),
            &with_scope(&[]),
        ),
        probe(
            "search",
            ApiRoute::Tasks,
            &with_scope(&[("limit", "100"), ("q", "shard-00417")]),
        ),
        probe(
            "jobs",
            ApiRoute::Entities(shared::tables::entities::EntityKind::Jobs),
            &with_scope(&[]),
        ),
        // The page's timeline of one job: its first 10 000 attempts by start time.
        probe(
            "timeline_job",
            ApiRoute::Timeline,
            &with_scope(&[("job_id", job)]),
        ),
        ray_tasks,
    ];
    let bar = progress::bar((probes.len() * (repeat + 1)) as u64, "query");
    let mut results = BTreeMap::new();
    for probe in &probes {
        // Cold: a new engine, so neither DuckDB's metadata cache nor a warm connection helps.
        let cold_engine = QueryEngine::open(Arc::clone(&storage), settings.clone())?;
        let timer = Instant::now();
        probe.ask(&cold_engine).await?;
        let cold = timer.elapsed();
        drop(cold_engine);
        bar.inc(1);
        let mut warm = Vec::with_capacity(repeat);
        let rolled_before = engine.rollup_answers();
        for _ in 0..repeat {
            let timer = Instant::now();
            probe.ask(&engine).await?;
            warm.push(timer.elapsed());
            bar.inc(1);
        }
        let stats = Stats::of(&mut warm);
        // Whether every warm answer came from rollups rather than a scan.
        let from_rollups = engine.rollup_answers() - rolled_before == repeat as u64;
        results.insert(
            probe.name.to_owned(),
            RouteTimes {
                cold_ms: ms(cold),
                warm: stats,
                from_rollups,
            },
        );
    }
    bar.finish_and_clear();
    Ok(QueryReport {
        routes: results,
        rss_before_mib: rss_before,
        peak_rss_mib: memory::peak_mib(),
        peak_rss_note: memory::NOTE.to_owned(),
        // Made, when asked, by `--query-only` before the routes are timed.
        fold: None,
    })
}

fn text(row: &Value, field: &str) -> anyhow::Result<String> {
    row.get(field)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .with_context(|| format!("a task row without `{field}`"))
}
