//! `afterglow export-url`: the URL a cluster's events (and logs) go to, with its own token.

use anyhow::Context as _;
use shared::config::Config;
use shared::keys::ClusterName;

/// Flags of `afterglow export-url`.
#[derive(Debug, clap::Args)]
pub struct ExportUrlArgs {
    /// The cluster's name, as it will appear in the history.
    #[arg(long, value_name = "NAME")]
    pub cluster: String,
    /// Base URL of ingest: the stack's IngestBaseUrl output, or `serve`'s address.
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:8700")]
    pub endpoint: String,
}

/// `afterglow export-url`: the URL a cluster exports to, with its own token.
pub async fn run(args: ExportUrlArgs, config: Config) -> anyhow::Result<()> {
    let cluster = ClusterName::new(&args.cluster).context("--cluster")?;
    let base = args.endpoint.trim_end_matches('/');
    let url = match crate::setup::ingest_keys(&config).await? {
        Some(keys) => format!(
            "{base}/v1/events/{cluster}?token={}",
            keys.token_for(&cluster).await
        ),
        None => {
            tracing::warn!(
                "no AFTERGLOW_INGEST_SECRET or AFTERGLOW_INGEST_SECRET_ARN: printing the URL of \
                 an open (loopback-only) ingest"
            );
            format!("{base}/v1/events/{cluster}")
        }
    };
    println!("{url}");
    Ok(())
}
