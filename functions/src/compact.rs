//! The compact function on Lambda: S3 `ObjectCreated` notifications, delivered through SQS (or
//! directly), onto the library's batch compaction. Reports SQS partial batch failures, so one
//! bad message is retried (and eventually dead-lettered) without failing the others.
//!
//! The same queue carries the quiet checks this function queues for itself after each commit
//! (delayed messages, see `shared::compact::schedule::quiet`): it runs them, and queues the
//! next ones.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lambda_events::event::s3::{S3Event, S3EventRecord};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Context, Error, LambdaEvent};
use shared::compact::Compactor;
use shared::compact::notification::raw_key_from_notification;
use shared::compact::schedule::batch::{BatchLimits, Message};
use shared::compact::schedule::check_queue::CheckQueue;
use shared::compact::schedule::quiet::QuietCheck;
use shared::iceberg::SyncQueue;
use shared::storage::ObjectKey;
use tracing::Instrument as _;

use crate::redelivery::failure;

/// The raw key a record names, with its notified size; `None` (logged) for other keys.
fn object_of(record: &S3EventRecord, prefix: &str) -> Option<(ObjectKey, u64)> {
    let encoded = record.s3.object.key.as_deref()?;
    match raw_key_from_notification(encoded, prefix) {
        Ok(key) => {
            let size = record
                .s3
                .object
                .size
                .and_then(|size| u64::try_from(size).ok());
            Some((key, size.unwrap_or(0)))
        }
        Err(reason) => {
            tracing::warn!(%reason, "skipping a notified key");
            None
        }
    }
}

/// Raw objects named by an S3 event; keys that are not raw objects are logged and skipped.
fn objects_of(event: &S3Event, prefix: &str) -> Vec<(ObjectKey, u64)> {
    event
        .records
        .iter()
        .filter_map(|record| object_of(record, prefix))
        .collect()
}

/// The raw objects an SQS message body names. S3's `s3:TestEvent` (sent when notifications are
/// configured) names none.
fn objects_of_message(body: &str, prefix: &str) -> Result<Vec<(ObjectKey, u64)>, String> {
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|err| format!("body is not JSON: {err}"))?;
    if value.get("Event").and_then(serde_json::Value::as_str) == Some("s3:TestEvent") {
        return Ok(Vec::new());
    }
    let event: S3Event =
        serde_json::from_value(value).map_err(|err| format!("body is not an S3 event: {err}"))?;
    Ok(objects_of(&event, prefix))
}

/// The invocation's deadline as an instant; `None` when there is no usable one. Lambda sends
/// milliseconds since the epoch, always ahead of the invocation's arrival; a deadline already
/// past on arrival (0 in tests, a relative 600000 from `cargo lambda`'s emulator) says nothing
/// about this invocation, and taking it literally would report every batch unattempted.
pub fn deadline_of(context: &Context) -> Option<tokio::time::Instant> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        });
    if context.deadline <= now_ms {
        if context.deadline != 0 {
            tracing::warn!(
                deadline_ms = context.deadline,
                now_ms,
                "the invocation's deadline is already past on arrival; ignoring it"
            );
        }
        return None;
    }
    let left = Duration::from_millis(context.deadline - now_ms);
    Some(tokio::time::Instant::now() + left)
}

/// What the compact function holds between invocations.
#[derive(Debug)]
pub struct CompactFunction {
    /// Compacts and tidies.
    pub compactor: Compactor,
    /// Where quiet checks are queued, and notifications a batch deferred queued again; `None`
    /// queues none (sessions are then folded by the fold policy alone, and deferred messages
    /// are reported as failures; the deployed function always has a queue).
    pub checks: Option<CheckQueue>,
    /// Where the catalog-sync function is asked to publish the tables after a commit; `None`
    /// (the Iceberg catalog off) asks nothing.
    pub sync: Option<SyncQueue>,
    /// The store's key prefix (notifications name full keys).
    pub prefix: String,
    /// Caps on one batch; the deadline comes from each invocation.
    pub limits: BatchLimits,
}

/// What one SQS record asks for.
enum Record {
    /// Compact the raw objects an S3 notification names.
    Notification(Message),
    /// Tidy a session if it went quiet.
    Check(String, QuietCheck),
}

/// Reads one SQS record's body.
fn record_of(id: String, body: &str, prefix: &str) -> Result<Record, String> {
    if let Some(check) = QuietCheck::from_message(body).map_err(|err| err.to_string())? {
        return Ok(Record::Check(id, check));
    }
    let objects = objects_of_message(body, prefix)?;
    Ok(Record::Notification(Message { id, objects }))
}

/// Handles one invocation: an SQS batch of S3 notifications and quiet checks, or a direct S3
/// event.
pub async fn handle(
    function: &CompactFunction,
    event: LambdaEvent<serde_json::Value>,
) -> Result<serde_json::Value, Error> {
    let span = tracing::info_span!("invocation", request_id = %event.context.request_id, function = "compact");
    async move {
        let CompactFunction {
            compactor,
            checks,
            sync,
            prefix,
            limits,
        } = function;
        let limits = BatchLimits {
            deadline: deadline_of(&event.context),
            ..limits.clone()
        };
        let payload = event.payload;
        let from_sqs = payload
            .pointer("/Records/0/eventSource")
            .and_then(serde_json::Value::as_str)
            == Some("aws:sqs");
        if !from_sqs {
            // A direct invocation is retried whole by Lambda: nothing to report per record.
            let s3: S3Event = serde_json::from_value(payload)?;
            let keys: Vec<ObjectKey> = objects_of(&s3, prefix)
                .into_iter()
                .map(|(key, _)| key)
                .collect();
            let report = compactor.compact(&keys).await?;
            if !report.committed.is_empty() {
                request_sync(sync.as_ref()).await;
            }
            if !queue_checks(checks.as_ref(), &report.committed).await {
                // Retried, the objects are compacted again (to the same rows) and the commit
                // asks for its check once more.
                return Err("quiet checks not queued; the invocation is retried".into());
            }
            return Ok(serde_json::Value::Null);
        }
        let sqs: SqsEvent = serde_json::from_value(payload)?;
        let mut messages = Vec::new();
        let mut bodies = HashMap::new();
        let mut quiet = Vec::new();
        let mut failures = Vec::new();
        let mut committed = false;
        for message in &sqs.records {
            let id = message.message_id.clone().unwrap_or_default();
            let body = message.body.as_deref().unwrap_or_default();
            match record_of(id.clone(), body, prefix) {
                Ok(Record::Notification(message)) => {
                    bodies.insert(id, body);
                    messages.push(message);
                }
                Ok(Record::Check(id, check)) => quiet.push((id, check)),
                Err(reason) => {
                    // Retrying cannot fix it: after maxReceiveCount it lands in the DLQ.
                    tracing::error!(message_id = %id, %reason, "unreadable message");
                    failures.push(failure(&id));
                }
            }
        }
        if !messages.is_empty() {
            // Sent back first: queued again at once, they wait for no run, this one included.
            let (taken, deferred) = limits.split(&messages);
            let unqueued = requeue(checks.as_ref(), deferred, &bodies).await;
            failures.extend(unqueued.iter().map(|id| failure(id)));
            let outcome = compactor.compact_messages(taken, &limits).await;
            committed = !outcome.report.committed.is_empty();
            failures.extend(outcome.failed.iter().map(|id| failure(id)));
            // A commit's check is the only thing that folds and tidies a session nothing more
            // arrives for. When it cannot be queued the notifications are not acknowledged:
            // delivered again, their objects are compacted again (to the same rows), and that
            // commit asks once more.
            if !queue_checks(checks.as_ref(), &outcome.report.committed).await {
                failures.extend(
                    taken
                        .iter()
                        .filter(|message| !outcome.failed.contains(&message.id))
                        .map(|message| failure(&message.id)),
                );
            }
        }
        let (failed, again) = compactor.tidy_messages(&quiet, &limits).await;
        failures.extend(failed.iter().map(|id| failure(id)));
        // A follow-up is the only thing that will delete a quiet session's retired files: one
        // that cannot be queued fails its check's message, and the same check delivered
        // again finds the session as its tidy left it (`Manifest::quiet_since`) and asks once
        // more.
        let follow_ups: Vec<QuietCheck> = again.iter().map(|(_, check)| check.clone()).collect();
        if !queue_checks(checks.as_ref(), &follow_ups).await {
            failures.extend(again.iter().map(|(id, _)| failure(id)));
        }
        // A quiet check may have folded a session or let one expire: published again too.
        if committed || !quiet.is_empty() {
            request_sync(sync.as_ref()).await;
        }
        let mut response = SqsBatchResponse::default();
        response.batch_item_failures = failures;
        Ok(serde_json::to_value(response)?)
    }
    .instrument(span)
    .await
}

/// Asks the catalog-sync function to publish the tables. A request that cannot be sent fails
/// nothing: the next one, or the function's scheduled sweep, publishes the same changes.
async fn request_sync(sync: Option<&SyncQueue>) {
    if let Some(sync) = sync
        && let Err(err) = sync.request_all().await
    {
        tracing::warn!(error = %err, "sync requests not sent; the next commit or sweep makes them up");
    }
}

/// Sends the `deferred` messages (their bodies in `bodies`, by id) back to the queue to be
/// delivered at once; returns the ids that could not be, to be reported as failures (retried
/// after the visibility timeout). Without a queue that is all of them.
async fn requeue<'a>(
    queue: Option<&CheckQueue>,
    deferred: &'a [Message],
    bodies: &HashMap<String, &str>,
) -> Vec<&'a str> {
    if deferred.is_empty() {
        return Vec::new();
    }
    tracing::warn!(
        deferred = deferred.len(),
        "the batch names more raw bytes than one run takes; the rest is deferred"
    );
    let Some(queue) = queue else {
        return deferred.iter().map(|message| message.id.as_str()).collect();
    };
    let mut unqueued = Vec::new();
    let mut ids = Vec::with_capacity(deferred.len());
    let mut texts = Vec::with_capacity(deferred.len());
    for message in deferred {
        match bodies.get(&message.id) {
            Some(body) => {
                ids.push(message.id.as_str());
                texts.push(*body);
            }
            None => unqueued.push(message.id.as_str()),
        }
    }
    for position in queue.requeue(&texts).await {
        unqueued.extend(ids.get(position).copied());
    }
    tracing::info!(
        deferred = deferred.len(),
        unqueued = unqueued.len(),
        "deferred messages sent back to the queue"
    );
    unqueued
}

/// Queues quiet checks of `sessions`; false when they could not be queued.
async fn queue_checks(checks: Option<&CheckQueue>, sessions: &[QuietCheck]) -> bool {
    let Some(checks) = checks.filter(|_| !sessions.is_empty()) else {
        return true;
    };
    match checks.send(sessions).await {
        Ok(()) => true,
        Err(err) => {
            tracing::error!(error = %err, "quiet checks not queued");
            false
        }
    }
}
