//! The `afterglow` binary: a Lambda function when Lambda starts it, a CLI otherwise.

use std::process::ExitCode;

use clap::Parser as _;
use shared::config::Config;

/// jemalloc, for Rust and (unprefixed) for DuckDB's C++ alike, configured as DuckDB's own builds
/// configure theirs (`.cargo/config.toml`). With glibc's malloc, DuckDB trims every arena
/// whenever a connection closes or a worker idles, and compaction faults the pages back in;
/// jemalloc frees a run's events faster and keeps a query's peak memory lower
/// (docs/performance.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let config = Config::from_env();
    // Outside Lambda, parse flags before reporting configuration errors so `--help` always works.
    let cli = (!shared::config::running_in_lambda()).then(afterglow::cli::Cli::parse);
    let config = match config {
        Ok(config) => config,
        Err(err) => {
            eprintln!("afterglow: configuration error: {err}");
            return ExitCode::from(2);
        }
    };
    let lambda = config.lambda;
    // Commands that report what they do themselves log only warnings unless asked.
    let quiet = cli
        .as_ref()
        .is_some_and(afterglow::cli::Cli::reports_itself);
    let filter = config
        .log_filter
        .as_deref()
        .unwrap_or(if quiet { "warn" } else { "info" });
    afterglow::telemetry::init(filter, config.log_spans, lambda.is_some());

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("afterglow: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = match (lambda, cli) {
        (Some(function), _) => runtime.block_on(afterglow::lambda::run(function, config)),
        (None, Some(cli)) => runtime.block_on(afterglow::cli::run(cli, config)),
        (None, None) => Ok(()),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("afterglow: {err:#}");
            ExitCode::FAILURE
        }
    }
}
