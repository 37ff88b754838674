//! What the SQS-fed functions (compact, log-store, catalog) answer for a message they want
//! delivered again: one entry of an SQS partial batch response.

use aws_lambda_events::event::sqs::BatchItemFailure;

/// Asks SQS to deliver the message `message_id` again (it counts as a receive).
pub fn failure(message_id: &str) -> BatchItemFailure {
    // The type is non-exhaustive: build it field by field.
    let mut failure = BatchItemFailure::default();
    message_id.clone_into(&mut failure.item_identifier);
    failure
}
