//! The state-API row of an attempt: [`TaskView`], derived from a merged [`TaskAttempt`] the way
//! Ray's state API derives it. State is the highest status reported, times come from the
//! transitions, the error shows only on `FAILED` (ANSI codes stripped, size capped), and an
//! unfinished attempt takes the failure Ray synthesizes for it (`synthesized.rs`).

use super::ids::actor_id_of_task;
use super::{FailureContext, ReportedError, TaskAttempt, TaskDefinition};
use crate::event::common::{Language, TaskStatus, TaskType};
use crate::event::encoding::Id;

impl TaskAttempt {
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
        if !state.is_terminal()
            && let Some((at, failure)) =
                context.synthesized_failure(job_id.as_ref(), worker_id.as_ref())
        {
            synthesized = true;
            state = TaskStatus::FAILED;
            end_ns = Some(at);
            error = Some(failure);
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
    use crate::merge::test_events::{
        ACTOR_TASK, TASK, actor_definition, definition, lifecycle, only,
    };

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
}
