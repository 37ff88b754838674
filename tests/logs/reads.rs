//! Reads by index: a task's output is exactly its bytes of its worker's file, a node's files
//! list and tail in our routes and Ray's, and a whole file's tail fetches no more than the
//! response holds.

use std::sync::Arc;

use afterglow_tests::faults::RecordsRequests;
use afterglow_tests::local_storage;
use anyhow::{Context as _, ensure};
use shared::keys::{ClusterName, LogFile, LogFileName, NodeId, SessionName};
use shared::query::{QueryEngine, QuerySettings};
use shared::storage::Storage;

use super::{SESSION, log_file, node_id, put, serving};

/// Ray's captured traffic with one attempt made to have printed: its executor event's
/// `taskLogInfo` end offsets moved `printed` bytes past their starts. Returns the bodies and
/// that attempt's task id (hex) and stdout file name.
fn bodies_with_output(printed: u64) -> anyhow::Result<(Vec<Vec<u8>>, String, String)> {
    use base64::Engine as _;
    let run = afterglow_tests::FixtureRun::named("basic-workload")?;
    let mut found = None;
    let mut bodies = Vec::new();
    for body in afterglow_tests::bodies(&run)? {
        let mut events: serde_json::Value = serde_json::from_slice(&body)?;
        for event in events.as_array_mut().into_iter().flatten() {
            // `get_mut`, not indexing: indexing a missing key would add it to every event.
            let Some(lifecycle) = event.get_mut("taskLifecycleEvent") else {
                continue;
            };
            if found.is_some() || lifecycle.get("taskAttempt") != Some(&serde_json::json!(0)) {
                continue;
            }
            let task_id = base64::engine::general_purpose::STANDARD.decode(
                lifecycle
                    .get("taskId")
                    .and_then(serde_json::Value::as_str)
                    .context("taskId")?,
            )?;
            let Some(info) = lifecycle
                .get_mut("taskLogInfo")
                .filter(|info| info.is_object())
            else {
                continue;
            };
            for stream in ["stdout", "stderr"] {
                let start: u64 = info
                    .get(format!("{stream}Start"))
                    .and_then(serde_json::Value::as_str)
                    .context("start offset")?
                    .parse()?;
                info[format!("{stream}End")] = (start + printed).to_string().into();
            }
            let file = info
                .get("stdoutFile")
                .and_then(serde_json::Value::as_str)
                .context("stdoutFile")?;
            found = Some((
                task_id
                    .iter()
                    .map(|byte| format!("{byte:02x}"))
                    .collect::<String>(),
                file.rsplit('/').next().unwrap_or(file).to_owned(),
            ));
        }
        bodies.push(serde_json::to_vec(&events)?);
    }
    let (task_id, file) = found.context("no executor event with taskLogInfo")?;
    Ok((bodies, task_id, file))
}

#[tokio::test]
async fn a_tasks_logs_are_exactly_its_bytes_of_its_workers_file() -> anyhow::Result<()> {
    const PRINTED: u64 = 12;
    let (bodies, task_id, name) = bodies_with_output(PRINTED)?;
    let served = serving(&bodies).await?;
    let api = |path: String| {
        let url = format!("{}{path}", served.server.url);
        async move {
            let response = reqwest::get(url).await?;
            let status = response.status().as_u16();
            let complete = response
                .headers()
                .get("x-afterglow-log-complete")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned);
            anyhow::Ok((status, complete, response.bytes().await?.to_vec()))
        }
    };
    let (status, _, detail) = api(format!("/api/tasks/{task_id}")).await?;
    ensure!(status == 200, "{}", String::from_utf8_lossy(&detail));
    let detail: serde_json::Value = serde_json::from_slice(&detail)?;
    let attempt = &detail["attempts"][0];
    let file = LogFile {
        cluster: ClusterName::new("logs")?,
        session: SessionName::new(attempt["session_name"].as_str().context("session")?)?,
        node_id: NodeId::new(attempt["node_id"].as_str().context("node_id")?)?,
        file: LogFileName::new(&name)?,
    };
    let start = attempt["task_log_info"]["stdout_start"]
        .as_u64()
        .context("stdout_start")?;

    let (status, _, said) = api(format!("/api/tasks/{task_id}/logs")).await?;
    let said = String::from_utf8_lossy(&said);
    ensure!(
        status == 404 && said.contains("ship-logs"),
        "{status} {said}"
    );

    // The worker's file as shipped: other tasks' output around this attempt's bytes.
    let before = "x".repeat(usize::try_from(start)?);
    let mine = "attempt out\n";
    ensure!(mine.len() as u64 == PRINTED);
    let whole = format!("{before}{mine}after, another task's output\n");
    put(
        &*served.storage,
        &file,
        0,
        &whole.as_bytes()[..whole.len() - 10],
    )
    .await?;
    let (status, complete, bytes) = api(format!("/api/tasks/{task_id}/logs?attempt=0")).await?;
    ensure!(
        status == 200 && complete.as_deref() == Some("true"),
        "{status} {complete:?}"
    );
    ensure!(
        bytes == mine.as_bytes(),
        "{:?}",
        String::from_utf8_lossy(&bytes)
    );

    let (status, _, said) = api(format!("/api/tasks/{task_id}/logs?stream=stderr")).await?;
    let said = String::from_utf8_lossy(&said);
    ensure!(status == 404, "stderr was never shipped: {status} {said}");
    let (status, _, said) = api(format!("/api/tasks/{task_id}/logs?attempt=7")).await?;
    ensure!(status == 404, "{status} {}", String::from_utf8_lossy(&said));
    let (status, _, said) = api(format!("/api/tasks/{task_id}/logs?stream=both")).await?;
    ensure!(status == 400, "{status} {}", String::from_utf8_lossy(&said));

    // A driver has no taskLogInfo and no worker file: 404, saying why.
    let (_, _, drivers) = api("/api/tasks?include_drivers=true&type=DRIVER_TASK".into()).await?;
    let drivers: serde_json::Value = serde_json::from_slice(&drivers)?;
    let driver = drivers["tasks"][0]["task_id"]
        .as_str()
        .context("a driver")?;
    let (status, _, said) = api(format!("/api/tasks/{driver}/logs")).await?;
    let said = String::from_utf8_lossy(&said);
    ensure!(
        status == 404 && said.contains("taskLogInfo"),
        "{status} {said}"
    );

    // The same traffic from a second cluster: the task id now names two attempts, so a request
    // that does not say which is refused with both places, and one that does gets its bytes.
    afterglow_tests::post_all(&format!("{}/v1/events/other", served.server.url), &bodies).await?;
    served.queue.idle().await;
    let (status, _, said) = api(format!("/api/tasks/{task_id}/logs?attempt=0")).await?;
    let said = String::from_utf8_lossy(&said);
    let session = file.session.as_str();
    ensure!(
        status == 409
            && said.contains(&format!("cluster=logs session={session}"))
            && said.contains(&format!("cluster=other session={session}")),
        "{status} {said}"
    );
    let (status, _, bytes) = api(format!(
        "/api/tasks/{task_id}/logs?attempt=0&cluster=logs&session={session}"
    ))
    .await?;
    ensure!(
        status == 200 && bytes == mine.as_bytes(),
        "{status} {:?}",
        String::from_utf8_lossy(&bytes)
    );
    Ok(())
}

#[tokio::test]
async fn a_nodes_files_list_and_tail_in_ours_and_in_rays_routes() -> anyhow::Result<()> {
    // Ray's routes name a session the tables know: the captured run's.
    let (bodies, _, _) = bodies_with_output(0)?;
    let served = serving(&bodies).await?;
    let get = |path: String| {
        let url = format!("{}{path}", served.server.url);
        async move {
            let response = reqwest::get(url).await?;
            let status = response.status().as_u16();
            anyhow::Ok((status, response.text().await?))
        }
    };
    let (_, clusters) = get("/api/clusters?cluster=logs".to_owned()).await?;
    let clusters: serde_json::Value = serde_json::from_str(&clusters)?;
    let session = clusters["clusters"][0]["sessions"][0]["session_name"]
        .as_str()
        .context("a session")?
        .to_owned();
    let in_session = |name: &str| -> anyhow::Result<LogFile> {
        Ok(LogFile {
            session: SessionName::new(&session)?,
            ..log_file(name)?
        })
    };
    let (raylet, worker) = (
        in_session("raylet.out")?,
        in_session("worker-d-01000000-3.out")?,
    );
    put(&*served.storage, &raylet, 0, b"one\ntwo\n").await?;
    put(&*served.storage, &raylet, 8, b"three\nfour").await?;
    put(&*served.storage, &worker, 0, b"printed\n").await?;

    let node = node_id();
    let place = format!("cluster=logs&session={session}&node_id={node}");
    let (status, listed) = get(format!("/api/logs?{place}")).await?;
    ensure!(status == 200, "{listed}");
    let listed: serde_json::Value = serde_json::from_str(&listed)?;
    ensure!(
        listed["files"]
            == serde_json::json!([
                {"file": "raylet.out", "bytes": 18},
                {"file": "worker-d-01000000-3.out", "bytes": 8}
            ]),
        "{listed}"
    );
    for (lines, expected) in [
        ("2", "three\nfour"),
        ("-1", "one\ntwo\nthree\nfour"),
        ("1", "four"),
    ] {
        let (status, tail) = get(format!(
            "/api/logs/file?{place}&file=raylet.out&lines={lines}"
        ))
        .await?;
        ensure!(
            status == 200 && tail == expected,
            "lines={lines}: {status} {tail:?}"
        );
    }
    let (status, _) = get(format!("/api/logs/file?{place}&file=gcs_server.out")).await?;
    ensure!(status == 404, "a file never shipped: {status}");
    let (status, _) = get("/api/logs?cluster=logs&node_id=x".to_owned()).await?;
    ensure!(status == 400, "no session: {status}");

    // Ray's own routes, as `ray logs` and the dashboard's logs page call them.
    let ray = format!("/ray/logs/{session}/api/v0/logs");
    let (status, index) = get(format!("{ray}?node_id={node}")).await?;
    ensure!(status == 200, "{status} {index}");
    let index: serde_json::Value = serde_json::from_str(&index)?;
    ensure!(
        index["data"]["result"]
            == serde_json::json!({"raylet": ["raylet.out"], "worker_out": ["worker-d-01000000-3.out"]}),
        "{index}"
    );
    let (status, index) = get(format!("{ray}?node_id={node}&glob=*worker*")).await?;
    ensure!(
        status == 200 && !index.contains("raylet"),
        "{status} {index}"
    );
    let (status, tail) = get(format!(
        "{ray}/file?node_id={node}&filename=raylet.out&lines=2"
    ))
    .await?;
    ensure!(status == 200 && tail == "three\nfour", "{status} {tail:?}");
    let (status, said) = get(format!("{ray}?glob=*")).await?;
    ensure!(status == 400 && said.contains("node id"), "{status} {said}");
    Ok(())
}

#[tokio::test]
async fn a_whole_files_tail_fetches_no_more_than_the_response_holds() -> anyhow::Result<()> {
    let (_dir, storage) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(storage);
    let file = log_file("raylet.out")?;
    // Two extents' worth of output that compresses poorly, shipped at once (stored in a
    // segment), then 100 pieces of 1 000 bytes, ten 100-byte lines each, each shipped as a
    // request (carried inline in the node's index).
    let early = afterglow_tests::noisy_lines(2 * 1024 * 1024, 5);
    put(&*storage, &file, 0, &early).await?;
    let piece = format!("{}\n", "y".repeat(99)).repeat(10);
    let mut whole = early.clone();
    for _ in 0..100 {
        put(&*storage, &file, whole.len() as u64, piece.as_bytes()).await?;
        whole.extend_from_slice(piece.as_bytes());
    }
    let segment_bytes: u64 = storage
        .list("logs/")
        .await?
        .iter()
        .filter(|object| object.key.as_str().contains("/segments/"))
        .map(|object| object.size)
        .sum();
    // A response inside the inline pieces reads the index alone; one reaching into the early
    // output fetches only the last of its two extents.
    for (response_bytes, extents_fetched) in [(2_500, 0), (150_000, 1)] {
        let recorder = Arc::new(RecordsRequests::new(Arc::clone(&storage)));
        let cache = tempfile::tempdir()?;
        let mut settings = QuerySettings::under(cache.path());
        settings.response_bytes = response_bytes;
        let engine = QueryEngine::open(Arc::clone(&recorder) as Arc<dyn Storage>, settings)?;
        let params: Vec<(String, String)> = [
            ("cluster", "logs".to_owned()),
            ("session", SESSION.to_owned()),
            ("node_id", node_id()),
            ("file", "raylet.out".to_owned()),
            ("lines", "-1".to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
        let tail = engine.answer_log_file(&params).await?;
        ensure!(
            tail.bytes == whole[whole.len() - response_bytes..] && !tail.complete,
            "{} bytes, complete: {}",
            tail.bytes.len(),
            tail.complete
        );
        let (gets, ranges) = (recorder.gets(), recorder.ranges());
        ensure!(
            gets.len() == 1 && gets[0].ends_with("index.json"),
            "{gets:?}"
        );
        ensure!(
            ranges.len() == extents_fetched,
            "{} extents fetched for {response_bytes} bytes: {ranges:?}",
            ranges.len()
        );
        ensure!(recorder.lists() == 0, "the tail listed");
        // One extent of the segment's two: well under two thirds of it, not the whole.
        let fetched: u64 = ranges
            .iter()
            .map(|(_, range)| range.end - range.start)
            .sum();
        ensure!(
            fetched * 3 < segment_bytes * 2,
            "{fetched} bytes fetched of a {segment_bytes}-byte segment"
        );
    }
    Ok(())
}
