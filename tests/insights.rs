//! `/api/insights` over real Ray runs: every finding lists exactly its attempts, and on a run
//! that planted one of each problem (`fixtures/ray-2.60/known-problems`, made by
//! `workloads/capture.py` with `workload_insights.py` on two nodes, one of which was killed),
//! each detector finds exactly the attempts Ray's own list shows with that problem.

use std::collections::{BTreeMap, BTreeSet};

use afterglow_tests::FixtureRun;
use afterglow_tests::api::{Api, percent_encoded, serve_locally};
use afterglow_tests::ray::{LOSSY_RUN, ray_millis};
use anyhow::{Context as _, ensure};
use serde_json::Value as Json;
use shared::tables::rollup::{round_up, rounding_bound};

/// A task attempt: its id and attempt number.
type AttemptKey = (String, i64);

/// One attempt of Ray's own list, with the fields the detectors read.
struct RayAttempt {
    key: AttemptKey,
    function: String,
    state: String,
    error_type: Option<String>,
    node_id: Option<String>,
    created_ms: i64,
    started_ms: Option<i64>,
    ended_ms: Option<i64>,
}

impl RayAttempt {
    fn ran_ms(&self) -> Option<i64> {
        Some(self.ended_ms? - self.started_ms?)
    }

    fn waited_ms(&self) -> Option<i64> {
        Some(self.started_ms? - self.created_ms)
    }
}

/// Ray's `ray list tasks --detail` for `run`.
fn ray_attempts(run: &FixtureRun) -> anyhow::Result<Vec<RayAttempt>> {
    let millis = |row: &Json, field: &str| -> anyhow::Result<Option<i64>> {
        row[field]
            .as_str()
            .map(|text| Ok(ray_millis(text)?.parse::<i64>()?))
            .transpose()
    };
    let text = |row: &Json, field: &str| row[field].as_str().map(str::to_owned);
    run.ground_truth("tasks.json")?
        .as_array()
        .context("tasks.json")?
        .iter()
        .map(|row| {
            Ok(RayAttempt {
                key: (
                    text(row, "task_id").context("task_id")?,
                    row["attempt_number"].as_i64().context("attempt_number")?,
                ),
                function: text(row, "func_or_class_name").context("func_or_class_name")?,
                state: text(row, "state").context("state")?,
                error_type: text(row, "error_type"),
                node_id: text(row, "node_id"),
                created_ms: millis(row, "creation_time_ms")?.context("creation_time_ms")?,
                started_ms: millis(row, "start_time_ms")?,
                ended_ms: millis(row, "end_time_ms")?,
            })
        })
        .collect()
}

/// The attempts a finding's `filter` lists through `/api/tasks`.
async fn listed(api: &Api, finding: &Json) -> anyhow::Result<BTreeSet<AttemptKey>> {
    let query: Vec<String> = finding["filter"]
        .as_object()
        .context("filter")?
        .iter()
        .map(|(name, value)| format!("{name}={}", percent_encoded(value.as_str().unwrap_or(""))))
        .collect();
    let rows = api
        .all_pages("/api/tasks", &query.join("&"), "tasks")
        .await?;
    rows.iter()
        .map(|row| {
            Ok((
                row["task_id"].as_str().context("task_id")?.to_owned(),
                row["attempt_number"].as_i64().context("attempt_number")?,
            ))
        })
        .collect()
}

/// The lower median (as DuckDB's `quantile_disc(…, 0.5)` picks it), rounded up to two
/// significant digits as insights report it.
fn median(mut values: Vec<i64>) -> anyhow::Result<i64> {
    values.sort_unstable();
    values
        .get((values.len().max(1) - 1) / 2)
        .map(|median| round_up(*median))
        .context("no values")
}

/// Where insights start counting a measure `factor` times `median` and `extra` above it:
/// the first value at or above both at which rounded values split.
fn threshold(median: i64, factor: i64, extra: i64) -> i64 {
    rounding_bound((factor * median).max(median + extra))
}

/// Failed attempts in Ray's list whose error message contains `text`.
fn ray_failed_with(truth: &Json, text: &str) -> u64 {
    truth
        .as_array()
        .into_iter()
        .flatten()
        .filter(|task| {
            task["state"] == "FAILED"
                && task["error_message"]
                    .as_str()
                    .is_some_and(|message| message.contains(text))
        })
        .count() as u64
}

/// On every captured run, each finding's `filter`, sent to `/api/tasks`, lists exactly its
/// `count` attempts, and the failure clusters add up to the failed attempts in Ray's own list
/// (each failed attempt in one cluster).
#[tokio::test]
async fn every_insight_lists_exactly_its_attempts() -> anyhow::Result<()> {
    let runs = FixtureRun::all()?;
    let (served, api) = serve_locally(&runs).await?;
    let mut checked = 0;
    for run in &runs {
        let answer = api
            .ok(&format!("/api/insights?cluster={}", run.name))
            .await?;
        let findings = answer["findings"].as_array().context("findings")?;
        for finding in findings {
            let count = finding["count"].as_u64().context("count")?;
            let listed = listed(&api, finding).await?.len() as u64;
            ensure!(
                listed == count,
                "{}: {} lists {listed} attempts, its count is {count}",
                run.name,
                finding["title"],
            );
            checked += 1;
        }
        let clusters: Vec<&Json> = findings
            .iter()
            .filter(|finding| finding["kind"] == "failure_cluster")
            .collect();
        let clustered: u64 = clusters
            .iter()
            .filter_map(|finding| finding["count"].as_u64())
            .sum();
        let truth = run.ground_truth("tasks.json")?;
        let failed = truth
            .as_array()
            .context("tasks.json")?
            .iter()
            .filter(|task| task["state"] == "FAILED" && !task["error_type"].is_null())
            .count() as u64;
        if run.name == "basic-workload" {
            // Ten ValueErrors whose messages differ only in a number are one cluster.
            let numbered = ray_failed_with(&truth, "intentional failure number");
            ensure!(
                clusters
                    .iter()
                    .any(|finding| finding["count"].as_u64() == Some(numbered)
                        && finding["example"]
                            .as_str()
                            .is_some_and(|text| text.contains("intentional failure number"))),
                "no one cluster holds the {numbered} numbered ValueErrors: {findings:?}"
            );
            ensure!(numbered >= 2, "the run has {numbered} numbered failures");
            // A healthy run otherwise: one retry that then succeeded is no storm, one node and
            // its workers no hot spot, nothing waited.
            let kinds: BTreeSet<&str> = findings
                .iter()
                .filter_map(|finding| finding["kind"].as_str())
                .collect();
            ensure!(
                kinds.is_subset(&BTreeSet::from(["failure_cluster", "straggler"])),
                "basic-workload: false findings {kinds:?}"
            );
        }
        if run.name != LOSSY_RUN && clusters.len() < 10 {
            ensure!(
                clustered == failed,
                "{}: failure clusters hold {clustered} attempts, Ray lists {failed} failed",
                run.name
            );
        }
    }
    ensure!(checked > 0, "no run had a finding to check");
    served.server.stop().await
}

/// The keys of the attempts `keep` selects.
fn keys_where<'a>(
    attempts: impl IntoIterator<Item = &'a RayAttempt>,
    keep: impl Fn(&RayAttempt) -> bool,
) -> BTreeSet<AttemptKey> {
    attempts
        .into_iter()
        .filter(|attempt| keep(attempt))
        .map(|attempt| attempt.key.clone())
        .collect()
}

/// The task ids among `attempts`.
fn tasks_of(attempts: &BTreeSet<AttemptKey>) -> BTreeSet<String> {
    attempts.iter().map(|(task, _)| task.clone()).collect()
}

/// The findings of one kind.
fn of_kind<'a>(findings: &'a [Json], kind: &str) -> Vec<&'a Json> {
    findings
        .iter()
        .filter(|finding| finding["kind"] == kind)
        .collect()
}

/// Each detector, on a real two-node run where the answer is known: Ray's own list decides
/// which attempts have each problem, and each finding lists exactly those.
#[tokio::test]
async fn each_detector_finds_the_problem_planted_in_a_real_run() -> anyhow::Result<()> {
    let run = FixtureRun::named("known-problems")?;
    let ray = ray_attempts(&run)?;
    let planted =
        serde_json::from_str::<Json>(&std::fs::read_to_string(run.dir.join("workload-ids.json"))?)?;
    let planted_tasks = |field: &str| -> anyhow::Result<BTreeSet<String>> {
        planted[field]
            .as_array()
            .with_context(|| format!("workload-ids.json: {field}"))?
            .iter()
            .map(|id| id.as_str().map(str::to_owned).context("a task id"))
            .collect()
    };
    let (served, api) = serve_locally(std::slice::from_ref(&run)).await?;
    let answer = api.ok("/api/insights?cluster=known-problems").await?;
    let findings = answer["findings"].as_array().context("findings")?;
    let kinds: BTreeMap<&str, usize> = findings.iter().fold(BTreeMap::new(), |mut kinds, f| {
        *kinds.entry(f["kind"].as_str().unwrap_or("?")).or_default() += 1;
        kinds
    });
    // Two failure clusters (flaky's exception, the dead node), one straggler function, a storm
    // and its exhausted retries, one scheduling wait, the dead node: nothing else.
    let expected_kinds = BTreeMap::from([
        ("failure_cluster", 2),
        ("straggler", 1),
        ("retry_storm", 2),
        ("scheduling_wait", 1),
        ("hot_spot", 1),
    ]);
    ensure!(
        kinds == expected_kinds,
        "findings {kinds:?}, expected {expected_kinds:?}: {findings:#?}"
    );

    // Stragglers: `steady` attempts that ran 3x the median and 1 s longer (rounded as
    // insights round), by Ray's times; the two planted 3 s calls among them.
    let steady: Vec<&RayAttempt> = ray.iter().filter(|a| a.function == "steady").collect();
    let p50 = median(steady.iter().filter_map(|a| a.ran_ms()).collect())?;
    let slow = keys_where(steady.iter().copied(), |a| {
        a.ran_ms()
            .is_some_and(|ran| ran >= threshold(p50, 3, 1_000))
    });
    let planted_slow = steady
        .iter()
        .filter(|a| a.ran_ms().is_some_and(|ran| ran >= 2_900))
        .count();
    ensure!(
        planted_slow == 2,
        "Ray shows {planted_slow} 3 s steady calls"
    );
    let straggler = of_kind(findings, "straggler")[0];
    ensure!(straggler["func_or_class_name"] == "steady", "{straggler}");
    ensure!(
        listed(&api, straggler).await? == slow,
        "stragglers: {straggler}"
    );

    // Retry storm: flaky's retries; exhausted: each flaky task's last attempt (all four failed).
    let storms = of_kind(findings, "retry_storm");
    let (exhausted, mostly): (Vec<&Json>, Vec<&Json>) = storms
        .into_iter()
        .partition(|finding| finding["retries_exhausted"] == true);
    let retries = keys_where(&ray, |a| a.function == "flaky" && a.key.1 >= 1);
    ensure!(
        retries.len() == 12,
        "Ray lists {} flaky retries",
        retries.len()
    );
    ensure!(
        listed(&api, mostly[0]).await? == retries,
        "storm: {}",
        mostly[0]
    );
    let mut last: BTreeMap<&str, &RayAttempt> = BTreeMap::new();
    for attempt in ray.iter().filter(|a| a.function == "flaky") {
        let latest = last.entry(&attempt.key.0).or_insert(attempt);
        if attempt.key.1 > latest.key.1 {
            *latest = attempt;
        }
    }
    let gave_up: BTreeSet<AttemptKey> = last
        .values()
        .filter(|a| a.state == "FAILED")
        .map(|a| a.key.clone())
        .collect();
    ensure!(
        tasks_of(&gave_up) == planted_tasks("retried_to_limit")?,
        "Ray's failed last attempts are not the planted tasks"
    );
    ensure!(
        listed(&api, exhausted[0]).await? == gave_up,
        "exhausted: {}",
        exhausted[0]
    );

    // Scheduling wait: attempts that waited 5x the job's median and 10 s longer, by Ray's
    // times: the three `queued` calls made while `hog` held every CPU.
    let waits = median(ray.iter().filter_map(RayAttempt::waited_ms).collect())?;
    let waited = keys_where(&ray, |a| {
        a.waited_ms()
            .is_some_and(|wait| wait >= threshold(waits, 5, 10_000))
    });
    ensure!(
        tasks_of(&waited) == planted_tasks("waited")?,
        "Ray's long waits are not the planted `queued` calls"
    );
    let wait = of_kind(findings, "scheduling_wait")[0];
    ensure!(listed(&api, wait).await? == waited, "waits: {wait}");

    // Hot spot: the node Ray lists as DEAD, with every attempt that failed because it died
    // (`flaky` also raised its own exception there: that is no system failure).
    let nodes = run.ground_truth("nodes.json")?;
    let dead: Vec<&str> = nodes
        .as_array()
        .context("nodes.json")?
        .iter()
        .filter(|node| node["state"] == "DEAD")
        .filter_map(|node| node["node_id"].as_str())
        .collect();
    ensure!(dead.len() == 1, "Ray lists dead nodes {dead:?}");
    let died = keys_where(&ray, |a| {
        a.state == "FAILED"
            && a.node_id.as_deref() == Some(dead[0])
            && a.error_type.as_deref() != Some("TASK_EXECUTION_EXCEPTION")
    });
    let error_types: BTreeSet<Option<&str>> = ray
        .iter()
        .filter(|a| died.contains(&a.key))
        .map(|a| a.error_type.as_deref())
        .collect();
    ensure!(
        died.iter()
            .map(|(task, _)| task.clone())
            .collect::<BTreeSet<_>>()
            == planted_tasks("doomed")?,
        "the attempts that failed on the dead node are not the planted `doomed` calls"
    );
    let hot = of_kind(findings, "hot_spot")[0];
    ensure!(
        hot["node_id"] == dead[0] && error_types == BTreeSet::from([hot["error_type"].as_str()]),
        "hot spot {hot}, Ray: node {} with {error_types:?}",
        dead[0]
    );
    ensure!(listed(&api, hot).await? == died, "hot spot: {hot}");
    served.server.stop().await
}
