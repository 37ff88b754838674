//! The compact Lambda function as its tests drive it: the function over a compactor, with or
//! without a queue for its quiet checks; SQS records and S3 notifications in the shapes AWS
//! sends; invocations that return the messages it asks to have redelivered; and reading back
//! what it queued (moto's SQS). No tests of its own.

use std::sync::Arc;
use std::time::Duration;

use afterglow::compact::CompactFunction;
use afterglow_tests::FixtureRun;
use afterglow_tests::moto::Moto;
use afterglow_tests::scenario::Scenario;
use anyhow::Context as _;
use shared::compact::schedule::batch::BatchLimits;
use shared::compact::schedule::check_queue::CheckQueue;
use shared::compact::schedule::quiet::QuietCheck;
use shared::compact::{CompactSettings, Compactor};
use shared::storage::Storage;

/// One SQS message: its id, the record as Lambda delivers it, and the notified object's size.
pub(crate) type Sqs = (String, serde_json::Value, u64);

/// The compact function as Lambda runs it over `compactor`, queueing no quiet checks.
pub(crate) fn function(compactor: Compactor, limits: BatchLimits) -> CompactFunction {
    CompactFunction {
        compactor,
        checks: None,
        sync: None,
        prefix: String::new(),
        limits,
    }
}

/// The compact function over `compactor`, queueing its quiet checks to `queue_url` at once.
pub(super) fn queueing_to(moto: &Moto, queue_url: &str, compactor: Compactor) -> CompactFunction {
    CompactFunction {
        checks: Some(CheckQueue::new(
            moto.sqs(),
            queue_url.to_owned(),
            Duration::ZERO,
        )),
        ..function(compactor, BatchLimits::default())
    }
}

/// Runs the compact function on SQS `records`; returns the ids it asks to redeliver.
pub(crate) async fn invoke(
    function: &CompactFunction,
    records: &[serde_json::Value],
) -> anyhow::Result<Vec<String>> {
    invoke_in(function, records, lambda_runtime::Context::default()).await
}

/// [`invoke`] with an invocation `context` (its deadline).
pub(crate) async fn invoke_in(
    function: &CompactFunction,
    records: &[serde_json::Value],
    context: lambda_runtime::Context,
) -> anyhow::Result<Vec<String>> {
    let event =
        lambda_runtime::LambdaEvent::new(serde_json::json!({ "Records": records }), context);
    let response = afterglow::compact::handle(function, event)
        .await
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    redelivered(&response)
}

/// The message ids an SQS batch response asks to redeliver (its `batchItemFailures`).
pub(crate) fn redelivered(response: &serde_json::Value) -> anyhow::Result<Vec<String>> {
    Ok(response["batchItemFailures"]
        .as_array()
        .context("batchItemFailures")?
        .iter()
        .filter_map(|failure| failure["itemIdentifier"].as_str().map(str::to_owned))
        .collect())
}

/// moto's SQS with the compact function's queue: the server and the queue's URL; `None` when
/// moto is not installed and not required (see [`Moto::start`]), and the test passes.
pub(super) async fn compact_queue(test: &str) -> anyhow::Result<Option<(Moto, String)>> {
    let Some(moto) = Moto::start(test).await? else {
        return Ok(None);
    };
    let queue_url = moto.create_queue("afterglow-compact").await?;
    Ok(Some((moto, queue_url)))
}

/// [`handle_batch`] with the default limits and invocation context.
pub(super) async fn handle_all(
    storage: &Arc<dyn Storage>,
    records: &[serde_json::Value],
) -> anyhow::Result<Vec<String>> {
    handle_batch(
        storage,
        records,
        &BatchLimits::default(),
        Default::default(),
    )
    .await
}

/// Runs the compact handler on `records` and returns the ids it asks SQS to redeliver.
pub(super) async fn handle_batch(
    storage: &Arc<dyn Storage>,
    records: &[serde_json::Value],
    limits: &BatchLimits,
    context: lambda_runtime::Context,
) -> anyhow::Result<Vec<String>> {
    let (compactor, _scratch) =
        afterglow_tests::compactor(Arc::clone(storage), CompactSettings::default())?;
    invoke_in(&function(compactor, limits.clone()), records, context).await
}

/// A queue message as Lambda delivers it from SQS.
pub(super) fn check_record(id: &str, body: &str) -> serde_json::Value {
    serde_json::json!({
        "messageId": id, "eventSource": "aws:sqs", "body": body,
        "attributes": {}, "messageAttributes": {}
    })
}

/// An SQS record notifying the object at `key` of `size` bytes.
pub(super) fn sqs_record(id: &str, key: &str, size: u64) -> serde_json::Value {
    serde_json::json!({
        "messageId": id, "eventSource": "aws:sqs",
        "body": s3_notification_sized(&[(key, size)]).to_string(),
        "attributes": {}, "messageAttributes": {}
    })
}

/// An S3 `ObjectCreated` notification in the shape S3 sends (keys form-URL-encoded).
pub(super) fn s3_notification(keys: &[&str]) -> serde_json::Value {
    let sized: Vec<(&str, u64)> = keys.iter().map(|key| (*key, 1024)).collect();
    s3_notification_sized(&sized)
}

/// The same, with each object's size.
fn s3_notification_sized(objects: &[(&str, u64)]) -> serde_json::Value {
    let records: Vec<serde_json::Value> = objects
        .iter()
        .map(|(key, size)| {
            serde_json::json!({
                "eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1",
                "eventTime": "2026-11-22T06:11:37.845Z", "eventName": "ObjectCreated:Put",
                "userIdentity": {"principalId": "AWS:AIDAEXAMPLE"},
                "requestParameters": {"sourceIPAddress": "127.0.0.1"},
                "responseElements": {"x-amz-request-id": "C3D13FE58DE4C810", "x-amz-id-2": "FMyUVURIY8"},
                "s3": {"s3SchemaVersion": "1.0", "configurationId": "raw-objects",
                       "bucket": {"name": "b", "ownerIdentity": {"principalId": "A3NL1KOZZKExample"},
                                  "arn": "arn:aws:s3:::b"},
                       "object": {"key": key.replace('/', "%2F"), "size": size,
                                  "eTag": "d41d8cd98f00b204e9800998ecf8427e",
                                  "sequencer": "0055AED6DCD90281E5"}}
            })
        })
        .collect();
    serde_json::json!({ "Records": records })
}

/// One SQS message per stored raw object of `cluster` (ids `m0`, `m1`, … in key order), each
/// notifying the object with its real size.
pub(crate) async fn sqs_messages_for(
    storage: &dyn Storage,
    cluster: &str,
) -> anyhow::Result<Vec<Sqs>> {
    Ok(storage
        .list(&format!("raw/{cluster}/"))
        .await?
        .into_iter()
        .enumerate()
        .map(|(index, meta)| {
            let id = format!("m{index}");
            let record = sqs_record(&id, meta.key.as_str(), meta.size);
            (id, record, meta.size)
        })
        .collect())
}

/// A local store holding basic-workload's raw objects for `cluster`, not compacted, and one SQS
/// message per object (see [`sqs_messages_for`]).
pub(super) async fn uncompacted_batch(
    cluster: &str,
) -> anyhow::Result<(FixtureRun, Scenario, Vec<Sqs>)> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::local()?.with_raw(&run, cluster).await?;
    let messages = sqs_messages_for(&*scenario.storage(), cluster).await?;
    Ok((run, scenario, messages))
}

/// One of the queue's approximate counts.
pub(super) async fn queued(moto: &Moto, queue_url: &str, attribute: &str) -> anyhow::Result<u64> {
    let name = aws_sdk_sqs::types::QueueAttributeName::from(attribute);
    let answer = moto
        .sqs()
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(name.clone())
        .send()
        .await
        .context("GetQueueAttributes")?;
    let value = answer
        .attributes()
        .and_then(|attributes| attributes.get(&name))
        .context("no such attribute")?;
    Ok(value.parse()?)
}

/// The sequence of the first quiet check queued to `queue_url` (waiting up to 30 s), and
/// every body received, for the message when it is not the one expected.
pub(super) async fn queued_check(
    moto: &Moto,
    queue_url: &str,
) -> anyhow::Result<(Option<u64>, Vec<String>)> {
    let bodies = moto.receive(queue_url, 1, Duration::from_secs(30)).await?;
    let sequence = bodies
        .first()
        .map(|body| QuietCheck::from_message(body))
        .transpose()?
        .flatten()
        .map(|check| check.sequence);
    Ok((sequence, bodies))
}
