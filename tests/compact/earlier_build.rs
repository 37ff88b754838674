//! A store an earlier build wrote (`fixtures/stores/`) is carried on by this build: its files
//! are read, folded and written again in this build's format, and a manifest of a format newer
//! than a build reads is refused.

use afterglow_tests::scenario::Scenario;
use afterglow_tests::{FixtureRun, keeping_deltas};
use anyhow::{Context as _, ensure};
use shared::storage::Storage;

/// A store an earlier build wrote (7ed31af, whose files store report times in place: they have
/// no `…_ref` columns) is carried on by this build: a run writes a delta beside the old one, a
/// fold turns the two kinds of file into one base, and later runs re-read attempts from it and
/// merge their events again; the rows agree with Ray's at each step.
#[tokio::test]
async fn a_session_an_earlier_build_began_is_carried_on() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::local()?;
    let data = scenario.dir()?.join("data");
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/stores/7ed31af-basic-workload-first-half/tables");
    copy_dir(&fixture, &data.join("tables"))?;
    let storage = scenario.storage();
    let requests = run.requests()?;
    let later: Vec<Vec<u8>> = requests[requests.len() / 2..]
        .iter()
        .map(|request| request.body.clone())
        .collect();
    let scenario = scenario.with_raw_bodies("upgrade", &later).await?;
    let (compactor, _scratch) = scenario.compactor(keeping_deltas())?;
    let keys = compactor.raw_keys().await?;
    let (first, rest) = keys.split_at(keys.len() / 3);
    compactor.compact(first).await?;

    let manifest = scenario.only_manifest("upgrade").await?;
    let connection = duckdb::Connection::open_in_memory()?;
    let kinds = manifest
        .task_attempts
        .all()
        .map(|file| {
            let path = data.join(file.key.as_str());
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
    let folded = scenario.only_manifest("upgrade").await?.task_attempts;
    ensure!(
        folded.has_key_indexes(),
        "the base the fold wrote has no key index"
    );
    // The earlier build's rollup kept no creation times apart: the base is counted again, so
    // that a time range reads its rollup.
    ensure!(
        folded.dated_rollups().is_some(),
        "the base the fold wrote has no rollup a time range reads"
    );
    for key in rest {
        compactor.compact(std::slice::from_ref(key)).await?;
    }
    scenario
        .check(
            &run,
            "upgrade",
            "begun by an earlier build, folded, carried on",
        )
        .await?;
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
    let manifest = scenario.only_manifest("upgrade").await?;
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
