//! The published tables in the Glue Data Catalog (moto's server on 127.0.0.1) over S3
//! (SeaweedFS), published as they are on AWS: the compact function, after its commit, sends one
//! sync request per table to an SQS FIFO queue, each in its table's message group, and the
//! catalog function, run on those messages, creates each table in the catalog. PyIceberg's Glue
//! catalog, and DuckDB reading the metadata file the catalog names, read exactly the rows
//! `afterglow sql` answers; with Glue out of reach, every request is handed back to be made
//! again and nothing is published. A catalog update that loses a race with another sync (injected:
//! moto does not check Glue's `VersionId`) is redone without taking the table back to an older
//! version, and a table another writer committed to is reported and left as it is, while the
//! function's sweep publishes the others.

use std::collections::BTreeSet;
use std::sync::Arc;

use afterglow::catalog::{CatalogFunction, handle};
use afterglow::compact::CompactFunction;
use afterglow_tests::glue_race::LosesFirstUpdate;
use afterglow_tests::moto::Moto;
use afterglow_tests::scenario::Scenario;
use afterglow_tests::{FixtureRun, compactor, keeping_deltas};
use anyhow::{Context as _, ensure};
use aws_sdk_sqs::types::MessageSystemAttributeName;
use bytes::Bytes;
use shared::compact::schedule::batch::BatchLimits;
use shared::iceberg::{GlueCatalog, Reads, SyncQueue, TableMetadata, publish};
use shared::keys;
use shared::storage::{PutMode, Storage};
use shared::tables::published::published_tables;

use super::readers::{Found, readers_agree, readers_python};
use crate::compact::sqs;

/// The Glue database.
const DATABASE: &str = "afterglow";

/// The clusters the run is compacted into, one after the other.
const CLUSTERS: [&str; 2] = ["glue-a", "glue-b"];

fn now_ms() -> anyhow::Result<i64> {
    Ok(i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?)
}

/// Compacts `cluster`'s raw objects with the compact function, as Lambda delivers their
/// notifications.
async fn compact_cluster(
    function: &CompactFunction,
    storage: &Arc<dyn Storage>,
    cluster: &str,
) -> anyhow::Result<()> {
    let records: Vec<serde_json::Value> = sqs::sqs_messages_for(&**storage, cluster)
        .await?
        .into_iter()
        .map(|(_, record, _)| record)
        .collect();
    let failed = sqs::invoke(function, &records).await?;
    ensure!(failed.is_empty(), "{cluster}: compaction failed {failed:?}");
    Ok(())
}

/// Every message waiting on the FIFO queue, received and deleted as Lambda's poller would, as
/// the SQS records Lambda hands the function; insists that each names a table in its table's
/// message group.
async fn take_requests(moto: &Moto, queue_url: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut records = Vec::new();
    loop {
        let received = moto
            .sqs()
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .send()
            .await
            .context("ReceiveMessage")?;
        let messages = received.messages();
        if messages.is_empty() {
            return Ok(records);
        }
        for message in messages {
            let body = message.body().context("no body")?;
            let group = message
                .attributes()
                .and_then(|attributes| attributes.get(&MessageSystemAttributeName::MessageGroupId))
                .context("no message group")?;
            let request: serde_json::Value = serde_json::from_str(body)?;
            ensure!(
                request["table"] == group.as_str(),
                "a request in another table's group: {body} in {group}"
            );
            records.push(serde_json::json!({
                "messageId": message.message_id().context("no id")?,
                "eventSource": "aws:sqs",
                "body": body,
                "attributes": { "MessageGroupId": group },
                "messageAttributes": {},
            }));
            moto.sqs()
                .delete_message()
                .queue_url(queue_url)
                .receipt_handle(message.receipt_handle().context("no receipt")?)
                .send()
                .await
                .context("DeleteMessage")?;
        }
    }
}

/// Runs the catalog function on `records`; returns the ids it asks SQS to redeliver.
async fn run_catalog(
    function: &CatalogFunction,
    records: &[serde_json::Value],
) -> anyhow::Result<Vec<String>> {
    let event = lambda_runtime::LambdaEvent::new(
        serde_json::json!({ "Records": records }),
        lambda_runtime::Context::default(),
    );
    let response = handle(function, event)
        .await
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    sqs::redelivered(&response)
}

/// The metadata location the catalog's `table` points at.
async fn pointer(moto: &Moto, table: &str) -> anyhow::Result<String> {
    let found = moto
        .glue()
        .get_table()
        .database_name(DATABASE)
        .name(table)
        .send()
        .await
        .context("GetTable")?;
    found
        .table()
        .and_then(|table| table.parameters())
        .and_then(|parameters| parameters.get("metadata_location"))
        .cloned()
        .with_context(|| format!("{table} has no metadata_location"))
}

#[tokio::test]
async fn glue_catalog_tables_read_what_afterglow_answers() -> anyhow::Result<()> {
    let test = "glue_catalog_tables_read_what_afterglow_answers";
    let Some(python) = readers_python()? else {
        return Ok(());
    };
    let Some(storage) = afterglow_tests::s3_storage(test).await else {
        return Ok(());
    };
    let storage: Arc<dyn Storage> = Arc::new(storage);
    let Some(moto) = Moto::start(test).await? else {
        return Ok(());
    };
    moto.create_glue_database(DATABASE).await?;
    let queue_url = moto.create_fifo_queue("afterglow-catalog.fifo").await?;
    let found = Found::Glue {
        database: DATABASE,
        endpoint: moto.endpoint(),
    };
    let run = FixtureRun::named("basic-workload")?;
    let [first, second] = CLUSTERS;
    let scenario = Scenario::over(Arc::clone(&storage))
        .with_raw(&run, first)
        .await?
        .with_raw(&run, second)
        .await?;
    let (compacting, _scratch) = scenario.compactor(keeping_deltas())?;
    let compact = CompactFunction {
        sync: Some(SyncQueue::new(moto.sqs(), queue_url.clone())),
        ..sqs::function(compacting, BatchLimits::default())
    };
    let tables: BTreeSet<&str> = published_tables().iter().map(|table| table.name).collect();

    compact_cluster(&compact, &storage, first).await?;
    let requests = take_requests(&moto, &queue_url).await?;
    let requested: BTreeSet<&str> = requests
        .iter()
        .filter_map(|record| record["attributes"]["MessageGroupId"].as_str())
        .collect();
    ensure!(requested == tables, "one request per table: {requested:?}");
    // Glue out of reach: every request is handed back to SQS to be made again, and nothing is
    // published meanwhile (a table is synced only once its catalog entry has been read).
    let unreachable = GlueCatalog::new(
        aws_sdk_glue::Client::from_conf(
            moto.glue()
                .config()
                .to_builder()
                .endpoint_url("http://127.0.0.1:9")
                .retry_config(
                    aws_sdk_glue::config::retry::RetryConfig::standard().with_max_attempts(1),
                )
                .build(),
        ),
        DATABASE,
    );
    let out_of_reach = CatalogFunction {
        storage: Arc::clone(&storage),
        catalog: unreachable,
    };
    let failed = run_catalog(&out_of_reach, &requests).await?;
    ensure!(
        failed.len() == requests.len(),
        "with Glue out of reach, {} of {} requests were handed back",
        failed.len(),
        requests.len()
    );
    let written = storage.list(keys::ICEBERG_PREFIX).await?;
    ensure!(
        written.is_empty(),
        "with Glue out of reach, {} Iceberg files were written",
        written.len()
    );

    let function = CatalogFunction {
        storage: Arc::clone(&storage),
        catalog: GlueCatalog::new(moto.glue(), DATABASE),
    };
    let failed = run_catalog(&function, &requests).await?;
    ensure!(failed.is_empty(), "the first sync failed {failed:?}");
    ensure!(
        pointer(&moto, "task_attempts")
            .await?
            .ends_with("/metadata/v1.metadata.json"),
        "the catalog does not point at the first version"
    );
    readers_agree(&python, &found, &storage, &run, &[first], "in Glue").await?;

    // The second cluster's commit asks again. Its catalog update loses a race: while it waits,
    // another sync folds both sessions and publishes them (version 3 of task_attempts, where
    // the delayed update would point at version 2).
    compact_cluster(&compact, &storage, second).await?;
    let requests = take_requests(&moto, &queue_url).await?;
    let rival_storage = Arc::clone(&storage);
    let rival_glue = moto.glue();
    let race = LosesFirstUpdate::new(
        shared::aws::http_client(),
        Box::new(move || {
            Box::pin(async move {
                let outcome = async {
                    let (folding, _scratch) =
                        compactor(Arc::clone(&rival_storage), keeping_deltas())?;
                    ensure!(folding.fold().await? == 2, "the rival folded both sessions");
                    let catalog = GlueCatalog::new(rival_glue, DATABASE);
                    for (table, outcome) in publish(
                        &rival_storage,
                        Some(&catalog),
                        &published_tables(),
                        Reads::Every,
                        now_ms()?,
                    )
                    .await?
                    {
                        outcome.with_context(|| format!("the rival's publish of {table}"))?;
                    }
                    anyhow::Ok(())
                }
                .await;
                if let Err(err) = outcome {
                    panic!("the rival sync failed: {err:#}");
                }
            })
        }),
    );
    let racing = CatalogFunction {
        storage: Arc::clone(&storage),
        catalog: GlueCatalog::new(moto.glue_over(race.shared()), DATABASE),
    };
    let failed = run_catalog(&racing, &requests).await?;
    ensure!(failed.is_empty(), "the racing sync failed {failed:?}");
    ensure!(
        race.refused() == 1 && race.updates() >= 1,
        "no update lost the race: {race:?}"
    );
    let attempts = pointer(&moto, "task_attempts").await?;
    ensure!(
        attempts.ends_with("/metadata/v3.metadata.json"),
        "the catalog was taken back from the rival's version 3 to {attempts}"
    );
    readers_agree(
        &python,
        &found,
        &storage,
        &run,
        &CLUSTERS,
        "after a lost race",
    )
    .await?;

    // Another writer commits to task_attempts through the catalog (as an Athena OPTIMIZE
    // would): a metadata file of its own, with a snapshot Afterglow did not make.
    let ours = storage
        .get(&keys::iceberg_metadata_key("task_attempts", 3)?)
        .await?;
    let theirs: TableMetadata = serde_json::from_slice(&ours.body)?;
    let mut snapshot = theirs.current().context("no current snapshot")?.clone();
    snapshot.parent_snapshot_id = Some(snapshot.snapshot_id);
    snapshot.snapshot_id += 1;
    snapshot.sequence_number += 1;
    snapshot.summary = [("operation".to_owned(), "replace".to_owned())].into();
    let theirs = theirs.with_snapshot(Some(attempts.clone()), snapshot);
    let their_key = keys::iceberg_table_key("task_attempts")?
        .as_str()
        .to_owned()
        + "/metadata/00004-5a4c2a51-8b1e-4d7a-9a3c-0c7d1f8e6b21.metadata.json";
    let their_key = shared::storage::ObjectKey::new(their_key)?;
    storage
        .put(
            &their_key,
            Bytes::from(serde_json::to_vec(&theirs)?),
            PutMode::Create,
        )
        .await?;
    let listed = moto
        .glue()
        .get_table()
        .database_name(DATABASE)
        .name("task_attempts")
        .send()
        .await?
        .table
        .context("no table")?;
    let mut parameters = listed.parameters().cloned().unwrap_or_default();
    parameters.insert("metadata_location".to_owned(), storage.uri(&their_key));
    let input = aws_sdk_glue::types::TableInput::builder()
        .name("task_attempts")
        .table_type("EXTERNAL_TABLE")
        .set_parameters(Some(parameters))
        .build()?;
    moto.glue()
        .update_table()
        .database_name(DATABASE)
        .table_input(input)
        .send()
        .await?;

    // The hourly sweep: that table is reported, and neither the catalog nor our metadata of it
    // moves; the others stay published.
    let sweep = lambda_runtime::LambdaEvent::new(
        serde_json::json!({"source": "aws.events", "detail-type": "Scheduled Event"}),
        lambda_runtime::Context::default(),
    );
    let swept = handle(&function, sweep).await;
    let reported = swept.err().map(|err| err.to_string()).unwrap_or_default();
    ensure!(
        reported.contains("task_attempts") && reported.contains("did not write"),
        "another writer's commit was not reported: {reported:?}"
    );
    ensure!(
        pointer(&moto, "task_attempts").await? == storage.uri(&their_key),
        "the other writer's commit was overwritten"
    );
    let fourth = storage
        .get(&keys::iceberg_metadata_key("task_attempts", 4)?)
        .await;
    ensure!(
        fourth.is_err(),
        "a version was committed over another writer's"
    );
    for table in ["jobs", "actors", "nodes", "workers"] {
        let location = pointer(&moto, table).await?;
        ensure!(
            keys::iceberg_metadata_version(table, &location).is_some(),
            "{table} is not published: {location}"
        );
    }
    Ok(())
}
