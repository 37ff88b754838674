//! Merge rules: how the events of one task attempt become one row, the way Ray's state API
//! derives it (reference §4.3). Pure: no I/O, no clock.
//!
//! A [`TaskAttempt`] accumulates what its events said. Every merge is commutative, associative
//! and idempotent, so events may arrive in any order, in any grouping, any number of times, and
//! the result is the same:
//! - transitions are a map from status to the latest time it was reported (Ray's `state_ts_ns`);
//! - single-valued facts (node, worker, pid, error, repr name, each log-info field) keep the
//!   value reported latest, ignoring empty values (Ray overwrites only with non-empty values);
//! - the definition is kept whole, latest report winning.
//!
//! [`TaskAttempt::view`] then derives the state-API row: state = the highest `TaskStatus`
//! reported (terminal states win, immune to clock skew), times from the transitions, error only
//! on `FAILED`, and the failures Ray synthesizes when the job ends or the worker dies.

mod attempt_map;
pub mod entities;
pub mod submissions;

pub use attempt_map::AttemptMap;

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::event::cluster::{DriverJobState, WorkerState};
use crate::event::common::{Language, TaskStatus, TaskType};
use crate::event::encoding::Id;
use crate::event::task::{
    ActorTaskDefinitionEvent, TaskDefinitionEvent, TaskLifecycleEvent, TaskLogInfo,
};
use crate::event::{EventPayload, RayEvent};

/// A value and when it was reported (ns). Merging keeps the later report; equal times keep the
/// larger value, so the outcome never depends on arrival order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Reported<T> {
    /// When the reporting event was created (ns since the epoch).
    pub at: i64,
    /// The value.
    pub value: T,
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

pub(crate) fn keep_latest<T: Ord>(slot: &mut Option<Reported<T>>, candidate: Option<Reported<T>>) {
    match (slot.as_ref(), candidate) {
        (_, None) => {}
        (None, Some(candidate)) => *slot = Some(candidate),
        (Some(current), Some(candidate)) => {
            if candidate > *current {
                *slot = Some(candidate);
            }
        }
    }
}

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
    /// The message as sent (ANSI codes included; [`strip_ansi`] removes them for display).
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

    /// The state-API view of this attempt, given what is known about its job and worker.
    pub fn view(&self, context: &FailureContext) -> TaskView {
        let definition = self.definition.as_ref().map(|reported| &reported.value.0);
        // The reported id is shared, not copied; a derived one is made from its hex.
        let job_id = self
            .job_id
            .clone()
            .or_else(|| self.job_hex().and_then(Id::from_hex));
        let worker_id = self
            .worker_id
            .as_ref()
            .map(|reported| reported.value.clone());

        let mut state = self
            .reported_state()
            .map_or(TaskStatus::NIL, |(state, _)| state);
        let mut end_ns = self
            .time_of(&TaskStatus::FAILED)
            .or_else(|| self.time_of(&TaskStatus::FINISHED));
        let mut error = (state == TaskStatus::FAILED)
            .then(|| self.error.as_ref().map(|reported| reported.value.clone()))
            .flatten()
            .map(|error| ReportedError {
                message: cap_error_message(strip_ansi(&error.message)),
                ..error
            });
        let mut synthesized = false;
        if !state.is_terminal() {
            // Worker death is checked first: it is the more specific cause, and Ray marks it
            // 1 s after the death versus 15 s after the job ends.
            let worker_death = worker_id
                .as_ref()
                .and_then(|worker| context.worker_deaths.get(worker));
            let job_end = job_id.as_ref().and_then(|job| context.job_ends.get(job));
            if let Some(death) = worker_death {
                synthesized = true;
                state = TaskStatus::FAILED;
                end_ns = Some(death.at);
                error = Some(ReportedError {
                    error_type: "WORKER_DIED".to_owned(),
                    message: format!(
                        "Worker running the task ({}) died with exit_type: {} with error_message: {}",
                        worker_id.as_ref().map(Id::as_hex).unwrap_or_default(),
                        death.exit_type_number,
                        death.detail
                    ),
                });
            } else if let (Some(&ended), Some(job)) = (job_end, job_id.as_ref()) {
                synthesized = true;
                state = TaskStatus::FAILED;
                end_ns = Some(ended);
                error = Some(ReportedError {
                    error_type: "WORKER_DIED".to_owned(),
                    message: format!(
                        "Job finishes ({job}) as driver exits. Marking all non-terminal tasks as failed."
                    ),
                });
            }
        }

        let name = definition.map(|definition| {
            let func = definition.func_or_class_name();
            match (
                &self.actor_repr_name,
                definition.task_type == TaskType::ACTOR_TASK,
            ) {
                (Some(repr), true) if definition.name == func && !repr.value.is_empty() => {
                    format!("{}.{}", repr.value, definition.function_name)
                }
                _ => definition.name.clone(),
            }
        });
        let actor_id = definition.and_then(|definition| match definition.task_type {
            TaskType::ACTOR_TASK => definition.actor_id.clone(),
            TaskType::ACTOR_CREATION_TASK => self.task_id.as_ref().and_then(actor_id_of_task),
            _ => None,
        });
        let millis = |nanos: i64| nanos.div_euclid(1_000_000);
        TaskView {
            task_id: self.task_id.clone(),
            attempt_number: self.attempt_number,
            name,
            func_or_class_name: definition.map(TaskDefinition::func_or_class_name),
            task_type: definition.map(|definition| definition.task_type.clone()),
            language: definition.map(|definition| definition.language.clone()),
            state,
            synthesized_failure: synthesized,
            job_id,
            actor_id,
            parent_task_id: definition.and_then(|definition| definition.parent_task_id.clone()),
            placement_group_id: definition
                .and_then(|definition| definition.placement_group_id.clone())
                .filter(|id| !id.is_nil()),
            node_id: self.node_id.as_ref().map(|reported| reported.value.clone()),
            worker_id,
            worker_pid: self.worker_pid.as_ref().map(|reported| reported.value),
            error_type: error.as_ref().map(|error| error.error_type.clone()),
            error_message: error.map(|error| error.message),
            creation_time_ms: self.creation_time_ms(),
            start_time_ms: self.time_of(&TaskStatus::RUNNING).map(millis),
            end_time_ms: end_ns.map(millis),
        }
    }
}

/// The tasks of one session: every attempt, and the job ends and worker deaths that failure
/// synthesis needs, collected from events in any order.
#[derive(Clone, Debug, Default)]
pub struct SessionTasks {
    /// Attempts by key, in the order first seen. Not a sorted map: one moves its (large)
    /// values around on every insert and compares ids all the way down, which would be most of
    /// the cost of applying events.
    pub attempts: AttemptMap,
    /// Job ends and worker deaths seen so far.
    pub failures: FailureContext,
}

impl SessionTasks {
    /// Applies one event of the session; events about other entities only feed failure
    /// synthesis or are ignored.
    ///
    /// Takes the event: what the attempt keeps of it is moved, not copied, and a run applies
    /// hundreds of thousands of them.
    pub fn apply(&mut self, event: RayEvent) {
        let at = event.timestamp.map_or(0, |timestamp| timestamp.nanos());
        self.failures.apply(&event.payload);
        if let Some(key) = AttemptKey::of(&event.payload) {
            self.attempts
                .get_or_insert_with(key, TaskAttempt::new)
                .apply(at, event.payload);
        }
    }

    /// Every attempt as the state API shows it, in key order.
    pub fn views(&self) -> impl Iterator<Item = (&AttemptKey, TaskView)> + '_ {
        let mut attempts: Vec<(&AttemptKey, &TaskAttempt)> = self.attempts.iter().collect();
        attempts.sort_unstable_by_key(|(key, _)| *key);
        attempts
            .into_iter()
            .map(|(key, attempt)| (key, attempt.view(&self.failures)))
    }
}

/// Merges partial views of attempts (stored rows, a run's new attempts) into one per attempt, in
/// the order each attempt was first seen (writers sort rows themselves). Views without a task
/// id are dropped: they cannot be keyed.
pub fn merge_all(attempts: impl IntoIterator<Item = TaskAttempt>) -> Vec<TaskAttempt> {
    let attempts = attempts.into_iter();
    let mut merged = AttemptMap::with_capacity(attempts.size_hint().0);
    for attempt in attempts {
        let Some(task_id) = attempt.task_id.clone() else {
            continue;
        };
        let key = AttemptKey {
            task_id,
            attempt_number: attempt.attempt_number,
        };
        merged.merge_in(key, attempt);
    }
    merged.into_values()
}

/// Stored versions of attempts merged with a run's attempts, without copying the run's.
#[derive(Debug, Default)]
pub struct Merged<'a> {
    /// Attempts with stored versions, each merged with the run's version if it has one.
    pub stored: Vec<TaskAttempt>,
    /// Attempts only the run knows: new to the table.
    pub new: Vec<&'a TaskAttempt>,
}

impl Merged<'_> {
    /// Every merged attempt.
    pub fn all(&self) -> Vec<&TaskAttempt> {
        self.stored.iter().chain(self.new.iter().copied()).collect()
    }
}

/// Merges `stored` versions (any number per attempt) with the attempts of `tasks`, copying an
/// attempt of `tasks` only when it has stored versions to merge with.
pub fn merge_stored(stored: Vec<TaskAttempt>, tasks: &SessionTasks) -> Merged<'_> {
    let mut stored = merge_all(stored);
    let mut updated: HashSet<&AttemptKey, foldhash::fast::RandomState> = HashSet::default();
    for attempt in &mut stored {
        let Some(task_id) = attempt.task_id.clone() else {
            continue;
        };
        let key = AttemptKey {
            task_id,
            attempt_number: attempt.attempt_number,
        };
        if let Some((key, newer)) = tasks.attempts.get_key_value(&key) {
            attempt.merge(newer.clone());
            updated.insert(key);
        }
    }
    let new = tasks
        .attempts
        .iter()
        .filter(|(key, _)| !updated.contains(key))
        .map(|(_, attempt)| attempt)
        .collect();
    Merged { stored, new }
}

/// The job id of a task id: its last 4 bytes.
pub fn job_id_of_task(task_id: &Id) -> Option<Id> {
    Id::from_hex(job_hex_of_task(task_id)?)
}

/// The hex of [`job_id_of_task`], borrowed from the task id.
pub fn job_hex_of_task(task_id: &Id) -> Option<&str> {
    let hex = task_id.as_hex();
    let start = hex.len().checked_sub(8)?;
    hex.get(start..)
}

/// The actor id of an actor (creation) task id: its last 16 bytes.
pub fn actor_id_of_task(task_id: &Id) -> Option<Id> {
    let hex = task_id.as_hex();
    let start = hex.len().checked_sub(32)?;
    Id::from_hex(hex.get(start..)?)
}

/// What Ray's failure synthesis needs to know: when jobs ended and workers died.
#[derive(Clone, Debug, Default)]
pub struct FailureContext {
    /// Job id → end time (ns) of finished jobs.
    pub job_ends: BTreeMap<Id, i64>,
    /// Worker id → how it died.
    pub worker_deaths: BTreeMap<Id, WorkerDeath>,
}

impl FailureContext {
    /// Merges in what another context knows (the same rules as [`FailureContext::apply`]).
    pub fn merge(&mut self, other: &Self) {
        for (job, &end) in &other.job_ends {
            self.record_job_end(job, end);
        }
        for (worker, death) in &other.worker_deaths {
            self.record_worker_death(worker, death.clone());
        }
    }

    fn record_job_end(&mut self, job: &Id, at: i64) {
        let end = self.job_ends.entry(job.clone()).or_insert(at);
        *end = (*end).max(at);
    }

    fn record_worker_death(&mut self, worker: &Id, death: WorkerDeath) {
        let slot = self
            .worker_deaths
            .entry(worker.clone())
            .or_insert_with(|| death.clone());
        if (death.at, &death.detail) > (slot.at, &slot.detail) {
            *slot = death;
        }
    }

    /// Applies a job or worker lifecycle event; other events are ignored. Like every merge
    /// here, the result does not depend on order or repetition.
    pub fn apply(&mut self, payload: &EventPayload) {
        match payload {
            EventPayload::DriverJobLifecycle(event) => {
                let Some(job) = &event.job_id else { return };
                for transition in &event.state_transitions {
                    if transition.state == DriverJobState::FINISHED {
                        self.record_job_end(job, transition.timestamp.nanos());
                    }
                }
            }
            EventPayload::WorkerLifecycle(event) => {
                let Some(worker) = &event.worker_id else {
                    return;
                };
                for transition in &event.state_transitions {
                    if transition.state != WorkerState::DEAD {
                        continue;
                    }
                    let at = if transition.end_time_ms > 0 {
                        transition.end_time_ms.saturating_mul(1_000_000)
                    } else {
                        transition.timestamp.nanos()
                    };
                    let (exit_type_number, detail) = transition
                        .death_info
                        .as_ref()
                        .map(|info| {
                            (
                                info.exit_type.number().unwrap_or(0),
                                info.exit_detail.clone(),
                            )
                        })
                        .unwrap_or_default();
                    self.record_worker_death(
                        worker,
                        WorkerDeath {
                            at,
                            exit_type_number,
                            detail,
                        },
                    );
                }
            }
            _ => {}
        }
    }
}

/// A worker's death, as its lifecycle event reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerDeath {
    /// End time (ns): the worker's `end_time_ms`, or the transition time if that is unset.
    pub at: i64,
    /// `WorkerExitType` number, as Ray prints it in the message.
    pub exit_type_number: i32,
    /// Exit detail.
    pub detail: String,
}

/// One attempt as Ray's state API shows it (field names follow `ray list tasks --detail`).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskView {
    /// Task id.
    pub task_id: Option<Id>,
    /// Attempt number.
    pub attempt_number: i32,
    /// Display name (`None` until the definition arrives).
    pub name: Option<String>,
    /// `Class.method` or function name.
    pub func_or_class_name: Option<String>,
    /// Task type.
    pub task_type: Option<TaskType>,
    /// Language.
    pub language: Option<Language>,
    /// Current state.
    pub state: TaskStatus,
    /// True when the state is a failure Ray would synthesize (job ended or worker died).
    pub synthesized_failure: bool,
    /// Job.
    pub job_id: Option<Id>,
    /// Actor (actor tasks and actor creation tasks).
    pub actor_id: Option<Id>,
    /// Submitting task.
    pub parent_task_id: Option<Id>,
    /// Placement group (never the nil id).
    pub placement_group_id: Option<Id>,
    /// Node.
    pub node_id: Option<Id>,
    /// Worker.
    pub worker_id: Option<Id>,
    /// Worker pid.
    pub worker_pid: Option<u32>,
    /// Error type, only when `FAILED`.
    pub error_type: Option<String>,
    /// Error message without ANSI codes, only when `FAILED`.
    pub error_message: Option<String>,
    /// `PENDING_ARGS_AVAIL` time (ms).
    pub creation_time_ms: Option<i64>,
    /// `RUNNING` time (ms).
    pub start_time_ms: Option<i64>,
    /// `FINISHED`/`FAILED` time (ms).
    pub end_time_ms: Option<i64>,
}

/// Longest error message kept in the tables. A task can fail with megabytes of text (a huge
/// `repr` in an exception); rows that carry it would exceed Lambda's 6 MB response, and pages
/// of them could not be served. The raw objects keep the full text.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 64 * 1024;

/// `message`, or its first and last halves of [`MAX_ERROR_MESSAGE_BYTES`] around a note of how
/// much was cut: the start of a traceback says where, its end says what.
pub fn cap_error_message(message: String) -> String {
    if message.len() <= MAX_ERROR_MESSAGE_BYTES {
        return message;
    }
    let half = MAX_ERROR_MESSAGE_BYTES / 2;
    let mut head_end = half;
    while !message.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = message.len() - half;
    while !message.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let cut = tail_start - head_end;
    format!(
        "{}\n[… {cut} bytes cut by Afterglow; the raw events hold the whole message …]\n{}",
        &message[..head_end],
        &message[tail_start..]
    )
}

/// Removes ANSI escape sequences the way Ray does (`re.sub(r"\x1b[^m]*m", "", text)`).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('\u{1b}') {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        match after.find('m') {
            Some(end) => rest = &after[end + 1..],
            // No terminating `m`: Ray's pattern does not match, the text stays.
            None => {
                out.push_str(after);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TASK: &str = "FjEKDwpFr1z///////////////8BAAAA"; // 16310a0f…01000000
    const ACTOR_TASK: &str = "4NwXTINZkDRR392XtzhGUcshBU8BAAAA";
    const NODE: &str = "CPIoGPtX5DmhSrfP6qC5bD2pqJtAy2bpi8HCNQ==";
    const WORKER: &str = "8Zy3Giv+Cb+LZ51kg5h3TLo+QBetp55HBzMNsA==";

    fn time(second: u32) -> String {
        format!("2026-11-22T06:14:{second:02}.000000000Z")
    }

    fn lifecycle(task: &str, at: u32, states: &[(&str, u32)], extra: &str) -> String {
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

    fn definition(task: &str, name: &str, function: &str) -> String {
        format!(
            r#"{{"eventType": "TASK_DEFINITION_EVENT", "timestamp": "{}", "taskDefinitionEvent": {{"taskId": "{task}", "taskAttempt": 0, "taskType": "NORMAL_TASK", "language": "PYTHON", "taskName": "{name}", "jobId": "AQAAAA==", "taskFunc": {{"pythonFunctionDescriptor": {{"moduleName": "m", "className": "", "functionName": "{function}"}}}}, "parentTaskId": "//////////////////////////8BAAAA", "placementGroupId": "////////////////////////"}}}}"#,
            time(1)
        )
    }

    fn actor_definition(name: &str) -> String {
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

    fn only(events: &[String]) -> TaskView {
        let mut all = views(events);
        assert_eq!(all.len(), 1);
        all.remove(0)
    }

    fn ms(second: u32) -> Option<i64> {
        Some(1_795_328_040_000 + i64::from(second) * 1000)
    }

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
    fn error_shows_only_on_failed_with_ansi_codes_stripped() {
        let failed = only(&[lifecycle(
            TASK,
            5,
            &[("FAILED", 5)],
            r#", "rayErrorInfo": {"errorMessage": "User exception:\n\u001b[36mray::boom_task()\u001b[39m (pid=1)", "errorType": "TASK_EXECUTION_EXCEPTION"}"#,
        )]);
        assert_eq!(failed.state, TaskStatus::FAILED);
        assert_eq!(
            failed.error_type.as_deref(),
            Some("TASK_EXECUTION_EXCEPTION")
        );
        assert_eq!(
            failed.error_message.as_deref(),
            Some("User exception:\nray::boom_task() (pid=1)")
        );

        let finished = only(&[lifecycle(
            TASK,
            5,
            &[("FINISHED", 5)],
            r#", "rayErrorInfo": {"errorMessage": "x", "errorType": "WORKER_DIED"}"#,
        )]);
        assert_eq!(finished.error_type, None);
        assert_eq!(finished.error_message, None);
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

    #[test]
    fn actor_tasks_take_the_actor_repr_name_when_not_renamed() {
        let view = only(&[
            actor_definition("Counter.incr"),
            lifecycle(
                ACTOR_TASK,
                4,
                &[("RUNNING", 4)],
                r#", "actorReprName": "Counter(7)""#,
            ),
        ]);
        assert_eq!(view.name.as_deref(), Some("Counter(7).incr"));
        assert_eq!(view.func_or_class_name.as_deref(), Some("Counter.incr"));
        assert_eq!(
            view.actor_id.map(|id| id.to_string()).as_deref(),
            Some("51dfdd97b7384651cb21054f01000000")
        );
        let renamed = only(&[
            actor_definition("custom"),
            lifecycle(
                ACTOR_TASK,
                4,
                &[("RUNNING", 4)],
                r#", "actorReprName": "Counter(7)""#,
            ),
        ]);
        assert_eq!(renamed.name.as_deref(), Some("custom"));
    }

    #[test]
    fn a_finished_job_fails_its_unfinished_attempts_at_the_job_end() {
        let job_end = format!(
            r#"{{"eventType": "DRIVER_JOB_LIFECYCLE_EVENT", "timestamp": "{}", "driverJobLifecycleEvent": {{"jobId": "AQAAAA==", "stateTransitions": [{{"state": "FINISHED", "timestamp": "{}"}}]}}}}"#,
            time(30),
            time(30)
        );
        let view = only(&[
            lifecycle(TASK, 5, &[("PENDING_ARGS_AVAIL", 2), ("RUNNING", 5)], ""),
            job_end.clone(),
        ]);
        assert_eq!(view.state, TaskStatus::FAILED);
        assert!(view.synthesized_failure);
        assert_eq!(view.error_type.as_deref(), Some("WORKER_DIED"));
        assert_eq!(
            view.error_message.as_deref(),
            Some(
                "Job finishes (01000000) as driver exits. Marking all non-terminal tasks as failed."
            )
        );
        assert_eq!(view.end_time_ms, ms(30));
        // A terminal state reported at any time, even after the job end arrived, wins.
        let view = only(&[
            lifecycle(TASK, 5, &[("RUNNING", 5), ("FINISHED", 6)], ""),
            job_end,
        ]);
        assert_eq!(view.state, TaskStatus::FINISHED);
        assert!(!view.synthesized_failure);
    }

    #[test]
    fn a_dead_worker_fails_its_unfinished_attempts_at_its_end_time() {
        let death = format!(
            r#"{{"eventType": "WORKER_LIFECYCLE_EVENT", "timestamp": "{}", "workerLifecycleEvent": {{"workerId": "{WORKER}", "stateTransitions": [{{"state": "DEAD", "timestamp": "{}", "endTimeMs": "1795328060000", "deathInfo": {{"exitType": "SYSTEM_ERROR", "exitDetail": "killed"}}}}]}}}}"#,
            time(21),
            time(21)
        );
        let view = only(&[
            lifecycle(
                TASK,
                3,
                &[("SUBMITTED_TO_WORKER", 3)],
                &format!(r#", "nodeId": "{NODE}", "workerId": "{WORKER}""#),
            ),
            death,
        ]);
        assert_eq!(view.state, TaskStatus::FAILED);
        assert_eq!(view.end_time_ms, Some(1_795_328_060_000));
        let message = view.error_message.unwrap_or_default();
        assert!(
            message.starts_with("Worker running the task (f19cb71a"),
            "{message}"
        );
        assert!(
            message.ends_with("died with exit_type: 0 with error_message: killed"),
            "{message}"
        );
    }

    #[test]
    fn an_attempt_with_no_transitions_is_nil() {
        let view = only(&[definition(TASK, "work", "work")]);
        assert_eq!(view.state, TaskStatus::NIL);
        assert_eq!(view.end_time_ms, None);
    }

    #[test]
    fn a_huge_error_message_keeps_its_start_and_its_end() {
        let short = "ValueError: short".to_owned();
        assert_eq!(cap_error_message(short.clone()), short);
        let huge = format!(
            "Traceback (most recent call last):{}ValueError: é the end",
            "ü".repeat(400_000)
        );
        let capped = cap_error_message(huge.clone());
        assert!(
            capped.len() < MAX_ERROR_MESSAGE_BYTES + 200,
            "{}",
            capped.len()
        );
        assert!(capped.starts_with("Traceback (most recent call last):"));
        assert!(capped.ends_with("ValueError: é the end"));
        let cut = huge.len()
            - (capped.len()
                - capped.find("\n[…").map_or(0, |at| {
                    capped[at..]
                        .find("…]\n")
                        .map_or(0, |end| end + "…]\n".len())
                }));
        assert!(capped.contains(&format!("[… {cut} bytes cut")), "{cut}");
    }

    #[test]
    fn strip_ansi_matches_rays_pattern() {
        assert_eq!(strip_ansi("\u{1b}[36mray::f()\u{1b}[39m ok"), "ray::f() ok");
        assert_eq!(strip_ansi("no codes"), "no codes");
        assert_eq!(strip_ansi("dangling \u{1b}[3"), "dangling \u{1b}[3");
        assert_eq!(strip_ansi("\u{1b}[1;31mred\u{1b}[0m"), "red");
    }

    #[test]
    fn ids_embed_their_job_and_actor() {
        let task = Id::from_hex("ffffffffffffffffa29e28dedd372d0df3041dff02000000");
        let task = task.unwrap_or_else(|| panic!("valid hex"));
        assert_eq!(
            job_id_of_task(&task).map(|id| id.to_string()).as_deref(),
            Some("02000000")
        );
        assert_eq!(
            actor_id_of_task(&task).map(|id| id.to_string()).as_deref(),
            Some("a29e28dedd372d0df3041dff02000000")
        );
    }
}
