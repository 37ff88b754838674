//! Task events for the merge rules' unit tests, and the check they all rest on: every order of
//! the same events (reversed, rotated, repeated) merges to the same rows.

use super::{SessionTasks, TaskView};
use crate::event::RayEvent;

pub(super) const TASK: &str = "FjEKDwpFr1z///////////////8BAAAA"; // 16310a0f…01000000
pub(super) const ACTOR_TASK: &str = "4NwXTINZkDRR392XtzhGUcshBU8BAAAA";
pub(super) const NODE: &str = "CPIoGPtX5DmhSrfP6qC5bD2pqJtAy2bpi8HCNQ==";
pub(super) const WORKER: &str = "8Zy3Giv+Cb+LZ51kg5h3TLo+QBetp55HBzMNsA==";

pub(super) fn time(second: u32) -> String {
    format!("2026-11-22T06:14:{second:02}.000000000Z")
}

pub(super) fn lifecycle(task: &str, at: u32, states: &[(&str, u32)], extra: &str) -> String {
    let transitions: Vec<String> = states
        .iter()
        .map(|(state, second)| {
            format!(
                r#"{{"state": "{state}", "timestamp": "{}"}}"#,
                time(*second)
            )
        })
        .collect();
    format!(
        r#"{{"eventType": "TASK_LIFECYCLE_EVENT", "timestamp": "{}", "taskLifecycleEvent": {{"taskId": "{task}", "taskAttempt": 0, "jobId": "AQAAAA==", "stateTransitions": [{}]{extra}}}}}"#,
        time(at),
        transitions.join(", ")
    )
}

pub(super) fn definition(task: &str, name: &str, function: &str) -> String {
    format!(
        r#"{{"eventType": "TASK_DEFINITION_EVENT", "timestamp": "{}", "taskDefinitionEvent": {{"taskId": "{task}", "taskAttempt": 0, "taskType": "NORMAL_TASK", "language": "PYTHON", "taskName": "{name}", "jobId": "AQAAAA==", "taskFunc": {{"pythonFunctionDescriptor": {{"moduleName": "m", "className": "", "functionName": "{function}"}}}}, "parentTaskId": "//////////////////////////8BAAAA", "placementGroupId": "////////////////////////"}}}}"#,
        time(1)
    )
}

pub(super) fn actor_definition(name: &str) -> String {
    format!(
        r#"{{"eventType": "ACTOR_TASK_DEFINITION_EVENT", "timestamp": "{}", "actorTaskDefinitionEvent": {{"taskId": "{ACTOR_TASK}", "taskAttempt": 0, "language": "PYTHON", "actorTaskName": "{name}", "jobId": "AQAAAA==", "actorId": "Ud/dl7c4RlHLIQVPAQAAAA==", "actorFunc": {{"pythonFunctionDescriptor": {{"moduleName": "m", "className": "m.Counter", "functionName": "incr"}}}}}}}}"#,
        time(1)
    )
}

/// Every order the tests try: as given, reversed, each rotation, and everything twice.
fn orders(events: &[String]) -> Vec<Vec<String>> {
    let mut orders = vec![events.to_vec(), events.iter().rev().cloned().collect()];
    for shift in 1..events.len() {
        let mut rotated = events.to_vec();
        rotated.rotate_left(shift);
        orders.push(rotated);
    }
    let mut doubled = events.to_vec();
    doubled.extend(events.iter().rev().cloned());
    orders.push(doubled);
    orders
}

/// Applies events to attempts and views them, checking that every order agrees.
fn views(events: &[String]) -> Vec<TaskView> {
    let mut results: Vec<Vec<TaskView>> = Vec::new();
    for order in orders(events) {
        let mut session = SessionTasks::default();
        for text in &order {
            let event = RayEvent::from_json(text).unwrap_or_else(|err| panic!("{err}: {text}"));
            session.apply(event);
        }
        results.push(session.views().map(|(_, view)| view).collect());
    }
    let first = results[0].clone();
    for (index, other) in results.iter().enumerate() {
        assert_eq!(&first, other, "order #{index} disagrees");
    }
    first
}

pub(super) fn only(events: &[String]) -> TaskView {
    let mut all = views(events);
    assert_eq!(all.len(), 1);
    all.remove(0)
}

pub(super) fn ms(second: u32) -> Option<i64> {
    Some(1_795_328_040_000 + i64::from(second) * 1000)
}
