//! The command line. Each subcommand maps onto one library entry point.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
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

impl Cli {
    /// True for the commands that draw progress bars on stderr.
    pub fn shows_progress(&self) -> bool {
        matches!(
            self.command,
            Command::Generate(_) | Command::Bench(_) | Command::Compact(_) | Command::Rebuild(_)
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
    /// Build with --release. 10 million attempts need about 25 GB of free disk in --dir (or
    /// TMPDIR) while running.
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
    /// and truncated files, new sessions), sends appended bytes with their offsets about every
    /// --interval, resumes after a restart from its state file without re-sending or skipping,
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
}

/// The shape of synthetic traffic.
#[derive(Debug, Clone, clap::Args)]
pub struct SynthArgs {
    /// Task attempts to generate.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub tasks: u64,
    /// Jobs (drivers).
    #[arg(long, value_name = "J", default_value_t = 8)]
    pub jobs: u32,
    /// Nodes, each sending its own bodies.
    #[arg(long, value_name = "K", default_value_t = 16)]
    pub nodes: u32,
    /// Share of tasks whose first attempt fails (some are retried).
    #[arg(long, value_name = "RATE", default_value_t = 0.02)]
    pub failure_rate: f64,
    /// Share of bodies delivered twice.
    #[arg(long, value_name = "RATE", default_value_t = 0.005)]
    pub duplicate_rate: f64,
    /// Also emit TASK_PROFILE_EVENTs (Ray sends them only when asked to).
    #[arg(long)]
    pub profile: bool,
    /// Seed: the same flags and seed give the same bytes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl SynthArgs {
    /// The generator's settings.
    pub fn settings(&self) -> synth::SynthSettings {
        synth::SynthSettings {
            attempts: self.tasks,
            jobs: self.jobs,
            nodes: self.nodes,
            failure_rate: self.failure_rate,
            duplicate_rate: self.duplicate_rate,
            profile: self.profile,
            seed: self.seed,
            ..synth::SynthSettings::default()
        }
    }
}

/// Flags of `afterglow generate`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["out", "post"])))]
pub struct GenerateArgs {
    /// What to generate.
    #[command(flatten)]
    pub synth: SynthArgs,
    /// Write the bodies as files under this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// POST the bodies to this ingest URL, e.g. http://127.0.0.1:8700/v1/events/local.
    #[arg(long, value_name = "URL")]
    pub post: Option<String>,
}

/// Flags of `afterglow bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// What to generate.
    #[command(flatten)]
    pub synth: SynthArgs,
    /// Work directory (kept afterwards); a temporary one (removed) when not given.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Warm repetitions of each route.
    #[arg(long, value_name = "R", default_value_t = 20)]
    pub repeat: usize,
    /// Raw objects per compaction run (the compact function's SQS batch size).
    #[arg(long, value_name = "N", default_value_t = shared::compact::RUN_OBJECTS)]
    pub objects_per_run: usize,
    /// Memory (MiB) compaction keeps between runs for where stored attempts are; 0 makes every
    /// run scan the stored task ids instead, as builds before it did (for comparisons).
    #[arg(long, value_name = "MIB", default_value_t = shared::tables::stored_keys::DEFAULT_BUDGET >> 20)]
    pub stored_keys_mib: u64,
    /// Only time the routes, over the store an earlier run left in --dir.
    #[arg(long, requires = "dir", conflicts_with = "compact_only")]
    pub query_only: bool,
    /// Only time compaction again, over the raw objects an earlier run left in --dir: its
    /// tables are dropped first (as `afterglow rebuild` drops them) and the raw objects read
    /// once (the full run finds them in the page cache), then compacted as the full benchmark
    /// compacts them. Prints the compaction report alone.
    #[arg(long, requires = "dir")]
    pub compact_only: bool,
    /// With --query-only: the session to query (the only one, when not given).
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,
    /// With --query-only: fold the deltas into the base first (`afterglow compact --fold`).
    #[arg(long, requires = "query_only")]
    pub fold: bool,
}

/// Which store a maintenance command works on.
#[derive(Debug, clap::Args)]
pub struct StoreArgs {
    /// A local data directory. Overrides AFTERGLOW_DATA_DIR and AFTERGLOW_BUCKET.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

/// Flags of `afterglow rebuild`.
#[derive(Debug, clap::Args)]
pub struct RebuildArgs {
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Rebuild even when raw objects the tables were built from are gone: the history only
    /// the tables still hold is dropped.
    #[arg(long)]
    pub force: bool,
    /// How many raw objects are compacted per run.
    #[command(flatten)]
    pub runs: RunArgs,
}

/// How `compact` and `rebuild` split their raw objects into runs.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Raw objects per compaction run, as the compact function's batch: a run holds its
    /// objects' attempts in memory until it commits (runs of 1000 bodies of 1000 events
    /// peaked at 0.9 GB, one run of 4000 at 3.3 GB).
    #[arg(long, value_name = "N", default_value_t = run_objects())]
    pub objects_per_run: NonZeroUsize,
}

/// [`shared::compact::RUN_OBJECTS`], which is not zero.
fn run_objects() -> NonZeroUsize {
    NonZeroUsize::new(shared::compact::RUN_OBJECTS).unwrap_or(NonZeroUsize::MIN)
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
    /// Only fold every session's delta files into its base now (compaction also does it on
    /// its own, once a session has gone quiet); no raw object is read.
    #[arg(long, conflicts_with = "keys")]
    pub fold: bool,
    /// How many raw objects are compacted per run.
    #[command(flatten)]
    pub runs: RunArgs,
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
    /// Ray's temporary directory (ray start --temp-dir).
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
    pub interval: std::time::Duration,
    /// Most bytes per request.
    #[arg(long, value_name = "BYTES", default_value_t = 1024 * 1024)]
    pub chunk_bytes: usize,
}

/// `250ms`, `1s`, `2m`, or plain seconds.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, "s"), |at| text.split_at(at));
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 500ms, 1s or 2m"))?;
    match unit {
        "ms" => Ok(std::time::Duration::from_millis(value)),
        "s" => Ok(std::time::Duration::from_secs(value)),
        "m" => Ok(std::time::Duration::from_secs(value.saturating_mul(60))),
        _ => Err(format!(
            "{text:?} is not a duration such as 500ms, 1s or 2m"
        )),
    }
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
    }
}
