//! The Ray event model against real traffic: every captured event parses, and what it says
//! agrees with Ray's own state API output for the same run (IDs, names, types, timestamps).

use std::collections::{BTreeMap, BTreeSet};

use afterglow_tests::ray::ray_transitions;
use afterglow_tests::{FixtureRun, raw_events};
use anyhow::{Context as _, ensure};
use shared::event::common::FunctionDescriptor;
use shared::event::encoding::Id;
use shared::event::{EventPayload, RayEvent};

/// Every event of every captured body parses into the payload its `eventType` names.
#[test]
fn every_captured_event_parses_into_its_declared_type() -> anyhow::Result<()> {
    let mut total = 0;
    for run in FixtureRun::all()? {
        for request in run.requests()? {
            for text in raw_events(&request.body)? {
                let event = RayEvent::from_json(&text)
                    .with_context(|| format!("{} #{}: {text}", run.name, request.seq))?;
                // The declared type, read with serde_json alone.
                let value: serde_json::Value = serde_json::from_str(&text)?;
                let declared = value
                    .get("eventType")
                    .or_else(|| value.get("event_type"))
                    .and_then(serde_json::Value::as_str)
                    .context("eventType")?;
                ensure!(event.event_type.as_str() == declared);
                let parsed_as = payload_name(&event.payload);
                ensure!(
                    parsed_as == declared,
                    "{}: {declared} parsed as {parsed_as}",
                    run.name
                );
                ensure!(
                    event.event_id.is_some(),
                    "2.60 events always carry an eventId"
                );
                ensure!(
                    event.timestamp.is_some(),
                    "2.60 events always carry a timestamp"
                );
                ensure!(event.session_name.starts_with("session_"));
                total += 1;
            }
        }
    }
    ensure!(total > 3000, "expected the captured events, parsed {total}");
    Ok(())
}

/// Writing an event gives Ray's own bytes back, as far as the model reads them: every captured
/// event re-reads to the same value, and every field written equals the field Ray sent (or is
/// the proto3 default Ray would print for it). This is what lets synthetic traffic be built
/// from these types.
#[test]
fn every_captured_event_writes_back_the_way_ray_sent_it() -> anyhow::Result<()> {
    let mut compared = 0usize;
    for run in FixtureRun::all()? {
        for request in run.requests()? {
            for text in raw_events(&request.body)? {
                let event = RayEvent::from_json(&text)?;
                let written = serde_json::to_string(&event)?;
                let reread = RayEvent::from_json(&written)
                    .with_context(|| format!("{}: re-reading {written}", run.name))?;
                ensure!(
                    format!("{event:?}") == format!("{reread:?}"),
                    "{} #{}: {text}\nwritten as {written}",
                    run.name,
                    request.seq
                );
                if run.name.contains("snake-case") {
                    continue;
                }
                let sent: serde_json::Value = serde_json::from_str(&text)?;
                let ours: serde_json::Value = serde_json::from_str(&written)?;
                let mut differences = Vec::new();
                written_agrees(&ours, &sent, "", &mut differences);
                ensure!(
                    differences.is_empty(),
                    "{} #{}: written differs from sent at {differences:?}\nsent    {text}\nwritten {written}",
                    run.name,
                    request.seq
                );
                compared += 1;
            }
        }
    }
    ensure!(compared > 3000, "compared only {compared} events");
    Ok(())
}

/// Collects the paths where `ours` says something `sent` does not: a different value, or a key
/// Ray left out whose value is not the proto3 default.
fn written_agrees(
    ours: &serde_json::Value,
    sent: &serde_json::Value,
    path: &str,
    differences: &mut Vec<String>,
) {
    use serde_json::Value;
    match (ours, sent) {
        (Value::Object(ours), Value::Object(sent)) => {
            for (key, value) in ours {
                let at = format!("{path}.{key}");
                match sent.get(key) {
                    Some(theirs) => written_agrees(value, theirs, &at, differences),
                    None if is_default(value) => {}
                    None => differences.push(at),
                }
            }
        }
        (Value::Array(ours), Value::Array(sent)) if ours.len() == sent.len() => {
            for (index, (value, theirs)) in ours.iter().zip(sent).enumerate() {
                written_agrees(value, theirs, &format!("{path}[{index}]"), differences);
            }
        }
        // Ray prints float resources as whole numbers when they are (`1.0` vs `1`).
        (Value::Number(ours), Value::Number(sent)) if ours.as_f64() == sent.as_f64() => {}
        _ if ours == sent => {}
        _ => differences.push(path.to_owned()),
    }
}

/// Proto3's defaults, which Ray may leave out.
fn is_default(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::Null => true,
        Value::Bool(flag) => !flag,
        Value::Number(number) => number.as_f64() == Some(0.0),
        Value::String(text) => text.is_empty() || text == "0",
        Value::Array(items) => items.is_empty(),
        Value::Object(fields) => fields.values().all(is_default),
    }
}

fn payload_name(payload: &EventPayload) -> &'static str {
    match payload {
        EventPayload::TaskDefinition(_) => "TASK_DEFINITION_EVENT",
        EventPayload::ActorTaskDefinition(_) => "ACTOR_TASK_DEFINITION_EVENT",
        EventPayload::TaskLifecycle(_) => "TASK_LIFECYCLE_EVENT",
        EventPayload::TaskProfile(_) => "TASK_PROFILE_EVENT",
        EventPayload::DriverJobDefinition(_) => "DRIVER_JOB_DEFINITION_EVENT",
        EventPayload::DriverJobLifecycle(_) => "DRIVER_JOB_LIFECYCLE_EVENT",
        EventPayload::ActorDefinition(_) => "ACTOR_DEFINITION_EVENT",
        EventPayload::ActorLifecycle(_) => "ACTOR_LIFECYCLE_EVENT",
        EventPayload::NodeDefinition(_) => "NODE_DEFINITION_EVENT",
        EventPayload::NodeLifecycle(_) => "NODE_LIFECYCLE_EVENT",
        EventPayload::WorkerDefinition(_) => "WORKER_DEFINITION_EVENT",
        EventPayload::WorkerLifecycle(_) => "WORKER_LIFECYCLE_EVENT",
        EventPayload::PlacementGroupDefinition(_) => "PLACEMENT_GROUP_DEFINITION_EVENT",
        EventPayload::PlacementGroupLifecycle(_) => "PLACEMENT_GROUP_LIFECYCLE_EVENT",
        EventPayload::SubmissionJobDefinition(_) => "SUBMISSION_JOB_DEFINITION_EVENT",
        EventPayload::SubmissionJobLifecycle(_) => "SUBMISSION_JOB_LIFECYCLE_EVENT",
        EventPayload::Platform(_) => "PLATFORM_EVENT",
        EventPayload::Unknown => "unknown",
    }
}

/// What one task definition event says, in the state API's terms.
#[derive(Debug, PartialEq)]
struct Definition {
    name: String,
    func_or_class_name: String,
    task_type: String,
    job_id: String,
    parent_task_id: Option<String>,
    actor_id: Option<String>,
    language: String,
    required_resources: BTreeMap<String, f64>,
}

/// Ray's `func_or_class_name`: `Class.method` with the short class name, or the function name.
fn func_or_class_name(descriptor: &FunctionDescriptor) -> String {
    match descriptor.class_and_function() {
        Some((class, function)) if !class.is_empty() => {
            let short = class.rsplit('.').next().unwrap_or(class);
            format!("{short}.{function}")
        }
        Some((_, function)) => function.to_owned(),
        None => String::new(),
    }
}

fn hex(id: Option<&Id>) -> Option<String> {
    id.map(|id| id.as_hex().to_owned())
}

/// Task definitions of one run, by task id and attempt.
type Definitions = BTreeMap<(String, i64), Definition>;

/// Lifecycle `(state, ms)` pairs of one run, by task id and attempt.
type Transitions = BTreeMap<(String, i64), BTreeSet<(String, i64)>>;

fn read_run(run: &FixtureRun) -> anyhow::Result<(Definitions, Transitions)> {
    let mut definitions = BTreeMap::new();
    let mut transitions: Transitions = BTreeMap::new();
    for request in run.requests()? {
        for text in raw_events(&request.body)? {
            match RayEvent::from_json(&text)?.payload {
                EventPayload::TaskDefinition(task) => {
                    let id = hex(task.task_id.as_ref()).context("task id")?;
                    definitions.insert(
                        (id, i64::from(task.task_attempt)),
                        Definition {
                            name: task.task_name.clone(),
                            func_or_class_name: func_or_class_name(&task.task_func),
                            task_type: task.task_type.to_string(),
                            job_id: hex(task.job_id.as_ref()).context("job id")?,
                            parent_task_id: hex(task.parent_task_id.as_ref()),
                            actor_id: None,
                            language: task.language.to_string(),
                            required_resources: task.required_resources.clone(),
                        },
                    );
                }
                EventPayload::ActorTaskDefinition(task) => {
                    let id = hex(task.task_id.as_ref()).context("task id")?;
                    definitions.insert(
                        (id, i64::from(task.task_attempt)),
                        Definition {
                            name: task.actor_task_name.clone(),
                            func_or_class_name: func_or_class_name(&task.actor_func),
                            task_type: "ACTOR_TASK".to_owned(),
                            job_id: hex(task.job_id.as_ref()).context("job id")?,
                            parent_task_id: hex(task.parent_task_id.as_ref()),
                            actor_id: hex(task.actor_id.as_ref()),
                            language: task.language.to_string(),
                            required_resources: task.required_resources.clone(),
                        },
                    );
                }
                EventPayload::TaskLifecycle(lifecycle) => {
                    let id = hex(lifecycle.task_id.as_ref()).context("task id")?;
                    let entry = transitions
                        .entry((id, i64::from(lifecycle.task_attempt)))
                        .or_default();
                    for transition in &lifecycle.state_transitions {
                        entry.insert((transition.state.to_string(), transition.timestamp.millis()));
                    }
                }
                _ => {}
            }
        }
    }
    Ok((definitions, transitions))
}

/// For every task attempt in Ray's `ray list tasks --detail` whose definition was exported, the
/// definition event decodes to the same IDs, name, function, type, language and resources; and
/// every lifecycle transition decodes to a state and millisecond time Ray also reports.
#[test]
fn task_events_agree_with_rays_state_api() -> anyhow::Result<()> {
    let mut compared_definitions = 0;
    let mut compared_transitions = 0;
    for run in FixtureRun::all()? {
        let (definitions, transitions) = read_run(&run)?;
        let truth = run.ground_truth("tasks.json")?;
        for task in truth.as_array().context("tasks.json is a list")? {
            let field = |name: &str| task[name].as_str().map(str::to_owned);
            let key = (
                field("task_id").context("task_id")?,
                task["attempt_number"].as_i64().context("attempt_number")?,
            );
            if let Some(definition) = definitions.get(&key) {
                let expected = Definition {
                    name: field("name").context("name")?,
                    func_or_class_name: field("func_or_class_name").context("func")?,
                    task_type: field("type").context("type")?,
                    job_id: field("job_id").context("job_id")?,
                    parent_task_id: field("parent_task_id"),
                    actor_id: if field("type").as_deref() == Some("ACTOR_TASK") {
                        field("actor_id")
                    } else {
                        None
                    },
                    language: field("language").context("language")?,
                    required_resources: serde_json::from_value(task["required_resources"].clone())?,
                };
                ensure!(
                    *definition == expected,
                    "{} {key:?}:\n ours {definition:?}\n Ray's {expected:?}",
                    run.name
                );
                compared_definitions += 1;
            }
            let ray_events: BTreeSet<(String, i64)> = ray_transitions(task)?.into_iter().collect();
            for (state, millis) in transitions.get(&key).into_iter().flatten() {
                let ray_has_state = ray_events.iter().any(|(ray_state, _)| ray_state == state);
                // Ray keeps one time per state (the last written); an attempt re-reporting a
                // state is rare, so require the exact time whenever the state is there.
                if ray_has_state {
                    ensure!(
                        ray_events.contains(&(state.clone(), *millis)),
                        "{} {key:?}: {state} at {millis} not in Ray's {ray_events:?}",
                        run.name
                    );
                    compared_transitions += 1;
                } else {
                    anyhow::bail!("{} {key:?}: Ray never reports {state}", run.name);
                }
            }
        }
    }
    ensure!(
        compared_definitions > 450,
        "compared only {compared_definitions} definitions"
    );
    ensure!(
        compared_transitions > 1500,
        "compared only {compared_transitions} transitions"
    );
    Ok(())
}

/// Actors, jobs and nodes: the IDs decoded from definition events are the ones Ray lists.
#[test]
fn entity_ids_agree_with_rays_state_api() -> anyhow::Result<()> {
    let mut actors_checked = 0;
    for run in FixtureRun::all()? {
        let mut actors = BTreeMap::new();
        let mut jobs = BTreeSet::new();
        let mut nodes = BTreeMap::new();
        for request in run.requests()? {
            for text in raw_events(&request.body)? {
                match RayEvent::from_json(&text)?.payload {
                    EventPayload::ActorDefinition(actor) => {
                        actors.insert(
                            hex(actor.actor_id.as_ref()).context("actor id")?,
                            (actor.class_name.clone(), actor.name.clone()),
                        );
                    }
                    EventPayload::DriverJobDefinition(job) => {
                        jobs.insert(hex(job.job_id.as_ref()).context("job id")?);
                    }
                    EventPayload::NodeDefinition(node) => {
                        nodes.insert(
                            hex(node.node_id.as_ref()).context("node id")?,
                            node.node_ip_address.clone(),
                        );
                    }
                    _ => {}
                }
            }
        }
        for actor in run
            .ground_truth("actors.json")?
            .as_array()
            .context("actors")?
        {
            let id = actor["actor_id"].as_str().context("actor_id")?;
            if let Some((class_name, name)) = actors.get(id) {
                ensure!(
                    actor["class_name"].as_str() == Some(class_name.as_str()),
                    "{id}"
                );
                ensure!(actor["name"].as_str().unwrap_or("") == name, "{id}");
                actors_checked += 1;
            } else {
                ensure!(
                    run.name == "dropped-events-small-buffer",
                    "{}: actor {id} has no definition event",
                    run.name
                );
            }
        }
        for job in run.ground_truth("jobs.json")?.as_array().context("jobs")? {
            if let Some(id) = job["job_id"].as_str() {
                ensure!(
                    jobs.contains(id) || run.name == "dropped-events-small-buffer",
                    "{}: job {id} has no definition event",
                    run.name
                );
            }
        }
        if let Ok(truth) = run.ground_truth("nodes.json") {
            for node in truth.as_array().context("nodes")? {
                let id = node["node_id"].as_str().context("node_id")?;
                if let Some(ip) = nodes.get(id) {
                    ensure!(node["node_ip"].as_str() == Some(ip.as_str()), "{id}");
                }
            }
        }
    }
    ensure!(actors_checked > 0, "no run's actors were compared");
    Ok(())
}
