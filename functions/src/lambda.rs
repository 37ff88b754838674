//! The Lambda entry point: `_HANDLER` names the function; each runs the shared router (HTTP
//! functions behind API Gateway's HTTP API, payload v2; ingest also behind the firewalled REST
//! API, payload v1, whose stage the template keeps out of the path) or its event handler
//! (compact, log-store, catalog).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use shared::auth::ingest::{IngestKeys, RefreshPolicy};
use shared::compact::fold::FoldPolicy;
use shared::compact::schedule::batch::BatchLimits;
use shared::compact::schedule::check_queue::CheckQueue;
use shared::compact::{CompactSettings, Compactor};
use shared::config::{Config, ConfigError, LambdaFunction};
use shared::iceberg::{GlueCatalog, RETIRED_FILE_GRACE, SyncQueue};
use shared::ingest::{IngestAccess, Ingestor};
use shared::logs::queue::sqs::SqsLogQueue;
use shared::query::{QueryEngine, QuerySettings};
use shared::storage::{S3Storage, Storage};

use crate::http::router;
use crate::state::{AppState, QueryService};

/// S3 must answer well inside Ray's 3 s publisher timeout, cold start included.
const INGEST_S3_TIMEOUT: Duration = Duration::from_millis(2500);

/// Runs `function` until Lambda stops the sandbox.
pub async fn run(function: LambdaFunction, config: Config) -> anyhow::Result<()> {
    match function {
        LambdaFunction::Ingest => {
            let source = config.ingest_secret.clone().ok_or(ConfigError::Missing {
                variable: "AFTERGLOW_INGEST_SECRET_ARN",
                reason: "the ingest function never accepts unauthenticated events",
            })?;
            // Read at start: a missing secret or permission fails the cold start, not requests.
            let keys = IngestKeys::load(source, RefreshPolicy::default())
                .await
                .context("cannot read the ingest secret")?;
            let storage = S3Storage::connect(config.lambda_s3(Some(INGEST_S3_TIMEOUT))?).await;
            let mut ingestor = Ingestor::new(
                Arc::new(storage),
                IngestAccess::Keys(Arc::new(keys)),
                config.ingest_limits,
            );
            if let Some(shards) = config.log_queues.clone() {
                ingestor = ingestor.with_log_queue(Arc::new(SqsLogQueue::connect(shards).await));
            }
            let state = Arc::new(AppState {
                ingestor: Some(ingestor),
                // On AWS, S3 notifications reach the compact function through SQS.
                compaction: None,
                query: None,
            });
            lambda_http::run(router(state))
                .await
                .map_err(|err| anyhow::anyhow!(err))
                .context("the ingest function stopped")
        }
        LambdaFunction::Query => {
            let storage = Arc::new(S3Storage::connect(config.lambda_s3(None)?).await);
            let state = Arc::new(AppState {
                query: Some(query_service(storage, &config)?),
                ..AppState::default()
            });
            lambda_http::run(router(state))
                .await
                .map_err(|err| anyhow::anyhow!(err))
                .context("the query function stopped")
        }
        LambdaFunction::Compact => {
            let settings = config.lambda_s3(None)?;
            let prefix = settings.prefix.clone();
            let storage = Arc::new(S3Storage::connect(settings).await);
            let scratch = std::env::temp_dir().join("afterglow-compact");
            std::fs::create_dir_all(&scratch).context("cannot create the scratch directory")?;
            let compactor = Compactor::new(storage, compact_settings(&config), scratch);
            let queue_url = config
                .compact_queue_url
                .clone()
                .ok_or(ConfigError::Missing {
                    variable: "AFTERGLOW_COMPACT_QUEUE_URL",
                    reason: "the compact function queues each session's quiet check on its own \
                             queue (the template sets it)",
                })?;
            let checks = CheckQueue::connect(queue_url, config.fold_quiet).await;
            let limits = BatchLimits {
                max_bytes: config
                    .lambda_memory_mib
                    .map(BatchLimits::max_bytes_for_memory),
                ..BatchLimits::default()
            };
            let sync = match config.catalog_queue_url.clone() {
                Some(url) => Some(SyncQueue::connect(url).await),
                None => None,
            };
            let function = crate::compact::CompactFunction {
                compactor,
                checks: Some(checks),
                sync,
                prefix,
                limits,
            };
            let function = &function;
            lambda_runtime::run(lambda_runtime::service_fn(move |event| {
                crate::compact::handle(function, event)
            }))
            .await
            .map_err(|err| anyhow::anyhow!(err))
            .context("the compact function stopped")
        }
        LambdaFunction::LogStore => {
            let storage: Arc<dyn Storage> =
                Arc::new(S3Storage::connect(config.lambda_s3(None)?).await);
            let storage = &storage;
            lambda_runtime::run(lambda_runtime::service_fn(move |event| {
                crate::log_store::handle(storage, event)
            }))
            .await
            .map_err(|err| anyhow::anyhow!(err))
            .context("the log store function stopped")
        }
        LambdaFunction::Catalog => {
            let database = config.glue_database.clone().ok_or(ConfigError::Missing {
                variable: "AFTERGLOW_GLUE_DATABASE",
                reason: "the catalog function points the published tables at a Glue database \
                         (the template sets it)",
            })?;
            let storage: Arc<dyn Storage> =
                Arc::new(S3Storage::connect(config.lambda_s3(None)?).await);
            let function = crate::catalog::CatalogFunction {
                storage,
                catalog: GlueCatalog::connect(database).await,
            };
            let function = &function;
            lambda_runtime::run(lambda_runtime::service_fn(move |event| {
                crate::catalog::handle(function, event)
            }))
            .await
            .map_err(|err| anyhow::anyhow!(err))
            .context("the catalog function stopped")
        }
    }
}

/// How the compact function compacts, from its configuration.
pub fn compact_settings(config: &Config) -> CompactSettings {
    // Published tables' snapshots name files for a while after a fold retires them.
    let retire_grace = match config.catalog_queue_url {
        Some(_) => RETIRED_FILE_GRACE,
        None => CompactSettings::default().retire_grace,
    };
    // DuckDB gets 60 % of the function's memory and spills the rest to /tmp.
    CompactSettings {
        retire_grace,
        memory_limit_mib: config.lambda_memory_mib.map(|memory| memory * 6 / 10),
        retention: config.tables_retention,
        cache_bytes: config.cache_bytes,
        stored_keys_bytes: config.stored_keys_bytes,
        fold: FoldPolicy {
            quiet: config.fold_quiet,
            ..FoldPolicy::default()
        },
        ..CompactSettings::default()
    }
}

/// The query function's engine: files cached under `/tmp` (the only writable place, kept
/// between invocations of a warm sandbox), DuckDB sized from the function's memory.
pub fn query_service(storage: Arc<S3Storage>, config: &Config) -> anyhow::Result<QueryService> {
    let dir = std::env::temp_dir().join("afterglow-query");
    let settings = QuerySettings {
        cache_bytes: config.cache_bytes,
        copy_budget_bytes: config.copy_budget_bytes,
        grafana_url: config.grafana_url.clone(),
        ..match config.lambda_memory_mib {
            Some(memory) => QuerySettings::for_lambda(&dir, memory),
            None => QuerySettings::under(&dir),
        }
    };
    Ok(QueryService {
        engine: QueryEngine::open(storage, settings).context("cannot start the query engine")?,
        token: config.query_token.clone(),
    })
}
