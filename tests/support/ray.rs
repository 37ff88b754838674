//! Comparing our task attempts with Ray's own `ray list tasks --detail` output for a fixture run.
//!
//! Our side is given as plain field → text maps, so that the in-memory merge and the Parquet
//! tables and the query API are all held to the same check.

use std::collections::BTreeMap;

use anyhow::{Context as _, ensure};

use crate::FixtureRun;

/// The state-API fields compared, by Ray's names.
pub const COMPARED_FIELDS: [&str; 18] = [
    "state",
    "name",
    "func_or_class_name",
    "type",
    "language",
    "job_id",
    "actor_id",
    "parent_task_id",
    "placement_group_id",
    "node_id",
    "worker_id",
    "worker_pid",
    "error_type",
    "error_message",
    "creation_time_ms",
    "start_time_ms",
    "end_time_ms",
    "attempt_number",
];

/// Our answer for one attempt: each compared field as text (`None` = null), plus whether the
/// state is a failure synthesized at job end or worker death.
#[derive(Clone, Debug, Default)]
pub struct OurRow {
    /// Field → value.
    pub fields: BTreeMap<&'static str, Option<String>>,
    /// True when the failure was synthesized.
    pub synthesized_failure: bool,
}

/// Our rows by `(task id hex, attempt number)`.
pub type OurRows = BTreeMap<(String, i64), OurRow>;

/// The run whose aggregator buffer (200 events) overflowed during an outage: Ray's own store
/// (fed by another path) has events the export dropped, so some of Ray's fields cannot be
/// reproduced from the exported events at all.
pub const LOSSY_RUN: &str = "dropped-events-small-buffer";

/// How one run compares with Ray's list.
#[derive(Debug, Default)]
pub struct Comparison {
    /// Attempts equal to Ray's in every compared field.
    pub matched: usize,
    /// Attempts Ray lists that none of our rows has.
    pub missing: Vec<String>,
    /// Differences explained by events that never reached the export.
    pub explained_by_lost_events: usize,
    /// The first few of those, for messages.
    pub lost_examples: Vec<String>,
    /// Every other difference: these are bugs.
    pub unexplained: Vec<String>,
}

/// Ray prints times as UTC dates with microseconds (`2026-11-22 06:11:47.258000`); as epoch ms.
pub fn ray_millis(text: &str) -> anyhow::Result<String> {
    Ok(ray_epoch_millis(text)?.to_string())
}

/// [`ray_millis`] as a number.
pub fn ray_epoch_millis(text: &str) -> anyhow::Result<i64> {
    let (date, time) = text.split_once(' ').context("date and time")?;
    let stamp = format!("{date}T{time}Z");
    Ok(shared::event::encoding::Timestamp::parse_rfc3339(&stamp)?.millis())
}

/// The state transitions Ray lists for one attempt of its task list (its `events`): each state
/// with its time in epoch milliseconds, in Ray's order.
pub fn ray_transitions(task: &serde_json::Value) -> anyhow::Result<Vec<(String, i64)>> {
    task["events"]
        .as_array()
        .context("events")?
        .iter()
        .map(|event| {
            Ok((
                event["state"].as_str().context("state")?.to_owned(),
                ray_epoch_millis(event["created_ms"].as_str().context("created_ms")?)?,
            ))
        })
        .collect()
}

/// Ray's value of a compared field, as text.
fn rays(row: &serde_json::Value, field: &str) -> anyhow::Result<Option<String>> {
    let value = &row[field];
    Ok(match value {
        serde_json::Value::Null => None,
        serde_json::Value::String(text) if field.ends_with("_time_ms") => Some(ray_millis(text)?),
        serde_json::Value::String(text) => Some(text.clone()),
        serde_json::Value::Number(number) => Some(number.to_string()),
        other => Some(other.to_string()),
    })
}

/// A difference is explained by lost events when we simply lack the fact, or when our state is
/// a failure synthesized at job end because the terminal event was lost.
fn explained_by_lost_events(ours: &OurRow, field: &str, value: Option<&String>) -> bool {
    value.is_none()
        || (ours.synthesized_failure
            && matches!(
                field,
                "state" | "error_type" | "error_message" | "end_time_ms"
            ))
}

/// Compares every attempt Ray lists for `run` with `ours`.
pub fn compare(run: &FixtureRun, ours: &OurRows) -> anyhow::Result<Comparison> {
    let truth = run.ground_truth("tasks.json")?;
    let mut comparison = Comparison::default();
    for ray in truth.as_array().context("tasks.json")? {
        let key = (
            ray["task_id"].as_str().context("task_id")?.to_owned(),
            ray["attempt_number"].as_i64().context("attempt_number")?,
        );
        let Some(our_row) = ours.get(&key) else {
            comparison
                .missing
                .push(format!("{key:?} ({})", ray["name"]));
            continue;
        };
        let mut equal = true;
        for field in COMPARED_FIELDS {
            let mine = our_row.fields.get(field).cloned().flatten();
            let theirs = rays(ray, field)?;
            if mine == theirs {
                continue;
            }
            equal = false;
            if explained_by_lost_events(our_row, field, mine.as_ref()) {
                comparison.explained_by_lost_events += 1;
                if comparison.lost_examples.len() < 10 {
                    comparison.lost_examples.push(format!(
                        "{key:?} ({}) {field}: ours {mine:?}, Ray's {theirs:?}",
                        ray["name"]
                    ));
                }
            } else {
                comparison.unexplained.push(format!(
                    "{key:?} ({}) {field}: ours {mine:?}, Ray's {theirs:?}",
                    ray["name"]
                ));
            }
        }
        if equal {
            comparison.matched += 1;
        }
    }
    Ok(comparison)
}

/// Compares and insists: complete runs agree with Ray on every attempt and field; the lossy run
/// may only differ where the export lost the events.
pub fn check(run: &FixtureRun, ours: &OurRows, what: &str) -> anyhow::Result<Comparison> {
    let comparison = compare(run, ours)?;
    ensure!(
        comparison.unexplained.is_empty(),
        "{} ({what}): {} attempts agree with Ray; these fields differ:\n{}",
        run.name,
        comparison.matched,
        comparison.unexplained.join("\n")
    );
    if run.name != LOSSY_RUN {
        ensure!(
            comparison.missing.is_empty() && comparison.explained_by_lost_events == 0,
            "{} ({what}): complete run, yet {} attempts missing and {} fields empty: {:?} {:#?}",
            run.name,
            comparison.missing.len(),
            comparison.explained_by_lost_events,
            comparison.missing,
            comparison.lost_examples
        );
    } else {
        ensure!(
            comparison.matched > 0,
            "{what}: the lossy run still has complete attempts"
        );
    }
    Ok(comparison)
}

/// Insists that `actual` holds exactly the rows of `expected`, field for field; `what` names
/// the step in a failure's message.
pub fn ensure_same(expected: &OurRows, actual: &OurRows, what: &str) -> anyhow::Result<()> {
    ensure!(
        expected.len() == actual.len(),
        "{what}: {} rows, expected {}",
        actual.len(),
        expected.len()
    );
    for (key, row) in expected {
        let other = actual
            .get(key)
            .with_context(|| format!("{what}: {key:?} missing"))?;
        ensure!(
            row.fields == other.fields,
            "{what}: {key:?} differs:\n {:?}\n {:?}",
            row.fields,
            other.fields
        );
    }
    Ok(())
}

/// One profile span as compared: name, start and end in microseconds.
pub type Span = (String, i64, i64);

/// Ray's `profiling_data` spans per attempt (Ray prints float milliseconds).
pub fn ray_spans(run: &FixtureRun) -> anyhow::Result<BTreeMap<(String, i64), Vec<Span>>> {
    let micros = |ms: &serde_json::Value| -> anyhow::Result<i64> {
        let ms = ms.as_f64().context("span time")?;
        #[allow(clippy::cast_possible_truncation)]
        Ok((ms * 1000.0).round() as i64)
    };
    let mut spans = BTreeMap::new();
    for ray in run
        .ground_truth("tasks.json")?
        .as_array()
        .context("tasks")?
    {
        let Some(events) = ray["profiling_data"]["events"].as_array() else {
            continue;
        };
        let mut list: Vec<Span> = events
            .iter()
            .map(|span| {
                Ok((
                    span["event_name"]
                        .as_str()
                        .context("event_name")?
                        .to_owned(),
                    micros(&span["start_time"])?,
                    micros(&span["end_time"])?,
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        if list.is_empty() {
            continue;
        }
        list.sort();
        let key = (
            ray["task_id"].as_str().context("task_id")?.to_owned(),
            ray["attempt_number"].as_i64().context("attempt_number")?,
        );
        spans.insert(key, list);
    }
    Ok(spans)
}

/// Checks our spans against Ray's: the same spans to the microsecond (float milliseconds lose
/// the last digit now and then, so 1 µs is allowed); in the lossy run, ours must be a subset.
/// Runs that exported no spans at all (TASK_PROFILE_EVENT is off by default) are skipped.
/// Returns how many attempts were compared.
pub fn check_spans(
    run: &FixtureRun,
    ours: &BTreeMap<(String, i64), Vec<Span>>,
) -> anyhow::Result<usize> {
    if ours.values().all(Vec::is_empty) {
        return Ok(0);
    }
    let same = |a: &Span, b: &Span| a.0 == b.0 && (a.1 - b.1).abs() <= 1 && (a.2 - b.2).abs() <= 1;
    let mut compared = 0;
    for (key, theirs) in ray_spans(run)? {
        let mut mine = ours.get(&key).cloned().unwrap_or_default();
        mine.sort();
        let close = if run.name == LOSSY_RUN {
            mine.iter().all(|a| theirs.iter().any(|b| same(a, b)))
        } else {
            mine.len() == theirs.len() && mine.iter().zip(&theirs).all(|(a, b)| same(a, b))
        };
        ensure!(
            close,
            "{} {key:?}:\n ours {mine:?}\n Ray's {theirs:?}",
            run.name
        );
        compared += 1;
    }
    Ok(compared)
}
