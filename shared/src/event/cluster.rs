//! GCS-side events: driver jobs, actors, nodes, workers and placement groups.
//!
//! Each entity has a definition (sent once) and lifecycle events whose `state_transitions` are
//! to be concatenated over the entity's life.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::ActorDeathCause;
use super::encoding::{Id, Timestamp, id_map, int64, opt_id, opt_int64, ray_enum};

/// `DRIVER_JOB_DEFINITION_EVENT`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DriverJobDefinitionEvent {
    /// The job (4 bytes).
    #[serde(alias = "job_id", with = "opt_id")]
    pub job_id: Option<Id>,
    /// Pid of the driver process.
    #[serde(alias = "driver_pid", with = "int64")]
    pub driver_pid: i64,
    /// Node the driver runs on.
    #[serde(alias = "driver_node_id", with = "opt_id")]
    pub driver_node_id: Option<Id>,
    /// The driver's command line.
    pub entrypoint: String,
    /// Runtime environment and metadata.
    pub config: DriverJobConfig,
}

/// `DriverJobDefinitionEvent.Config`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DriverJobConfig {
    /// The runtime environment as JSON text.
    #[serde(alias = "serialized_runtime_env")]
    pub serialized_runtime_env: String,
    /// User metadata.
    pub metadata: BTreeMap<String, String>,
}

ray_enum! {
    /// `DriverJobLifecycleEvent.State`.
    pub enum DriverJobState { UNSPECIFIED = 0, CREATED = 1, FINISHED = 2 }
}

/// `DRIVER_JOB_LIFECYCLE_EVENT`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DriverJobLifecycleEvent {
    /// The job.
    #[serde(alias = "job_id", with = "opt_id")]
    pub job_id: Option<Id>,
    /// States entered.
    #[serde(alias = "state_transitions")]
    pub state_transitions: Vec<StateTransition<DriverJobState>>,
}

/// A `(state, timestamp)` pair of an entity with no per-transition details.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct StateTransition<S> {
    /// The state entered.
    #[serde(default)]
    pub state: S,
    /// When.
    pub timestamp: Timestamp,
}

/// `ACTOR_DEFINITION_EVENT`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ActorDefinitionEvent {
    /// The actor (16 bytes; its last 4 are the job id).
    #[serde(alias = "actor_id", with = "opt_id")]
    pub actor_id: Option<Id>,
    /// Owning job.
    #[serde(alias = "job_id", with = "opt_id")]
    pub job_id: Option<Id>,
    /// True for detached actors.
    #[serde(alias = "is_detached")]
    pub is_detached: bool,
    /// Name, if the actor is named.
    pub name: String,
    /// Namespace of the name.
    #[serde(alias = "ray_namespace")]
    pub ray_namespace: String,
    /// The runtime environment as JSON text.
    #[serde(alias = "serialized_runtime_env")]
    pub serialized_runtime_env: String,
    /// Actor class.
    #[serde(alias = "class_name")]
    pub class_name: String,
    /// Resources the actor holds.
    #[serde(alias = "required_resources")]
    pub required_resources: BTreeMap<String, f64>,
    /// Placement group, if any.
    #[serde(alias = "placement_group_id", with = "opt_id")]
    pub placement_group_id: Option<Id>,
    /// Label selector for scheduling.
    #[serde(alias = "label_selector")]
    pub label_selector: BTreeMap<String, String>,
    /// Where the actor was created from.
    #[serde(alias = "call_site")]
    pub call_site: String,
    /// The task or actor that created it.
    #[serde(alias = "parent_id", with = "opt_id")]
    pub parent_id: Option<Id>,
    /// Correlation ids.
    #[serde(alias = "ref_ids", with = "id_map")]
    pub ref_ids: BTreeMap<String, Id>,
}

ray_enum! {
    /// `ActorLifecycleEvent.State`.
    pub enum ActorState {
        DEPENDENCIES_UNREADY = 0,
        PENDING_CREATION = 1,
        ALIVE = 2,
        RESTARTING = 3,
        DEAD = 4,
    }
}

ray_enum! {
    /// `ActorLifecycleEvent.RestartReason`; printed on every transition, meaningful only on
    /// `RESTARTING`.
    pub enum ActorRestartReason { ACTOR_FAILURE = 0, LINEAGE_RECONSTRUCTION = 1, NODE_PREEMPTION = 2 }
}

/// `ActorLifecycleEvent.StateTransition`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActorStateTransition {
    /// The state entered.
    #[serde(default)]
    pub state: ActorState,
    /// When.
    pub timestamp: Timestamp,
    /// Node, when `ALIVE`.
    #[serde(default, alias = "node_id", with = "opt_id")]
    pub node_id: Option<Id>,
    /// Worker, when `ALIVE`.
    #[serde(default, alias = "worker_id", with = "opt_id")]
    pub worker_id: Option<Id>,
    /// The actor's `__repr__`.
    #[serde(default, alias = "repr_name")]
    pub repr_name: String,
    /// Why it died, when `DEAD`.
    #[serde(
        default,
        alias = "death_cause",
        skip_serializing_if = "Option::is_none"
    )]
    pub death_cause: Option<ActorDeathCause>,
    /// Worker pid, when `ALIVE`.
    #[serde(default)]
    pub pid: u32,
    /// Worker port, when `ALIVE`.
    #[serde(default)]
    pub port: i32,
    /// Why it restarts, when `RESTARTING`.
    #[serde(default, alias = "restart_reason")]
    pub restart_reason: ActorRestartReason,
}

/// `ACTOR_LIFECYCLE_EVENT`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ActorLifecycleEvent {
    /// The actor.
    #[serde(alias = "actor_id", with = "opt_id")]
    pub actor_id: Option<Id>,
    /// States entered.
    #[serde(alias = "state_transitions")]
    pub state_transitions: Vec<ActorStateTransition>,
}

/// `NODE_DEFINITION_EVENT`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NodeDefinitionEvent {
    /// The node (28 bytes).
    #[serde(alias = "node_id", with = "opt_id")]
    pub node_id: Option<Id>,
    /// Its IP address.
    #[serde(alias = "node_ip_address")]
    pub node_ip_address: String,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// When the node started.
    #[serde(alias = "start_timestamp", skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<Timestamp>,
    /// Host name.
    pub hostname: String,
    /// Node name.
    #[serde(alias = "node_name")]
    pub node_name: String,
    /// Cloud instance id.
    #[serde(alias = "instance_id")]
    pub instance_id: String,
    /// Cloud instance type.
    #[serde(alias = "instance_type_name")]
    pub instance_type_name: String,
}

ray_enum! {
    /// `NodeLifecycleEvent.State`.
    pub enum NodeState { ALIVE = 0, DEAD = 1 }
}

ray_enum! {
    /// `NodeLifecycleEvent.AliveSubState`.
    pub enum NodeAliveSubState { UNSPECIFIED = 0, DRAINING = 1 }
}

ray_enum! {
    /// `NodeLifecycleEvent.DeathInfo.Reason`.
    pub enum NodeDeathReason {
        UNSPECIFIED = 0,
        EXPECTED_TERMINATION = 1,
        UNEXPECTED_TERMINATION = 2,
        AUTOSCALER_DRAIN_PREEMPTED = 3,
        AUTOSCALER_DRAIN_IDLE = 4,
    }
}

/// `NodeLifecycleEvent.DeathInfo`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NodeDeathInfo {
    /// Why, as an enum.
    pub reason: NodeDeathReason,
    /// Why, in words.
    #[serde(alias = "reason_message")]
    pub reason_message: String,
}

/// `NodeLifecycleEvent.StateTransition`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStateTransition {
    /// The state entered.
    #[serde(default)]
    pub state: NodeState,
    /// When.
    pub timestamp: Timestamp,
    /// Total resources, when `ALIVE`.
    #[serde(default)]
    pub resources: BTreeMap<String, f64>,
    /// Why it died, when `DEAD`.
    #[serde(default, alias = "death_info", skip_serializing_if = "Option::is_none")]
    pub death_info: Option<NodeDeathInfo>,
    /// Draining or not, when `ALIVE`.
    #[serde(default, alias = "alive_sub_state")]
    pub alive_sub_state: NodeAliveSubState,
}

/// `NODE_LIFECYCLE_EVENT`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NodeLifecycleEvent {
    /// The node.
    #[serde(alias = "node_id", with = "opt_id")]
    pub node_id: Option<Id>,
    /// States entered.
    #[serde(alias = "state_transitions")]
    pub state_transitions: Vec<NodeStateTransition>,
}

ray_enum! {
    /// `ray.rpc.WorkerType`.
    pub enum WorkerType { WORKER = 0, DRIVER = 1, SPILL_WORKER = 2, RESTORE_WORKER = 3 }
}

/// `WORKER_DEFINITION_EVENT` (2.58+).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WorkerDefinitionEvent {
    /// The worker (28 bytes).
    #[serde(alias = "worker_id", with = "opt_id")]
    pub worker_id: Option<Id>,
    /// Its node.
    #[serde(alias = "node_id", with = "opt_id")]
    pub node_id: Option<Id>,
    /// Kind of worker process.
    #[serde(alias = "worker_type")]
    pub worker_type: WorkerType,
    /// Its pid.
    pub pid: u32,
}

ray_enum! {
    /// `WorkerLifecycleEvent.State`.
    pub enum WorkerState { ALIVE = 0, DEAD = 1 }
}

ray_enum! {
    /// `ray.rpc.WorkerExitType`.
    pub enum WorkerExitType {
        SYSTEM_ERROR = 0,
        INTENDED_SYSTEM_EXIT = 1,
        USER_ERROR = 2,
        INTENDED_USER_EXIT = 3,
        NODE_OUT_OF_MEMORY = 4,
    }
}

/// `WorkerLifecycleEvent.DeathInfo`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WorkerDeathInfo {
    /// How the worker exited.
    #[serde(alias = "exit_type")]
    pub exit_type: WorkerExitType,
    /// Why, in words.
    #[serde(alias = "exit_detail")]
    pub exit_detail: String,
    /// Memory in use when it was killed for memory.
    #[serde(
        alias = "memory_used_bytes",
        with = "opt_int64",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_used_bytes: Option<i64>,
}

/// `WorkerLifecycleEvent.StateTransition`. Times are Unix milliseconds; 0 means unset.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerStateTransition {
    /// The state entered.
    #[serde(default)]
    pub state: WorkerState,
    /// When.
    pub timestamp: Timestamp,
    /// When the raylet asked for the worker process.
    #[serde(default, alias = "worker_launch_time_ms", with = "int64")]
    pub worker_launch_time_ms: i64,
    /// When the process was up.
    #[serde(default, alias = "worker_launched_time_ms", with = "int64")]
    pub worker_launched_time_ms: i64,
    /// When the worker registered.
    #[serde(default, alias = "start_time_ms", with = "int64")]
    pub start_time_ms: i64,
    /// When it exited (the time Ray marks its running tasks failed).
    #[serde(default, alias = "end_time_ms", with = "int64")]
    pub end_time_ms: i64,
    /// Why it exited, when `DEAD`.
    #[serde(default, alias = "death_info", skip_serializing_if = "Option::is_none")]
    pub death_info: Option<WorkerDeathInfo>,
}

/// `WORKER_LIFECYCLE_EVENT` (2.58+).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WorkerLifecycleEvent {
    /// The worker.
    #[serde(alias = "worker_id", with = "opt_id")]
    pub worker_id: Option<Id>,
    /// The job it served.
    #[serde(alias = "job_id", with = "opt_id")]
    pub job_id: Option<Id>,
    /// States entered.
    #[serde(alias = "state_transitions")]
    pub state_transitions: Vec<WorkerStateTransition>,
}

ray_enum! {
    /// `ray.rpc.PlacementStrategy`.
    pub enum PlacementStrategy { PACK = 0, SPREAD = 1, STRICT_PACK = 2, STRICT_SPREAD = 3 }
}

/// `PlacementGroupDefinitionEvent.BundleSpec`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct BundleSpec {
    /// Position of the bundle in the group.
    #[serde(alias = "bundle_index")]
    pub bundle_index: i32,
    /// Resources of one bundle.
    #[serde(alias = "unit_resources")]
    pub unit_resources: BTreeMap<String, f64>,
    /// Label selector of the bundle.
    #[serde(alias = "label_selector")]
    pub label_selector: BTreeMap<String, String>,
}

/// `PLACEMENT_GROUP_DEFINITION_EVENT` (2.55+).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PlacementGroupDefinitionEvent {
    /// The placement group (18 bytes).
    #[serde(alias = "placement_group_id", with = "opt_id")]
    pub placement_group_id: Option<Id>,
    /// Name, if named.
    pub name: String,
    /// Namespace of the name.
    #[serde(alias = "ray_namespace")]
    pub ray_namespace: String,
    /// Packing strategy.
    pub strategy: PlacementStrategy,
    /// True for detached groups.
    #[serde(alias = "is_detached")]
    pub is_detached: bool,
    /// Job that created it.
    #[serde(alias = "creator_job_id", with = "opt_id")]
    pub creator_job_id: Option<Id>,
    /// Actor that created it, if any.
    #[serde(alias = "creator_actor_id", with = "opt_id")]
    pub creator_actor_id: Option<Id>,
    /// Its bundles.
    pub bundles: Vec<BundleSpec>,
    /// Preferred node, if any.
    #[serde(alias = "soft_target_node_id", with = "opt_id")]
    pub soft_target_node_id: Option<Id>,
    /// When GCS received the creation request (ns).
    #[serde(
        alias = "creation_request_received_ns",
        with = "opt_int64",
        skip_serializing_if = "Option::is_none"
    )]
    pub creation_request_received_ns: Option<i64>,
}

ray_enum! {
    /// `PlacementGroupLifecycleEvent.State`.
    pub enum PlacementGroupState { PENDING = 0, PREPARED = 1, CREATED = 2, REMOVED = 3, RESCHEDULING = 4 }
}

/// `PlacementGroupLifecycleEvent.StateTransition`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementGroupStateTransition {
    /// The state entered.
    #[serde(default)]
    pub state: PlacementGroupState,
    /// When.
    pub timestamp: Timestamp,
    /// Scheduler state name at the transition.
    #[serde(
        default,
        alias = "scheduling_state",
        skip_serializing_if = "Option::is_none"
    )]
    pub scheduling_state: Option<serde_json::Value>,
    /// Scheduling attempt counter.
    #[serde(default, alias = "scheduling_attempt")]
    pub scheduling_attempt: u32,
}

/// `PLACEMENT_GROUP_LIFECYCLE_EVENT` (2.55+).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PlacementGroupLifecycleEvent {
    /// The placement group.
    #[serde(alias = "placement_group_id", with = "opt_id")]
    pub placement_group_id: Option<Id>,
    /// States entered.
    #[serde(alias = "state_transitions")]
    pub state_transitions: Vec<PlacementGroupStateTransition>,
}
