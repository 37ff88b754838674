//! `serve`'s stand-in for the compact queue's delayed quiet checks: a timer per session, started
//! by each commit (and by the start-up scan for every session found untidy), and the tidying of
//! each session when its timer is due, one session at a time.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::compact::Compactor;
use crate::compact::schedule::quiet::QuietCheck;
use crate::keys::{self, ClusterName, SessionName};
use crate::storage::{Storage, StorageError};
use crate::tables::manifest;

/// Manifests the start-up scan reads at once: over a bucket each is a request of its own
/// (tens of milliseconds), so one after another a few thousand sessions would take minutes.
const CONCURRENT_MANIFEST_READS: usize = 16;

/// The quiet checks waiting for their time: one per session, its newest commit's (or, for a
/// session untidy at start, its version when the start-up scan read it).
pub(super) struct QuietTimers {
    quiet: Duration,
    /// The longest wait before a failed check tries again ([`super::QueueTiming::park_max`]).
    max_wait: Duration,
    checks: BTreeMap<(ClusterName, SessionName), (QuietCheck, Instant)>,
    /// One permit: the session being tidied holds it.
    tidying: Arc<Semaphore>,
    /// Sessions with a check started and not ended (waiting for the permit, tidying, or
    /// waiting to try again), with how many: a commit's check can come due while an earlier
    /// one of the same session still waits to try again.
    started: StartedChecks,
}

impl QuietTimers {
    /// Timers of checks due `quiet` after their commit, a failed one trying again after at
    /// most `max_wait`.
    pub(super) fn new(quiet: Duration, max_wait: Duration) -> Self {
        Self {
            quiet,
            max_wait,
            checks: BTreeMap::new(),
            tidying: Arc::new(Semaphore::new(1)),
            started: Arc::default(),
        }
    }

    /// Checks these commits once the quiet period has passed (a session's newer commit
    /// replaces its older one's check, as its timer starts again).
    pub(super) fn watch(&mut self, committed: Vec<QuietCheck>) {
        let due = Instant::now() + self.quiet;
        for check in committed {
            let session = (check.cluster.clone(), check.session.clone());
            self.checks.insert(session, (check, due));
        }
    }

    /// Checks these sessions found untidy once the quiet period has passed, except those a
    /// commit of this queue already asked to check, whether that check waits or has started:
    /// it names the session's version at least as new as any the scan can have read, whenever
    /// the scan read it, and sees the session tidy. A commit that comes after this replaces
    /// the scan's check as [`Self::watch`] does.
    pub(super) fn watch_untidy(&mut self, untidy: Vec<QuietCheck>) {
        let due = Instant::now() + self.quiet;
        let started = lock(&self.started);
        for check in untidy {
            let session = (check.cluster.clone(), check.session.clone());
            if started.contains_key(&session) {
                continue;
            }
            if let Entry::Vacant(vacant) = self.checks.entry(session) {
                vacant.insert((check, due));
            }
        }
    }

    /// When the next check is due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.checks.values().map(|(_, due)| *due).min()
    }

    /// Starts the checks that are due, each in a task of its own (a fold can take a minute,
    /// and compaction goes on meanwhile: the manifest's conditional writes keep the two
    /// apart); see [`tidy_until_settled`].
    pub(super) fn tidy_due(&mut self, compactor: &Compactor) {
        let now = Instant::now();
        let due: Vec<(ClusterName, SessionName)> = self
            .checks
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(session, _)| session.clone())
            .collect();
        for session in due {
            let Some((check, _)) = self.checks.remove(&session) else {
                continue;
            };
            let started = Started::new(&self.started, session);
            tokio::spawn(tidy_until_settled(
                compactor.clone(),
                check,
                Waits {
                    quiet: self.quiet,
                    max: self.max_wait,
                },
                Arc::clone(&self.tidying),
                started,
            ));
        }
    }
}

/// Checks started and not ended, by session.
type StartedChecks = Arc<Mutex<BTreeMap<(ClusterName, SessionName), usize>>>;

/// A started check, counted in [`QuietTimers::started`] until it ends, however it ends.
struct Started {
    checks: StartedChecks,
    session: (ClusterName, SessionName),
}

impl Started {
    /// Counts a check of `session` in `checks`.
    fn new(checks: &StartedChecks, session: (ClusterName, SessionName)) -> Self {
        *lock(checks).entry(session.clone()).or_default() += 1;
        Self {
            checks: Arc::clone(checks),
            session,
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let mut checks = lock(&self.checks);
        if let Some(count) = checks.get_mut(&self.session) {
            *count -= 1;
            if *count == 0 {
                checks.remove(&self.session);
            }
        }
    }
}

/// What `mutex` guards, even if a task panicked while holding it (each change to it is a
/// single step, so it is never left half made).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `check`, tidying only while it holds `tidying`: a fold encodes on every core and holds
/// a session's rows, so the sessions a restart finds untidy, all due at once, are folded one
/// after another rather than all together in memory. A session still holding retired files is
/// checked again a quiet period later, until it changes or is tidy; a check that failed tries
/// again after a wait that doubles with each failure in a row ([`Waits::after_failure`]).
async fn tidy_until_settled(
    compactor: Compactor,
    mut check: QuietCheck,
    waits: Waits,
    tidying: Arc<Semaphore>,
    _started: Started,
) {
    let mut wait = waits.quiet;
    loop {
        // The semaphore is never closed.
        let Ok(permit) = tidying.acquire().await else {
            return;
        };
        match compactor.tidy_if_quiet(&check).await {
            Ok(tidied) if tidied.again => {
                check.sequence = tidied.sequence;
                wait = waits.quiet;
            }
            Ok(_) => return,
            Err(err) => {
                wait = waits.after_failure(wait);
                tracing::warn!(
                    cluster = %check.cluster,
                    session = %check.session,
                    error = %err,
                    wait_s = wait.as_secs_f64(),
                    "could not tidy a quiet session; trying again later"
                );
            }
        }
        drop(permit);
        tokio::time::sleep(wait).await;
    }
}

/// How long a started check waits before it tries again.
#[derive(Clone, Copy, Debug)]
struct Waits {
    /// After a tidy that left retired files: the quiet period.
    quiet: Duration,
    /// The longest wait after failures.
    max: Duration,
}

impl Waits {
    /// The wait after a failure that followed a wait of `last`: doubled, up to `max` (never
    /// under the quiet period). A check that fails every time (a fold that cannot be written)
    /// would otherwise take the one tidy permit, and a fold's memory and cores, every quiet
    /// period for as long as the fault lasts.
    fn after_failure(self, last: Duration) -> Duration {
        last.saturating_mul(2).min(self.max).max(self.quiet)
    }
}

/// A check at its current version of each session whose manifest holds deltas, replaced
/// files or a base of an older format: what a quiet check would tidy.
pub(super) async fn untidy_sessions(
    storage: &Arc<dyn Storage>,
) -> Result<Vec<QuietCheck>, StorageError> {
    let mut untidy = Vec::new();
    let mut reads = JoinSet::new();
    // Each read's key, by task, to name a read that panicked.
    let mut reading = HashMap::new();
    let mut manifests = storage.list(keys::MANIFESTS_PREFIX).await?.into_iter();
    loop {
        while reads.len() < CONCURRENT_MANIFEST_READS
            && let Some(meta) = manifests.next()
        {
            let Some((cluster, session)) = keys::manifest_session(&meta.key) else {
                continue;
            };
            let storage = Arc::clone(storage);
            let id = reads
                .spawn({
                    let key = meta.key.clone();
                    async move {
                        let loaded = manifest::load(&*storage, &key).await;
                        (cluster, session, loaded)
                    }
                })
                .id();
            reading.insert(id, meta.key);
        }
        let Some(read) = reads.join_next_with_id().await else {
            break;
        };
        let (key, (cluster, session, loaded)) = match read {
            Ok((id, read)) => (reading.remove(&id), read),
            Err(err) => {
                let key = reading.remove(&err.id());
                tracing::warn!(key = ?key, error = %err, "a manifest read to tidy stopped");
                continue;
            }
        };
        match loaded {
            Ok(current) => untidy.extend(untidy_check(cluster, session, &current.manifest)),
            // Its next commit watches it; nothing else depends on this one.
            Err(err) => {
                tracing::warn!(key = ?key, error = %err, "cannot read a manifest to tidy it");
            }
        }
    }
    Ok(untidy)
}

/// A check of the session at its current version if its manifest holds deltas, replaced files
/// or a base of an older format.
fn untidy_check(
    cluster: ClusterName,
    session: SessionName,
    manifest: &manifest::Manifest,
) -> Option<QuietCheck> {
    let untidy = manifest.task_attempts.needs_fold() || !manifest.retired.is_empty();
    untidy.then_some(QuietCheck {
        cluster,
        session,
        sequence: manifest.sequence,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::schedule::queue::PARK_MAX;

    #[test]
    fn a_failing_quiet_check_waits_twice_as_long_each_time_up_to_the_cap() {
        let waits = Waits {
            quiet: Duration::from_secs(60),
            max: PARK_MAX,
        };
        let mut wait = waits.quiet;
        let seen: Vec<u64> = (0..5)
            .map(|_| {
                wait = waits.after_failure(wait);
                wait.as_secs()
            })
            .collect();
        assert_eq!(seen, [120, 240, 480, 600, 600]);
        // `serve`'s defaults: a 5-minute quiet period, so the cap at once.
        let defaults = Waits {
            quiet: Duration::from_secs(300),
            max: PARK_MAX,
        };
        assert_eq!(defaults.after_failure(defaults.quiet), PARK_MAX);
        let capped_below_quiet = Waits {
            quiet: Duration::from_secs(60),
            max: Duration::from_secs(10),
        };
        assert_eq!(
            capped_below_quiet.after_failure(capped_below_quiet.quiet),
            capped_below_quiet.quiet,
            "a failed check never tries again sooner than a quiet period"
        );
    }

    fn check(cluster: &str, sequence: u64) -> QuietCheck {
        QuietCheck {
            cluster: ClusterName::new(cluster).unwrap_or_else(|err| panic!("a test name: {err}")),
            session: SessionName::new("session_2026-11-25_10-00-00_000000_1")
                .unwrap_or_else(|err| panic!("a test session: {err}")),
            sequence,
        }
    }

    fn watched(timers: &QuietTimers, cluster: &str) -> Option<u64> {
        let session = check(cluster, 0);
        timers
            .checks
            .get(&(session.cluster, session.session))
            .map(|(check, _)| check.sequence)
    }

    #[test]
    fn a_session_found_untidy_leaves_a_commits_check_as_it_is() {
        let mut timers = QuietTimers::new(Duration::from_secs(1), PARK_MAX);
        timers.watch(vec![check("a", 5)]);
        timers.watch_untidy(vec![check("a", 3), check("b", 2)]);
        assert_eq!(
            watched(&timers, "a"),
            Some(5),
            "a commit's check was replaced"
        );
        assert_eq!(
            watched(&timers, "b"),
            Some(2),
            "an untidy session is watched"
        );
        timers.watch(vec![check("b", 4)]);
        assert_eq!(
            watched(&timers, "b"),
            Some(4),
            "a commit replaces the scan's check"
        );

        // A session whose check has started (its task waits for its turn or to try again),
        // twice: a commit's check came due while the earlier one waited.
        let session = check("c", 0);
        let session = (session.cluster, session.session);
        let first = Started::new(&timers.started, session.clone());
        let second = Started::new(&timers.started, session);
        timers.watch_untidy(vec![check("c", 1)]);
        assert_eq!(watched(&timers, "c"), None, "a started check was doubled");
        drop(first);
        timers.watch_untidy(vec![check("c", 1)]);
        assert_eq!(
            watched(&timers, "c"),
            None,
            "one started check is still running"
        );
        drop(second);
        timers.watch_untidy(vec![check("c", 1)]);
        assert_eq!(
            watched(&timers, "c"),
            Some(1),
            "no check is running any more"
        );
    }
}
