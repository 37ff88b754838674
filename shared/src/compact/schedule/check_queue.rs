//! Quiet checks on AWS: each is a message to the compact function's own queue, delayed by the
//! quiet period, so a session is looked at again once it may have gone quiet and nothing runs
//! in between (SQS holds the message; no schedule, no poller).
//!
//! It only sends; the compact function reads the messages back among its S3 notifications
//! ([`QuietCheck::from_message`]) and runs them ([`crate::compact::Compactor::tidy_messages`]). It
//! also sends back the notifications a batch deferred ([`CheckQueue::requeue`]).

use std::time::Duration;

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;

use super::quiet::QuietCheck;

/// SQS's most messages in one `SendMessageBatch`.
const MAX_BATCH: usize = 10;

/// SQS's longest message delay.
pub const MAX_DELAY: Duration = Duration::from_secs(900);

/// Quiet checks that could not be queued.
#[derive(Debug, thiserror::Error)]
#[error("could not queue {failed} quiet check(s) on {queue_url}: {reason}")]
pub struct SendError {
    /// The queue.
    pub queue_url: String,
    /// Checks not queued.
    pub failed: usize,
    /// What SQS said.
    pub reason: String,
}

/// The compact function's queue, for quiet checks and the notifications a batch defers.
#[derive(Clone, Debug)]
pub struct CheckQueue {
    client: aws_sdk_sqs::Client,
    queue_url: String,
    delay: Duration,
}

impl CheckQueue {
    /// The queue at `queue_url` through `client`, delaying each check by `delay` (at most
    /// [`MAX_DELAY`]: longer is cut to it).
    pub fn new(client: aws_sdk_sqs::Client, queue_url: String, delay: Duration) -> Self {
        Self {
            client,
            queue_url,
            delay: delay.min(MAX_DELAY),
        }
    }

    /// The queue at `queue_url`, with the SDK's configuration from the environment
    /// (`AWS_ENDPOINT_URL_SQS` points it at another server).
    pub async fn connect(queue_url: String, delay: Duration) -> Self {
        let sdk = crate::aws::sdk_config().await;
        Self::new(aws_sdk_sqs::Client::new(&sdk), queue_url, delay)
    }

    /// Queues `checks`, each delivered once the delay has passed. The SDK retries throttling
    /// and lost answers; a check sent twice costs a second look, nothing more.
    pub async fn send(&self, checks: &[QuietCheck]) -> Result<(), SendError> {
        let delay = i32::try_from(self.delay.as_secs()).unwrap_or(i32::MAX);
        let bodies: Vec<String> = checks.iter().map(QuietCheck::to_message).collect();
        let unsent = self.send_bodies(&bodies, delay).await;
        if unsent.positions.is_empty() {
            return Ok(());
        }
        Err(SendError {
            queue_url: self.queue_url.clone(),
            failed: unsent.positions.len(),
            reason: unsent.reasons.join("; "),
        })
    }

    /// Queues the message `bodies` again, deliverable at once: notifications a batch deferred
    /// (past its byte cap), as new messages, so they neither wait out the visibility timeout
    /// nor use up a receive. Returns the positions in `bodies` not queued (logged once), which
    /// the caller retries the usual way. A body queued and also retried is compacted twice, to
    /// the same rows.
    pub async fn requeue(&self, bodies: &[&str]) -> Vec<usize> {
        let unsent = self.send_bodies(bodies, 0).await;
        if !unsent.positions.is_empty() {
            tracing::warn!(
                queue_url = %self.queue_url,
                unsent = unsent.positions.len(),
                reasons = %unsent.reasons.join("; "),
                "deferred messages were not queued again; they are retried as failures"
            );
        }
        unsent.positions
    }

    /// Sends `bodies`, each delayed `delay` seconds, in batches: which were not sent, and why.
    async fn send_bodies(&self, bodies: &[impl AsRef<str>], delay: i32) -> Unsent {
        let mut unsent = Unsent::default();
        let numbered: Vec<(usize, &str)> = bodies.iter().map(AsRef::as_ref).enumerate().collect();
        for chunk in numbered.chunks(MAX_BATCH) {
            let mut entries = Vec::with_capacity(chunk.len());
            let mut positions = Vec::with_capacity(chunk.len());
            for (position, body) in chunk {
                let built = SendMessageBatchRequestEntry::builder()
                    .id(position.to_string())
                    .message_body(*body)
                    .delay_seconds(delay)
                    .build();
                match built {
                    Ok(entry) => {
                        entries.push(entry);
                        positions.push(*position);
                    }
                    Err(err) => unsent.add(&[*position], err.to_string()),
                }
            }
            if entries.is_empty() {
                continue;
            }
            match self.send_batch(entries).await {
                Ok((sent, refused)) => {
                    // Only an entry SQS says it took was sent: one it names neither way was not.
                    let missing: Vec<usize> = positions
                        .into_iter()
                        .filter(|position| !sent.contains(&position.to_string()))
                        .collect();
                    if !missing.is_empty() {
                        let reason = if refused.is_empty() {
                            "not among the entries SQS took".to_owned()
                        } else {
                            refused.join("; ")
                        };
                        unsent.add(&missing, reason);
                    }
                }
                Err(reason) => unsent.add(&positions, reason),
            }
        }
        unsent
    }

    /// One `SendMessageBatch`: the ids of the entries SQS took, and why it refused the others;
    /// `Err` when the call failed.
    #[tracing::instrument(name = "sqs.send_message_batch", skip_all, fields(entries = entries.len()))]
    async fn send_batch(
        &self,
        entries: Vec<SendMessageBatchRequestEntry>,
    ) -> Result<(Vec<String>, Vec<String>), String> {
        let answer = self
            .client
            .send_message_batch()
            .queue_url(&self.queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|err| aws_sdk_sqs::error::DisplayErrorContext(err).to_string())?;
        let sent = answer
            .successful()
            .iter()
            .map(|entry| entry.id().to_owned())
            .collect();
        let refused = answer
            .failed()
            .iter()
            .map(|entry| {
                format!(
                    "{}: {}",
                    entry.code(),
                    entry.message().unwrap_or("no message")
                )
            })
            .collect();
        Ok((sent, refused))
    }
}

/// Messages not sent: their positions among those given, and the distinct reasons.
#[derive(Debug, Default)]
struct Unsent {
    positions: Vec<usize>,
    reasons: Vec<String>,
}

impl Unsent {
    fn add(&mut self, positions: &[usize], reason: String) {
        self.positions.extend_from_slice(positions);
        if !self.reasons.contains(&reason) {
            self.reasons.push(reason);
        }
    }
}
