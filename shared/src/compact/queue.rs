//! The in-process stand-in for S3 → SQS → compact used by `serve`: ingest notifies each raw key
//! it stores; a background task batches keys that arrive close together and compacts them in
//! one run, so a burst of POSTs is one compaction. A run that fails as a whole is retried
//! twice, a second apart; keys it still cannot compact, objects it could not read, and the
//! objects of a session it could not commit (it commits the others) are parked and tried again
//! later on their own (see `Parked`).
//! After each successful run the queue records which raw objects it compacted
//! ([`super::backlog`]), so that a `serve` started after a crash compacts what this one could not.
//! It also stands in for the compact queue's delayed quiet checks: a session a run committed is
//! tidied ([`super::fold`]) once no run has changed it for the policy's quiet period, and so is
//! every session found untidy at start ([`CompactionQueue::catch_up`]). One session is tidied
//! at a time, as the compact function tidies the checks of one invocation.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::fold::QuietCheck;
use super::raw::RawError;
use super::{Compactor, RunOutcome, backlog};
use crate::layout::{self, ClusterName, SessionName};
use crate::storage::{ObjectKey, Storage, StorageError};
use crate::tables::manifest;

/// How long the queue waits for more keys after the first one before compacting.
const BATCH_WINDOW: Duration = Duration::from_millis(150);
/// Pause before retrying a failed run ([`QueueTiming::retry_delay`]).
const RETRY_DELAY: Duration = Duration::from_secs(1);
/// Runs tried per batch before its keys are parked (see [`Parked`]).
const MAX_ATTEMPTS: usize = 3;
/// How long keys are parked before they are first tried again ([`QueueTiming::park_first`]).
const PARK_FIRST: Duration = Duration::from_secs(10);
/// The longest wait between tries of parked keys ([`QueueTiming::park_max`]).
const PARK_MAX: Duration = Duration::from_secs(600);
/// Every this many failed tries from the park, keys that keep failing together are split
/// although no run has succeeded since they were parked ([`Parked::splits`]). With no other
/// traffic nothing else succeeds, and a group that one key breaks would be tried whole for ever;
/// a long outage splits groups it did not need to, doubling their number every this many
/// tries (every half hour once the wait is at its 10 minutes), and their keys are then
/// compacted in smaller runs.
const SPLIT_UNPROVEN_AFTER: u32 = 3;
/// Manifests the start-up scan reads at once: over a bucket each is a request of its own
/// (tens of milliseconds), so one after another a few thousand sessions would take minutes.
const CONCURRENT_MANIFEST_READS: usize = 16;
/// Most raw objects per run, as the compact function's SQS batch: a backlog found at start is
/// compacted in bounded steps.
const MAX_BATCH: usize = super::RUN_OBJECTS;

enum Command {
    Compact(ObjectKey),
    /// Answered, with how many keys are parked, once every key queued before it has been
    /// compacted, parked, or left out.
    Idle(oneshot::Sender<usize>),
    /// Sessions found untidy at start, to tidy once quiet unless a commit already asked for
    /// a check of them (see [`QuietTimers::watch_untidy`]).
    WatchUntidy(Vec<QuietCheck>),
}

/// How long the queue waits before trying again what failed. The defaults are `serve`'s; tests
/// shorten them to watch several tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueTiming {
    /// Pause before retrying a run that failed as a whole (a batch is tried up to three times;
    /// the objects of a session a run could not commit are parked at once instead).
    pub retry_delay: Duration,
    /// How long keys are parked before they are first tried again; doubled at each failure
    /// after.
    pub park_first: Duration,
    /// The longest wait between tries of parked keys, and between tries of a quiet check
    /// that keeps failing.
    pub park_max: Duration,
}

impl Default for QueueTiming {
    fn default() -> Self {
        Self {
            retry_delay: RETRY_DELAY,
            park_first: PARK_FIRST,
            park_max: PARK_MAX,
        }
    }
}

/// Handle to the background compaction task.
#[derive(Clone, Debug)]
pub struct CompactionQueue {
    sender: mpsc::UnboundedSender<Command>,
    /// The compactor's storage, where [`Self::catch_up`] looks for what was left.
    storage: Arc<dyn Storage>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Compact(key) => write!(f, "Compact({key})"),
            Self::Idle(_) => f.write_str("Idle"),
            Self::WatchUntidy(checks) => write!(f, "WatchUntidy({} sessions)", checks.len()),
        }
    }
}

impl CompactionQueue {
    /// Starts the background task on the current Tokio runtime.
    pub fn spawn(compactor: Compactor) -> Self {
        Self::spawn_with(compactor, QueueTiming::default())
    }

    /// [`Self::spawn`], waiting as `timing` says before trying again what failed.
    pub fn spawn_with(compactor: Compactor, timing: QueueTiming) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let storage = Arc::clone(compactor.storage());
        tokio::spawn(run(compactor, receiver, timing));
        Self { sender, storage }
    }

    /// Queues a raw object for compaction.
    pub fn notify(&self, key: ObjectKey) {
        if self.sender.send(Command::Compact(key)).is_err() {
            tracing::error!(
                "the compaction task has stopped; the next start of `serve` compacts what it missed"
            );
        }
    }

    /// Queues every raw object an earlier `serve` on the compactor's storage may have left
    /// uncompacted (see [`super::backlog`]) and returns how many.
    ///
    /// It also starts, in the background, a scan that watches every session whose manifest is
    /// untidy (deltas, replaced files, or a base an earlier build wrote), as if it had just
    /// been committed: the quiet check its last commit asked for died with the process that
    /// made it, or was never asked for (`afterglow rebuild` or `compact` on the same store),
    /// and without one the session would stay so until it changed again. The scan reads one
    /// manifest per session, so `serve` does not wait for it; a session it finds is left out
    /// when a commit of this queue already asked for a check of it, or is being tidied
    /// ([`QuietTimers::watch_untidy`]).
    pub async fn catch_up(&self) -> Result<usize, StorageError> {
        let (storage, sender) = (Arc::clone(&self.storage), self.sender.clone());
        // Not joined: a panic in the scan costs only its tidying, and is printed.
        tokio::spawn(async move {
            match untidy_sessions(&storage).await {
                Ok(untidy) if !untidy.is_empty() => {
                    tracing::info!(sessions = untidy.len(), "sessions to tidy once quiet");
                    if sender.send(Command::WatchUntidy(untidy)).is_err() {
                        tracing::warn!(
                            "the compaction task has stopped; untidy sessions are left to the next start"
                        );
                    }
                }
                Ok(_) => {}
                // Only tidying waits for it: each session's next commit watches it.
                Err(err) => tracing::warn!(error = %err, "cannot list the manifests to tidy"),
            }
        });
        let storage = self.storage.as_ref();
        backlog::consolidate(storage).await?;
        let keys = backlog::uncompacted(storage).await?;
        let count = keys.len();
        for key in keys {
            self.notify(key);
        }
        Ok(count)
    }

    /// Waits until everything queued so far has been compacted, parked to be tried again, or
    /// left out (logged) as unreadable for good, and returns how many keys are parked: raw
    /// objects not yet in any table, which the next start compacts if this process stops.
    /// `None` when the queue's task is gone (it panicked): what it held is unknown.
    pub async fn idle(&self) -> Option<usize> {
        let (done, wait) = oneshot::channel();
        self.sender.send(Command::Idle(done)).ok()?;
        wait.await.ok()
    }
}

async fn run(
    compactor: Compactor,
    mut receiver: mpsc::UnboundedReceiver<Command>,
    timing: QueueTiming,
) {
    let mut pending: Vec<ObjectKey> = Vec::new();
    let mut waiters: Vec<oneshot::Sender<usize>> = Vec::new();
    let mut quiet = QuietTimers::new(compactor.settings().fold.quiet, timing.park_max);
    let mut parked = Parked::default();
    loop {
        // Checks come first: under steady ingest a command is always waiting, and other
        // sessions' checks would wait for ever.
        quiet.tidy_due(&compactor);
        // One parked group per turn, tried once (its backoff is its retry): new keys and
        // `idle` callers take their turns between them, whatever is parked.
        if let Some(group) = parked.take_due(Instant::now()) {
            let outcome = compact_once(&compactor, &group.keys).await;
            let retried = Some(&group);
            settle(
                &compactor,
                &timing,
                outcome,
                &mut quiet,
                &mut parked,
                retried,
            )
            .await;
        }
        // A command that is already waiting is taken even when something else is due.
        let due = [quiet.next_due(), parked.next_due()]
            .into_iter()
            .flatten()
            .min();
        let command = match due {
            None => receiver.recv().await,
            Some(due) => match tokio::time::timeout_at(due, receiver.recv()).await {
                Ok(command) => command,
                Err(_) => continue,
            },
        };
        let Some(command) = command else {
            // Warned about by whoever stops the queue (`idle` tells them the count): this
            // task may not run again once the runtime shuts down.
            tracing::debug!(
                keys = parked.keys(),
                "the compaction queue stops; parked keys are left to the next start"
            );
            return;
        };
        take(command, &mut pending, &mut waiters, &mut quiet);
        // Gather whatever else arrives within the window.
        let deadline = Instant::now() + BATCH_WINDOW;
        while pending.len() < MAX_BATCH
            && let Ok(Some(command)) = tokio::time::timeout_at(deadline, receiver.recv()).await
        {
            take(command, &mut pending, &mut waiters, &mut quiet);
        }
        if !pending.is_empty() {
            let keys = std::mem::take(&mut pending);
            let outcome = compact_retrying(&compactor, &keys, timing.retry_delay).await;
            settle(&compactor, &timing, outcome, &mut quiet, &mut parked, None).await;
        }
        for waiter in waiters.drain(..) {
            let _ = waiter.send(parked.keys());
        }
    }
}

/// What a run over some keys came to.
enum Outcome<'a> {
    /// The run committed what it could ([`RunOutcome`]).
    Compacted {
        /// The keys asked for.
        keys: &'a [ObjectKey],
        /// What it committed, and what it could not.
        run: Box<RunOutcome>,
    },
    /// The run failed as a whole.
    Failed(&'a [ObjectKey]),
}

/// Compacts `keys` in one run.
async fn compact_once<'a>(compactor: &Compactor, keys: &'a [ObjectKey]) -> Outcome<'a> {
    match compactor.compact_readable(keys).await {
        Ok(run) => Outcome::Compacted {
            keys,
            run: Box::new(run),
        },
        Err(err) => {
            tracing::error!(error = %err, keys = keys.len(), "compaction failed");
            Outcome::Failed(keys)
        }
    }
}

/// Compacts `keys`, trying a run that fails as a whole up to [`MAX_ATTEMPTS`] times, `delay`
/// apart.
async fn compact_retrying<'a>(
    compactor: &Compactor,
    keys: &'a [ObjectKey],
    delay: Duration,
) -> Outcome<'a> {
    let mut tried = 1;
    loop {
        let outcome = compact_once(compactor, keys).await;
        if matches!(outcome, Outcome::Compacted { .. }) || tried == MAX_ATTEMPTS {
            return outcome;
        }
        tried += 1;
        tokio::time::sleep(delay).await;
    }
}

/// Whether an object that could not be read may be readable later: a storage fault may pass;
/// a key that is not a raw object's, an object that is gone, or one that is not gzip text
/// will not, and is left out (logged) rather than tried for ever. Left unrecorded, a corrupt
/// object is tried (and logged) again at each start; a gone one is no longer listed.
fn may_read_later(error: &RawError) -> bool {
    matches!(error, RawError::Storage(err) if !matches!(err, StorageError::NotFound { .. }))
}

/// Records what a run compacted, watches the sessions it committed, and parks what it did not
/// compact but may later. `retried` is the parked group the run tried again, if it was one.
async fn settle(
    compactor: &Compactor,
    timing: &QueueTiming,
    outcome: Outcome<'_>,
    quiet: &mut QuietTimers,
    parked: &mut Parked,
    retried: Option<&ParkedGroup>,
) {
    let wait = retried.map_or(timing.park_first, |group| group.next_wait(timing.park_max));
    let failed_retries = retried.map_or(0, ParkedGroup::failed_again);
    let splits = |parked: &Parked| retried.is_some_and(|group| parked.splits(group));
    match outcome {
        Outcome::Compacted { keys, run } => {
            let not_compacted = run.not_compacted();
            let compacted: Vec<ObjectKey> = keys
                .iter()
                .filter(|key| !not_compacted.contains(key))
                .cloned()
                .collect();
            // A run that compacted none of its objects says nothing about storage working.
            if !compacted.is_empty() {
                parked.succeeded(Instant::now());
            }
            if let Err(err) = backlog::record(compactor.storage().as_ref(), &compacted).await {
                // Only costs time: the next start compacts these again.
                tracing::warn!(error = %err, "cannot record compaction progress");
            }
            let RunOutcome {
                report,
                unreadable,
                failed,
            } = *run;
            quiet.watch(report.committed);
            let mut later = Vec::new();
            for (key, error) in unreadable {
                if may_read_later(&error) {
                    later.push(key);
                } else {
                    tracing::error!(key = %key, %error, "raw object left out: it cannot be compacted");
                }
            }
            if !later.is_empty() {
                tracing::warn!(
                    keys = later.len(),
                    wait_s = wait.as_secs(),
                    "raw objects could not be read; they are parked and tried again later"
                );
            }
            // A read fails for its own object alone: nothing is gained by splitting them.
            parked.park(later, wait, failed_retries);
            // Each session that could not be committed waits apart (a full disk, a refused
            // write, or one of its objects that breaks it), holding back no other session.
            let split = splits(parked);
            for session in failed {
                tracing::warn!(
                    cluster = %session.cluster,
                    session = %session.session,
                    keys = session.keys.len(),
                    wait_s = wait.as_secs(),
                    "a session's raw objects are parked and tried again later"
                );
                parked.park_split(&session.keys, wait, split, failed_retries);
            }
        }
        Outcome::Failed(keys) => {
            tracing::warn!(
                keys = keys.len(),
                wait_s = wait.as_secs(),
                "raw objects whose run failed are parked and tried again later"
            );
            let split = splits(parked);
            parked.park_split(keys, wait, split, failed_retries);
        }
    }
}

/// Raw keys whose runs failed, whose objects could not be read, or whose sessions could not be
/// committed, waiting to be tried again.
///
/// Without it a fault that outlasts a run's retries (a full disk, storage down for a minute)
/// would leave those objects out of every table until `serve` started again, however long it
/// ran. They stay unrecorded in the backlog meanwhile, so a stop also leaves them to the next
/// start.
#[derive(Default)]
struct Parked {
    groups: Vec<ParkedGroup>,
    /// When a run last compacted an object.
    last_success: Option<Instant>,
}

/// Keys parked together, and when they are tried again.
struct ParkedGroup {
    keys: Vec<ObjectKey>,
    parked_at: Instant,
    due: Instant,
    wait: Duration,
    /// How many times its keys were tried from the park and not compacted (a split's halves
    /// carry their group's count on).
    failed_retries: u32,
}

impl ParkedGroup {
    /// Its count of failed tries once the try under way has failed too.
    fn failed_again(&self) -> u32 {
        self.failed_retries.saturating_add(1)
    }

    /// The wait after this group's next failure: doubled, up to `max`.
    fn next_wait(&self, max: Duration) -> Duration {
        self.wait.saturating_mul(2).min(max)
    }
}

impl Parked {
    /// Parks `keys` (if any) as one group, tried again after `wait`, that failed
    /// `failed_retries` tries from the park so far.
    fn park(&mut self, keys: Vec<ObjectKey>, wait: Duration, failed_retries: u32) {
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
    fn park_split(&mut self, keys: &[ObjectKey], wait: Duration, split: bool, failed_retries: u32) {
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
    fn succeeded(&mut self, at: Instant) {
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
    fn splits(&self, group: &ParkedGroup) -> bool {
        self.succeeded_since(group.parked_at)
            || group.failed_again().is_multiple_of(SPLIT_UNPROVEN_AFTER)
    }

    /// When the next group is due.
    fn next_due(&self) -> Option<Instant> {
        self.groups.iter().map(|group| group.due).min()
    }

    /// Takes the earliest group due at `now`.
    fn take_due(&mut self, now: Instant) -> Option<ParkedGroup> {
        let (index, _) = self
            .groups
            .iter()
            .enumerate()
            .filter(|(_, group)| group.due <= now)
            .min_by_key(|(_, group)| group.due)?;
        Some(self.groups.swap_remove(index))
    }

    /// How many keys are parked.
    fn keys(&self) -> usize {
        self.groups.iter().map(|group| group.keys.len()).sum()
    }
}

/// The quiet checks waiting for their time: one per session, its newest commit's (or, for a
/// session untidy at start, its version when the start-up scan read it).
struct QuietTimers {
    quiet: Duration,
    /// The longest wait before a failed check tries again ([`QueueTiming::park_max`]).
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
    fn new(quiet: Duration, max_wait: Duration) -> Self {
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
    fn watch(&mut self, committed: Vec<QuietCheck>) {
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
    fn watch_untidy(&mut self, untidy: Vec<QuietCheck>) {
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
    fn next_due(&self) -> Option<Instant> {
        self.checks.values().map(|(_, due)| *due).min()
    }

    /// Starts the checks that are due, each in a task of its own (a fold can take a minute,
    /// and compaction goes on meanwhile: the manifest's conditional writes keep the two
    /// apart); see [`tidy_until_settled`].
    fn tidy_due(&mut self, compactor: &Compactor) {
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

fn take(
    command: Command,
    pending: &mut Vec<ObjectKey>,
    waiters: &mut Vec<oneshot::Sender<usize>>,
    quiet: &mut QuietTimers,
) {
    match command {
        Command::Compact(key) => pending.push(key),
        Command::Idle(done) => waiters.push(done),
        Command::WatchUntidy(checks) => quiet.watch_untidy(checks),
    }
}

/// A check at its current version of each session whose manifest holds deltas, replaced
/// files or a base an earlier build wrote: what a quiet check would tidy.
async fn untidy_sessions(storage: &Arc<dyn Storage>) -> Result<Vec<QuietCheck>, StorageError> {
    let mut untidy = Vec::new();
    let mut reads = JoinSet::new();
    // Each read's key, by task, to name a read that panicked.
    let mut reading = HashMap::new();
    let mut manifests = storage.list(layout::MANIFESTS_PREFIX).await?.into_iter();
    loop {
        while reads.len() < CONCURRENT_MANIFEST_READS
            && let Some(meta) = manifests.next()
        {
            let Some((cluster, session)) = layout::manifest_session(&meta.key) else {
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
/// or a base an earlier build wrote.
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
