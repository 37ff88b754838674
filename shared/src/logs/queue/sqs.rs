//! The log queue on AWS: an SQS queue the log store function reads in batches.

use async_trait::async_trait;

use super::{LogQueue, QueueError};

/// The SQS queue at a URL.
#[derive(Clone, Debug)]
pub struct SqsLogQueue {
    client: aws_sdk_sqs::Client,
    queue_url: String,
}

impl SqsLogQueue {
    /// The queue at `queue_url` through `client`.
    pub fn new(client: aws_sdk_sqs::Client, queue_url: String) -> Self {
        Self { client, queue_url }
    }

    /// The queue at `queue_url`, with the SDK's configuration from the environment
    /// (`AWS_ENDPOINT_URL_SQS` points it at another server).
    pub async fn connect(queue_url: String) -> Self {
        let sdk = crate::aws::sdk_config().await;
        Self::new(aws_sdk_sqs::Client::new(&sdk), queue_url)
    }
}

#[async_trait]
impl LogQueue for SqsLogQueue {
    async fn send(&self, message: String) -> Result<(), QueueError> {
        // The SDK retries throttling and lost answers; a message sent twice stores the same
        // bytes twice over, which the store finds equal.
        self.client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(message)
            .send()
            .await
            .map(|_| ())
            .map_err(|err| QueueError {
                queue_url: self.queue_url.clone(),
                reason: aws_sdk_sqs::error::DisplayErrorContext(err).to_string(),
            })
    }
}
