//! A captured Ray run compacted one raw object at a time into two clusters (a base and deltas
//! whose deletion vectors supersede earlier rows), beside a synthetic streaming session
//! compacted the same way, published as Iceberg after the first cluster and the synthetic one,
//! after the second (as a sync requested after a commit: the others' manifests carried forward
//! without being read), after all are folded (that sync first cut short before its commit, then
//! retried as a requested sync, which finds the folds in the catalog), and after all expire: PyIceberg 0.12
//! and DuckDB's `iceberg_scan` (`tests/iceberg/read.py`) read exactly the rows `afterglow sql`
//! answers, each attempt once (and the captured run's as Ray lists it), every time (nothing, once
//! expired, while the snapshot from before the expiry still reads whole, until the grace period
//! of the files the commits retired is over); every file's column statistics bound what DuckDB
//! finds in it; on a local store and on S3 (SeaweedFS).

use std::sync::Arc;

use afterglow_tests::faults::{RecordsRequests, Refuses, SweepsBetweenListAndRead};
use afterglow_tests::scenario::Scenario;
use afterglow_tests::{FixtureRun, keeping_deltas};
use anyhow::{Context as _, ensure};
use shared::iceberg::{
    Published, RETIRED_FILE_GRACE, Reads, TableMetadata, delete_retired, publish, sync_tables,
};
use shared::keys;
use shared::storage::Storage;
use shared::tables::published::published_tables;

use super::readers::{
    Found, TABLES, readers_agree, readers_python, rows_read_at, statistics_bound_every_file,
};

/// The clusters the run is compacted into, one after the other.
const CLUSTERS: [&str; 2] = ["iceberg-a", "iceberg-b"];

/// The cluster of a synthetic streaming session, compacted with the first.
const STREAMING: &str = "iceberg-stream";

/// The current snapshot's operation of `table`.
async fn operation(storage: &dyn Storage, table: &str, version: u64) -> anyhow::Result<String> {
    let stored = storage
        .get(&keys::iceberg_metadata_key(table, version)?)
        .await?;
    let metadata: TableMetadata = serde_json::from_slice(&stored.body)?;
    let snapshot = metadata.current().context("no current snapshot")?;
    Ok(snapshot
        .summary
        .get("operation")
        .cloned()
        .unwrap_or_default())
}

fn outcome<'a>(published: &'a [Published], table: &str) -> anyhow::Result<&'a Published> {
    published
        .iter()
        .find(|outcome| outcome.table == table)
        .with_context(|| format!("{table} was not synced: {published:?}"))
}

/// Publishes every table as a sync requested after a commit does: reading only the manifests
/// the catalog shows moved since the tables published them.
async fn publish_changed(
    storage: &Arc<dyn Storage>,
    now_ms: i64,
) -> anyhow::Result<Vec<Published>> {
    publish(storage, None, &published_tables(), Reads::Changed, now_ms)
        .await?
        .into_iter()
        .map(|(table, outcome)| {
            outcome
                .map(|cataloged| cataloged.published)
                .with_context(|| format!("publishing {table}"))
        })
        .collect()
}

fn version_of(published: &[Published], table: &str) -> Option<u64> {
    outcome(published, table)
        .ok()
        .and_then(|outcome| outcome.version)
}

/// Compacts `cluster`'s raw objects one at a time, and insists that its deltas supersede rows.
async fn compact_one_by_one(
    compactor: &shared::compact::Compactor,
    scenario: &Scenario,
    cluster: &str,
) -> anyhow::Result<()> {
    let prefix = format!("raw/{cluster}/");
    for key in compactor.raw_keys().await? {
        if key.as_str().starts_with(&prefix) {
            compactor.compact(&[key]).await?;
        }
    }
    ensure!(
        scenario.superseded_rows(cluster).await? > 0,
        "{cluster}: no delta supersedes a row: the test would not show position deletes applied"
    );
    Ok(())
}

async fn iceberg_readers_read_what_afterglow_answers(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let Some(python) = readers_python()? else {
        return Ok(());
    };
    let run = FixtureRun::named("basic-workload")?;
    let [first, second] = CLUSTERS;
    let scenario = Scenario::over(Arc::clone(&storage))
        .with_raw(&run, first)
        .await?
        .with_raw(&run, second)
        .await?;
    // A larger session than the capture, sent as Ray streams it (small bodies from several
    // nodes, some delivered twice) and compacted body by body.
    scenario
        .ingest_synthetic(
            STREAMING,
            synth::SynthSettings {
                attempts: 1_500,
                jobs: 2,
                nodes: 3,
                failure_rate: 0.1,
                duplicate_rate: 0.05,
                batch_events: 250,
                seed: 69,
                ..synth::SynthSettings::default()
            },
        )
        .await?;
    let (compactor, _scratch) = scenario.compactor(keeping_deltas())?;
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;

    compact_one_by_one(&compactor, &scenario, first).await?;
    compact_one_by_one(&compactor, &scenario, STREAMING).await?;
    let published = sync_tables(&storage, now_ms).await?;
    for table in TABLES {
        ensure!(version_of(&published, table) == Some(1), "{published:?}");
    }
    ensure!(
        operation(&*storage, "task_attempts", 1).await? == "overwrite",
        "a first snapshot with position deletes is an overwrite"
    );
    readers_agree(
        &python,
        &Found::Directory,
        &storage,
        &run,
        &[first],
        "one cluster's deltas",
    )
    .await?;

    // Nothing changed: nothing is committed.
    let again = sync_tables(&storage, now_ms + 1).await?;
    ensure!(
        again.iter().all(|outcome| outcome.version.is_none()),
        "a sync with nothing new committed: {again:?}"
    );

    compact_one_by_one(&compactor, &scenario, second).await?;
    // As a sync requested after those commits: only the manifest that moved is read.
    let recorder = Arc::new(RecordsRequests::new(Arc::clone(&storage)));
    let watched: Arc<dyn Storage> = recorder.clone();
    let both = publish_changed(&watched, now_ms + 2).await?;
    let attempts = outcome(&both, "task_attempts")?;
    ensure!(
        attempts.version == Some(2) && attempts.changed == 1 && attempts.sessions == 3,
        "the second cluster's session alone is written: {attempts:?}"
    );
    let manifests_read: Vec<String> = recorder
        .gets()
        .into_iter()
        .filter(|key| key.starts_with(keys::MANIFESTS_PREFIX))
        .collect();
    ensure!(
        manifests_read.len() == 1
            && manifests_read
                .iter()
                .all(|key| key.contains(&format!("cluster={second}/"))),
        "the unchanged sessions' manifests were read too: {manifests_read:?}"
    );
    readers_agree(
        &python,
        &Found::Directory,
        &storage,
        &run,
        &CLUSTERS,
        "two clusters' deltas",
    )
    .await?;
    statistics_bound_every_file(&python, &storage, "two clusters' deltas").await?;

    ensure!(compactor.fold().await? == 3, "every session folded");
    // Cut short just before its commit: everything but the new metadata version is written.
    let refusing = Arc::new(Refuses::writes_under(
        Arc::clone(&storage),
        "iceberg/task_attempts/metadata/v",
    ));
    let refusing_storage: Arc<dyn Storage> = refusing.clone();
    let cut_short = sync_tables(&refusing_storage, now_ms + 3).await;
    ensure!(
        cut_short.is_err() && refusing.refused() == 1,
        "the commit was not refused: {cut_short:?}"
    );
    readers_agree(
        &python,
        &Found::Directory,
        &storage,
        &run,
        &CLUSTERS,
        "a sync cut short",
    )
    .await?;
    refusing.clear();
    // The folds moved the manifests without new statistics: the catalog shows them moved all
    // the same, so a sync requested afterwards publishes them.
    let folded = publish_changed(&refusing_storage, now_ms + 4).await?;
    let attempts = outcome(&folded, "task_attempts")?;
    ensure!(
        attempts.version == Some(3) && attempts.changed == 3,
        "the folds were not published: {attempts:?}"
    );
    ensure!(
        operation(&*storage, "task_attempts", 3).await? == "replace",
        "a fold publishes a replace snapshot"
    );
    readers_agree(
        &python,
        &Found::Directory,
        &storage,
        &run,
        &CLUSTERS,
        "folded",
    )
    .await?;

    let mut before_expiry = Vec::new();
    for table in TABLES {
        let version = outcome(&folded, table)?.current;
        before_expiry.push(storage.uri(&keys::iceberg_metadata_key(table, version)?));
    }
    let rows_before = rows_read_at(&python, &before_expiry).await?;

    // Every session expires: its manifest is emptied (not deleted) and its files retired.
    // The next sync takes them out of every table.
    let expired = compactor
        .expire_sessions(std::time::Duration::from_secs(60), now_ms + 5)
        .await?;
    ensure!(expired.len() == 3, "{expired:?} expired, not 3 sessions");
    let emptied = sync_tables(&storage, now_ms + 6).await?;
    let attempts = outcome(&emptied, "task_attempts")?;
    ensure!(
        attempts.version == Some(4) && attempts.removed == 3 && attempts.sessions == 0,
        "the expired sessions were not taken out: {attempts:?}"
    );
    ensure!(
        operation(&*storage, "task_attempts", 4).await? == "delete",
        "an expiry publishes a delete snapshot"
    );
    readers_agree(&python, &Found::Directory, &storage, &run, &[], "expired").await?;
    // A reader of the snapshot before the expiry (a query under way, a time travel) still
    // reads it whole: its files wait out their grace period.
    let rows_after = rows_read_at(&python, &before_expiry).await?;
    let attempts_before = rows_before
        .get("task_attempts")
        .and_then(|readers| readers.get("pyiceberg"))
        .with_context(|| format!("PyIceberg counted no task_attempts: {rows_before:?}"))?;
    ensure!(
        rows_after == rows_before && *attempts_before > 0,
        "the snapshot before the expiry read {rows_before:?}, after it {rows_after:?}"
    );

    // The fold and the expiry retired every session manifest and position-delete file the
    // table had: kept through the grace period, then deleted, while the current snapshot reads
    // on.
    let grace_ms = i64::try_from(RETIRED_FILE_GRACE.as_millis())?;
    let within = delete_retired(&storage, "task_attempts", now_ms + 4 + grace_ms - 1).await?;
    let before_grace = session_files(&*storage).await?;
    ensure!(
        within == 0 && before_grace > 0,
        "{within} files deleted within the grace period, {before_grace} left"
    );
    // Two sweeps at once (the catalog function's and a request's): the other one deletes
    // every record and file between this one's listing and its reads, and this one skips
    // what is gone.
    let after_grace = now_ms + 6 + grace_ms;
    let raced = Arc::new(SweepsBetweenListAndRead::new(
        storage.clone(),
        "task_attempts",
        after_grace,
    ));
    let raced_storage: Arc<dyn Storage> = raced.clone();
    let deleted = delete_retired(&raced_storage, "task_attempts", after_grace).await?;
    let left = session_files(&*storage).await?;
    ensure!(
        raced.swept() == before_grace && deleted == 0 && left == 0,
        "after the grace period the other sweep deleted {} of {before_grace} retired files, \
         this one {deleted}, {left} left",
        raced.swept()
    );
    readers_agree(
        &python,
        &Found::Directory,
        &storage,
        &run,
        &[],
        "expired, its retired files deleted",
    )
    .await
}

/// The session manifests and position-delete files `task_attempts`' Iceberg folder holds.
async fn session_files(storage: &dyn Storage) -> anyhow::Result<usize> {
    let manifests = storage
        .list("iceberg/task_attempts/metadata/cluster=")
        .await?;
    let deletes = storage.list("iceberg/task_attempts/deletes/").await?;
    Ok(manifests.len() + deletes.len())
}

afterglow_tests::for_each_backend!(iceberg_readers_read_what_afterglow_answers);

/// A fold whose catalog note is refused (the manifest lands, the catalog entry lags it): a
/// sync requested afterwards reads what the catalog says, and misses the fold; the catalog
/// function's sweep reads every manifest and publishes it, within the grace the fold's inputs
/// are kept for.
#[tokio::test]
async fn the_sweep_publishes_what_a_lagging_catalog_hid() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::local()?.with_raw(&run, "lagging").await?;
    let storage = scenario.storage();
    let (compactor, _scratch) = scenario.compactor(keeping_deltas())?;
    compact_one_by_one(&compactor, &scenario, "lagging").await?;
    let now_ms = i64::try_from(afterglow_tests::now_ms()?)?;
    let first = sync_tables(&storage, now_ms).await?;
    ensure!(version_of(&first, "task_attempts") == Some(1), "{first:?}");

    let refusing = Arc::new(Refuses::writes_under(
        Arc::clone(&storage),
        keys::CATALOG_PREFIX,
    ));
    let (folding, _scratch) = afterglow_tests::compactor_over(&refusing, keeping_deltas())?;
    ensure!(folding.fold().await? == 1, "the session was not folded");
    ensure!(
        refusing.refused() > 0,
        "the catalog took the fold's note: nothing lags"
    );
    let requested = publish_changed(&storage, now_ms + 1).await?;
    ensure!(
        version_of(&requested, "task_attempts").is_none(),
        "a requested sync published a fold the catalog does not show: {requested:?}"
    );
    let swept = sync_tables(&storage, now_ms + 2).await?;
    ensure!(
        version_of(&swept, "task_attempts") == Some(2)
            && operation(&*storage, "task_attempts", 2).await? == "replace",
        "the sweep did not publish the fold: {swept:?}"
    );
    Ok(())
}

/// `rebuild` drops the tables and compacts the raw objects again. The manifests it empties keep
/// each session's sequence, so the rebuilt session's manifest is newer than the one the
/// Iceberg tables publish (which never take a session back to an older version), the next sync
/// publishes the rebuilt files, and both readers read them.
#[tokio::test]
async fn a_rebuilt_store_is_published_afresh() -> anyhow::Result<()> {
    let Some(python) = readers_python()? else {
        return Ok(());
    };
    let run = FixtureRun::named("basic-workload")?;
    let cluster = "rebuilt";
    let scenario = Scenario::local()?.with_raw(&run, cluster).await?;
    let storage = scenario.storage();
    let (compactor, _scratch) = scenario.compactor(keeping_deltas())?;
    compact_one_by_one(&compactor, &scenario, cluster).await?;
    let now_ms = i64::try_from(afterglow_tests::now_ms()?)?;
    let first = sync_tables(&storage, now_ms).await?;
    ensure!(version_of(&first, "task_attempts") == Some(1), "{first:?}");

    compactor.drop_tables().await?;
    // In one run: far fewer commits than the first compaction made.
    compactor.compact(&compactor.raw_keys().await?).await?;
    let rebuilt = sync_tables(&storage, now_ms + 1).await?;
    ensure!(
        version_of(&rebuilt, "task_attempts") == Some(2),
        "the rebuilt session was not published: {rebuilt:?}"
    );
    readers_agree(
        &python,
        &Found::Directory,
        &storage,
        &run,
        &[cluster],
        "a rebuilt store",
    )
    .await
}
