//! Tracing setup: readable lines on a terminal, JSON lines on Lambda (CloudWatch parses them).

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `filter` is an `EnvFilter` directive; a bad one falls back
/// to `info` with a warning rather than failing startup.
pub fn init(filter: &str, json: bool) {
    let (filter, bad_filter) = match EnvFilter::try_new(filter) {
        Ok(filter) => (filter, None),
        Err(err) => (EnvFilter::new("info"), Some(err)),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = if json {
        builder.json().without_time().try_init()
    } else {
        builder.compact().try_init()
    };
    if installed.is_ok()
        && let Some(err) = bad_filter
    {
        tracing::warn!("AFTERGLOW_LOG is not a valid filter ({err}); logging at info");
    }
}
