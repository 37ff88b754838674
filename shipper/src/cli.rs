//! `afterglow-ship-logs` (and `afterglow ship-logs`): runs next to `ray start` on every node and
//! sends each session's log files, as they grow, to `POST /v1/logs/{cluster}` ([`crate::ship`]
//! decides what to send; this module is the loop, the signals and the HTTP client).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use async_trait::async_trait;
use tokio::signal::unix::{SignalKind, signal};

use crate::names::NodeId;
use crate::ship::{
    LogChunk, LogSink, MAX_CHUNK_BYTES, SendError, ShipError, ShipSettings, Shipper, backoff,
};

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
    /// Time between passes.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Most bytes per request.
    #[arg(long, value_name = "BYTES", default_value_t = 1024 * 1024)]
    pub chunk_bytes: usize,
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

/// Longest one chunk's request may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait between attempts while the endpoint is down.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Sends chunks to an Afterglow ingest endpoint.
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
    async fn send(&self, chunk: LogChunk<'_>) -> Result<(), SendError> {
        let mut url = self.url.clone();
        url.query_pairs_mut()
            .append_pair("session", chunk.session.as_str())
            .append_pair("node_id", chunk.node_id.as_str())
            .append_pair("file", chunk.file.as_str())
            .append_pair("offset", &chunk.offset.to_string());
        let response = self
            .client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(chunk.bytes.to_vec())
            .send()
            .await
            // The URL holds the token: never let it into a message.
            .map_err(|err| SendError::Retry(err.without_url().to_string()))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let body = response.text().await.unwrap_or_default();
        let reason = format!("{status}: {}", body.chars().take(500).collect::<String>());
        // Only what is wrong with this piece refuses the file for good; a wrong token or URL is
        // fixed on the endpoint's side, and the shipper must then carry on where it was.
        match status.as_u16() {
            400 | 409 | 413 => Err(SendError::Refused(reason)),
            _ => Err(SendError::Retry(reason)),
        }
    }
}

/// The logs URL for an export URL: `/v1/events/{cluster}` becomes `/v1/logs/{cluster}`, the
/// query string (the token) kept.
pub fn logs_url(export_url: &str) -> anyhow::Result<url::Url> {
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
        [.., version, kind, cluster]
            if version == "v1" && (kind == "events" || kind == "logs") && !cluster.is_empty() =>
        {
            let prefix = segments.get(..segments.len() - 3).unwrap_or_default();
            let mut path: Vec<&str> = prefix.iter().map(String::as_str).collect();
            path.extend(["v1", "logs", cluster]);
            url.set_path(&path.join("/"));
            Ok(url)
        }
        _ => bail!(
            "--to must be the export URL Ray uses (…/v1/events/CLUSTER?token=…) or the logs URL \
             (…/v1/logs/CLUSTER?token=…)"
        ),
    }
}

/// Runs `afterglow ship-logs` until SIGINT or SIGTERM, then makes one last pass.
pub async fn run_cli(args: ShipLogsArgs) -> anyhow::Result<()> {
    let sink = HttpSink::new(&args.to)?;
    let node_id = args
        .node_id
        .as_deref()
        .map(|id| NodeId::new(&id.to_ascii_lowercase()))
        .transpose()
        .context("--node-id")?;
    if args.chunk_bytes == 0 || args.chunk_bytes > MAX_CHUNK_BYTES {
        bail!("--chunk-bytes must be between 1 and {MAX_CHUNK_BYTES}");
    }
    let state_file = args
        .state_file
        .clone()
        .unwrap_or_else(|| args.ray_dir.join("afterglow-ship-logs.json"));
    let mut shipper = Shipper::new(ShipSettings {
        ray_dir: args.ray_dir.clone(),
        node_id,
        state_file: state_file.clone(),
        chunk_bytes: args.chunk_bytes,
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
                if report.chunks > 0 {
                    tracing::info!(chunks = report.chunks, bytes = report.bytes, "sent");
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
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    // A node being stopped: send what the last second wrote.
    if let Err(err) = shipper.pass(&sink).await {
        tracing::warn!(error = %err, "the last pass before stopping did not finish");
    }
    Ok(())
}
