//! The task attempts of one session ([`SessionTasks`]), applied from its events with what failure
//! synthesis needs, and merged with stored versions of the same attempts ([`merge_stored`]): how
//! a compaction run's attempts meet the table's.

use std::collections::HashSet;

use super::{AttemptKey, AttemptMap, FailureContext, TaskAttempt, TaskView};
use crate::event::RayEvent;

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
