//! Merge rules for submitted jobs (`ray job submit`), from `SUBMISSION_JOB_DEFINITION_EVENT`
//! and `SUBMISSION_JOB_LIFECYCLE_EVENT`. Ray 2.60 defines these events without emitting them;
//! the log shipper reads Ray's job API on the head node and sends what changed as these
//! events, so a Ray that emits them itself is read the same way.
//!
//! A submission is keyed by its submission id (`raysubmit_…` or the user's own). Its driver
//! job, once it called `ray.init()`, carries the id in its metadata (`job_submission_id`),
//! which is how the two are joined when read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::entities::{Record, add_transitions, define};
use crate::event::EventPayload;

/// What a submission's definition says.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SubmissionDefinitionFacts {
    /// The entrypoint command.
    pub entrypoint: String,
    /// Runtime environment JSON, as submitted (secrets included: masked when answered).
    pub serialized_runtime_env: String,
    /// The user's metadata as JSON (keys sorted).
    pub metadata: String,
}

/// One state a submission entered.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SubmissionTransition {
    /// When (ns).
    pub at: i64,
    /// `PENDING`, `RUNNING`, `STOPPED`, `SUCCEEDED` or `FAILED`.
    pub state: String,
    /// Ray's message for the state.
    pub message: String,
    /// Ray's error category, when failed (empty otherwise).
    pub error_type: String,
    /// Node running the driver (hex).
    pub driver_node_id: Option<String>,
    /// The driver's exit code, once it exited.
    pub driver_exit_code: Option<i32>,
}

/// Everything known about one submission.
pub type SubmissionRecord = Record<SubmissionDefinitionFacts, SubmissionTransition>;

/// States a submission does not leave.
const TERMINAL: [&str; 3] = ["STOPPED", "SUCCEEDED", "FAILED"];

impl SubmissionRecord {
    /// The latest transition: a terminal state outranks any other reported at the same time.
    pub fn current(&self) -> Option<&SubmissionTransition> {
        self.transitions
            .iter()
            .max_by_key(|transition| (transition.at, TERMINAL.contains(&transition.state.as_str())))
    }

    /// Ray's `status`.
    pub fn state(&self) -> Option<&str> {
        self.current().map(|transition| transition.state.as_str())
    }

    /// When it was submitted (ns): its first transition.
    pub fn start_ns(&self) -> Option<i64> {
        self.transitions.first().map(|transition| transition.at)
    }

    /// When it ended (ns), once in a terminal state.
    pub fn end_ns(&self) -> Option<i64> {
        self.current()
            .filter(|transition| TERMINAL.contains(&transition.state.as_str()))
            .map(|transition| transition.at)
    }

    /// The latest value of a per-transition fact that some transition reported.
    pub fn latest<T>(&self, pick: impl Fn(&SubmissionTransition) -> Option<T>) -> Option<T> {
        self.transitions.iter().rev().find_map(pick)
    }
}

/// Applies a submission event reported at `at` (ns); other events are not submissions'.
pub(super) fn apply(
    submissions: &mut BTreeMap<String, SubmissionRecord>,
    at: i64,
    payload: &EventPayload,
) {
    match payload {
        EventPayload::SubmissionJobDefinition(event) if !event.submission_id.is_empty() => {
            define(
                submissions,
                event.submission_id.clone(),
                at,
                SubmissionDefinitionFacts {
                    entrypoint: event.entrypoint.clone(),
                    serialized_runtime_env: event.config.serialized_runtime_env.clone(),
                    metadata: serde_json::to_string(&event.config.metadata).unwrap_or_default(),
                },
            );
        }
        EventPayload::SubmissionJobLifecycle(event) if !event.submission_id.is_empty() => {
            let transitions = event
                .state_transitions
                .iter()
                .map(|transition| SubmissionTransition {
                    at: transition.timestamp.nanos(),
                    state: transition.state.to_string(),
                    message: transition.message.clone(),
                    error_type: transition.error_type.clone(),
                    driver_node_id: transition
                        .driver_node_id
                        .as_ref()
                        .map(|id| id.as_hex().to_owned()),
                    driver_exit_code: transition.driver_exit_code,
                })
                .collect();
            add_transitions(submissions, event.submission_id.clone(), transitions);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::RayEvent;

    fn applied(events: &[&RayEvent]) -> BTreeMap<String, SubmissionRecord> {
        let mut submissions = BTreeMap::new();
        for event in events {
            apply(
                &mut submissions,
                event.timestamp.map_or(0, |t| t.nanos()),
                &event.payload,
            );
        }
        submissions
    }

    /// The events follow Ray's proto (`events_submission_job_definition_event.proto`,
    /// `…_lifecycle_event.proto`); Ray 2.60 emits none of its own.
    #[test]
    fn a_submission_merges_in_any_order_and_ends_in_its_terminal_state()
    -> Result<(), crate::event::EventError> {
        let definition = RayEvent::from_json(
            r#"{"eventType": "SUBMISSION_JOB_DEFINITION_EVENT", "timestamp": "2026-11-22T06:11:54Z",
                "submissionJobDefinitionEvent": {"submissionId": "cap-fail",
                  "entrypoint": "python fail.py",
                  "config": {"serializedRuntimeEnv": "{\"env_vars\": {\"TOKEN\": \"x\"}}",
                             "metadata": {"owner": "capture"}}}}"#,
        )?;
        let started = RayEvent::from_json(
            r#"{"eventType": "SUBMISSION_JOB_LIFECYCLE_EVENT", "timestamp": "2026-11-22T06:11:56Z",
                "submissionJobLifecycleEvent": {"submissionId": "cap-fail", "stateTransitions": [
                  {"state": "PENDING", "timestamp": "2026-11-22T06:11:54Z", "message": "queued"},
                  {"state": "RUNNING", "timestamp": "2026-11-22T06:11:55Z",
                   "driverNodeId": "l10+4KP1bNCzm82Nq5MCAAAA"}]}}"#,
        )?;
        let failed = RayEvent::from_json(
            r#"{"eventType": "SUBMISSION_JOB_LIFECYCLE_EVENT", "timestamp": "2026-11-22T06:11:59Z",
                "submissionJobLifecycleEvent": {"submissionId": "cap-fail", "stateTransitions": [
                  {"state": "FAILED", "timestamp": "2026-11-22T06:11:58Z",
                   "message": "exited with code 3", "errorType": "JOB_ENTRYPOINT_COMMAND_ERROR",
                   "driverExitCode": 3}]}}"#,
        )?;
        let forward = applied(&[&definition, &started, &failed]);
        assert_eq!(forward, applied(&[&failed, &started, &definition, &failed]));
        let record = &forward["cap-fail"];
        assert_eq!(record.state(), Some("FAILED"));
        assert_eq!(record.start_ns(), Some(1_795_327_914_000_000_000));
        assert_eq!(record.end_ns(), Some(1_795_327_918_000_000_000));
        assert_eq!(
            record.latest(|t| t.driver_node_id.clone()).as_deref(),
            Some("975d3ee0a3f56cd0b39bcd8dab9302000000")
        );
        assert_eq!(record.latest(|t| t.driver_exit_code), Some(3));
        let facts = record.definition.as_ref().map(|reported| &reported.value);
        assert_eq!(
            facts.map(|facts| facts.metadata.as_str()),
            Some(r#"{"owner":"capture"}"#)
        );
        Ok(())
    }

    #[test]
    fn a_terminal_state_outranks_one_reported_at_the_same_time() {
        let at = |state: &str| SubmissionTransition {
            at: 5,
            state: state.to_owned(),
            ..SubmissionTransition::default()
        };
        let record = SubmissionRecord {
            id: "s".to_owned(),
            definition: None,
            transitions: vec![at("FAILED"), at("RUNNING")],
        };
        assert_eq!(record.state(), Some("FAILED"));
        assert_eq!(record.end_ns(), Some(5));
    }
}
