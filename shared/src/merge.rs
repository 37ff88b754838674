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
//!
//! The files: `attempt.rs` holds one attempt and its merges, `view.rs` the state-API row,
//! `synthesized.rs` the failures Ray synthesizes, `tasks.rs` a session's attempts and their merge
//! with stored versions, `ids.rs` the ids a task id embeds; [`entities`] and [`submissions`] hold
//! the same rules for the other entities.

mod attempt;
mod attempt_map;
pub mod entities;
mod ids;
pub mod submissions;
mod synthesized;
mod tasks;
mod view;

#[cfg(test)]
mod test_events;

pub use attempt::{
    AttemptKey, DefinitionSlot, LogInfo, ProfileSpan, ReportedError, TaskAttempt, TaskDefinition,
};
pub use attempt_map::AttemptMap;
pub use ids::{actor_id_of_task, job_hex_of_task, job_id_of_task};
pub use synthesized::{FailureContext, WorkerDeath};
pub use tasks::{Merged, SessionTasks, merge_all, merge_stored};
pub use view::{MAX_ERROR_MESSAGE_BYTES, TaskView, cap_error_message, strip_ansi};

use serde::{Deserialize, Serialize};

/// A value and when it was reported (ns). Merging keeps the later report; equal times keep the
/// larger value, so the outcome never depends on arrival order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Reported<T> {
    /// When the reporting event was created (ns since the epoch).
    pub at: i64,
    /// The value.
    pub value: T,
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
