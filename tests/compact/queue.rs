//! The compact function's own queue (moto's SQS). Each commit queues on it a delayed quiet
//! check of the session as it left it, and the check that finds the session unchanged folds it;
//! a check, or its follow-up, that cannot be queued is never acknowledged. Messages past a
//! batch's byte cap are sent back to it, deliverable at once.

use std::time::Duration;

use afterglow::compact::CompactFunction;
use afterglow_tests::keeping_deltas;
use anyhow::{Context as _, ensure};
use shared::compact::schedule::batch::BatchLimits;
use shared::compact::schedule::check_queue::CheckQueue;
use shared::compact::schedule::quiet::QuietCheck;

use super::sqs::{
    check_record, compact_queue, function, invoke, queued, queued_check, queueing_to,
    uncompacted_batch,
};

/// Each commit of the compact function queues a quiet check of the session as it left it, on
/// its own queue (moto's SQS) and delayed by the quiet period. A check whose session changed
/// since does nothing; the newest folds the deltas into one base, whose rows still agree with
/// Ray, and queues one more check for the replaced files it keeps through their grace period.
#[tokio::test]
async fn quiet_checks_on_the_queue_fold_a_session_no_run_changed() -> anyhow::Result<()> {
    let Some((moto, queue_url)) =
        compact_queue("quiet_checks_on_the_queue_fold_a_session_no_run_changed").await?
    else {
        return Ok(());
    };
    let (run, scenario, messages) = uncompacted_batch("hushed").await?;
    let delay = Duration::from_secs(5);
    let (compactor, _scratch) = scenario.compactor(keeping_deltas())?;
    let function = CompactFunction {
        checks: Some(CheckQueue::new(moto.sqs(), queue_url.clone(), delay)),
        ..function(compactor, BatchLimits::default())
    };
    let records: Vec<serde_json::Value> =
        messages.into_iter().map(|(_, record, _)| record).collect();
    let (first, second) = records.split_at(records.len() / 2);
    ensure!(
        invoke(&function, first).await?.is_empty(),
        "first half failed"
    );
    // Delayed, not yet delivered.
    ensure!(
        queued(&moto, &queue_url, "ApproximateNumberOfMessagesDelayed").await? == 1,
        "one delayed check after one commit"
    );
    ensure!(
        moto.receive(&queue_url, 0, Duration::ZERO)
            .await?
            .is_empty(),
        "a check was delivered before its delay"
    );
    ensure!(
        invoke(&function, second).await?.is_empty(),
        "second half failed"
    );
    let checks = moto.receive(&queue_url, 2, Duration::from_secs(30)).await?;
    let mut sequences: Vec<(u64, String)> = checks
        .iter()
        .map(|body| {
            QuietCheck::from_message(body)?
                .map(|check| (check.sequence, body.clone()))
                .context("not a quiet check")
        })
        .collect::<anyhow::Result<_>>()?;
    sequences.sort();
    let [(stale_sequence, stale), (newest_sequence, newest)] = sequences.as_slice() else {
        anyhow::bail!("expected two checks, got {checks:?}");
    };
    let before = scenario.only_manifest("hushed").await?;
    ensure!(before.sequence == *newest_sequence && stale_sequence < newest_sequence);
    ensure!(before.task_attempts.deltas.len() == 2, "{before:?}");

    ensure!(
        invoke(&function, &[check_record("stale", stale)])
            .await?
            .is_empty()
    );
    ensure!(
        scenario.only_manifest("hushed").await? == before,
        "a check of an older commit changed the session"
    );
    ensure!(
        invoke(&function, &[check_record("newest", newest)])
            .await?
            .is_empty()
    );
    let after = scenario.only_manifest("hushed").await?;
    ensure!(after.task_attempts.deltas.is_empty(), "{after:?}");
    ensure!(after.task_attempts.base.len() == 1, "{after:?}");
    ensure!(
        !after.retired.is_empty(),
        "the replaced deltas wait out their grace"
    );
    scenario
        .check(&run, "hushed", "folded by a quiet check")
        .await?;
    let (follow_up, again) = queued_check(&moto, &queue_url).await?;
    ensure!(
        follow_up == Some(after.sequence),
        "expected a check of the folded session for its retired files: {again:?}"
    );
    Ok(())
}

/// A quiet check whose follow-up cannot be queued (the only thing that will delete the retired
/// files of a session nothing more arrives for) is not acknowledged: its message is reported
/// failed, and delivered again the same check sees the session as its own tidy left it and
/// queues the follow-up.
#[tokio::test]
async fn a_quiet_checks_follow_up_that_cannot_be_queued_is_asked_for_again() -> anyhow::Result<()> {
    let Some((moto, queue_url)) =
        compact_queue("a_quiet_checks_follow_up_that_cannot_be_queued_is_asked_for_again").await?
    else {
        return Ok(());
    };
    let (_run, scenario, messages) = uncompacted_batch("lost-follow-up").await?;
    let storage = scenario.storage();
    let records: Vec<serde_json::Value> =
        messages.into_iter().map(|(_, record, _)| record).collect();
    let (compacting, _scratch) = scenario.compactor(keeping_deltas())?;
    let plain = function(compacting, BatchLimits::default());
    ensure!(
        invoke(&plain, &records).await?.is_empty(),
        "compaction failed"
    );
    let before = scenario.only_manifest("lost-follow-up").await?;
    ensure!(!before.task_attempts.deltas.is_empty(), "{before:?}");
    let manifests = storage
        .list("tables/manifests/cluster=lost-follow-up/")
        .await?;
    let (cluster, session) = manifests
        .first()
        .and_then(|meta| shared::keys::manifest_session(&meta.key))
        .context("the session's manifest")?;
    let check = QuietCheck {
        cluster,
        session,
        sequence: before.sequence,
    };

    // The queue is gone when the follow-up is sent.
    let (tidying, _tidy_scratch) = scenario.compactor(keeping_deltas())?;
    let unqueued = queueing_to(&moto, &format!("{queue_url}-gone"), tidying);
    let record = check_record("quiet", &check.to_message());
    ensure!(
        invoke(&unqueued, std::slice::from_ref(&record)).await? == ["quiet"],
        "a check whose follow-up was not queued was acknowledged"
    );
    let folded = scenario.only_manifest("lost-follow-up").await?;
    ensure!(
        folded.task_attempts.deltas.is_empty() && !folded.retired.is_empty(),
        "{folded:?}"
    );

    // Delivered again, with the queue back.
    let (compactor, _scratch) = scenario.compactor(keeping_deltas())?;
    let queued_again = queueing_to(&moto, &queue_url, compactor);
    ensure!(invoke(&queued_again, &[record]).await?.is_empty());
    let (sequence, follow_up) = queued_check(&moto, &queue_url).await?;
    ensure!(
        sequence == Some(folded.sequence),
        "expected a follow-up check of the folded session: {follow_up:?}"
    );
    Ok(())
}

/// A commit whose quiet check cannot be queued (the only thing that folds and tidies a
/// session nothing more arrives for) does not acknowledge its notifications: every message is
/// reported failed, though its rows are stored. Delivered again with the queue back, the same
/// objects are compacted to the same rows and the check of that commit is queued.
#[tokio::test]
async fn a_commits_quiet_check_that_cannot_be_queued_fails_its_notifications() -> anyhow::Result<()>
{
    let Some((moto, queue_url)) =
        compact_queue("a_commits_quiet_check_that_cannot_be_queued_fails_its_notifications")
            .await?
    else {
        return Ok(());
    };
    let (run, scenario, messages) = uncompacted_batch("lost-check").await?;
    let ids: Vec<String> = messages.iter().map(|(id, _, _)| id.clone()).collect();
    let records: Vec<serde_json::Value> =
        messages.into_iter().map(|(_, record, _)| record).collect();

    let (compacting, _scratch) = scenario.compactor(keeping_deltas())?;
    let unqueued = queueing_to(&moto, &format!("{queue_url}-gone"), compacting);
    let failed = invoke(&unqueued, &records).await?;
    ensure!(
        failed == ids,
        "notifications whose commit's check was not queued were acknowledged: {failed:?}"
    );
    let first = scenario.only_manifest("lost-check").await?;
    scenario
        .check(&run, "lost-check", "stored before the check failed")
        .await?;

    let (compactor, _scratch) = scenario.compactor(keeping_deltas())?;
    let queued_again = queueing_to(&moto, &queue_url, compactor);
    ensure!(invoke(&queued_again, &records).await?.is_empty());
    let again = scenario.only_manifest("lost-check").await?;
    ensure!(
        again.sequence > first.sequence,
        "delivered again, nothing was committed"
    );
    scenario
        .check(&run, "lost-check", "compacted twice")
        .await?;
    let (sequence, queued) = queued_check(&moto, &queue_url).await?;
    ensure!(
        sequence == Some(again.sequence),
        "expected the check of the second commit: {queued:?}"
    );
    Ok(())
}

/// A batch past its byte cap sends the messages past the cap back to its queue as new
/// messages, deliverable at once, and does not report them as failures: SQS would redeliver
/// those only after the 30-minute visibility timeout, each time using up one of the receives
/// before the dead-letter queue. Delivered from the queue, they complete the history. When the
/// queue cannot take them they are reported as failures after all, each once.
#[tokio::test]
async fn a_batch_past_its_byte_cap_sends_the_rest_back_to_its_queue() -> anyhow::Result<()> {
    let Some((moto, queue_url)) =
        compact_queue("a_batch_past_its_byte_cap_sends_the_rest_back_to_its_queue").await?
    else {
        return Ok(());
    };
    let (run, scenario, messages) = uncompacted_batch("deferred").await?;
    ensure!(messages.len() > 4, "too few raw objects to cap");
    let cap: u64 = messages.iter().take(3).map(|(_, _, size)| size).sum();
    let records: Vec<serde_json::Value> = messages
        .iter()
        .map(|(_, record, _)| record.clone())
        .collect();
    let mut past_cap: Vec<String> = records
        .iter()
        .skip(3)
        .map(|record| record["body"].as_str().map(str::to_owned))
        .collect::<Option<_>>()
        .context("a record without a body")?;
    past_cap.sort();

    let limits = BatchLimits {
        max_bytes: Some(cap),
        ..BatchLimits::default()
    };
    // A queue that cannot take them: the messages past the cap are reported as failures, as
    // are the three compacted (their commit's quiet check was not queued either), each once.
    let (compacting, _scratch) = scenario.compactor(keeping_deltas())?;
    let unqueued = CompactFunction {
        limits: limits.clone(),
        ..queueing_to(&moto, &format!("{queue_url}-gone"), compacting)
    };
    let failed = invoke(&unqueued, &records).await?;
    let mut reported = failed.clone();
    reported.sort();
    let mut expected: Vec<String> = messages.iter().map(|(id, _, _)| id.clone()).collect();
    expected.sort();
    ensure!(
        reported == expected,
        "with no queue to send them back to, failed {failed:?}"
    );

    let (compacting, _scratch) = scenario.compactor(keeping_deltas())?;
    let capped = CompactFunction {
        limits,
        ..queueing_to(&moto, &queue_url, compacting)
    };
    let failed = invoke(&capped, &records).await?;
    ensure!(
        failed.is_empty(),
        "messages past the cap were reported as failures: {failed:?}"
    );
    let sessions = scenario
        .storage()
        .list("tables/manifests/cluster=deferred/")
        .await?
        .len();
    // The run's quiet checks (one per session, not delayed here) share the queue.
    let queued = moto
        .receive(
            &queue_url,
            past_cap.len() + sessions,
            Duration::from_secs(30),
        )
        .await?;
    let mut sent_back = Vec::new();
    for body in queued {
        if QuietCheck::from_message(&body)?.is_none() {
            sent_back.push(body);
        }
    }
    sent_back.sort();
    ensure!(
        sent_back == past_cap,
        "sent back {} messages, expected the {} past the cap",
        sent_back.len(),
        past_cap.len()
    );

    let delivered: Vec<serde_json::Value> = sent_back
        .iter()
        .enumerate()
        .map(|(index, body)| check_record(&format!("again{index}"), body))
        .collect();
    let (compacting, _scratch) = scenario.compactor(keeping_deltas())?;
    let failed = invoke(&queueing_to(&moto, &queue_url, compacting), &delivered).await?;
    ensure!(
        failed.is_empty(),
        "the messages sent back failed: {failed:?}"
    );
    scenario
        .check(
            &run,
            "deferred",
            "a capped batch and the messages it sent back",
        )
        .await
}
