//! The command line. Each subcommand maps onto one library entry point.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use shared::config::Config;

/// Afterglow: Ray task history that outlives the cluster.
///
/// Ray's event export POSTs task, job, actor and node events to Afterglow, which keeps them
/// after the cluster is gone. Configuration comes from AFTERGLOW_* environment variables; flags
/// override them.
#[derive(Debug, Parser)]
#[command(name = "afterglow", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run Afterglow locally: receive Ray's events on 127.0.0.1 and store them in a directory.
    ///
    /// Prints the URL to put in RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR. Without
    /// AFTERGLOW_INGEST_TOKEN, ingest is open and only a loopback address may be used.
    Serve(ServeArgs),
    /// Roll raw ingest objects into the Parquet tables (all of them, or the keys given).
    ///
    /// Safe to repeat: compaction is idempotent.
    Compact(CompactArgs),
    /// Rebuild every table from the raw objects: delete the tables, then compact everything.
    ///
    /// Stop `serve` (and the compact function) on the same store first.
    Rebuild(StoreArgs),
}

/// Which store a maintenance command works on.
#[derive(Debug, clap::Args)]
pub struct StoreArgs {
    /// A local data directory. Overrides AFTERGLOW_DATA_DIR and AFTERGLOW_BUCKET.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

/// Flags of `afterglow compact`.
#[derive(Debug, clap::Args)]
pub struct CompactArgs {
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Raw object keys (`raw/{cluster}/…ndjson.gz`); all raw objects when none are given.
    #[arg(value_name = "KEY")]
    pub keys: Vec<String>,
}

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

/// Runs one parsed command line.
pub async fn run(cli: Cli, config: Config) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => crate::serve::run_cli(args, config).await,
        Command::Compact(args) => crate::maintenance::compact(args, config).await,
        Command::Rebuild(args) => crate::maintenance::rebuild(args, config).await,
    }
}
