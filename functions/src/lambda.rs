//! The Lambda entry point: `_HANDLER` names the function; each runs the shared router (HTTP
//! functions behind API Gateway's HTTP API, payload v2).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use shared::config::{Config, ConfigError, LambdaFunction};
use shared::ingest::{IngestAccess, Ingestor};
use shared::storage::S3Storage;

use crate::http::{AppState, router};

/// S3 must answer well inside Ray's 3 s publisher timeout, cold start included.
const INGEST_S3_TIMEOUT: Duration = Duration::from_millis(2500);

/// Runs `function` until Lambda stops the sandbox.
pub async fn run(function: LambdaFunction, config: Config) -> anyhow::Result<()> {
    match function {
        LambdaFunction::Ingest => {
            let token = config.ingest_token.clone().ok_or(ConfigError::Missing {
                variable: "AFTERGLOW_INGEST_TOKEN",
                reason: "the ingest function never accepts unauthenticated events",
            })?;
            let storage = S3Storage::connect(config.lambda_s3(INGEST_S3_TIMEOUT)?).await;
            let state = Arc::new(AppState {
                ingestor: Ingestor::new(
                    Arc::new(storage),
                    IngestAccess::Token(token),
                    config.ingest_limits,
                ),
            });
            lambda_http::run(router(state))
                .await
                .map_err(|err| anyhow::anyhow!(err))
                .context("the ingest function stopped")
        }
    }
}
