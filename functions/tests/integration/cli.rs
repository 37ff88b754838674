//! The real `afterglow` binary, as a user runs it: help, configuration errors, and `serve`
//! taking Ray's bodies on the URL it prints.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use afterglow_tests::ray::check;
use afterglow_tests::{
    FixtureRun, cluster_token, manifest_commits, raw_events, store_raw, stored_raw_lines,
    stored_task_rows,
};
use anyhow::{Context as _, ensure};
use shared::storage::{LocalDirStorage, Storage};

/// The binary with a clean Afterglow environment.
fn afterglow() -> anyhow::Result<Command> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_afterglow"));
    for variable in [
        "AFTERGLOW_BUCKET",
        "AFTERGLOW_INGEST_TOKEN",
        "AFTERGLOW_INGEST_SECRET",
        "AFTERGLOW_INGEST_SECRET_ARN",
        "AFTERGLOW_QUERY_TOKEN",
        "AFTERGLOW_DATA_DIR",
        "AWS_LAMBDA_RUNTIME_API",
        "_HANDLER",
    ] {
        command.env_remove(variable);
    }
    Ok(command)
}

#[test]
fn help_lists_the_commands_and_flags() -> anyhow::Result<()> {
    let output = afterglow()?.arg("--help").output()?;
    ensure!(output.status.success());
    let text = String::from_utf8(output.stdout)?;
    ensure!(text.contains("serve"), "{text}");
    let output = afterglow()?.args(["serve", "--help"]).output()?;
    ensure!(output.status.success());
    let text = String::from_utf8(output.stdout)?;
    for flag in ["--data-dir", "--addr", "--cluster"] {
        ensure!(text.contains(flag), "serve --help lacks {flag}: {text}");
    }
    // The shipper's URL may come from Ray's own variable; help never prints its value (the
    // token is in it).
    let output = afterglow()?
        .args(["ship-logs", "--help"])
        .env(
            "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR",
            "http://h/v1/events/c?token=do-not-print-me",
        )
        .output()?;
    ensure!(output.status.success());
    let text = String::from_utf8(output.stdout)?;
    for flag in [
        "--to",
        "--ray-dir",
        "--node-id",
        "--state-file",
        "--interval",
    ] {
        ensure!(text.contains(flag), "ship-logs --help lacks {flag}: {text}");
    }
    ensure!(!text.contains("do-not-print-me"), "{text}");
    Ok(())
}

/// `bench --sessions` builds a history of several clusters and reports every probe, each cold
/// one having copied its sessions' files into the query cache as the query function copies
/// them from S3.
#[test]
fn bench_over_the_history_reports_what_each_read_copied() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let output = afterglow()?
        .args([
            "bench",
            "--sessions",
            "3",
            "--clusters",
            "2",
            "--tasks",
            "300",
        ])
        .args(["--repeat", "1", "--dir"])
        .arg(dir.path())
        .output()?;
    ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    ensure!(
        report["sessions"] == 3 && report["clusters"] == 2,
        "{report}"
    );
    let probes = report["probes"].as_array().context("probes")?;
    // Three routes cluster-wide and fleet-wide, and the counts over two time ranges.
    ensure!(probes.len() == 10, "{report}");
    for probe in probes {
        ensure!(
            probe["refused"].is_null()
                && probe["warm"]["n"] == 1
                && probe["copied_bytes"]
                    .as_u64()
                    .is_some_and(|bytes| bytes > 0),
            "{probe}"
        );
    }
    Ok(())
}

/// `AFTERGLOW_LOG_SPANS=true` logs each span the filter lets through as it closes, with its
/// times; without it no span is logged, and a value that is not a flag is named in the error.
#[test]
fn spans_are_logged_with_their_times_when_asked() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let sql = |spans: &str| {
        afterglow()?
            .args(["sql", "SELECT 1 AS one", "--data-dir"])
            .arg(dir.path())
            .env("AFTERGLOW_LOG", "info")
            .env("AFTERGLOW_LOG_SPANS", spans)
            .output()
            .map_err(anyhow::Error::from)
    };
    let logged = |output: &std::process::Output| {
        let text = String::from_utf8_lossy(&output.stderr);
        text.lines()
            .any(|line| line.contains("ad_hoc_sql") && line.contains("time.busy"))
    };
    let with = sql("true")?;
    ensure!(
        with.status.success() && logged(&with),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    let without = sql("false")?;
    ensure!(
        without.status.success() && !logged(&without),
        "{}",
        String::from_utf8_lossy(&without.stderr)
    );
    let bad = sql("lots")?;
    ensure!(bad.status.code() == Some(2));
    let text = String::from_utf8(bad.stderr)?;
    ensure!(text.contains("AFTERGLOW_LOG_SPANS=lots"), "{text}");
    Ok(())
}

#[test]
fn a_bad_variable_is_named_in_the_error() -> anyhow::Result<()> {
    let output = afterglow()?
        .args(["serve", "--addr", "127.0.0.1:0"])
        .env("AFTERGLOW_MAX_BODY_BYTES", "lots")
        .output()?;
    ensure!(output.status.code() == Some(2));
    let text = String::from_utf8(output.stderr)?;
    ensure!(text.contains("AFTERGLOW_MAX_BODY_BYTES=lots"), "{text}");
    Ok(())
}

#[test]
fn an_unknown_lambda_handler_is_named_with_the_allowed_values() -> anyhow::Result<()> {
    let output = afterglow()?
        .env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9")
        .env("_HANDLER", "bootstrap")
        .output()?;
    ensure!(output.status.code() == Some(2));
    let text = String::from_utf8(output.stderr)?;
    ensure!(
        text.contains("_HANDLER=bootstrap") && text.contains("ingest"),
        "{text}"
    );
    Ok(())
}

#[test]
fn open_ingest_refuses_a_non_loopback_address() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let output = afterglow()?
        .args(["serve", "--addr", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .output()?;
    ensure!(!output.status.success());
    let text = String::from_utf8(output.stderr)?;
    ensure!(text.contains("AFTERGLOW_INGEST_SECRET"), "{text}");
    Ok(())
}

#[test]
fn export_url_prints_the_clusters_own_token() -> anyhow::Result<()> {
    const SECRET: &str = "export-url-secret-0123456789";
    let output = afterglow()?
        .args(["export-url", "--cluster", "team-a", "--endpoint"])
        .arg("https://ingest.example.com/")
        .env("AFTERGLOW_INGEST_SECRET", SECRET)
        .output()?;
    ensure!(output.status.success(), "{output:?}");
    let expected = format!(
        "https://ingest.example.com/v1/events/team-a?token={}\n",
        cluster_token(SECRET, "team-a")
    );
    ensure!(
        String::from_utf8(output.stdout)? == expected,
        "not {expected}"
    );

    // A deployment still configured the old way is told what changed.
    let output = afterglow()?
        .args(["export-url", "--cluster", "team-a"])
        .env("AFTERGLOW_INGEST_TOKEN", SECRET)
        .output()?;
    ensure!(!output.status.success());
    let text = String::from_utf8(output.stderr)?;
    ensure!(
        text.contains("AFTERGLOW_INGEST_SECRET") && !text.contains(SECRET),
        "{text}"
    );
    Ok(())
}

/// Stops the child process when the test ends, however it ends: Ctrl-C first (a graceful
/// shutdown that removes its scratch files), a kill if it does not exit.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let interrupted = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status()
            .is_ok_and(|status| status.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        while interrupted && Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn serve_prints_the_ray_settings_stores_what_ray_posts_and_answers_queries()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut child = Running(
        afterglow()?
            .args([
                "serve",
                "--addr",
                "127.0.0.1:0",
                "--cluster",
                "laptop",
                "--data-dir",
            ])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let stdout = child.0.stdout.take().context("stdout")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut printed = Vec::new();
    let mut export_url = None;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        printed.push(line.clone());
        if let Some(value) = line
            .trim()
            .strip_prefix("export RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR=")
        {
            export_url = Some(value.trim_matches('"').to_owned());
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "no export line in time: {printed:?}"
        );
    }
    let export_url = export_url.with_context(|| format!("no export line in {printed:?}"))?;
    for variable in [
        "RAY_enable_core_worker_ray_event_to_aggregator=1",
        "RAY_enable_ray_event=1",
        "RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES=ALL",
    ] {
        ensure!(
            printed.iter().any(|line| line.contains(variable)),
            "{variable} not printed: {printed:?}"
        );
    }
    ensure!(export_url.ends_with("/v1/events/laptop"), "{export_url}");

    let run = FixtureRun::named("edge-cases")?;
    let mut sent = Vec::new();
    let client = reqwest::Client::new();
    for request in run.requests()? {
        let response = client
            .post(&export_url)
            .header("content-type", "application/json")
            .body(request.body.clone())
            .send()
            .await?;
        ensure!(
            response.status() == 200,
            "#{}: {}",
            request.seq,
            response.status()
        );
        sent.extend(raw_events(&request.body)?);
    }
    let storage = LocalDirStorage::open(dir.path())?;
    let mut stored = stored_raw_lines(&storage, "raw/laptop/").await?;
    stored.sort();
    sent.sort();
    ensure!(
        stored == sent,
        "stored {} events, sent {}",
        stored.len(),
        sent.len()
    );

    // The same process answers the dashboard API over what it compacted: the same attempts
    // Ray listed for this run.
    let base = export_url
        .split("/v1/events/")
        .next()
        .context("base URL")?
        .to_owned();
    let expected = run
        .ground_truth("tasks.json")?
        .as_array()
        .map_or(0, Vec::len) as u64;
    let mut total = 0;
    while Instant::now() < deadline && total != expected {
        let text = client
            .get(format!("{base}/api/summary?cluster=laptop"))
            .send()
            .await?
            .text()
            .await?;
        let summary: serde_json::Value = serde_json::from_str(&text)?;
        total = summary["total"].as_u64().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        total == expected,
        "summary shows {total} of {expected} attempts"
    );
    drop(child);
    Ok(())
}

/// `rebuild` compacts the store in runs of `--objects-per-run` raw objects, as the compact
/// function's batches take them: a run holds its objects' attempts in memory, and one run over
/// a whole large store would not fit. The history equals Ray's. A raw object that cannot be
/// read is named and every other one compacted, and the command fails, rather than failing
/// the whole store's run without a report.
#[tokio::test]
async fn rebuild_compacts_in_bounded_runs_and_names_an_unreadable_object() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let dir = tempfile::tempdir()?;
    let storage: Arc<dyn Storage> = Arc::new(LocalDirStorage::open(dir.path())?);
    store_raw(&storage, &run, &run.name).await?;
    let raw = shared::raw::list::list_keys(&*storage).await?;
    let per_run = 4;
    ensure!(raw.len() > 2 * per_run, "only {} raw objects", raw.len());
    let rebuild = || -> anyhow::Result<std::process::Output> {
        Ok(afterglow()?
            .args(["rebuild", "--objects-per-run", &per_run.to_string()])
            .arg("--data-dir")
            .arg(dir.path())
            .output()?)
    };

    let output = rebuild()?;
    ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    check(
        &run,
        &stored_task_rows(&*storage, &run.name).await?,
        "rebuilt in runs",
    )?;
    // Each run commits.
    let commits = manifest_commits(&*storage, &run.name).await?;
    let runs = raw.len().div_ceil(per_run) as u64;
    ensure!(
        commits >= runs,
        "{commits} commits for {} raw objects in runs of {per_run}",
        raw.len()
    );

    let bad = raw.get(raw.len() / 2).context("a raw object")?.clone();
    std::fs::write(dir.path().join(bad.as_str()), b"not gzip")?;
    let output = rebuild()?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    ensure!(
        !output.status.success(),
        "a rebuild that left out an object succeeded: {stdout}"
    );
    ensure!(stderr.contains(bad.as_str()), "{bad} not named: {stderr}");
    let read = format!("{} raw objects read", raw.len() - 1);
    ensure!(stdout.contains(&read), "{stdout}\n{stderr}");
    ensure!(
        !stored_task_rows(&*storage, &run.name).await?.is_empty(),
        "nothing was compacted"
    );
    Ok(())
}

/// `afterglow rebuild` leaves a session folded into one base, as the quiet check of its last
/// commit would. A session above the fold policy's `small_session_rows` is not folded at every
/// run, so its last runs leave deltas that every read opens; `serve` and the compact function
/// fold them once the session goes quiet, but a command has no later: a rebuilt store would
/// keep them until the next compaction.
#[tokio::test]
async fn rebuild_leaves_a_large_session_in_one_base() -> anyhow::Result<()> {
    use shared::compact::CompactSettings;
    use shared::ingest::{IngestAccess, IngestLimits, Ingestor};
    use shared::keys::{ClusterName, SessionName, manifest_key};
    use shared::tables::manifest::{self, TableFiles};

    let dir = tempfile::tempdir()?;
    let storage: Arc<dyn Storage> = Arc::new(LocalDirStorage::open(dir.path())?);
    let cluster = ClusterName::new("large")?;
    let jobs = 2;
    let settings = synth::SynthSettings {
        attempts: 60_000,
        jobs,
        nodes: 2,
        batch_events: 500,
        ..synth::SynthSettings::default()
    };
    let small = CompactSettings::default().fold.small_session_rows;
    ensure!(
        settings.attempts > small,
        "a session of {small} rows is folded at every run"
    );
    let ingestor = Ingestor::new(
        Arc::clone(&storage),
        IngestAccess::Open,
        IngestLimits::default(),
    );
    let mut generator = synth::Generator::new(settings);
    for body in generator.by_ref() {
        ingestor.ingest(&cluster, &body?.json).await?;
    }
    let truth = generator.truth().clone();
    let manifest = manifest_key(&cluster, &SessionName::new(&truth.session_name)?)?;
    let attempts = || async {
        anyhow::Ok(
            manifest::load(&*storage, &manifest)
                .await?
                .manifest
                .task_attempts,
        )
    };
    let raw = shared::raw::list::list_keys(&*storage).await?;
    let per_run = std::num::NonZeroUsize::new(raw.len() / 8).context("too few raw objects")?;

    // The runs alone, as the command runs them, leave deltas.
    let (compactor, _scratch) =
        afterglow_tests::compactor(Arc::clone(&storage), CompactSettings::default())?;
    let in_runs = compactor.compact_in_runs(&raw, per_run, |_| ()).await;
    ensure!(in_runs.not_compacted().is_empty(), "{in_runs:?}");
    let TableFiles { deltas, .. } = attempts().await?;
    ensure!(!deltas.is_empty(), "the runs left no delta to fold");

    let output = afterglow()?
        .args(["rebuild", "--objects-per-run", &per_run.to_string()])
        .arg("--data-dir")
        .arg(dir.path())
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        stdout.contains("sessions in one base: 1 (1 folded now)"),
        "{stdout}"
    );
    let TableFiles { base, deltas } = attempts().await?;
    ensure!(deltas.is_empty(), "{} deltas left: {stdout}", deltas.len());
    // Each job's driver has a row too: Ray exports it, its state API hides it.
    let rows: u64 = base.iter().map(|file| file.rows).sum();
    let expected = truth.attempts + u64::from(jobs);
    ensure!(
        rows == expected,
        "{rows} rows in the base for {} attempts and {jobs} drivers generated",
        truth.attempts
    );
    Ok(())
}

/// Secrets never reach the logs, even at the most verbose level: the cluster's ingest token
/// travels in the query string of every Ray POST, the query token in every dashboard request.
/// A cluster's token writes only that cluster's history.
#[tokio::test]
async fn secrets_never_appear_in_the_logs() -> anyhow::Result<()> {
    const INGEST_SECRET: &str = "ingest-secret-7f3a9c1e5b";
    const QUERY_TOKEN: &str = "query-secret-2d8e6b4a0c";
    let dir = tempfile::tempdir()?;
    let log_path = dir.path().join("serve.log");
    let log = std::fs::File::create(&log_path)?;
    let child = Running(
        afterglow()?
            .args([
                "serve",
                "--addr",
                "127.0.0.1:0",
                "--cluster",
                "secretive",
                "--data-dir",
            ])
            .arg(dir.path().join("data"))
            .env("AFTERGLOW_INGEST_SECRET", INGEST_SECRET)
            .env("AFTERGLOW_QUERY_TOKEN", QUERY_TOKEN)
            .env("AFTERGLOW_LOG", "trace")
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()?,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let base = loop {
        let text = std::fs::read_to_string(&log_path)?;
        if let Some(rest) = text.split("Afterglow listening on ").nth(1)
            && let Some(url) = rest.split_whitespace().next()
        {
            break url.to_owned();
        }
        ensure!(
            Instant::now() < deadline,
            "serve printed no address: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let client = reqwest::Client::new();
    let body = FixtureRun::named("edge-cases")?
        .requests()?
        .into_iter()
        .next()
        .context("a body")?
        .body;
    let token = cluster_token(INGEST_SECRET, "secretive");
    for (cluster, token, expected) in [
        ("secretive", token.as_str(), 200),
        // Another cluster's URL with this cluster's token: refused.
        ("other", token.as_str(), 403),
        // The secret itself is not a token.
        ("secretive", INGEST_SECRET, 403),
        ("secretive", "wrong-secret-0123456789", 403),
    ] {
        let status = client
            .post(format!("{base}/v1/events/{cluster}?token={token}"))
            .body(body.clone())
            .send()
            .await?
            .status();
        ensure!(status == expected, "ingest to {cluster}: {status}");
    }
    for (authorization, expected) in [
        (format!("Bearer {QUERY_TOKEN}"), 200),
        ("Bearer wrong-secret-0123456789".to_owned(), 403),
    ] {
        let status = client
            .get(format!("{base}/api/summary"))
            .header("authorization", authorization)
            .send()
            .await?
            .status();
        ensure!(status == expected, "query: {status}");
    }
    drop(child);
    let text = std::fs::read_to_string(&log_path)?;
    ensure!(
        text.contains("request"),
        "the log shows no requests at all:\n{text}"
    );
    for secret in [INGEST_SECRET, token.as_str(), QUERY_TOKEN] {
        ensure!(
            !text.contains(secret),
            "the log contains a secret:\n{}",
            text.lines()
                .filter(|line| line.contains(secret))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    Ok(())
}
