//! Sync requests on AWS: after each commit the compact function asks the catalog-sync function
//! to publish every table again, with one message per table on an SQS FIFO queue whose message
//! group is the table, so one table's syncs run one at a time and in order while the tables
//! sync side by side.
//!
//! A request lost (the queue out of reach) loses nothing: a sync publishes everything that
//! changed since the last one, so the next request, or the function's scheduled sweep, makes
//! it up.

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use serde::{Deserialize, Serialize};
use ulid::Ulid;

use super::IcebergError;
use crate::tables::published::published_tables;

/// SQS's most messages in one `SendMessageBatch`.
const MAX_BATCH: usize = 10;

/// One request, as its message body carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncRequest {
    /// The published table to sync.
    pub table: String,
}

impl SyncRequest {
    /// The request a message body holds.
    pub fn from_message(body: &str) -> Result<Self, String> {
        serde_json::from_str(body).map_err(|err| format!("not a sync request: {err}"))
    }
}

/// The catalog-sync function's queue.
#[derive(Clone, Debug)]
pub struct SyncQueue {
    client: aws_sdk_sqs::Client,
    queue_url: String,
}

impl SyncQueue {
    /// The FIFO queue at `queue_url` through `client`.
    pub fn new(client: aws_sdk_sqs::Client, queue_url: String) -> Self {
        Self { client, queue_url }
    }

    /// The queue at `queue_url`, with the SDK's configuration from the environment.
    pub async fn connect(queue_url: String) -> Self {
        let sdk = crate::aws::sdk_config().await;
        Self::new(aws_sdk_sqs::Client::new(&sdk), queue_url)
    }

    /// Asks for every published table to be synced.
    pub async fn request_all(&self) -> Result<(), IcebergError> {
        let tables = published_tables();
        let mut entries = Vec::with_capacity(tables.len());
        for (position, table) in tables.iter().enumerate() {
            let body = serde_json::to_string(&SyncRequest {
                table: table.name.to_owned(),
            })?;
            let entry = SendMessageBatchRequestEntry::builder()
                .id(position.to_string())
                .message_body(body)
                .message_group_id(table.name)
                // Every request is its own: two commits a second apart both ask.
                .message_deduplication_id(Ulid::new().to_string())
                .build()
                .map_err(|err| IcebergError::Catalog(format!("sync request: {err}")))?;
            entries.push(entry);
        }
        for batch in entries.chunks(MAX_BATCH) {
            let sent = self
                .client
                .send_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(batch.to_vec()))
                .send()
                .await
                .map_err(|err| {
                    IcebergError::Catalog(format!(
                        "sync requests to {}: {}",
                        self.queue_url,
                        aws_sdk_sqs::error::DisplayErrorContext(err)
                    ))
                })?;
            if let Some(refused) = sent.failed().first() {
                return Err(IcebergError::Catalog(format!(
                    "sync requests to {}: {} refused, the first because {}",
                    self.queue_url,
                    sent.failed().len(),
                    refused.message().unwrap_or(refused.code())
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_back_and_anything_else_is_refused() {
        let body = serde_json::to_string(&SyncRequest {
            table: "jobs".to_owned(),
        })
        .expect("serializes");
        assert_eq!(
            SyncRequest::from_message(&body),
            Ok(SyncRequest {
                table: "jobs".to_owned()
            })
        );
        for bad in ["", "{}", r#"{"table": 1}"#, r#"{"table": "jobs", "x": 1}"#] {
            assert!(SyncRequest::from_message(bad).is_err(), "{bad}");
        }
    }
}
