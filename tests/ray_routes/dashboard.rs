//! The routes Ray's dashboard reads answer the shapes the live dashboard did.

use super::*;

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
    let (_, actors) = served
        .get("/ray/basic-workload/api/v0/actors?limit=1")
        .await?;
    let actor = actors["data"]["result"]["result"][0]["actor_id"]
        .as_str()
        .context("an actor")?
        .to_owned();
    let (_, nodes) = served.get("/ray/basic-workload/api/v0/nodes").await?;
    let node = nodes["data"]["result"]["result"][0]["node_id"]
        .as_str()
        .context("a node")?
        .to_owned();
    let (_, jobs) = served.get("/ray/basic-workload/api/jobs/").await?;
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
        let (status, ours) = served
            .get(&format!("/ray/basic-workload/latest/{route}"))
            .await?;
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
    let (_, status) = served
        .get("/ray/basic-workload/api/cluster_status?format=1")
        .await?;
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
async fn downloads_are_named_as_ray_names_them() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs(std::slice::from_ref(&run), None).await?;
    let (_, jobs) = served.get("/ray/basic-workload/api/jobs/").await?;
    let job = jobs[0]["job_id"].as_str().context("a job")?.to_owned();
    let disposition = |path: String| {
        let url = format!("{}{path}", served.server.url);
        async move {
            let response = reqwest::get(&url).await?;
            ensure!(response.status() == 200, "{url}: {}", response.status());
            let value = response
                .headers()
                .get("content-disposition")
                .map(|value| value.to_str().map(str::to_owned))
                .transpose()?;
            let _: Json = serde_json::from_slice(&response.bytes().await?)?;
            anyhow::Ok(value)
        }
    };

    // Ray 2.60's dashboard saves the trace file its "Download" button asks for
    // (state_head.py's tasks_timeline): `timeline-{job_id}-%Y-%m-%d_%H-%M-%S.json`.
    let timeline = format!("/ray/basic-workload/api/v0/tasks/timeline?job_id={job}");
    let saved = disposition(format!("{timeline}&download=1"))
        .await?
        .context("a download without Content-Disposition")?;
    let prefix = format!("attachment; filename=\"timeline-{job}-");
    let stamp = saved
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(".json\""))
        .with_context(|| format!("{saved:?}"))?;
    let digits = |range: std::ops::Range<usize>| {
        stamp
            .get(range)
            .is_some_and(|part| part.bytes().all(|b| b.is_ascii_digit()))
    };
    ensure!(
        stamp.len() == 19
            && [(4, b'-'), (7, b'-'), (10, b'_'), (13, b'-'), (16, b'-')]
                .iter()
                .all(|&(at, sep)| stamp.as_bytes()[at] == sep)
            && [0..4, 5..7, 8..10, 11..13, 14..16, 17..19]
                .into_iter()
                .all(digits),
        "{saved:?}"
    );
    // Shown, not saved, when not asked to download.
    ensure!(disposition(timeline).await?.is_none());
    Ok(())
}

#[tokio::test]
async fn prometheus_is_answered_as_a_cluster_without_it_answers() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs(std::slice::from_ref(&run), None).await?;
    // The live cluster had no Prometheus: its dashboard then tells the user to set one up, where
    // a healthy answer had it frame Grafana's "DISABLED" host.
    let live = captured("GET__api_prometheus_health.500.json")?;
    let (status, ours) = served
        .get("/ray/basic-workload/latest/api/prometheus_health")
        .await?;
    ensure!(status == 500, "{status} {ours}");
    ensure!(
        ours["result"] == live["result"] && ours["msg"] == live["msg"],
        "{ours}"
    );
    let (mut want, mut have) = (BTreeSet::new(), BTreeSet::new());
    shape(&live, "", &mut want);
    shape(&ours, "", &mut have);
    ensure!(want == have, "{want:?} != {have:?}");
    Ok(())
}

/// With a Grafana configured, Ray's metrics pages frame it: Grafana and Prometheus answer as
/// running, the host is the relative `grafana` (so a frame asks Ray's dashboard, and through its
/// proxy Afterglow), and a frame of Ray's Metrics page is sent on to the configured Grafana over
/// the session's first to last event, as `/api/clusters` gives them, without refresh.
#[tokio::test]
async fn with_grafana_the_metrics_pages_frame_it_over_the_session() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs_locally(std::slice::from_ref(&run), |mut settings| {
        if let Some(query) = settings.query.as_mut() {
            let url = "https://grafana.example.com/d/rayDefaultDashboard?orgId=1";
            query.grafana_url =
                Some(shared::config::GrafanaUrl::new(url).map_err(anyhow::Error::msg)?);
        }
        Ok(settings)
    })
    .await?;
    let (status, listed) = served.get("/api/clusters?cluster=basic-workload").await?;
    ensure!(status == 200, "{status} {listed}");
    let session = &listed["clusters"][0]["sessions"][0];
    let name = session["session_name"].as_str().context("session_name")?;
    let (first, last) = (&session["first_ms"], &session["last_ms"]);
    ensure!(first.is_i64() && last.is_i64(), "{session}");

    let (status, prometheus) = served
        .get("/ray/basic-workload/latest/api/prometheus_health")
        .await?;
    ensure!(
        status == 200 && prometheus["result"] == true,
        "{status} {prometheus}"
    );
    let (status, grafana) = served
        .get("/ray/basic-workload/latest/api/grafana_health")
        .await?;
    ensure!(
        status == 200 && grafana["result"] == true,
        "{status} {grafana}"
    );
    ensure!(
        grafana["data"]["grafanaHost"] == "grafana"
            && grafana["data"]["sessionName"] == name
            && grafana["data"]["dashboardUids"]["default"] == "rayDefaultDashboard",
        "{grafana}"
    );

    // The frame Ray's Metrics page builds from that answer (pages/metrics/Metrics.tsx).
    let frame = format!(
        "{}/ray/basic-workload/latest/grafana/d/rayDefaultDashboard/?orgId=1&theme=light\
         &kiosk=1&refresh=5s&from=now-5m&to=now&var-SessionName={name}\
         &var-datasource=Prometheus",
        served.server.url
    );
    let response = reqwest::get(&frame).await?;
    ensure!(response.status() == 200, "{}", response.status());
    let page = response.text().await?;
    let sent = format!(
        "url=https://grafana.example.com/d/rayDefaultDashboard/?orgId=1&amp;theme=light\
         &amp;kiosk=1&amp;var-datasource=Prometheus&amp;from={first}&amp;to={last}\
         &amp;var-SessionName={name}\""
    );
    ensure!(page.contains(&sent), "{page} does not hold {sent}");
    Ok(())
}
