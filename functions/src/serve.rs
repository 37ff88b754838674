//! `afterglow serve`: the embedded default. Every function in one process on a local directory
//! (or the configured bucket), listening on loopback.

use std::future::Future;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use shared::auth::AccessToken;
use shared::auth::ingest::IngestKeys;
use shared::compact::schedule::queue::CompactionQueue;
use shared::config::Config;
use shared::ingest::{IngestAccess, IngestLimits, Ingestor};
use shared::query::{QueryEngine, QuerySettings};
use shared::storage::Storage;
use tokio::net::TcpListener;

use crate::http::router;
use crate::setup::{compactor_with_scratch, ingest_keys, open_storage};
use crate::state::{AppState, QueryService};

/// Flags of `afterglow serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Directory to keep the history in (created if missing). Overrides AFTERGLOW_DATA_DIR and
    /// AFTERGLOW_BUCKET.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address to listen on. Port 0 picks a free port.
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:8700")]
    pub addr: SocketAddr,
    /// Cluster name used in the printed export URL (each Ray cluster gets its own URL).
    #[arg(long, value_name = "NAME", default_value = "local")]
    pub cluster: String,
}

/// What a running server needs, resolved from configuration and flags.
#[derive(Debug)]
pub struct ServeSettings {
    /// Where objects go.
    pub storage: Arc<dyn Storage>,
    /// The ingest secrets; `None` leaves ingest open, which only loopback listeners allow.
    pub ingest_keys: Option<Arc<IngestKeys>>,
    /// Bounds on ingest requests.
    pub ingest_limits: IngestLimits,
    /// Where stored raw objects are queued for compaction; `None` stores raw objects only.
    pub compaction: Option<CompactionQueue>,
    /// The dashboard API's engine settings; `None` serves no queries.
    pub query: Option<QuerySettings>,
    /// The query API's bearer token; `None` leaves it open, which only loopback listeners allow.
    pub query_token: Option<AccessToken>,
}

/// Serves every route on `listener` until `shutdown` resolves.
pub async fn run(
    settings: ServeSettings,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let local = listener.local_addr().context("listener has no address")?;
    let access = match settings.ingest_keys {
        Some(keys) => IngestAccess::Keys(keys),
        None if local.ip().is_loopback() => IngestAccess::Open,
        None => anyhow::bail!(
            "refusing to serve ingest without a token on {local}: set AFTERGLOW_INGEST_SECRET, \
             or listen on 127.0.0.1"
        ),
    };
    let query = match settings.query {
        None => None,
        Some(_) if settings.query_token.is_none() && !local.ip().is_loopback() => anyhow::bail!(
            "refusing to serve the query API without a token on {local}: set \
             AFTERGLOW_QUERY_TOKEN, or listen on 127.0.0.1"
        ),
        Some(query_settings) => Some(QueryService {
            engine: QueryEngine::open(Arc::clone(&settings.storage), query_settings)
                .context("cannot start the query engine")?,
            token: settings.query_token,
        }),
    };
    let state = Arc::new(AppState {
        ingestor: Some(Ingestor::new(
            settings.storage,
            access,
            settings.ingest_limits,
        )),
        compaction: settings.compaction,
        query,
    });
    let mut app = router(state);
    if local.ip().is_loopback() {
        app = app.layer(axum::middleware::from_fn(crate::http::loopback_hosts_only));
    }
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .context("server failed")
}

/// The `serve` subcommand: binds, prints how to point Ray here, and runs until Ctrl-C.
pub async fn run_cli(args: ServeArgs, config: Config) -> anyhow::Result<()> {
    if (config.ingest_secret.is_none() || config.query_token.is_none())
        && !args.addr.ip().is_loopback()
    {
        anyhow::bail!(
            "refusing to listen on {} with an open API: set both AFTERGLOW_INGEST_SECRET and \
             AFTERGLOW_QUERY_TOKEN, or use --addr 127.0.0.1:PORT",
            args.addr
        );
    }
    let ingest_keys = ingest_keys(&config).await?;
    let storage = open_storage(&config, args.data_dir.clone()).await?;
    let listener = TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.addr))?;
    let local = listener.local_addr().context("listener has no address")?;
    // Whoever started `serve` may close its stdout after reading what it needed (a test reads
    // up to the export line): a failed print must not take the server down with it.
    let _ = writeln!(
        std::io::stdout(),
        "{}",
        banner(
            local,
            &args.cluster,
            &storage.location(),
            ingest_keys.is_some()
        )
    );
    let (compactor, scratch) = compactor_with_scratch(Arc::clone(&storage), &config)?;
    let queue = CompactionQueue::spawn(compactor);
    // Raw objects a crashed or killed `serve` stored but never compacted, or left parked; and
    // sessions left untidy, whose quiet checks died with it (or that a command left so).
    let left = queue
        .catch_up()
        .await
        .context("cannot list the raw objects an earlier run may have left")?;
    if left > 0 {
        tracing::info!(
            objects = left,
            "compacting raw objects stored since the last recorded compaction"
        );
    }
    let settings = ServeSettings {
        storage,
        ingest_keys,
        ingest_limits: config.ingest_limits,
        compaction: Some(queue.clone()),
        query: Some(QuerySettings {
            copy_budget_bytes: config.copy_budget_bytes,
            grafana_url: config.grafana_url,
            ..QuerySettings::under(&scratch.path().join("query"))
        }),
        query_token: config.query_token,
    };
    run(settings, listener, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    // Finish compacting what was received before stopping.
    tracing::info!("stopping: compacting what is still queued");
    match queue.idle().await {
        Some(0) => {}
        Some(parked) => tracing::warn!(
            keys = parked,
            "stopping with raw objects that a fault kept out of the tables; the next start compacts them"
        ),
        None => tracing::warn!(
            "the compaction queue stopped early; the next start compacts what it did not"
        ),
    }
    drop(scratch);
    Ok(())
}

/// The startup text: where we listen and exactly what to export on the Ray cluster.
fn banner(local: SocketAddr, cluster: &str, location: &str, has_secret: bool) -> String {
    // The cluster's token is not printed: serve's output may end up in logs.
    let export = if has_secret {
        format!("$(afterglow export-url --endpoint http://{local} --cluster {cluster})")
    } else {
        format!("http://{local}/v1/events/{cluster}")
    };
    let access = if has_secret {
        "Ingest requires each cluster's token, derived from AFTERGLOW_INGEST_SECRET."
    } else {
        "Ingest is open (AFTERGLOW_INGEST_SECRET is not set), so Afterglow only listens on loopback."
    };
    format!(
        "Afterglow listening on http://{local} (history in {location})\n\
         Dashboard: http://{local}/ (API: http://{local}/api/summary, /api/tasks, … see openapi.yaml)\n\
         Ray's own tools: ray list tasks --address http://{local}/ray/{cluster}/latest\n\
         \x20 (and ray start --head --proxy-server-url=http://{local}/ray/{cluster}/latest for Ray's dashboard)\n\
         {access}\n\
         Point a Ray (>= 2.49) cluster here: export these before `ray start`:\n\
         \x20 export RAY_enable_core_worker_ray_event_to_aggregator=1\n\
         \x20 export RAY_enable_ray_event=1\n\
         \x20 export RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES=ALL\n\
         \x20 export RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR=\"{export}\"\n\
         Keep tasks' stdout/stderr too: on every node, with the same variable exported:\n\
         \x20 afterglow ship-logs &"
    )
}
