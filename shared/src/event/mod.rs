//! The Ray event model: every event type Ray 2.49–2.60 exports, as typed Rust values.
//!
//! [`RayEvent::from_json`] reads one event in either key form (camelCase, or snake_case when the
//! cluster sets `RAY_DASHBOARD_AGGREGATOR_AGENT_PRESERVE_PROTO_FIELD_NAME`). Unknown fields are
//! ignored and unknown event types become [`EventPayload::Unknown`], so a newer Ray never fails a
//! batch; only an event whose known fields are malformed is an error. The encoding rules (base64
//! IDs, 64-bit integers as strings, RFC 3339 times, enum names) live in [`encoding`].
//!
//! This module only reads. It does not merge events into entities: that is `merge`'s job.

pub mod cluster;
pub mod common;
pub mod encoding;
mod fast;
pub mod submission;
pub mod task;

use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use self::cluster::{
    ActorDefinitionEvent, ActorLifecycleEvent, DriverJobDefinitionEvent, DriverJobLifecycleEvent,
    NodeDefinitionEvent, NodeLifecycleEvent, PlacementGroupDefinitionEvent,
    PlacementGroupLifecycleEvent, WorkerDefinitionEvent, WorkerLifecycleEvent,
};
use self::encoding::{EventId, Id, Timestamp, opt_event_id, opt_id, ray_enum};
use self::submission::{PlatformEvent, SubmissionJobDefinitionEvent, SubmissionJobLifecycleEvent};
use self::task::{
    ActorTaskDefinitionEvent, LegacyTaskExecutionEvent, TaskDefinitionEvent, TaskLifecycleEvent,
    TaskProfileEvents,
};

ray_enum! {
    /// `RayEvent.EventType` (2.60 numbering). The 2.49–2.50 name `TASK_EXECUTION_EVENT` arrives
    /// as `Unknown` here and is read as a lifecycle event by [`RayEvent::from_json`].
    pub enum EventType {
        EVENT_TYPE_UNSPECIFIED = 0,
        TASK_DEFINITION_EVENT = 1,
        TASK_LIFECYCLE_EVENT = 2,
        ACTOR_TASK_DEFINITION_EVENT = 3,
        TASK_PROFILE_EVENT = 4,
        DRIVER_JOB_DEFINITION_EVENT = 5,
        DRIVER_JOB_LIFECYCLE_EVENT = 6,
        NODE_DEFINITION_EVENT = 7,
        NODE_LIFECYCLE_EVENT = 8,
        ACTOR_DEFINITION_EVENT = 9,
        ACTOR_LIFECYCLE_EVENT = 10,
        PLACEMENT_GROUP_DEFINITION_EVENT = 11,
        PLACEMENT_GROUP_LIFECYCLE_EVENT = 12,
        SUBMISSION_JOB_DEFINITION_EVENT = 13,
        SUBMISSION_JOB_LIFECYCLE_EVENT = 14,
        PLATFORM_EVENT = 15,
        WORKER_LIFECYCLE_EVENT = 16,
        WORKER_DEFINITION_EVENT = 17,
    }
}

ray_enum! {
    /// `RayEvent.SourceType`: the Ray component that emitted the event.
    pub enum SourceType {
        SOURCE_TYPE_UNSPECIFIED = 0,
        CORE_WORKER = 1,
        GCS = 2,
        RAYLET = 3,
        CLUSTER_LIFECYCLE = 4,
        AUTOSCALER = 5,
        JOBS = 6,
    }
}

ray_enum! {
    /// `RayEvent.Severity`.
    pub enum Severity {
        EVENT_SEVERITY_UNSPECIFIED = 0,
        TRACE = 1,
        DEBUG = 2,
        INFO = 3,
        WARNING = 4,
        ERROR = 5,
        FATAL = 6,
    }
}

/// One exported Ray event: the common envelope and its typed payload.
#[derive(Clone, Debug)]
pub struct RayEvent {
    /// Unique per event; re-sent batches repeat it, so it is the dedupe key. `None` only in
    /// pre-2.49 traffic.
    pub event_id: Option<EventId>,
    /// Emitting component.
    pub source_type: SourceType,
    /// The type as sent; for [`EventPayload::Unknown`] this is the only record of it.
    pub event_type: EventType,
    /// When the event was created.
    pub timestamp: Option<Timestamp>,
    /// Severity (all task and GCS events are `INFO`).
    pub severity: Severity,
    /// Free text, usually empty.
    pub message: String,
    /// The Ray session (one `ray start` of a cluster).
    pub session_name: String,
    /// Node whose aggregator exported the event (2.54+).
    pub node_id: Option<Id>,
    /// The type-specific part.
    pub payload: EventPayload,
}

/// The type-specific part of a [`RayEvent`]: exactly one per event, chosen by `eventType`.
#[derive(Clone, Debug)]
pub enum EventPayload {
    /// `TASK_DEFINITION_EVENT`.
    TaskDefinition(Box<TaskDefinitionEvent>),
    /// `ACTOR_TASK_DEFINITION_EVENT`.
    ActorTaskDefinition(Box<ActorTaskDefinitionEvent>),
    /// `TASK_LIFECYCLE_EVENT`, or 2.49–2.50's `TASK_EXECUTION_EVENT`.
    TaskLifecycle(Box<TaskLifecycleEvent>),
    /// `TASK_PROFILE_EVENT`.
    TaskProfile(Box<TaskProfileEvents>),
    /// `DRIVER_JOB_DEFINITION_EVENT`.
    DriverJobDefinition(Box<DriverJobDefinitionEvent>),
    /// `DRIVER_JOB_LIFECYCLE_EVENT`.
    DriverJobLifecycle(Box<DriverJobLifecycleEvent>),
    /// `ACTOR_DEFINITION_EVENT`.
    ActorDefinition(Box<ActorDefinitionEvent>),
    /// `ACTOR_LIFECYCLE_EVENT`.
    ActorLifecycle(Box<ActorLifecycleEvent>),
    /// `NODE_DEFINITION_EVENT`.
    NodeDefinition(Box<NodeDefinitionEvent>),
    /// `NODE_LIFECYCLE_EVENT`.
    NodeLifecycle(Box<NodeLifecycleEvent>),
    /// `WORKER_DEFINITION_EVENT`.
    WorkerDefinition(Box<WorkerDefinitionEvent>),
    /// `WORKER_LIFECYCLE_EVENT`.
    WorkerLifecycle(Box<WorkerLifecycleEvent>),
    /// `PLACEMENT_GROUP_DEFINITION_EVENT`.
    PlacementGroupDefinition(Box<PlacementGroupDefinitionEvent>),
    /// `PLACEMENT_GROUP_LIFECYCLE_EVENT`.
    PlacementGroupLifecycle(Box<PlacementGroupLifecycleEvent>),
    /// `SUBMISSION_JOB_DEFINITION_EVENT`.
    SubmissionJobDefinition(Box<SubmissionJobDefinitionEvent>),
    /// `SUBMISSION_JOB_LIFECYCLE_EVENT`.
    SubmissionJobLifecycle(Box<SubmissionJobLifecycleEvent>),
    /// `PLATFORM_EVENT`.
    Platform(Box<PlatformEvent>),
    /// A type this build does not read; the raw event is kept in storage all the same.
    Unknown,
}

/// Why one event could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// Not JSON, or a known field has the wrong form (bad base64, bad timestamp, …).
    #[error("malformed Ray event: {0}")]
    Malformed(#[from] serde_json::Error),
    /// The event names a type but lacks that type's payload object.
    #[error("{event_type} event has no {key:?} payload")]
    MissingPayload {
        /// The `eventType` sent.
        event_type: String,
        /// The camelCase key that should hold the payload.
        key: &'static str,
    },
}

/// The envelope exactly as sent: every payload is a plain optional field (it is not a oneof in
/// Ray's proto either), and `eventType` decides which one is read.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireEvent {
    #[serde(alias = "event_id", with = "opt_event_id")]
    event_id: Option<EventId>,
    #[serde(alias = "source_type")]
    source_type: SourceType,
    #[serde(alias = "event_type")]
    event_type: EventType,
    timestamp: Option<Timestamp>,
    severity: Severity,
    message: String,
    #[serde(alias = "session_name")]
    session_name: String,
    #[serde(alias = "node_id", with = "opt_id")]
    node_id: Option<Id>,
    #[serde(alias = "task_definition_event")]
    task_definition_event: Option<Box<TaskDefinitionEvent>>,
    #[serde(alias = "actor_task_definition_event")]
    actor_task_definition_event: Option<Box<ActorTaskDefinitionEvent>>,
    #[serde(alias = "task_lifecycle_event")]
    task_lifecycle_event: Option<Box<TaskLifecycleEvent>>,
    #[serde(alias = "task_execution_event")]
    task_execution_event: Option<LegacyTaskExecutionEvent>,
    #[serde(alias = "task_profile_events")]
    task_profile_events: Option<Box<TaskProfileEvents>>,
    #[serde(alias = "driver_job_definition_event")]
    driver_job_definition_event: Option<Box<DriverJobDefinitionEvent>>,
    #[serde(alias = "driver_job_lifecycle_event")]
    driver_job_lifecycle_event: Option<Box<DriverJobLifecycleEvent>>,
    #[serde(alias = "actor_definition_event")]
    actor_definition_event: Option<Box<ActorDefinitionEvent>>,
    #[serde(alias = "actor_lifecycle_event")]
    actor_lifecycle_event: Option<Box<ActorLifecycleEvent>>,
    #[serde(alias = "node_definition_event")]
    node_definition_event: Option<Box<NodeDefinitionEvent>>,
    #[serde(alias = "node_lifecycle_event")]
    node_lifecycle_event: Option<Box<NodeLifecycleEvent>>,
    #[serde(alias = "worker_definition_event")]
    worker_definition_event: Option<Box<WorkerDefinitionEvent>>,
    #[serde(alias = "worker_lifecycle_event")]
    worker_lifecycle_event: Option<Box<WorkerLifecycleEvent>>,
    #[serde(alias = "placement_group_definition_event")]
    placement_group_definition_event: Option<Box<PlacementGroupDefinitionEvent>>,
    #[serde(alias = "placement_group_lifecycle_event")]
    placement_group_lifecycle_event: Option<Box<PlacementGroupLifecycleEvent>>,
    #[serde(alias = "submission_job_definition_event")]
    submission_job_definition_event: Option<Box<SubmissionJobDefinitionEvent>>,
    #[serde(alias = "submission_job_lifecycle_event")]
    submission_job_lifecycle_event: Option<Box<SubmissionJobLifecycleEvent>>,
    #[serde(alias = "platform_event")]
    platform_event: Option<Box<PlatformEvent>>,
}

/// Takes the payload the event type calls for, or says which key was missing.
fn required<T>(
    payload: Option<T>,
    event_type: &EventType,
    key: &'static str,
) -> Result<T, EventError> {
    payload.ok_or_else(|| EventError::MissingPayload {
        event_type: event_type.as_str().to_owned(),
        key,
    })
}

impl RayEvent {
    /// Reads one event from its JSON text.
    pub fn from_json(text: &str) -> Result<Self, EventError> {
        // Task events in Ray's own shapes, nearly all of the traffic, without serde's
        // per-struct machinery; the reader declines anything it cannot read exactly as serde
        // would, and serde reads that.
        if let Some(event) = fast::read_event(text) {
            return Ok(event);
        }
        Self::from_serde(text)
    }

    /// Reads one event with serde: the definition of every event's reading.
    fn from_serde(text: &str) -> Result<Self, EventError> {
        let wire: WireEvent = serde_json::from_str(text)?;
        Self::from_wire(wire)
    }

    fn from_wire(mut wire: WireEvent) -> Result<Self, EventError> {
        use EventPayload as P;
        let kind = &wire.event_type;
        let payload = match kind {
            EventType::TASK_DEFINITION_EVENT => P::TaskDefinition(required(
                wire.task_definition_event.take(),
                kind,
                "taskDefinitionEvent",
            )?),
            EventType::ACTOR_TASK_DEFINITION_EVENT => P::ActorTaskDefinition(required(
                wire.actor_task_definition_event.take(),
                kind,
                "actorTaskDefinitionEvent",
            )?),
            EventType::TASK_LIFECYCLE_EVENT => P::TaskLifecycle(required(
                wire.task_lifecycle_event.take(),
                kind,
                "taskLifecycleEvent",
            )?),
            EventType::Unknown(name) if &**name == "TASK_EXECUTION_EVENT" => {
                let legacy =
                    required(wire.task_execution_event.take(), kind, "taskExecutionEvent")?;
                P::TaskLifecycle(Box::new(legacy.into_lifecycle()))
            }
            EventType::TASK_PROFILE_EVENT => P::TaskProfile(required(
                wire.task_profile_events.take(),
                kind,
                "taskProfileEvents",
            )?),
            EventType::DRIVER_JOB_DEFINITION_EVENT => P::DriverJobDefinition(required(
                wire.driver_job_definition_event.take(),
                kind,
                "driverJobDefinitionEvent",
            )?),
            EventType::DRIVER_JOB_LIFECYCLE_EVENT => P::DriverJobLifecycle(required(
                wire.driver_job_lifecycle_event.take(),
                kind,
                "driverJobLifecycleEvent",
            )?),
            EventType::ACTOR_DEFINITION_EVENT => P::ActorDefinition(required(
                wire.actor_definition_event.take(),
                kind,
                "actorDefinitionEvent",
            )?),
            EventType::ACTOR_LIFECYCLE_EVENT => P::ActorLifecycle(required(
                wire.actor_lifecycle_event.take(),
                kind,
                "actorLifecycleEvent",
            )?),
            EventType::NODE_DEFINITION_EVENT => P::NodeDefinition(required(
                wire.node_definition_event.take(),
                kind,
                "nodeDefinitionEvent",
            )?),
            EventType::NODE_LIFECYCLE_EVENT => P::NodeLifecycle(required(
                wire.node_lifecycle_event.take(),
                kind,
                "nodeLifecycleEvent",
            )?),
            EventType::WORKER_DEFINITION_EVENT => P::WorkerDefinition(required(
                wire.worker_definition_event.take(),
                kind,
                "workerDefinitionEvent",
            )?),
            EventType::WORKER_LIFECYCLE_EVENT => P::WorkerLifecycle(required(
                wire.worker_lifecycle_event.take(),
                kind,
                "workerLifecycleEvent",
            )?),
            EventType::PLACEMENT_GROUP_DEFINITION_EVENT => P::PlacementGroupDefinition(required(
                wire.placement_group_definition_event.take(),
                kind,
                "placementGroupDefinitionEvent",
            )?),
            EventType::PLACEMENT_GROUP_LIFECYCLE_EVENT => P::PlacementGroupLifecycle(required(
                wire.placement_group_lifecycle_event.take(),
                kind,
                "placementGroupLifecycleEvent",
            )?),
            EventType::SUBMISSION_JOB_DEFINITION_EVENT => P::SubmissionJobDefinition(required(
                wire.submission_job_definition_event.take(),
                kind,
                "submissionJobDefinitionEvent",
            )?),
            EventType::SUBMISSION_JOB_LIFECYCLE_EVENT => P::SubmissionJobLifecycle(required(
                wire.submission_job_lifecycle_event.take(),
                kind,
                "submissionJobLifecycleEvent",
            )?),
            EventType::PLATFORM_EVENT => {
                P::Platform(required(wire.platform_event.take(), kind, "platformEvent")?)
            }
            EventType::EVENT_TYPE_UNSPECIFIED | EventType::Unknown(_) => P::Unknown,
        };
        Ok(Self {
            event_id: wire.event_id,
            source_type: wire.source_type,
            event_type: wire.event_type,
            timestamp: wire.timestamp,
            severity: wire.severity,
            message: wire.message,
            session_name: wire.session_name,
            node_id: wire.node_id,
            payload,
        })
    }
}

impl EventPayload {
    /// The event type that carries this payload (the 2.51+ name for a lifecycle); `None` for
    /// [`EventPayload::Unknown`].
    pub fn event_type(&self) -> Option<EventType> {
        self.wire_key().map(|(_, event_type)| event_type)
    }

    /// The camelCase envelope key Ray 2.60 puts this payload under, and the event type that
    /// names it; `None` for [`EventPayload::Unknown`].
    fn wire_key(&self) -> Option<(&'static str, EventType)> {
        use EventPayload as P;
        Some(match self {
            P::TaskDefinition(_) => ("taskDefinitionEvent", EventType::TASK_DEFINITION_EVENT),
            P::ActorTaskDefinition(_) => (
                "actorTaskDefinitionEvent",
                EventType::ACTOR_TASK_DEFINITION_EVENT,
            ),
            P::TaskLifecycle(_) => ("taskLifecycleEvent", EventType::TASK_LIFECYCLE_EVENT),
            P::TaskProfile(_) => ("taskProfileEvents", EventType::TASK_PROFILE_EVENT),
            P::DriverJobDefinition(_) => (
                "driverJobDefinitionEvent",
                EventType::DRIVER_JOB_DEFINITION_EVENT,
            ),
            P::DriverJobLifecycle(_) => (
                "driverJobLifecycleEvent",
                EventType::DRIVER_JOB_LIFECYCLE_EVENT,
            ),
            P::ActorDefinition(_) => ("actorDefinitionEvent", EventType::ACTOR_DEFINITION_EVENT),
            P::ActorLifecycle(_) => ("actorLifecycleEvent", EventType::ACTOR_LIFECYCLE_EVENT),
            P::NodeDefinition(_) => ("nodeDefinitionEvent", EventType::NODE_DEFINITION_EVENT),
            P::NodeLifecycle(_) => ("nodeLifecycleEvent", EventType::NODE_LIFECYCLE_EVENT),
            P::WorkerDefinition(_) => ("workerDefinitionEvent", EventType::WORKER_DEFINITION_EVENT),
            P::WorkerLifecycle(_) => ("workerLifecycleEvent", EventType::WORKER_LIFECYCLE_EVENT),
            P::PlacementGroupDefinition(_) => (
                "placementGroupDefinitionEvent",
                EventType::PLACEMENT_GROUP_DEFINITION_EVENT,
            ),
            P::PlacementGroupLifecycle(_) => (
                "placementGroupLifecycleEvent",
                EventType::PLACEMENT_GROUP_LIFECYCLE_EVENT,
            ),
            P::SubmissionJobDefinition(_) => (
                "submissionJobDefinitionEvent",
                EventType::SUBMISSION_JOB_DEFINITION_EVENT,
            ),
            P::SubmissionJobLifecycle(_) => (
                "submissionJobLifecycleEvent",
                EventType::SUBMISSION_JOB_LIFECYCLE_EVENT,
            ),
            P::Platform(_) => ("platformEvent", EventType::PLATFORM_EVENT),
            P::Unknown => return None,
        })
    }
}

/// Writes the event as Ray 2.60's aggregator sends it: camelCase keys in Ray's order, base64
/// IDs, RFC 3339 times, 64-bit integers as strings. A 2.49–2.50 `TASK_EXECUTION_EVENT` is written
/// in the lifecycle shape it was read into; an unknown type is written without a payload (its
/// raw text is what storage keeps). [`RayEvent::from_json`] reads the output back unchanged.
impl Serialize for RayEvent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let wire_key = self.payload.wire_key();
        let event_type = wire_key.as_ref().map_or(&self.event_type, |(_, kind)| kind);
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry(
            "eventId",
            &self
                .event_id
                .as_ref()
                .map(EventId::to_base64)
                .unwrap_or_default(),
        )?;
        map.serialize_entry("sourceType", &self.source_type)?;
        map.serialize_entry("eventType", event_type)?;
        if let Some(timestamp) = &self.timestamp {
            map.serialize_entry("timestamp", timestamp)?;
        }
        map.serialize_entry("severity", &self.severity)?;
        map.serialize_entry("sessionName", &self.session_name)?;
        if let Some((key, _)) = wire_key {
            use EventPayload as P;
            match &self.payload {
                P::TaskDefinition(payload) => map.serialize_entry(key, payload)?,
                P::ActorTaskDefinition(payload) => map.serialize_entry(key, payload)?,
                P::TaskLifecycle(payload) => map.serialize_entry(key, payload)?,
                P::TaskProfile(payload) => map.serialize_entry(key, payload)?,
                P::DriverJobDefinition(payload) => map.serialize_entry(key, payload)?,
                P::DriverJobLifecycle(payload) => map.serialize_entry(key, payload)?,
                P::ActorDefinition(payload) => map.serialize_entry(key, payload)?,
                P::ActorLifecycle(payload) => map.serialize_entry(key, payload)?,
                P::NodeDefinition(payload) => map.serialize_entry(key, payload)?,
                P::NodeLifecycle(payload) => map.serialize_entry(key, payload)?,
                P::WorkerDefinition(payload) => map.serialize_entry(key, payload)?,
                P::WorkerLifecycle(payload) => map.serialize_entry(key, payload)?,
                P::PlacementGroupDefinition(payload) => map.serialize_entry(key, payload)?,
                P::PlacementGroupLifecycle(payload) => map.serialize_entry(key, payload)?,
                P::SubmissionJobDefinition(payload) => map.serialize_entry(key, payload)?,
                P::SubmissionJobLifecycle(payload) => map.serialize_entry(key, payload)?,
                P::Platform(payload) => map.serialize_entry(key, payload)?,
                P::Unknown => {}
            }
        }
        map.serialize_entry(
            "nodeId",
            &self.node_id.as_ref().map(Id::to_base64).unwrap_or_default(),
        )?;
        map.serialize_entry("message", &self.message)?;
        map.end()
    }
}

/// Why a request body is not a batch of Ray events.
#[derive(Debug, thiserror::Error)]
#[error("request body is not a JSON array of Ray events: {0}")]
pub struct BatchError(#[from] serde_json::Error);

/// Splits a POST body (a JSON array) into its events' raw JSON texts, exactly as received.
///
/// Only the array structure is checked; each element is read later, one at a time, so that a
/// malformed or unknown event never costs the rest of its batch.
pub fn split_batch(body: &[u8]) -> Result<Vec<&RawValue>, BatchError> {
    Ok(serde_json::from_slice(body)?)
}

#[cfg(test)]
mod tests {
    use super::common::{ErrorType, TaskStatus, TaskType};
    use super::*;

    /// The owner-side lifecycle event of reference §2.5, verbatim.
    const OWNER_FAILED: &str = r#"{"eventId": "ttKOyLdbD15DlhqmkKD8fhAxmYuFEOu0wUqlpQ==", "sourceType": "CORE_WORKER", "eventType": "TASK_LIFECYCLE_EVENT", "timestamp": "2026-11-22T06:14:57.121203660Z", "severity": "INFO", "sessionName": "session_2026-11-22_06-14-46_050039_15318", "taskLifecycleEvent": {"taskId": "FjEKDwpFr1z///////////////8BAAAA", "stateTransitions": [{"state": "PENDING_ARGS_AVAIL", "timestamp": "2026-11-22T06:14:57.115116155Z"}, {"state": "FAILED", "timestamp": "2026-11-22T06:14:57.121203660Z"}], "rayErrorInfo": {"errorMessage": "User exception:\n\u001b[36mray::boom_task()\u001b[39m", "errorType": "TASK_EXECUTION_EXCEPTION"}, "nodeId": "CPIoGPtX5DmhSrfP6qC5bD2pqJtAy2bpi8HCNQ==", "workerId": "8Zy3Giv+Cb+LZ51kg5h3TLo+QBetp55HBzMNsA==", "jobId": "AQAAAA==", "taskAttempt": 0, "workerPid": 0}, "nodeId": "CPIoGPtX5DmhSrfP6qC5bD2pqJtAy2bpi8HCNQ==", "message": ""}"#;

    fn lifecycle(event: &RayEvent) -> Option<&TaskLifecycleEvent> {
        match &event.payload {
            EventPayload::TaskLifecycle(lifecycle) => Some(lifecycle),
            _ => None,
        }
    }

    #[test]
    fn camel_case_lifecycle_reads_every_field() -> Result<(), Box<dyn std::error::Error>> {
        let event = RayEvent::from_json(OWNER_FAILED)?;
        assert_eq!(event.event_type, EventType::TASK_LIFECYCLE_EVENT);
        assert_eq!(event.source_type, SourceType::CORE_WORKER);
        let body = lifecycle(&event).ok_or("not a lifecycle")?;
        assert_eq!(
            body.task_id.as_ref().map(Id::as_hex),
            Some("16310a0f0a45af5cffffffffffffffffffffffff01000000")
        );
        assert_eq!(body.state_transitions.len(), 2);
        assert_eq!(body.state_transitions[1].state, TaskStatus::FAILED);
        let error = body.ray_error_info.as_ref().ok_or("no error")?;
        assert_eq!(error.error_type, ErrorType::TASK_EXECUTION_EXCEPTION);
        assert!(error.error_message.contains("\u{1b}[36m"));
        assert_eq!(body.job_id.as_ref().map(Id::as_hex), Some("01000000"));
        assert_eq!(body.worker_pid, 0);
        Ok(())
    }

    #[test]
    fn snake_case_keys_read_the_same_as_camel_case() -> Result<(), Box<dyn std::error::Error>> {
        let snake = OWNER_FAILED
            .replace("eventId", "event_id")
            .replace("sourceType", "source_type")
            .replace("eventType", "event_type")
            .replace("sessionName", "session_name")
            .replace("taskLifecycleEvent", "task_lifecycle_event")
            .replace("taskId", "task_id")
            .replace("stateTransitions", "state_transitions")
            .replace("rayErrorInfo", "ray_error_info")
            .replace("errorMessage", "error_message")
            .replace("errorType", "error_type")
            .replace("nodeId", "node_id")
            .replace("workerId", "worker_id")
            .replace("jobId", "job_id")
            .replace("taskAttempt", "task_attempt")
            .replace("workerPid", "worker_pid");
        let camel = RayEvent::from_json(OWNER_FAILED)?;
        let snake = RayEvent::from_json(&snake)?;
        assert_eq!(format!("{camel:?}"), format!("{snake:?}"));
        Ok(())
    }

    #[test]
    fn unknown_event_types_and_fields_do_not_fail() -> Result<(), EventError> {
        let event = RayEvent::from_json(
            r#"{"eventId": "AQAAAA==", "eventType": "AUTOSCALER_SCALING_DECISION_EVENT",
                "autoscalerScalingDecisionEvent": {"x": 1}, "brandNewField": [1, 2]}"#,
        )?;
        assert!(matches!(event.payload, EventPayload::Unknown));
        assert_eq!(
            event.event_type.as_str(),
            "AUTOSCALER_SCALING_DECISION_EVENT"
        );
        let known = RayEvent::from_json(
            r#"{"eventType": "TASK_DEFINITION_EVENT",
                "taskDefinitionEvent": {"taskId": "AQAAAA==", "taskType": "QUANTUM_TASK", "futureField": {}}}"#,
        )?;
        match known.payload {
            EventPayload::TaskDefinition(definition) => {
                assert_eq!(
                    definition.task_type,
                    TaskType::Unknown("QUANTUM_TASK".into())
                );
            }
            other => panic!("expected a task definition, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn a_known_type_without_its_payload_is_an_error_naming_the_key() {
        let err = RayEvent::from_json(r#"{"eventType": "NODE_LIFECYCLE_EVENT"}"#).err();
        assert!(err.is_some_and(|err| err.to_string().contains("nodeLifecycleEvent")));
    }

    #[test]
    fn legacy_task_execution_events_become_lifecycles() -> Result<(), Box<dyn std::error::Error>> {
        // The 2.49/2.50 shape of reference §6.
        let event = RayEvent::from_json(
            r#"{"sourceType": "CORE_WORKER", "eventType": "TASK_EXECUTION_EVENT",
                "timestamp": "2025-09-03T18:52:14.469074Z", "severity": "INFO", "sessionName": "session_x",
                "taskExecutionEvent": {"taskId": "yO9FzNARJXH///////////////8BAAAA",
                  "taskState": {"1": "2025-09-03T18:52:14.467290Z", "12": "2025-09-03T18:52:14.469074Z"},
                  "rayErrorInfo": {"errorMessage": "boom", "errorType": "WORKER_DIED"},
                  "jobId": "AQAAAA==", "taskAttempt": 0, "nodeId": "", "workerId": "", "workerPid": 0},
                "eventId": "", "message": ""}"#,
        )?;
        let body = lifecycle(&event).ok_or("not a lifecycle")?;
        let states: Vec<_> = body
            .state_transitions
            .iter()
            .map(|t| t.state.clone())
            .collect();
        assert_eq!(states, [TaskStatus::PENDING_ARGS_AVAIL, TaskStatus::FAILED]);
        assert_eq!(body.node_id, None);
        assert_eq!(event.event_id, None);
        Ok(())
    }

    #[test]
    fn malformed_known_fields_are_errors() {
        for bad in [
            r#"{"eventType": "TASK_LIFECYCLE_EVENT", "taskLifecycleEvent": {"taskId": "%%%"}}"#,
            r#"{"eventType": "TASK_LIFECYCLE_EVENT", "timestamp": "noon", "taskLifecycleEvent": {}}"#,
            r#"{"eventType": "TASK_LIFECYCLE_EVENT", "taskLifecycleEvent": {"taskAttempt": "x"}}"#,
            r#"[1, 2]"#,
            r#"not json"#,
        ] {
            assert!(RayEvent::from_json(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn batches_split_into_raw_events_verbatim() -> Result<(), BatchError> {
        let body = br#"[{"a": 1, "b": [2, 3]}, {"eventType": "X"}]"#;
        let events = split_batch(body)?;
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].get(), r#"{"a": 1, "b": [2, 3]}"#);
        assert_eq!(events[1].get(), r#"{"eventType": "X"}"#);
        assert!(split_batch(br#"{"not": "an array"}"#).is_err());
        assert!(split_batch(b"[1, 2").is_err());
        assert!(split_batch(b"").is_err());
        Ok(())
    }
}
