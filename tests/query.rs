//! The dashboard API over Ray's captured traffic: posted to ingest, compacted, then queried
//! through `serve` (HTTP) and through the Lambda query function on SeaweedFS. Answers are held
//! to Ray's own state-API output for the same runs, and every answer (errors included) is
//! checked against `openapi.yaml`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use afterglow::http::router;
use afterglow::serve::ServeSettings;
use afterglow::state::AppState;
use afterglow_tests::api::{Api, our_rows, ray_counts_by_name, serve_locally};
use afterglow_tests::ray::{LOSSY_RUN, check, ray_millis};
use afterglow_tests::{
    FixtureRun, TestServer, bodies, fetch_encoded, local_storage, post_all, s3_storage, serve_runs,
    serving_settings,
};
use anyhow::{Context as _, ensure};
use serde_json::Value as Json;
use shared::auth::AccessToken;
use shared::compact::fold::FoldPolicy;
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

fn counts_of(object: &Json) -> anyhow::Result<BTreeMap<String, i64>> {
    object
        .as_object()
        .context("by_state")?
        .iter()
        .map(|(state, count)| Ok((state.clone(), count.as_i64().context("count")?)))
        .collect()
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
            grafana_url: None,
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

#[tokio::test]
async fn search_finds_a_task_by_a_word_of_its_stack_trace() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let (served, api) = serve_locally(std::slice::from_ref(&run)).await?;
    let truth = run.ground_truth("tasks.json")?;
    let failing = truth
        .as_array()
        .context("tasks")?
        .iter()
        .find(|task| {
            task["error_message"]
                .as_str()
                .is_some_and(|message| message.contains("KeyError"))
        })
        .context("a task whose stack trace names KeyError")?;
    let wanted = failing["task_id"].as_str().context("task_id")?;
    // Lower case on purpose: search ignores case.
    let found = api
        .all_pages(
            "/api/tasks",
            "q=keyerror&include_error_message=true",
            "tasks",
        )
        .await?;
    ensure!(
        found.iter().any(|task| task["task_id"] == wanted),
        "searching `keyerror` did not find {wanted}"
    );
    for task in &found {
        let text = [
            "task_id",
            "job_id",
            "actor_id",
            "node_id",
            "worker_id",
            "parent_task_id",
            "name",
            "func_or_class_name",
            "error_type",
            "error_message",
        ]
        .iter()
        .filter_map(|field| task[*field].as_str())
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase();
        ensure!(
            text.contains("keyerror"),
            "{task} does not mention keyerror"
        );
    }
    // And a word that is nowhere finds nothing.
    let none = api.ok("/api/tasks?q=no-such-word-anywhere").await?;
    ensure!(none["tasks"].as_array().is_some_and(Vec::is_empty));
    served.server.stop().await
}

/// Every order, paged by cursor in pages of 1 and 7 rows, lists every attempt once and in
/// order, nulls included (the lossy run has attempts that never ran: no duration); each page
/// first finds where its rows end by the sort column alone, so a page of 1 row has a bound
/// shared by ties and nulls.
#[tokio::test]
async fn pagination_visits_every_row_exactly_once_in_every_order() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let lossy = FixtureRun::named(LOSSY_RUN)?;
    let (served, api) = serve_locally(&[run, lossy]).await?;
    let total = api.ok("/api/summary").await?["total"]
        .as_u64()
        .context("total")?;
    let mut nulls = 0;
    for (sort, order, limit) in ["creation", "duration"]
        .into_iter()
        .flat_map(|sort| ["desc", "asc"].map(|order| (sort, order)))
        .flat_map(|(sort, order)| [1, 7].map(|limit| (sort, order, limit)))
    {
        {
            let rows = api
                .all_pages(
                    "/api/tasks",
                    &format!("sort={sort}&order={order}&limit={limit}"),
                    "tasks",
                )
                .await?;
            // The runs replayed the same script: task ids repeat across clusters.
            let keys: BTreeSet<(String, String, i64)> = rows
                .iter()
                .map(|row| {
                    (
                        row["cluster"].as_str().unwrap_or_default().to_owned(),
                        row["task_id"].as_str().unwrap_or_default().to_owned(),
                        row["attempt_number"].as_i64().unwrap_or(-1),
                    )
                })
                .collect();
            ensure!(
                rows.len() as u64 == total && keys.len() == rows.len(),
                "{sort} {order}: {} rows, {} distinct, {total} in the summary",
                rows.len(),
                keys.len()
            );
            let field = if sort == "creation" {
                "creation_time_ms"
            } else {
                "duration_ms"
            };
            // Nulls sort below every value.
            let values: Vec<i64> = rows
                .iter()
                .map(|row| row[field].as_i64().unwrap_or(i64::MIN))
                .collect();
            nulls += values.iter().filter(|value| **value == i64::MIN).count();
            let sorted = values.windows(2).all(|pair| {
                if order == "desc" {
                    pair[0] >= pair[1]
                } else {
                    pair[0] <= pair[1]
                }
            });
            ensure!(sorted, "{sort} {order} by {limit}: rows out of order");
        }
    }
    ensure!(
        nulls > 0,
        "no attempt without a time: the null orders went untried"
    );
    // Filters page too: FAILED attempts only, every one of them.
    let failed = api
        .all_pages("/api/tasks", "state=FAILED&limit=3", "tasks")
        .await?;
    let summary = api.ok("/api/summary?state=FAILED").await?;
    ensure!(failed.len() as u64 == summary["total"].as_u64().unwrap_or(0));
    ensure!(failed.iter().all(|task| task["state"] == "FAILED"));
    // Aggregate groups page as well.
    let groups = api
        .all_pages("/api/aggregates", "by=name&limit=2", "groups")
        .await?;
    let whole = api.ok("/api/aggregates?by=name&limit=1000").await?;
    ensure!(Some(&Json::Array(groups)) == whole.get("groups"));
    served.server.stop().await
}

#[tokio::test]
async fn bad_parameters_get_a_400_that_names_them() -> anyhow::Result<()> {
    let run = FixtureRun::named("edge-cases")?;
    let (served, api) = serve_locally(std::slice::from_ref(&run)).await?;
    let cases = [
        ("/api/tasks?limit=0", "limit"),
        ("/api/tasks?limit=100000", "limit"),
        ("/api/tasks?limit=ten", "limit"),
        ("/api/tasks?state=DONE", "state"),
        ("/api/tasks?job_id=not-hex", "job_id"),
        ("/api/tasks?sort=name", "sort"),
        ("/api/tasks?order=sideways", "order"),
        ("/api/tasks?cursor=bm90LWEtY3Vyc29y", "cursor"),
        ("/api/tasks?since_ms=10&until_ms=5", "since_ms"),
        ("/api/tasks?type=LAMBDA", "type"),
        ("/api/tasks?include_drivers=maybe", "include_drivers"),
        ("/api/tasks?colour=red", "colour"),
        ("/api/tasks?name=a&name=b", "name"),
        ("/api/aggregates?by=colour", "by"),
        ("/api/summary?cluster=no%20spaces", "cluster"),
        ("/api/tasks/xyz", "task_id"),
        ("/api/actors?state=ALIVE&job_id=zz", "job_id"),
        ("/api/timeline?limit=1000000", "limit"),
    ];
    for (url, parameter) in cases {
        let answer = api.get(url).await?;
        let message = answer.body["error"].as_str().unwrap_or_default();
        ensure!(
            answer.status == 400 && message.contains(parameter),
            "{url}: {} {message:?}",
            answer.status
        );
    }
    // A cursor of one ordering is refused by another.
    let page = api.ok("/api/tasks?limit=1&sort=duration").await?;
    let cursor = page["next"].as_str().context("next")?;
    let answer = api
        .get(&format!("/api/tasks?limit=1&cursor={cursor}"))
        .await?;
    ensure!(answer.status == 400, "{}", answer.body);
    let missing = api.get("/api/tasks/00ff").await?;
    ensure!(missing.status == 404, "{}", missing.body);
    served.server.stop().await
}

#[tokio::test]
async fn task_detail_shows_every_attempt_with_rays_transitions() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let (served, api) = serve_locally(std::slice::from_ref(&run)).await?;
    let truth = run.ground_truth("tasks.json")?;
    let mut by_task: BTreeMap<&str, Vec<&Json>> = BTreeMap::new();
    for task in truth.as_array().context("tasks")? {
        by_task
            .entry(task["task_id"].as_str().context("task_id")?)
            .or_default()
            .push(task);
    }
    let retried = by_task
        .values()
        .filter(|attempts| attempts.len() > 1)
        .count();
    ensure!(retried > 0, "the fixture has a retried task");
    for (task_id, ray_attempts) in &by_task {
        let detail = api.ok(&format!("/api/tasks/{task_id}")).await?;
        let attempts = detail["attempts"].as_array().context("attempts")?;
        ensure!(
            attempts.len() == ray_attempts.len(),
            "{task_id}: {} attempts vs Ray's {}",
            attempts.len(),
            ray_attempts.len()
        );
        for ray in ray_attempts {
            let ours = attempts
                .iter()
                .find(|attempt| attempt["attempt_number"] == ray["attempt_number"])
                .with_context(|| format!("{task_id} attempt {}", ray["attempt_number"]))?;
            let theirs: Vec<(String, String)> = ray["events"]
                .as_array()
                .context("events")?
                .iter()
                .map(|event| {
                    Ok((
                        event["state"].as_str().context("state")?.to_owned(),
                        ray_millis(event["created_ms"].as_str().context("created_ms")?)?,
                    ))
                })
                .collect::<anyhow::Result<_>>()?;
            let mine: Vec<(String, String)> = ours["events"]
                .as_array()
                .context("events")?
                .iter()
                .map(|event| {
                    (
                        event["state"].as_str().unwrap_or_default().to_owned(),
                        event["created_ms"].to_string(),
                    )
                })
                .collect();
            ensure!(
                mine == theirs,
                "{task_id}: events {mine:?} vs Ray's {theirs:?}"
            );
            ensure!(
                ours["error_message"] == ray["error_message"],
                "{task_id}: error {} vs {}",
                ours["error_message"],
                ray["error_message"]
            );
            ensure!(
                ours["task_log_info"]["stdout_file"] == ray["task_log_info"]["stdout_file"],
                "{task_id}: log info"
            );
            ensure!(
                ours["required_resources"] == ray["required_resources"],
                "{task_id}: resources"
            );
        }
    }
    served.server.stop().await
}

#[tokio::test]
async fn timeline_draws_every_attempt_that_ran() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let (served, api) = serve_locally(std::slice::from_ref(&run)).await?;
    let truth = run.ground_truth("tasks.json")?;
    let ran = truth
        .as_array()
        .context("tasks")?
        .iter()
        .filter(|task| !task["start_time_ms"].is_null() && !task["end_time_ms"].is_null())
        .count();
    let trace = api.ok("/api/timeline").await?;
    let events = trace["traceEvents"].as_array().context("traceEvents")?;
    let tasks = events.iter().filter(|event| event["cat"] == "task").count();
    ensure!(tasks == ran, "{tasks} task spans, {ran} attempts that ran");
    ensure!(events.iter().any(|event| event["cat"] == "profile"));
    ensure!(events.iter().any(|event| event["name"] == "process_name"));
    let limited = api.ok("/api/timeline?limit=5").await?;
    ensure!(limited["otherData"]["truncated"] == true);
    // Page through with the cursor: every attempt that ran, each exactly once.
    let mut seen = BTreeSet::new();
    let mut path = "/api/timeline?limit=5".to_owned();
    for _ in 0..ran {
        let page = api.ok(&path).await?;
        for event in page["traceEvents"].as_array().context("traceEvents")? {
            if event["cat"] == "task" {
                let attempt = (
                    event["args"]["task_id"].to_string(),
                    event["args"]["attempt_number"].to_string(),
                );
                ensure!(seen.insert(attempt.clone()), "{attempt:?} drawn twice");
            }
        }
        match page["otherData"]["next"].as_str() {
            Some(next) => path = format!("/api/timeline?limit=5&cursor={next}"),
            None => break,
        }
    }
    ensure!(
        seen.len() == ran,
        "{} attempts over the pages, {ran} ran",
        seen.len()
    );
    served.server.stop().await
}

#[tokio::test]
async fn bearer_mode_refuses_requests_without_the_token() -> anyhow::Result<()> {
    const QUERY_TOKEN: &str = "query-token-0123456789";
    let run = FixtureRun::named("edge-cases")?;
    let (data, storage) = local_storage()?;
    let served = serve_runs(Arc::new(storage), std::slice::from_ref(&run), |settings| {
        Ok(ServeSettings {
            query_token: Some(AccessToken::new(QUERY_TOKEN)?),
            ..settings
        })
    })
    .await?;
    let api = Api::Http(served.server.url.clone());
    let none = api.get("/api/summary").await?;
    ensure!(none.status == 401, "{}", none.body);
    let wrong = api
        .get_with("/api/summary", Some("Bearer wrong-token-0123456789"))
        .await?;
    ensure!(wrong.status == 403, "{}", wrong.body);
    let right = api
        .get_with("/api/summary", Some(&format!("Bearer {QUERY_TOKEN}")))
        .await?;
    ensure!(right.status == 200 && right.body["total"].as_u64() > Some(0));
    drop(data);
    served.server.stop().await
}

/// DESIGN §7: a batch is visible in `serve` within 2 s of its POST.
#[tokio::test]
async fn a_replayed_run_is_visible_in_the_summary_within_two_seconds() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let expected = run
        .ground_truth("tasks.json")?
        .as_array()
        .map_or(0, Vec::len) as u64;
    let (data, storage) = local_storage()?;
    let (settings, _queue, _scratch) = serving_settings(Arc::new(storage))?;
    let server = TestServer::start(settings).await?;
    let api = Api::Http(server.url.clone());
    post_all(&format!("{}/v1/events/fresh", server.url), &bodies(&run)?).await?;
    let posted = Instant::now();
    let mut seen = 0;
    while posted.elapsed() < Duration::from_secs(2) {
        seen = api.ok("/api/summary?cluster=fresh").await?["total"]
            .as_u64()
            .unwrap_or(0);
        if seen == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let waited = posted.elapsed();
    ensure!(
        seen == expected,
        "after {waited:?} the summary shows {seen} of {expected} attempts"
    );
    println!("visible {waited:?} after the last POST");
    drop(data);
    server.stop().await
}

/// The page is served beside the API, with relative URLs so a proxy can mount both anywhere.
#[tokio::test]
async fn the_dashboard_page_and_its_assets_are_served() -> anyhow::Result<()> {
    let (served, _api) = serve_locally(&[]).await?;
    let client = reqwest::Client::new();
    for (path, content_type, must_contain) in [
        ("/", "text/html", "src=\"assets/app.js\""),
        ("/assets/app.js", "text/javascript", "fetch(`api/"),
        ("/assets/style.css", "text/css", "--failed"),
    ] {
        let response = client
            .get(format!("{}{path}", served.server.url))
            .send()
            .await?;
        ensure!(response.status() == 200, "{path}: {}", response.status());
        let kind = response
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        ensure!(kind.starts_with(content_type), "{path}: {kind}");
        let text = response.text().await?;
        ensure!(text.contains(must_contain), "{path} lacks {must_contain}");
    }
    served.server.stop().await
}

/// Clients that take gzip (browsers, Ray's dashboard and CLI, `afterglow proxy`) get text
/// answers of some size gzipped, the same bytes once decoded; others, and small answers, get
/// them as they are.
#[tokio::test]
async fn answers_are_gzipped_for_clients_that_take_gzip() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let (data, storage) = local_storage()?;
    let served = serve_runs(Arc::new(storage), std::slice::from_ref(&run), Ok).await?;
    let base = &served.server.url;
    for path in [
        "/api/tasks?limit=1000".to_owned(),
        "/api/tasks?limit=1000&include_error_message=true".to_owned(),
        "/".to_owned(),
        "/assets/app.js".to_owned(),
        format!(
            "/ray/{}/latest/api/v0/tasks?limit=10000&detail=True",
            run.name
        ),
    ] {
        let url = format!("{base}{path}");
        let plain = fetch_encoded(&url, None).await?;
        ensure!(
            plain.status == 200 && plain.encoding.is_none(),
            "{path}: {plain:?}"
        );
        let packed = fetch_encoded(&url, Some("gzip, deflate, br")).await?;
        ensure!(
            packed.status == 200 && packed.encoding.as_deref() == Some("gzip"),
            "{path}: {:?}",
            packed.encoding
        );
        ensure!(
            packed
                .vary
                .as_deref()
                .is_some_and(|vary| vary.contains("accept-encoding")),
            "{path}: Vary {:?}",
            packed.vary
        );
        ensure!(
            packed.sent.len() * 2 < plain.sent.len(),
            "{path}: {} bytes gzipped from {}",
            packed.sent.len(),
            plain.sent.len()
        );
        match serde_json::from_slice::<Json>(&plain.body) {
            Ok(json) => ensure!(
                serde_json::from_slice::<Json>(&packed.body)? == json,
                "{path}: another answer once decoded"
            ),
            Err(_) => ensure!(
                packed.body == plain.body,
                "{path}: other bytes once decoded"
            ),
        }
        let refused = fetch_encoded(&url, Some("gzip;q=0, deflate")).await?;
        ensure!(
            refused.encoding.is_none(),
            "{path}: gzip sent though refused"
        );
    }
    let small = fetch_encoded(&format!("{base}/api/summary"), Some("gzip")).await?;
    ensure!(
        small.status == 200 && small.encoding.is_none() && small.sent.len() < 1024,
        "a {}-byte answer: {:?}",
        small.sent.len(),
        small.encoding
    );
    drop(data);
    served.server.stop().await
}

/// Counts of a response's `groups`: key → total.
fn group_totals(answer: &Json) -> anyhow::Result<BTreeMap<String, u64>> {
    ensure!(answer["next"].is_null(), "one page holds every group");
    answer["groups"]
        .as_array()
        .context("groups")?
        .iter()
        .map(|group| {
            Ok((
                group["key"].as_str().context("key")?.to_owned(),
                group["total"].as_u64().context("total")?,
            ))
        })
        .collect()
}

/// Generates synthetic traffic for `cluster` and ingests every body; returns what was generated.
async fn ingest_synthetic(
    storage: &Arc<dyn Storage>,
    cluster: &str,
    settings: synth::SynthSettings,
) -> anyhow::Result<synth::Truth> {
    use shared::ingest::{IngestAccess, IngestLimits, Ingestor};

    let ingestor = Ingestor::new(
        Arc::clone(storage),
        IngestAccess::Open,
        IngestLimits::default(),
    );
    let cluster = shared::layout::ClusterName::new(cluster)?;
    let mut generator = synth::Generator::new(settings);
    for body in generator.by_ref() {
        ingestor.ingest(&cluster, &body?.json).await?;
    }
    Ok(generator.truth().clone())
}

/// A compactor over `storage` that folds deltas into a base once there are more than
/// `max_deltas` of them (the rest of the fold policy as deployed).
fn compactor_folding_past(
    storage: &Arc<dyn Storage>,
    max_deltas: usize,
) -> anyhow::Result<(shared::compact::Compactor, tempfile::TempDir)> {
    afterglow_tests::compactor(
        Arc::clone(storage),
        shared::compact::CompactSettings {
            fold: FoldPolicy {
                max_deltas,
                // These sessions are small; the tests are about their deltas.
                small_session_rows: 0,
                ..FoldPolicy::default()
            },
            ..shared::compact::CompactSettings::default()
        },
    )
}

/// Two sessions of synthetic traffic (one per seed) of `attempts` each over `jobs` jobs, with
/// a tenth of first attempts failing (some retried) and a twentieth of bodies re-delivered,
/// ingested as `cluster`. Returns the attempts generated.
async fn ingest_failing_sessions(
    storage: &Arc<dyn Storage>,
    cluster: &str,
    seeds: [u64; 2],
    attempts: u64,
    jobs: u32,
) -> anyhow::Result<u64> {
    let mut generated = 0;
    for seed in seeds {
        let settings = synth::SynthSettings {
            attempts,
            jobs,
            nodes: 4,
            failure_rate: 0.1,
            duplicate_rate: 0.05,
            seed,
            ..synth::SynthSettings::default()
        };
        generated += ingest_synthetic(storage, cluster, settings).await?.attempts;
    }
    Ok(generated)
}

/// Synthetic traffic (what `afterglow generate` and `bench` send), ingested, compacted in small
/// batches that fold into a base several times, is counted exactly as the generator says it
/// generated it: by state, by task name and by error type, re-sent bodies counted once.
#[tokio::test]
async fn synthetic_traffic_is_counted_as_generated() -> anyhow::Result<()> {
    use shared::query::{ApiRoute, QueryEngine, QuerySettings};
    use synth::SynthSettings;

    let (dir, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    let truth = ingest_synthetic(
        &storage,
        "synthetic",
        SynthSettings {
            attempts: 20_000,
            jobs: 3,
            nodes: 5,
            failure_rate: 0.1,
            duplicate_rate: 0.05,
            seed: 7,
            ..SynthSettings::default()
        },
    )
    .await?;
    ensure!(truth.redeliveries > 0, "some bodies are sent twice");

    let (compactor, _scratch) = compactor_folding_past(&storage, 3)?;
    let keys = compactor.raw_keys().await?;
    for batch in keys.chunks(6) {
        compactor.compact(batch).await?;
    }

    let engine = QueryEngine::open(storage, QuerySettings::under(&dir.path().join("query")))?;
    let ask = |route: ApiRoute, params: &[(&str, &str)]| {
        let params: Vec<(String, String)> = params
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        let engine = &engine;
        async move { engine.answer(&route, &params).await }
    };
    let summary = ask(ApiRoute::Summary, &[]).await?;
    ensure!(
        summary["total"].as_u64() == Some(truth.attempts),
        "{summary}"
    );
    let by_state: BTreeMap<String, u64> = truth.by_state.clone().into_iter().collect();
    let served: BTreeMap<String, u64> = counts_of(&summary["by_state"])?
        .into_iter()
        .map(|(state, count)| (state, count as u64))
        .collect();
    ensure!(served == by_state, "by state: {served:?} != {by_state:?}");

    let names =
        group_totals(&ask(ApiRoute::Aggregates, &[("by", "name"), ("limit", "1000")]).await?)?;
    let expected_names: BTreeMap<String, u64> = truth.by_name.clone().into_iter().collect();
    ensure!(
        names == expected_names,
        "by name: {names:?} != {expected_names:?}"
    );

    let mut errors = group_totals(
        &ask(
            ApiRoute::Aggregates,
            &[("by", "error_type"), ("limit", "1000")],
        )
        .await?,
    )?;
    errors.remove("");
    let expected_errors: BTreeMap<String, u64> = truth.by_error_type.clone().into_iter().collect();
    ensure!(
        errors == expected_errors,
        "by error type: {errors:?} != {expected_errors:?}"
    );
    Ok(())
}

/// A file the manifest names may be gone (deleted by hand, or expired by a storage rule under
/// a live manifest): readers answer from the rest of the session, without that file's rows,
/// instead of failing every request for the session.
#[tokio::test]
async fn a_missing_table_file_costs_its_rows_not_the_session() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let (data, storage) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(storage);
    let served = serve_runs(Arc::clone(&storage), std::slice::from_ref(&run), Ok).await?;
    let api = Api::Http(served.server.url.clone());
    let cluster = &run.name;
    let full = api.ok(&format!("/api/summary?cluster={cluster}")).await?["total"]
        .as_u64()
        .context("total")?;
    let manifests = storage
        .list(&format!("tables/manifests/cluster={cluster}/"))
        .await?;
    let first = manifests.first().context("no manifest")?;
    let manifest = shared::tables::manifest::load(&*storage, &first.key)
        .await?
        .manifest;
    let oldest = manifest
        .task_attempts
        .all()
        .next()
        .context("no attempt file")?;
    let nodes = manifest.entities.get("nodes").context("no nodes file")?;
    for gone in [&oldest.key, &nodes.key] {
        storage.delete(gone).await?;
    }
    let summary = api.ok(&format!("/api/summary?cluster={cluster}")).await?;
    let total = summary["total"].as_u64().context("total")?;
    ensure!(
        total <= full,
        "{total} attempts after a file was lost, {full} before"
    );
    api.ok(&format!("/api/tasks?cluster={cluster}")).await?;
    let nodes = api.ok(&format!("/api/nodes?cluster={cluster}")).await?;
    println!("a lost file: {total} of {full} attempts still answered; nodes: {nodes}");
    drop(data);
    served.server.stop().await
}

/// Each delta records the stored rows it supersedes, and reading every file minus those rows
/// (no key join) gives exactly the rows the read by key gives: over two sessions of synthetic
/// traffic re-delivered and compacted in small batches, where later deltas do supersede rows.
/// A session whose deltas predate deletion vectors (the field stripped from its manifest) is
/// still read by key, with the same answer.
#[tokio::test]
async fn reading_without_superseded_rows_equals_reading_by_key() -> anyhow::Result<()> {
    use shared::query::params::Scope;
    use shared::query::snapshot::{Needs, snapshot};
    use shared::query::sql::newest_rows;
    use shared::query::{ApiRoute, QueryEngine, QuerySettings};
    use shared::storage::FileCache;

    let (dir, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    let attempts = ingest_failing_sessions(&storage, "positions", [11, 12], 6_000, 2).await?;
    let (compactor, _scratch) = compactor_folding_past(&storage, 100)?;
    for batch in compactor.raw_keys().await?.chunks(3) {
        compactor.compact(batch).await?;
    }

    let cache = FileCache::new(Arc::clone(&storage), dir.path().join("cache"), 4);
    let needs = Needs {
        attempts: true,
        ..Needs::default()
    };
    let by_position = snapshot(&storage, &cache, &Scope::default(), needs).await?;
    let vectors = by_position
        .task_attempts
        .deletes
        .clone()
        .context("every delta was written with its deletion vector")?;
    let connection = shared::tables::open_duckdb()?;
    let mut superseded = 0i64;
    for vector in &vectors {
        let sql = format!(
            "SELECT count(*) FROM read_parquet('{}')",
            vector.path.display()
        );
        superseded += connection.query_row(&sql, [], |row| row.get::<_, i64>(0))?;
    }
    ensure!(superseded > 0, "no delta superseded a stored row");
    let mut by_key = by_position.task_attempts.clone();
    by_key.deletes = None;
    let rows = |files: &shared::tables::newest::LocalFiles| -> anyhow::Result<Vec<String>> {
        let relation = newest_rows(&files.files()).context("no files")?;
        let sql = format!(
            "SELECT concat_ws('|', session_name, task_id, attempt_number, state, error_type,
                              end_time_ms, node_id, worker_id)
             FROM {relation} WHERE type <> 'DRIVER_TASK' ORDER BY 1"
        );
        let mut statement = connection.prepare(&sql)?;
        let rows = statement
            .query_map([], |row| row.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    };
    let positional = rows(&by_position.task_attempts)?;
    let keyed = rows(&by_key)?;
    ensure!(
        positional.len() as u64 == attempts,
        "{} rows by position, {} by key, {attempts} generated",
        positional.len(),
        keyed.len()
    );
    ensure!(
        positional == keyed,
        "the read by position differs from the read by key"
    );
    println!(
        "{} attempts, {superseded} superseded rows in {} deletion vectors",
        positional.len(),
        vectors.len()
    );

    // A manifest whose deltas have no vectors, as an earlier build wrote it.
    let engine = QueryEngine::open(
        Arc::clone(&storage),
        QuerySettings::under(&dir.path().join("query")),
    )?;
    let before = engine.answer(&ApiRoute::Summary, &[]).await?;
    // Pages: the newest first, then the next by cursor, and the oldest first; a job's failures.
    async fn pages(engine: &QueryEngine) -> anyhow::Result<Vec<Json>> {
        let ask = |pairs: &[(&str, &str)]| {
            let params: Vec<(String, String)> = pairs
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect();
            async move { engine.answer(&ApiRoute::Tasks, &params).await }
        };
        let first = ask(&[("limit", "200")]).await?;
        let cursor = first["next"].as_str().context("a next page")?.to_owned();
        let second = ask(&[("limit", "200"), ("cursor", &cursor)]).await?;
        let oldest = ask(&[("limit", "50"), ("order", "asc"), ("sort", "duration")]).await?;
        let failed = ask(&[("limit", "100"), ("state", "FAILED")]).await?;
        // Small pages, whose first stored rows hold more superseded versions than newest
        // rows: read again with more rows until enough are newest.
        let mut small = Vec::new();
        for limit in ["1", "2", "5"] {
            small.push(ask(&[("limit", limit)]).await?);
            small.push(ask(&[("limit", limit), ("sort", "duration")]).await?);
        }
        Ok([vec![first, second, oldest, failed], small].concat())
    }
    let pages_by_position = pages(&engine).await?;
    ensure!(
        engine.page_retakes() > 0,
        "no page read more of the first rows: the test does not reach that path"
    );
    rewrite_manifests(&*storage, |manifest| {
        for delta in &mut manifest.task_attempts.deltas {
            delta.deletes = None;
        }
    })
    .await?;
    let legacy = snapshot(&storage, &cache, &Scope::default(), needs).await?;
    ensure!(legacy.task_attempts.deletes.is_none());
    let after = engine.answer(&ApiRoute::Summary, &[]).await?;
    ensure!(
        after["total"] == before["total"] && after["by_state"] == before["by_state"],
        "{after} != {before}"
    );
    ensure!(after["total"].as_u64() == Some(attempts), "{after}");
    let pages_by_key = pages(&engine).await?;
    for (by_position, by_key) in pages_by_position.iter().zip(&pages_by_key) {
        ensure!(
            by_position == by_key,
            "a page read by position differs from the page read by key:\n{by_position}\n{by_key}"
        );
    }
    Ok(())
}

/// Rewrites every session's manifest with `edit` applied, as an earlier build might have
/// written it.
async fn rewrite_manifests(
    storage: &dyn Storage,
    edit: impl Fn(&mut shared::tables::manifest::Manifest),
) -> anyhow::Result<()> {
    for meta in storage.list("tables/manifests/").await? {
        let mut manifest = shared::tables::manifest::load(storage, &meta.key)
            .await?
            .manifest;
        edit(&mut manifest);
        storage
            .put(
                &meta.key,
                serde_json::to_vec(&manifest)?.into(),
                shared::storage::PutMode::Overwrite,
            )
            .await?;
    }
    Ok(())
}

/// Rewrites every manifest with its rollups' format unknown, so reads count by scanning.
async fn forget_rollups(storage: &dyn Storage) -> anyhow::Result<()> {
    rewrite_manifests(storage, |manifest| {
        for file in manifest
            .task_attempts
            .base
            .iter_mut()
            .chain(&mut manifest.task_attempts.deltas)
        {
            file.rollup_format = None;
        }
    })
    .await
}

/// The deltas of every session, by manifest key.
async fn deltas_by_session(
    storage: &dyn Storage,
) -> anyhow::Result<BTreeMap<String, Vec<shared::tables::manifest::DataFile>>> {
    let mut sessions = BTreeMap::new();
    for meta in storage.list("tables/manifests/").await? {
        let manifest = shared::tables::manifest::load(storage, &meta.key)
            .await?
            .manifest;
        sessions.insert(meta.key.to_string(), manifest.task_attempts.deltas);
    }
    Ok(sessions)
}

/// An earlier delta's rollup that is gone or cannot be read (garbage bytes) does not stop
/// compaction: a run adds in earlier rollups only to save reads, so it writes its delta's
/// rollup counting that delta alone and goes on; a fold that cannot fetch or sum them counts
/// its new base. (Without the fallbacks the runs failed fetching the rollup and then reading
/// it, at every retry, and so did the folds.) The summary and aggregates read before and
/// after the fold equal a scan's.
#[tokio::test]
async fn an_earlier_rollup_that_is_damaged_or_gone_does_not_stop_compaction() -> anyhow::Result<()>
{
    use shared::query::{ApiRoute, QueryEngine, QuerySettings};

    let (dir, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    ingest_failing_sessions(&storage, "damaged", [41, 42], 3_000, 2).await?;
    let (compactor, _scratch) = compactor_folding_past(&storage, 100)?;
    let keys = compactor.raw_keys().await?;
    let batches: Vec<&[shared::storage::ObjectKey]> =
        keys.chunks(keys.len().div_ceil(3).max(1)).collect();
    ensure!(batches.len() == 3, "{} raw objects", keys.len());
    compactor.compact(batches[0]).await?;
    // Gone first, then garbage over every earlier delta's rollup key: the fold then fetches
    // them all and cannot read them.
    for (step, damage) in ["gone", "garbage"].into_iter().enumerate() {
        let before = deltas_by_session(&*storage).await?;
        for deltas in before.values() {
            for delta in deltas {
                let key = delta.rollup.as_ref().context("a rollup")?;
                if damage == "garbage" {
                    storage
                        .put(
                            key,
                            bytes::Bytes::from_static(b"not parquet"),
                            shared::storage::PutMode::Overwrite,
                        )
                        .await?;
                } else {
                    storage.delete(key).await?;
                }
            }
        }
        compactor.compact(batches[step + 1]).await?;
        let after = deltas_by_session(&*storage).await?;
        let mut checked = 0;
        for (session, deltas) in &after {
            let earlier = before.get(session).map_or(0, Vec::len);
            for delta in deltas.iter().skip(earlier) {
                ensure!(
                    delta.rollup_covers == Some(1),
                    "{damage}: a new delta after {earlier} covers {:?}",
                    delta.rollup_covers
                );
                checked += usize::from(earlier > 0);
            }
        }
        ensure!(
            checked > 0,
            "{damage}: no session added a delta after a damaged one"
        );
    }
    let requests: Vec<(ApiRoute, Vec<(String, String)>)> = vec![
        (ApiRoute::Summary, Vec::new()),
        (ApiRoute::Summary, vec![("state".into(), "FAILED".into())]),
        (ApiRoute::Aggregates, vec![("by".into(), "name".into())]),
    ];
    // The answers, and how many came from rollups.
    let ask = |name: &'static str| {
        let engine = QueryEngine::open(
            Arc::clone(&storage),
            QuerySettings::under(&dir.path().join(name)),
        );
        let requests = &requests;
        async move {
            let engine = engine?;
            let mut answers = Vec::new();
            for (route, params) in requests {
                answers.push(engine.answer(route, params).await?);
            }
            anyhow::Ok((answers, engine.rollup_answers()))
        }
    };
    // One session's newest rollup gone too: its fold cannot fetch the rollups it would sum,
    // the other's cannot read them.
    let sessions = deltas_by_session(&*storage).await?;
    let newest = sessions
        .values()
        .next()
        .and_then(|deltas| deltas.last())
        .and_then(|delta| delta.rollup.as_ref())
        .context("a newest delta's rollup")?;
    storage.delete(newest).await?;
    let (damaged, from_rollups) = ask("query-damaged").await?;
    ensure!(
        from_rollups == 0,
        "{from_rollups} answers from damaged rollups"
    );
    let folded = compactor.fold().await?;
    ensure!(folded == 2, "{folded} sessions folded");
    ensure!(
        compactor.folds_summed() == 0,
        "a fold summed unreadable rollups"
    );
    let (counted, from_rollups) = ask("query-folded").await?;
    ensure!(
        from_rollups > 0,
        "no answer from the counted bases' rollups"
    );
    forget_rollups(&*storage).await?;
    let (scanned, _) = ask("query-scanned").await?;
    for (answers, when) in [(&damaged, "before the fold"), (&counted, "after it")] {
        for ((request, answer), scan) in requests.iter().zip(answers).zip(&scanned) {
            ensure!(
                answer == scan,
                "{request:?} {when}:\n{answer}\nscanned:\n{scan}"
            );
        }
    }
    Ok(())
}

/// Every base and delta has a rollup (counts by grouping, job, state, type and rounded
/// duration, with minus rows for the versions a delta supersedes), and the summary and the
/// aggregates and insights answered from them equal the answers of a scan: over two sessions of
/// synthetic traffic with failures, retries and re-delivered bodies, compacted in small batches
/// that fold into a base, each delta's rollup adding in those of the deltas before it. The
/// engine's count of rollup answers proves which path ran; with the rollups marked as the first
/// format (as an earlier build wrote them) the same requests scan.
#[tokio::test]
async fn rollups_count_what_a_scan_counts() -> anyhow::Result<()> {
    use shared::query::{ApiRoute, QueryEngine, QuerySettings};

    let (dir, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    ingest_failing_sessions(&storage, "rollups", [21, 22], 8_000, 3).await?;
    let (compactor, _scratch) = compactor_folding_past(&storage, 4)?;
    // Every base a fold installed, seen in the manifests after each run.
    let mut bases = BTreeSet::new();
    for batch in compactor.raw_keys().await?.chunks(3) {
        compactor.compact(batch).await?;
        for meta in storage.list("tables/manifests/").await? {
            let manifest = shared::tables::manifest::load(&*storage, &meta.key)
                .await?
                .manifest;
            bases.extend(manifest.task_attempts.base.into_iter().map(|base| base.key));
        }
    }
    // Every fold summed its base's rollup from the rollups it replaced.
    ensure!(bases.len() >= 2, "{} folds", bases.len());
    ensure!(
        compactor.folds_summed() == u64::try_from(bases.len())?,
        "{} of {} folds summed their base's rollup",
        compactor.folds_summed(),
        bases.len()
    );
    let mut rollups = 0;
    let mut minus_rows = 0;
    // Rollups a read sums: each base's, and one per bit of the number of deltas (each delta's
    // rollup adds in the rollups before it that count no more deltas than it has gathered).
    let mut read = 0;
    let mut most_deltas = 0;
    let connection = shared::tables::open_duckdb()?;
    for meta in storage.list("tables/manifests/").await? {
        let manifest = shared::tables::manifest::load(&*storage, &meta.key)
            .await?
            .manifest;
        ensure!(
            manifest.task_attempts.has_rollups(),
            "a file without its rollup"
        );
        let deltas = &manifest.task_attempts.deltas;
        if let Some(newest) = deltas.last() {
            let lowest_bit = 1 << deltas.len().trailing_zeros();
            ensure!(
                newest.rollup_covers == Some(lowest_bit),
                "the newest of {} deltas covers {:?}",
                deltas.len(),
                newest.rollup_covers
            );
        }
        read += manifest.task_attempts.base.len() + deltas.len().count_ones() as usize;
        most_deltas = most_deltas.max(deltas.len());
        for base in &manifest.task_attempts.base {
            // A summed base rollup is the one counted from the base, row for row.
            let key = base.rollup.as_ref().context("rollup")?;
            let stored = dir.path().join("base-rollup.parquet");
            std::fs::write(&stored, storage.get(key).await?.body)?;
            let rows = dir.path().join("base.parquet");
            std::fs::write(&rows, storage.get(&base.key).await?.body)?;
            let counted = dir.path().join("base-counted.parquet");
            shared::tables::rollup::write_rollup(
                &connection,
                &rows,
                &shared::tables::rollup::RowsByFile::new(),
                &[],
                &counted,
            )?;
            for (left, right) in [(&stored, &counted), (&counted, &stored)] {
                let extra: i64 = connection.query_row(
                    &format!(
                        "SELECT count(*) FROM (SELECT * FROM read_parquet('{}')
                         EXCEPT ALL SELECT * FROM read_parquet('{}'))",
                        left.display(),
                        right.display()
                    ),
                    [],
                    |row| row.get(0),
                )?;
                ensure!(extra == 0, "{extra} rows of {left:?} not in {right:?}");
            }
        }
        for file in manifest.task_attempts.all() {
            let key = file.rollup.as_ref().context("rollup")?;
            let path = dir.path().join(format!("rollup-{rollups}.parquet"));
            std::fs::write(&path, storage.get(key).await?.body)?;
            rollups += 1;
            minus_rows += connection.query_row(
                &format!(
                    "SELECT count(*) FROM read_parquet('{}') WHERE sign < 0",
                    path.display()
                ),
                [],
                |row| row.get::<_, i64>(0),
            )?;
        }
    }
    ensure!(minus_rows > 0, "no rollup subtracts a superseded version");
    ensure!(
        most_deltas >= 2,
        "no session has two deltas: no rollup adds in another"
    );

    let engine = QueryEngine::open(
        Arc::clone(&storage),
        QuerySettings::under(&dir.path().join("query")),
    )?;
    let jobs = engine
        .answer(&ApiRoute::Aggregates, &[("by".into(), "job_id".into())])
        .await?;
    let job = jobs["groups"][0]["key"]
        .as_str()
        .context("a job")?
        .to_owned();
    let mut requests: Vec<(ApiRoute, Vec<(String, String)>)> = Vec::new();
    let filters: Vec<Vec<(&str, &str)>> = vec![
        vec![],
        vec![("job_id", &job)],
        vec![("state", "FAILED")],
        vec![("state", "RUNNING,FINISHED")],
        vec![("type", "ACTOR_TASK")],
        vec![("include_drivers", "true"), ("include_incomplete", "true")],
    ];
    for filter in &filters {
        let owned = |extra: &[(&str, &str)]| -> Vec<(String, String)> {
            filter
                .iter()
                .chain(extra)
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect()
        };
        requests.push((ApiRoute::Summary, owned(&[])));
        requests.push((ApiRoute::Insights, owned(&[])));
        for by in [
            "name",
            "func_or_class_name",
            "error_type",
            "job_id",
            "node_id",
        ] {
            requests.push((
                ApiRoute::Aggregates,
                owned(&[("by", by), ("limit", "1000")]),
            ));
        }
    }
    let mut rolled = Vec::new();
    for (route, params) in &requests {
        rolled.push(engine.answer(route, params).await?);
    }
    ensure!(
        engine.rollup_answers() == requests.len() as u64 + 1,
        "{} of {} requests answered from rollups",
        engine.rollup_answers(),
        requests.len() + 1
    );
    // Rollups are read without the attempts files (a cold Lambda would download the whole
    // base for nothing).
    let cache = shared::storage::FileCache::new(Arc::clone(&storage), dir.path().join("c"), 4);
    let rolled_only = shared::query::snapshot::snapshot(
        &storage,
        &cache,
        &shared::query::params::Scope::default(),
        shared::query::snapshot::Needs {
            rollups: true,
            ..Default::default()
        },
    )
    .await?;
    ensure!(
        rolled_only.rollups.as_ref().map(Vec::len) == Some(read)
            && rolled_only.task_attempts.base.is_empty()
            && rolled_only.task_attempts.deltas.is_empty(),
        "a snapshot for rollups fetches them and nothing else"
    );

    forget_rollups(&*storage).await?;
    let scanning = QueryEngine::open(
        Arc::clone(&storage),
        QuerySettings::under(&dir.path().join("query-scan")),
    )?;
    for ((route, params), rolled) in requests.iter().zip(&rolled) {
        let scanned = scanning.answer(route, params).await?;
        ensure!(
            &scanned == rolled,
            "{route:?} {params:?}: from rollups\n{rolled}\nscanned\n{scanned}"
        );
    }
    ensure!(
        scanning.rollup_answers() == 0,
        "rollups of the first format were read"
    );
    let findings: usize = requests
        .iter()
        .zip(&rolled)
        .filter(|((route, _), _)| *route == ApiRoute::Insights)
        .map(|(_, answer)| answer["findings"].as_array().map_or(0, Vec::len))
        .sum();
    ensure!(findings > 0, "no insight to compare");
    println!(
        "{} requests equal ({findings} findings); {rollups} rollups, {minus_rows} minus rows",
        requests.len()
    );
    Ok(())
}

/// A task lookup reads only the blocks its key indexes name and answers what a scan answers:
/// over two sessions of synthetic traffic with failures, retries and re-delivered bodies,
/// compacted into a base and deltas, for tasks whose attempts are stored in several of those
/// files (some in different states: only the newest file's version is the task's), for tasks
/// stored once, and for an id nobody has. The engine's count of indexed lookups proves which
/// path ran. With every data file rewritten in a form the parquet crate cannot read, the
/// lookups scan and answer the same; with the indexes gone from the manifests (as an earlier
/// build wrote them) too.
#[tokio::test]
async fn a_lookup_through_key_indexes_equals_a_lookup_by_scan() -> anyhow::Result<()> {
    use shared::query::{ApiRoute, QueryEngine, QueryError, QuerySettings};

    let (dir, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    ingest_failing_sessions(&storage, "indexed", [21, 22], 5_000, 2).await?;
    let (_compactor, _scratch, _) = in_base_and_deltas(&storage, 0).await?;

    let LookupCases {
        ids,
        session,
        recent,
    } = lookup_cases(&storage, &dir.path().join("cache")).await?;

    // Rows held in memory would answer repeated lookups without the key indexes.
    let engine = QueryEngine::open(
        Arc::clone(&storage),
        QuerySettings {
            resident_bytes: 0,
            ..QuerySettings::under(&dir.path().join("query"))
        },
    )?;
    let lookup = |id: &str| {
        let route = ApiRoute::Task(id.to_owned());
        let engine = &engine;
        async move { engine.answer(&route, &[]).await }
    };
    // And in a scope that keeps some of the tasks: one of the two sessions.
    let scoped_params = [("session".to_owned(), session.clone())];
    let scoped = |id: &str| {
        let route = ApiRoute::Task(id.to_owned());
        let (engine, params) = (&engine, &scoped_params);
        async move {
            match engine.answer(&route, params).await {
                Ok(answer) => Ok(Some(answer)),
                Err(QueryError::NotFound(_)) => Ok(None),
                Err(err) => Err(err),
            }
        }
    };
    let mut indexed = Vec::new();
    let mut indexed_in_scope = Vec::new();
    for id in &ids {
        indexed.push(lookup(id).await?);
        indexed_in_scope.push(scoped(id).await?);
    }
    let kept = indexed_in_scope
        .iter()
        .filter(|answer| answer.is_some())
        .count();
    ensure!(
        kept > 0 && kept < ids.len(),
        "the scope kept {kept} of {} tasks: it tells nothing",
        ids.len()
    );
    let nobody = "0123456789abcdef0123456789abcdef0123456789abcdef";
    ensure!(matches!(lookup(nobody).await, Err(QueryError::NotFound(_))));
    ensure!(
        engine.key_index_lookups() == 2 * ids.len() as u64 + 1,
        "{} of {} lookups read through key indexes",
        engine.key_index_lookups(),
        2 * ids.len() + 1
    );

    // Over storage that is not a local directory (as on Lambda, where files are downloaded
    // into the cache), a lookup of a task only deltas hold fetches its key indexes and the
    // deltas named, never the base.
    let recorded = Arc::new(RecordsGets::new(Arc::clone(&storage)));
    // (A small session's files are all downloaded after a lookup, to be held in memory.)
    let remote = QueryEngine::open(
        Arc::clone(&recorded) as Arc<dyn Storage>,
        QuerySettings {
            resident_bytes: 0,
            ..QuerySettings::under(&dir.path().join("remote-query"))
        },
    )?;
    let answer = remote.answer(&ApiRoute::Task(recent.clone()), &[]).await?;
    ensure!(answer == lookup(&recent).await?, "{recent}: {answer}");
    let fetched = recorded.gets();
    ensure!(
        fetched.iter().any(|key| key.contains("/keys-"))
            && fetched.iter().any(|key| key.contains("/delta-")),
        "{fetched:?}"
    );
    ensure!(
        !fetched.iter().any(|key| key.contains("/base-")),
        "a lookup of a task only deltas hold downloaded the base: {fetched:?}"
    );

    // A block the parquet crate cannot read sends the lookup to the scan: every data file
    // rewritten by DuckDB, rows in the same order, with snappy pages (a codec this build's
    // crate does not decode), answers as before.
    // (Read as the engine reads them: without the hive columns the folders' names would add.)
    use shared::tables::newest::{path_literal, read_parquet};
    let connection = shared::tables::open_duckdb()?;
    let data_files: Vec<std::path::PathBuf> = connection
        .prepare(&format!(
            "SELECT file FROM glob({})
             WHERE regexp_matches(file, '/(base|delta)-[^/]*$')",
            path_literal(&dir.path().join("data/tables/task_attempts/*/*/*.parquet"))
        ))?
        .query_map([], |row| row.get::<_, String>(0))?
        .map(|file| file.map(std::path::PathBuf::from))
        .collect::<Result<_, _>>()?;
    ensure!(data_files.len() > 2, "{data_files:?}");
    for file in &data_files {
        let snappy = file.with_extension("snappy");
        connection.execute_batch(&format!(
            "COPY (SELECT * FROM {}) TO {} (FORMAT parquet, COMPRESSION snappy)",
            read_parquet(&[file.as_path()], ""),
            path_literal(&snappy)
        ))?;
        std::fs::rename(&snappy, file)?;
    }
    let unreadable = shared::tables::task_block::task_rows(
        &shared::tables::task_block::Footers::default(),
        &data_files[0],
        (0, u64::MAX),
        &ids[0],
    );
    ensure!(
        unreadable.is_err(),
        "the crate reads the rewritten files: the fallback is not reached"
    );
    let before = engine.key_index_lookups();
    for (id, by_index) in ids.iter().zip(&indexed) {
        let by_scan = lookup(id).await?;
        ensure!(
            &by_scan == by_index,
            "{id}: the lookup of unreadable blocks differs:\n{by_index}\n{by_scan}"
        );
    }
    ensure!(engine.key_index_lookups() - before == ids.len() as u64);

    rewrite_manifests(&*storage, |manifest| {
        for file in manifest
            .task_attempts
            .base
            .iter_mut()
            .chain(&mut manifest.task_attempts.deltas)
        {
            file.key_index = None;
        }
    })
    .await?;
    let before = engine.key_index_lookups();
    for ((id, by_index), in_scope) in ids.iter().zip(&indexed).zip(&indexed_in_scope) {
        let by_scan = lookup(id).await?;
        ensure!(
            &by_scan == by_index,
            "{id}: the lookup through key indexes differs from the scan:\n{by_index}\n{by_scan}"
        );
        let by_scan = scoped(id).await?;
        ensure!(
            &by_scan == in_scope,
            "{id} in {session}: the lookup through key indexes differs from the scan:\n\
             {in_scope:?}\n{by_scan:?}"
        );
    }
    ensure!(matches!(lookup(nobody).await, Err(QueryError::NotFound(_))));
    ensure!(
        engine.key_index_lookups() == before,
        "a lookup used a key index it no longer has"
    );
    Ok(())
}

/// Compacts the raw objects in `storage`: half of them folded into a base, the rest in deltas
/// of three objects each over it, but for the last `held_back`, which are returned with the
/// compactor.
async fn in_base_and_deltas(
    storage: &Arc<dyn Storage>,
    held_back: usize,
) -> anyhow::Result<(
    shared::compact::Compactor,
    tempfile::TempDir,
    Vec<shared::storage::ObjectKey>,
)> {
    let (compactor, scratch) = compactor_folding_past(storage, 100)?;
    let mut keys = compactor.raw_keys().await?;
    let later = keys.split_off(keys.len().saturating_sub(held_back));
    let (first, rest) = keys.split_at(keys.len() / 2);
    for batch in first.chunks(3) {
        compactor.compact(batch).await?;
    }
    ensure!(compactor.fold().await? > 0, "nothing folded");
    for batch in rest.chunks(3) {
        compactor.compact(batch).await?;
    }
    Ok((compactor, scratch, later))
}

/// A lookup in a small session answers from the rows held in memory after a lookup read its
/// files (loaded in the background), with no DuckDB query, and answers what a lookup through
/// the files does: for the tasks of [`LookupCases`], in every session and in one. When the
/// session moves on, a lookup reads the new delta from disk and the files held from memory,
/// still the same answers, until the delta is held too. With too little memory for the
/// session, nothing is held and the lookups read files. The engine's counts prove which path
/// ran.
#[tokio::test]
async fn a_lookup_from_rows_held_in_memory_equals_one_from_files() -> anyhow::Result<()> {
    use shared::query::{QueryEngine, QuerySettings};

    let (dir, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    ingest_failing_sessions(&storage, "held", [31, 32], 2_000, 2).await?;
    let (compactor, _scratch, later) = in_base_and_deltas(&storage, 3).await?;
    ensure!(later.len() == 3);
    let LookupCases { ids, session, .. } =
        lookup_cases(&storage, &dir.path().join("cache")).await?;
    let engine = |name: &str, resident_bytes: u64| {
        QueryEngine::open(
            Arc::clone(&storage),
            QuerySettings {
                resident_bytes,
                ..QuerySettings::under(&dir.path().join(name))
            },
        )
    };
    let from_files = engine("from-files", 0)?;
    let held = engine("held", 128 << 20)?;
    let starved = engine("starved", 4096)?;
    let scopes = [Vec::new(), vec![("session".to_owned(), session)]];
    let nobody = "0123456789abcdef0123456789abcdef0123456789abcdef";

    // Loaded after a lookup read the files.
    looked_up(&held, &ids[0], &[]).await?;
    let files = held_all_files(&storage, &held).await?;
    ensure!(files > 2, "{files} files: the test reaches no delta");
    let (_, bytes) = held.resident_held();
    let rows: u64 = shared::query::snapshot::manifests(&storage, &Default::default())
        .await?
        .iter()
        .flat_map(|session| session.manifest.task_attempts.all().map(|file| file.rows))
        .sum();
    println!("{files} files of {rows} rows held in {bytes} bytes");
    let (indexed, reads) = (held.key_index_lookups(), held.resident_reads());
    let mut lookups = 0;
    for id in ids.iter().map(String::as_str).chain([nobody]) {
        for params in &scopes {
            let expected = looked_up(&from_files, id, params).await?;
            ensure!(
                looked_up(&held, id, params).await? == expected,
                "{id} {params:?}: held rows answer differently"
            );
            ensure!(looked_up(&starved, id, params).await? == expected);
            lookups += 1;
        }
    }
    ensure!(
        held.key_index_lookups() == indexed,
        "a lookup ran DuckDB though every file was held"
    );

    ensure!(
        held.resident_reads() - reads >= lookups,
        "a lookup read no file from memory"
    );
    // Ray's route for one task id (its dashboard's task page, `ray get tasks`) answers from the
    // same lookup, and as its scan of the session does: reached with one more filter that
    // every attempt passes.
    let (cluster_of_session, session_name) = {
        let manifests =
            shared::query::snapshot::manifests(&storage, &shared::query::params::Scope::default())
                .await?;
        let first = manifests.first().context("a session")?;
        (first.cluster.clone(), first.session.clone())
    };
    let request = shared::query::ray::RayRequest::parse(
        "GET",
        &format!("{cluster_of_session}/{session_name}/api/v0/tasks"),
    )?;
    let pair = |key: &str, value: &str| (key.to_owned(), value.to_owned());
    let (indexed, reads) = (held.key_index_lookups(), held.resident_reads());
    for (at, id) in ids.iter().enumerate() {
        // Ray's dashboard asks with detail; `ray get tasks` without, drivers shown.
        let mut asked = vec![
            pair("filter_keys", "task_id"),
            pair("filter_predicates", "="),
            pair("filter_values", &id.to_uppercase()),
        ];
        if at % 2 == 0 {
            asked.push(pair("detail", "1"));
        } else {
            asked.push(pair("exclude_driver", "false"));
        }
        let mut scanned = asked.clone();
        scanned.extend([
            pair("filter_keys", "attempt_number"),
            pair("filter_predicates", "!="),
            pair("filter_values", "-1"),
        ]);
        let expected = ray_list(&from_files, &request, &scanned).await?;
        ensure!(
            ray_list(&from_files, &request, &asked).await? == expected,
            "{id}: Ray's route through key indexes answers differently from its scan"
        );
        ensure!(
            ray_list(&held, &request, &asked).await? == expected,
            "{id}: Ray's route from held rows answers differently from its scan:\n{expected}"
        );
    }
    ensure!(
        held.key_index_lookups() == indexed && held.resident_reads() > reads,
        "Ray's route for one task did not answer from held rows"
    );
    ensure!(starved.resident_held() == (0, 0) && starved.resident_reads() == 0);

    // The session moves on: one more delta, not held yet.
    compactor.compact(&later).await?;
    let (indexed, reads) = (held.key_index_lookups(), held.resident_reads());
    for id in &ids {
        ensure!(
            looked_up(&held, id, &[]).await? == looked_up(&from_files, id, &[]).await?,
            "{id}: a lookup from held rows and a new delta answers differently"
        );
    }
    ensure!(
        held.key_index_lookups() > indexed && held.resident_reads() > reads,
        "no lookup after the new delta read it from disk and the rest from memory"
    );
    let files_now = held_all_files(&storage, &held).await?;
    ensure!(
        files_now > files,
        "the new delta was folded away: {files_now} files"
    );
    let indexed = held.key_index_lookups();
    for id in &ids {
        ensure!(looked_up(&held, id, &[]).await? == looked_up(&from_files, id, &[]).await?);
    }
    ensure!(held.key_index_lookups() == indexed);
    Ok(())
}

/// `engine`'s answer to the Ray route `request` with `pairs`, as JSON.
async fn ray_list(
    engine: &shared::query::QueryEngine,
    request: &shared::query::ray::RayRequest,
    pairs: &[(String, String)],
) -> anyhow::Result<Json> {
    let body = engine.answer_ray(request, pairs).await?;
    Ok(serde_json::from_slice(body.as_bytes())?)
}

/// The answer of `engine` to a lookup of task `id` with `params`; `None` for a task it does
/// not find.
async fn looked_up(
    engine: &shared::query::QueryEngine,
    id: &str,
    params: &[(String, String)],
) -> Result<Option<Json>, shared::query::QueryError> {
    match engine
        .answer(&shared::query::ApiRoute::Task(id.to_owned()), params)
        .await
    {
        Ok(answer) => Ok(Some(answer)),
        Err(shared::query::QueryError::NotFound(_)) => Ok(None),
        Err(err) => Err(err),
    }
}

/// Waits until `engine` holds in memory as many files as the manifests in `storage` name (its
/// loads run in the background), and returns that number.
async fn held_all_files(
    storage: &Arc<dyn Storage>,
    engine: &shared::query::QueryEngine,
) -> anyhow::Result<usize> {
    let manifests =
        shared::query::snapshot::manifests(storage, &shared::query::params::Scope::default())
            .await?;
    let files: usize = manifests
        .iter()
        .map(|session| session.manifest.task_attempts.all().count())
        .sum();
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine.resident_held().0 < files {
        ensure!(Instant::now() < deadline, "{files} files were never held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(files)
}

/// Tasks to look up in a store of [`ingest_failing_sessions`] compacted into a base and
/// deltas, as a lookup test needs them.
struct LookupCases {
    /// Tasks stored in several files (those in different states first), tasks stored once,
    /// and tasks with more than one attempt.
    ids: Vec<String>,
    /// The first session's name: a scope that keeps some of the tasks.
    session: String,
    /// A task only deltas hold.
    recent: String,
}

/// Finds [`LookupCases`] by reading every stored file of `storage` (cached under `cache_dir`).
async fn lookup_cases(
    storage: &Arc<dyn Storage>,
    cache_dir: &std::path::Path,
) -> anyhow::Result<LookupCases> {
    use shared::query::params::Scope;
    use shared::query::snapshot::{Needs, snapshot};
    use shared::query::sql::read_parquet;
    use shared::storage::FileCache;

    let cache = FileCache::new(Arc::clone(storage), cache_dir.to_owned(), 4);
    let needs = Needs {
        attempts: true,
        key_indexes: true,
        ..Needs::default()
    };
    let stored = snapshot(storage, &cache, &Scope::default(), needs).await?;
    ensure!(
        stored.key_indexes.is_some(),
        "every base and delta was written with its key index"
    );
    ensure!(!stored.task_attempts.base.is_empty() && !stored.task_attempts.deltas.is_empty());
    // Tasks by how many files hold a version of them, and how many states those versions show.
    let files = stored.task_attempts.files();
    let all: Vec<&std::path::Path> = files.base.iter().chain(&files.deltas).copied().collect();
    let connection = shared::tables::open_duckdb()?;
    let sql = format!(
        "SELECT task_id, count(DISTINCT file_index) AS files, count(DISTINCT state) AS states
         FROM {} GROUP BY task_id ORDER BY files DESC, states DESC, task_id LIMIT 300",
        read_parquet(&all, ", file_row_number = true")
    );
    let mut statement = connection.prepare(&sql)?;
    let tasks: Vec<(String, i64, i64)> = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
        .collect::<Result<_, _>>()?;
    ensure!(
        tasks
            .iter()
            .any(|(_, files, states)| *files > 1 && *states > 1),
        "no task is stored in several files in different states: the test reaches nothing"
    );
    let sql = format!(
        "SELECT task_id FROM {} GROUP BY task_id HAVING count(*) = 1 ORDER BY task_id LIMIT 100",
        read_parquet(&all, "")
    );
    let mut statement = connection.prepare(&sql)?;
    let once: Vec<String> = statement
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    ensure!(!once.is_empty());
    let sql = format!(
        "SELECT task_id FROM {} GROUP BY task_id HAVING count(DISTINCT attempt_number) > 1
         ORDER BY task_id LIMIT 50",
        read_parquet(&all, "")
    );
    let mut statement = connection.prepare(&sql)?;
    let retried: Vec<String> = statement
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    ensure!(!retried.is_empty(), "no task was retried");
    let ids: Vec<String> = tasks
        .into_iter()
        .map(|(id, _, _)| id)
        .chain(once)
        .chain(retried)
        .collect();
    let session: String = connection.query_row(
        &format!("SELECT min(session_name) FROM {}", read_parquet(&all, "")),
        [],
        |row| row.get(0),
    )?;
    let sql = format!(
        "SELECT task_id FROM {} GROUP BY task_id HAVING min(file_index) >= {} ORDER BY task_id
         LIMIT 1",
        read_parquet(&all, ", file_row_number = true"),
        files.base.len()
    );
    let recent: String = connection.query_row(&sql, [], |row| row.get(0))?;
    Ok(LookupCases {
        ids,
        session,
        recent,
    })
}

/// Storage that records the keys it is asked to get and, unlike a local directory, never lets
/// readers use its files in place: the query cache downloads them, as from S3.
#[derive(Debug)]
struct RecordsGets {
    inner: Arc<dyn Storage>,
    gets: std::sync::Mutex<Vec<String>>,
}

impl RecordsGets {
    fn new(inner: Arc<dyn Storage>) -> Self {
        Self {
            inner,
            gets: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn gets(&self) -> Vec<String> {
        self.gets
            .lock()
            .map(|gets| gets.clone())
            .unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl Storage for RecordsGets {
    async fn put(
        &self,
        key: &shared::storage::ObjectKey,
        body: bytes::Bytes,
        mode: shared::storage::PutMode,
    ) -> Result<shared::storage::ETag, shared::storage::StorageError> {
        self.inner.put(key, body, mode).await
    }

    async fn get(
        &self,
        key: &shared::storage::ObjectKey,
    ) -> Result<shared::storage::StoredObject, shared::storage::StorageError> {
        if let Ok(mut gets) = self.gets.lock() {
            gets.push(key.to_string());
        }
        self.inner.get(key).await
    }

    async fn list(
        &self,
        prefix: &str,
    ) -> Result<Vec<shared::storage::ObjectMeta>, shared::storage::StorageError> {
        self.inner.list(prefix).await
    }

    async fn delete(
        &self,
        key: &shared::storage::ObjectKey,
    ) -> Result<(), shared::storage::StorageError> {
        self.inner.delete(key).await
    }

    fn location(&self) -> String {
        self.inner.location()
    }
}
