//! Raw keys `serve` could not compact yet, parked and tried again later, each group after a
//! wait that doubles with each failure, and split in two once it is clear that some key among
//! them breaks every run it is in.

use std::time::Duration;

use tokio::time::Instant;

use crate::storage::ObjectKey;

/// Every this many failed tries from the park, keys that keep failing together are split
/// although no run has succeeded since they were parked ([`Parked::splits`]). With no other
/// traffic nothing else succeeds, and a group that one key breaks would be tried whole for ever;
/// a long outage splits groups it did not need to, doubling their number every this many
/// tries (every half hour once the wait is at its 10 minutes), and their keys are then
/// compacted in smaller runs.
const SPLIT_UNPROVEN_AFTER: u32 = 3;

/// Raw keys whose runs failed, whose objects could not be read, or whose sessions could not be
/// committed, waiting to be tried again.
///
/// Without it a fault that outlasts a run's retries (a full disk, storage down for a minute)
/// would leave those objects out of every table until `serve` started again, however long it
/// ran. They stay unrecorded in the backlog meanwhile, so a stop also leaves them to the next
/// start.
#[derive(Default)]
pub(super) struct Parked {
    groups: Vec<ParkedGroup>,
    /// When a run last compacted an object.
    last_success: Option<Instant>,
}

/// Keys parked together, and when they are tried again.
pub(super) struct ParkedGroup {
    /// The keys.
    pub(super) keys: Vec<ObjectKey>,
    parked_at: Instant,
    due: Instant,
    wait: Duration,
    /// How many times its keys were tried from the park and not compacted (a split's halves
    /// carry their group's count on).
    failed_retries: u32,
}

impl ParkedGroup {
    /// Its count of failed tries once the try under way has failed too.
    pub(super) fn failed_again(&self) -> u32 {
        self.failed_retries.saturating_add(1)
    }

    /// The wait after this group's next failure: doubled, up to `max`.
    pub(super) fn next_wait(&self, max: Duration) -> Duration {
        self.wait.saturating_mul(2).min(max)
    }
}

impl Parked {
    /// Parks `keys` (if any) as one group, tried again after `wait`, that failed
    /// `failed_retries` tries from the park so far.
    pub(super) fn park(&mut self, keys: Vec<ObjectKey>, wait: Duration, failed_retries: u32) {
        if !keys.is_empty() {
            let now = Instant::now();
            self.groups.push(ParkedGroup {
                keys,
                parked_at: now,
                due: now + wait,
                wait,
                failed_retries,
            });
        }
    }

    /// Parks `keys` as one group, or as two halves when `split` (and there are two keys).
    pub(super) fn park_split(
        &mut self,
        keys: &[ObjectKey],
        wait: Duration,
        split: bool,
        failed_retries: u32,
    ) {
        let half = if split && keys.len() > 1 {
            keys.len() / 2
        } else {
            keys.len()
        };
        let (first, second) = keys.split_at(half);
        self.park(first.to_vec(), wait, failed_retries);
        self.park(second.to_vec(), wait, failed_retries);
    }

    /// Notes that a run committed at `at`.
    pub(super) fn succeeded(&mut self, at: Instant) {
        self.last_success = Some(at);
    }

    /// Whether a run committed after `at`.
    fn succeeded_since(&self, at: Instant) -> bool {
        self.last_success.is_some_and(|success| success > at)
    }

    /// Whether the keys of `group`, tried again and failed together, are parked as two
    /// halves. So they are once a run has succeeded since they were parked (the failed try
    /// included, for the keys it compacted): storage works, so some key among them breaks
    /// every run or session it is in, and halving each time leaves it alone, holding back no
    /// others. Without such a success one failure says nothing about the keys (storage may be
    /// down), and they stay together but for every [`SPLIT_UNPROVEN_AFTER`]th failed try.
    pub(super) fn splits(&self, group: &ParkedGroup) -> bool {
        self.succeeded_since(group.parked_at)
            || group.failed_again().is_multiple_of(SPLIT_UNPROVEN_AFTER)
    }

    /// When the next group is due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.groups.iter().map(|group| group.due).min()
    }

    /// Takes the earliest group due at `now`.
    pub(super) fn take_due(&mut self, now: Instant) -> Option<ParkedGroup> {
        let (index, _) = self
            .groups
            .iter()
            .enumerate()
            .filter(|(_, group)| group.due <= now)
            .min_by_key(|(_, group)| group.due)?;
        Some(self.groups.swap_remove(index))
    }

    /// How many keys are parked.
    pub(super) fn keys(&self) -> usize {
        self.groups.iter().map(|group| group.keys.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::schedule::queue::{PARK_FIRST, PARK_MAX};

    fn keys(names: &[&str]) -> Vec<ObjectKey> {
        names
            .iter()
            .map(|name| {
                ObjectKey::new(format!("raw/c/2026/11/28/21/{name}.ndjson.gz"))
                    .unwrap_or_else(|err| panic!("a test key: {err}"))
            })
            .collect()
    }

    #[test]
    fn parked_groups_come_due_earliest_first_and_wait_twice_as_long_each_time() {
        let mut parked = Parked::default();
        parked.park(Vec::new(), PARK_FIRST, 0);
        assert_eq!(parked.keys(), 0, "an empty group is not parked");
        let start = Instant::now();
        parked.park(keys(&["late"]), PARK_FIRST * 2, 0);
        parked.park(keys(&["early", "also"]), PARK_FIRST, 0);
        assert_eq!(parked.keys(), 3);
        let due = parked.next_due().expect("something is parked");
        assert!(due >= start + PARK_FIRST && due < start + PARK_FIRST * 2);
        assert!(parked.take_due(start).is_none(), "nothing is due yet");

        let later = Instant::now() + PARK_FIRST * 3;
        let first = parked.take_due(later).expect("due");
        assert_eq!(first.keys, keys(&["early", "also"]));
        assert_eq!(first.next_wait(PARK_MAX), PARK_FIRST * 2);
        let second = parked.take_due(later).expect("due");
        assert_eq!(second.keys, keys(&["late"]));
        assert!(parked.take_due(later).is_none() && parked.keys() == 0);

        // The wait doubles up to its cap.
        let mut wait = PARK_FIRST;
        for _ in 0..20 {
            parked.park(keys(&["k"]), wait, 0);
            wait = parked
                .take_due(Instant::now() + PARK_MAX)
                .expect("due")
                .next_wait(PARK_MAX);
        }
        assert_eq!(wait, PARK_MAX);
    }

    #[test]
    fn keys_failing_together_split_once_storage_works_or_every_third_failed_try() {
        let mut parked = Parked::default();
        let far = Instant::now() + PARK_MAX;
        let expected = [false, false, true, false, false, true];
        for (failed_before, split) in (0..).zip(expected) {
            parked.park(keys(&["a", "b"]), PARK_FIRST, failed_before);
            let group = parked.take_due(far).expect("due");
            assert_eq!(
                parked.splits(&group),
                split,
                "failed try {} from the park",
                failed_before + 1
            );
        }
        parked.park(keys(&["a", "b"]), PARK_FIRST, 0);
        let group = parked.take_due(far).expect("due");
        parked.succeeded(group.parked_at + Duration::from_millis(1));
        assert!(
            parked.splits(&group),
            "a run succeeded since they were parked"
        );
    }

    #[test]
    fn a_success_after_a_group_was_parked_is_told_from_one_before() {
        let mut parked = Parked::default();
        parked.park(keys(&["a"]), PARK_FIRST, 0);
        let group = parked.take_due(Instant::now() + PARK_FIRST).expect("due");
        assert!(!parked.succeeded_since(group.parked_at), "no run succeeded");
        parked.succeeded(group.parked_at);
        assert!(!parked.succeeded_since(group.parked_at), "not after it");
        parked.succeeded(group.parked_at + Duration::from_millis(1));
        assert!(parked.succeeded_since(group.parked_at));
    }
}
