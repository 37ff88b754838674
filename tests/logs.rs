//! Node logs (docs/architecture.md, "Logs"): pieces stored by index on both backends,
//! re-sends and lost responses recognised wherever they overlap, rewritten files refused, reads
//! that never list; `POST /v1/logs/{cluster}` checking what it is sent; and the shipper sending a
//! Ray session folder through `serve`.

use std::sync::Arc;

use afterglow::ship_logs::HttpSink;
use afterglow_tests::faults::{LosesConditionalResponses, RecordsGets};
use afterglow_tests::{
    TestServer, cluster_token, for_each_backend, ingest_keys, local_storage, open_settings,
};
use anyhow::{Context as _, ensure};
use shared::keys::{ClusterName, LogFile, LogFileName, NodeId, SessionName};
use shared::logs::read::{LogRange, list_files, read_range, read_tail};
use shared::logs::ship::{ShipError, ShipSettings, Shipper};
use shared::logs::store::{MAX_BODY_BYTES, MERGE_RUN, PieceOutcome, ReadPiece, put_pieces};
use shared::query::{QueryEngine, QuerySettings};
use shared::storage::Storage;

const SESSION: &str = "session_2026-11-23_10-00-00_000001_4242";
const SECRET: &str = "logs-test-secret-0123456789";

/// No limit on the bytes a read returns.
const ALL: usize = usize::MAX;

fn node_id() -> String {
    "5e".repeat(28)
}

fn log_file(name: &str) -> anyhow::Result<LogFile> {
    Ok(LogFile {
        cluster: ClusterName::new("logs")?,
        session: SessionName::new(SESSION)?,
        node_id: NodeId::new(&node_id())?,
        file: LogFileName::new(name)?,
    })
}

/// Stores one piece of `file` as a request of its own.
async fn put(
    storage: &dyn Storage,
    file: &LogFile,
    offset: u64,
    bytes: &[u8],
) -> anyhow::Result<PieceOutcome> {
    let pieces = [ReadPiece {
        file: file.file.clone(),
        offset,
        bytes,
    }];
    put_pieces(storage, &file.node(), &pieces)
        .await?
        .into_iter()
        .next()
        .context("no outcome for the piece")
}

/// What a stored piece's outcome says: bytes newly stored and where the file continues.
fn stored(outcome: &PieceOutcome) -> anyhow::Result<(usize, u64)> {
    match outcome {
        PieceOutcome::Stored { stored, end } => Ok((*stored, *end)),
        PieceOutcome::Refused { reason } => anyhow::bail!("refused: {reason}"),
    }
}

async fn pieces_tile_a_file_and_any_range_reads_back(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let file = log_file("worker-a-01000000-7.out")?;
    let text = b"first line\nsecond line\nthird\n";
    put(&*storage, &file, 0, &text[..11]).await?;
    put(&*storage, &file, 11, &text[11..]).await?;
    let whole = read_range(&*storage, &file, 0, None, ALL).await?;
    ensure!(whole.bytes == text && whole.complete, "{whole:?}");
    // A range across the two pieces, as a task's taskLogInfo names one.
    let middle = read_range(&*storage, &file, 6, Some(17), ALL).await?;
    ensure!(
        middle
            == LogRange {
                bytes: text[6..17].to_vec(),
                complete: true
            },
        "{middle:?}"
    );
    // Past what was shipped: the stored part, marked incomplete.
    let past = read_range(&*storage, &file, 23, Some(40), ALL).await?;
    ensure!(
        past == LogRange {
            bytes: text[23..].to_vec(),
            complete: false
        },
        "{past:?}"
    );
    let other = read_range(&*storage, &log_file("never-sent.out")?, 0, Some(5), ALL).await?;
    ensure!(other.bytes.is_empty() && !other.complete, "{other:?}");
    // A limit cuts a range short, and says so; a range that just fits is whole.
    let cut = read_range(&*storage, &file, 6, None, 5).await?;
    ensure!(
        cut == LogRange {
            bytes: text[6..11].to_vec(),
            complete: false
        },
        "{cut:?}"
    );
    let fits = read_range(&*storage, &file, 6, Some(17), 11).await?;
    ensure!(fits.bytes == text[6..17] && fits.complete, "{fits:?}");
    Ok(())
}

async fn overlaps_are_checked_wherever_they_fall_and_only_new_bytes_stored(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let file = log_file("worker-b-01000000-8.err")?;
    put(&*storage, &file, 0, b"0123456789").await?;
    // A re-send from an acknowledged offset, with what was appended since.
    ensure!(stored(&put(&*storage, &file, 0, b"0123456789abc").await?)? == (3, 13));
    ensure!(stored(&put(&*storage, &file, 0, b"0123456789abc").await?)? == (0, 13));
    // Starting inside a stored extent, and running past two of them.
    ensure!(stored(&put(&*storage, &file, 5, b"56789abcdef").await?)? == (3, 16));
    // The same name with other bytes (a file rewritten), the difference inside an extent and
    // not at the piece's start: refused, and nothing changes.
    let Some(at) = refusal(&put(&*storage, &file, 3, b"3456X89").await?) else {
        anyhow::bail!("a rewrite was not refused");
    };
    ensure!(at.contains("bytes 7..10"), "{at}");
    // A gap at 16..20, then bytes stored after it.
    put(&*storage, &file, 20, b"WXYZ").await?;
    // Equal, then new bytes in the gap, then a difference: the new bytes before the
    // difference are stored, nothing after it.
    ensure!(
        refusal(&put(&*storage, &file, 14, b"efGHIJwXYZ!").await?).is_some(),
        "a difference after a gap was not refused"
    );
    let stored_now = read_range(&*storage, &file, 0, None, ALL).await?;
    ensure!(
        stored_now.bytes == b"0123456789abcdefGHIJWXYZ" && stored_now.complete,
        "{stored_now:?}"
    );
    Ok(())
}

/// Why a piece was refused; `None` when it was stored.
fn refusal(outcome: &PieceOutcome) -> Option<String> {
    match outcome {
        PieceOutcome::Refused { reason } => Some(reason.clone()),
        PieceOutcome::Stored { .. } => None,
    }
}

async fn a_lost_response_is_recognised_not_refused(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let faulty = LosesConditionalResponses::new(Arc::clone(&storage), "logs/", 1);
    let file = log_file("raylet.out")?;
    // The index lands, the response is lost, the SDK's retry sees 412.
    let outcome = put(&faulty, &file, 0, b"raylet started\n").await?;
    ensure!(faulty.lost() == 1, "the response was not lost");
    ensure!(stored(&outcome)? == (15, 15), "{outcome:?}");
    ensure!(read_range(&*storage, &file, 0, None, ALL).await?.bytes == b"raylet started\n");
    Ok(())
}

async fn one_request_holds_many_files_and_they_list_by_name(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let node = log_file("raylet.out")?.node();
    let (raylet, rotated) = (
        LogFileName::new("raylet.out")?,
        LogFileName::new("raylet.out.1")?,
    );
    let pieces = [
        ReadPiece {
            file: raylet.clone(),
            offset: 0,
            bytes: b"one\ntwo\n",
        },
        ReadPiece {
            file: rotated.clone(),
            offset: 0,
            bytes: b"rotated\n",
        },
        ReadPiece {
            file: raylet.clone(),
            offset: 8,
            bytes: b"three\n",
        },
    ];
    let outcomes = put_pieces(&*storage, &node, &pieces).await?;
    ensure!(outcomes.len() == 3, "{outcomes:?}");
    let segments = storage.list(&format!("{}segments/", node.prefix())).await?;
    ensure!(segments.len() == 1, "one object per request: {segments:?}");
    let file = node.file(raylet);
    let whole = read_range(&*storage, &file, 0, None, ALL).await?;
    ensure!(
        whole.bytes == b"one\ntwo\nthree\n" && whole.complete,
        "{whole:?}"
    );
    let tail = read_tail(&*storage, &file, 3, ALL).await?;
    ensure!(
        tail.bytes == b"one\ntwo\nthree\n" && tail.complete,
        "{tail:?}"
    );
    let names: Vec<(String, u64)> = list_files(&*storage, &node)
        .await?
        .into_iter()
        .map(|shipped| (shipped.name.to_string(), shipped.bytes))
        .collect();
    ensure!(
        names
            == [
                ("raylet.out".to_owned(), 14),
                ("raylet.out.1".to_owned(), 8)
            ],
        "{names:?}"
    );
    Ok(())
}

async fn a_large_resend_over_many_stored_pieces_costs_its_own_size(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let node = log_file("raylet.out")?.node();
    let name = LogFileName::new("worker-e-01000000-5.out")?;
    let file = node.file(name.clone());
    // 10 000 one-line pieces, shipped 1 000 to a request: a slow printer over hours.
    let lines: Vec<String> = (0..10_000)
        .map(|line| format!("line {line:05}\n"))
        .collect();
    let mut offset = 0_u64;
    for batch in lines.chunks(1_000) {
        let mut pieces = Vec::new();
        for line in batch {
            pieces.push(ReadPiece {
                file: name.clone(),
                offset,
                bytes: line.as_bytes(),
            });
            offset += line.len() as u64;
        }
        put_pieces(&*storage, &node, &pieces).await?;
    }
    let stored_text: String = lines.concat();
    // A shipper that lost its state sends the file again from 0, as much as a body holds.
    let mut resend = stored_text.clone().into_bytes();
    resend.resize(MAX_BODY_BYTES - 1_024, b'+');
    let recorder = Arc::new(RecordsGets::new(Arc::clone(&storage)));
    let outcome = put(&*recorder, &file, 0, &resend).await?;
    ensure!(
        stored(&outcome)? == (resend.len() - stored_text.len(), resend.len() as u64),
        "{outcome:?}"
    );
    // The stored part is read back a few merged extents at a time, not a piece at a time.
    let reads = recorder.ranges().len();
    ensure!(
        reads <= 2 * MERGE_RUN,
        "{reads} ranged reads to check a re-send over 10 000 pieces"
    );
    ensure!(recorder.lists() == 0, "the store listed");
    let whole = read_range(&*recorder, &file, 0, None, ALL).await?;
    ensure!(
        whole.bytes == resend,
        "{} bytes read back",
        whole.bytes.len()
    );
    ensure!(recorder.lists() == 0, "a read listed");
    Ok(())
}

async fn a_segment_an_age_rule_removed_is_a_gap_a_resend_fills(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let file = log_file("worker-f-01000000-6.out")?;
    put(&*storage, &file, 0, b"first\n").await?;
    put(&*storage, &file, 6, b"second\n").await?;
    // The age rule removes the first request's segment (ids sort by time).
    let segments = storage
        .list(&format!("{}segments/", file.node().prefix()))
        .await?;
    ensure!(segments.len() == 2, "{segments:?}");
    storage.delete(&segments[0].key).await?;
    ensure!(
        read_range(&*storage, &file, 0, None, ALL).await.is_err(),
        "a read of a removed segment answered"
    );
    // The shipper, its state lost, sends the file from 0: the gap is filled, the rest checked.
    let outcome = put(&*storage, &file, 0, b"first\nsecond\nthird\n").await?;
    ensure!(stored(&outcome)? == (12, 19), "{outcome:?}");
    let whole = read_range(&*storage, &file, 0, None, ALL).await?;
    ensure!(
        whole.bytes == b"first\nsecond\nthird\n" && whole.complete,
        "{whole:?}"
    );
    Ok(())
}

for_each_backend!(
    one_request_holds_many_files_and_they_list_by_name,
    pieces_tile_a_file_and_any_range_reads_back,
    overlaps_are_checked_wherever_they_fall_and_only_new_bytes_stored,
    a_lost_response_is_recognised_not_refused,
    a_large_resend_over_many_stored_pieces_costs_its_own_size,
    a_segment_an_age_rule_removed_is_a_gap_a_resend_fills,
);

/// `serve` with ingest behind [`SECRET`], over a local folder.
async fn serve_with_token() -> anyhow::Result<(TestServer, Arc<dyn Storage>, tempfile::TempDir)> {
    let (dir, storage) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(storage);
    let settings = afterglow::serve::ServeSettings {
        ingest_keys: Some(ingest_keys(SECRET)?),
        ..open_settings(Arc::clone(&storage))
    };
    Ok((TestServer::start(settings).await?, storage, dir))
}

#[tokio::test]
async fn the_log_route_checks_token_place_and_size() -> anyhow::Result<()> {
    let (server, storage, _dir) = serve_with_token().await?;
    let token = cluster_token(SECRET, "logs");
    let client = reqwest::Client::new();
    let node = node_id();
    let post = |query: String, body: Vec<u8>| {
        let request = client
            .post(format!("{}/v1/logs/logs?{query}", server.url))
            .body(body);
        async move {
            let response = request.send().await?;
            let status = response.status().as_u16();
            let text = response.text().await?;
            anyhow::Ok((status, text))
        }
    };
    let place = format!("session={SESSION}&node_id={node}");
    let one = format!("{place}&file=raylet.out&offset=0");
    for (query, status, says) in [
        (place.clone(), 401, "missing ingest token"),
        (
            format!("token=wrong-token-0123456789&{place}"),
            403,
            "wrong ingest token",
        ),
        (
            format!("token={}&{place}", cluster_token(SECRET, "other")),
            403,
            "wrong ingest token for this cluster",
        ),
        (format!("token={token}&node_id={node}"), 400, "`session`"),
        (
            format!("token={token}&session={SESSION}&node_id=XYZ"),
            400,
            "node id",
        ),
        (
            format!("token={token}&{place}&file=..%2Fx&offset=0"),
            400,
            "log file name",
        ),
        (
            format!("token={token}&{place}&file=a&offset=-1"),
            400,
            "offset",
        ),
        (format!("token={token}&{place}"), 400, "header line"),
    ] {
        let (got, text) = post(query.clone(), b"x".to_vec()).await?;
        ensure!(
            got == status && text.contains(says),
            "{query}: {got} {text}"
        );
    }
    let (got, text) = post(
        format!("token={token}&{one}"),
        vec![b'x'; MAX_BODY_BYTES + 1],
    )
    .await?;
    ensure!(got == 413, "{got} {text}");
    // One file's bytes, as earlier shippers send them.
    let (got, text) = post(format!("token={token}&{one}"), b"hello\n".to_vec()).await?;
    ensure!(got == 200 && text.contains("\"end\":6"), "{got} {text}");
    let (got, text) = post(format!("token={token}&{one}"), b"HELLO\n".to_vec()).await?;
    ensure!(got == 409 && text.contains("rewritten"), "{got} {text}");
    // A framed body: each piece answered, a refused one beside a stored one.
    let (raylet, worker) = (
        LogFileName::new("raylet.out")?,
        LogFileName::new("worker-a-01000000-1.out")?,
    );
    let mut body = shared::logs::frames::Body::new(MAX_BODY_BYTES);
    body.push(shared::logs::frames::Piece {
        file: &raylet,
        offset: 0,
        bytes: b"HELLO\nworld\n",
    });
    body.push(shared::logs::frames::Piece {
        file: &worker,
        offset: 0,
        bytes: b"printed\n",
    });
    let (got, text) = post(format!("token={token}&{place}"), body.into_bytes()).await?;
    ensure!(got == 200, "{got} {text}");
    let answer: shared::logs::frames::BodyAnswer = serde_json::from_str(&text)?;
    ensure!(
        matches!(
            answer.pieces.as_slice(),
            [
                shared::logs::frames::PieceAnswer {
                    outcome: PieceOutcome::Refused { .. },
                    ..
                },
                shared::logs::frames::PieceAnswer {
                    outcome: PieceOutcome::Stored { stored: 8, end: 8 },
                    ..
                },
            ]
        ),
        "{text}"
    );
    let stored_now = read_range(&*storage, &log_file("raylet.out")?, 0, None, ALL).await?;
    ensure!(stored_now.bytes == b"hello\n", "{stored_now:?}");
    let printed = read_range(
        &*storage,
        &log_file("worker-a-01000000-1.out")?,
        0,
        None,
        ALL,
    )
    .await?;
    ensure!(printed.bytes == b"printed\n", "{printed:?}");
    server.stop().await
}

#[tokio::test]
async fn the_shipper_sends_a_session_folder_through_serve_and_waits_out_an_outage()
-> anyhow::Result<()> {
    let token = cluster_token(SECRET, "logs");
    let ray = tempfile::tempdir()?;
    let session = ray.path().join(SESSION);
    std::fs::create_dir_all(session.join("logs").join("old"))?;
    std::fs::write(
        session.join(format!("metrics_agent_port_{}", node_id())),
        "1",
    )?;
    let files = [
        ("worker-c-01000000-9.out", "task says hi\n".repeat(300)),
        (
            "worker-c-01000000-9.err",
            "Traceback (most recent call last):\n".to_owned(),
        ),
        ("raylet.out", "started\n".to_owned()),
    ];
    for (name, text) in &files {
        std::fs::write(session.join("logs").join(name), text)?;
    }
    let settings = ShipSettings {
        ray_dir: ray.path().to_owned(),
        node_id: None,
        state_file: ray.path().join("state.json"),
        body_bytes: 2_000,
    };

    // Nothing listens yet: the pass asks to retry and acknowledges nothing.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let down = format!(
        "http://{}/v1/events/logs?token={token}",
        closed.local_addr()?
    );
    drop(closed);
    let mut shipper = Shipper::new(settings.clone())?;
    match shipper.pass(&HttpSink::new(&down)?).await {
        Err(ShipError::Retry { reason, .. }) => ensure!(!reason.contains(&token), "{reason}"),
        other => anyhow::bail!("a pass against a closed port: {other:?}"),
    }

    let (server, storage, _dir) = serve_with_token().await?;
    let sink = HttpSink::new(&format!("{}/v1/events/logs?token={token}", server.url))?;
    let report = shipper.pass(&sink).await?;
    // 3 900 bytes of one file and two small ones, in bodies of at most 2 000 bytes.
    ensure!(report.requests == 3 && report.pieces == 5, "{report:?}");
    for (name, text) in &files {
        let stored = read_range(&*storage, &log_file(name)?, 0, None, ALL).await?;
        ensure!(
            stored.bytes == text.as_bytes(),
            "{name}: {} of {} bytes",
            stored.bytes.len(),
            text.len()
        );
    }
    // A restarted shipper has nothing to send.
    let again = Shipper::new(settings)?.pass(&sink).await?;
    ensure!(again.requests == 0, "{again:?}");
    server.stop().await.context("stopping serve")
}

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

/// `serve` over a local folder with `bodies` posted as cluster `logs` and compacted.
async fn serving(bodies: &[Vec<u8>]) -> anyhow::Result<afterglow_tests::Served> {
    let served = afterglow_tests::serve_runs_locally(&[], Ok).await?;
    afterglow_tests::post_all(&format!("{}/v1/events/logs", served.server.url), bodies).await?;
    served.queue.idle().await;
    Ok(served)
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
    // 100 pieces of 1 000 bytes, ten 100-byte lines each, each shipped as a request.
    let piece = format!("{}\n", "y".repeat(99)).repeat(10);
    for at in 0..100_u64 {
        put(&*storage, &file, at * 1_000, piece.as_bytes()).await?;
    }
    let recorder = Arc::new(RecordsGets::new(Arc::clone(&storage)));
    let cache = tempfile::tempdir()?;
    let mut settings = QuerySettings::under(cache.path());
    settings.response_bytes = 2_500;
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
    let whole = piece.repeat(100);
    ensure!(
        tail.bytes == whole.as_bytes()[whole.len() - 2_500..] && !tail.complete,
        "{} bytes, complete: {}",
        tail.bytes.len(),
        tail.complete
    );
    // The index, and the last three pieces, which hold the response: nothing before them is
    // fetched, and nothing is listed.
    let (gets, ranges) = (recorder.gets(), recorder.ranges());
    ensure!(
        gets.len() == 1 && gets[0].ends_with("index.json"),
        "{gets:?}"
    );
    ensure!(
        ranges.len() == 3,
        "{} extents fetched: {ranges:?}",
        ranges.len()
    );
    ensure!(recorder.lists() == 0, "the tail listed");
    Ok(())
}

/// Ray 2.60 exports no `RUNNING` event for many short tasks, and with it no `taskLogInfo`: in
/// the captured run, every attempt on the busiest worker is made so. Its file holds each
/// attempt's own line after the marker Ray's worker writes before each task, in the order Ray
/// submitted them to the worker; each attempt's output is its own line alone.
#[tokio::test]
async fn attempts_without_offsets_get_only_their_own_lines() -> anyhow::Result<()> {
    use base64::Engine as _;
    let run = afterglow_tests::FixtureRun::named("basic-workload")?;
    let bodies = afterglow_tests::bodies(&run)?;
    let decode = |value: Option<&serde_json::Value>| -> anyhow::Result<String> {
        let text = value.and_then(serde_json::Value::as_str).context("an id")?;
        Ok(base64::engine::general_purpose::STANDARD
            .decode(text)?
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect())
    };
    // Each attempt's worker, job and submission time, and each definition's task name.
    let mut workers: std::collections::HashMap<(String, u64), String> = Default::default();
    let mut jobs: std::collections::HashMap<(String, u64), String> = Default::default();
    let mut submitted: std::collections::HashMap<(String, u64), String> = Default::default();
    let mut names: std::collections::HashMap<(String, u64), String> = Default::default();
    for body in &bodies {
        let events: Vec<serde_json::Value> = serde_json::from_slice(body)?;
        for event in &events {
            if let Some(definition) = event.get("taskDefinitionEvent") {
                let attempt = (
                    decode(definition.get("taskId"))?,
                    definition["taskAttempt"].as_u64().unwrap_or(0),
                );
                if let Some(name) = definition["taskName"].as_str() {
                    names.insert(attempt, name.to_owned());
                }
            }
            let Some(lifecycle) = event.get("taskLifecycleEvent") else {
                continue;
            };
            let attempt = (
                decode(lifecycle.get("taskId"))?,
                lifecycle["taskAttempt"].as_u64().unwrap_or(0),
            );
            // Ray sends an empty id before a worker is known.
            if lifecycle["workerId"]
                .as_str()
                .is_some_and(|id| !id.is_empty())
            {
                workers.insert(attempt.clone(), decode(lifecycle.get("workerId"))?);
                jobs.insert(attempt.clone(), decode(lifecycle.get("jobId"))?);
            }
            for transition in lifecycle["stateTransitions"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if transition["state"] == "SUBMITTED_TO_WORKER" {
                    let at = transition["timestamp"].as_str().context("timestamp")?;
                    // RFC 3339 with up to nine digits of fraction: padded, they sort as times.
                    let (seconds, fraction) =
                        at.trim_end_matches('Z').split_once('.').unwrap_or((at, ""));
                    submitted.insert(attempt.clone(), format!("{seconds}.{fraction:0<9}"));
                }
            }
        }
    }
    let mut by_worker: std::collections::HashMap<&str, Vec<&(String, u64)>> = Default::default();
    for (attempt, worker) in &workers {
        by_worker.entry(worker.as_str()).or_default().push(attempt);
    }
    let (worker, mut ran) = by_worker
        .into_iter()
        .max_by_key(|(worker, attempts)| (attempts.len(), *worker))
        .context("no worker")?;
    ensure!(
        ran.len() >= 10,
        "the busiest worker ran {} attempts",
        ran.len()
    );
    ran.sort_by_key(|attempt| (submitted.get(*attempt).cloned(), (*attempt).clone()));

    // Ray reported no offsets for any of them.
    let mut stripped = Vec::new();
    for body in &bodies {
        let mut events: Vec<serde_json::Value> = serde_json::from_slice(body)?;
        for event in &mut events {
            let Some(lifecycle) = event.get_mut("taskLifecycleEvent") else {
                continue;
            };
            let attempt = (
                decode(lifecycle.get("taskId"))?,
                lifecycle["taskAttempt"].as_u64().unwrap_or(0),
            );
            if ran.contains(&&attempt)
                && let Some(lifecycle) = lifecycle.as_object_mut()
            {
                lifecycle.remove("taskLogInfo");
            }
        }
        stripped.push(serde_json::to_vec(&events)?);
    }
    let served = serving(&stripped).await?;
    let (first_task, _) = ran.first().context("an attempt")?;
    let detail: serde_json::Value =
        reqwest::get(format!("{}/api/tasks/{first_task}", served.server.url))
            .await?
            .json()
            .await?;
    let attempt = &detail["attempts"][0];

    let mut written = String::new();
    let mut job = None;
    for attempt in &ran {
        let (task_id, number) = attempt;
        if job != jobs.get(*attempt) {
            job = jobs.get(*attempt);
            written.push_str(&format!(":job_id:{}\n", job.context("a job")?));
        }
        let name = names
            .get(*attempt)
            .with_context(|| format!("no task name for {attempt:?} among {}", names.len()))?;
        written.push_str(&format!(
            ":task_name:{name}\noutput of {task_id} attempt {number}\n"
        ));
    }
    let file = LogFile {
        cluster: ClusterName::new("logs")?,
        session: SessionName::new(attempt["session_name"].as_str().context("session")?)?,
        node_id: NodeId::new(attempt["node_id"].as_str().context("node_id")?)?,
        file: LogFileName::new(&format!("worker-{worker}-ffffffff-4242.out"))?,
    };
    put(&*served.storage, &file, 0, written.as_bytes()).await?;

    for (task_id, number) in &ran {
        let response = reqwest::get(format!(
            "{}/api/tasks/{task_id}/logs?attempt={number}",
            served.server.url
        ))
        .await?;
        let status = response.status().as_u16();
        let range = response
            .headers()
            .get("x-afterglow-log-range")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let said = response.text().await?;
        ensure!(
            status == 200
                && range.as_deref() == Some("inferred")
                && said == format!("output of {task_id} attempt {number}\n"),
            "{task_id} attempt {number}: {status} {range:?} {:?}",
            said.chars().take(300).collect::<String>()
        );
    }
    Ok(())
}
