//! Every captured run, served through the dashboard API, agrees with Ray's own state-API
//! output: through `serve` (HTTP), through the Lambda query function on S3, and through a query
//! cache far smaller than one session. Every answer is checked against `openapi.yaml`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use afterglow::http::router;
use afterglow::state::AppState;
use afterglow_tests::api::{Api, counts_of, our_rows, ray_counts_by_name, serve_locally};
use afterglow_tests::ray::{LOSSY_RUN, check};
use afterglow_tests::{FixtureRun, s3_storage, serve_runs};
use anyhow::{Context as _, ensure};
use serde_json::Value as Json;
use shared::config::Config;
use shared::storage::Storage;

/// Counts by state of Ray's own task list.
fn ray_counts_by_state(truth: &Json) -> anyhow::Result<BTreeMap<String, i64>> {
    let mut counts = BTreeMap::new();
    for task in truth.as_array().context("tasks.json")? {
        *counts
            .entry(task["state"].as_str().context("state")?.to_owned())
            .or_default() += 1;
    }
    Ok(counts)
}

/// Everything the API says about `run` agrees with Ray: every attempt of `ray list tasks` in
/// the task table with the same fields, the summary's counts, per-name state counts (which is
/// what `ray summary tasks` shows), actors and nodes.
async fn check_run(api: &Api, run: &FixtureRun) -> anyhow::Result<()> {
    let cluster = &run.name;
    let truth = run.ground_truth("tasks.json")?;
    let tasks = api
        .all_pages(
            "/api/tasks",
            &format!("cluster={cluster}&limit=40&include_error_message=true"),
            "tasks",
        )
        .await?;
    let rows = our_rows(&tasks)?;
    check(run, &rows, "query API /api/tasks")?;

    let summary = api.ok(&format!("/api/summary?cluster={cluster}")).await?;
    // The catalog's count (kept by compaction, batch by batch) is every stored attempt.
    let everything = api
        .ok(&format!(
            "/api/summary?cluster={cluster}&include_drivers=true&include_incomplete=true"
        ))
        .await?;
    let listed = api.ok(&format!("/api/clusters?cluster={cluster}")).await?;
    ensure!(
        listed["clusters"][0]["attempts"] == everything["total"],
        "{cluster}: the catalog counts {} attempts, the tables hold {}",
        listed["clusters"][0]["attempts"],
        everything["total"]
    );
    ensure!(
        summary["total"].as_u64() == Some(tasks.len() as u64),
        "{cluster}: summary total {} but the table pages through {} rows",
        summary["total"],
        tasks.len()
    );
    let groups = api
        .ok(&format!(
            "/api/aggregates?cluster={cluster}&by=name&limit=1000"
        ))
        .await?;
    let ours_by_name: BTreeMap<String, BTreeMap<String, i64>> = groups["groups"]
        .as_array()
        .context("groups")?
        .iter()
        .map(|group| {
            Ok((
                group["key"].as_str().unwrap_or_default().to_owned(),
                counts_of(&group["by_state"])?,
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    if run.name != LOSSY_RUN {
        ensure!(
            summary["total"].as_u64() == truth.as_array().map(|tasks| tasks.len() as u64),
            "{cluster}: total {} vs Ray's {}",
            summary["total"],
            truth.as_array().map_or(0, Vec::len)
        );
        ensure!(
            counts_of(&summary["by_state"])? == ray_counts_by_state(&truth)?,
            "{cluster}: by_state {} vs Ray's {:?}",
            summary["by_state"],
            ray_counts_by_state(&truth)?
        );
        ensure!(
            ours_by_name == ray_counts_by_name(&truth)?,
            "{cluster}: per-name counts {ours_by_name:?} vs Ray's {:?}",
            ray_counts_by_name(&truth)?
        );
        // The run that saved `ray summary tasks` itself: the same groups and counts.
        if let Ok(ray_summary) = run.ground_truth("summary_tasks.json") {
            let cluster_summary = &ray_summary["tasks"]["cluster"];
            let theirs: BTreeMap<String, BTreeMap<String, i64>> = cluster_summary["summary"]
                .as_object()
                .context("summary")?
                .iter()
                .map(|(name, group)| Ok((name.clone(), counts_of(&group["state_counts"])?)))
                .collect::<anyhow::Result<_>>()?;
            ensure!(
                ours_by_name == theirs,
                "{cluster}: per-name counts {ours_by_name:?} vs ray summary tasks {theirs:?}"
            );
            let ray_total = ["total_tasks", "total_actor_tasks", "total_actor_scheduled"]
                .iter()
                .map(|field| cluster_summary[field].as_i64().unwrap_or(0))
                .sum::<i64>();
            ensure!(
                summary["total"].as_i64() == Some(ray_total),
                "{cluster}: total {} vs ray summary tasks {ray_total}",
                summary["total"]
            );
        }
        // Actors and nodes: the same ids in the same states.
        for (route, file, id) in [
            ("actors", "actors.json", "actor_id"),
            ("nodes", "nodes.json", "node_id"),
        ] {
            let ours: BTreeMap<String, String> = api
                .all_pages(
                    &format!("/api/{route}"),
                    &format!("cluster={cluster}&limit=3"),
                    route,
                )
                .await?
                .iter()
                .map(|row| {
                    (
                        row[id].as_str().unwrap_or_default().to_owned(),
                        row["state"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect();
            let theirs: BTreeMap<String, String> = run
                .ground_truth(file)?
                .as_array()
                .context("entities")?
                .iter()
                .map(|row| {
                    (
                        row[id].as_str().unwrap_or_default().to_owned(),
                        row["state"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect();
            ensure!(
                ours == theirs,
                "{cluster} {route}: {ours:?} vs Ray's {theirs:?}"
            );
        }
    }
    Ok(())
}

/// `serve` lists every run as a cluster, and all it says about each agrees with Ray (see
/// [`check_run`]).
#[tokio::test]
async fn every_run_agrees_with_ray_through_serve() -> anyhow::Result<()> {
    let runs = FixtureRun::all()?;
    let (served, api) = serve_locally(&runs).await?;
    let clusters = api.ok("/api/clusters").await?;
    let listed: BTreeSet<&str> = clusters["clusters"]
        .as_array()
        .context("clusters")?
        .iter()
        .filter_map(|cluster| cluster["cluster"].as_str())
        .collect();
    let expected: BTreeSet<&str> = runs.iter().map(|run| run.name.as_str()).collect();
    ensure!(listed == expected, "clusters {listed:?}");
    for run in &runs {
        check_run(&api, run).await?;
    }
    served.server.stop().await
}

/// The Lambda query function (`afterglow::lambda::query_service`, as `_HANDLER=query` builds
/// it) over SeaweedFS, driven with API Gateway v2 events.
#[tokio::test]
async fn every_run_agrees_with_ray_through_the_lambda_function_on_s3() -> anyhow::Result<()> {
    let Some(storage) = s3_storage("lambda query").await else {
        return Ok(());
    };
    let storage = Arc::new(storage);
    let runs = FixtureRun::all()?;
    let served = serve_runs(Arc::clone(&storage) as Arc<dyn Storage>, &runs, Ok).await?;
    served.server.stop().await?;

    let config = Config::from_lookup(|name| {
        (name == "AWS_LAMBDA_FUNCTION_MEMORY_SIZE").then(|| "1769".to_owned())
    })?;
    let state = Arc::new(AppState {
        query: Some(afterglow::lambda::query_service(storage, &config)?),
        ..AppState::default()
    });
    let api = Api::Lambda(router(state));
    for run in &runs {
        check_run(&api, run).await?;
    }
    Ok(())
}

/// A query cache far smaller than one session (1 byte: every file is evicted as soon as no
/// request reads it) still answers every run as Ray does, and deleted what it no longer held.
#[tokio::test]
async fn a_cache_smaller_than_a_session_still_answers_every_run() -> anyhow::Result<()> {
    let Some(storage) = s3_storage("bounded cache").await else {
        return Ok(());
    };
    let storage: Arc<dyn Storage> = Arc::new(storage);
    let runs = FixtureRun::all()?;
    let served = serve_runs(Arc::clone(&storage), &runs, Ok).await?;
    served.server.stop().await?;

    let dir = tempfile::tempdir()?;
    let settings = shared::query::QuerySettings {
        cache_bytes: Some(1),
        ..shared::query::QuerySettings::under(dir.path())
    };
    let state = Arc::new(AppState {
        query: Some(afterglow::state::QueryService {
            engine: shared::query::QueryEngine::open(Arc::clone(&storage), settings)?,
            token: None,
        }),
        ..AppState::default()
    });
    let api = Api::Lambda(router(state));
    for run in &runs {
        check_run(&api, run).await?;
    }
    let stored = storage
        .list("tables/")
        .await?
        .iter()
        .filter(|meta| meta.key.as_str().ends_with(".parquet"))
        .count();
    let cached = std::fs::read_dir(dir.path().join("cache"))?.count();
    ensure!(
        cached < stored,
        "the cache holds {cached} files, as many as the {stored} stored: nothing was evicted"
    );
    Ok(())
}
