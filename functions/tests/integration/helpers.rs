//! The library's small helpers, tested here rather than in the library's own test harness,
//! which would compile the whole library a second time and link one more copy of DuckDB
//! (`test = false` in functions/Cargo.toml).

/// The dashboard page's shell.
mod page {
    use afterglow::page::index;
    use shared::config::GrafanaUrl;

    #[test]
    fn the_page_carries_the_grafana_url_escaped() -> Result<(), &'static str> {
        let url = GrafanaUrl::new("https://grafana.example.com/d/ray?orgId=1&refresh=5s")?;
        let page = index(Some(&url));
        assert!(page.contains(
            r#"<meta name="afterglow-grafana-url" content="https://grafana.example.com/d/ray?orgId=1&amp;refresh=5s">"#
        ));
        assert!(index(None).contains(r#"<meta name="afterglow-grafana-url" content="">"#));
        Ok(())
    }
}

/// `afterglow ship-logs`' target URL.
mod ship_logs {
    use afterglow::ship_logs::logs_url;

    #[test]
    fn the_export_url_becomes_the_logs_url_with_its_token() -> anyhow::Result<()> {
        for (given, expected) in [
            (
                "https://h.example/v1/events/prod?token=s3cret",
                "https://h.example/v1/logs/prod?token=s3cret",
            ),
            (
                "http://127.0.0.1:8700/stage/v1/logs/prod",
                "http://127.0.0.1:8700/stage/v1/logs/prod",
            ),
        ] {
            assert_eq!(logs_url(given)?.as_str(), expected);
        }
        for bad in [
            "https://h.example/v1/tasks/prod?token=s3cret",
            "ftp://h/v1/events/c",
            "not a url",
        ] {
            let err = logs_url(bad).err().map(|err| err.to_string());
            assert!(
                err.as_ref().is_some_and(|err| !err.contains("s3cret")),
                "{bad}: {err:?}"
            );
        }
        Ok(())
    }
}

/// The compact function's reading of Lambda's deadline.
mod compact {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use afterglow::compact::deadline_of;
    use lambda_runtime::Context;

    fn context_with_deadline(deadline: u64) -> Context {
        let mut context = Context::default();
        context.deadline = deadline;
        context
    }

    #[test]
    fn only_a_deadline_ahead_of_arrival_bounds_the_batch() {
        // Tests send none; cargo lambda's emulator sends a relative 600000.
        assert!(deadline_of(&context_with_deadline(0)).is_none());
        assert!(deadline_of(&context_with_deadline(600_000)).is_none());
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(0));
        let deadline = deadline_of(&context_with_deadline(now_ms + 60_000));
        let left = deadline.map(|at| at.saturating_duration_since(tokio::time::Instant::now()));
        assert!(
            left.is_some_and(|left| left > Duration::from_secs(50)),
            "{left:?}"
        );
    }
}

/// The router's header readings.
mod http {
    use afterglow::http::{accepts_gzip, is_loopback_host};
    use axum::http::{HeaderMap, HeaderValue, header};

    #[test]
    fn gzip_is_taken_when_accept_encoding_lists_it_with_a_weight() {
        let takes = |values: &[&str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(
                    header::ACCEPT_ENCODING,
                    HeaderValue::from_str(value).expect("ascii"),
                );
            }
            accepts_gzip(&headers)
        };
        for yes in [
            &["gzip"][..],
            &["gzip, deflate, br"],
            &["br;q=1.0, GZIP;q=0.5"],
            &["x-gzip"],
            &["*"],
            &["deflate", "gzip"],
            &["br, *;q=0.1"],
        ] {
            assert!(takes(yes), "{yes:?}");
        }
        for no in [
            &[][..],
            &["identity"],
            &["deflate, br"],
            &["gzip;q=0"],
            &["gzip;q=0.0, *"],
            &["*;q=0"],
            &[""],
        ] {
            assert!(!takes(no), "{no:?}");
        }
    }

    #[test]
    fn only_loopback_names_pass() {
        for host in [
            "localhost",
            "LOCALHOST:8700",
            "127.0.0.1",
            "127.0.0.1:8700",
            "127.1.2.3:1",
            "[::1]",
            "[::1]:8700",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8700",
            "localhost.evil.example",
            "10.0.0.1:8700",
            "[::2]:8700",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}

/// What logging never prints.
mod telemetry {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use afterglow::telemetry::filter;

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
