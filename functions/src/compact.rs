//! The compact function on Lambda: S3 `ObjectCreated` notifications, delivered through SQS (or
//! directly), onto [`Compactor::compact`]. Reports SQS partial batch failures, so one bad
//! message is retried (and eventually dead-lettered) without failing the others.

use aws_lambda_events::event::s3::S3Event;
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent};
use shared::compact::Compactor;
use shared::compact::notification::raw_key_from_notification;
use shared::storage::ObjectKey;
use tracing::Instrument as _;

/// Raw keys named by an S3 event; keys that are not raw objects are logged and skipped.
fn keys_of(event: &S3Event, prefix: &str) -> Vec<ObjectKey> {
    event
        .records
        .iter()
        .filter_map(|record| record.s3.object.key.as_deref())
        .filter_map(|encoded| match raw_key_from_notification(encoded, prefix) {
            Ok(key) => Some(key),
            Err(reason) => {
                tracing::warn!(%reason, "skipping a notified key");
                None
            }
        })
        .collect()
}

/// The raw keys an SQS message body names. S3's `s3:TestEvent` (sent when notifications are
/// configured) names none.
fn keys_of_message(body: &str, prefix: &str) -> Result<Vec<ObjectKey>, String> {
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|err| format!("body is not JSON: {err}"))?;
    if value.get("Event").and_then(serde_json::Value::as_str) == Some("s3:TestEvent") {
        return Ok(Vec::new());
    }
    let event: S3Event =
        serde_json::from_value(value).map_err(|err| format!("body is not an S3 event: {err}"))?;
    Ok(keys_of(&event, prefix))
}

fn failure(message_id: &str) -> BatchItemFailure {
    // The type is non-exhaustive: build it field by field.
    let mut failure = BatchItemFailure::default();
    message_id.clone_into(&mut failure.item_identifier);
    failure
}

/// Handles one invocation: an SQS batch of S3 notifications, or a direct S3 event.
pub async fn handle(
    compactor: &Compactor,
    prefix: &str,
    event: LambdaEvent<serde_json::Value>,
) -> Result<serde_json::Value, Error> {
    let span = tracing::info_span!("invocation", request_id = %event.context.request_id, function = "compact");
    async move {
        let payload = event.payload;
        let from_sqs = payload
            .pointer("/Records/0/eventSource")
            .and_then(serde_json::Value::as_str)
            == Some("aws:sqs");
        if !from_sqs {
            let s3: S3Event = serde_json::from_value(payload)?;
            compactor.compact(&keys_of(&s3, prefix)).await?;
            return Ok(serde_json::Value::Null);
        }
        let sqs: SqsEvent = serde_json::from_value(payload)?;
        let mut messages = Vec::new();
        let mut failures = Vec::new();
        for message in &sqs.records {
            let id = message.message_id.clone().unwrap_or_default();
            match keys_of_message(message.body.as_deref().unwrap_or_default(), prefix) {
                Ok(keys) => messages.push((id, keys)),
                Err(reason) => {
                    // Retrying cannot fix it: after maxReceiveCount it lands in the DLQ.
                    tracing::error!(message_id = %id, %reason, "unreadable notification");
                    failures.push(failure(&id));
                }
            }
        }
        let all: Vec<ObjectKey> = messages.iter().flat_map(|(_, keys)| keys.clone()).collect();
        if let Err(err) = compactor.compact(&all).await {
            // Find the culprits: compact each message alone; only those that fail are retried.
            tracing::warn!(error = %err, "batch compaction failed; retrying message by message");
            for (id, keys) in &messages {
                let span = tracing::info_span!("message", message_id = %id);
                if let Err(err) = compactor.compact(keys).instrument(span).await {
                    tracing::error!(message_id = %id, error = %err, "message failed");
                    failures.push(failure(id));
                }
            }
        }
        let mut response = SqsBatchResponse::default();
        response.batch_item_failures = failures;
        Ok(serde_json::to_value(response)?)
    }
    .instrument(span)
    .await
}
