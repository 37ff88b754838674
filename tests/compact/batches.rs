//! The compact Lambda function's batches: SQS records of S3 notifications (and direct S3
//! events) are compacted in one run, and what cannot be compacted is reported per message for
//! redelivery (a missing or unreadable object, a session whose commits fail, messages past the
//! byte cap with no queue to send them back to, or past the deadline) while the rest of the
//! batch is committed. Sending messages back to the queue is in `queue`.

use std::sync::Arc;

use afterglow_tests::scenario::Scenario;
use afterglow_tests::{FixtureRun, compactor_over, manifest_commits, now_ms};
use anyhow::{Context as _, ensure};
use shared::compact::CompactSettings;
use shared::compact::schedule::batch::BatchLimits;
use shared::storage::ObjectKey;

use super::sqs::{
    function, handle_all, handle_batch, invoke, s3_notification, sqs_record, uncompacted_batch,
};

/// The compact Lambda handler: an SQS batch of S3 notifications with URL-encoded keys is
/// compacted; a message naming a missing object is reported as a batch item failure alone.
#[tokio::test]
async fn lambda_handler_compacts_notified_keys_and_reports_failures_per_message()
-> anyhow::Result<()> {
    let run = FixtureRun::named("edge-cases")?;
    let scenario = Scenario::local()?.with_raw(&run, "sqs").await?;
    let keys = scenario.storage().list("raw/sqs/").await?;
    let s3_body = |key: &str| s3_notification(&[key]).to_string();
    let mut records: Vec<serde_json::Value> = keys
        .iter()
        .enumerate()
        .map(|(index, meta)| {
            serde_json::json!({
                "messageId": format!("m{index}"), "eventSource": "aws:sqs",
                "body": s3_body(meta.key.as_str()), "attributes": {}, "messageAttributes": {}
            })
        })
        .collect();
    records.push(serde_json::json!({
        "messageId": "test-event", "eventSource": "aws:sqs",
        "body": r#"{"Service":"Amazon S3","Event":"s3:TestEvent","Time":"2026-11-22T06:11:37.845Z","Bucket":"b"}"#,
        "attributes": {}, "messageAttributes": {}
    }));
    records.push(serde_json::json!({
        "messageId": "garbage", "eventSource": "aws:sqs", "body": "not json",
        "attributes": {}, "messageAttributes": {}
    }));
    records.push(serde_json::json!({
        "messageId": "missing", "eventSource": "aws:sqs",
        "body": s3_body("raw/sqs/2026/11/22/06/01JD0000000000000000000000.ndjson.gz"),
        "attributes": {}, "messageAttributes": {}
    }));
    let event = lambda_runtime::LambdaEvent::new(
        serde_json::json!({ "Records": records }),
        lambda_runtime::Context::default(),
    );
    let (compactor, _scratch) = scenario.compactor(CompactSettings::default())?;
    let response = afterglow::compact::handle(&function(compactor, BatchLimits::default()), event)
        .await
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    let failures = response["batchItemFailures"]
        .as_array()
        .context("batchItemFailures")?;
    let mut failed: Vec<&str> = failures
        .iter()
        .filter_map(|failure| failure["itemIdentifier"].as_str())
        .collect();
    failed.sort_unstable();
    ensure!(failed == ["garbage", "missing"], "{response}");
    scenario.check(&run, "sqs", "via the compact handler").await
}

/// A direct S3 event (no SQS) is compacted too.
#[tokio::test]
async fn lambda_handler_compacts_a_direct_s3_event() -> anyhow::Result<()> {
    let run = FixtureRun::named("snake-case-keys")?;
    let scenario = Scenario::local()?.with_raw(&run, "direct").await?;
    let keys: Vec<String> = scenario
        .storage()
        .list("raw/direct/")
        .await?
        .into_iter()
        .map(|meta| meta.key.to_string())
        .collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let event = lambda_runtime::LambdaEvent::new(
        s3_notification(&keys),
        lambda_runtime::Context::default(),
    );
    let (compactor, _scratch) = scenario.compactor(CompactSettings::default())?;
    afterglow::compact::handle(&function(compactor, BatchLimits::default()), event)
        .await
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    scenario
        .check(&run, "direct", "via a direct S3 event")
        .await
}

/// A session whose commits fail costs the compact function only its own messages: the batch's
/// run commits the other sessions at once, and only the failing session's messages are
/// reported for redelivery. Failing the whole run would compact every message again on its
/// own, one commit each, for as long as the deadline allowed.
#[tokio::test]
async fn a_session_that_cannot_be_committed_fails_only_its_own_messages() -> anyhow::Result<()> {
    use afterglow_tests::faults::Refuses;

    let healthy = FixtureRun::named("basic-workload")?;
    let failing = FixtureRun::named("edge-cases")?;
    let scenario = Scenario::local()?
        .with_raw(&healthy, "fine")
        .await?
        .with_raw(&failing, "broken")
        .await?;
    let local = scenario.storage();
    let mut records = Vec::new();
    let mut broken_ids = Vec::new();
    for (cluster, prefix) in [("broken", "b"), ("fine", "f")] {
        for (index, meta) in local
            .list(&format!("raw/{cluster}/"))
            .await?
            .iter()
            .enumerate()
        {
            let id = format!("{prefix}{index}");
            records.push(sqs_record(&id, meta.key.as_str(), meta.size));
            if cluster == "broken" {
                broken_ids.push(id);
            }
        }
    }
    let faulty = Arc::new(Refuses::writes_under(
        Arc::clone(&local),
        "tables/manifests/cluster=broken/",
    ));
    let (compactor, _scratch) = compactor_over(&faulty, CompactSettings::default())?;
    let mut failed = invoke(&function(compactor, BatchLimits::default()), &records).await?;
    ensure!(faulty.refused() > 0, "nothing was refused");
    failed.sort();
    broken_ids.sort();
    ensure!(
        failed == broken_ids,
        "failed {failed:?}, not the broken session's {broken_ids:?}"
    );
    scenario
        .check(
            &healthy,
            "fine",
            "beside a session that cannot be committed",
        )
        .await?;
    let commits = manifest_commits(&*local, "fine").await?;
    ensure!(
        commits == 1,
        "{commits} commits, not one for the whole batch"
    );
    Ok(())
}

/// One unreadable raw object in a batch fails only the message that names it, and the rest of
/// the batch is still compacted in one run: compacting the batch one message at a time instead
/// would take hundreds of runs, past the function's timeout.
#[tokio::test]
async fn an_unreadable_object_fails_only_its_message_and_the_batch_runs_once() -> anyhow::Result<()>
{
    let (run, scenario, messages) = uncompacted_batch("unreadable").await?;
    let storage = scenario.storage();
    let corrupt = "raw/unreadable/2026/11/22/06/01JD0000000000000000000000.ndjson.gz";
    storage
        .put(
            &ObjectKey::new(corrupt)?,
            bytes::Bytes::from_static(b"not gzip at all"),
            shared::storage::PutMode::Create,
        )
        .await?;
    let mut records: Vec<serde_json::Value> =
        messages.into_iter().map(|(_, record, _)| record).collect();
    let messages = records.len();
    records.insert(messages / 2, sqs_record("corrupt", corrupt, 15));
    let failed = handle_all(&storage, &records).await?;
    ensure!(failed == ["corrupt"], "failed: {failed:?}");
    // One run commits once per session.
    let commits = manifest_commits(&*storage, "unreadable").await?;
    let sessions = storage
        .list("tables/manifests/cluster=unreadable/")
        .await?
        .len();
    ensure!(
        sessions > 0 && commits == u64::try_from(sessions)?,
        "{messages} good messages took {commits} manifest commits for {sessions} sessions, not one run"
    );
    scenario
        .check(&run, "unreadable", "a batch with an unreadable object")
        .await
}

/// A batch naming more raw bytes than one run may take compacts the messages up to the cap;
/// with no queue to send the rest back to, it reports them as failures, and redelivered they
/// complete the history.
#[tokio::test]
async fn a_batch_past_its_byte_cap_leaves_the_rest_for_redelivery() -> anyhow::Result<()> {
    let (run, scenario, messages) = uncompacted_batch("capped").await?;
    let storage = scenario.storage();
    ensure!(messages.len() > 4, "too few raw objects to cap");
    let cap: u64 = messages.iter().take(3).map(|(_, _, size)| size).sum();
    let limits = BatchLimits {
        max_bytes: Some(cap),
        ..BatchLimits::default()
    };
    let records: Vec<serde_json::Value> = messages
        .iter()
        .map(|(_, record, _)| record.clone())
        .collect();
    let failed = handle_batch(&storage, &records, &limits, Default::default()).await?;
    let expected: Vec<String> = messages
        .iter()
        .skip(3)
        .map(|(id, _, _)| id.clone())
        .collect();
    ensure!(
        failed == expected,
        "failed {failed:?}, expected {expected:?}"
    );
    let redelivered: Vec<serde_json::Value> = messages
        .iter()
        .filter(|(id, _, _)| failed.contains(id))
        .map(|(_, record, _)| record.clone())
        .collect();
    let failed = handle_all(&storage, &redelivered).await?;
    ensure!(failed.is_empty(), "redelivery failed: {failed:?}");
    scenario
        .check(&run, "capped", "a capped batch and its redelivery")
        .await
}

/// A batch that cannot be compacted before the invocation's deadline (less the margin kept for
/// answering) is reported unattempted, message by message, instead of being cut off by Lambda
/// with no answer (which would count a receive against every message).
#[tokio::test]
async fn a_batch_past_the_deadline_is_answered_unattempted() -> anyhow::Result<()> {
    let (_run, scenario, messages) = uncompacted_batch("late").await?;
    let storage = scenario.storage();
    let records: Vec<serde_json::Value> = messages
        .iter()
        .map(|(_, record, _)| record.clone())
        .collect();
    let mut context = lambda_runtime::Context::default();
    // Two seconds left, less than the 15 s kept for answering.
    context.deadline = now_ms()? + 2_000;
    let started = std::time::Instant::now();
    let failed = handle_batch(&storage, &records, &BatchLimits::default(), context).await?;
    let all: Vec<String> = messages.iter().map(|(id, _, _)| id.clone()).collect();
    ensure!(failed == all, "failed {failed:?}");
    ensure!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "answered after the deadline"
    );
    ensure!(
        manifest_commits(&*storage, "late").await? == 0,
        "compacted although reported unattempted"
    );
    Ok(())
}
