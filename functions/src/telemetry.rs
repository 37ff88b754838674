//! Tracing setup: readable lines on a terminal, JSON lines on Lambda (CloudWatch parses them).

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

/// Targets never logged below debug, whatever `AFTERGLOW_LOG` asks: lambda_runtime logs a whole
/// invocation payload at TRACE when it cannot parse one, and an API Gateway event carries the
/// ingest token in its query string.
const NEVER_TRACED: &str = "lambda_runtime=debug,lambda_http=debug,lambda_runtime_api_client=debug";

/// The filter for `directive` (falling back to `info` when it does not parse) with the caps of
/// `NEVER_TRACED` after it, so that they win over a broader level.
pub fn filter(directive: &str) -> (EnvFilter, Option<tracing_subscriber::filter::ParseError>) {
    match EnvFilter::try_new(format!("{directive},{NEVER_TRACED}")) {
        Ok(filter) => (filter, None),
        Err(err) => (EnvFilter::new(format!("info,{NEVER_TRACED}")), Some(err)),
    }
}

/// Installs the global subscriber. `filter` is an `EnvFilter` directive; a bad one falls back
/// to `info` with a warning rather than failing startup. With `spans`, each span is also
/// logged as it closes, with its busy and idle time.
pub fn init(directive: &str, spans: bool, json: bool) {
    let (filter, bad_filter) = filter(directive);
    let span_events = if spans { FmtSpan::CLOSE } else { FmtSpan::NONE };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(span_events)
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
