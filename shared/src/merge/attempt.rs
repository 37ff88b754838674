//! One task attempt: what its events say ([`TaskDefinition`], lifecycle facts, [`LogInfo`],
//! [`ProfileSpan`]s), kept as a [`TaskAttempt`] whose merges are commutative, associative and
//! idempotent, so events and partial views may arrive in any order and any number of times.
//! The state-API row derived from it, [`TaskAttempt::view`], is `view.rs`'s.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ids::job_hex_of_task;
use super::{Reported, keep_latest};
use crate::event::EventPayload;
use crate::event::common::{Language, TaskStatus, TaskType};
use crate::event::encoding::Id;
use crate::event::task::{
    ActorTaskDefinitionEvent, TaskDefinitionEvent, TaskLifecycleEvent, TaskLogInfo,
};

/// What a definition event says about an attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskDefinition {
    /// User-visible name.
    pub name: String,
    /// Task type (`ACTOR_TASK` for actor task definitions).
    pub task_type: TaskType,
    /// Language.
    pub language: Language,
    /// Python module of the function, when Python.
    pub module_name: String,
    /// Class of the function (empty for plain functions), as the descriptor gives it.
    pub class_name: String,
    /// Function or method name.
    pub function_name: String,
    /// Submitting task.
    pub parent_task_id: Option<Id>,
    /// Actor of an actor task.
    pub actor_id: Option<Id>,
    /// Placement group.
    pub placement_group_id: Option<Id>,
    /// Requested resources.
    pub required_resources: BTreeMap<String, f64>,
    /// Runtime environment JSON.
    pub serialized_runtime_env: String,
    /// Submission call site.
    pub call_site: Option<String>,
    /// Scheduling label selector.
    pub label_selector: BTreeMap<String, String>,
}

impl TaskDefinition {
    /// From a `TASK_DEFINITION_EVENT`.
    pub fn from_task(event: TaskDefinitionEvent) -> Self {
        let (module_name, class_name, function_name) = event.task_func.into_parts();
        Self {
            name: event.task_name,
            task_type: event.task_type,
            language: event.language,
            module_name,
            class_name,
            function_name,
            parent_task_id: event.parent_task_id,
            actor_id: None,
            placement_group_id: event.placement_group_id,
            required_resources: event.required_resources,
            serialized_runtime_env: event.serialized_runtime_env,
            call_site: event.call_site,
            label_selector: event.label_selector,
        }
    }

    /// From an `ACTOR_TASK_DEFINITION_EVENT`.
    pub fn from_actor_task(event: ActorTaskDefinitionEvent) -> Self {
        let (module_name, class_name, function_name) = event.actor_func.into_parts();
        Self {
            name: event.actor_task_name,
            task_type: TaskType::ACTOR_TASK,
            language: event.language,
            module_name,
            class_name,
            function_name,
            parent_task_id: event.parent_task_id,
            actor_id: event.actor_id,
            placement_group_id: event.placement_group_id,
            required_resources: event.required_resources,
            serialized_runtime_env: event.serialized_runtime_env,
            call_site: event.call_site,
            label_selector: event.label_selector,
        }
    }

    /// Ray's `func_or_class_name`: `Class.function` with the class's last dotted part, or the
    /// function name alone.
    pub fn func_or_class_name(&self) -> String {
        if self.class_name.is_empty() {
            self.function_name.clone()
        } else {
            let short = self
                .class_name
                .rsplit('.')
                .next()
                .unwrap_or(&self.class_name);
            format!("{short}.{}", self.function_name)
        }
    }

    /// A total order over definitions, to break ties between reports made at the same instant.
    fn tie_break_key(&self) -> (&str, &str, &str) {
        (&self.name, &self.class_name, &self.function_name)
    }
}

/// Error info as the attempt reported it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReportedError {
    /// `ErrorType` name.
    pub error_type: String,
    /// The message as sent (ANSI codes included; [`super::strip_ansi`] removes them for display).
    pub message: String,
}

/// Log-file locations, merged field by field (start offsets and end offsets arrive separately).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogInfo {
    /// stdout file.
    pub stdout_file: Option<Reported<String>>,
    /// stderr file.
    pub stderr_file: Option<Reported<String>>,
    /// stdout start offset.
    pub stdout_start: Option<Reported<i64>>,
    /// stdout end offset.
    pub stdout_end: Option<Reported<i64>>,
    /// stderr start offset.
    pub stderr_start: Option<Reported<i64>>,
    /// stderr end offset.
    pub stderr_end: Option<Reported<i64>>,
}

impl LogInfo {
    fn merge(&mut self, other: Self) {
        keep_latest(&mut self.stdout_file, other.stdout_file);
        keep_latest(&mut self.stderr_file, other.stderr_file);
        keep_latest(&mut self.stdout_start, other.stdout_start);
        keep_latest(&mut self.stdout_end, other.stdout_end);
        keep_latest(&mut self.stderr_start, other.stderr_start);
        keep_latest(&mut self.stderr_end, other.stderr_end);
    }

    fn reported(at: i64, info: TaskLogInfo) -> Self {
        let text = |value: Option<String>| {
            value
                .filter(|text| !text.is_empty())
                .map(|value| Reported { at, value })
        };
        let number = |value: Option<i64>| value.map(|value| Reported { at, value });
        Self {
            stdout_file: text(info.stdout_file),
            stderr_file: text(info.stderr_file),
            stdout_start: number(info.stdout_start),
            stdout_end: number(info.stdout_end),
            stderr_start: number(info.stderr_start),
            stderr_end: number(info.stderr_end),
        }
    }
}

/// Everything known about one task attempt, merged from its events.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskAttempt {
    /// The task.
    pub task_id: Option<Id>,
    /// Attempt number.
    pub attempt_number: i32,
    /// Owning job (from any event; else the task id's last 4 bytes).
    pub job_id: Option<Id>,
    /// The definition, once it has arrived.
    pub definition: Option<Reported<DefinitionSlot>>,
    /// Status number → when it was reported (the latest report, if repeated), as Ray's
    /// `state_ts_ns` map. Statuses unknown to this build are not kept: they never decide a state.
    pub status_times: BTreeMap<i32, i64>,
    /// Node the attempt was submitted to.
    pub node_id: Option<Reported<Id>>,
    /// Worker the attempt was submitted to.
    pub worker_id: Option<Reported<Id>>,
    /// Executor pid.
    pub worker_pid: Option<Reported<u32>>,
    /// Error info from a failure report.
    pub error: Option<Reported<ReportedError>>,
    /// The actor's `__repr__`, for actor tasks.
    pub actor_repr_name: Option<Reported<String>>,
    /// Debugger pause flag.
    pub is_debugger_paused: Option<Reported<bool>>,
    /// Log files.
    pub log_info: LogInfo,
    /// Profile spans (`TASK_PROFILE_EVENT`, when exported), sorted, without duplicates.
    pub profile: Vec<ProfileSpan>,
}

/// One timed span inside an attempt, from a `TASK_PROFILE_EVENT`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProfileSpan {
    /// Start (ns since the epoch).
    pub start_ns: i64,
    /// End (ns since the epoch).
    pub end_ns: i64,
    /// Span name (`task:execute`, …).
    pub event_name: String,
    /// Kind of process that recorded it (`worker`, `driver`).
    pub component_type: String,
    /// The worker that recorded it (hex).
    pub component_id: Option<String>,
    /// IP address of its node.
    pub node_ip_address: String,
    /// Details as JSON text (for `task:execute` failures, the exception and traceback).
    pub extra_data: Option<String>,
}

/// A definition with a total order (by its identifying strings), so it can be [`Reported`].
#[derive(Clone, Debug, PartialEq)]
pub struct DefinitionSlot(pub TaskDefinition);

impl Eq for DefinitionSlot {}

impl PartialOrd for DefinitionSlot {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for DefinitionSlot {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.tie_break_key().cmp(&other.0.tie_break_key())
    }
}

/// The identity of a task attempt inside one session.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttemptKey {
    /// The task.
    pub task_id: Id,
    /// Attempt number.
    pub attempt_number: i32,
}

impl AttemptKey {
    /// The attempt a task event is about, if it is a task event with a task id.
    pub fn of(payload: &EventPayload) -> Option<Self> {
        let (task_id, attempt_number) = match payload {
            EventPayload::TaskDefinition(event) => (event.task_id.as_ref()?, event.task_attempt),
            EventPayload::ActorTaskDefinition(event) => {
                (event.task_id.as_ref()?, event.task_attempt)
            }
            EventPayload::TaskLifecycle(event) => (event.task_id.as_ref()?, event.task_attempt),
            EventPayload::TaskProfile(event) => (event.task_id.as_ref()?, event.attempt_number),
            _ => return None,
        };
        Some(Self {
            task_id: task_id.clone(),
            attempt_number,
        })
    }
}

impl TaskAttempt {
    /// An attempt nothing is known about yet.
    pub fn new(key: &AttemptKey) -> Self {
        Self {
            task_id: Some(key.task_id.clone()),
            attempt_number: key.attempt_number,
            ..Self::default()
        }
    }

    /// Applies one task event reported at `at` (the event's timestamp, ns). Events about other
    /// entities are ignored.
    pub fn apply(&mut self, at: i64, payload: EventPayload) {
        match payload {
            EventPayload::TaskDefinition(event) => {
                self.set_job(event.job_id.as_ref());
                self.merge_definition(at, TaskDefinition::from_task(*event));
            }
            EventPayload::ActorTaskDefinition(event) => {
                self.set_job(event.job_id.as_ref());
                self.merge_definition(at, TaskDefinition::from_actor_task(*event));
            }
            EventPayload::TaskLifecycle(event) => self.apply_lifecycle(at, *event),
            EventPayload::TaskProfile(event) => {
                self.set_job(event.job_id.as_ref());
                let events = &event.profile_events;
                let spans = events.events.iter().map(|entry| ProfileSpan {
                    start_ns: entry.start_time,
                    end_ns: entry.end_time,
                    event_name: entry.event_name.clone(),
                    component_type: events.component_type.clone(),
                    component_id: events
                        .component_id
                        .as_ref()
                        .map(|id| id.as_hex().to_owned()),
                    node_ip_address: events.node_ip_address.clone(),
                    extra_data: entry.extra_data.clone(),
                });
                add_spans(&mut self.profile, spans);
            }
            _ => {}
        }
    }

    fn set_job(&mut self, job_id: Option<&Id>) {
        if self.job_id.is_none() {
            self.job_id = job_id.cloned();
        }
    }

    fn merge_definition(&mut self, at: i64, definition: TaskDefinition) {
        keep_latest(
            &mut self.definition,
            Some(Reported {
                at,
                value: DefinitionSlot(definition),
            }),
        );
    }

    fn apply_lifecycle(&mut self, at: i64, event: TaskLifecycleEvent) {
        self.set_job(event.job_id.as_ref());
        for transition in &event.state_transitions {
            if let Some(number) = transition.state.number() {
                self.add_status_time(number, transition.timestamp.nanos());
            }
        }
        keep_latest(&mut self.node_id, event.node_id.and_then(stamp(at)));
        keep_latest(&mut self.worker_id, event.worker_id.and_then(stamp(at)));
        // Ray: "worker pid can never be 0", so 0 means "not reported".
        if event.worker_pid != 0 {
            keep_latest(&mut self.worker_pid, stamp(at)(event.worker_pid));
        }
        if let Some(error) = event.ray_error_info {
            keep_latest(
                &mut self.error,
                stamp(at)(ReportedError {
                    error_type: error.error_type.to_string(),
                    message: error.error_message,
                }),
            );
        }
        keep_latest(
            &mut self.actor_repr_name,
            event.actor_repr_name.and_then(stamp(at)),
        );
        keep_latest(
            &mut self.is_debugger_paused,
            event.is_debugger_paused.and_then(stamp(at)),
        );
        if let Some(info) = event.task_log_info {
            self.log_info.merge(LogInfo::reported(at, info));
        }
    }

    fn add_status_time(&mut self, number: i32, at: i64) {
        let time = self.status_times.entry(number).or_insert(at);
        *time = (*time).max(at);
    }

    /// Merges another partial view of the same attempt into this one.
    pub fn merge(&mut self, other: Self) {
        if self.task_id.is_none() {
            self.task_id = other.task_id;
        }
        if self.job_id.is_none() {
            self.job_id = other.job_id;
        }
        keep_latest(&mut self.definition, other.definition);
        for (number, at) in other.status_times {
            self.add_status_time(number, at);
        }
        keep_latest(&mut self.node_id, other.node_id);
        keep_latest(&mut self.worker_id, other.worker_id);
        keep_latest(&mut self.worker_pid, other.worker_pid);
        keep_latest(&mut self.error, other.error);
        keep_latest(&mut self.actor_repr_name, other.actor_repr_name);
        keep_latest(&mut self.is_debugger_paused, other.is_debugger_paused);
        self.log_info.merge(other.log_info);
        add_spans(&mut self.profile, other.profile);
    }

    /// The state Ray would show and when it was reported: the highest `TaskStatus` number,
    /// except that `FINISHED`/`FAILED` outrank everything (2.52 added the metrics-only
    /// `GETTING_AND_PINNING_ARGS = 13` after them).
    pub fn reported_state(&self) -> Option<(TaskStatus, i64)> {
        self.status_times
            .iter()
            .map(|(&number, &at)| (TaskStatus::from_number(i64::from(number)), at))
            .max_by_key(|(status, at)| {
                let terminal_bonus = if status.is_terminal() { 100 } else { 0 };
                (status.number().unwrap_or(0) + terminal_bonus, *at)
            })
    }

    /// The attempt's job as its row shows it: as reported, else the task id's last 4 bytes.
    pub fn job_hex(&self) -> Option<&str> {
        self.job_id
            .as_ref()
            .map(Id::as_hex)
            .or_else(|| self.task_id.as_ref().and_then(job_hex_of_task))
    }

    /// When the attempt was created (`PENDING_ARGS_AVAIL`), in milliseconds as Ray shows it.
    pub fn creation_time_ms(&self) -> Option<i64> {
        self.time_of(&TaskStatus::PENDING_ARGS_AVAIL)
            .map(|nanos| nanos.div_euclid(1_000_000))
    }

    /// When a status was reported.
    pub fn time_of(&self, status: &TaskStatus) -> Option<i64> {
        status
            .number()
            .and_then(|number| self.status_times.get(&number).copied())
    }

    /// Every `(status, time)` reported, in time order (status order on ties).
    pub fn transitions(&self) -> Vec<(TaskStatus, i64)> {
        let mut transitions: Vec<(TaskStatus, i64)> = self
            .status_times
            .iter()
            .map(|(&number, &at)| (TaskStatus::from_number(i64::from(number)), at))
            .collect();
        transitions.sort_by_key(|(status, at)| (*at, status.number()));
        transitions
    }
}

/// Adds spans to a sorted, duplicate-free list.
fn add_spans(list: &mut Vec<ProfileSpan>, spans: impl IntoIterator<Item = ProfileSpan>) {
    for span in spans {
        if let Err(position) = list.binary_search(&span) {
            list.insert(position, span);
        }
    }
}

/// Wraps values reported at `at`.
fn stamp<T>(at: i64) -> impl Fn(T) -> Option<Reported<T>> {
    move |value| Some(Reported { at, value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::test_events::{NODE, TASK, WORKER, definition, lifecycle, ms, only};

    #[test]
    fn state_is_the_highest_status_even_when_clocks_disagree() {
        // The executor's RUNNING carries a later clock than the owner's FINISHED.
        let view = only(&[
            lifecycle(
                TASK,
                5,
                &[
                    ("PENDING_ARGS_AVAIL", 2),
                    ("SUBMITTED_TO_WORKER", 3),
                    ("FINISHED", 5),
                ],
                "",
            ),
            lifecycle(TASK, 9, &[("RUNNING", 9)], r#", "workerPid": 77"#),
        ]);
        assert_eq!(view.state, TaskStatus::FINISHED);
        assert_eq!(view.start_time_ms, ms(9));
        assert_eq!(view.end_time_ms, ms(5));
        assert_eq!(view.creation_time_ms, ms(2));
    }

    #[test]
    fn empty_node_worker_and_zero_pid_never_overwrite() {
        let view = only(&[
            lifecycle(
                TASK,
                3,
                &[("SUBMITTED_TO_WORKER", 3)],
                &format!(r#", "nodeId": "{NODE}", "workerId": "{WORKER}", "workerPid": 0"#),
            ),
            lifecycle(
                TASK,
                8,
                &[("RUNNING", 4)],
                r#", "nodeId": "", "workerId": "", "workerPid": 15805"#,
            ),
        ]);
        assert_eq!(
            view.node_id.map(|id| id.to_string()).as_deref(),
            Some("08f22818fb57e439a14ab7cfeaa0b96c3da9a89b40cb66e98bc1c235")
        );
        assert!(view.worker_id.is_some());
        assert_eq!(view.worker_pid, Some(15805));
    }

    #[test]
    fn a_definition_arriving_after_the_lifecycle_fills_the_row() {
        let view = only(&[
            lifecycle(TASK, 5, &[("PENDING_ARGS_AVAIL", 2), ("FINISHED", 5)], ""),
            definition(TASK, "custom-work-0", "work"),
        ]);
        assert_eq!(view.name.as_deref(), Some("custom-work-0"));
        assert_eq!(view.func_or_class_name.as_deref(), Some("work"));
        assert_eq!(view.task_type, Some(TaskType::NORMAL_TASK));
        assert_eq!(
            view.job_id.map(|id| id.to_string()).as_deref(),
            Some("01000000")
        );
        assert_eq!(
            view.placement_group_id, None,
            "the nil placement group is no group"
        );
    }
}
