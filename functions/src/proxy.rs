//! `afterglow proxy`: a loopback server in front of a deployed query API, for the clients that
//! cannot authenticate to it themselves — a browser, Ray's dashboard (`--proxy-server-url`) and
//! `ray list --address`. Each request is forwarded as is (method, path, query, body) and signed
//! with SigV4 for API Gateway's IAM auth, from the standard AWS credential chain, or given the
//! bearer token of a deployment in bearer mode. Answers come back unchanged, 404s included (Ray's
//! dashboard then serves its own UI files). The chain is asked for credentials once, and again
//! only as they near expiry ([`CREDENTIALS_REFRESH_MARGIN`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};
use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials as _, SharedCredentialsProvider};
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use shared::auth::AccessToken;
use shared::config::Config;
use tokio::net::TcpListener;
use tokio::sync::Mutex;

use crate::query::{LOG_COMPLETE, LOG_RANGE};
use crate::state::error_response;

/// How `afterglow proxy` authenticates upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProxyAuth {
    /// SigV4 (the template's default, QueryAuth=iam).
    Iam,
    /// `Authorization: Bearer $AFTERGLOW_QUERY_TOKEN` (QueryAuth=bearer).
    Bearer,
}

/// Flags of `afterglow proxy`.
#[derive(Debug, clap::Args)]
pub struct ProxyArgs {
    /// Base URL of the deployed query API (the stack's QueryApiUrl output), such as
    /// https://abc123.execute-api.eu-west-1.amazonaws.com.
    #[arg(long, value_name = "URL")]
    pub url: String,
    /// Loopback address to listen on. Port 0 picks a free port.
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:8701")]
    pub addr: SocketAddr,
    /// How to authenticate: bearer when AFTERGLOW_QUERY_TOKEN is set, else iam.
    #[arg(long, value_enum)]
    pub auth: Option<ProxyAuth>,
    /// The API's AWS region, when --url does not name it (a custom domain).
    #[arg(long, value_name = "REGION")]
    pub region: Option<String>,
}

/// Largest request body forwarded (Ray's dashboard sends small JSON at most).
const MAX_BODY: usize = 1024 * 1024;
/// Longest an upstream request may take (API Gateway gives up at 30 s).
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(35);
/// Response headers passed back to the client: the page reads a task's output's two.
const PASSED_BACK: [header::HeaderName; 6] = [
    header::CONTENT_TYPE,
    header::CONTENT_DISPOSITION,
    header::CACHE_CONTROL,
    header::CONTENT_SECURITY_POLICY,
    LOG_COMPLETE,
    LOG_RANGE,
];
/// How long before they expire credentials are resolved again: longer than any request may take
/// (`UPSTREAM_TIMEOUT`), so none is signed with credentials that lapse on the way, and short
/// beside the 15 minutes of the shortest STS session.
pub const CREDENTIALS_REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);
/// How long credentials that name no expiry (access keys) are kept, as the SDK's own identity
/// cache keeps them: keys rotated in the environment or the profile are then picked up.
const UNEXPIRING_CREDENTIALS_KEPT: Duration = Duration::from_secs(15 * 60);

/// How requests are authenticated upstream.
#[derive(Debug)]
pub enum Upstream {
    /// SigV4 for `execute-api` in `region`, with credentials from the AWS chain.
    Iam {
        /// The API's region.
        region: String,
        /// Where credentials come from. The proxy asks once and keeps what it gets until
        /// [`CREDENTIALS_REFRESH_MARGIN`] before it expires.
        credentials: SharedCredentialsProvider,
    },
    /// `Authorization: Bearer <token>`.
    Bearer(AccessToken),
}

/// [`Upstream`], with the IAM credentials cached.
#[derive(Debug)]
enum Auth {
    /// SigV4 for `execute-api` in `region`.
    Iam {
        /// The API's region.
        region: String,
        /// The credentials to sign with.
        credentials: CachedCredentials,
    },
    /// `Authorization: Bearer <token>`.
    Bearer(AccessToken),
}

/// Credentials from a provider, kept until [`CREDENTIALS_REFRESH_MARGIN`] before they expire.
/// The default chain does not cache by itself (an SDK client's identity cache does): its SSO and
/// assume-role providers make a network call each time they are asked.
///
/// The SDK's identity cache (`IdentityCache::lazy()`) is not used: its `resolve_cached_identity`
/// takes an operation's `RuntimeComponents`, whose builder requires an endpoint resolver, an auth
/// scheme and its option resolver, an identity resolver and a retry strategy: parts of an SDK
/// client that the proxy, signing its own requests, does not have.
#[derive(Debug)]
struct CachedCredentials {
    /// Where credentials come from.
    provider: SharedCredentialsProvider,
    /// The credentials last resolved and when to resolve them again. The lock is held while
    /// resolving, so concurrent requests wait for one resolution rather than each starting one.
    current: Mutex<Option<(Credentials, SystemTime)>>,
}

impl CachedCredentials {
    /// Nothing resolved yet: the first request asks `provider`.
    fn new(provider: SharedCredentialsProvider) -> Self {
        Self {
            provider,
            current: Mutex::new(None),
        }
    }

    /// The kept credentials, or new ones from the provider once the kept ones are due.
    async fn get(&self) -> Result<Credentials, CredentialsError> {
        let mut current = self.current.lock().await;
        let now = SystemTime::now();
        if let Some((credentials, refresh_at)) = current.as_ref()
            && now < *refresh_at
        {
            return Ok(credentials.clone());
        }
        let credentials = self.provider.provide_credentials().await?;
        // Credentials already within the margin are used once and resolved again next time.
        let refresh_at = match credentials.expiry() {
            Some(expiry) => expiry
                .checked_sub(CREDENTIALS_REFRESH_MARGIN)
                .unwrap_or(now),
            None => now + UNEXPIRING_CREDENTIALS_KEPT,
        };
        tracing::debug!(expiry = ?credentials.expiry(), "AWS credentials resolved");
        *current = Some((credentials.clone(), refresh_at));
        Ok(credentials)
    }
}

/// What the proxy holds for every request.
#[derive(Debug)]
pub struct Proxy {
    /// The query API's base URL, without a trailing slash.
    base: String,
    /// How to authenticate.
    auth: Auth,
    client: reqwest::Client,
}

impl Proxy {
    /// A proxy to `base` (such as `https://abc.execute-api.eu-west-1.amazonaws.com`),
    /// authenticated as `upstream` says. Nothing is resolved until the first request.
    pub fn new(base: &str, upstream: Upstream) -> anyhow::Result<Self> {
        let parsed = url::Url::parse(base).with_context(|| format!("--url {base:?}"))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            bail!("--url {base:?}: an http(s) URL of the query API is needed");
        }
        let client = reqwest::Client::builder()
            .timeout(UPSTREAM_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("cannot build the HTTP client")?;
        let auth = match upstream {
            Upstream::Iam {
                region,
                credentials,
            } => Auth::Iam {
                region,
                credentials: CachedCredentials::new(credentials),
            },
            Upstream::Bearer(token) => Auth::Bearer(token),
        };
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            auth,
            client,
        })
    }

    /// Every path, forwarded.
    pub fn router(self) -> Router {
        Router::new()
            .fallback(forward)
            .layer(axum::middleware::from_fn(crate::http::loopback_hosts_only))
            .with_state(Arc::new(self))
    }
}

/// The region of an API Gateway URL (`{id}.execute-api.{region}.amazonaws.com`).
pub fn region_of(base: &str) -> Option<String> {
    let host = url::Url::parse(base).ok()?.host_str()?.to_owned();
    let mut labels = host.split('.');
    labels.find(|label| *label == "execute-api")?;
    labels.next().map(str::to_owned)
}

#[tracing::instrument(name = "proxy", skip_all, fields(method = %request.method(), path = %request.uri().path(), status = tracing::field::Empty))]
async fn forward(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(_) => {
            return error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request bodies over {MAX_BODY} bytes are not forwarded"),
            );
        }
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", axum::http::uri::PathAndQuery::as_str);
    let url = format!("{}{path}", proxy.base);
    let response = match send(&proxy, &parts.method, &url, &parts.headers, body).await {
        Ok(response) => response,
        Err(err) => {
            // Never the URL's query string or headers: they may hold secrets.
            tracing::warn!(error = format!("{err:#}"), "upstream request failed");
            return error_response(
                StatusCode::BAD_GATEWAY,
                format!("the query API did not answer: {err:#}"),
            );
        }
    };
    tracing::Span::current().record("status", response.status().as_u16());
    response
}

/// Sends one request upstream, authenticated, and turns the answer into a response.
async fn send(
    proxy: &Proxy,
    method: &axum::http::Method,
    url: &str,
    incoming: &HeaderMap,
    body: Bytes,
) -> anyhow::Result<Response> {
    let mut headers: Vec<(String, String)> = Vec::new();
    for name in [header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(value) = incoming.get(&name).and_then(|value| value.to_str().ok()) {
            headers.push((name.as_str().to_owned(), value.to_owned()));
        }
    }
    match &proxy.auth {
        Auth::Bearer(token) => {
            headers.push((
                header::AUTHORIZATION.as_str().to_owned(),
                format!("Bearer {}", token.expose()),
            ));
        }
        Auth::Iam {
            region,
            credentials,
        } => {
            let credentials = credentials.get().await.context(
                "no AWS credentials (the standard chain: AWS_PROFILE, AWS_ACCESS_KEY_ID, SSO, …)",
            )?;
            let identity = credentials.into();
            let params = v4::SigningParams::builder()
                .identity(&identity)
                .region(region)
                .name("execute-api")
                .time(SystemTime::now())
                .settings(SigningSettings::default())
                .build()
                .context("SigV4 parameters")?
                .into();
            let signable = SignableRequest::new(
                method.as_str(),
                url,
                headers
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_str())),
                SignableBody::Bytes(&body),
            )
            .context("cannot sign this request")?;
            let (instructions, _) = sign(signable, &params)
                .context("SigV4 signing")?
                .into_parts();
            let (signed, _) = instructions.into_parts();
            for header in signed {
                headers.push((header.name().to_owned(), header.value().to_owned()));
            }
        }
    }
    let mut request = proxy.client.request(method.clone(), url).body(body);
    for (name, value) in &headers {
        request = request.header(name, value);
    }
    // reqwest's errors name the URL, query string included: never log or echo it.
    let upstream = request.send().await.map_err(reqwest::Error::without_url)?;
    let status = upstream.status();
    let mut passed = HeaderMap::new();
    for name in PASSED_BACK {
        if let Some(value) = upstream.headers().get(&name) {
            passed.insert(name, value.clone());
        }
    }
    let bytes = upstream
        .bytes()
        .await
        .map_err(reqwest::Error::without_url)?;
    let mut response = (status, bytes).into_response();
    response.headers_mut().extend(passed);
    Ok(response)
}

/// `afterglow proxy`: serves until Ctrl-C.
pub async fn run_cli(args: ProxyArgs, config: Config) -> anyhow::Result<()> {
    let auth = args.auth.unwrap_or(if config.query_token.is_some() {
        ProxyAuth::Bearer
    } else {
        ProxyAuth::Iam
    });
    let upstream = match auth {
        ProxyAuth::Bearer => Upstream::Bearer(
            config
                .query_token
                .clone()
                .context("--auth bearer needs the query API's token in AFTERGLOW_QUERY_TOKEN")?,
        ),
        ProxyAuth::Iam => {
            let sdk = shared::aws::sdk_config().await;
            let region = args
                .region
                .clone()
                .or_else(|| region_of(&args.url))
                .or_else(|| sdk.region().map(ToString::to_string))
                .context("the API's region is not in --url: give --region or set AWS_REGION")?;
            let credentials = sdk
                .credentials_provider()
                .context("no AWS credential chain is configured")?;
            Upstream::Iam {
                region,
                credentials,
            }
        }
    };
    if !args.addr.ip().is_loopback() {
        bail!(
            "--addr {}: the proxy adds credentials to every request, so it listens on loopback \
             only",
            args.addr
        );
    }
    let proxy = Proxy::new(&args.url, upstream)?;
    let listener = TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.addr))?;
    let local: SocketAddr = listener.local_addr()?;
    println!(
        "Afterglow proxy to {} on http://{local}\n\
         Ray's dashboard: ray start --head --proxy-server-url=http://{local}/ray/CLUSTER/latest\n\
         Ray's CLI:       ray list tasks --address http://{local}/ray/CLUSTER/latest\n\
         Afterglow's page: http://{local}/",
        args.url
    );
    axum::serve(listener, proxy.router())
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .context("the proxy stopped")
}
