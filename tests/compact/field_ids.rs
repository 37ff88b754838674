//! Field ids: every `task_attempts` and entity file compaction writes carries each column's
//! field id (`PARQUET:field_id`, what Iceberg readers find columns by), whichever way it was
//! written: a run's delta, a fold's base interleaved by the parquet crate, a base DuckDB sorted
//! (deltas without deletion vectors), and the entity tables DuckDB writes.

use std::collections::BTreeMap;

use afterglow_tests::scenario::Scenario;
use afterglow_tests::{FixtureRun, keeping_deltas};
use anyhow::{Context as _, ensure};
use shared::storage::{ObjectKey, Storage};
use shared::tables::entities::EntityKind;
use shared::tables::manifest::Manifest;
use shared::tables::published::{Source, stored_columns};

/// The field id of each leaf column of the Parquet file `key`, and the writer it names.
fn field_ids(
    storage: &dyn Storage,
    key: &ObjectKey,
) -> anyhow::Result<(BTreeMap<String, Option<i32>>, String)> {
    let path = storage.local_path(key).context("a local store")?;
    let file = format!("'{}'", path.display());
    let connection = duckdb::Connection::open_in_memory()?;
    let mut statement = connection.prepare(&format!(
        "SELECT name, field_id FROM parquet_schema({file}) WHERE num_children IS NULL"
    ))?;
    // Every column, a report time's reference code (`node_id_at_ref`, …) too: an Iceberg
    // reader finds a file's columns by id only when every one has one.
    let ids = statement
        .query_map([], |row| Ok((row.get::<_, String>(0)?, row.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let writer = connection.query_row(
        &format!("SELECT created_by FROM parquet_file_metadata({file})"),
        [],
        |row| row.get(0),
    )?;
    Ok((ids, writer))
}

/// Insists that every file of `manifest` carries its table's field ids; returns the writers
/// of its `task_attempts` files.
fn ensure_field_ids(storage: &dyn Storage, manifest: &Manifest) -> anyhow::Result<Vec<String>> {
    let expected = |source: Source| -> BTreeMap<String, Option<i32>> {
        stored_columns(source)
            .into_iter()
            .map(|column| (column.name.to_owned(), Some(column.id)))
            .collect()
    };
    let mut writers = Vec::new();
    for file in manifest.task_attempts.all() {
        let (ids, writer) = field_ids(storage, &file.key)?;
        ensure!(
            ids == expected(Source::Attempts),
            "{} ({writer}): {ids:?}",
            file.key
        );
        writers.push(writer);
    }
    // A run without placement groups has no such file; it has jobs, actors, nodes, workers.
    let mut entity_files = 0;
    for kind in EntityKind::ALL {
        let Some(file) = manifest.entities.get(kind.table()) else {
            continue;
        };
        entity_files += 1;
        let (ids, writer) = field_ids(storage, &file.key)?;
        ensure!(
            ids == expected(Source::Entities(kind)),
            "{} ({writer}): {ids:?}",
            file.key
        );
    }
    ensure!(entity_files >= 4, "{entity_files} entity files");
    Ok(writers)
}

#[tokio::test]
async fn every_table_file_carries_its_columns_field_ids() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    for (cluster, sorted_by_duckdb) in [("ids", false), ("ids-sorted", true)] {
        let scenario = Scenario::local()?.with_raw(&run, cluster).await?;
        let storage = scenario.storage();
        let (compactor, _scratch) = scenario.compactor(keeping_deltas())?;
        for key in compactor.raw_keys().await? {
            compactor.compact(&[key]).await?;
        }
        let deltas = scenario.only_manifest(cluster).await?;
        ensure!(deltas.task_attempts.deltas.len() > 1, "{deltas:?}");
        ensure_field_ids(&*storage, &deltas)?;
        if sorted_by_duckdb {
            // Deltas without deletion vectors (as an older build wrote them) are not
            // interleaved: DuckDB sorts the fold's base.
            scenario
                .rewrite_manifests(|manifest| {
                    for delta in &mut manifest.task_attempts.deltas {
                        delta.deletes = None;
                    }
                })
                .await?;
        }
        ensure!(compactor.fold().await? == 1, "one session folded");
        let folded = scenario.only_manifest(cluster).await?;
        let writers = ensure_field_ids(&*storage, &folded)?;
        let [writer] = writers.as_slice() else {
            anyhow::bail!("{cluster}: the fold left {} files", writers.len());
        };
        ensure!(
            writer.starts_with("DuckDB") == sorted_by_duckdb,
            "{cluster}: the base was written by {writer}"
        );
        scenario.check(&run, cluster, "folded").await?;
    }
    Ok(())
}
