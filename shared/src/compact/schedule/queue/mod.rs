//! The in-process stand-in for S3 → SQS → compact used by `serve`: ingest notifies each raw key it
//! stores; a background task batches keys that arrive close together and compacts them in one run,
//! so a burst of POSTs is one compaction. A run that fails as a whole is retried twice, a second
//! apart; keys it still cannot compact, objects it could not read, and the objects of a session it
//! could not commit (it commits the others) are parked and tried again later on their own (see
//! `parked`). After each successful run the queue records which raw objects it compacted
//! ([`super::backlog`]), so that a `serve` started after a crash compacts what this one could not.
//! It also stands in for the compact queue's delayed quiet checks: a session a run committed is
//! tidied ([`crate::compact::fold`]) once no run has changed it for the policy's quiet period, and
//! so is every session found untidy at start ([`CompactionQueue::catch_up`]). One session is tidied
//! at a time, as the compact function tidies the checks of one invocation.

mod parked;
mod timers;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use self::parked::{Parked, ParkedGroup};
use self::timers::{QuietTimers, untidy_sessions};
use super::backlog;
use super::quiet::QuietCheck;
use crate::compact::Compactor;
use crate::compact::report::RunOutcome;
use crate::raw::read::RawError;
use crate::storage::{ObjectKey, Storage, StorageError};

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
/// Most raw objects per run, as the compact function's SQS batch: a backlog found at start is
/// compacted in bounded steps.
const MAX_BATCH: usize = crate::compact::RUN_OBJECTS;

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
    /// untidy (deltas, replaced files, or a base of an older format), as if it had just
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
