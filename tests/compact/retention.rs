//! Retention: expiry removes a session whole (its logs too) once its newest event is older than
//! the retention, and keeps one a compaction is writing meanwhile; `rebuild` is refused once raw
//! objects the tables came from have expired.

use std::sync::Arc;

use afterglow_tests::faults::RecordsRequests;
use afterglow_tests::scenario::Scenario;
use afterglow_tests::{FixtureRun, compactor_over, now_ms};
use anyhow::{Context as _, ensure};
use shared::compact::CompactSettings;
use shared::storage::{ObjectKey, Storage, StorageError};

/// Retention removes a session whole once its newest event is older than the retention: its
/// manifest's files, then its catalog entry. The files are retired, not deleted: the session's
/// quiet check deletes them once their grace period is over, so a reader already under way (or
/// an Iceberg snapshot from before) keeps them until then. Newer sessions are left alone, and
/// still agree with Ray.
#[tokio::test]
async fn expiry_removes_old_sessions_whole_and_keeps_the_rest() -> anyhow::Result<()> {
    use shared::tables::catalog;

    let old_run = FixtureRun::named("basic-workload")?;
    let new_run = FixtureRun::named("edge-cases")?;
    let scenario = Scenario::local()?
        .with_compacted(&old_run, "old")
        .await?
        .with_compacted(&new_run, "new")
        .await?;
    let storage = scenario.storage();

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

    // Each session's node shipped a log file; only the old sessions' go.
    let new_manifests = storage.list("tables/manifests/cluster=new/").await?;
    let mut logs = Vec::new();
    for meta in old_manifests.iter().chain(&new_manifests) {
        let (cluster, session) =
            shared::keys::manifest_session(&meta.key).context("a manifest names its session")?;
        let node = shared::keys::NodeLogs {
            cluster,
            session,
            node_id: shared::keys::NodeId::new(&"4d".repeat(28))?,
        };
        let pieces = [shared::logs::store::ReadPiece {
            file: shared::keys::LogFileName::new("raylet.out")?,
            offset: 0,
            bytes: b"raylet started\n",
        }];
        shared::logs::store::put_pieces(&*storage, &node, &pieces).await?;
        logs.push(node);
    }
    // Deletes are watched: a session's objects go in batches (S3 takes 1 000 keys a request),
    // never one request each.
    let recorder = Arc::new(RecordsRequests::new(Arc::clone(&storage)));
    let (compactor, _scratch) = compactor_over(&recorder, CompactSettings::default())?;
    let expired = compactor
        .expire_sessions(std::time::Duration::from_secs(7 * 86_400), now)
        .await?;
    for node in &logs {
        let left = storage.list(&node.prefix()).await?.len();
        let old = node.cluster.as_str() == "old";
        ensure!(
            (left == 0) == old,
            "{} objects of {}'s logs left after expiry",
            left,
            node.prefix()
        );
    }
    ensure!(
        expired.len() == old_manifests.len(),
        "expired {expired:?}, {} sessions were old",
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
    let stored = |file: &ObjectKey| {
        let storage = Arc::clone(&storage);
        let file = file.clone();
        async move {
            match storage.get(&file).await {
                Ok(_) => Ok(true),
                Err(StorageError::NotFound { .. }) => Ok(false),
                Err(err) => Err(err),
            }
        }
    };
    for file in &old_files {
        ensure!(
            stored(file).await?,
            "{file} was deleted within its grace period"
        );
    }
    // Within the grace period the quiet check keeps them, and asks to be made again.
    for check in &expired {
        let tidied = compactor.tidy_if_quiet(check).await?;
        ensure!(
            tidied.again && tidied.deleted == 0,
            "{check:?} within the grace: {tidied:?}"
        );
    }
    // Once it is over, the check deletes every one of them.
    let (after_grace, _scratch) = compactor_over(
        &recorder,
        CompactSettings {
            retire_grace: std::time::Duration::ZERO,
            ..CompactSettings::default()
        },
    )?;
    for check in &expired {
        let tidied = after_grace.tidy_if_quiet(check).await?;
        ensure!(
            !tidied.again && tidied.deleted > 0,
            "{check:?} after the grace: {tidied:?}"
        );
    }
    // Per session, one batch for its logs and one for its retired files.
    ensure!(
        recorder.deletes() == 0 && recorder.batch_deletes() <= 2 * expired.len(),
        "{} objects deleted one at a time and {} batch deletes, for {} sessions",
        recorder.deletes(),
        recorder.batch_deletes(),
        expired.len()
    );
    for file in &old_files {
        ensure!(!stored(file).await?, "{file} was left behind");
    }
    let after = catalog::load(&storage).await?;
    ensure!(
        !after.clusters.contains_key("old"),
        "the catalog still lists the old cluster"
    );
    ensure!(
        after.clusters.contains_key("new"),
        "the recent cluster was removed"
    );
    scenario
        .check(&new_run, "new", "a recent session after expiry")
        .await
}

/// A compaction committing into a session while expiry removes it: the manifest expiry read is
/// replaced before expiry writes. The session is kept whole (manifest, files, catalog entry):
/// deleting the manifest unconditionally would lose the commit and orphan every file.
#[tokio::test]
async fn a_session_written_while_it_expires_is_kept() -> anyhow::Result<()> {
    use afterglow_tests::faults::CommitsAfterRead;

    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::local()?.with_compacted(&run, "racing").await?;
    let storage = scenario.storage();
    let now = i64::try_from(now_ms()?)?;
    let day = 86_400_000;
    age_sessions(&*storage, "racing", now - 10 * day).await?;

    let racing = Arc::new(CommitsAfterRead::new(
        Arc::clone(&storage),
        "tables/manifests/",
        now,
    ));
    let (compactor, _scratch) = compactor_over(&racing, CompactSettings::default())?;
    let expired = compactor
        .expire_sessions(std::time::Duration::from_secs(7 * 86_400), now)
        .await?;
    ensure!(racing.committed(), "no commit raced the expiry");
    ensure!(
        expired.is_empty(),
        "a session written meanwhile was expired"
    );
    scenario
        .check(&run, "racing", "a session written while it expired")
        .await?;
    let catalog = shared::tables::catalog::load(&storage).await?;
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
    let scenario = Scenario::local()?.with_compacted(&run, "expiring").await?;
    let storage = scenario.storage();
    let (compactor, _scratch) = scenario.compactor(CompactSettings::default())?;
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

/// Sets the newest event time of every session of `cluster` to `last_ms`, in its manifest and
/// in the cluster's catalog document, as if its events had been that old. The document is
/// written directly: `catalog::record` only ever widens a session's span, as compaction needs.
async fn age_sessions(storage: &dyn Storage, cluster: &str, last_ms: i64) -> anyhow::Result<()> {
    use shared::tables::{catalog, manifest};
    let name = shared::keys::ClusterName::new(cluster)?;
    let mut listed = catalog::load_cluster(storage, &name).await?;
    for meta in storage
        .list(&format!("tables/manifests/cluster={cluster}/"))
        .await?
    {
        let read = manifest::load(storage, &meta.key).await?;
        let mut aged = read.manifest;
        aged.stats.last_ms = Some(last_ms);
        manifest::store(storage, &meta.key, &aged, read.etag.as_ref()).await?;
        let (_, session) = shared::keys::manifest_session(&meta.key).context("a manifest key")?;
        listed.sessions.insert(session.to_string(), aged.stats);
    }
    storage
        .put(
            &shared::keys::cluster_catalog_key(&name)?,
            bytes::Bytes::from(serde_json::to_vec(&listed)?),
            shared::storage::PutMode::Overwrite,
        )
        .await?;
    Ok(())
}
