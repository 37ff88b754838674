//! Ray's own routes (`/ray/{cluster}/{session|latest}/…`; docs/architecture.md, "Ray's own
//! tools") over Ray's captured traffic: the task list held to Ray's own `ray list tasks
//! --detail` for the same runs, the summaries to Ray's `summarize_tasks` and to Ray's own
//! summary code, every data route the 2.60 dashboard requests to the shape the live
//! dashboard answered (`fixtures/ray-routes-2.60/`), and runtime envs to Ray's own answers
//! masked by Ray's own redaction (`redaction`, which also holds `/api/…` to it).

use std::collections::{BTreeMap, BTreeSet};

use afterglow_tests::api::{Api, our_rows};
use afterglow_tests::ray::{LOSSY_RUN, check};
use afterglow_tests::{FixtureRun, Served, fetch_encoded, post_all, serve_runs_locally};
use anyhow::{Context as _, ensure};
use serde_json::{Value as Json, json};
use shared::query::ray::summary::{self, SummaryActor, SummaryTask};

mod cuts;
mod dashboard;
mod jobs;
mod lists;
mod redaction;
mod summaries;

/// `serve` with every fixture run posted (one cluster per run) and compacted, and Ray answers
/// cut at `response_bytes` when given.
async fn serve_runs(runs: &[FixtureRun], response_bytes: Option<usize>) -> anyhow::Result<Served> {
    serve_runs_locally(runs, |mut settings| {
        if let (Some(query), Some(bytes)) = (settings.query.as_mut(), response_bytes) {
            query.response_bytes = bytes;
        }
        Ok(settings)
    })
    .await
}

/// Ray's list envelope's inner result, checked to be Ray's `ListApiResponse`.
fn list_result(body: &Json) -> anyhow::Result<&serde_json::Map<String, Json>> {
    ensure!(
        body["result"] == json!(true) && body["msg"] == json!(""),
        "{body}"
    );
    let result = body["data"]["result"].as_object().context("data.result")?;
    let keys: BTreeSet<&str> = result.keys().map(String::as_str).collect();
    ensure!(
        keys == BTreeSet::from([
            "total",
            "num_after_truncation",
            "num_filtered",
            "result",
            "partial_failure_warning",
            "warnings"
        ]),
        "{keys:?}"
    );
    Ok(result)
}

/// Ray's times are floats of whole milliseconds; our comparison wants their integer text.
fn as_compared(mut row: Json) -> Json {
    for field in ["creation_time_ms", "start_time_ms", "end_time_ms"] {
        #[allow(clippy::cast_possible_truncation)]
        if let Some(ms) = row[field].as_f64() {
            row[field] = json!(ms as i64);
        }
    }
    row
}
