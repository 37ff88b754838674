//! Comparing our jobs, actors, nodes and workers with Ray's `ray list …` output for a run.

use std::collections::BTreeMap;

use anyhow::{Context as _, ensure};
use shared::merge::entities::SessionEntities;

use crate::FixtureRun;
use crate::ray::LOSSY_RUN;

/// Fields of Ray's lists that cannot be reproduced from exported events, and why.
pub const NOT_EXPORTED: &[(&str, &str)] = &[
    (
        "jobs.status/start_time/end_time/message",
        "`ray list jobs` lists submission jobs; the export carried only driver jobs \
         (SUBMISSION_JOB events never appeared even with ALL)",
    ),
    ("workers (DRIVER)", "drivers are never exported as workers"),
    (
        "nodes.end_time_ms, state after `ray stop`",
        "nothing is exported during `ray stop`",
    ),
    (
        "placement_groups",
        "PLACEMENT_GROUP events never appeared in 2.60 captures, even with ALL",
    ),
];

/// Ray's `start_time_ms`-style dates (`2026-11-22 06:11:37.651000`) as epoch ms; the epoch
/// itself means "unset".
fn ray_ms(value: &serde_json::Value) -> anyhow::Result<Option<i64>> {
    let Some(text) = value.as_str() else {
        return Ok(None);
    };
    let (date, time) = text.split_once(' ').context("date and time")?;
    let ms =
        shared::event::encoding::Timestamp::parse_rfc3339(&format!("{date}T{time}Z"))?.millis();
    Ok((ms != 0).then_some(ms))
}

fn text(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::Null => None,
        serde_json::Value::String(text) => Some(text.clone()),
        other => Some(other.to_string()),
    }
}

type Fields = BTreeMap<&'static str, Option<String>>;

/// Compares our fields with Ray's, collecting differences.
fn diff(what: &str, ours: &Fields, rays: &Fields, problems: &mut Vec<String>) {
    for (field, theirs) in rays {
        let mine = ours.get(field).cloned().flatten();
        if &mine != theirs {
            problems.push(format!("{what} {field}: ours {mine:?}, Ray's {theirs:?}"));
        }
    }
}

/// Compares Ray's actors, jobs, nodes and workers with ours: how many were compared, and
/// every difference (complete runs must have none; the lossy run may lack facts).
pub fn compare(
    run: &FixtureRun,
    entities: &SessionEntities,
) -> anyhow::Result<(usize, Vec<String>)> {
    let mut problems = Vec::new();
    let mut compared = 0;
    let lossy = run.name == LOSSY_RUN;

    for ray in run
        .ground_truth("actors.json")?
        .as_array()
        .context("actors")?
    {
        let id = ray["actor_id"].as_str().context("actor_id")?;
        let Some(actor) = entities.actors.get(id) else {
            if !lossy {
                problems.push(format!("actor {id} missing"));
            }
            continue;
        };
        let definition = actor.definition.as_ref().map(|reported| &reported.value);
        let ours: Fields = [
            ("class_name", definition.map(|d| d.class_name.clone())),
            ("job_id", definition.and_then(|d| d.job_id.clone())),
            ("name", definition.map(|d| d.name.clone())),
            ("ray_namespace", definition.map(|d| d.ray_namespace.clone())),
            ("is_detached", definition.map(|d| d.is_detached.to_string())),
            (
                "placement_group_id",
                definition.and_then(|d| d.placement_group_id.clone()),
            ),
            ("state", actor.state().map(str::to_owned)),
            ("node_id", actor.node_id()),
            ("pid", actor.pid().map(|pid| pid.to_string())),
            ("repr_name", Some(actor.repr_name())),
            ("num_restarts", Some(actor.num_restarts().to_string())),
            (
                "death_message",
                actor
                    .death_message()
                    .filter(|_| !ray["death_cause"]["actor_died_error_context"].is_null()),
            ),
        ]
        .into_iter()
        .collect();
        let rays: Fields = [
            ("class_name", text(&ray["class_name"])),
            ("job_id", text(&ray["job_id"])),
            ("name", text(&ray["name"])),
            ("ray_namespace", text(&ray["ray_namespace"])),
            ("is_detached", text(&ray["is_detached"])),
            ("placement_group_id", text(&ray["placement_group_id"])),
            ("state", text(&ray["state"])),
            ("node_id", text(&ray["node_id"])),
            ("pid", text(&ray["pid"])),
            ("repr_name", text(&ray["repr_name"])),
            ("num_restarts", text(&ray["num_restarts"])),
            (
                "death_message",
                text(&ray["death_cause"]["actor_died_error_context"]["error_message"]),
            ),
        ]
        .into_iter()
        .collect();
        if lossy {
            // Only what we have must agree.
            let known: Fields = rays
                .into_iter()
                .filter(|(field, _)| ours.get(field).cloned().flatten().is_some())
                .collect();
            diff(&format!("actor {id}"), &ours, &known, &mut problems);
        } else {
            diff(&format!("actor {id}"), &ours, &rays, &mut problems);
        }
        compared += 1;
    }

    for ray in run.ground_truth("jobs.json")?.as_array().context("jobs")? {
        let Some(id) = ray["job_id"].as_str() else {
            continue;
        };
        let Some(job) = entities.jobs.get(id) else {
            if !lossy {
                problems.push(format!("job {id} missing"));
            }
            continue;
        };
        let definition = job.definition.as_ref().map(|reported| &reported.value);
        let ours: Fields = [
            ("driver_pid", definition.map(|d| d.driver_pid.to_string())),
            (
                "driver_node_id",
                definition.and_then(|d| d.driver_node_id.clone()),
            ),
        ]
        .into_iter()
        .collect();
        let mut rays: Fields = [
            ("driver_pid", text(&ray["driver_info"]["pid"])),
            ("driver_node_id", text(&ray["driver_node_id"])),
        ]
        .into_iter()
        .collect();
        if lossy {
            rays.retain(|field, _| ours.get(field).cloned().flatten().is_some());
        }
        if ray["type"] == "DRIVER" {
            // Ray names the driver's node only for jobs submitted through its job API; the
            // export names it for every driver (`reference/ray-state-api-2.60/state_jobs.json`).
            rays.remove("driver_node_id");
        }
        diff(&format!("job {id}"), &ours, &rays, &mut problems);
        ensure!(
            job.state() == Some("FINISHED") || ray["status"] != "SUCCEEDED",
            "{}: job {id} succeeded but has no FINISHED transition",
            run.name
        );
        compared += 1;
    }

    for ray in run
        .ground_truth("nodes.json")?
        .as_array()
        .context("nodes")?
    {
        let id = ray["node_id"].as_str().context("node_id")?;
        let Some(node) = entities.nodes.get(id) else {
            if !lossy {
                problems.push(format!("node {id} missing"));
            }
            continue;
        };
        let definition = node.definition.as_ref().map(|reported| &reported.value);
        let labels: Option<serde_json::Value> = definition
            .map(|d| serde_json::from_str(&d.labels))
            .transpose()?;
        let ours: Fields = [
            ("node_ip", definition.map(|d| d.node_ip.clone())),
            ("node_name", definition.map(|d| d.node_name.clone())),
            ("state", node.state().map(str::to_owned)),
            ("labels", labels.map(|labels| labels.to_string())),
            (
                "start_time_ms",
                definition
                    .and_then(|d| d.start_ns)
                    .map(|ns| ns.div_euclid(1_000_000).to_string()),
            ),
        ]
        .into_iter()
        .collect();
        let rays: Fields = [
            ("node_ip", text(&ray["node_ip"])),
            ("node_name", text(&ray["node_name"])),
            ("state", text(&ray["state"])),
            ("labels", Some(ray["labels"].to_string())),
            (
                "start_time_ms",
                ray_ms(&ray["start_time_ms"])?.map(|ms| ms.to_string()),
            ),
        ]
        .into_iter()
        .collect();
        diff(&format!("node {id}"), &ours, &rays, &mut problems);
        compared += 1;
    }

    for ray in run
        .ground_truth("workers.json")?
        .as_array()
        .context("workers")?
    {
        if ray["worker_type"] == "DRIVER" {
            continue; // Never exported (NOT_EXPORTED).
        }
        let id = ray["worker_id"].as_str().context("worker_id")?;
        let Some(worker) = entities.workers.get(id) else {
            if !lossy {
                problems.push(format!("worker {id} missing"));
            }
            continue;
        };
        let definition = worker.definition.as_ref().map(|reported| &reported.value);
        let death = worker.death();
        let ours: Fields = [
            ("worker_type", definition.map(|d| d.worker_type.clone())),
            ("node_id", definition.and_then(|d| d.node_id.clone())),
            ("pid", definition.map(|d| d.pid.to_string())),
            ("is_alive", Some(worker.is_alive().to_string())),
            ("exit_type", death.and_then(|death| death.exit_type.clone())),
            (
                "exit_detail",
                death.and_then(|death| death.exit_detail.clone()),
            ),
            (
                "start_time_ms",
                worker.start_time_ms().map(|ms| ms.to_string()),
            ),
            (
                "end_time_ms",
                death
                    .map(|death| death.end_time_ms)
                    .filter(|&ms| ms > 0)
                    .map(|ms| ms.to_string()),
            ),
        ]
        .into_iter()
        .collect();
        let mut rays: Fields = [
            ("worker_type", text(&ray["worker_type"])),
            ("node_id", text(&ray["node_id"])),
            ("pid", text(&ray["pid"])),
            ("is_alive", text(&ray["is_alive"])),
            ("exit_type", text(&ray["exit_type"])),
            ("exit_detail", text(&ray["exit_detail"])),
            (
                "start_time_ms",
                ray_ms(&ray["start_time_ms"])?.map(|ms| ms.to_string()),
            ),
            (
                "end_time_ms",
                ray_ms(&ray["end_time_ms"])?.map(|ms| ms.to_string()),
            ),
        ]
        .into_iter()
        .collect();
        if lossy {
            // Without the exported death, a worker still looks alive.
            rays.retain(|field, _| ours.get(field).cloned().flatten().is_some());
            if worker.is_alive() {
                rays.remove("is_alive");
            }
        }
        diff(&format!("worker {id}"), &ours, &rays, &mut problems);
        compared += 1;
    }
    Ok((compared, problems))
}
