//! Job-submission and platform events (2.55+): `ray job submit` jobs and events from the
//! platform Ray runs on (KubeRay, Slurm).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::encoding::{Id, Timestamp, int64, opt_id, ray_enum};

/// `SUBMISSION_JOB_DEFINITION_EVENT`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SubmissionJobDefinitionEvent {
    /// The submission id (`raysubmit_…`), a string rather than bytes.
    #[serde(alias = "submission_id")]
    pub submission_id: String,
    /// The entrypoint command.
    pub entrypoint: String,
    /// Runtime environment and metadata.
    pub config: SubmissionJobConfig,
}

/// `SubmissionJobDefinitionEvent.Config`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SubmissionJobConfig {
    /// The runtime environment as JSON text.
    #[serde(alias = "serialized_runtime_env")]
    pub serialized_runtime_env: String,
    /// User metadata.
    pub metadata: BTreeMap<String, String>,
}

ray_enum! {
    /// `SubmissionJobLifecycleEvent.State`.
    pub enum SubmissionJobState {
        UNSPECIFIED = 0,
        PENDING = 1,
        RUNNING = 2,
        STOPPED = 3,
        SUCCEEDED = 4,
        FAILED = 5,
    }
}

/// `SubmissionJobLifecycleEvent.StateTransition`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SubmissionJobStateTransition {
    /// The state entered.
    #[serde(default)]
    pub state: SubmissionJobState,
    /// When.
    pub timestamp: Timestamp,
    /// Details of the state.
    #[serde(default)]
    pub message: String,
    /// Error category, when failed.
    #[serde(default, alias = "error_type")]
    pub error_type: String,
    /// Node running the driver.
    #[serde(default, alias = "driver_node_id", with = "opt_id")]
    pub driver_node_id: Option<Id>,
    /// Exit code of the driver, once it exited.
    #[serde(
        default,
        alias = "driver_exit_code",
        skip_serializing_if = "Option::is_none"
    )]
    pub driver_exit_code: Option<i32>,
}

/// `SUBMISSION_JOB_LIFECYCLE_EVENT`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SubmissionJobLifecycleEvent {
    /// The submission id.
    #[serde(alias = "submission_id")]
    pub submission_id: String,
    /// States entered.
    #[serde(alias = "state_transitions")]
    pub state_transitions: Vec<SubmissionJobStateTransition>,
}

/// `PLATFORM_EVENT`: something the platform under Ray reported (a pod OOM-killed, …).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PlatformEvent {
    /// The platform's own event id (a string).
    #[serde(alias = "event_id")]
    pub event_id: String,
    /// Who emitted it.
    pub source: PlatformSource,
    /// Kind of object concerned (`Pod`, `RayCluster`).
    #[serde(alias = "object_kind")]
    pub object_kind: String,
    /// Name of the object concerned.
    #[serde(alias = "object_name")]
    pub object_name: String,
    /// What happened, in words.
    pub message: String,
    /// What happened, as a short code (`OOMKilled`).
    pub reason: String,
    /// When (ns since the epoch).
    #[serde(alias = "timestamp_ns", with = "int64")]
    pub timestamp_ns: i64,
    /// Platform-specific extras.
    #[serde(alias = "custom_fields")]
    pub custom_fields: BTreeMap<String, String>,
}

/// `PlatformEvent.Source`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct PlatformSource {
    /// Platform name (`kubernetes`, `slurm`).
    pub platform: String,
    /// Component of the platform (`kubelet`).
    pub component: String,
    /// Source metadata.
    pub metadata: BTreeMap<String, String>,
}
