//! `afterglow proxy` in front of an upstream that records what it receives: IAM requests carry
//! a SigV4 signature that an independent implementation of AWS's algorithm (below, from the
//! published specification) accepts for exactly the request that arrived, made with credentials
//! asked of the provider once while they are valid; bearer requests carry the token; answers,
//! 404s included, come back unchanged.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use afterglow::proxy::{CREDENTIALS_REFRESH_MARGIN, Proxy, Upstream, region_of};
use afterglow_tests::api::percent_encoded;
use anyhow::{Context as _, ensure};
use aws_credential_types::Credentials;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider, future};
use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use shared::auth::AccessToken;

/// One request as the upstream saw it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    query: String,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

/// An upstream on 127.0.0.1 that records each request and answers JSON (404 under `/static/`).
async fn recording_upstream() -> anyhow::Result<(String, Arc<Mutex<Vec<Seen>>>)> {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let record = Arc::clone(&seen);
    let app = Router::new().fallback(move |request: Request| {
        let record = Arc::clone(&record);
        async move {
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, usize::MAX)
                .await
                .unwrap_or_default();
            let headers = parts
                .headers
                .iter()
                .map(|(name, value)| {
                    (
                        name.as_str().to_owned(),
                        value.to_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect();
            if let Ok(mut list) = record.lock() {
                list.push(Seen {
                    method: parts.method.to_string(),
                    path: parts.uri.path().to_owned(),
                    query: parts.uri.query().unwrap_or_default().to_owned(),
                    headers,
                    body: body.to_vec(),
                });
            }
            if parts.uri.path().contains("/static/") {
                return StatusCode::NOT_FOUND.into_response();
            }
            (
                [
                    ("content-type", "application/json"),
                    ("x-afterglow-log-complete", "false"),
                    ("x-afterglow-log-range", "inferred"),
                ],
                r#"{"result": true}"#,
            )
                .into_response()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, seen))
}

/// The proxy on 127.0.0.1, in front of `upstream`.
async fn proxy(upstream_url: &str, upstream: Upstream) -> anyhow::Result<String> {
    let router = Proxy::new(upstream_url, upstream)?.router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(url)
}

/// The secret key of every [`CountingProvider`]'s credentials.
const COUNTED_SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";

/// A credential provider that counts its calls: call `n` gives access key `AKIDn` and session
/// token `session-n`, valid for `lifetime` from then.
#[derive(Debug)]
struct CountingProvider {
    calls: Arc<AtomicUsize>,
    lifetime: Duration,
}

impl ProvideCredentials for CountingProvider {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        future::ProvideCredentials::ready(Ok(Credentials::new(
            format!("AKID{call}"),
            COUNTED_SECRET,
            Some(format!("session-{call}")),
            Some(SystemTime::now() + self.lifetime),
            "counting",
        )))
    }
}

/// `requests` GETs, one after another, through an IAM proxy whose credentials come from a
/// [`CountingProvider`] with `lifetime`: how many times the provider was asked, and the requests
/// the upstream received, in order.
async fn through_counting_proxy(
    lifetime: Duration,
    requests: usize,
) -> anyhow::Result<(usize, Vec<Seen>)> {
    let (upstream_url, seen) = recording_upstream().await?;
    let calls = Arc::new(AtomicUsize::new(0));
    let provider = CountingProvider {
        calls: Arc::clone(&calls),
        lifetime,
    };
    let url = proxy(
        &upstream_url,
        Upstream::Iam {
            region: "eu-west-1".into(),
            credentials: SharedCredentialsProvider::new(provider),
        },
    )
    .await?;
    let client = reqwest::Client::new();
    for _ in 0..requests {
        let answer = client
            .get(format!("{url}/api/summary?cluster=x"))
            .send()
            .await?;
        ensure!(answer.status() == 200, "{}", answer.status());
    }
    let seen = seen
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    ensure!(seen.len() == requests, "{seen:?}");
    Ok((calls.load(Ordering::SeqCst), seen))
}

/// Checks that `request` was signed with call `call`'s credentials of a [`CountingProvider`].
fn signed_by_call(request: &Seen, call: usize) -> anyhow::Result<()> {
    let authorization = request
        .headers
        .get("authorization")
        .context("no Authorization header")?;
    ensure!(
        authorization.starts_with(&format!("AWS4-HMAC-SHA256 Credential=AKID{call}/")),
        "{authorization}"
    );
    ensure!(
        request.headers.get("x-amz-security-token") == Some(&format!("session-{call}")),
        "{:?}",
        request.headers
    );
    let (expected, sent) = expected_signature(request, COUNTED_SECRET)?;
    ensure!(
        expected == sent,
        "signature {sent}, AWS would compute {expected}"
    );
    Ok(())
}

fn hmac(key: &[u8], data: &str) -> anyhow::Result<Vec<u8>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).context("HMAC key")?;
    mac.update(data.as_bytes());
    Ok(mac.finalize().into_bytes().to_vec())
}

fn hex_sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("x={text}").as_bytes())
        .next()
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default()
}

/// The signature AWS computes for `seen` (Signature Version 4, as published), with the
/// signed headers and scope the request names.
fn expected_signature(seen: &Seen, secret: &str) -> anyhow::Result<(String, String)> {
    let authorization = seen
        .headers
        .get("authorization")
        .context("no Authorization header")?;
    let rest = authorization
        .strip_prefix("AWS4-HMAC-SHA256 Credential=")
        .context("not SigV4")?;
    let (credential, rest) = rest
        .split_once(", SignedHeaders=")
        .context("SignedHeaders")?;
    let (signed_headers, signature) = rest.split_once(", Signature=").context("Signature")?;
    let scope = credential.split_once('/').context("scope")?.1;
    let mut pairs: Vec<(String, String)> = seen
        .query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (
                percent_encoded(&decode(key)),
                percent_encoded(&decode(value)),
            )
        })
        .collect();
    pairs.sort();
    let query: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let headers: Vec<String> = signed_headers
        .split(';')
        .map(|name| {
            let value = seen.headers.get(name).map_or("", |value| value.trim());
            format!("{name}:{value}\n")
        })
        .collect();
    let canonical = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        seen.method,
        seen.path,
        query.join("&"),
        headers.concat(),
        signed_headers,
        hex_sha256(&seen.body)
    );
    let amz_date = seen.headers.get("x-amz-date").context("x-amz-date")?;
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex_sha256(canonical.as_bytes())
    );
    let mut parts = scope.split('/');
    let (date, region, service) = (
        parts.next().context("date")?,
        parts.next().context("region")?,
        parts.next().context("service")?,
    );
    let key = hmac(format!("AWS4{secret}").as_bytes(), date)?;
    let key = hmac(&key, region)?;
    let key = hmac(&key, service)?;
    let key = hmac(&key, "aws4_request")?;
    Ok((
        hex::encode(hmac(&key, &string_to_sign)?),
        signature.to_owned(),
    ))
}

#[tokio::test]
async fn iam_requests_carry_a_signature_aws_would_accept() -> anyhow::Result<()> {
    let (upstream_url, seen) = recording_upstream().await?;
    let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    let credentials = Credentials::new("AKIDEXAMPLE", secret, None, None, "test");
    let url = proxy(
        &upstream_url,
        Upstream::Iam {
            region: "eu-west-1".into(),
            credentials: SharedCredentialsProvider::new(credentials),
        },
    )
    .await?;
    let client = reqwest::Client::new();
    // What `ray list tasks --filter state=FAILED` sends, and a POST with a body.
    let get = client
        .get(format!(
            "{url}/ray/prod/latest/api/v0/tasks?limit=100&detail=True&filter_keys=state\
             &filter_predicates=%3D&filter_values=FAILED&filter_keys=name&filter_predicates=%21%3D\
             &filter_values=a%20b"
        ))
        .send()
        .await?;
    ensure!(get.status() == 200);
    ensure!(get.text().await? == r#"{"result": true}"#);
    let post = client
        .post(format!("{url}/ray/prod/latest/api/authenticate"))
        .header("content-type", "application/json")
        .body(r#"{"token": ""}"#)
        .send()
        .await?;
    ensure!(post.status() == 200);
    // A 404 comes back as a 404: Ray's dashboard then serves its own files.
    let missing = client
        .get(format!("{url}/ray/prod/latest/static/js/main.js"))
        .send()
        .await?;
    ensure!(missing.status() == 404);

    let seen = seen
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    ensure!(seen.len() == 3, "{seen:?}");
    for request in &seen {
        let (expected, sent) = expected_signature(request, secret)?;
        ensure!(
            expected == sent,
            "{} {}?{}: signature {sent}, AWS would compute {expected}",
            request.method,
            request.path,
            request.query
        );
        let authorization = &request.headers["authorization"];
        ensure!(
            authorization.contains("/eu-west-1/execute-api/aws4_request"),
            "{authorization}"
        );
    }
    ensure!(seen[1].body == br#"{"token": ""}"#, "the body is forwarded");
    // Tampering is detectable: the signature covers the query string.
    let mut tampered = seen[0].clone();
    tampered.query = tampered.query.replace("FAILED", "FINISHED");
    let (expected, sent) = expected_signature(&tampered, secret)?;
    ensure!(expected != sent);
    Ok(())
}

#[tokio::test]
async fn iam_credentials_are_resolved_once_while_valid() -> anyhow::Result<()> {
    let (calls, seen) = through_counting_proxy(Duration::from_secs(60 * 60), 5).await?;
    ensure!(
        calls == 1,
        "the provider was asked {calls} times for 5 requests"
    );
    for request in &seen {
        signed_by_call(request, 1)?;
    }
    Ok(())
}

#[tokio::test]
async fn iam_credentials_near_expiry_are_resolved_again() -> anyhow::Result<()> {
    // Valid for half the margin: already due for refresh when the next request comes.
    let (calls, seen) = through_counting_proxy(CREDENTIALS_REFRESH_MARGIN / 2, 3).await?;
    ensure!(
        calls == 3,
        "the provider was asked {calls} times for 3 requests"
    );
    for (call, request) in (1..).zip(&seen) {
        signed_by_call(request, call)?;
    }
    Ok(())
}

#[tokio::test]
async fn bearer_requests_carry_the_token() -> anyhow::Result<()> {
    let (upstream_url, seen) = recording_upstream().await?;
    let token = AccessToken::new("proxy-test-token-0123456789")?;
    let url = proxy(&upstream_url, Upstream::Bearer(token)).await?;
    let answer = reqwest::get(format!("{url}/api/summary?cluster=x")).await?;
    ensure!(answer.status() == 200);
    // What the page reads of a task's output comes back through the proxy.
    for (name, value) in [
        ("x-afterglow-log-complete", "false"),
        ("x-afterglow-log-range", "inferred"),
    ] {
        ensure!(
            answer.headers().get(name).and_then(|got| got.to_str().ok()) == Some(value),
            "{name}: {:?}",
            answer.headers()
        );
    }
    let seen = seen
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    ensure!(
        seen.first()
            .and_then(|request| request.headers.get("authorization"))
            .map(String::as_str)
            == Some("Bearer proxy-test-token-0123456789"),
        "{seen:?}"
    );
    ensure!(seen[0].query == "cluster=x");
    Ok(())
}

#[tokio::test]
async fn a_request_for_another_host_is_refused() -> anyhow::Result<()> {
    let (upstream_url, seen) = recording_upstream().await?;
    let token = AccessToken::new("proxy-test-token-0123456789")?;
    let url = proxy(&upstream_url, Upstream::Bearer(token)).await?;
    // A page elsewhere that rebinds its name to 127.0.0.1 must not get signed requests.
    let answer = reqwest::Client::new()
        .get(format!("{url}/api/summary"))
        .header("host", "evil.example")
        .send()
        .await?;
    ensure!(answer.status() == 403);
    ensure!(
        seen.lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .is_empty()
    );
    Ok(())
}

#[test]
fn the_region_is_read_from_an_api_gateway_url() {
    assert_eq!(
        region_of("https://abc123.execute-api.eu-west-1.amazonaws.com").as_deref(),
        Some("eu-west-1")
    );
    assert_eq!(region_of("https://history.example.com"), None);
}
