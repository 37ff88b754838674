//! Compaction end to end: Ray's captured bodies are posted to ingest, compacted into Parquet,
//! and the rows a reader sees are compared with Ray's own state-API output. Also: order and
//! duplicates change nothing, `rebuild` gives the same rows, racing compactions both land,
//! unreadable events are quarantined, a manifest write whose response was lost still counts,
//! and the Lambda handler decodes SQS/S3 notifications.

use std::sync::Arc;
use std::time::Duration;

use afterglow::compact::CompactFunction;
use afterglow_tests::faults::LosesConditionalResponses;
use afterglow_tests::moto::Moto;
use afterglow_tests::ray::{LOSSY_RUN, OurRows, check};
use afterglow_tests::{
    FixtureRun, TestServer, bodies, compacting_settings, compactor, keeping_deltas, local_storage,
    manifest_commits, post_all, raw_events, shuffled, store_raw, stored_entities, stored_spans,
    stored_task_rows,
};
use anyhow::{Context as _, ensure};
use shared::compact::batch::BatchLimits;
use shared::compact::check_queue::CheckQueue;
use shared::compact::fold::{FoldPolicy, QuietCheck};
use shared::compact::queue::CompactionQueue;
use shared::compact::{CompactSettings, Compactor};
use shared::storage::{ObjectKey, Storage};

/// Posts `bodies` for `cluster` through a compacting server and returns the stored rows.
async fn ingest_and_compact(
    storage: Arc<dyn Storage>,
    cluster: &str,
    bodies: &[Vec<u8>],
) -> anyhow::Result<OurRows> {
    let (settings, queue, _scratch) = compacting_settings(Arc::clone(&storage))?;
    let server = TestServer::start(settings).await?;
    post_all(&format!("{}/v1/events/{cluster}", server.url), bodies).await?;
    queue.idle().await;
    server.stop().await?;
    stored_task_rows(&*storage, cluster).await
}

/// Every captured run, posted in arrival order (retried deliveries included), compacts into
/// rows that agree with Ray's `ray list tasks --detail` on every compared field.
async fn compacted_rows_agree_with_ray(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    for run in FixtureRun::all()? {
        let rows = ingest_and_compact(Arc::clone(&storage), &run.name, &bodies(&run)?).await?;
        let comparison = check(&run, &rows, "ingest + compaction, arrival order")?;
        let spans = stored_spans(&*storage, &run.name).await?;
        afterglow_tests::ray::check_spans(&run, &spans)?;
        let entities = stored_entities(&*storage, &run.name).await?;
        let (compared, problems) = afterglow_tests::ray_entities::compare(&run, &entities)?;
        ensure!(
            problems.is_empty(),
            "{}: entities differ:\n{}",
            run.name,
            problems.join("\n")
        );
        ensure!(compared > 0, "{}: no entities compared", run.name);
        if run.name == LOSSY_RUN {
            println!(
                "{LOSSY_RUN}: {} attempts agree; {} have no exported event; {} fields lost",
                comparison.matched,
                comparison.missing.len(),
                comparison.explained_by_lost_events
            );
        }
    }
    Ok(())
}

/// Two compactions of different raw objects of the same session, racing: both finish, and the
/// manifest holds both results (the rows equal one compaction of everything).
async fn racing_compactions_both_land(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    // Store the raw objects without compacting them.
    let server = TestServer::start(afterglow_tests::open_settings(Arc::clone(&storage))).await?;
    post_all(&format!("{}/v1/events/race", server.url), &bodies(&run)?).await?;
    server.stop().await?;
    let keys: Vec<ObjectKey> = storage
        .list("raw/race/")
        .await?
        .into_iter()
        .map(|meta| meta.key)
        .collect();
    let (even, odd): (Vec<_>, Vec<_>) = keys
        .iter()
        .cloned()
        .enumerate()
        .partition(|(index, _)| index % 2 == 0);
    let even: Vec<ObjectKey> = even.into_iter().map(|(_, key)| key).collect();
    let odd: Vec<ObjectKey> = odd.into_iter().map(|(_, key)| key).collect();
    let (first, _a) = compactor(Arc::clone(&storage), CompactSettings::default())?;
    let (second, _b) = compactor(Arc::clone(&storage), CompactSettings::default())?;
    let (one, two) = tokio::join!(first.compact(&even), second.compact(&odd));
    let (one, two) = (one?, two?);
    println!("race: {} and {} manifest retries", one.retries, two.retries);
    let rows = stored_task_rows(&*storage, "race").await?;
    check(&run, &rows, "two racing compactions")?;
    Ok(())
}

/// A manifest write whose response was lost (it landed, and the SDK's retry of the same
/// request got 412) is a commit, not a lost race: compaction must keep the files the manifest
/// now names. Every manifest response is lost here, one raw object per compaction, so each
/// compaction after the first also reads the files the one before wrote.
async fn lost_manifest_responses_lose_no_file(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let server = TestServer::start(afterglow_tests::open_settings(Arc::clone(&storage))).await?;
    post_all(&format!("{}/v1/events/lost", server.url), &bodies(&run)?).await?;
    server.stop().await?;
    let faulty = Arc::new(LosesConditionalResponses::of_manifests(
        Arc::clone(&storage),
        usize::MAX,
    ));
    let (compactor, _scratch) = compactor(faulty.clone(), CompactSettings::default())?;
    let keys = compactor.raw_keys().await?;
    for key in &keys {
        compactor
            .compact(std::slice::from_ref(key))
            .await
            .with_context(|| format!("compacting {key} after {} lost responses", faulty.lost()))?;
    }
    ensure!(
        faulty.lost() >= keys.len(),
        "only {} of {} manifest responses were lost",
        faulty.lost(),
        keys.len()
    );
    let rows = stored_task_rows(&*storage, "lost").await?;
    check(&run, &rows, "every manifest response lost")?;
    Ok(())
}

/// Files a cut-off run wrote but never committed are deleted once old enough, by the store's
/// clock; younger ones (perhaps a run still going) and every file the manifest names stay.
async fn orphan_files_are_collected_once_old(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    // In two halves, so the second run supersedes rows of the first (a deletion vector).
    let all = bodies(&run)?;
    let (first, second) = all.split_at(all.len() / 2);
    for half in [first, second] {
        ingest_and_compact(Arc::clone(&storage), "orphaned", half).await?;
    }
    let manifests = storage.list("tables/manifests/cluster=orphaned/").await?;
    let [manifest] = manifests.as_slice() else {
        anyhow::bail!("expected one session, found {}", manifests.len());
    };
    let (cluster, session) =
        shared::layout::manifest_session(&manifest.key).context("a manifest key")?;
    let strays = [
        format!("tables/task_attempts/cluster=orphaned/session={session}/delta-01STRAY.parquet"),
        format!("tables/jobs/cluster=orphaned/session={session}/jobs-01STRAY.parquet"),
    ];
    for stray in &strays {
        storage
            .put(
                &ObjectKey::new(stray.clone())?,
                bytes::Bytes::from_static(b"PAR1 cut off"),
                shared::storage::PutMode::Overwrite,
            )
            .await?;
    }
    let before = storage.list("tables/").await?.len();
    // Deletion vectors are files the manifest names too (beside their deltas): they must stay.
    let vectors = storage
        .list("tables/task_attempts/cluster=orphaned/")
        .await?
        .iter()
        .filter(|meta| meta.key.as_str().contains("/deletes-"))
        .count();
    ensure!(vectors > 0, "the runs superseded no stored row");

    let (patient, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
    let young = patient.collect_orphans(&cluster, &session).await?;
    ensure!(young == 0, "collected {young} files younger than a day");

    let settings = CompactSettings {
        orphan_age: std::time::Duration::ZERO,
        ..CompactSettings::default()
    };
    let (eager, _scratch) = compactor(Arc::clone(&storage), settings)?;
    let collected = eager.collect_orphans(&cluster, &session).await?;
    ensure!(collected == strays.len(), "collected {collected} files");
    for stray in &strays {
        ensure!(
            matches!(
                storage.get(&ObjectKey::new(stray.clone())?).await,
                Err(shared::storage::StorageError::NotFound { .. })
            ),
            "{stray} is left"
        );
    }
    ensure!(storage.list("tables/").await?.len() == before - strays.len());
    check(
        &run,
        &stored_task_rows(&*storage, "orphaned").await?,
        "after collecting orphans",
    )?;
    Ok(())
}

afterglow_tests::for_each_backend!(
    compacted_rows_agree_with_ray,
    racing_compactions_both_land,
    lost_manifest_responses_lose_no_file,
    orphan_files_are_collected_once_old
);

/// Bodies shuffled and every body delivered twice give exactly the rows of arrival order; so
/// does compacting every raw object again, and so does `rebuild`.
#[tokio::test]
async fn order_duplicates_recompaction_and_rebuild_change_no_row() -> anyhow::Result<()> {
    for run in FixtureRun::all()? {
        let name = run.name.as_str();
        let in_order = {
            let (_guard, storage) = local_storage()?;
            ingest_and_compact(Arc::new(storage), name, &bodies(&run)?).await?
        };
        let (_guard, storage) = local_storage()?;
        let storage: Arc<dyn Storage> = Arc::new(storage);
        let mut scrambled = shuffled(&bodies(&run)?, 11);
        scrambled.extend(shuffled(&bodies(&run)?, 5));
        let rows = ingest_and_compact(Arc::clone(&storage), name, &scrambled).await?;
        ensure_same(
            &in_order,
            &rows,
            &format!("{name}: shuffled and duplicated"),
        )?;

        let (again, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
        let report = again.compact(&again.raw_keys().await?).await?;
        ensure!(
            report.duplicates > 0,
            "re-reading raw objects must find every event again"
        );
        let rows = stored_task_rows(&*storage, name).await?;
        ensure_same(&in_order, &rows, &format!("{name}: compacted twice"))?;

        let deleted = again.drop_tables().await?;
        ensure!(deleted > 0);
        ensure!(stored_task_rows(&*storage, name).await?.is_empty());
        again.compact(&again.raw_keys().await?).await?;
        let rows = stored_task_rows(&*storage, name).await?;
        ensure_same(&in_order, &rows, &format!("{name}: rebuilt"))?;
    }
    Ok(())
}

fn ensure_same(expected: &OurRows, actual: &OurRows, what: &str) -> anyhow::Result<()> {
    ensure!(
        expected.len() == actual.len(),
        "{what}: {} rows, expected {}",
        actual.len(),
        expected.len()
    );
    for (key, row) in expected {
        let other = actual
            .get(key)
            .with_context(|| format!("{what}: {key:?} missing"))?;
        ensure!(
            row.fields == other.fields,
            "{what}: {key:?} differs:\n {:?}\n {:?}",
            row.fields,
            other.fields
        );
    }
    Ok(())
}

/// Many small compactions fold their deltas into a base; the rows stay the same and the old
/// files are retired, not deleted at once.
#[tokio::test]
async fn deltas_fold_into_a_base_without_changing_rows() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let (_guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    let server = TestServer::start(afterglow_tests::open_settings(Arc::clone(&storage))).await?;
    post_all(&format!("{}/v1/events/fold", server.url), &bodies(&run)?).await?;
    server.stop().await?;
    let settings = CompactSettings {
        fold: FoldPolicy {
            max_deltas: 3,
            ..FoldPolicy::default()
        },
        ..CompactSettings::default()
    };
    let (compactor, _scratch) = compactor(Arc::clone(&storage), settings)?;
    for key in compactor.raw_keys().await? {
        compactor.compact(&[key]).await?;
    }
    // Runs after a fold found stored versions in the new base from its keys, read once.
    let held = compactor.stored_keys();
    ensure!(held.rows_read() > 0 && held.scans_after_error() == 0 && held.scans_after_check() == 0);
    let manifests = storage.list("tables/manifests/cluster=fold/").await?;
    ensure!(manifests.len() == 1, "one session, one manifest");
    let manifest = shared::tables::manifest::load(&*storage, &manifests[0].key)
        .await?
        .manifest;
    ensure!(manifest.task_attempts.base.len() == 1, "{manifest:?}");
    ensure!(manifest.task_attempts.deltas.len() <= 3, "{manifest:?}");
    ensure!(
        !manifest.retired.is_empty(),
        "superseded files wait out the grace period"
    );
    for retired in &manifest.retired {
        ensure!(
            storage.get(&retired.key).await.is_ok(),
            "{} deleted too early",
            retired.key
        );
    }
    check(
        &run,
        &stored_task_rows(&*storage, "fold").await?,
        "folded into a base",
    )?;
    Ok(())
}

/// `fold` (`afterglow compact --fold`) turns a quiet session's deltas into one base at once;
/// the rows are still Ray's.
#[tokio::test]
async fn fold_turns_every_delta_into_one_base() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let (_guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    let server = TestServer::start(afterglow_tests::open_settings(Arc::clone(&storage))).await?;
    post_all(&format!("{}/v1/events/quiet", server.url), &bodies(&run)?).await?;
    server.stop().await?;
    let (compactor, _scratch) = compactor(Arc::clone(&storage), keeping_deltas())?;
    for key in compactor.raw_keys().await? {
        compactor.compact(&[key]).await?;
    }
    let manifests = storage.list("tables/manifests/cluster=quiet/").await?;
    ensure!(manifests.len() == 1, "one session, one manifest");
    let before = shared::tables::manifest::load(&*storage, &manifests[0].key)
        .await?
        .manifest;
    ensure!(before.task_attempts.deltas.len() > 1, "{before:?}");
    ensure!(compactor.fold().await? == 1, "one session folded");
    let after = shared::tables::manifest::load(&*storage, &manifests[0].key)
        .await?
        .manifest;
    ensure!(after.task_attempts.base.len() == 1, "{after:?}");
    ensure!(after.task_attempts.deltas.is_empty(), "{after:?}");
    ensure!(compactor.fold().await? == 0, "nothing left to fold");
    check(
        &run,
        &stored_task_rows(&*storage, "quiet").await?,
        "folded on request",
    )?;
    Ok(())
}

/// Deltas fold once they hold half the base's rows, however few they are: compacted one raw
/// object at a time with a delta limit never reached, the session still gets a base, and after
/// every run its deltas hold less than half of it (or fewer rows than the minimum).
#[tokio::test]
async fn deltas_fold_once_they_hold_a_share_of_the_base() -> anyhow::Result<()> {
    let (run, _guard, storage) = uncompacted("tiers").await?;
    let policy = FoldPolicy {
        max_deltas: 1_000,
        delta_share_percent: 50,
        min_delta_rows: 10,
        ..FoldPolicy::default()
    };
    let settings = CompactSettings {
        fold: policy.clone(),
        ..CompactSettings::default()
    };
    let (compactor, _scratch) = compactor(Arc::clone(&storage), settings)?;
    let mut bases = std::collections::BTreeSet::new();
    for key in compactor.raw_keys().await? {
        compactor.compact(&[key]).await?;
        let manifest = only_manifest(&*storage, "tiers").await?;
        let table = &manifest.task_attempts;
        ensure!(
            policy.due(table).is_none(),
            "left due for a fold: {table:?}"
        );
        bases.extend(table.base.iter().map(|file| file.key.clone()));
    }
    ensure!(
        bases.len() >= 2,
        "the base was rewritten {} time(s)",
        bases.len()
    );
    check(
        &run,
        &stored_task_rows(&*storage, "tiers").await?,
        "folded by share",
    )?;
    Ok(())
}

/// A small session stays in one file: compacted one raw object at a time with the default
/// policy, after every run it is one base or one delta, never more, and its rows still agree
/// with Ray.
#[tokio::test]
async fn a_small_session_stays_in_one_file() -> anyhow::Result<()> {
    let (run, _guard, storage) = uncompacted("small").await?;
    let (compactor, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
    let keys = compactor.raw_keys().await?;
    ensure!(keys.len() > 2, "{} raw objects tell nothing", keys.len());
    let mut folds = 0;
    for key in keys {
        compactor.compact(&[key]).await?;
        let table = only_manifest(&*storage, "small").await?.task_attempts;
        ensure!(
            table.base.len() + table.deltas.len() <= 1,
            "a small session left in several files: {table:?}"
        );
        folds += usize::from(!table.base.is_empty() && table.deltas.is_empty());
    }
    ensure!(folds > 1, "folded {folds} time(s)");
    check(
        &run,
        &stored_task_rows(&*storage, "small").await?,
        "kept in one file",
    )?;
    Ok(())
}

/// The manifest of `cluster`'s one session.
async fn only_manifest(
    storage: &dyn Storage,
    cluster: &str,
) -> anyhow::Result<shared::tables::manifest::Manifest> {
    let manifests = storage
        .list(&format!("tables/manifests/cluster={cluster}/"))
        .await?;
    let [meta] = manifests.as_slice() else {
        anyhow::bail!("expected one session, found {}", manifests.len());
    };
    Ok(shared::tables::manifest::load(storage, &meta.key)
        .await?
        .manifest)
}

/// Each commit of the compact function queues a quiet check of the session as it left it, on
/// its own queue (moto's SQS) and delayed by the quiet period. A check whose session changed
/// since does nothing; the newest folds the deltas into one base, whose rows still agree with
/// Ray, and queues one more check for the replaced files it keeps through their grace period.
#[tokio::test]
async fn quiet_checks_on_the_queue_fold_a_session_no_run_changed() -> anyhow::Result<()> {
    let Some(moto) = Moto::start("quiet_checks_on_the_queue_fold_a_session_no_run_changed").await?
    else {
        return Ok(());
    };
    let queue_url = moto.create_queue("afterglow-compact").await?;
    let (run, _guard, storage, messages) = uncompacted_batch("hushed").await?;
    let delay = Duration::from_secs(5);
    let (compactor, _scratch) = compactor(Arc::clone(&storage), keeping_deltas())?;
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
        receive(&moto, &queue_url, 0, Duration::ZERO)
            .await?
            .is_empty(),
        "a check was delivered before its delay"
    );
    ensure!(
        invoke(&function, second).await?.is_empty(),
        "second half failed"
    );
    let checks = receive(&moto, &queue_url, 2, Duration::from_secs(30)).await?;
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
    let before = only_manifest(&*storage, "hushed").await?;
    ensure!(before.sequence == *newest_sequence && stale_sequence < newest_sequence);
    ensure!(before.task_attempts.deltas.len() == 2, "{before:?}");

    ensure!(
        invoke(&function, &[check_record("stale", stale)])
            .await?
            .is_empty()
    );
    ensure!(
        only_manifest(&*storage, "hushed").await? == before,
        "a check of an older commit changed the session"
    );
    ensure!(
        invoke(&function, &[check_record("newest", newest)])
            .await?
            .is_empty()
    );
    let after = only_manifest(&*storage, "hushed").await?;
    ensure!(after.task_attempts.deltas.is_empty(), "{after:?}");
    ensure!(after.task_attempts.base.len() == 1, "{after:?}");
    ensure!(
        !after.retired.is_empty(),
        "the replaced deltas wait out their grace"
    );
    check(
        &run,
        &stored_task_rows(&*storage, "hushed").await?,
        "folded by a quiet check",
    )?;
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
    let Some(moto) =
        Moto::start("a_quiet_checks_follow_up_that_cannot_be_queued_is_asked_for_again").await?
    else {
        return Ok(());
    };
    let queue_url = moto.create_queue("afterglow-compact").await?;
    let (_run, _guard, storage, messages) = uncompacted_batch("lost-follow-up").await?;
    let records: Vec<serde_json::Value> =
        messages.into_iter().map(|(_, record, _)| record).collect();
    let (compacting, _scratch) = compactor(Arc::clone(&storage), keeping_deltas())?;
    let plain = function(compacting, BatchLimits::default());
    ensure!(
        invoke(&plain, &records).await?.is_empty(),
        "compaction failed"
    );
    let before = only_manifest(&*storage, "lost-follow-up").await?;
    ensure!(!before.task_attempts.deltas.is_empty(), "{before:?}");
    let manifests = storage
        .list("tables/manifests/cluster=lost-follow-up/")
        .await?;
    let (cluster, session) = manifests
        .first()
        .and_then(|meta| shared::layout::manifest_session(&meta.key))
        .context("the session's manifest")?;
    let check = QuietCheck {
        cluster,
        session,
        sequence: before.sequence,
    };

    // The queue is gone when the follow-up is sent.
    let (tidying, _tidy_scratch) = compactor(Arc::clone(&storage), keeping_deltas())?;
    let unqueued = queueing_to(&moto, &format!("{queue_url}-gone"), tidying);
    let record = check_record("quiet", &check.to_message());
    ensure!(
        invoke(&unqueued, std::slice::from_ref(&record)).await? == ["quiet"],
        "a check whose follow-up was not queued was acknowledged"
    );
    let folded = only_manifest(&*storage, "lost-follow-up").await?;
    ensure!(
        folded.task_attempts.deltas.is_empty() && !folded.retired.is_empty(),
        "{folded:?}"
    );

    // Delivered again, with the queue back.
    let (compactor, _scratch) = compactor(Arc::clone(&storage), keeping_deltas())?;
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
    let Some(moto) =
        Moto::start("a_commits_quiet_check_that_cannot_be_queued_fails_its_notifications").await?
    else {
        return Ok(());
    };
    let queue_url = moto.create_queue("afterglow-compact").await?;
    let (run, _guard, storage, messages) = uncompacted_batch("lost-check").await?;
    let ids: Vec<String> = messages.iter().map(|(id, _, _)| id.clone()).collect();
    let records: Vec<serde_json::Value> =
        messages.into_iter().map(|(_, record, _)| record).collect();

    let (compacting, _scratch) = compactor(Arc::clone(&storage), keeping_deltas())?;
    let unqueued = queueing_to(&moto, &format!("{queue_url}-gone"), compacting);
    let failed = invoke(&unqueued, &records).await?;
    ensure!(
        failed == ids,
        "notifications whose commit's check was not queued were acknowledged: {failed:?}"
    );
    let first = only_manifest(&*storage, "lost-check").await?;
    check(
        &run,
        &stored_task_rows(&*storage, "lost-check").await?,
        "stored before the check failed",
    )?;

    let (compactor, _scratch) = compactor(Arc::clone(&storage), keeping_deltas())?;
    let queued_again = queueing_to(&moto, &queue_url, compactor);
    ensure!(invoke(&queued_again, &records).await?.is_empty());
    let again = only_manifest(&*storage, "lost-check").await?;
    ensure!(
        again.sequence > first.sequence,
        "delivered again, nothing was committed"
    );
    check(
        &run,
        &stored_task_rows(&*storage, "lost-check").await?,
        "compacted twice",
    )?;
    let (sequence, queued) = queued_check(&moto, &queue_url).await?;
    ensure!(
        sequence == Some(again.sequence),
        "expected the check of the second commit: {queued:?}"
    );
    Ok(())
}

/// In `serve`, the compaction queue stands in for the delayed checks: a session no run has
/// changed for the quiet period is folded into one base, and with no grace period the files it
/// replaced are deleted at once. Rows still agree with Ray.
#[tokio::test]
async fn serve_folds_a_session_once_it_goes_quiet() -> anyhow::Result<()> {
    let (run, _guard, storage) = uncompacted("idle").await?;
    let quiet = Duration::from_secs(3);
    let settings = CompactSettings {
        fold: FoldPolicy {
            quiet,
            ..FoldPolicy::default()
        },
        retire_grace: Duration::ZERO,
        ..CompactSettings::default()
    };
    let (compactor, _scratch) = compactor(Arc::clone(&storage), settings)?;
    let keys = compactor.raw_keys().await?;
    let queue = CompactionQueue::spawn(compactor);
    let started = tokio::time::Instant::now();
    for key in keys {
        queue.notify(key);
    }
    queue.idle().await;
    let compacted = only_manifest(&*storage, "idle").await?;
    ensure!(
        started.elapsed() < quiet,
        "compaction took longer than the quiet period; the test cannot tell"
    );
    ensure!(!compacted.task_attempts.deltas.is_empty(), "{compacted:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let folded = loop {
        let manifest = only_manifest(&*storage, "idle").await?;
        if manifest.task_attempts.deltas.is_empty() {
            break manifest;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "not folded a minute after going quiet: {manifest:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(folded.task_attempts.base.len() == 1, "{folded:?}");
    ensure!(folded.retired.is_empty(), "{folded:?}");
    for delta in &compacted.task_attempts.deltas {
        for key in delta.keys() {
            ensure!(
                storage.get(key).await.is_err(),
                "{key} was replaced but is still stored"
            );
        }
    }
    check(
        &run,
        &stored_task_rows(&*storage, "idle").await?,
        "folded once quiet in serve",
    )?;
    Ok(())
}

/// Runs the compact function on SQS `records`; returns the ids it asks to redeliver.
async fn invoke(
    function: &CompactFunction,
    records: &[serde_json::Value],
) -> anyhow::Result<Vec<String>> {
    invoke_in(function, records, lambda_runtime::Context::default()).await
}

/// [`invoke`] with an invocation `context` (its deadline).
async fn invoke_in(
    function: &CompactFunction,
    records: &[serde_json::Value],
    context: lambda_runtime::Context,
) -> anyhow::Result<Vec<String>> {
    let event =
        lambda_runtime::LambdaEvent::new(serde_json::json!({ "Records": records }), context);
    let response = afterglow::compact::handle(function, event)
        .await
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    Ok(response["batchItemFailures"]
        .as_array()
        .context("batchItemFailures")?
        .iter()
        .filter_map(|failure| failure["itemIdentifier"].as_str().map(str::to_owned))
        .collect())
}

/// A queue message as Lambda delivers it from SQS.
fn check_record(id: &str, body: &str) -> serde_json::Value {
    serde_json::json!({
        "messageId": id, "eventSource": "aws:sqs", "body": body,
        "attributes": {}, "messageAttributes": {}
    })
}

/// One of the queue's approximate counts.
async fn queued(moto: &Moto, queue_url: &str, attribute: &str) -> anyhow::Result<u64> {
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

/// Receives (and deletes) messages until `count` have arrived or `within` has passed; the
/// bodies.
async fn receive(
    moto: &Moto,
    queue_url: &str,
    count: usize,
    within: Duration,
) -> anyhow::Result<Vec<String>> {
    let deadline = tokio::time::Instant::now() + within;
    let mut bodies = Vec::new();
    loop {
        let answer = moto
            .sqs()
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .send()
            .await
            .context("ReceiveMessage")?;
        for message in answer.messages() {
            bodies.extend(message.body().map(str::to_owned));
            if let Some(handle) = message.receipt_handle() {
                moto.sqs()
                    .delete_message()
                    .queue_url(queue_url)
                    .receipt_handle(handle)
                    .send()
                    .await
                    .context("DeleteMessage")?;
            }
        }
        if bodies.len() >= count || tokio::time::Instant::now() >= deadline {
            return Ok(bodies);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A store an earlier build wrote (7ed31af, before report times were stored by reference: its
/// files have no `…_ref` columns) is carried on by this build: a run writes a delta beside the
/// old one, a fold merges the two kinds of file into one base, and later runs re-read and
/// re-merge attempts from it; the rows agree with Ray's at each step.
#[tokio::test]
async fn a_session_an_earlier_build_began_is_carried_on() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let (guard, local) = local_storage()?;
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/stores/7ed31af-basic-workload-first-half/tables");
    copy_dir(&fixture, &guard.path().join("data/tables"))?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    let requests = run.requests()?;
    let later: Vec<Vec<u8>> = requests[requests.len() / 2..]
        .iter()
        .map(|request| request.body.clone())
        .collect();
    let server = TestServer::start(afterglow_tests::open_settings(Arc::clone(&storage))).await?;
    post_all(&format!("{}/v1/events/upgrade", server.url), &later).await?;
    server.stop().await?;
    let (compactor, _scratch) = compactor(Arc::clone(&storage), keeping_deltas())?;
    let keys = compactor.raw_keys().await?;
    let (first, rest) = keys.split_at(keys.len() / 3);
    compactor.compact(first).await?;

    let manifest = only_manifest(&*storage, "upgrade").await?;
    let connection = duckdb::Connection::open_in_memory()?;
    let kinds = manifest
        .task_attempts
        .all()
        .map(|file| {
            let path = guard.path().join("data").join(file.key.as_str());
            let count: i64 = connection.query_row(
                "SELECT count(*) FROM parquet_schema(?) WHERE name = 'worker_id_at_ref'",
                [path.display().to_string()],
                |row| row.get(0),
            )?;
            Ok(count > 0)
        })
        .collect::<anyhow::Result<Vec<bool>>>()?;
    ensure!(
        kinds == [false, true],
        "expected the earlier build's delta, then this build's: {kinds:?}"
    );
    // The earlier build's delta has no key index, so lookups scan until the fold.
    let indexed: Vec<bool> = manifest
        .task_attempts
        .all()
        .map(|file| file.key_index.is_some())
        .collect();
    ensure!(indexed == [false, true], "key indexes: {indexed:?}");
    ensure!(compactor.fold().await? == 1, "the session was not folded");
    ensure!(
        only_manifest(&*storage, "upgrade")
            .await?
            .task_attempts
            .has_key_indexes(),
        "the base the fold wrote has no key index"
    );
    for key in rest {
        compactor.compact(std::slice::from_ref(key)).await?;
    }
    check(
        &run,
        &stored_task_rows(&*storage, "upgrade").await?,
        "begun by an earlier build, folded, carried on",
    )?;
    let key = storage
        .list("tables/manifests/cluster=upgrade/")
        .await?
        .into_iter()
        .next()
        .context("the manifest")?
        .key;
    // A quiet session whose base an earlier build wrote (no key index, nothing else to fold)
    // gets its base written again once, so its lookups stop scanning.
    ensure!(compactor.fold().await? == 1, "the deltas were not folded");
    edit_manifest(&*storage, &key, |stored| {
        let base = stored["task_attempts"]["base"][0]
            .as_object_mut()
            .context("a base")?;
        ensure!(
            base.remove("key_index").is_some(),
            "the base has no key index"
        );
        Ok(())
    })
    .await?;
    ensure!(
        compactor.fold().await? == 1,
        "a base without key index was left as it was"
    );
    let manifest = only_manifest(&*storage, "upgrade").await?;
    ensure!(manifest.task_attempts.has_key_indexes() && manifest.task_attempts.deltas.is_empty());
    ensure!(
        compactor.fold().await? == 0,
        "a current base was written again"
    );
    // The manifest now says its files may hold references, so the earlier build (which reads
    // format 1 only) refuses it instead of taking referenced times for missing ones; and this
    // build refuses a format newer than its own the same way.
    edit_manifest(&*storage, &key, |stored| {
        ensure!(
            stored["format"] == 2,
            "manifest format {}",
            stored["format"]
        );
        stored["format"] = 3.into();
        Ok(())
    })
    .await?;
    let refused = shared::tables::manifest::load(&*storage, &key).await;
    ensure!(
        refused
            .as_ref()
            .is_err_and(|err| err.to_string().contains("format 3")),
        "a newer manifest was read: {refused:?}"
    );
    Ok(())
}

/// Rewrites the manifest at `key` as JSON with `edit` applied, as another build might have
/// written it.
async fn edit_manifest(
    storage: &dyn Storage,
    key: &shared::storage::ObjectKey,
    edit: impl FnOnce(&mut serde_json::Value) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut stored: serde_json::Value = serde_json::from_slice(&storage.get(key).await?.body)?;
    edit(&mut stored)?;
    storage
        .put(
            key,
            serde_json::to_vec(&stored)?.into(),
            shared::storage::PutMode::Overwrite,
        )
        .await?;
    Ok(())
}

/// Copies the directory tree `from` to `to`.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// A line that is not a readable event goes to a quarantine object with its reason; the other
/// events of the same object are compacted.
#[tokio::test]
async fn unreadable_events_are_quarantined_and_the_rest_compacted() -> anyhow::Result<()> {
    let run = FixtureRun::named("edge-cases")?;
    let mut events = Vec::new();
    for body in bodies(&run)? {
        events.extend(raw_events(&body)?);
    }
    events.push(r#"{"eventType": "TASK_LIFECYCLE_EVENT", "sessionName": "s", "taskLifecycleEvent": {"taskId": "%%%"}}"#.to_owned());
    events.push(r#"{"eventType": "NODE_LIFECYCLE_EVENT"}"#.to_owned());
    let body = format!("[{}]", events.join(", ")).into_bytes();
    let (_guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    let rows = ingest_and_compact(Arc::clone(&storage), "odd", &[body]).await?;
    check(&run, &rows, "with unreadable neighbours")?;
    let quarantine = afterglow_tests::stored_lines(&*storage, "quarantine/").await?;
    ensure!(quarantine.len() == 2, "{quarantine:?}");
    ensure!(
        quarantine
            .iter()
            .any(|line| line.contains("invalid base64")),
        "{quarantine:?}"
    );
    ensure!(
        quarantine
            .iter()
            .any(|line| line.contains("nodeLifecycleEvent")),
        "{quarantine:?}"
    );
    Ok(())
}

/// The compact Lambda handler: an SQS batch of S3 notifications with URL-encoded keys is
/// compacted; a message naming a missing object is reported as a batch item failure alone.
#[tokio::test]
async fn lambda_handler_compacts_notified_keys_and_reports_failures_per_message()
-> anyhow::Result<()> {
    let run = FixtureRun::named("edge-cases")?;
    let (_guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    let server = TestServer::start(afterglow_tests::open_settings(Arc::clone(&storage))).await?;
    post_all(&format!("{}/v1/events/sqs", server.url), &bodies(&run)?).await?;
    server.stop().await?;
    let keys = storage.list("raw/sqs/").await?;
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
    let (compactor, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
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
    check(
        &run,
        &stored_task_rows(&*storage, "sqs").await?,
        "via the compact handler",
    )?;
    Ok(())
}

/// A session whose commits fail costs the compact function only its own messages: the batch's
/// run commits the other sessions at once, and only the failing session's messages are
/// reported for redelivery. (Before, the whole run failed and every message was compacted
/// again on its own, one commit each, for as long as the deadline allowed.)
#[tokio::test]
async fn a_session_that_cannot_be_committed_fails_only_its_own_messages() -> anyhow::Result<()> {
    use afterglow_tests::faults::Refuses;

    let healthy = FixtureRun::named("basic-workload")?;
    let failing = FixtureRun::named("edge-cases")?;
    let (_guard, local) = local_storage()?;
    let local: Arc<dyn Storage> = Arc::new(local);
    store_raw(&local, &healthy, "fine").await?;
    store_raw(&local, &failing, "broken").await?;
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
    let (compactor, _scratch) = compactor(
        Arc::clone(&faulty) as Arc<dyn Storage>,
        CompactSettings::default(),
    )?;
    let mut failed = invoke(&function(compactor, BatchLimits::default()), &records).await?;
    ensure!(faulty.refused() > 0, "nothing was refused");
    failed.sort();
    broken_ids.sort();
    ensure!(
        failed == broken_ids,
        "failed {failed:?}, not the broken session's {broken_ids:?}"
    );
    check(
        &healthy,
        &stored_task_rows(&*local, "fine").await?,
        "beside a session that cannot be committed",
    )?;
    let commits = manifest_commits(&*local, "fine").await?;
    ensure!(
        commits == 1,
        "{commits} commits, not one for the whole batch"
    );
    Ok(())
}

/// The compact function as Lambda runs it over `compactor`, queueing no quiet checks.
fn function(compactor: Compactor, limits: BatchLimits) -> CompactFunction {
    CompactFunction {
        compactor,
        checks: None,
        prefix: String::new(),
        limits,
    }
}

/// The compact function over `compactor`, queueing its quiet checks to `queue_url` at once.
fn queueing_to(moto: &Moto, queue_url: &str, compactor: Compactor) -> CompactFunction {
    CompactFunction {
        checks: Some(CheckQueue::new(
            moto.sqs(),
            queue_url.to_owned(),
            Duration::ZERO,
        )),
        ..function(compactor, BatchLimits::default())
    }
}

/// The sequence of the first quiet check queued to `queue_url` (waiting up to 30 s), and
/// every body received, for the message when it is not the one expected.
async fn queued_check(moto: &Moto, queue_url: &str) -> anyhow::Result<(Option<u64>, Vec<String>)> {
    let bodies = receive(moto, queue_url, 1, Duration::from_secs(30)).await?;
    let sequence = bodies
        .first()
        .map(|body| QuietCheck::from_message(body))
        .transpose()?
        .flatten()
        .map(|check| check.sequence);
    Ok((sequence, bodies))
}

/// An S3 `ObjectCreated` notification in the shape S3 sends (keys form-URL-encoded).
fn s3_notification(keys: &[&str]) -> serde_json::Value {
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

/// A direct S3 event (no SQS) is compacted too.
#[tokio::test]
async fn lambda_handler_compacts_a_direct_s3_event() -> anyhow::Result<()> {
    let run = FixtureRun::named("snake-case-keys")?;
    let (_guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    let server = TestServer::start(afterglow_tests::open_settings(Arc::clone(&storage))).await?;
    post_all(&format!("{}/v1/events/direct", server.url), &bodies(&run)?).await?;
    server.stop().await?;
    let keys: Vec<String> = storage
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
    let (compactor, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
    afterglow::compact::handle(&function(compactor, BatchLimits::default()), event)
        .await
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    check(
        &run,
        &stored_task_rows(&*storage, "direct").await?,
        "via a direct S3 event",
    )?;
    Ok(())
}

/// One compaction per raw object, the finest grain SQS can deliver: every run still agrees with
/// Ray. (Regression: re-deriving unfinished attempts at job end once read an old version of an
/// attempt alone and failed it, although a newer version had finished.)
#[tokio::test]
async fn compacting_one_raw_object_at_a_time_agrees_with_ray() -> anyhow::Result<()> {
    let mut keys_read = 0;
    for run in FixtureRun::all()? {
        let (_guard, local) = local_storage()?;
        let storage: Arc<dyn Storage> = Arc::new(local);
        let server =
            TestServer::start(afterglow_tests::open_settings(Arc::clone(&storage))).await?;
        post_all(
            &format!("{}/v1/events/{}", server.url, run.name),
            &bodies(&run)?,
        )
        .await?;
        server.stop().await?;
        let (compactor, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
        let mut written = 0;
        for key in compactor.raw_keys().await? {
            written += compactor.compact(&[key]).await?.rows_written;
        }
        let rows = stored_task_rows(&*storage, &run.name).await?;
        check(&run, &rows, "one raw object per compaction")?;
        // Each run found the stored versions from keys held since earlier runs, reading only
        // the keys of files it had not seen: at most every row written once, where scanning
        // would have read every stored row again at each run.
        let held = compactor.stored_keys();
        ensure!(
            held.rows_read() <= written,
            "{}: {} stored keys read, {written} rows written",
            run.name,
            held.rows_read()
        );
        ensure!(held.scans_after_check() == 0 && held.scans_after_error() == 0);
        keys_read += held.rows_read();
    }
    // A run with one raw object has no stored files; the longer ones have.
    ensure!(keys_read > 0, "no run found stored versions from held keys");
    Ok(())
}

/// `serve` queues compaction in memory: a server that stopped after storing Ray's batches but
/// before compacting them (a crash, a kill, a stop while runs were failing) must not lose them.
/// The next start finds every raw object no compaction record names, and its rows agree with
/// Ray; a start after a clean run has nothing to compact.
#[tokio::test]
async fn raw_objects_left_uncompacted_are_compacted_at_the_next_start() -> anyhow::Result<()> {
    use shared::compact::backlog;
    use shared::compact::queue::CompactionQueue;

    let run = FixtureRun::all()?
        .into_iter()
        .next()
        .context("no fixture run")?;
    let (_guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    // The "crashed" server: ingest answered 200 and stored every batch; nothing compacted them.
    let server = TestServer::start(afterglow_tests::open_settings(Arc::clone(&storage))).await?;
    let delivered = bodies(&run)?;
    post_all(
        &format!("{}/v1/events/{}", server.url, run.name),
        &delivered,
    )
    .await?;
    server.stop().await?;
    ensure!(
        stored_task_rows(&*storage, &run.name).await?.is_empty(),
        "nothing compacted yet"
    );
    ensure!(
        storage
            .list(shared::layout::COMPACTED_RECORDS_PREFIX)
            .await?
            .is_empty(),
        "no compaction recorded yet"
    );

    // The next start: everything stored is queued and compacted.
    let raw_objects = {
        let (compactor, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
        let queue = CompactionQueue::spawn(compactor);
        let queued = queue.catch_up().await?;
        queue.idle().await;
        queued
    };
    let stored = storage.list("raw/").await?.len();
    ensure!(
        raw_objects == stored && stored > 0,
        "queued {raw_objects} of {stored} raw objects"
    );
    let rows = stored_task_rows(&*storage, &run.name).await?;
    check(&run, &rows, "compacted at the next start")?;
    ensure!(
        backlog::uncompacted(&*storage).await?.is_empty(),
        "the runs recorded what they compacted"
    );

    // Another start right away: nothing left to compact, and nothing changes.
    let (compactor, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
    let queue = CompactionQueue::spawn(compactor);
    ensure!(queue.catch_up().await? == 0, "compacted again");
    queue.idle().await;
    let again = stored_task_rows(&*storage, &run.name).await?;
    ensure_same(&rows, &again, "a second catch-up")?;
    Ok(())
}

/// `serve` keeps what a fault outlasting a run's retries kept it from compacting: writes
/// refused as by a full disk (no session can be committed), or one raw object that cannot be
/// read (the others are compacted and recorded). Once the fault clears, the same queue compacts
/// the rest with no new key and no restart, and the history equals Ray's. (Before, the keys
/// were left for the next start, however long `serve` ran on.)
#[tokio::test]
async fn serve_compacts_what_a_fault_held_back_once_it_clears_without_a_restart()
-> anyhow::Result<()> {
    use afterglow_tests::faults::Refuses;
    use shared::compact::backlog;

    let run = FixtureRun::named("basic-workload")?;
    for fault in ["a full disk", "an unreadable raw object"] {
        let (_guard, local) = local_storage()?;
        let local: Arc<dyn Storage> = Arc::new(local);
        store_raw(&local, &run, &run.name).await?;
        let raw = shared::compact::raw::list_keys(&*local).await?;
        let first = raw.first().context("nothing stored")?.clone();
        let faulty = Arc::new(if fault == "a full disk" {
            Refuses::writes_under(Arc::clone(&local), "tables/")
        } else {
            Refuses::reads_of(Arc::clone(&local), vec![first.clone()])
        });
        let (compactor, _scratch) = compactor(
            Arc::clone(&faulty) as Arc<dyn Storage>,
            CompactSettings::default(),
        )?;
        let queue = CompactionQueue::spawn(compactor);
        ensure!(queue.catch_up().await? == raw.len());
        let parked = queue.idle().await;
        ensure!(faulty.refused() > 0, "{fault}: nothing was refused");
        let left = backlog::uncompacted(&*local).await?;
        ensure!(
            parked == Some(left.len()),
            "{fault}: idle reports {parked:?} keys parked, {} are not compacted",
            left.len()
        );
        if fault == "a full disk" {
            ensure!(
                left.len() == raw.len(),
                "{fault}: {} of {} left",
                left.len(),
                raw.len()
            );
        } else {
            ensure!(
                left == [first.clone()],
                "{fault}: left {left:?}, not only {first}"
            );
        }

        faulty.clear();
        all_compacted_within(&*local, Duration::from_secs(60))
            .await
            .with_context(|| format!("{fault}, once cleared"))?;
        ensure!(
            queue.idle().await == Some(0),
            "{fault}: keys still parked once all were compacted"
        );
        check(
            &run,
            &stored_task_rows(&*local, &run.name).await?,
            &format!("after {fault} cleared"),
        )?;
    }
    Ok(())
}

/// A session whose commits fail (here its manifest cannot be written; a corrupt stored file
/// would do the same) holds back only its own raw objects: `serve`'s run commits the other
/// sessions it read and records their objects, and parks the failing session's, which are
/// compacted once the fault clears. Both histories then equal Ray's. (Before, the whole run
/// failed, every object in it was parked, and a group that kept failing was split only after
/// some other run had succeeded since: objects parked with a session that always failed could
/// wait for the next start.)
#[tokio::test]
async fn a_session_that_cannot_be_committed_holds_back_only_its_own_objects() -> anyhow::Result<()>
{
    use afterglow_tests::faults::Refuses;
    use shared::compact::backlog;
    use shared::compact::queue::QueueTiming;
    use shared::layout::raw_object_cluster;

    let healthy = FixtureRun::named("basic-workload")?;
    let failing = FixtureRun::named("edge-cases")?;
    // Sorted first, so that a run which stopped at the first failing session would commit
    // nothing of the healthy one.
    let failing_cluster = "always-failing";
    let (_guard, local) = local_storage()?;
    let local: Arc<dyn Storage> = Arc::new(local);
    store_raw(&local, &healthy, &healthy.name).await?;
    store_raw(&local, &failing, failing_cluster).await?;
    let raw = shared::compact::raw::list_keys(&*local).await?;
    let mut failing_keys: Vec<ObjectKey> = raw
        .iter()
        .filter(|key| raw_object_cluster(key).is_some_and(|c| c.as_str() == failing_cluster))
        .cloned()
        .collect();
    failing_keys.sort();
    ensure!(
        !failing_keys.is_empty() && failing_keys.len() < raw.len(),
        "{} of {} objects failing",
        failing_keys.len(),
        raw.len()
    );

    let faulty = Arc::new(Refuses::writes_under(
        Arc::clone(&local),
        "tables/manifests/cluster=always-failing/",
    ));
    let (compactor, _scratch) = compactor(
        Arc::clone(&faulty) as Arc<dyn Storage>,
        CompactSettings::default(),
    )?;
    let timing = QueueTiming {
        retry_delay: Duration::from_millis(10),
        park_first: Duration::from_millis(50),
        park_max: Duration::from_millis(400),
    };
    let queue = CompactionQueue::spawn_with(compactor, timing);
    ensure!(queue.catch_up().await? == raw.len());
    let parked = queue.idle().await;
    ensure!(faulty.refused() > 0, "nothing was refused");
    let mut left = backlog::uncompacted(&*local).await?;
    left.sort();
    ensure!(
        left == failing_keys,
        "{} objects left uncompacted, {} of them the failing session's",
        left.len(),
        failing_keys.len()
    );
    ensure!(
        parked == Some(failing_keys.len()),
        "idle reports {parked:?} keys parked, not the failing session's {}",
        failing_keys.len()
    );
    check(
        &healthy,
        &stored_task_rows(&*local, &healthy.name).await?,
        "beside a session that cannot be committed",
    )?;

    faulty.clear();
    all_compacted_within(&*local, Duration::from_secs(30))
        .await
        .context("the failing session's objects, once the fault cleared")?;
    ensure!(queue.idle().await == Some(0), "keys still parked");
    check(
        &failing,
        &stored_task_rows(&*local, failing_cluster).await?,
        "once its commits were no longer refused",
    )?;
    Ok(())
}

/// Waits until `serve`'s backlog in `storage` holds no uncompacted raw object, for `within` at
/// most.
async fn all_compacted_within(storage: &dyn Storage, within: Duration) -> anyhow::Result<()> {
    let started = tokio::time::Instant::now();
    loop {
        let left = shared::compact::backlog::uncompacted(storage).await?.len();
        if left == 0 {
            return Ok(());
        }
        ensure!(
            started.elapsed() < within,
            "{left} raw objects still not compacted after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Appends to the raw object at `key` a line that is not an event, which compaction quarantines.
async fn add_a_line_that_is_not_an_event(
    storage: &dyn Storage,
    key: &ObjectKey,
) -> anyhow::Result<()> {
    let mut text = afterglow_tests::gunzip(&storage.get(key).await?.body)?;
    text.extend_from_slice(b"not an event\n");
    let body = shared::gzip::gzip(&text)?;
    storage
        .put(key, body.into(), shared::storage::PutMode::Overwrite)
        .await?;
    Ok(())
}

/// A key that breaks every run it is in (here an object with a bad line, whose quarantine
/// cannot be written) holds back only itself in `serve`, even with no other traffic: its run
/// fails as a whole, the run's keys are parked together, and after a few failed tries they are
/// split although no run has succeeded since, until the key is alone. Once the fault clears it
/// is compacted too, and the history equals Ray's. (Before, keys parked together were split only
/// after some other run had succeeded: with no traffic, every object of that run waited for
/// the next start, which failed the same way.)
#[tokio::test]
async fn a_key_that_breaks_every_run_holds_back_only_itself_with_no_other_traffic()
-> anyhow::Result<()> {
    use afterglow_tests::faults::Refuses;
    use shared::compact::backlog;
    use shared::compact::queue::QueueTiming;

    let run = FixtureRun::named("basic-workload")?;
    let (_dir, local) = local_storage()?;
    let local: Arc<dyn Storage> = Arc::new(local);
    store_raw(&local, &run, &run.name).await?;
    let raw = shared::compact::raw::list_keys(&*local).await?;
    ensure!(raw.len() >= 4, "only {} objects", raw.len());
    let spoiled = raw.get(raw.len() / 2).context("a middle object")?.clone();
    add_a_line_that_is_not_an_event(&*local, &spoiled).await?;

    let faulty = Arc::new(Refuses::writes_under(
        Arc::clone(&local),
        shared::layout::QUARANTINE_PREFIX,
    ));
    let (compactor, _scratch) = compactor(
        Arc::clone(&faulty) as Arc<dyn Storage>,
        CompactSettings::default(),
    )?;
    let timing = QueueTiming {
        retry_delay: Duration::from_millis(10),
        park_first: Duration::from_millis(50),
        park_max: Duration::from_millis(400),
    };
    let queue = CompactionQueue::spawn_with(compactor, timing);
    // Every object in one batch: a run without the spoiled one would succeed, which splits
    // the rest by the older rule.
    ensure!(queue.catch_up().await? == raw.len());
    let started = tokio::time::Instant::now();
    loop {
        let left = backlog::uncompacted(&*local).await?;
        if left == [spoiled.clone()] {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "{} of {} objects still uncompacted after 30 s with no other traffic",
            left.len(),
            raw.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(faulty.refused() > 0, "the quarantine was not refused");

    faulty.clear();
    all_compacted_within(&*local, Duration::from_secs(30))
        .await
        .context("the spoiled object, once the fault cleared")?;
    check(
        &run,
        &stored_task_rows(&*local, &run.name).await?,
        "a key that broke every run, compacted once the fault cleared",
    )?;
    Ok(())
}

/// A run that fails as a whole (here its quarantine cannot be written) holds back only its own
/// raw objects when compacting in runs, as `afterglow rebuild` and `compact` do: the later runs
/// still run, and once the fault clears the failed run's objects compact to Ray's history.
/// (Before, the first such run stopped the command, and a rebuild left every later run's
/// history out until it was run again from the start.)
#[tokio::test]
async fn a_run_that_fails_as_a_whole_holds_back_only_its_own_objects() -> anyhow::Result<()> {
    use afterglow_tests::faults::Refuses;

    let run = FixtureRun::named("basic-workload")?;
    let (_dir, local) = local_storage()?;
    let local: Arc<dyn Storage> = Arc::new(local);
    store_raw(&local, &run, &run.name).await?;
    let raw = shared::compact::raw::list_keys(&*local).await?;
    let per_run = std::num::NonZeroUsize::new(4).context("four")?;
    let chunks: Vec<&[ObjectKey]> = raw.chunks(per_run.get()).collect();
    ensure!(chunks.len() >= 3, "only {} runs", chunks.len());
    // One object of a middle run gets a line that is not an event, which is quarantined.
    let failing = *chunks.get(chunks.len() / 2).context("a middle run")?;
    let spoiled = failing.first().context("an object")?;
    add_a_line_that_is_not_an_event(&*local, spoiled).await?;

    let faulty = Arc::new(Refuses::writes_under(
        Arc::clone(&local),
        shared::layout::QUARANTINE_PREFIX,
    ));
    let (compactor, _scratch) = compactor(
        Arc::clone(&faulty) as Arc<dyn Storage>,
        CompactSettings::default(),
    )?;
    let in_runs = compactor.compact_in_runs(&raw, per_run, |_| ()).await;
    ensure!(faulty.refused() > 0, "the quarantine was not refused");
    let failed: Vec<&[ObjectKey]> = in_runs
        .failed_runs
        .iter()
        .map(|run| run.keys.as_slice())
        .collect();
    ensure!(
        failed == [failing],
        "failed runs: {:?}",
        in_runs.failed_runs
    );
    ensure!(
        in_runs.outcome.not_compacted().is_empty(),
        "{:?}",
        in_runs.outcome.failed
    );
    // Every other run ran, those after the failed one included.
    let read = in_runs.outcome.report.raw_objects;
    ensure!(
        read == raw.len() - failing.len(),
        "{read} of {} objects read",
        raw.len()
    );

    faulty.clear();
    compactor.compact(failing).await?;
    check(
        &run,
        &stored_task_rows(&*local, &run.name).await?,
        "a failed run compacted after the others",
    )?;
    Ok(())
}

/// Raw objects are named by ULIDs from the wall clock, which can step back (NTP) or stall behind
/// a slow write. A server that compacted most of a run, then stored the rest under a clock an
/// hour behind and crashed before compacting it, must still find that rest at the next start.
/// (The ULID-time watermark this replaces skipped anything older than its margin.)
#[tokio::test]
async fn raw_objects_written_under_a_stepped_back_clock_are_compacted_at_the_next_start()
-> anyhow::Result<()> {
    use shared::compact::queue::CompactionQueue;
    use shared::layout::{ClusterName, raw_object_key};

    let run = FixtureRun::named("basic-workload")?;
    let (_guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    let delivered = bodies(&run)?;
    let (early, late) = delivered.split_at(delivered.len() / 2);

    // A server that compacts the first half (and records it).
    let (settings, queue, _scratch) = compacting_settings(Arc::clone(&storage))?;
    let server = TestServer::start(settings).await?;
    post_all(&format!("{}/v1/events/{}", server.url, run.name), early).await?;
    queue.idle().await;
    server.stop().await?;
    let compacted: Vec<ObjectKey> = storage
        .list("raw/")
        .await?
        .into_iter()
        .map(|m| m.key)
        .collect();

    // The second half stored, never compacted, under a clock an hour behind.
    let server = TestServer::start(afterglow_tests::open_settings(Arc::clone(&storage))).await?;
    post_all(&format!("{}/v1/events/{}", server.url, run.name), late).await?;
    server.stop().await?;
    let cluster = ClusterName::new(run.name.as_str())?;
    let hour_ago = now_ms()? - 3_600_000;
    let mut moved = 0_u128;
    for meta in storage.list("raw/").await? {
        if compacted.contains(&meta.key) {
            continue;
        }
        let body = storage.get(&meta.key).await?.body;
        let stepped = raw_object_key(&cluster, ulid::Ulid::from_parts(hour_ago, moved))?;
        storage
            .put(&stepped, body, shared::storage::PutMode::Create)
            .await?;
        storage.delete(&meta.key).await?;
        moved += 1;
    }
    ensure!(moved > 0, "nothing was written under the stepped clock");

    // The next start finds exactly those, and the history is whole.
    let (compactor, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
    let queue = CompactionQueue::spawn(compactor);
    let queued = queue.catch_up().await?;
    queue.idle().await;
    ensure!(
        queued == usize::try_from(moved)?,
        "queued {queued} of the {moved} objects written under the stepped clock"
    );
    check(
        &run,
        &stored_task_rows(&*storage, &run.name).await?,
        "after a clock step",
    )?;
    Ok(())
}

/// Placement-group events (none appeared in the captures; these follow Ray's proto) land in the
/// `placement_groups` table.
#[tokio::test]
async fn placement_group_events_are_compacted_into_their_table() -> anyhow::Result<()> {
    let body = br#"[
      {"eventId": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==", "eventType": "PLACEMENT_GROUP_DEFINITION_EVENT",
       "timestamp": "2026-11-22T06:11:54.347Z", "sessionName": "session_pg",
       "placementGroupDefinitionEvent": {"placementGroupId": "l10+4KP1bNCzm82Nq5MCAAAA",
         "name": "capture-pg", "strategy": "STRICT_PACK", "creatorJobId": "AgAAAA==",
         "bundles": [{"bundleIndex": 0, "unitResources": {"CPU": 1.0}}]}},
      {"eventId": "AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==", "eventType": "PLACEMENT_GROUP_LIFECYCLE_EVENT",
       "timestamp": "2026-11-22T06:11:58Z", "sessionName": "session_pg",
       "placementGroupLifecycleEvent": {"placementGroupId": "l10+4KP1bNCzm82Nq5MCAAAA",
         "stateTransitions": [{"state": "CREATED", "timestamp": "2026-11-22T06:11:55.308Z"}]}}
    ]"#;
    let (_guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    ingest_and_compact(Arc::clone(&storage), "pg", &[body.to_vec()]).await?;
    let entities = stored_entities(&*storage, "pg").await?;
    let group = entities
        .placement_groups
        .get("975d3ee0a3f56cd0b39bcd8dab9302000000")
        .context("placement group")?;
    ensure!(group.state() == Some("CREATED"));
    let facts = group.definition.as_ref().context("definition")?;
    ensure!(facts.value.strategy == "STRICT_PACK" && facts.value.name == "capture-pg");
    Ok(())
}

/// One SQS message per stored raw object of `cluster` (ids `m0`, `m1`, … in key order), each
/// notifying the object with its real size.
/// One SQS message: its id, the record as Lambda delivers it, and the notified object's size.
type Sqs = (String, serde_json::Value, u64);

async fn sqs_messages_for(storage: &dyn Storage, cluster: &str) -> anyhow::Result<Vec<Sqs>> {
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

fn sqs_record(id: &str, key: &str, size: u64) -> serde_json::Value {
    serde_json::json!({
        "messageId": id, "eventSource": "aws:sqs",
        "body": s3_notification_sized(&[(key, size)]).to_string(),
        "attributes": {}, "messageAttributes": {}
    })
}

/// Runs the compact handler on `records` and returns the ids it asks SQS to redeliver.
async fn handle_batch(
    storage: &Arc<dyn Storage>,
    records: &[serde_json::Value],
    limits: &BatchLimits,
    context: lambda_runtime::Context,
) -> anyhow::Result<Vec<String>> {
    let (compactor, _scratch) = compactor(Arc::clone(storage), CompactSettings::default())?;
    invoke_in(&function(compactor, limits.clone()), records, context).await
}

/// A local store holding basic-workload's raw objects for `cluster`, not compacted, and one SQS
/// message per object (see [`sqs_messages_for`]).
async fn uncompacted_batch(
    cluster: &str,
) -> anyhow::Result<(FixtureRun, tempfile::TempDir, Arc<dyn Storage>, Vec<Sqs>)> {
    let (run, guard, storage) = uncompacted(cluster).await?;
    let messages = sqs_messages_for(&*storage, cluster).await?;
    Ok((run, guard, storage, messages))
}

/// A local store holding basic-workload's raw objects for `cluster`, not compacted.
async fn uncompacted(
    cluster: &str,
) -> anyhow::Result<(FixtureRun, tempfile::TempDir, Arc<dyn Storage>)> {
    let run = FixtureRun::named("basic-workload")?;
    let (guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    store_raw(&storage, &run, cluster).await?;
    Ok((run, guard, storage))
}

/// Milliseconds since the epoch, now.
fn now_ms() -> anyhow::Result<u64> {
    Ok(u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?)
}

/// One unreadable raw object in a batch fails only the message that names it, and the rest of
/// the batch is still compacted in one run. (It used to fail the whole run, and the fallback
/// then compacted the batch one message at a time: 500 runs, past the function's timeout.)
#[tokio::test]
async fn an_unreadable_object_fails_only_its_message_and_the_batch_runs_once() -> anyhow::Result<()>
{
    let (run, _guard, storage, messages) = uncompacted_batch("unreadable").await?;
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
    let failed = handle_batch(
        &storage,
        &records,
        &BatchLimits::default(),
        Default::default(),
    )
    .await?;
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
    check(
        &run,
        &stored_task_rows(&*storage, "unreadable").await?,
        "a batch with an unreadable object",
    )?;
    Ok(())
}

/// A batch naming more raw bytes than one run may take compacts the messages up to the cap;
/// with no queue to send the rest back to, it reports them as failures, and redelivered they
/// complete the history.
#[tokio::test]
async fn a_batch_past_its_byte_cap_leaves_the_rest_for_redelivery() -> anyhow::Result<()> {
    let (run, _guard, storage, messages) = uncompacted_batch("capped").await?;
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
    let failed = handle_batch(
        &storage,
        &redelivered,
        &BatchLimits::default(),
        Default::default(),
    )
    .await?;
    ensure!(failed.is_empty(), "redelivery failed: {failed:?}");
    check(
        &run,
        &stored_task_rows(&*storage, "capped").await?,
        "a capped batch and its redelivery",
    )?;
    Ok(())
}

/// A batch past its byte cap sends the messages past the cap back to its queue as new
/// messages, deliverable at once, and does not report them as failures: SQS would redeliver
/// those only after the 30-minute visibility timeout, each time using up one of the receives
/// before the dead-letter queue. Delivered from the queue, they complete the history. When the
/// queue cannot take them they are reported as failures after all, each once.
#[tokio::test]
async fn a_batch_past_its_byte_cap_sends_the_rest_back_to_its_queue() -> anyhow::Result<()> {
    let Some(moto) =
        Moto::start("a_batch_past_its_byte_cap_sends_the_rest_back_to_its_queue").await?
    else {
        return Ok(());
    };
    let queue_url = moto.create_queue("afterglow-compact").await?;
    let (run, _guard, storage, messages) = uncompacted_batch("deferred").await?;
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
    let (compacting, _scratch) = compactor(Arc::clone(&storage), keeping_deltas())?;
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

    let (compacting, _scratch) = compactor(Arc::clone(&storage), keeping_deltas())?;
    let capped = CompactFunction {
        limits,
        ..queueing_to(&moto, &queue_url, compacting)
    };
    let failed = invoke(&capped, &records).await?;
    ensure!(
        failed.is_empty(),
        "messages past the cap were reported as failures: {failed:?}"
    );
    let sessions = storage
        .list("tables/manifests/cluster=deferred/")
        .await?
        .len();
    // The run's quiet checks (one per session, not delayed here) share the queue.
    let queued = receive(
        &moto,
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
    let (compacting, _scratch) = compactor(Arc::clone(&storage), keeping_deltas())?;
    let failed = invoke(&queueing_to(&moto, &queue_url, compacting), &delivered).await?;
    ensure!(
        failed.is_empty(),
        "the messages sent back failed: {failed:?}"
    );
    check(
        &run,
        &stored_task_rows(&*storage, "deferred").await?,
        "a capped batch and the messages it sent back",
    )?;
    Ok(())
}

/// A batch that cannot be compacted before the invocation's deadline (less the margin kept for
/// answering) is reported unattempted, message by message, instead of being cut off by Lambda
/// with no answer (which would count a receive against every message).
#[tokio::test]
async fn a_batch_past_the_deadline_is_answered_unattempted() -> anyhow::Result<()> {
    let (_run, _guard, storage, messages) = uncompacted_batch("late").await?;
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

/// Retention removes a session whole once its newest event is older than the retention: its
/// manifest, then every file the manifest named, then its catalog entry. Newer sessions are
/// left alone, and still agree with Ray.
#[tokio::test]
async fn expiry_removes_old_sessions_whole_and_keeps_the_rest() -> anyhow::Result<()> {
    use shared::tables::catalog;

    let (_guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    let old_run = FixtureRun::named("basic-workload")?;
    let new_run = FixtureRun::named("edge-cases")?;
    ingest_and_compact(Arc::clone(&storage), "old", &bodies(&old_run)?).await?;
    ingest_and_compact(Arc::clone(&storage), "new", &bodies(&new_run)?).await?;

    // The captures' event times are fixed; place the sessions in time relative to now.
    let now = i64::try_from(now_ms()?)?;
    let day = 86_400_000;
    age_sessions(&*storage, "old", now - 10 * day).await?;
    age_sessions(&*storage, "new", now - day / 24).await?;
    let mut old_files = Vec::new();
    let old_manifests = storage.list("tables/manifests/cluster=old/").await?;
    for meta in &old_manifests {
        let manifest = shared::tables::manifest::load(&*storage, &meta.key)
            .await?
            .manifest;
        old_files.extend(
            manifest
                .task_attempts
                .all()
                .chain(manifest.entities.values())
                .flat_map(|file| file.keys().cloned()),
        );
    }
    ensure!(
        old_files
            .iter()
            .any(|key| key.as_str().contains("/rollup-")),
        "the old session's files include their rollups"
    );
    ensure!(!old_files.is_empty(), "the old session has no files");

    let (compactor, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
    let expired = compactor
        .expire_sessions(std::time::Duration::from_secs(7 * 86_400), now)
        .await?;
    ensure!(
        expired == old_manifests.len(),
        "expired {expired} sessions, {} were old",
        old_manifests.len()
    );
    for meta in &old_manifests {
        let left = shared::tables::manifest::load(&*storage, &meta.key)
            .await?
            .manifest;
        ensure!(
            left.task_attempts.all().next().is_none() && left.entities.is_empty(),
            "an old manifest still names files"
        );
    }
    for file in &old_files {
        ensure!(
            matches!(
                storage.get(file).await,
                Err(shared::storage::StorageError::NotFound { .. })
            ),
            "{file} was left behind"
        );
    }
    let (after, _) = catalog::load(&*storage).await?;
    ensure!(
        !after.clusters.contains_key("old"),
        "the catalog still lists the old cluster"
    );
    ensure!(
        after.clusters.contains_key("new"),
        "the recent cluster was removed"
    );
    check(
        &new_run,
        &stored_task_rows(&*storage, "new").await?,
        "a recent session after expiry",
    )?;
    Ok(())
}

/// Sets the newest event time of every session of `cluster` to `last_ms`, in its manifest and
/// in the catalog, as if its events had been that old.
async fn age_sessions(storage: &dyn Storage, cluster: &str, last_ms: i64) -> anyhow::Result<()> {
    use shared::tables::{catalog, manifest};
    let cluster_name = shared::layout::ClusterName::new(cluster)?;
    for meta in storage
        .list(&format!("tables/manifests/cluster={cluster}/"))
        .await?
    {
        let read = manifest::load(storage, &meta.key).await?;
        let mut aged = read.manifest;
        aged.stats.last_ms = Some(last_ms);
        manifest::store(storage, &meta.key, &aged, read.etag.as_ref()).await?;
        let (_, session) = shared::layout::manifest_session(&meta.key).context("a manifest key")?;
        catalog::record(storage, &cluster_name, &session, &aged.stats, None).await?;
    }
    Ok(())
}

/// A compaction committing into a session while expiry removes it: the manifest expiry read is
/// replaced before expiry writes. The session is kept whole (manifest, files, catalog entry),
/// where deleting the manifest unconditionally lost the commit and orphaned every file.
#[tokio::test]
async fn a_session_written_while_it_expires_is_kept() -> anyhow::Result<()> {
    use afterglow_tests::faults::CommitsAfterRead;

    let (_guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    let run = FixtureRun::named("basic-workload")?;
    ingest_and_compact(Arc::clone(&storage), "racing", &bodies(&run)?).await?;
    let now = i64::try_from(now_ms()?)?;
    let day = 86_400_000;
    age_sessions(&*storage, "racing", now - 10 * day).await?;

    let racing = Arc::new(CommitsAfterRead::new(
        Arc::clone(&storage),
        "tables/manifests/",
        now,
    ));
    let (compactor, _scratch) = compactor(
        Arc::clone(&racing) as Arc<dyn Storage>,
        CompactSettings::default(),
    )?;
    let expired = compactor
        .expire_sessions(std::time::Duration::from_secs(7 * 86_400), now)
        .await?;
    ensure!(racing.committed(), "no commit raced the expiry");
    ensure!(expired == 0, "a session written meanwhile was expired");
    check(
        &run,
        &stored_task_rows(&*storage, "racing").await?,
        "a session written while it expired",
    )?;
    let (catalog, _) = shared::tables::catalog::load(&*storage).await?;
    ensure!(
        catalog.clusters.contains_key("racing"),
        "the catalog lost the session"
    );
    Ok(())
}

/// `rebuild` replays the raw objects, which expire (`RawRetentionDays`) while tables may be kept
/// longer: once a raw object the tables were built from is gone, a rebuild would drop history
/// that only the tables still hold, so it is refused.
#[tokio::test]
async fn rebuild_is_refused_once_raw_objects_the_tables_came_from_are_gone() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let (_guard, local) = local_storage()?;
    let storage: Arc<dyn Storage> = Arc::new(local);
    ingest_and_compact(Arc::clone(&storage), "expiring", &bodies(&run)?).await?;
    let (compactor, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
    compactor
        .ensure_rebuildable()
        .await
        .context("refused while every raw object is stored")?;
    // Keys are ordered by hour and ULID: the first is the oldest, the first to expire.
    let oldest = storage
        .list("raw/expiring/")
        .await?
        .into_iter()
        .next()
        .context("no raw object")?;
    storage.delete(&oldest.key).await?;
    match compactor.ensure_rebuildable().await {
        Err(shared::compact::CompactError::RawHistoryGone { cluster, .. }) => {
            ensure!(cluster == "expiring", "refused for {cluster}");
            Ok(())
        }
        other => anyhow::bail!("a rebuild that drops history was allowed: {other:?}"),
    }
}

/// A store as a rebuild in runs leaves it: basic-workload under each of `clusters`, compacted
/// in runs of four objects, every object recorded as compacted. Each run folds the small
/// session, so every session keeps the files its folds replaced until their grace period is
/// over and a quiet check deletes them. A `serve` stopped before its quiet checks ran leaves
/// the same. With the settings of the tests that tidy it: a short grace and quiet period.
struct UntidyStore {
    run: FixtureRun,
    _dir: tempfile::TempDir,
    local: Arc<dyn Storage>,
    settings: CompactSettings,
    clusters: Vec<String>,
}

impl UntidyStore {
    async fn new(clusters: &[&str]) -> anyhow::Result<Self> {
        use shared::compact::backlog;

        let run = FixtureRun::named("basic-workload")?;
        let (dir, local) = local_storage()?;
        let local: Arc<dyn Storage> = Arc::new(local);
        for cluster in clusters {
            store_raw(&local, &run, cluster).await?;
        }
        let raw = shared::compact::raw::list_keys(&*local).await?;
        let settings = CompactSettings {
            retire_grace: Duration::from_millis(300),
            fold: FoldPolicy {
                quiet: Duration::from_millis(100),
                ..FoldPolicy::default()
            },
            ..CompactSettings::default()
        };
        let (earlier, _scratch) = compactor(Arc::clone(&local), settings.clone())?;
        let per_run = std::num::NonZeroUsize::new(4).context("four")?;
        let in_runs = earlier.compact_in_runs(&raw, per_run, |_| ()).await;
        ensure!(in_runs.not_compacted().is_empty(), "{in_runs:?}");
        backlog::record(&*local, &raw).await?;
        let store = Self {
            run,
            _dir: dir,
            local,
            settings,
            clusters: clusters
                .iter()
                .map(|cluster| (*cluster).to_owned())
                .collect(),
        };
        for cluster in &store.clusters {
            ensure!(
                store.retired(cluster).await? > 0,
                "{cluster}: the runs replaced no file"
            );
        }
        Ok(store)
    }

    /// How many replaced files the manifest of `cluster`'s only session still keeps.
    async fn retired(&self, cluster: &str) -> anyhow::Result<usize> {
        use shared::layout::ClusterName;
        use shared::tables::manifest;

        let manifests = self
            .local
            .list(&shared::layout::cluster_manifests_prefix(
                &ClusterName::new(cluster)?,
            ))
            .await?;
        let [only] = manifests.as_slice() else {
            anyhow::bail!("{cluster}: {} manifests", manifests.len());
        };
        Ok(manifest::load(&*self.local, &only.key)
            .await?
            .manifest
            .retired
            .len())
    }

    /// Waits until no session keeps a replaced file (20 s at most), then checks every
    /// cluster's rows against Ray's.
    async fn tidied(&self) -> anyhow::Result<()> {
        let started = tokio::time::Instant::now();
        for cluster in &self.clusters {
            while self.retired(cluster).await? > 0 {
                ensure!(
                    started.elapsed() < Duration::from_secs(20),
                    "{cluster}: {} replaced files still kept after 20 s",
                    self.retired(cluster).await?
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        for cluster in &self.clusters {
            check(
                &self.run,
                &stored_task_rows(&*self.local, cluster).await?,
                &format!("{cluster}, tidied by a later serve"),
            )?;
        }
        Ok(())
    }
}

/// `serve` started on a store whose sessions still hold deltas or replaced files tidies them
/// once they have been quiet, although no commit of its own asks for those checks (see
/// [`UntidyStore`]). (Before, the files stayed until the session changed again.)
#[tokio::test]
async fn serve_tidies_at_start_what_an_earlier_process_left_untidy() -> anyhow::Result<()> {
    let store = UntidyStore::new(&["basic-workload"]).await?;
    let (compactor, _scratch) = compactor(Arc::clone(&store.local), store.settings.clone())?;
    let queue = CompactionQueue::spawn(compactor);
    ensure!(queue.catch_up().await? == 0, "objects left to compact");
    store.tidied().await
}

/// The sessions a restart finds untidy are all due at the same moment; `serve` tidies them
/// one at a time, as the compact function tidies one invocation's checks. (Before, each tidy
/// ran in a task of its own at once: after a restart over many large sessions, as many folds,
/// each holding a session's rows, ran together.) Writes under `tables/` are slowed so that
/// tidies started together overlap; which cluster each write is for shows whether they did.
#[tokio::test]
async fn serve_tidies_what_it_finds_untidy_one_session_at_a_time() -> anyhow::Result<()> {
    use afterglow_tests::faults::SlowWrites;

    let store = UntidyStore::new(&["first", "second", "third"]).await?;
    let slow = Arc::new(SlowWrites::under(
        Arc::clone(&store.local),
        "tables/",
        Duration::from_millis(50),
    ));
    let (compactor, _scratch) = compactor(
        Arc::clone(&slow) as Arc<dyn Storage>,
        store.settings.clone(),
    )?;
    let queue = CompactionQueue::spawn(compactor);
    ensure!(queue.catch_up().await? == 0, "objects left to compact");
    store.tidied().await?;
    ensure!(slow.writes() > 0, "the tidies wrote nothing");
    ensure!(
        slow.most_clusters_at_once() == 1,
        "{} sessions were tidied at once",
        slow.most_clusters_at_once()
    );
    Ok(())
}

/// A quiet check that fails every time (here its session's manifest cannot be written) waits
/// twice as long after each failure, up to the queue's longest wait for what failed; once the
/// fault clears, the session is tidied. (Before, it tried again every quiet period for as long
/// as the fault lasted, each time taking the one tidy permit, and where the session needed a
/// fold, a fold's memory and cores; this session needs none, so its tries are quick.) Each try
/// stops at its first refused write, so the refusals, watched every 10 ms, show when the tries
/// were.
#[tokio::test]
async fn a_quiet_check_that_keeps_failing_waits_longer_each_time() -> anyhow::Result<()> {
    use afterglow_tests::faults::Refuses;
    use shared::compact::queue::QueueTiming;

    let store = UntidyStore::new(&["basic-workload"]).await?;
    let refusing = Arc::new(Refuses::writes_under(Arc::clone(&store.local), "tables/"));
    let (compactor, _scratch) = compactor(
        Arc::clone(&refusing) as Arc<dyn Storage>,
        store.settings.clone(),
    )?;
    let timing = QueueTiming {
        park_max: Duration::from_millis(1600),
        ..QueueTiming::default()
    };
    let queue = CompactionQueue::spawn_with(compactor, timing);
    ensure!(queue.catch_up().await? == 0, "objects left to compact");
    let watching = tokio::time::Instant::now();
    let mut refused = 0;
    let mut tries: Vec<tokio::time::Instant> = Vec::new();
    while watching.elapsed() < Duration::from_millis(3500) {
        let now = refusing.refused();
        if now > refused {
            // Refusals closer than 80 ms, under the quiet period of 100 ms, are one try's.
            if tries
                .last()
                .is_none_or(|last| last.elapsed() >= Duration::from_millis(80))
            {
                tries.push(tokio::time::Instant::now());
            }
            refused = now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let gaps: Vec<u128> = tries
        .windows(2)
        .map(|pair| (pair[1] - pair[0]).as_millis())
        .collect();
    ensure!(
        tries.len() >= 3,
        "only {} tries in 3.5 s: {gaps:?} ms apart",
        tries.len()
    );
    // Doubling from the quiet period: 200, 400, 800, 1600 ms apart, so at most 5 tries in
    // 3.5 s; every quiet period would be about 30.
    ensure!(
        tries.len() <= 6,
        "{} tries in 3.5 s, {gaps:?} ms apart: a failing check does not wait longer",
        tries.len()
    );
    refusing.clear();
    store.tidied().await
}

/// `serve` does not wait, before it answers, for the scan that finds untidy sessions: it reads
/// one manifest per session, over a bucket one request each. Here those reads are held; the
/// start must not be, and the sessions are tidied once the reads go through. (Before, the
/// start read every manifest first.)
#[tokio::test]
async fn serve_starts_before_its_scan_for_untidy_sessions_ends() -> anyhow::Result<()> {
    use afterglow_tests::faults::HeldReads;

    let store = UntidyStore::new(&["basic-workload"]).await?;
    let held = Arc::new(HeldReads::under(
        Arc::clone(&store.local),
        shared::layout::MANIFESTS_PREFIX,
    ));
    let (compactor, _scratch) = compactor(
        Arc::clone(&held) as Arc<dyn Storage>,
        store.settings.clone(),
    )?;
    let queue = CompactionQueue::spawn(compactor);
    let started = tokio::time::timeout(Duration::from_secs(10), queue.catch_up()).await;
    ensure!(
        matches!(started, Ok(Ok(0))),
        "the start waited for the manifests: {started:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        store.retired("basic-workload").await? > 0,
        "tidied without reading its manifest"
    );
    held.release();
    store.tidied().await
}
