//! The in-process stand-in for S3 → SQS → compact used by `serve`: ingest notifies each raw key
//! it stores; a background task batches keys that arrive close together and compacts them in
//! one run, so a burst of POSTs is one compaction. A failed run keeps its keys and retries.
//! After each successful run the queue records which raw objects it compacted
//! ([`super::backlog`]), so that a `serve` started after a crash compacts what this one could not.
//! It also stands in for the compact queue's delayed quiet checks: a session a run committed is
//! tidied ([`super::fold`]) once no run has changed it for the policy's quiet period.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::fold::QuietCheck;
use super::{Compactor, backlog};
use crate::layout::{ClusterName, SessionName};
use crate::storage::{ObjectKey, Storage, StorageError};

/// How long the queue waits for more keys after the first one before compacting.
const BATCH_WINDOW: Duration = Duration::from_millis(150);
/// Pause before retrying a failed run.
const RETRY_DELAY: Duration = Duration::from_secs(1);
/// Runs tried per batch before its keys are left for the next start (see [`super::backlog`]).
const MAX_ATTEMPTS: usize = 3;
/// Most raw objects per run, as the compact function's SQS batch: a backlog found at start is
/// compacted in bounded steps.
const MAX_BATCH: usize = super::RUN_OBJECTS;

enum Command {
    Compact(ObjectKey),
    /// Answered once every key queued before it has been compacted.
    Idle(oneshot::Sender<()>),
}

/// Handle to the background compaction task.
#[derive(Clone, Debug)]
pub struct CompactionQueue {
    sender: mpsc::UnboundedSender<Command>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Compact(key) => write!(f, "Compact({key})"),
            Self::Idle(_) => f.write_str("Idle"),
        }
    }
}

impl CompactionQueue {
    /// Starts the background task on the current Tokio runtime.
    pub fn spawn(compactor: Compactor) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(compactor, receiver));
        Self { sender }
    }

    /// Queues a raw object for compaction.
    pub fn notify(&self, key: ObjectKey) {
        if self.sender.send(Command::Compact(key)).is_err() {
            tracing::error!("the compaction task has stopped; raw objects stay for `rebuild`");
        }
    }

    /// Queues every raw object an earlier `serve` on `storage` may have left uncompacted (see
    /// [`super::backlog`]) and returns how many.
    pub async fn catch_up(&self, storage: &dyn Storage) -> Result<usize, StorageError> {
        backlog::consolidate(storage).await?;
        let keys = backlog::uncompacted(storage).await?;
        let count = keys.len();
        for key in keys {
            self.notify(key);
        }
        Ok(count)
    }

    /// Waits until everything queued so far has been compacted.
    pub async fn idle(&self) {
        let (done, wait) = oneshot::channel();
        if self.sender.send(Command::Idle(done)).is_ok() {
            let _ = wait.await;
        }
    }
}

async fn run(compactor: Compactor, mut receiver: mpsc::UnboundedReceiver<Command>) {
    let mut pending: Vec<ObjectKey> = Vec::new();
    let mut waiters: Vec<oneshot::Sender<()>> = Vec::new();
    let mut failures = 0;
    let mut quiet = QuietTimers::new(compactor.settings().fold.quiet);
    loop {
        // Checks come first: under steady ingest a command is always waiting, and other
        // sessions' checks would wait for ever.
        quiet.tidy_due(&compactor);
        if pending.is_empty() && waiters.is_empty() {
            let command = match quiet.next_due() {
                None => receiver.recv().await,
                Some(due) => match tokio::time::timeout_at(due, receiver.recv()).await {
                    Ok(command) => command,
                    Err(_) => continue,
                },
            };
            match command {
                Some(command) => take(command, &mut pending, &mut waiters),
                None => return,
            }
        }
        // Gather whatever else arrives within the window.
        let deadline = Instant::now() + BATCH_WINDOW;
        while pending.len() < MAX_BATCH
            && let Ok(Some(command)) = tokio::time::timeout_at(deadline, receiver.recv()).await
        {
            take(command, &mut pending, &mut waiters);
        }
        if !pending.is_empty() {
            match compactor.compact(&pending).await {
                Ok(report) => {
                    if let Err(err) = backlog::record(compactor.storage().as_ref(), &pending).await
                    {
                        // Only costs time: the next start compacts these again.
                        tracing::warn!(error = %err, "cannot record compaction progress");
                    }
                    quiet.watch(report.committed);
                    pending.clear();
                    failures = 0;
                }
                Err(err) if failures + 1 < MAX_ATTEMPTS => {
                    failures += 1;
                    tracing::error!(error = %err, keys = pending.len(), "compaction failed; retrying");
                    tokio::time::sleep(RETRY_DELAY).await;
                    continue;
                }
                Err(err) => {
                    tracing::error!(
                        error = %err,
                        keys = pending.len(),
                        "compaction failed {MAX_ATTEMPTS} times; the raw objects stay for the next start of `serve` (or `afterglow compact`)"
                    );
                    // Unrecorded, so the next start compacts them.
                    pending.clear();
                    failures = 0;
                }
            }
        }
        for waiter in waiters.drain(..) {
            let _ = waiter.send(());
        }
    }
}

/// The quiet checks waiting for their time: one per session, its newest commit's.
struct QuietTimers {
    quiet: Duration,
    checks: BTreeMap<(ClusterName, SessionName), (QuietCheck, Instant)>,
}

impl QuietTimers {
    fn new(quiet: Duration) -> Self {
        Self {
            quiet,
            checks: BTreeMap::new(),
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

    /// When the next check is due.
    fn next_due(&self) -> Option<Instant> {
        self.checks.values().map(|(_, due)| *due).min()
    }

    /// Starts the checks that are due, each in a task of its own (a fold can take a minute,
    /// and compaction goes on meanwhile: the manifest's conditional writes keep the two
    /// apart). A session still holding retired files, or whose check failed, is checked again
    /// by that task a quiet period later, until it changes or is tidy.
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
            let compactor = compactor.clone();
            let quiet = self.quiet;
            tokio::spawn(async move {
                let mut check = check;
                loop {
                    match compactor.tidy_if_quiet(&check).await {
                        Ok(tidied) if tidied.again => check.sequence = tidied.sequence,
                        Ok(_) => return,
                        Err(err) => {
                            tracing::warn!(error = %err, "could not tidy a quiet session; trying again later");
                        }
                    }
                    tokio::time::sleep(quiet).await;
                }
            });
        }
    }
}

fn take(command: Command, pending: &mut Vec<ObjectKey>, waiters: &mut Vec<oneshot::Sender<()>>) {
    match command {
        Command::Compact(key) => pending.push(key),
        Command::Idle(done) => waiters.push(done),
    }
}
