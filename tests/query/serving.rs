//! The API as `serve` serves it over HTTP: bearer tokens, a replayed run visible within the
//! target's two seconds, the dashboard page and its assets beside the API, and answers gzipped
//! for clients that take gzip.

use std::sync::Arc;
use std::time::{Duration, Instant};

use afterglow::serve::ServeSettings;
use afterglow_tests::api::{Api, serve_locally};
use afterglow_tests::{
    FixtureRun, TestServer, bodies, fetch_encoded, local_storage, post_all, serve_runs_locally,
    serving_settings,
};
use anyhow::ensure;
use serde_json::Value as Json;
use shared::auth::AccessToken;

/// With a query token set, the API refuses a request without it (401) or with another (403),
/// and answers one that carries it.
#[tokio::test]
async fn bearer_mode_refuses_requests_without_the_token() -> anyhow::Result<()> {
    const QUERY_TOKEN: &str = "query-token-0123456789";
    let run = FixtureRun::named("edge-cases")?;
    let served = serve_runs_locally(std::slice::from_ref(&run), |settings| {
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
    served.server.stop().await
}

/// A batch is visible in `serve` within 2 s of its POST (docs/performance.md, "Targets").
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
    let served = serve_runs_locally(std::slice::from_ref(&run), Ok).await?;
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
    served.server.stop().await
}
