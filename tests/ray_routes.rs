//! Ray's own routes (`/ray/{cluster}/{session|latest}/…`; docs/architecture.md, "Ray's own
//! tools") over Ray's captured traffic: the task list held to Ray's own `ray list tasks
//! --detail` for the same runs, the summaries to Ray's `summarize_tasks` and to Ray's own
//! summary code, and every data route the 2.60 dashboard requests to the shape the live
//! dashboard answered (`fixtures/ray-routes-2.60/`).

use std::collections::{BTreeMap, BTreeSet};

use afterglow_tests::api::{Api, our_rows};
use afterglow_tests::ray::{LOSSY_RUN, check};
use afterglow_tests::{FixtureRun, Served, fetch_encoded, post_all, serve_runs_locally};
use anyhow::{Context as _, ensure};
use serde_json::{Value as Json, json};
use shared::query::ray::summary::{self, SummaryActor, SummaryTask};

/// `serve` with every fixture run posted (one cluster per run) and compacted, and Ray answers
/// cut at `response_bytes` when given.
async fn serve_runs(runs: &[FixtureRun], response_bytes: Option<usize>) -> anyhow::Result<Served> {
    serve_runs_locally(runs, |mut settings| {
        if let (Some(query), Some(bytes)) = (settings.query.as_mut(), response_bytes) {
            query.response_bytes = bytes;
        }
        Ok(settings)
    })
    .await
}

/// `GET` under the server, any status; the body as JSON (null when it is not JSON).
async fn get(served: &Served, path: &str) -> anyhow::Result<(u16, Json)> {
    let response = reqwest::get(format!("{}{path}", served.server.url)).await?;
    let status = response.status().as_u16();
    let text = response.text().await?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Json::Null)))
}

/// Ray's list envelope's inner result, checked to be Ray's `ListApiResponse`.
fn list_result(body: &Json) -> anyhow::Result<&serde_json::Map<String, Json>> {
    ensure!(
        body["result"] == json!(true) && body["msg"] == json!(""),
        "{body}"
    );
    let result = body["data"]["result"].as_object().context("data.result")?;
    let keys: BTreeSet<&str> = result.keys().map(String::as_str).collect();
    ensure!(
        keys == BTreeSet::from([
            "total",
            "num_after_truncation",
            "num_filtered",
            "result",
            "partial_failure_warning",
            "warnings"
        ]),
        "{keys:?}"
    );
    Ok(result)
}

/// Ray's times are floats of whole milliseconds; our comparison wants their integer text.
fn as_compared(mut row: Json) -> Json {
    for field in ["creation_time_ms", "start_time_ms", "end_time_ms"] {
        #[allow(clippy::cast_possible_truncation)]
        if let Some(ms) = row[field].as_f64() {
            row[field] = json!(ms as i64);
        }
    }
    row
}

#[tokio::test]
async fn ray_list_tasks_over_the_history_equals_rays_own() -> anyhow::Result<()> {
    let runs = FixtureRun::all()?;
    let served = serve_runs(&runs, None).await?;
    let api = Api::Http(served.server.url.clone());
    for run in &runs {
        // The exact request `ray list tasks --detail --limit 10000` sends.
        let path = format!(
            "/ray/{}/latest/api/v0/tasks?limit=10000&timeout=24&detail=True&exclude_driver=True\
             &server_timeout_multiplier=0.8",
            run.name
        );
        let answer = api.get(&path).await?;
        ensure!(answer.status == 200, "{path}: {}", answer.body);
        let result = list_result(&answer.body)?;
        let rows = result["result"].as_array().context("rows")?;
        let truth = run.ground_truth("tasks.json")?;
        let truth = truth.as_array().context("tasks.json")?;
        // Ray's CLI prints the detail columns in `TaskState` order: so do our rows.
        let ray_keys: Vec<&String> = truth
            .first()
            .and_then(Json::as_object)
            .context("a Ray row")?
            .keys()
            .collect();
        for row in rows {
            let keys: Vec<&String> = row.as_object().context("row")?.keys().collect();
            ensure!(keys == ray_keys, "{}: columns {keys:?}", run.name);
        }
        let ids: Vec<&str> = rows
            .iter()
            .filter_map(|row| row["task_id"].as_str())
            .collect();
        ensure!(
            ids.is_sorted(),
            "{}: rows are not in task id order",
            run.name
        );
        ensure!(
            result["num_filtered"] == json!(rows.len())
                && result["total"] == result["num_after_truncation"],
            "{}: counts {result:?}",
            run.name
        );
        if run.name == LOSSY_RUN {
            // Ray's own store kept events the export dropped: the rows are compared through
            // `/api/tasks`, which says which failures were synthesized (tests/query/).
            continue;
        }
        ensure!(
            rows.len() == truth.len(),
            "{}: {} rows, Ray {}",
            run.name,
            rows.len(),
            truth.len()
        );
        let ours: Vec<Json> = rows.iter().cloned().map(as_compared).collect();
        check(run, &our_rows(&ours)?, "Ray's route")?;
        for row in rows {
            ensure!(
                row["required_resources"].is_object(),
                "the task page needs required_resources as an object: {row}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn filters_select_what_rays_filters_select() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs(std::slice::from_ref(&run), None).await?;
    let truth = run.ground_truth("tasks.json")?;
    let truth = truth.as_array().context("tasks.json")?;
    let count = |pick: &dyn Fn(&Json) -> bool| truth.iter().filter(|task| pick(task)).count();
    let failed = truth
        .iter()
        .find(|task| task["state"] == json!("FAILED"))
        .context("a failed task")?;
    let job = failed["job_id"].as_str().context("job")?;
    let task_id = failed["task_id"].as_str().context("task")?;
    let cases: Vec<(String, usize)> = vec![
        // Ray compares strings case-insensitively.
        (
            "filter_keys=state&filter_predicates=%3D&filter_values=failed".to_owned(),
            count(&|task| task["state"] == json!("FAILED")),
        ),
        (
            "filter_keys=state&filter_predicates=%21%3D&filter_values=FINISHED".to_owned(),
            count(&|task| task["state"] != json!("FINISHED")),
        ),
        (
            "filter_keys=name&filter_predicates=%3D&filter_values=WORK".to_owned(),
            count(&|task| task["name"] == json!("work")),
        ),
        (
            "filter_keys=attempt_number&filter_predicates=%3D&filter_values=1".to_owned(),
            count(&|task| task["attempt_number"] == json!(1)),
        ),
        (
            format!(
                "filter_keys=job_id&filter_predicates=%3D&filter_values={job}\
                 &filter_keys=state&filter_predicates=%3D&filter_values=FAILED"
            ),
            count(&|task| task["job_id"] == json!(job) && task["state"] == json!("FAILED")),
        ),
        (
            format!("filter_keys=task_id&filter_predicates=%3D&filter_values={task_id}"),
            count(&|task| task["task_id"] == json!(task_id)),
        ),
        // A missing field matches neither `=` nor `!=` (error_type is null unless failed).
        (
            "filter_keys=error_type&filter_predicates=%21%3D&filter_values=NOPE".to_owned(),
            count(&|task| !task["error_type"].is_null()),
        ),
    ];
    for (filter, expected) in cases {
        let path = format!("/ray/basic-workload/latest/api/v0/tasks?limit=10000&{filter}");
        let (status, body) = get(&served, &path).await?;
        ensure!(status == 200, "{path}: {body}");
        let result = list_result(&body)?;
        ensure!(
            expected > 0,
            "{filter}: the case selects nothing in Ray's list"
        );
        ensure!(
            result["num_filtered"] == json!(expected)
                && result["result"].as_array().map(Vec::len) == Some(expected),
            "{filter}: {} rows, {} filtered; Ray's list has {expected}",
            result["result"].as_array().map_or(0, Vec::len),
            result["num_filtered"]
        );
    }
    // `limit` cuts the rows, not the counts; without `detail` only Ray's default columns.
    let (_, body) = get(&served, "/ray/basic-workload/api/v0/tasks?limit=3").await?;
    let result = list_result(&body)?;
    ensure!(result["result"].as_array().map(Vec::len) == Some(3));
    ensure!(result["num_filtered"] == json!(truth.len()), "{result:?}");
    let first = result["result"][0].as_object().context("row")?;
    ensure!(
        first.len() == 13 && !first.contains_key("events"),
        "{first:?}"
    );
    // A limit below the row count reads up to the task id where the first rows end (found by
    // a sort of that column alone) and gives the first rows of the whole list, in its order:
    // with retried tasks, whose attempts straddle the bound when it falls on them.
    let (_, body) = get(
        &served,
        "/ray/basic-workload/api/v0/tasks?limit=10000&detail=True",
    )
    .await?;
    let all = list_result(&body)?["result"]
        .as_array()
        .context("rows")?
        .clone();
    let retried: Vec<usize> = (1..all.len())
        .filter(|&index| all[index]["task_id"] == all[index - 1]["task_id"])
        .collect();
    ensure!(!retried.is_empty(), "no retried task in the list");
    let mut limits = vec![1, 2, 7, all.len() - 1, all.len()];
    limits.extend(retried.iter().flat_map(|&index| [index, index + 1]));
    for limit in limits {
        let path = format!("/ray/basic-workload/api/v0/tasks?limit={limit}&detail=True");
        let (status, body) = get(&served, &path).await?;
        ensure!(status == 200, "{path}: {body}");
        let result = list_result(&body)?;
        let rows = result["result"].as_array().context("rows")?;
        ensure!(
            rows.as_slice() == &all[..limit],
            "{path}: not the first {limit} rows of the whole list"
        );
        ensure!(result["num_filtered"] == json!(truth.len()), "{result:?}");
    }
    Ok(())
}

#[tokio::test]
async fn bad_requests_get_rays_error_shape_and_what_is_not_a_route_is_left_to_ray()
-> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs(std::slice::from_ref(&run), None).await?;
    let session = {
        let (_, body) = get(&served, "/api/clusters").await?;
        body["clusters"][0]["sessions"][0]["session_name"]
            .as_str()
            .context("session")?
            .to_owned()
    };
    let ray_error = |status: u16, body: &Json, words: &str| -> anyhow::Result<()> {
        ensure!(
            body["result"] == json!(false)
                && body["data"] == json!({"result": null})
                && body["msg"].as_str().is_some_and(|msg| msg.contains(words)),
            "{status}: {body} (wanted a message with {words:?})"
        );
        Ok(())
    };
    for (path, status, words) in [
        (
            "/ray/basic-workload/latest/api/v0/tasks?filter_keys=bogus&filter_predicates=%3D&filter_values=x".to_owned(),
            400,
            "The given filter column bogus is not supported",
        ),
        (
            "/ray/basic-workload/latest/api/v0/actors?filter_keys=state&filter_predicates=%3E&filter_values=x".to_owned(),
            400,
            "Unsupported filter predicate > is given",
        ),
        (
            "/ray/basic-workload/latest/api/v0/tasks?limit=abc".to_owned(),
            400,
            "invalid literal for int()",
        ),
        (
            "/ray/basic-workload/latest/api/v0/tasks?limit=18446744073709551615".to_owned(),
            400,
            "Given limit 18446744073709551615 exceeds the supported limit",
        ),
        (
            format!(
                "/ray/basic-workload/latest/api/v0/tasks?{}",
                "filter_keys=state&filter_predicates=%3D&filter_values=FAILED&".repeat(40)
            ),
            400,
            "40 filters were given",
        ),
        (
            "/ray/no-such-cluster/latest/api/v0/tasks".to_owned(),
            404,
            "no cluster `no-such-cluster`",
        ),
        (
            "/ray/basic-workload/session_1999-01-01_00-00-00_0_0/api/v0/tasks".to_owned(),
            404,
            "has no session `session_1999-01-01_00-00-00_0_0`",
        ),
    ] {
        let (got, body) = get(&served, &path).await?;
        ensure!(got == status, "{path}: {got} {body}");
        ray_error(got, &body, words)?;
    }
    // The session by name and by `latest` (or by nothing) are the same history.
    let named = get(
        &served,
        &format!("/ray/basic-workload/{session}/api/v0/tasks?limit=5"),
    )
    .await?;
    let latest = get(&served, "/ray/basic-workload/latest/api/v0/tasks?limit=5").await?;
    let bare = get(&served, "/ray/basic-workload/api/v0/tasks?limit=5").await?;
    ensure!(named.0 == 200 && named == latest && latest == bare);
    // Ray's UI files and unknown paths: a bare 404, so Ray's dashboard serves its own.
    for path in [
        "/",
        "/static/js/main.84605326.js",
        "/favicon.ico",
        "/api/v0/nope",
    ] {
        let (status, body) = get(&served, &format!("/ray/basic-workload/latest{path}")).await?;
        ensure!(status == 404 && body.is_null(), "{path}: {status} {body}");
    }
    Ok(())
}

/// The captured live answers (`fixtures/ray-routes-2.60`) by file name.
fn captured(file: &str) -> anyhow::Result<Json> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/ray-routes-2.60")
        .join(file);
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// Every object key path in `value` (arrays through their first element), so two answers can be
/// compared by shape: what the dashboard dereferences must be there.
fn shape(value: &Json, prefix: &str, into: &mut BTreeSet<String>) {
    match value {
        Json::Object(map) => {
            for (key, inner) in map {
                // Ids as keys (actors by id) are data, not shape.
                let key = if key.len() >= 16 && key.bytes().all(|b| b.is_ascii_hexdigit()) {
                    "{id}"
                } else {
                    key.as_str()
                };
                let path = format!("{prefix}.{key}");
                into.insert(path.clone());
                shape(inner, &path, into);
            }
        }
        Json::Array(items) => {
            if let Some(first) = items.first() {
                shape(first, &format!("{prefix}[]"), into);
            }
        }
        _ => {}
    }
}

/// What a live node reports of its machine and its raylet's load: a history has none of it, and
/// the pages read it guarded (or from fields Afterglow fills with zeros).
const LIVE_STATISTICS: &str = ".now|.cpu|.cpus|.mem|.hostMem|.cgroupMem|.shm|coreWorkersStats|\
numWorkers|storeStats|.agent|.bootTime|.disk|.diskIo|.diskIoSpeed|.gpus|.network|.gcs";

/// What a live raylet reports about its process (ports, sockets, directories, its autoscaler
/// snapshot): the export does not carry it and no page needs it.
const RAYLET_PROCESS: &str =
    "Port|SocketName|sessionDir|tempDir|nodeTypeName|stateSnapshot|metricsAgentPort";

#[tokio::test]
async fn the_dashboards_routes_answer_the_shapes_the_live_dashboard_did() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs(std::slice::from_ref(&run), None).await?;
    let (_, actors) = get(&served, "/ray/basic-workload/api/v0/actors?limit=1").await?;
    let actor = actors["data"]["result"]["result"][0]["actor_id"]
        .as_str()
        .context("an actor")?
        .to_owned();
    let (_, nodes) = get(&served, "/ray/basic-workload/api/v0/nodes").await?;
    let node = nodes["data"]["result"]["result"][0]["node_id"]
        .as_str()
        .context("a node")?
        .to_owned();
    let (_, jobs) = get(&served, "/ray/basic-workload/api/jobs/").await?;
    let job = jobs[0]["job_id"].as_str().context("a job")?.to_owned();
    // Route → the live answer captured from Ray 2.60 and the fields of it we may lack (live
    // statistics a history does not have).
    let routes: Vec<(String, &str, &[&str])> = vec![
        ("api/version".into(), "GET__api_version.200.json", &[]),
        ("timezone".into(), "GET__timezone.200.json", &[]),
        (
            "api/v0/cluster_metadata".into(),
            "GET__api_v0_cluster_metadata.200.json",
            &[],
        ),
        (
            "usage_stats_enabled".into(),
            "GET__usage_stats_enabled.200.json",
            &[],
        ),
        (
            "api/authentication_mode".into(),
            "GET__api_authentication_mode.200.json",
            &[],
        ),
        (
            "api/v0/runtime_env_redaction".into(),
            "GET__api_v0_runtime_env_redaction.200.json",
            &[],
        ),
        (
            "api/cluster_status?format=1".into(),
            "GET__api_cluster_status__format-1.200.json",
            &[],
        ),
        ("api/jobs/".into(), "GET__api_jobs.200.json", &[]),
        (
            format!("api/jobs/{job}"),
            "GET__api_jobs_job_id.200.json",
            &[],
        ),
        (
            "api/v0/jobs?limit=100&detail=True".into(),
            "GET__api_v0_jobs__limit-100_detail-True_cli.200.json",
            &[],
        ),
        (
            "api/v0/actors?limit=100&detail=True".into(),
            "GET__api_v0_actors__limit-100_detail-True_cli.200.json",
            &[".data.result.result[].death_cause.actor_died_error_context"],
        ),
        (
            "api/v0/nodes?limit=100&detail=True".into(),
            "GET__api_v0_nodes__limit-100_detail-True_cli.200.json",
            &[],
        ),
        (
            "api/v0/workers?limit=100&detail=True".into(),
            "GET__api_v0_workers__limit-100_detail-True_cli.200.json",
            &[],
        ),
        (
            "api/v0/tasks/summarize".into(),
            "GET__api_v0_tasks_summarize.200.json",
            &[],
        ),
        (
            "api/v0/tasks/summarize?summary_by=lineage".into(),
            "GET__api_v0_tasks_summarize__summary_by-lineage.200.json",
            &[],
        ),
        (
            "api/v0/actors/summarize".into(),
            "GET__api_v0_actors_summarize.200.json",
            &[],
        ),
        (
            "api/v0/objects/summarize".into(),
            "GET__api_v0_objects_summarize.200.json",
            &[],
        ),
        ("logical/actors".into(), "GET__logical_actors.200.json", &[]),
        (
            format!("logical/actors/{actor}"),
            "GET__logical_actors_actor_id.200.json",
            &[],
        ),
        (
            "nodes?view=summary".into(),
            "GET__nodes__view-summary.200.json",
            &[
                LIVE_STATISTICS,
                RAYLET_PROCESS,
                "raylet.nodeName|raylet.startTimeMs",
            ],
        ),
        (
            format!("nodes/{node}"),
            "GET__nodes_node_id.200.json",
            &[LIVE_STATISTICS, RAYLET_PROCESS, "workers[]"],
        ),
        (
            "events".into(),
            "GET__events.200.json",
            // The export carries no cluster event log.
            &[".data.events."],
        ),
    ];
    let mut problems = Vec::new();
    for (route, file, may_lack) in &routes {
        let (status, ours) = get(&served, &format!("/ray/basic-workload/latest/{route}")).await?;
        if status != 200 {
            problems.push(format!("{route}: {status} {ours}"));
            continue;
        }
        let (mut want, mut have) = (BTreeSet::new(), BTreeSet::new());
        shape(&captured(file)?, "", &mut want);
        shape(&ours, "", &mut have);
        let missing: Vec<&String> = want
            .difference(&have)
            .filter(|path| {
                !may_lack
                    .iter()
                    .any(|lack| lack.split('|').any(|part| path.contains(part)))
            })
            // Keys inside free-form maps (resources, labels, metadata, state counts) are data.
            .filter(|path| {
                ![
                    "resources",
                    "Resources",
                    "labels",
                    "Labels",
                    "labelSelector",
                    "metadata",
                    "state_counts",
                    ".summary.",
                    "runtime_env",
                    "node_id_to_summary.cluster.summary[",
                ]
                .iter()
                .any(|free| path.contains(free))
            })
            .collect();
        if !missing.is_empty() {
            problems.push(format!("{route}: lacks {missing:?}"));
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));

    // The overview's cards split the status text at "Node status" and "Resources" (Ray's
    // AutoscalerStatusCards.tsx); each shows what Ray's own `ray list nodes` said.
    let (_, status) = get(&served, "/ray/basic-workload/api/cluster_status?format=1").await?;
    let text = status["data"]["clusterStatus"]
        .as_str()
        .context("clusterStatus")?;
    let (nodes_part, resources_part) = text
        .split_once("Resources")
        .context("no Resources section")?;
    let truth = run.ground_truth("nodes.json")?;
    let node_truth = truth.get(0).context("Ray's node")?;
    ensure!(
        nodes_part.contains("Node status")
            && nodes_part.contains(&format!(
                "Active:\n 1 node_{}",
                node_truth["node_id"].as_str().context("node id")?
            )),
        "{text}"
    );
    let cpus = node_truth["resources_total"]["CPU"]
        .as_f64()
        .context("CPU")?;
    ensure!(
        resources_part.contains(&format!("Total:\n {cpus:.1} CPU")),
        "{text}"
    );
    Ok(())
}

#[tokio::test]
async fn ray_summary_tasks_over_the_history_equals_rays_own() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs(std::slice::from_ref(&run), None).await?;
    let api = Api::Http(served.server.url.clone());
    // What `ray summary tasks` sends.
    let answer = api
        .get("/ray/basic-workload/latest/api/v0/tasks/summarize?timeout=30")
        .await?;
    ensure!(answer.status == 200, "{}", answer.body);
    let ours = &answer.body["data"]["result"]["result"]["node_id_to_summary"]["cluster"];
    let truth = run.ground_truth("summary_tasks.json")?;
    let theirs = &truth["tasks"]["cluster"];
    for key in [
        "total_tasks",
        "total_actor_tasks",
        "total_actor_scheduled",
        "summary_by",
    ] {
        ensure!(
            ours[key] == theirs[key],
            "{key}: ours {}, Ray's {}",
            ours[key],
            theirs[key]
        );
    }
    let by_name = |summary: &Json| -> BTreeMap<String, Json> {
        summary["summary"]
            .as_object()
            .map(|groups| groups.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    };
    ensure!(
        by_name(ours) == by_name(theirs),
        "ours {:?}\nRay's {:?}",
        by_name(ours),
        by_name(theirs)
    );
    Ok(())
}

/// Ray's own `TaskSummaries` code, run by `fixtures/ray-summaries-2.60/make.py` on one input.
#[test]
fn the_summaries_group_exactly_as_rays_code_does() -> anyhow::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/ray-summaries-2.60");
    let read = |name: &str| -> anyhow::Result<Json> {
        Ok(serde_json::from_str(&std::fs::read_to_string(
            dir.join(name),
        )?)?)
    };
    let input = read("input.json")?;
    let text = |value: &Json| value.as_str().map(str::to_owned);
    let tasks: Vec<SummaryTask> = input["tasks"]
        .as_array()
        .context("tasks")?
        .iter()
        .map(|task| SummaryTask {
            task_id: text(&task["task_id"]).unwrap_or_default(),
            name: text(&task["name"]).unwrap_or_default(),
            func_or_class_name: text(&task["func_or_class_name"]).unwrap_or_default(),
            task_type: text(&task["type"]).unwrap_or_default(),
            state: text(&task["state"]).unwrap_or_default(),
            actor_id: text(&task["actor_id"]),
            parent_task_id: text(&task["parent_task_id"]),
            #[allow(clippy::cast_possible_truncation)]
            creation_time_ms: task["creation_time_ms"].as_f64().map(|ms| ms as i64),
        })
        .collect();
    let actors: Vec<SummaryActor> = input["actors"]
        .as_array()
        .context("actors")?
        .iter()
        .map(|actor| SummaryActor {
            actor_id: text(&actor["actor_id"]).unwrap_or_default(),
            repr_name: text(&actor["repr_name"]),
            class_name: text(&actor["class_name"]),
        })
        .collect();
    let func_name: Json = serde_json::from_str(&summary::by_func_name(&tasks))?;
    ensure!(func_name == read("func_name.json")?, "by func_name differs");
    let lineage: Json = serde_json::from_str(&summary::by_lineage(&tasks, &actors))?;
    ensure!(lineage == read("lineage.json")?, "by lineage differs");
    Ok(())
}

/// Ray's task list as `served` answers it to a client that takes gzip or not: the rows, how
/// many the filter kept, the warnings, and the bytes sent.
async fn cut_list(
    served: &Served,
    gzip: bool,
) -> anyhow::Result<(Vec<Json>, u64, Vec<Json>, usize)> {
    let url = format!(
        "{}/ray/basic-workload/latest/api/v0/tasks?limit=10000&detail=True",
        served.server.url
    );
    let answer = fetch_encoded(&url, gzip.then_some("gzip")).await?;
    ensure!(
        answer.status == 200,
        "{}: {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    ensure!(
        answer.encoding.as_deref() == gzip.then_some("gzip"),
        "gzip {gzip}: {:?}",
        answer.encoding
    );
    let body: Json = serde_json::from_slice(&answer.body)?;
    let result = list_result(&body)?;
    Ok((
        result["result"].as_array().context("result")?.clone(),
        result["num_filtered"].as_u64().context("num_filtered")?,
        // Ray writes `null` for no warnings.
        result["warnings"].as_array().cloned().unwrap_or_default(),
        answer.sent.len(),
    ))
}

#[tokio::test]
async fn a_list_larger_than_the_response_limit_is_cut_and_says_so() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs(std::slice::from_ref(&run), Some(20_000)).await?;
    let (rows, filtered, warnings, _) = cut_list(&served, false).await?;
    let kept = rows.len();
    ensure!(
        kept > 0 && (kept as u64) < filtered,
        "{kept} of {filtered} rows"
    );
    let warning = warnings
        .first()
        .and_then(Json::as_str)
        .context("a warning")?;
    ensure!(
        warning.contains(&format!("first {kept} of {filtered} tasks"))
            && warning.contains("limit of 20000 bytes"),
        "{warning}"
    );
    Ok(())
}

/// A client that takes gzip gets up to six times more rows, compressed into the same limit, so
/// that on Lambda (a 6 MB answer) the stock dashboard's job page is whole.
/// When even the compressed answer would not fit, it is the plain answer, compressed.
#[tokio::test]
async fn gzip_carries_lists_six_times_the_response_limit() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let whole = serve_runs(std::slice::from_ref(&run), None).await?;
    let (all, filtered, warnings, plain_bytes) = cut_list(&whole, false).await?;
    ensure!(all.len() as u64 == filtered && warnings.is_empty());
    whole.server.stop().await?;

    // A limit the whole list passes four times over, and its gzip fits in.
    let limit = plain_bytes / 4;
    let served = serve_runs(std::slice::from_ref(&run), Some(limit)).await?;
    let (cut, _, cut_warnings, _) = cut_list(&served, false).await?;
    ensure!(
        cut.len() < all.len() && cut_warnings.len() == 1,
        "without gzip: {} of {} rows",
        cut.len(),
        all.len()
    );
    let (rows, _, warnings, sent) = cut_list(&served, true).await?;
    ensure!(
        rows == all && warnings.is_empty() && sent <= limit,
        "with gzip: {} of {} rows, {sent} bytes sent against a limit of {limit}, {warnings:?}",
        rows.len(),
        all.len()
    );
    served.server.stop().await?;

    // A limit below one row compressed: the larger answer does not fit, so the plain one is
    // sent (its warning names the plain limit), gzipped.
    let served = serve_runs(std::slice::from_ref(&run), Some(300)).await?;
    let (plain, _, plain_warnings, _) = cut_list(&served, false).await?;
    let (rows, _, warnings, _) = cut_list(&served, true).await?;
    ensure!(rows == plain && warnings == plain_warnings, "{warnings:?}");
    ensure!(
        warnings
            .first()
            .and_then(Json::as_str)
            .is_some_and(|warning| warning.contains("limit of 300 bytes")),
        "{warnings:?}"
    );
    served.server.stop().await
}

/// How deeply `text` nests arrays and objects (strings skipped).
fn nesting_depth(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0_usize, 0, false, false);
    for byte in text.bytes() {
        match (in_string, escaped, byte) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') | (false, _, b'"') => in_string = !in_string,
            (false, _, b'[' | b'{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (false, _, b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[tokio::test]
async fn a_lineage_as_deep_as_its_job_is_summarized_without_overflowing() -> anyhow::Result<()> {
    use synth::{Generator, SynthSettings};

    // One job whose every task is submitted by the one before: a chain ~30 000 levels deep,
    // past where serde_json's recursive drop (~10 000) and serialize (~20 000) overflow a
    // 2 MiB stack and abort the process.
    const ATTEMPTS: u64 = 30_000;
    const ACTOR_CREATIONS: u64 = 4;
    let served = serve_runs(&[], None).await?;
    let mut generator = Generator::new(SynthSettings {
        attempts: ATTEMPTS,
        jobs: 1,
        nodes: 2,
        workers_per_node: 4,
        failure_rate: 0.0,
        actor_share: 0.0,
        nested_share: 1.0,
        chained: true,
        duplicate_rate: 0.0,
        ..SynthSettings::default()
    });
    let bodies = generator
        .by_ref()
        .map(|body| body.map(|body| body.json))
        .collect::<Result<Vec<_>, _>>()?;
    ensure!(
        generator.truth().attempts == ATTEMPTS,
        "{:?}",
        generator.truth()
    );
    post_all(&format!("{}/v1/events/deep", served.server.url), &bodies).await?;
    served.queue.idle().await;

    let response = reqwest::get(format!(
        "{}/ray/deep/latest/api/v0/tasks/summarize?summary_by=lineage",
        served.server.url
    ))
    .await?;
    ensure!(response.status() == 200, "{}", response.status());
    let text = response.text().await?;
    let chain = ATTEMPTS - ACTOR_CREATIONS;
    for counted in [
        format!("\"total_tasks\":{chain},"),
        format!("\"total_actor_scheduled\":{ACTOR_CREATIONS},"),
        "\"summary_by\":\"lineage\"".to_owned(),
    ] {
        ensure!(
            text.contains(&counted),
            "no {counted} in {}",
            &text[text.len().saturating_sub(300)..]
        );
    }
    // Each level is an object and its `children` list.
    let depth = nesting_depth(&text);
    ensure!(
        depth as u64 >= 2 * chain,
        "nested {depth} deep for a chain of {chain}"
    );
    Ok(())
}

/// `ray list jobs` names a driver's node only for jobs submitted through Ray's job API (a plain
/// `ray.init()` driver has none in Ray's list, though the export names its node): so do we.
#[tokio::test]
async fn ray_list_jobs_names_the_drivers_node_where_ray_does() -> anyhow::Result<()> {
    let runs = FixtureRun::all()?;
    let served = serve_runs(&runs, None).await?;
    let mut drivers = 0;
    for run in runs.iter().filter(|run| run.name != LOSSY_RUN) {
        let path = format!("/ray/{}/latest/api/v0/jobs?limit=100&detail=True", run.name);
        let (status, body) = get(&served, &path).await?;
        ensure!(status == 200, "{path}: {body}");
        let ours = list_result(&body)?["result"]
            .as_array()
            .context("rows")?
            .clone();
        for ray in run
            .ground_truth("jobs.json")?
            .as_array()
            .context("jobs.json")?
        {
            let mine = ours
                .iter()
                .find(|job| job["job_id"] == ray["job_id"])
                .with_context(|| format!("{}: no job {}", run.name, ray["job_id"]))?;
            ensure!(
                mine["driver_node_id"] == ray["driver_node_id"],
                "{}: job {} driver_node_id ours {}, Ray's {}",
                run.name,
                ray["job_id"],
                mine["driver_node_id"],
                ray["driver_node_id"]
            );
            drivers += usize::from(ray["type"] == "DRIVER");
        }
    }
    ensure!(drivers > 0, "no run has a plain driver job");
    Ok(())
}
