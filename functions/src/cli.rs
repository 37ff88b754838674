//! The command line: parses it and hands each command to the module that runs it. Each command
//! module owns its flags (a clap `Args` struct) beside its `run`; this module only names the
//! commands and dispatches.

use clap::{Parser, Subcommand};
use shared::config::Config;

use crate::bench::BenchArgs;
use crate::export_url::ExportUrlArgs;
use crate::generate::GenerateArgs;
use crate::maintenance::{CompactArgs, RebuildArgs};
use crate::migrate_logs::MigrateLogsArgs;
use crate::proxy::ProxyArgs;
use crate::publish::PublishArgs;
use crate::serve::ServeArgs;
use crate::ship_logs::ShipLogsArgs;
use crate::sql::SqlArgs;

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

impl Cli {
    /// True for the commands whose own output says what they are doing (progress bars on
    /// stderr, a line per table): their logs would bury it.
    pub fn reports_itself(&self) -> bool {
        matches!(
            self.command,
            Command::Generate(_)
                | Command::Bench(_)
                | Command::Compact(_)
                | Command::Rebuild(_)
                | Command::Publish(_)
                | Command::MigrateLogs(_)
        )
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run Afterglow locally: receive Ray's events on 127.0.0.1 and store them in a directory.
    ///
    /// Prints the URL to put in RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR. Without
    /// AFTERGLOW_INGEST_SECRET (or AFTERGLOW_INGEST_SECRET_ARN), ingest is open and only a
    /// loopback address may be used.
    Serve(ServeArgs),
    /// Roll raw ingest objects into the Parquet tables (all of them, or the keys given).
    ///
    /// Works in runs. Without KEY, then folds each session into one base; with keys, folding
    /// is left to the fold policy, as in the compact function. Over the deployment's bucket,
    /// AFTERGLOW_COMPACT_QUEUE_URL hands the sessions' quiet checks to the compact function.
    /// Safe to repeat: compaction is idempotent.
    Compact(CompactArgs),
    /// Rebuild every table from the raw objects: delete the tables, then compact everything
    /// and fold each session into one base (over the deployment's bucket,
    /// AFTERGLOW_COMPACT_QUEUE_URL lets the compact function delete the files folds replaced).
    ///
    /// Stop `serve` (and the compact function) on the same store first. Refuses when raw
    /// objects the tables were built from are gone (expired), unless --force.
    Rebuild(RebuildArgs),
    /// Generate synthetic Ray 2.60 event traffic (deterministic for a seed).
    ///
    /// Writes POST bodies to --out DIR (bodies/*.json plus truth.json, what was generated) or
    /// POSTs them to --post URL (an ingest URL, token included), retrying like Ray does.
    Generate(GenerateArgs),
    /// Measure the whole pipeline at scale: ingest, compaction, storage and every dashboard
    /// route, cold and warm. Prints JSON to stdout and a table to stderr.
    ///
    /// Build with --release. A large --tasks needs free disk in --dir (or TMPDIR) while it
    /// runs (docs/performance.md).
    Bench(BenchArgs),
    /// Serve a deployed query API on 127.0.0.1 for what cannot authenticate to it: a browser,
    /// Ray's dashboard (`ray start --head --proxy-server-url=…/ray/CLUSTER/latest`) and Ray's
    /// CLI (`ray list tasks --address …/ray/CLUSTER/latest`).
    ///
    /// Signs each request with SigV4 from the standard AWS credential chain (AWS_PROFILE,
    /// AWS_ACCESS_KEY_ID, SSO, …), or sends AFTERGLOW_QUERY_TOKEN as a bearer token to a
    /// deployment in bearer mode.
    Proxy(ProxyArgs),
    /// Send this node's Ray logs to Afterglow as they are written: start it next to `ray start`
    /// on every node.
    ///
    /// Follows every session under --ray-dir (new files, files Ray moves to logs/old/, rotated
    /// and truncated files, new sessions), sends what every file appended in one request about
    /// every --interval (nothing when nothing was written), resumes after a restart from its state file without re-sending or skipping,
    /// and retries with backoff while the endpoint is down. A crashed node loses at most the
    /// last interval.
    ShipLogs(ShipLogsArgs),
    /// Print a cluster's export URL: the endpoint, the cluster's name, and its own token.
    ///
    /// Each cluster's token is derived from the ingest secret (AFTERGLOW_INGEST_SECRET, or the
    /// Secrets Manager secret AFTERGLOW_INGEST_SECRET_ARN names, read with the standard AWS
    /// credential chain), so a leaked URL cannot write another cluster's history. Put the URL
    /// in RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR before `ray start`.
    ExportUrl(ExportUrlArgs),
    /// Query the whole history with SQL: DuckDB over the tables `task_attempts`, `jobs`,
    /// `actors`, `nodes`, `workers` and `placement_groups` (docs/tables.md), each attempt and
    /// entity as it is now.
    ///
    /// Reads a local store (--data-dir, AFTERGLOW_DATA_DIR) in place, or copies from the
    /// deployment's bucket (AFTERGLOW_BUCKET) only the tables the query names, for the
    /// sessions --cluster and --session select.
    Sql(SqlArgs),
    /// Publish the tables as Apache Iceberg v2 metadata over the stored files (no copy), for
    /// PyIceberg, DuckDB's iceberg_scan, Spark, Trino and Ray Data's read_iceberg.
    ///
    /// Writes each table's metadata under iceberg/{table}/ in the store (--data-dir,
    /// AFTERGLOW_DATA_DIR, or AFTERGLOW_BUCKET), reflecting every session as its manifest is
    /// now; only sessions that changed since the last publish are written again. Prints each
    /// table's current metadata file. With --glue-database, also points each table of that
    /// Glue database at it, as the deployed catalog function does after every commit.
    Publish(PublishArgs),
    /// Move task logs stored in the older layout (an object per shipped piece, under
    /// logs/{cluster}/{session}/{node}/{file}/) into the segments and index that reads use, so
    /// that they can be read again.
    ///
    /// Works on the store (--data-dir, AFTERGLOW_DATA_DIR, or AFTERGLOW_BUCKET) beside running
    /// functions; a piece is deleted once the node's index names its bytes. Safe to repeat.
    MigrateLogs(MigrateLogsArgs),
}

/// Runs one parsed command line.
pub async fn run(cli: Cli, config: Config) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => crate::serve::run_cli(args, config).await,
        Command::Compact(args) => crate::maintenance::compact(args, config).await,
        Command::Rebuild(args) => crate::maintenance::rebuild(args, config).await,
        Command::Generate(args) => crate::generate::run(args).await,
        Command::Bench(args) => crate::bench::run(args).await,
        Command::Proxy(args) => crate::proxy::run_cli(args, config).await,
        Command::ShipLogs(args) => crate::ship_logs::run_cli(args).await,
        Command::ExportUrl(args) => crate::export_url::run(args, config).await,
        Command::Sql(args) => crate::sql::run(args, config).await,
        Command::Publish(args) => crate::publish::run(args, config).await,
        Command::MigrateLogs(args) => crate::migrate_logs::run(args, config).await,
    }
}
