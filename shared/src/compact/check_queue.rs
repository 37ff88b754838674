//! Quiet checks on AWS: each is a message to the compact function's own queue, delayed by the
//! quiet period, so a session is looked at again once it may have gone quiet and nothing runs
//! in between (SQS holds the message; no schedule, no poller).
//!
//! It only sends; the compact function reads the messages back among its S3 notifications
//! ([`QuietCheck::from_message`]) and runs them ([`super::Compactor::tidy_messages`]).

use std::time::Duration;

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;

use super::fold::QuietCheck;

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

/// The compact function's queue, for quiet checks.
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
        let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        Self::new(aws_sdk_sqs::Client::new(&sdk), queue_url, delay)
    }

    /// Queues `checks`, each delivered once the delay has passed. The SDK retries throttling
    /// and lost answers; a check sent twice costs a second look, nothing more.
    pub async fn send(&self, checks: &[QuietCheck]) -> Result<(), SendError> {
        let delay = i32::try_from(self.delay.as_secs()).unwrap_or(i32::MAX);
        let mut failed = 0;
        let mut reasons = Vec::new();
        for chunk in checks.chunks(MAX_BATCH) {
            let entries: Vec<SendMessageBatchRequestEntry> = chunk
                .iter()
                .enumerate()
                .filter_map(|(index, check)| {
                    SendMessageBatchRequestEntry::builder()
                        .id(index.to_string())
                        .message_body(check.to_message())
                        .delay_seconds(delay)
                        .build()
                        .ok()
                })
                .collect();
            match self.send_batch(entries).await {
                Ok(refused) => {
                    failed += refused.len();
                    reasons.extend(refused);
                }
                Err(reason) => {
                    failed += chunk.len();
                    reasons.push(reason);
                }
            }
        }
        if failed == 0 {
            return Ok(());
        }
        Err(SendError {
            queue_url: self.queue_url.clone(),
            failed,
            reason: reasons.join("; "),
        })
    }

    /// One `SendMessageBatch`; the reasons of the entries SQS refused.
    #[tracing::instrument(name = "sqs.send_message_batch", skip_all, fields(entries = entries.len()))]
    async fn send_batch(
        &self,
        entries: Vec<SendMessageBatchRequestEntry>,
    ) -> Result<Vec<String>, String> {
        let answer = self
            .client
            .send_message_batch()
            .queue_url(&self.queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|err| aws_sdk_sqs::error::DisplayErrorContext(err).to_string())?;
        Ok(answer
            .failed()
            .iter()
            .map(|entry| {
                format!(
                    "{}: {}",
                    entry.code(),
                    entry.message().unwrap_or("no message")
                )
            })
            .collect())
    }
}
