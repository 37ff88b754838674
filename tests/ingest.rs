//! Ingest: Ray's captured POST bodies replayed over HTTP (through `serve`'s router and through
//! the Lambda adapter), read back from storage byte for byte, every kind of bad request, and
//! the bounds on the sessions a cluster's bodies may start.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use afterglow::http::router;
use afterglow::serve::ServeSettings;
use afterglow::state::AppState;
use afterglow_tests::{
    FixtureRun, TestServer, cluster_token, ingest_keys, local_storage, open_settings, raw_events,
    stored_raw_lines,
};
use anyhow::{Context as _, ensure};
use shared::ingest::{
    IngestAccess, IngestError, IngestLimits, Ingestor, MAX_SESSIONS_PER_BODY,
    NEW_SESSIONS_VARIABLE, RAY_BATCH_SIZE_VARIABLE,
};
use shared::keys::ClusterName;
use shared::storage::{LocalDirStorage, S3Storage, Storage};
use tower::ServiceExt as _;

const SECRET: &str = "test-secret-0123456789abcdef";

fn counts(lines: impl IntoIterator<Item = String>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in lines {
        *counts.entry(line).or_insert(0) += 1;
    }
    counts
}

async fn post(url: &str, body: impl Into<reqwest::Body>) -> anyhow::Result<(u16, String)> {
    let (status, _, text) = post_retry_after(url, body).await?;
    Ok((status, text))
}

/// Every request of every captured run, in arrival order and including the deliveries Ray
/// retried, is answered 200, and storage then holds exactly those events, each line equal to
/// the event's text in the body Ray sent.
async fn replayed_fixture_bodies_are_stored_verbatim(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let server = TestServer::start(open_settings(Arc::clone(&storage))).await?;
    for run in FixtureRun::all()? {
        let mut sent = Vec::new();
        for request in run.requests()? {
            let (status, text) = post(
                &format!("{}/v1/events/{}", server.url, run.name),
                request.body.clone(),
            )
            .await?;
            ensure!(
                status == 200,
                "{} #{}: {status} {text}",
                run.name,
                request.seq
            );
            sent.extend(raw_events(&request.body)?);
        }
        let stored = stored_raw_lines(&*storage, &format!("raw/{}/", run.name)).await?;
        ensure!(
            counts(stored.clone()) == counts(sent.clone()),
            "{}: stored {} lines, sent {} events; they differ",
            run.name,
            stored.len(),
            sent.len()
        );
    }
    server.stop().await
}

/// A batch of events Afterglow cannot read (unknown types, missing fields) is Ray traffic all
/// the same: stored, not refused, since Ray would re-send a refused batch forever.
async fn unknown_and_malformed_events_are_stored_not_refused(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let server = TestServer::start(open_settings(Arc::clone(&storage))).await?;
    let body = r#"[{"eventType": "FROM_THE_FUTURE_EVENT", "x": 1}, {"eventType": "TASK_LIFECYCLE_EVENT"}, 42, "text"]"#;
    let (status, text) = post(&format!("{}/v1/events/odd", server.url), body).await?;
    ensure!(status == 200, "{status} {text}");
    let stored = stored_raw_lines(&*storage, "raw/odd/").await?;
    ensure!(stored == raw_events(body.as_bytes())?, "stored {stored:?}");
    server.stop().await
}

afterglow_tests::for_each_backend!(
    replayed_fixture_bodies_are_stored_verbatim,
    unknown_and_malformed_events_are_stored_not_refused,
);

/// A server over a fresh local directory: `configure` adjusts the open default settings. The
/// directory lives as long as the returned guard.
async fn local_server(
    configure: impl FnOnce(ServeSettings) -> anyhow::Result<ServeSettings>,
) -> anyhow::Result<(tempfile::TempDir, Arc<dyn Storage>, TestServer)> {
    let (guard, storage) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(storage);
    let server = TestServer::start(configure(open_settings(Arc::clone(&storage)))?).await?;
    Ok((guard, storage, server))
}

fn with_token(settings: ServeSettings) -> anyhow::Result<ServeSettings> {
    Ok(ServeSettings {
        ingest_keys: Some(ingest_keys(SECRET)?),
        ..settings
    })
}

async fn body_of(run: &str) -> anyhow::Result<Vec<u8>> {
    Ok(FixtureRun::named(run)?
        .requests()?
        .into_iter()
        .next()
        .context("no requests")?
        .body)
}

#[tokio::test]
async fn missing_token_answers_401_and_stores_nothing() -> anyhow::Result<()> {
    let (_guard, storage, server) = local_server(with_token).await?;
    let (status, text) = post(
        &format!("{}/v1/events/c", server.url),
        body_of("basic-workload").await?,
    )
    .await?;
    ensure!(status == 401, "{status} {text}");
    ensure!(text.contains("token"), "{text}");
    ensure!(storage.list("raw/").await?.is_empty());
    server.stop().await
}

#[tokio::test]
async fn wrong_token_answers_403_and_stores_nothing() -> anyhow::Result<()> {
    let (_guard, storage, server) = local_server(with_token).await?;
    let token = cluster_token(SECRET, "c");
    // A near miss, the secret itself, and another cluster's token (a leaked export URL of
    // cluster `d` must not write `c`'s history).
    let mut near_miss = token.clone();
    near_miss.replace_range(63.., if token.ends_with('0') { "1" } else { "0" });
    for wrong in [near_miss, SECRET.to_owned(), cluster_token(SECRET, "d")] {
        let url = format!("{}/v1/events/c?token={wrong}", server.url);
        let (status, text) = post(&url, body_of("basic-workload").await?).await?;
        ensure!(status == 403, "{status} {text}");
        ensure!(
            !text.contains(&token) && !text.contains(SECRET),
            "the answer must not echo a secret: {text}"
        );
    }
    ensure!(storage.list("raw/").await?.is_empty());
    let (status, _) = post(
        &format!("{}/v1/events/c?token={token}", server.url),
        body_of("basic-workload").await?,
    )
    .await?;
    ensure!(status == 200, "the right token must work: {status}");
    ensure!(storage.list("raw/c/").await?.len() == 1);
    server.stop().await
}

#[tokio::test]
async fn bodies_that_are_not_json_arrays_answer_400_and_store_nothing() -> anyhow::Result<()> {
    let (_guard, storage, server) = local_server(Ok).await?;
    for body in [
        "",
        "not json",
        r#"{"eventType": "TASK_LIFECYCLE_EVENT"}"#,
        r#"[{"truncated": "#,
        "[1, 2] trailing",
    ] {
        let (status, text) = post(&format!("{}/v1/events/c", server.url), body).await?;
        ensure!(status == 400, "{body:?}: {status} {text}");
        ensure!(
            text.contains("not a JSON array of Ray events"),
            "{body:?}: {text}"
        );
    }
    ensure!(storage.list("raw/").await?.is_empty());
    server.stop().await
}

/// Ingest only checks the outer array, without recursion, so nesting cannot exhaust the stack;
/// the body limit bounds memory. Such an event is stored for compaction to quarantine.
#[tokio::test]
async fn deeply_nested_events_are_stored_without_recursion() -> anyhow::Result<()> {
    let (_guard, storage, server) = local_server(Ok).await?;
    let depth = 1_000_000;
    let event = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let (status, text) = post(
        &format!("{}/v1/events/deep", server.url),
        format!("[{event}]"),
    )
    .await?;
    ensure!(status == 200, "{status} {text}");
    ensure!(stored_raw_lines(&*storage, "raw/deep/").await? == [event]);
    server.stop().await
}

/// A body past its byte limit is refused with a 413 that names the Ray variable bounding a
/// batch, and nothing is stored.
#[tokio::test]
async fn oversized_bodies_answer_413_naming_the_ray_variable() -> anyhow::Result<()> {
    let body = body_of("basic-workload").await?;
    let limits = IngestLimits {
        max_body_bytes: body.len() - 1,
        max_events: 10_000,
        ..IngestLimits::default()
    };
    ensure_too_large(body, limits).await
}

/// A body past its event limit is refused the same way.
#[tokio::test]
async fn batches_with_too_many_events_answer_413_naming_the_ray_variable() -> anyhow::Result<()> {
    let body = body_of("basic-workload").await?;
    let events = raw_events(&body)?.len();
    ensure!(events > 1, "need a multi-event body");
    let limits = IngestLimits {
        max_body_bytes: 5 * 1024 * 1024,
        max_events: events - 1,
        ..IngestLimits::default()
    };
    ensure_too_large(body, limits).await
}

/// Posts `body` to a server with ingest `limits` and insists on a 413 naming
/// [`RAY_BATCH_SIZE_VARIABLE`], with nothing stored.
async fn ensure_too_large(body: Vec<u8>, limits: IngestLimits) -> anyhow::Result<()> {
    let (_guard, storage, server) = local_server(|settings| {
        Ok(ServeSettings {
            ingest_limits: limits,
            ..settings
        })
    })
    .await?;
    let (status, text) = post(&format!("{}/v1/events/c", server.url), body).await?;
    ensure!(status == 413, "{status} {text}");
    ensure!(text.contains(RAY_BATCH_SIZE_VARIABLE), "{text}");
    ensure!(storage.list("raw/").await?.is_empty());
    server.stop().await
}

/// Events of `run`'s bodies with their sessions renamed to `sessions` in turn, in the key form
/// the run uses: what a token holder fanning out over made-up sessions sends.
fn body_with_sessions(run: &str, sessions: &[String]) -> anyhow::Result<Vec<u8>> {
    let mut events = Vec::new();
    for request in FixtureRun::named(run)?.requests()? {
        events.extend(serde_json::from_slice::<Vec<serde_json::Value>>(
            &request.body,
        )?);
    }
    events.truncate(sessions.len().max(20));
    ensure!(events.len() >= sessions.len(), "{run} has too few events");
    for (event, session) in events.iter_mut().zip(sessions.iter().cycle()) {
        let event = event.as_object_mut().context("an event is a JSON object")?;
        let key = if event.contains_key("session_name") {
            "session_name"
        } else {
            "sessionName"
        };
        event.insert(key.to_owned(), serde_json::Value::String(session.clone()));
    }
    Ok(serde_json::to_vec(&events)?)
}

/// `count` session names in Ray's form, told apart by `tag`.
fn session_names(tag: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|index| format!("session_2026-11-22_06-11-29_{index:06}_{tag}"))
        .collect()
}

/// A POST of a JSON body: its status, `Retry-After` header and text.
async fn post_retry_after(
    url: &str,
    body: impl Into<reqwest::Body>,
) -> anyhow::Result<(u16, Option<String>, String)> {
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str())
        .transpose()?
        .map(str::to_owned);
    Ok((status, retry_after, response.text().await?))
}

/// Ray's aggregator sends the events of one session per body. A body naming more sessions than
/// [`MAX_SESSIONS_PER_BODY`] (each would become a manifest, a catalog entry and a quiet check)
/// is refused with a 400 in either key form and nothing of it is stored; Ray's own bodies, and
/// bodies within the bound, pass.
#[tokio::test]
async fn a_body_of_more_sessions_than_ray_sends_answers_400_and_stores_nothing()
-> anyhow::Result<()> {
    let (_guard, storage, server) = local_server(Ok).await?;
    let url = format!("{}/v1/events/c", server.url);
    let fan_out = session_names("fan", MAX_SESSIONS_PER_BODY + 1);
    for run in ["basic-workload", "snake-case-keys"] {
        let (status, text) = post(&url, body_with_sessions(run, &fan_out)?).await?;
        ensure!(status == 400, "{run}: {status} {text}");
        ensure!(text.contains("one session per request"), "{run}: {text}");
    }
    ensure!(storage.list("raw/").await?.is_empty());
    for run in ["basic-workload", "snake-case-keys"] {
        let (status, text) = post(&url, body_of(run).await?).await?;
        ensure!(status == 200, "{run}: {status} {text}");
    }
    let few = session_names("few", MAX_SESSIONS_PER_BODY);
    let (status, text) = post(&url, body_with_sessions("basic-workload", &few)?).await?;
    ensure!(status == 200, "{} sessions: {status} {text}", few.len());
    ensure!(storage.list("raw/c/").await?.len() == 3);
    server.stop().await
}

/// A cluster starting sessions faster than its budget (a token holder fanning out over made-up
/// session names, one body after another) is answered 429, naming the bound and its variable,
/// with a `Retry-After`; a refused body is stored in no part, even beside a session already
/// seen. The cluster's sessions already seen are still accepted, and other clusters are
/// admitted and stored as if nothing happened.
#[tokio::test]
async fn a_cluster_starting_sessions_too_fast_answers_429_and_other_clusters_are_admitted()
-> anyhow::Result<()> {
    let budget = 3;
    let (_guard, storage, server) = local_server(|settings| {
        Ok(ServeSettings {
            ingest_limits: IngestLimits {
                new_sessions_per_minute: budget,
                ..IngestLimits::default()
            },
            ..settings
        })
    })
    .await?;
    let flood = format!("{}/v1/events/flood", server.url);
    let sessions = session_names("flood", budget + 2);
    for session in sessions.iter().take(budget) {
        let body = body_with_sessions("basic-workload", std::slice::from_ref(session))?;
        let (status, text) = post(&flood, body).await?;
        ensure!(status == 200, "{session}: {status} {text}");
    }
    for refused in [
        vec![sessions[budget].clone()],
        vec![sessions[0].clone(), sessions[budget + 1].clone()],
    ] {
        let body = body_with_sessions("basic-workload", &refused)?;
        let (status, retry_after, text) = post_retry_after(&flood, body).await?;
        ensure!(status == 429, "{refused:?}: {status} {text}");
        ensure!(
            text.contains(NEW_SESSIONS_VARIABLE) && text.contains(&format!("limit of {budget}")),
            "{text}"
        );
        let seconds: u64 = retry_after.context("no Retry-After")?.parse()?;
        ensure!((1..=60).contains(&seconds), "Retry-After: {seconds}");
    }
    let seen = body_with_sessions("basic-workload", &sessions[..1])?;
    let (status, text) = post(&flood, seen).await?;
    ensure!(status == 200, "a session already seen: {status} {text}");
    let stored = storage.list("raw/flood/").await?.len();
    ensure!(
        stored == budget + 1,
        "{stored} objects stored for the flooding cluster"
    );

    for other in ["calm-a", "calm-b"] {
        let url = format!("{}/v1/events/{other}", server.url);
        let (status, text) = post(&url, body_of("basic-workload").await?).await?;
        ensure!(status == 200, "{other}: {status} {text}");
        ensure!(storage.list(&format!("raw/{other}/")).await?.len() == 1);
    }
    server.stop().await
}

/// The budget counts a rolling minute: once a minute has passed since a cluster's earlier
/// admissions, new sessions are admitted again. The clock is the test's.
#[tokio::test]
async fn the_new_session_budget_refills_as_the_minute_rolls() -> anyhow::Result<()> {
    let (_guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    let limits = IngestLimits {
        new_sessions_per_minute: 2,
        ..IngestLimits::default()
    };
    let ingestor = Ingestor::new(Arc::clone(&storage), IngestAccess::Open, limits);
    let cluster = ClusterName::new("flood")?;
    let sessions = session_names("minute", 4);
    let body = |index: usize| body_with_sessions("edge-cases", &sessions[index..=index]);
    let start = Instant::now();
    let at = |seconds: u64| {
        start
            .checked_add(Duration::from_secs(seconds))
            .context("instant overflow")
    };

    ingestor.ingest_at(&cluster, &body(0)?, at(0)?).await?;
    ingestor.ingest_at(&cluster, &body(1)?, at(30)?).await?;
    match ingestor.ingest_at(&cluster, &body(2)?, at(59)?).await {
        Err(IngestError::SessionFlood {
            new_sessions: 1,
            limit: 2,
            retry_after_secs: 1,
        }) => {}
        other => anyhow::bail!("a third session within the minute: {other:?}"),
    }
    // The first admission has left the window; the second has not.
    ingestor.ingest_at(&cluster, &body(2)?, at(60)?).await?;
    let early = ingestor.ingest_at(&cluster, &body(3)?, at(89)?).await;
    ensure!(
        matches!(early, Err(IngestError::SessionFlood { .. })),
        "{early:?}"
    );
    ingestor.ingest_at(&cluster, &body(3)?, at(90)?).await?;
    ensure!(storage.list("raw/flood/").await?.len() == 4);
    Ok(())
}

#[tokio::test]
async fn an_empty_batch_is_accepted_and_stores_nothing() -> anyhow::Result<()> {
    let (_guard, storage, server) = local_server(Ok).await?;
    let (status, text) = post(&format!("{}/v1/events/c", server.url), "[]").await?;
    ensure!(status == 200, "{status} {text}");
    ensure!(storage.list("raw/").await?.is_empty());
    server.stop().await
}

#[tokio::test]
async fn invalid_cluster_names_answer_400() -> anyhow::Result<()> {
    let (_guard, storage, server) = local_server(Ok).await?;
    for cluster in [".hidden", "a%20b", &"x".repeat(65)] {
        let url = format!("{}/v1/events/{cluster}", server.url);
        let (status, text) = post(&url, body_of("edge-cases").await?).await?;
        ensure!(status == 400, "{cluster}: {status} {text}");
        ensure!(text.contains("invalid cluster name"), "{text}");
    }
    ensure!(storage.list("raw/").await?.is_empty());
    server.stop().await
}

/// A local directory whose staging area has been replaced by a file: every write really fails.
#[tokio::test]
async fn a_failing_local_disk_answers_503_so_ray_retries() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let storage = LocalDirStorage::open(dir.path())?;
    std::fs::remove_dir(dir.path().join("~staging"))?;
    std::fs::write(dir.path().join("~staging"), b"not a directory")?;
    let server = TestServer::start(open_settings(Arc::new(storage))).await?;
    let (status, text) = post(
        &format!("{}/v1/events/c", server.url),
        body_of("edge-cases").await?,
    )
    .await?;
    ensure!(status == 503, "{status} {text}");
    ensure!(text.contains("storage failed"), "{text}");
    server.stop().await
}

/// An S3 endpoint that refuses connections: the SDK's real error path, answered 503.
#[tokio::test]
async fn an_unreachable_s3_answers_503_so_ray_retries() -> anyhow::Result<()> {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?;
    let endpoint = format!("http://{}", closed.local_addr()?);
    drop(closed);
    let storage = S3Storage::connect(shared::storage::S3Settings {
        bucket: "afterglow-test".into(),
        prefix: String::new(),
        endpoint_url: Some(endpoint),
        force_path_style: true,
        operation_timeout: Some(Duration::from_secs(2)),
        stall_timeout: shared::storage::S3Settings::DEFAULT_STALL_TIMEOUT,
    })
    .await;
    let server = TestServer::start(open_settings(Arc::new(storage))).await?;
    let (status, text) = post(
        &format!("{}/v1/events/c", server.url),
        body_of("edge-cases").await?,
    )
    .await?;
    ensure!(status == 503, "{status} {text}");
    server.stop().await
}

/// An API Gateway HTTP API (payload v2) event, as Lambda delivers it, through the same router.
fn api_gateway_event(cluster: &str, token: &str, body: &[u8], base64: bool) -> String {
    use std::fmt::Write as _;
    let encoded = if base64 {
        let mut out = String::new();
        // A tiny base64 encoder keeps the test independent of the code under test.
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for chunk in body.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (16 - 8 * i)));
            for i in 0..4 {
                if i <= chunk.len() {
                    let index = usize::try_from((n >> (18 - 6 * i)) & 63).unwrap_or(0);
                    out.push(char::from(ALPHABET[index]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    } else {
        String::from_utf8_lossy(body).into_owned()
    };
    let headers = serde_json::json!({"content-type": "application/json",
        "user-agent": "Python/3.11 aiohttp/3.14.5"});
    let mut event = afterglow_tests::api::api_gateway_event(
        "POST",
        "POST /v1/events/{cluster}",
        &format!("/v1/events/{cluster}"),
        &format!("token={token}"),
        headers,
        "lambda-request-1",
    );
    event["pathParameters"] = serde_json::json!({ "cluster": cluster });
    event["isBase64Encoded"] = serde_json::Value::Bool(base64);
    event["body"] = serde_json::Value::String(encoded);
    let mut text = String::new();
    let _ = write!(text, "{event}");
    text
}

#[tokio::test]
async fn lambda_api_gateway_v2_events_are_ingested() -> anyhow::Result<()> {
    let (_guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    let state = Arc::new(AppState {
        ingestor: Some(Ingestor::new(
            Arc::clone(&storage),
            IngestAccess::Keys(ingest_keys(SECRET)?),
            IngestLimits::default(),
        )),
        ..AppState::default()
    });
    let run = FixtureRun::named("snake-case-keys")?;
    let mut sent = Vec::new();
    for (index, request) in run.requests()?.into_iter().enumerate() {
        let token = cluster_token(SECRET, "lambda-run");
        let event = api_gateway_event("lambda-run", &token, &request.body, index % 2 == 1);
        let http_request = lambda_http::request::from_str(&event)?;
        let response = router(Arc::clone(&state)).oneshot(http_request).await?;
        ensure!(
            response.status() == 200,
            "request {}: {}",
            request.seq,
            response.status()
        );
        sent.extend(raw_events(&request.body)?);
    }
    let event = api_gateway_event("lambda-run", "wrong-token-0123456789", b"[]", false);
    let response = router(Arc::clone(&state))
        .oneshot(lambda_http::request::from_str(&event)?)
        .await?;
    ensure!(
        response.status() == 403,
        "wrong token: {}",
        response.status()
    );

    let stored = stored_raw_lines(&*storage, "raw/lambda-run/").await?;
    ensure!(
        counts(stored) == counts(sent),
        "stored events differ from the posted ones"
    );
    Ok(())
}

/// `serve` on loopback answers only requests addressed to a loopback name: a web page that
/// rebinds its own DNS name to 127.0.0.1 (DNS rebinding) sends its own name as `Host`, so it
/// can neither write events nor read history through the open loopback API.
#[tokio::test]
async fn loopback_serve_refuses_requests_addressed_to_other_hosts() -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let (_guard, storage) = local_storage()?;
    let server = TestServer::start(open_settings(Arc::new(storage))).await?;
    let address = server.url.trim_start_matches("http://").to_owned();
    let port = address.rsplit(':').next().unwrap_or_default().to_owned();
    let cases = [
        ("evil.example".to_owned(), 403),
        (format!("evil.example:{port}"), 403),
        (address.clone(), 200),
        (format!("localhost:{port}"), 200),
    ];
    for (host, expected) in cases {
        let mut stream = tokio::net::TcpStream::connect(&address).await?;
        let request = format!(
            "POST /v1/events/c HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
             Content-Length: 2\r\nConnection: close\r\n\r\n[]"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        let status: u16 = answer
            .split_whitespace()
            .nth(1)
            .context("no status line")?
            .parse()?;
        ensure!(
            status == expected,
            "Host {host}: {status}, expected {expected}\n{answer}"
        );
    }
    server.stop().await
}
