//! Task events: definitions (normal and actor tasks), lifecycles and profiles.
//!
//! A task attempt is `(task_id, task_attempt)`. Its definition comes once from the owner; its
//! lifecycle arrives in pieces from the owner and the executor, in any order (reference §4.2).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::{FunctionDescriptor, Language, RayErrorInfo, TaskStatus, TaskType};
use super::encoding::{Id, Timestamp, id_map, int64, opt_id, opt_int64};

/// `TASK_DEFINITION_EVENT`: what a normal, actor-creation or driver task is.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TaskDefinitionEvent {
    /// The task (24 bytes; its last 4 are the job id).
    #[serde(alias = "task_id", with = "opt_id")]
    pub task_id: Option<Id>,
    /// Attempt number: 0 for the first execution, +1 per retry.
    #[serde(alias = "task_attempt")]
    pub task_attempt: i32,
    /// `NORMAL_TASK`, `ACTOR_CREATION_TASK` or `DRIVER_TASK`.
    #[serde(alias = "task_type")]
    pub task_type: TaskType,
    /// Language of the function.
    pub language: Language,
    /// The function run.
    #[serde(alias = "task_func")]
    pub task_func: FunctionDescriptor,
    /// User-visible name (`.options(name=…)` or the function name).
    #[serde(alias = "task_name")]
    pub task_name: String,
    /// Resources the task asked for.
    #[serde(alias = "required_resources")]
    pub required_resources: BTreeMap<String, f64>,
    /// Owning job.
    #[serde(alias = "job_id", with = "opt_id")]
    pub job_id: Option<Id>,
    /// The task that submitted this one (the driver task for top-level tasks).
    #[serde(alias = "parent_task_id", with = "opt_id")]
    pub parent_task_id: Option<Id>,
    /// Placement group, or the nil id.
    #[serde(alias = "placement_group_id", with = "opt_id")]
    pub placement_group_id: Option<Id>,
    /// Correlation ids (task labels).
    #[serde(alias = "ref_ids", with = "id_map")]
    pub ref_ids: BTreeMap<String, Id>,
    /// The runtime environment as JSON text.
    #[serde(alias = "serialized_runtime_env")]
    pub serialized_runtime_env: String,
    /// Where the task was submitted from, when Ray records call sites.
    #[serde(alias = "call_site", skip_serializing_if = "Option::is_none")]
    pub call_site: Option<String>,
    /// Label selector for scheduling.
    #[serde(alias = "label_selector")]
    pub label_selector: BTreeMap<String, String>,
    /// True when the task creates a detached actor.
    #[serde(alias = "is_detached_actor")]
    pub is_detached_actor: bool,
}

/// `ACTOR_TASK_DEFINITION_EVENT`: an actor method call. Its task type is always `ACTOR_TASK`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ActorTaskDefinitionEvent {
    /// The task (24 bytes; its last 16 are the actor id).
    #[serde(alias = "task_id", with = "opt_id")]
    pub task_id: Option<Id>,
    /// Attempt number.
    #[serde(alias = "task_attempt")]
    pub task_attempt: i32,
    /// Language of the method.
    pub language: Language,
    /// The method run.
    #[serde(alias = "actor_func")]
    pub actor_func: FunctionDescriptor,
    /// User-visible name, `Class.method` unless renamed.
    #[serde(alias = "actor_task_name")]
    pub actor_task_name: String,
    /// Resources the call asked for.
    #[serde(alias = "required_resources")]
    pub required_resources: BTreeMap<String, f64>,
    /// Owning job.
    #[serde(alias = "job_id", with = "opt_id")]
    pub job_id: Option<Id>,
    /// The actor the method runs on.
    #[serde(alias = "actor_id", with = "opt_id")]
    pub actor_id: Option<Id>,
    /// The task that made the call.
    #[serde(alias = "parent_task_id", with = "opt_id")]
    pub parent_task_id: Option<Id>,
    /// Placement group, or the nil id.
    #[serde(alias = "placement_group_id", with = "opt_id")]
    pub placement_group_id: Option<Id>,
    /// Correlation ids.
    #[serde(alias = "ref_ids", with = "id_map")]
    pub ref_ids: BTreeMap<String, Id>,
    /// The runtime environment as JSON text.
    #[serde(alias = "serialized_runtime_env")]
    pub serialized_runtime_env: String,
    /// Where the call was made from.
    #[serde(alias = "call_site", skip_serializing_if = "Option::is_none")]
    pub call_site: Option<String>,
    /// Label selector for scheduling.
    #[serde(alias = "label_selector")]
    pub label_selector: BTreeMap<String, String>,
    /// True when the actor is detached.
    #[serde(alias = "is_detached_actor")]
    pub is_detached_actor: bool,
}

/// One `(state, timestamp)` pair of a task attempt's life.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct TaskStateTransition {
    /// The status entered.
    #[serde(default)]
    pub state: TaskStatus,
    /// When it was entered.
    pub timestamp: Timestamp,
}

/// `TaskLifecycleEvent.TaskLogInfo`: where the attempt's output went. From 2.58 each field may
/// be absent; the owner's and executor's halves are merged field by field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TaskLogInfo {
    /// Absolute path of the worker's stdout file.
    #[serde(alias = "stdout_file", skip_serializing_if = "Option::is_none")]
    pub stdout_file: Option<String>,
    /// Absolute path of the worker's stderr file.
    #[serde(alias = "stderr_file", skip_serializing_if = "Option::is_none")]
    pub stderr_file: Option<String>,
    /// Offset in stdout where the attempt's output starts.
    #[serde(
        alias = "stdout_start",
        with = "opt_int64",
        skip_serializing_if = "Option::is_none"
    )]
    pub stdout_start: Option<i64>,
    /// Offset in stdout where it ends.
    #[serde(
        alias = "stdout_end",
        with = "opt_int64",
        skip_serializing_if = "Option::is_none"
    )]
    pub stdout_end: Option<i64>,
    /// Offset in stderr where the attempt's output starts.
    #[serde(
        alias = "stderr_start",
        with = "opt_int64",
        skip_serializing_if = "Option::is_none"
    )]
    pub stderr_start: Option<i64>,
    /// Offset in stderr where it ends.
    #[serde(
        alias = "stderr_end",
        with = "opt_int64",
        skip_serializing_if = "Option::is_none"
    )]
    pub stderr_end: Option<i64>,
}

/// `TASK_LIFECYCLE_EVENT` (2.51+), and the 2.49–2.50 `TASK_EXECUTION_EVENT` converted to it.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TaskLifecycleEvent {
    /// The task.
    #[serde(alias = "task_id", with = "opt_id")]
    pub task_id: Option<Id>,
    /// Attempt number.
    #[serde(alias = "task_attempt")]
    pub task_attempt: i32,
    /// States entered, in no guaranteed order.
    #[serde(alias = "state_transitions")]
    pub state_transitions: Vec<TaskStateTransition>,
    /// Why the attempt failed; only on the owner's `FAILED`.
    #[serde(alias = "ray_error_info", skip_serializing_if = "Option::is_none")]
    pub ray_error_info: Option<RayErrorInfo>,
    /// Node the attempt was submitted to (owner side; empty from the executor).
    #[serde(alias = "node_id", with = "opt_id")]
    pub node_id: Option<Id>,
    /// Worker the attempt was submitted to (owner side; empty from the executor).
    #[serde(alias = "worker_id", with = "opt_id")]
    pub worker_id: Option<Id>,
    /// Executor's pid (0 from the owner).
    #[serde(alias = "worker_pid")]
    pub worker_pid: u32,
    /// Owning job.
    #[serde(alias = "job_id", with = "opt_id")]
    pub job_id: Option<Id>,
    /// True while paused in the debugger.
    #[serde(alias = "is_debugger_paused", skip_serializing_if = "Option::is_none")]
    pub is_debugger_paused: Option<bool>,
    /// The actor's `__repr__`, for actor tasks.
    #[serde(alias = "actor_repr_name", skip_serializing_if = "Option::is_none")]
    pub actor_repr_name: Option<String>,
    /// Log file locations.
    #[serde(alias = "task_log_info", skip_serializing_if = "Option::is_none")]
    pub task_log_info: Option<TaskLogInfo>,
}

/// `TASK_EXECUTION_EVENT` as sent by Ray 2.49–2.50: transitions are a map from the `TaskStatus`
/// number (as a decimal string) to a timestamp.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct LegacyTaskExecutionEvent {
    #[serde(alias = "task_id", with = "opt_id")]
    task_id: Option<Id>,
    #[serde(alias = "task_attempt")]
    task_attempt: i32,
    #[serde(alias = "task_state")]
    task_state: BTreeMap<String, Timestamp>,
    #[serde(alias = "ray_error_info")]
    ray_error_info: Option<RayErrorInfo>,
    #[serde(alias = "node_id", with = "opt_id")]
    node_id: Option<Id>,
    #[serde(alias = "worker_id", with = "opt_id")]
    worker_id: Option<Id>,
    #[serde(alias = "worker_pid")]
    worker_pid: u32,
    #[serde(alias = "job_id", with = "opt_id")]
    job_id: Option<Id>,
}

impl LegacyTaskExecutionEvent {
    /// The same facts in the 2.51+ shape. A state key that is not a number becomes an unknown
    /// status rather than failing the event.
    pub(crate) fn into_lifecycle(self) -> TaskLifecycleEvent {
        let state_transitions = self
            .task_state
            .into_iter()
            .map(|(number, timestamp)| TaskStateTransition {
                state: number.parse::<i64>().map_or_else(
                    |_| TaskStatus::Unknown(number.into_boxed_str()),
                    TaskStatus::from_number,
                ),
                timestamp,
            })
            .collect();
        TaskLifecycleEvent {
            task_id: self.task_id,
            task_attempt: self.task_attempt,
            state_transitions,
            ray_error_info: self.ray_error_info,
            node_id: self.node_id,
            worker_id: self.worker_id,
            worker_pid: self.worker_pid,
            job_id: self.job_id,
            ..TaskLifecycleEvent::default()
        }
    }
}

/// `TASK_PROFILE_EVENT` (payload key `taskProfileEvents`): timed spans inside an attempt.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TaskProfileEvents {
    /// The task.
    #[serde(alias = "task_id", with = "opt_id")]
    pub task_id: Option<Id>,
    /// Attempt number (named `attempt_number` here, unlike every other task event).
    #[serde(alias = "attempt_number")]
    pub attempt_number: i32,
    /// Owning job.
    #[serde(alias = "job_id", with = "opt_id")]
    pub job_id: Option<Id>,
    /// The spans and where they were recorded.
    #[serde(alias = "profile_events")]
    pub profile_events: ProfileEvents,
}

/// `ray.rpc.ProfileEvents`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProfileEvents {
    /// Kind of process (`worker`, `driver`).
    #[serde(alias = "component_type")]
    pub component_type: String,
    /// The worker that recorded the spans.
    #[serde(alias = "component_id", with = "opt_id")]
    pub component_id: Option<Id>,
    /// IP address of its node.
    #[serde(alias = "node_ip_address")]
    pub node_ip_address: String,
    /// The spans.
    pub events: Vec<ProfileEventEntry>,
}

/// `ray.rpc.ProfileEventEntry`: one span, nanoseconds since the epoch.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProfileEventEntry {
    /// Span start (ns).
    #[serde(alias = "start_time", with = "int64")]
    pub start_time: i64,
    /// Span end (ns).
    #[serde(alias = "end_time", with = "int64")]
    pub end_time: i64,
    /// JSON text with details (for `task:execute`, the exception and traceback).
    #[serde(alias = "extra_data", skip_serializing_if = "Option::is_none")]
    pub extra_data: Option<String>,
    /// Span name, such as `task:execute`.
    #[serde(alias = "event_name")]
    pub event_name: String,
}
