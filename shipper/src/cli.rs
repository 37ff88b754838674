//! `afterglow-ship-logs` (and `afterglow ship-logs`): runs next to `ray start` on every node and
//! sends each session's log files, as they grow, to `POST /v1/logs/{cluster}` ([`crate::ship`]
//! decides what to send; this module is the loop, the signals and the HTTP client), and on the
//! head node submitted jobs' changes to `POST /v1/events/{cluster}` ([`crate::submissions`])
//! and the cluster's metadata beside its logs ([`crate::metadata`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use async_trait::async_trait;
use tokio::signal::unix::{SignalKind, signal};

use crate::frames::{BodyAnswer, MAX_BODY_BYTES, MIN_BODY_BYTES, PieceOutcome};
use crate::metadata::{MAX_METADATA_BYTES, metadata_body};
use crate::names::{NodeId, SessionName};
use crate::ship::{
    LogBatch, LogSink, SendError, ShipError, ShipSettings, Shipper, backoff, node_ids_in,
};
use crate::submissions::{JobDetails, SubmissionLedger, latest_session, ray_auth_token};

/// Flags of `afterglow ship-logs`.
#[derive(Debug, clap::Args)]
pub struct ShipLogsArgs {
    /// The export URL the cluster's events go to (…/v1/events/CLUSTER?token=…), or the logs URL
    /// (…/v1/logs/CLUSTER?token=…).
    #[arg(
        long,
        value_name = "URL",
        env = "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR",
        hide_env_values = true
    )]
    pub to: String,
    /// Ray's temporary directory (ray start --temp-dir); waited for when it does not exist
    /// yet, so the shipper may start before `ray start`.
    #[arg(long, value_name = "DIR", default_value = "/tmp/ray")]
    pub ray_dir: PathBuf,
    /// This node's id (56 hex digits); read from each session's port files when not given.
    #[arg(long, value_name = "HEX")]
    pub node_id: Option<String>,
    /// Where sent offsets are kept across restarts [default: RAY_DIR/afterglow-ship-logs.json].
    #[arg(long, value_name = "FILE")]
    pub state_file: Option<PathBuf>,
    /// Time between passes. Each pass sends one request per session holding what every file
    /// appended (more only when that passes --body-bytes); an idle node sends nothing.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Most bytes per request.
    #[arg(long, value_name = "BYTES", default_value_t = 1024 * 1024, alias = "chunk-bytes")]
    pub body_bytes: usize,
    /// Ray's dashboard on this node. Where it answers (the head node), its job API is read
    /// every pass and what changed of each submitted job is sent as an event, since Ray exports
    /// none for them, and its cluster metadata (Ray's and Python's versions) once per session;
    /// `none` turns this off. With Ray's token authentication on, Ray's token is
    /// taken from where Ray's clients take it (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH,
    /// ~/.ray/auth_token).
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:8265")]
    pub dashboard: String,
}

/// `250ms`, `1s`, `2m`, or plain seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, "s"), |at| text.split_at(at));
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 500ms, 1s or 2m"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(value)),
        "s" => Ok(Duration::from_secs(value)),
        "m" => Ok(Duration::from_secs(value.saturating_mul(60))),
        _ => Err(format!(
            "{text:?} is not a duration such as 500ms, 1s or 2m"
        )),
    }
}

/// Most bytes read of the job API's answer, which takes a few hundred bytes per job.
const MAX_JOBS_BYTES: usize = 64 * 1024 * 1024;

/// Longest one request may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait between attempts while the endpoint is down.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Sends batches to an Afterglow ingest endpoint.
pub struct HttpSink {
    /// `…/v1/logs/{cluster}` with the token in its query string.
    url: url::Url,
    client: reqwest::Client,
}

impl HttpSink {
    /// A sink for the export URL Ray uses (`…/v1/events/{cluster}?token=…`) or the logs URL
    /// itself (`…/v1/logs/{cluster}?token=…`).
    pub fn new(export_url: &str) -> anyhow::Result<Self> {
        let url = logs_url(export_url)?;
        let client = reqwest::Client::builder()
            .timeout(SEND_TIMEOUT)
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Self { url, client })
    }
}

/// The URL holds the token: `Debug` shows neither.
impl std::fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSink")
            .field("host", &self.url.host_str())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl LogSink for HttpSink {
    async fn send(&self, batch: LogBatch<'_>) -> Result<BodyAnswer, SendError> {
        let mut url = self.url.clone();
        url.query_pairs_mut()
            .append_pair("session", batch.session.as_str())
            .append_pair("node_id", batch.node_id.as_str());
        let response = self
            .client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(batch.body.to_vec())
            .send()
            .await
            // The URL holds the token: never let it into a message.
            .map_err(|err| SendError::Retry(err.without_url().to_string()))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|err| SendError::Retry(err.without_url().to_string()))?;
        if status.is_success() {
            return serde_json::from_str(&body).map_err(|err| {
                SendError::Retry(format!("the endpoint's answer is not a log answer: {err}"))
            });
        }
        // A piece the store refuses is answered per piece, with 200; a refused request (a
        // wrong token or URL) is fixed on the endpoint's side, and the shipper then carries on
        // where it was.
        Err(SendError::Retry(format!(
            "{status}: {}",
            body.chars().take(500).collect::<String>()
        )))
    }
}

/// The logs URL for an export URL: `/v1/events/{cluster}` becomes `/v1/logs/{cluster}`, the
/// query string (the token) kept.
pub fn logs_url(export_url: &str) -> anyhow::Result<url::Url> {
    ingest_url(export_url, "logs")
}

/// The events URL for a logs or export URL: `/v1/{events|logs}/{cluster}` becomes
/// `/v1/events/{cluster}`, the query string (the token) kept.
pub fn events_url(export_url: &str) -> anyhow::Result<url::Url> {
    ingest_url(export_url, "events")
}

/// `export_url` with its `/v1/{events|logs}/{cluster}` path ending pointed at `kind`.
fn ingest_url(export_url: &str, kind: &str) -> anyhow::Result<url::Url> {
    // The URL may hold the token: messages name only its shape.
    let mut url =
        url::Url::parse(export_url).map_err(|err| anyhow::anyhow!("--to is not a URL ({err})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("--to must be an http(s) URL");
    }
    let segments: Vec<String> = url
        .path_segments()
        .map(|segments| segments.map(str::to_owned).collect())
        .unwrap_or_default();
    match segments.as_slice() {
        [.., version, given, cluster]
            if version == "v1" && (given == "events" || given == "logs") && !cluster.is_empty() =>
        {
            let prefix = segments.get(..segments.len() - 3).unwrap_or_default();
            let mut path: Vec<&str> = prefix.iter().map(String::as_str).collect();
            path.extend(["v1", kind, cluster]);
            url.set_path(&path.join("/"));
            Ok(url)
        }
        _ => bail!(
            "--to must be the export URL Ray uses (…/v1/events/CLUSTER?token=…) or the logs URL \
             (…/v1/logs/CLUSTER?token=…)"
        ),
    }
}

/// Reads Ray's dashboard on this node: sends what changed of each submitted job to the events
/// URL ([`crate::submissions`]), and stores the cluster's metadata ([`crate::metadata`]).
struct SubmissionWatch {
    /// `{dashboard}/api/jobs/`.
    jobs_url: url::Url,
    /// `{dashboard}/api/v0/cluster_metadata`.
    metadata_url: url::Url,
    /// The session whose metadata is stored.
    metadata_sent: Option<SessionName>,
    /// `…/v1/events/{cluster}` with the token in its query string.
    events_url: url::Url,
    /// Ray's own token for its dashboard, when Ray has one: never logged.
    ray_token: Option<String>,
    client: reqwest::Client,
    ledger: SubmissionLedger,
}

impl SubmissionWatch {
    fn new(dashboard: &str, export_url: &str) -> anyhow::Result<Option<Self>> {
        if dashboard == "none" {
            return Ok(None);
        }
        let route = |path: &str| {
            url::Url::parse(dashboard)
                .and_then(|url| url.join(path))
                .map_err(|err| anyhow::anyhow!("--dashboard {dashboard:?} is not a URL ({err})"))
        };
        let client = reqwest::Client::builder()
            .timeout(SEND_TIMEOUT)
            .build()
            .context("cannot build the HTTP client")?;
        let ray_token = ray_auth_token(
            std::env::var("RAY_AUTH_TOKEN").ok(),
            std::env::var_os("RAY_AUTH_TOKEN_PATH").map(PathBuf::from),
            std::env::var_os("HOME").map(PathBuf::from),
        );
        Ok(Some(Self {
            jobs_url: route("api/jobs/")?,
            metadata_url: route("api/v0/cluster_metadata")?,
            metadata_sent: None,
            events_url: events_url(export_url)?,
            ray_token,
            client,
            ledger: SubmissionLedger::default(),
        }))
    }

    /// The answer of Ray's dashboard at `url`, asked with Ray's token when there is one, read
    /// only up to `limit` bytes; `None` when nothing answers there (a node other than the head).
    async fn read(
        &self,
        url: &url::Url,
        limit: usize,
        what: &str,
    ) -> Result<Option<Vec<u8>>, String> {
        let mut request = self.client.get(url.clone());
        if let Some(token) = &self.ray_token {
            request = request.bearer_auth(token);
        }
        let mut response = match request.send().await {
            Ok(response) => response,
            Err(err) if err.is_connect() => return Ok(None),
            Err(err) => return Err(format!("reading {what}: {err}")),
        };
        if response.status() == reqwest::StatusCode::UNAUTHORIZED {
            return Err(format!(
                "{what} asks for Ray's token (token authentication is on): set RAY_AUTH_TOKEN \
                 or RAY_AUTH_TOKEN_PATH as for Ray's own clients"
            ));
        }
        if !response.status().is_success() {
            return Err(format!("{what} answered {}", response.status()));
        }
        let too_long = || format!("{what} answered more than {limit} bytes");
        if response
            .content_length()
            .is_some_and(|length| length > limit as u64)
        {
            return Err(too_long());
        }
        let mut answer = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|err| format!("reading {what}: {err}"))?
        {
            if answer.len() + chunk.len() > limit {
                return Err(too_long());
            }
            answer.extend_from_slice(&chunk);
        }
        Ok(Some(answer))
    }

    /// One read of Ray's job API, and the events of what changed. Returns the submissions
    /// sent; nothing when no dashboard answers (a node other than the head).
    async fn pass(&mut self, ray_dir: &Path) -> Result<usize, String> {
        let Some(session) = latest_session(ray_dir) else {
            return Ok(0);
        };
        let Some(answer) = self
            .read(&self.jobs_url, MAX_JOBS_BYTES, "Ray's job API")
            .await?
        else {
            return Ok(0);
        };
        let jobs: Vec<JobDetails> = serde_json::from_slice(&answer)
            .map_err(|err| format!("Ray's job API answered something else than jobs: {err}"))?;
        let now_ms = chrono::Utc::now().timestamp_millis();
        let mut sent = 0;
        for change in self.ledger.changes(&session, &jobs, now_ms) {
            let response = self
                .client
                .post(self.events_url.clone())
                .json(&change.events)
                .send()
                .await
                // The URL holds the token: never let it into a message.
                .map_err(|err| format!("sending a submission's events: {}", err.without_url()))?;
            if !response.status().is_success() {
                return Err(format!(
                    "sending a submission's events: the endpoint answered {}",
                    response.status()
                ));
            }
            self.ledger.sent(change);
            sent += 1;
        }
        Ok(sent)
    }

    /// Stores the latest session's cluster metadata beside the logs of this node (`node_id`, or
    /// the one its port files name), once per session. Returns whether it was sent now;
    /// nothing when no dashboard answers (a node other than the head).
    async fn ship_metadata(
        &mut self,
        ray_dir: &Path,
        node_id: Option<&NodeId>,
        sink: &dyn LogSink,
    ) -> Result<bool, String> {
        let Some(session) = latest_session(ray_dir) else {
            return Ok(false);
        };
        if self.metadata_sent.as_ref() == Some(&session) {
            return Ok(false);
        }
        let node_id = match node_id {
            Some(node_id) => node_id.clone(),
            None => match node_ids_in(&ray_dir.join(session.as_str())).as_slice() {
                [only] => only.clone(),
                _ => return Ok(false),
            },
        };
        let Some(answer) = self
            .read(
                &self.metadata_url,
                MAX_METADATA_BYTES,
                "Ray's cluster metadata",
            )
            .await?
        else {
            return Ok(false);
        };
        let body = metadata_body(&answer).map_err(|err| err.to_string())?;
        let answer = sink
            .send(LogBatch {
                session: &session,
                node_id: &node_id,
                body: &body,
            })
            .await
            .map_err(|SendError::Retry(reason)| {
                format!("storing the cluster metadata: {reason}")
            })?;
        // Refused: the session's metadata was stored before with other bytes, and is kept.
        if let Some(PieceOutcome::Refused { reason }) =
            answer.pieces.first().map(|piece| &piece.outcome)
        {
            tracing::warn!("the cluster metadata stored earlier is kept: {reason}");
        }
        self.metadata_sent = Some(session);
        Ok(true)
    }
}

/// Runs `afterglow ship-logs` until SIGINT or SIGTERM, then makes one last pass.
pub async fn run_cli(args: ShipLogsArgs) -> anyhow::Result<()> {
    let sink = HttpSink::new(&args.to)?;
    let mut submissions = SubmissionWatch::new(&args.dashboard, &args.to)?;
    let node_id = args
        .node_id
        .as_deref()
        .map(|id| NodeId::new(&id.to_ascii_lowercase()))
        .transpose()
        .context("--node-id")?;
    if args.body_bytes < MIN_BODY_BYTES || args.body_bytes > MAX_BODY_BYTES {
        bail!("--body-bytes must be between {MIN_BODY_BYTES} and {MAX_BODY_BYTES}");
    }
    let state_file = args
        .state_file
        .clone()
        .unwrap_or_else(|| args.ray_dir.join("afterglow-ship-logs.json"));
    let mut shipper = Shipper::new(ShipSettings {
        ray_dir: args.ray_dir.clone(),
        node_id: node_id.clone(),
        state_file: state_file.clone(),
        body_bytes: args.body_bytes,
    })?;
    tracing::info!(
        ray_dir = %args.ray_dir.display(),
        state_file = %state_file.display(),
        "shipping Ray's session logs every {:?}",
        args.interval
    );
    // Listening before the first pass: a pod stopped during it still gets its last pass.
    let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    let mut failures = 0_u32;
    let mut awaiting_ray = false;
    loop {
        let wait = match shipper.pass(&sink).await {
            Ok(report) => {
                if report.awaiting_ray && !awaiting_ray {
                    tracing::info!(
                        ray_dir = %args.ray_dir.display(),
                        "waiting for Ray to create its directory (--ray-dir)"
                    );
                }
                awaiting_ray = report.awaiting_ray;
                if report.pieces > 0 {
                    tracing::info!(
                        requests = report.requests,
                        pieces = report.pieces,
                        bytes = report.bytes,
                        "sent"
                    );
                }
                failures = 0;
                args.interval
            }
            Err(err @ ShipError::Retry { .. }) => {
                let wait = backoff(failures, MAX_BACKOFF);
                failures = failures.saturating_add(1);
                tracing::warn!(error = %err, "endpoint unavailable; retrying in {wait:?}");
                wait
            }
            Err(err) => return Err(err.into()),
        };
        if let Some(watch) = submissions.as_mut() {
            match watch.pass(&args.ray_dir).await {
                Ok(0) => {}
                Ok(sent) => tracing::info!(submissions = sent, "sent submitted jobs' changes"),
                Err(reason) => tracing::warn!("submitted jobs not sent, will retry: {reason}"),
            }
            match watch
                .ship_metadata(&args.ray_dir, node_id.as_ref(), &sink)
                .await
            {
                Ok(false) => {}
                Ok(true) => tracing::info!("stored the cluster's metadata"),
                Err(reason) => tracing::warn!("cluster metadata not stored, will retry: {reason}"),
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    // A node being stopped: send what was written since the last pass.
    if let Err(err) = shipper.pass(&sink).await {
        tracing::warn!(error = %err, "the last pass before stopping did not finish");
    }
    if let Some(watch) = submissions.as_mut()
        && let Err(reason) = watch.pass(&args.ray_dir).await
    {
        tracing::warn!("submitted jobs' last changes not sent: {reason}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// A dashboard on 127.0.0.1 that answers every request with `response` (a whole HTTP/1.1
    /// answer, head and body); its URL.
    async fn dashboard_answering(response: &'static [u8]) -> anyhow::Result<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = [0_u8; 4096];
                // One read takes a GET's head; the answer does not depend on it.
                let _ = stream.read(&mut request).await;
                let _ = stream.write_all(response).await;
                let _ = stream.shutdown().await;
            }
        });
        Ok(format!("http://{address}/"))
    }

    fn watch(dashboard: &str) -> anyhow::Result<SubmissionWatch> {
        SubmissionWatch::new(dashboard, "http://127.0.0.1:9/v1/logs/c")?
            .context("a dashboard is given")
    }

    /// Ray's answers are read only up to the bound: one that declares more is refused before
    /// its body is read, and one that does not say (chunked) is refused once it passes the
    /// bound. One within it is read whole, and a dashboard that is not there is no error (a
    /// node other than the head).
    #[tokio::test]
    async fn the_dashboards_answers_are_read_only_up_to_a_bound() -> anyhow::Result<()> {
        let url = |base: &str| url::Url::parse(base).map_err(anyhow::Error::from);
        let declared = dashboard_answering(
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n0123456789",
        )
        .await?;
        let refused = watch(&declared)?
            .read(&url(&declared)?, 10, "the test")
            .await;
        assert_eq!(
            refused,
            Err("the test answered more than 10 bytes".to_owned())
        );

        let chunked = dashboard_answering(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
              8\r\n01234567\r\n8\r\n89abcdef\r\n0\r\n\r\n",
        )
        .await?;
        let refused = watch(&chunked)?.read(&url(&chunked)?, 10, "the test").await;
        assert_eq!(
            refused,
            Err("the test answered more than 10 bytes".to_owned())
        );
        let whole = watch(&chunked)?.read(&url(&chunked)?, 16, "the test").await;
        assert_eq!(whole, Ok(Some(b"0123456789abcdef".to_vec())));

        // A port nothing listens on: bound and released at once.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await?
            .local_addr()?;
        let absent = format!("http://{closed}/");
        assert_eq!(
            watch(&absent)?.read(&url(&absent)?, 10, "the test").await,
            Ok(None)
        );
        Ok(())
    }
}
