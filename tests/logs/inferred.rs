//! Attempts Ray exported no offsets for: each one's output is bounded by the markers Ray's
//! worker writes before each task.

use anyhow::{Context as _, ensure};
use shared::keys::{ClusterName, LogFile, LogFileName, NodeId, SessionName};

use super::{put, serving};

/// Ray 2.60 exports no `RUNNING` event for many short tasks, and with it no `taskLogInfo`: in
/// the captured run, every attempt on the busiest worker is made so. Its file holds each
/// attempt's own line after the marker Ray's worker writes before each task, in the order Ray
/// submitted them to the worker; each attempt's output is its own line alone.
#[tokio::test]
async fn attempts_without_offsets_get_only_their_own_lines() -> anyhow::Result<()> {
    use base64::Engine as _;
    let run = afterglow_tests::FixtureRun::named("basic-workload")?;
    let bodies = afterglow_tests::bodies(&run)?;
    let decode = |value: Option<&serde_json::Value>| -> anyhow::Result<String> {
        let text = value.and_then(serde_json::Value::as_str).context("an id")?;
        Ok(base64::engine::general_purpose::STANDARD
            .decode(text)?
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect())
    };
    // Each attempt's worker, job and submission time, and each definition's task name.
    let mut workers: std::collections::HashMap<(String, u64), String> = Default::default();
    let mut jobs: std::collections::HashMap<(String, u64), String> = Default::default();
    let mut submitted: std::collections::HashMap<(String, u64), String> = Default::default();
    let mut names: std::collections::HashMap<(String, u64), String> = Default::default();
    for body in &bodies {
        let events: Vec<serde_json::Value> = serde_json::from_slice(body)?;
        for event in &events {
            if let Some(definition) = event.get("taskDefinitionEvent") {
                let attempt = (
                    decode(definition.get("taskId"))?,
                    definition["taskAttempt"].as_u64().unwrap_or(0),
                );
                if let Some(name) = definition["taskName"].as_str() {
                    names.insert(attempt, name.to_owned());
                }
            }
            let Some(lifecycle) = event.get("taskLifecycleEvent") else {
                continue;
            };
            let attempt = (
                decode(lifecycle.get("taskId"))?,
                lifecycle["taskAttempt"].as_u64().unwrap_or(0),
            );
            // Ray sends an empty id before a worker is known.
            if lifecycle["workerId"]
                .as_str()
                .is_some_and(|id| !id.is_empty())
            {
                workers.insert(attempt.clone(), decode(lifecycle.get("workerId"))?);
                jobs.insert(attempt.clone(), decode(lifecycle.get("jobId"))?);
            }
            for transition in lifecycle["stateTransitions"]
                .as_array()
                .into_iter()
                .flatten()
            {
                if transition["state"] == "SUBMITTED_TO_WORKER" {
                    let at = transition["timestamp"].as_str().context("timestamp")?;
                    // RFC 3339 with up to nine digits of fraction: padded, they sort as times.
                    let (seconds, fraction) =
                        at.trim_end_matches('Z').split_once('.').unwrap_or((at, ""));
                    submitted.insert(attempt.clone(), format!("{seconds}.{fraction:0<9}"));
                }
            }
        }
    }
    let mut by_worker: std::collections::HashMap<&str, Vec<&(String, u64)>> = Default::default();
    for (attempt, worker) in &workers {
        by_worker.entry(worker.as_str()).or_default().push(attempt);
    }
    let (worker, mut ran) = by_worker
        .into_iter()
        .max_by_key(|(worker, attempts)| (attempts.len(), *worker))
        .context("no worker")?;
    ensure!(
        ran.len() >= 10,
        "the busiest worker ran {} attempts",
        ran.len()
    );
    ran.sort_by_key(|attempt| (submitted.get(*attempt).cloned(), (*attempt).clone()));

    // Ray reported no offsets for any of them.
    let mut stripped = Vec::new();
    for body in &bodies {
        let mut events: Vec<serde_json::Value> = serde_json::from_slice(body)?;
        for event in &mut events {
            let Some(lifecycle) = event.get_mut("taskLifecycleEvent") else {
                continue;
            };
            let attempt = (
                decode(lifecycle.get("taskId"))?,
                lifecycle["taskAttempt"].as_u64().unwrap_or(0),
            );
            if ran.contains(&&attempt)
                && let Some(lifecycle) = lifecycle.as_object_mut()
            {
                lifecycle.remove("taskLogInfo");
            }
        }
        stripped.push(serde_json::to_vec(&events)?);
    }
    let served = serving(&stripped).await?;
    let (first_task, _) = ran.first().context("an attempt")?;
    let detail: serde_json::Value =
        reqwest::get(format!("{}/api/tasks/{first_task}", served.server.url))
            .await?
            .json()
            .await?;
    let attempt = &detail["attempts"][0];

    let mut written = String::new();
    let mut job = None;
    for attempt in &ran {
        let (task_id, number) = attempt;
        if job != jobs.get(*attempt) {
            job = jobs.get(*attempt);
            written.push_str(&format!(":job_id:{}\n", job.context("a job")?));
        }
        let name = names
            .get(*attempt)
            .with_context(|| format!("no task name for {attempt:?} among {}", names.len()))?;
        written.push_str(&format!(
            ":task_name:{name}\noutput of {task_id} attempt {number}\n"
        ));
    }
    let file = LogFile {
        cluster: ClusterName::new("logs")?,
        session: SessionName::new(attempt["session_name"].as_str().context("session")?)?,
        node_id: NodeId::new(attempt["node_id"].as_str().context("node_id")?)?,
        file: LogFileName::new(&format!("worker-{worker}-ffffffff-4242.out"))?,
    };
    put(&*served.storage, &file, 0, written.as_bytes()).await?;

    for (task_id, number) in &ran {
        let response = reqwest::get(format!(
            "{}/api/tasks/{task_id}/logs?attempt={number}",
            served.server.url
        ))
        .await?;
        let status = response.status().as_u16();
        let range = response
            .headers()
            .get("x-afterglow-log-range")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let said = response.text().await?;
        ensure!(
            status == 200
                && range.as_deref() == Some("inferred")
                && said == format!("output of {task_id} attempt {number}\n"),
            "{task_id} attempt {number}: {status} {range:?} {:?}",
            said.chars().take(300).collect::<String>()
        );
    }
    Ok(())
}
