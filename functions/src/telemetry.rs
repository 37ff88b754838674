//! Tracing setup: readable lines on a terminal, JSON lines on Lambda (CloudWatch parses them).

use tracing_subscriber::EnvFilter;

/// Targets never logged below debug, whatever `AFTERGLOW_LOG` asks: lambda_runtime logs a whole
/// invocation payload at TRACE when it cannot parse one, and an API Gateway event carries the
/// ingest token in its query string.
const NEVER_TRACED: &str = "lambda_runtime=debug,lambda_http=debug,lambda_runtime_api_client=debug";

/// The filter for `directive` (falling back to `info` when it does not parse) with the caps of
/// [`NEVER_TRACED`] after it, so that they win over a broader level.
fn filter(directive: &str) -> (EnvFilter, Option<tracing_subscriber::filter::ParseError>) {
    match EnvFilter::try_new(format!("{directive},{NEVER_TRACED}")) {
        Ok(filter) => (filter, None),
        Err(err) => (EnvFilter::new(format!("info,{NEVER_TRACED}")), Some(err)),
    }
}

/// Installs the global subscriber. `filter` is an `EnvFilter` directive; a bad one falls back
/// to `info` with a warning rather than failing startup.
pub fn init(directive: &str, json: bool) {
    let (filter, bad_filter) = filter(directive);
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

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::filter;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut buffer) = self.0.lock() {
                buffer.extend_from_slice(bytes);
            }
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn trace_logging_never_prints_lambda_payloads() {
        let captured = Captured::default();
        let writer = captured.clone();
        let (filter, error) = filter("trace");
        assert!(error.is_none());
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::trace!(
                target: "lambda_runtime::layers::api_response",
                "raw payload rawQueryString=token=SECRET"
            );
            tracing::trace!(target: "afterglow::compact", "our own trace line");
        });
        let text = captured
            .0
            .lock()
            .map(|buffer| String::from_utf8_lossy(&buffer).into_owned())
            .unwrap_or_default();
        assert!(text.contains("our own trace line"), "{text}");
        assert!(!text.contains("SECRET"), "{text}");
    }
}
