//! Compaction end to end: Ray's captured bodies are posted to ingest, compacted into Parquet,
//! and the rows a reader sees are compared with Ray's own state-API output. Also: order and
//! duplicates change nothing, `rebuild` gives the same rows, racing compactions both land,
//! unreadable events are quarantined, and the Lambda handler decodes SQS/S3 notifications.

use std::sync::Arc;

use afterglow_tests::ray::{LOSSY_RUN, OurRows, check};
use afterglow_tests::{
    FixtureRun, TestServer, bodies, compacting_settings, compactor, local_storage, post_all,
    raw_events, shuffled, stored_entities, stored_spans, stored_task_rows,
};
use anyhow::{Context as _, ensure};
use shared::compact::CompactSettings;
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

afterglow_tests::for_each_backend!(compacted_rows_agree_with_ray, racing_compactions_both_land);

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
        max_deltas: 3,
        ..CompactSettings::default()
    };
    let (compactor, _scratch) = compactor(Arc::clone(&storage), settings)?;
    for key in compactor.raw_keys().await? {
        compactor.compact(&[key]).await?;
    }
    let manifests = storage.list("tables/manifests/cluster=fold/").await?;
    ensure!(manifests.len() == 1, "one session, one manifest");
    let manifest = shared::compact::manifest::load(&*storage, &manifests[0].key)
        .await?
        .manifest;
    ensure!(manifest.task_attempts.base.len() == 1, "{manifest:?}");
    ensure!(manifest.task_attempts.deltas.len() <= 3, "{manifest:?}");
    ensure!(
        !manifest.retired.is_empty(),
        "superseded files wait out the grace period"
    );
    for retired in &manifest.retired {
        let key = ObjectKey::new(retired.key.clone())?;
        ensure!(
            storage.get(&key).await.is_ok(),
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
    let (compactor, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
    for key in compactor.raw_keys().await? {
        compactor.compact(&[key]).await?;
    }
    let manifests = storage.list("tables/manifests/cluster=quiet/").await?;
    ensure!(manifests.len() == 1, "one session, one manifest");
    let before = shared::compact::manifest::load(&*storage, &manifests[0].key)
        .await?
        .manifest;
    ensure!(before.task_attempts.deltas.len() > 1, "{before:?}");
    ensure!(compactor.fold().await? == 1, "one session folded");
    let after = shared::compact::manifest::load(&*storage, &manifests[0].key)
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
    let response = afterglow::compact::handle(&compactor, "", event)
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

/// An S3 `ObjectCreated` notification in the shape S3 sends (keys form-URL-encoded).
fn s3_notification(keys: &[&str]) -> serde_json::Value {
    let records: Vec<serde_json::Value> = keys
        .iter()
        .map(|key| {
            serde_json::json!({
                "eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1",
                "eventTime": "2026-11-22T06:11:37.845Z", "eventName": "ObjectCreated:Put",
                "userIdentity": {"principalId": "AWS:AIDAEXAMPLE"},
                "requestParameters": {"sourceIPAddress": "127.0.0.1"},
                "responseElements": {"x-amz-request-id": "C3D13FE58DE4C810", "x-amz-id-2": "FMyUVURIY8"},
                "s3": {"s3SchemaVersion": "1.0", "configurationId": "raw-objects",
                       "bucket": {"name": "b", "ownerIdentity": {"principalId": "A3NL1KOZZKExample"},
                                  "arn": "arn:aws:s3:::b"},
                       "object": {"key": key.replace('/', "%2F"), "size": 1024,
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
    afterglow::compact::handle(&compactor, "", event)
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
        for key in compactor.raw_keys().await? {
            compactor.compact(&[key]).await?;
        }
        let rows = stored_task_rows(&*storage, &run.name).await?;
        check(&run, &rows, "one raw object per compaction")?;
    }
    Ok(())
}

/// `serve` queues compaction in memory: a server that stopped after storing Ray's batches but
/// before compacting them (a crash, a kill, three failed runs) must not lose them. The next
/// start finds them through the recorded watermark, and its rows agree with Ray; a start after
/// a clean run re-compacts only the last minute, and changes no row.
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
        backlog::load(&*storage).await?.is_none(),
        "no watermark yet"
    );

    // The next start: everything stored is queued and compacted.
    let raw_objects = {
        let (compactor, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
        let queue = CompactionQueue::spawn(compactor);
        let queued = queue.catch_up(&*storage).await?;
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
        backlog::load(&*storage).await?.is_some(),
        "the run recorded its watermark"
    );

    // Another start right away: the objects are within a minute of the watermark, so they are
    // compacted again, and nothing changes.
    let (compactor, _scratch) = compactor(Arc::clone(&storage), CompactSettings::default())?;
    let queue = CompactionQueue::spawn(compactor);
    queue.catch_up(&*storage).await?;
    queue.idle().await;
    let again = stored_task_rows(&*storage, &run.name).await?;
    ensure_same(&rows, &again, "a second catch-up")?;
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
