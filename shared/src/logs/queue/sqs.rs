//! The log queue on AWS: SQS queues, one per shard, the log store function reads in batches.

use async_trait::async_trait;

use super::shard::QueueShards;
use super::{LogQueue, QueueError};
use crate::keys::NodeLogs;

/// The SQS queues of the log queue's shards.
#[derive(Clone, Debug)]
pub struct SqsLogQueue {
    client: aws_sdk_sqs::Client,
    shards: QueueShards,
}

impl SqsLogQueue {
    /// The queues of `shards` through `client`.
    pub fn new(client: aws_sdk_sqs::Client, shards: QueueShards) -> Self {
        Self { client, shards }
    }

    /// The queues of `shards`, with the SDK's configuration from the environment
    /// (`AWS_ENDPOINT_URL_SQS` points it at another server).
    pub async fn connect(shards: QueueShards) -> Self {
        let sdk = crate::aws::sdk_config().await;
        Self::new(aws_sdk_sqs::Client::new(&sdk), shards)
    }
}

#[async_trait]
impl LogQueue for SqsLogQueue {
    async fn send(&self, node: &NodeLogs, message: String) -> Result<(), QueueError> {
        let queue_url = self.shards.queue_of(node);
        // The SDK retries throttling and lost answers; a message sent twice stores the same
        // bytes twice over, which the store finds equal.
        self.client
            .send_message()
            .queue_url(queue_url)
            .message_body(message)
            .send()
            .await
            .map(|_| ())
            .map_err(|err| QueueError {
                queue_url: queue_url.to_owned(),
                reason: aws_sdk_sqs::error::DisplayErrorContext(err).to_string(),
            })
    }
}
