//! `afterglow-ship-logs`: the log shipper alone, for installing on Ray nodes (see [`ship_logs`]).

use std::process::ExitCode;

use clap::Parser as _;

/// Send this node's Ray logs to Afterglow as they are written: start it next to `ray start` on
/// every node (the same command as `afterglow ship-logs`).
///
/// Follows every session under --ray-dir (new files, files Ray moves to logs/old/, rotated and
/// truncated files, new sessions), sends what every file appended in one request about every
/// --interval (nothing when nothing was written), resumes after a restart from its state file without re-sending or skipping, and
/// retries with backoff while the endpoint is down. A crashed node loses at most the last
/// interval. AFTERGLOW_LOG sets the log filter (`info` by default).
#[derive(Debug, clap::Parser)]
#[command(name = "afterglow-ship-logs", version)]
struct Cli {
    #[command(flatten)]
    args: ship_logs::cli::ShipLogsArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let directive = std::env::var("AFTERGLOW_LOG").unwrap_or_else(|_| "info".to_owned());
    let (filter, bad_filter) = match tracing_subscriber::EnvFilter::try_new(&directive) {
        Ok(filter) => (filter, None),
        Err(err) => (tracing_subscriber::EnvFilter::new("info"), Some(err)),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .compact()
        .init();
    if let Some(err) = bad_filter {
        tracing::warn!("AFTERGLOW_LOG is not a valid filter ({err}); logging at info");
    }
    // One thread is plenty to tail files and send one request at a time.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("afterglow-ship-logs: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(ship_logs::cli::run_cli(cli.args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("afterglow-ship-logs: {err:#}");
            ExitCode::FAILURE
        }
    }
}
