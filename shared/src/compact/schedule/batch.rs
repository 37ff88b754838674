//! A batch of notifications (the compact function's SQS batch) compacted as one unit, with an
//! answer per message: which messages to retry. It owns the rules that keep one bad message
//! from costing the batch: an unreadable raw object fails only the messages that name it, a
//! batch is capped by the raw bytes it names ([`BatchLimits::split`]: the caller defers the
//! rest), and whatever cannot finish before the deadline is reported back unattempted instead
//! of being cut off by the platform.
//!
//! It knows nothing of SQS's wire format: the handler turns records into [`Message`]s.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument as _;

use crate::compact::{CompactReport, Compactor};
use crate::storage::ObjectKey;

/// One notification: an id the caller can report back, and the raw objects it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The id to report when the message must be retried (SQS's `messageId`).
    pub id: String,
    /// The raw objects it names, each with its size in bytes as notified.
    pub objects: Vec<(ObjectKey, u64)>,
}

impl Message {
    fn bytes(&self) -> u64 {
        self.objects.iter().map(|(_, size)| size).sum()
    }
}

/// How much one batch may take on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchLimits {
    /// Raw bytes (as notified: compressed) compacted in one run; the messages past the cap are
    /// deferred ([`BatchLimits::split`]). The first message is always taken, whatever its size.
    pub max_bytes: Option<u64>,
    /// When the caller must have answered (the Lambda deadline).
    pub deadline: Option<Instant>,
    /// Time kept back before the deadline for answering.
    pub margin: Duration,
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            max_bytes: None,
            deadline: None,
            margin: Duration::from_secs(15),
        }
    }
}

impl BatchLimits {
    /// Compressed raw bytes a batch may name in a function with `memory_mib` of memory: 1/20
    /// (150 MiB of the compact function's 3008), so that a full batch of
    /// [`crate::compact::RUN_OBJECTS`] bodies like the bench's is one run. A run's peak memory
    /// grows with the compressed bytes it reads, so the cap keeps a batch well within the
    /// function's memory even for bodies that compress better than the bench's; a smaller cap
    /// would cut ordinary batches short, and their rest would wait out the queue's visibility
    /// timeout.
    pub fn max_bytes_for_memory(memory_mib: u64) -> u64 {
        memory_mib * 1024 * 1024 / 20
    }

    /// `messages` split into those one run takes (the first always, then while their raw
    /// bytes stay within the cap) and those past the cap, deferred to a later run.
    pub fn split<'a>(&self, messages: &'a [Message]) -> (&'a [Message], &'a [Message]) {
        let Some(cap) = self.max_bytes else {
            return (messages, &[]);
        };
        let mut bytes = 0;
        let taken = messages
            .iter()
            .enumerate()
            .take_while(|(index, message)| {
                bytes += message.bytes();
                *index == 0 || bytes <= cap
            })
            .count();
        messages.split_at(taken)
    }

    /// Time left before the answer is due, or `None` without a deadline.
    fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|deadline| deadline.saturating_duration_since(Instant::now()))
            .map(|left| left.saturating_sub(self.margin))
    }
}

/// What a batch came to.
#[derive(Debug, Default)]
pub struct BatchOutcome {
    /// Ids of the messages to retry, in batch order.
    pub failed: Vec<String>,
    /// What the batch's run did, and the sessions the messages compacted again on their own
    /// committed (only their `committed` is added).
    pub report: CompactReport,
}

impl Compactor {
    /// Compacts the messages' raw objects together, and says which messages must be retried:
    /// those naming an object that could not be read, those of a session the run could not
    /// commit that fail again on their own (below), and all that were not compacted when the
    /// deadline (less the margin) came. The byte cap is the caller's ([`BatchLimits::split`]).
    ///
    /// The messages of a session the run could not commit (it commits the others), and all of
    /// them if the run fails as a whole, are compacted again one at a time while time remains,
    /// so that one message that breaks compaction is the only one retried; the rest are
    /// reported unattempted.
    #[tracing::instrument(name = "compact_batch", skip_all, fields(messages = messages.len()))]
    pub async fn compact_messages(
        &self,
        messages: &[Message],
        limits: &BatchLimits,
    ) -> BatchOutcome {
        let mut outcome = BatchOutcome::default();
        let keys: Vec<ObjectKey> = messages
            .iter()
            .flat_map(|message| message.objects.iter().map(|(key, _)| key.clone()))
            .collect();
        match self.within(limits, self.compact_readable(&keys)).await {
            Some(Ok(run)) => {
                let unreadable: HashSet<&ObjectKey> =
                    run.unreadable.iter().map(|(key, _)| key).collect();
                let of_failed: HashSet<&ObjectKey> = run
                    .failed
                    .iter()
                    .flat_map(|session| &session.keys)
                    .collect();
                let names = |message: &Message, keys: &HashSet<&ObjectKey>| {
                    message.objects.iter().any(|(key, _)| keys.contains(key))
                };
                let mut again = Vec::new();
                for message in messages {
                    if names(message, &unreadable) {
                        outcome.failed.push(message.id.clone());
                    } else if names(message, &of_failed) {
                        again.push(message);
                    }
                }
                outcome.report = run.report;
                if !again.is_empty() {
                    tracing::warn!(
                        messages = again.len(),
                        "sessions not compacted; compacting their messages one by one"
                    );
                    self.one_by_one(again, limits, &mut outcome).await;
                }
            }
            Some(Err(err)) => {
                tracing::warn!(error = %err, "batch compaction failed; compacting message by message");
                self.one_by_one(messages.iter().collect(), limits, &mut outcome)
                    .await;
            }
            None => {
                tracing::warn!("the deadline came before the batch was compacted; it is retried");
                outcome
                    .failed
                    .extend(messages.iter().map(|message| message.id.clone()));
            }
        }
        let mut seen = HashSet::new();
        outcome.failed.retain(|id| seen.insert(id.clone()));
        let order: HashMap<&str, usize> = messages
            .iter()
            .enumerate()
            .map(|(index, message)| (message.id.as_str(), index))
            .collect();
        outcome
            .failed
            .sort_by_key(|id| order.get(id.as_str()).copied().unwrap_or(usize::MAX));
        tracing::info!(failed = outcome.failed.len(), "batch answered");
        outcome
    }

    /// Compacts each of `messages` in a run of its own while time remains, adding what fails
    /// or is not reached to `outcome.failed`.
    async fn one_by_one(
        &self,
        messages: Vec<&Message>,
        limits: &BatchLimits,
        outcome: &mut BatchOutcome,
    ) {
        for message in messages {
            let keys: Vec<ObjectKey> = message.objects.iter().map(|(key, _)| key.clone()).collect();
            let span = tracing::info_span!("message", message_id = %message.id);
            match self
                .within(limits, self.compact_readable(&keys))
                .instrument(span)
                .await
            {
                Some(Ok(run)) => {
                    if !run.not_compacted().is_empty() {
                        tracing::error!(message_id = %message.id, "message failed again on its own");
                        outcome.failed.push(message.id.clone());
                    }
                    // Its sessions that did commit are to be checked once quiet, as in a whole
                    // batch, whether or not the message is retried.
                    outcome.report.committed.extend(run.report.committed);
                }
                Some(Err(err)) => {
                    tracing::error!(message_id = %message.id, error = %err, "message failed");
                    outcome.failed.push(message.id.clone());
                }
                None => outcome.failed.push(message.id.clone()),
            }
        }
    }

    /// Runs `work` until the deadline (less the margin); `None` if it did not finish. Dropping
    /// a run midway is safe: files it wrote without committing are named by no manifest.
    pub(super) async fn within<T>(
        &self,
        limits: &BatchLimits,
        work: impl Future<Output = T>,
    ) -> Option<T> {
        match limits.remaining() {
            None => Some(work.await),
            Some(left) if left.is_zero() => None,
            Some(left) => tokio::time::timeout(left, work).await.ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str, bytes: u64) -> Message {
        let key = ObjectKey::new(format!("raw/c/2026/11/28/18/{id}.ndjson.gz"))
            .unwrap_or_else(|err| panic!("a test key: {err}"));
        Message {
            id: id.to_owned(),
            objects: vec![(key, bytes)],
        }
    }

    fn ids(messages: &[Message]) -> Vec<&str> {
        messages.iter().map(|message| message.id.as_str()).collect()
    }

    #[test]
    fn a_batch_is_split_at_its_byte_cap_and_the_first_message_always_taken() {
        let batch = [
            message("a", 40),
            message("b", 30),
            message("c", 30),
            message("d", 1),
        ];
        let capped = |max_bytes| BatchLimits {
            max_bytes,
            ..BatchLimits::default()
        };
        let split = |limits: BatchLimits| {
            let (taken, deferred) = limits.split(&batch);
            (ids(taken), ids(deferred))
        };
        assert_eq!(split(capped(None)), (vec!["a", "b", "c", "d"], vec![]));
        assert_eq!(split(capped(Some(100))), (vec!["a", "b", "c"], vec!["d"]));
        assert_eq!(split(capped(Some(101))), (vec!["a", "b", "c", "d"], vec![]));
        // A message that would fit after one that did not is deferred too: batch order holds.
        assert_eq!(split(capped(Some(70))), (vec!["a", "b"], vec!["c", "d"]));
        assert_eq!(split(capped(Some(10))), (vec!["a"], vec!["b", "c", "d"]));
        assert_eq!(split(capped(Some(0))), (vec!["a"], vec!["b", "c", "d"]));
        let (taken, deferred) = capped(Some(0)).split(&[]);
        assert!(taken.is_empty() && deferred.is_empty());
    }
}
