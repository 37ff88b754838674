//! `POST /v1/logs/{cluster}` through `serve`: the token, the place and the size it checks, and
//! the shipper sending a Ray session folder and waiting out an outage.

use std::sync::Arc;

use afterglow::ship_logs::HttpSink;
use afterglow_tests::{TestServer, cluster_token, ingest_keys, local_storage, open_settings};
use anyhow::{Context as _, ensure};
use shared::keys::LogFileName;
use shared::logs::read::read_range;
use shared::logs::ship::{ShipError, ShipSettings, Shipper};
use shared::logs::store::{MAX_BODY_BYTES, PieceOutcome};
use shared::storage::Storage;

use super::{ALL, SESSION, log_file, node_id};

const SECRET: &str = "logs-test-secret-0123456789";

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
