//! The log store function on Lambda: batches of queued log requests (SQS) onto
//! `shared::logs::queue::drain`. Reports SQS partial batch failures: the messages of a node
//! that could not be stored are delivered again, and the other nodes' are not.

use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent};
use shared::logs::queue::drain::{DrainLimits, Received, store_batch};
use shared::storage::Storage;
use tracing::Instrument as _;

use crate::redelivery::failure;

/// Handles one SQS batch of queued log requests.
pub async fn handle(
    storage: &Arc<dyn Storage>,
    event: LambdaEvent<SqsEvent>,
) -> Result<SqsBatchResponse, Error> {
    let span = tracing::info_span!("invocation", request_id = %event.context.request_id, function = "log-store");
    async move {
        let mut response = SqsBatchResponse::default();
        let mut received = Vec::with_capacity(event.payload.records.len());
        for record in &event.payload.records {
            let id = record.message_id.as_deref().unwrap_or_default();
            match &record.body {
                Some(body) => received.push(Received { id, body }),
                None => {
                    tracing::error!(
                        id,
                        "an SQS record without a body; it goes to the dead-letter queue"
                    );
                    response.batch_item_failures.push(failure(id));
                }
            }
        }
        let drained = store_batch(&**storage, &received, DrainLimits::default()).await;
        tracing::info!(
            messages = received.len(),
            nodes = drained.nodes,
            refused = drained.refused,
            redelivered = drained.redeliver.len(),
            "stored queued log requests"
        );
        response
            .batch_item_failures
            .extend(drained.redeliver.iter().map(|id| failure(id)));
        Ok(response)
    }
    .instrument(span)
    .await
}
