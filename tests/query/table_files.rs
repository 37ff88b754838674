//! The table files a read takes: a file the manifest names but the store lost costs its rows,
//! not the session; and the rows a delta supersedes, recorded beside it as a deletion vector,
//! are left out of a read without a key join, giving the rows a read by key gives.

use std::sync::Arc;

use afterglow_tests::api::Api;
use afterglow_tests::scenario::{Scenario, query_params};
use afterglow_tests::{FixtureRun, folding_past, serve_runs_locally};
use anyhow::{Context as _, ensure};
use serde_json::Value as Json;

/// A file the manifest names may be gone (deleted by hand, or expired by a storage rule under
/// a live manifest): readers answer from the rest of the session, without that file's rows,
/// instead of failing every request for the session.
#[tokio::test]
async fn a_missing_table_file_costs_its_rows_not_the_session() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs_locally(std::slice::from_ref(&run), Ok).await?;
    let storage = Arc::clone(&served.storage);
    let api = Api::Http(served.server.url.clone());
    let cluster = &run.name;
    let full = api.ok(&format!("/api/summary?cluster={cluster}")).await?["total"]
        .as_u64()
        .context("total")?;
    let manifests = storage
        .list(&format!("tables/manifests/cluster={cluster}/"))
        .await?;
    let first = manifests.first().context("no manifest")?;
    let manifest = shared::tables::manifest::load(&*storage, &first.key)
        .await?
        .manifest;
    let oldest = manifest
        .task_attempts
        .all()
        .next()
        .context("no attempt file")?;
    let nodes = manifest.entities.get("nodes").context("no nodes file")?;
    for gone in [&oldest.key, &nodes.key] {
        storage.delete(gone).await?;
    }
    let summary = api.ok(&format!("/api/summary?cluster={cluster}")).await?;
    let total = summary["total"].as_u64().context("total")?;
    ensure!(
        total <= full,
        "{total} attempts after a file was lost, {full} before"
    );
    api.ok(&format!("/api/tasks?cluster={cluster}")).await?;
    let nodes = api.ok(&format!("/api/nodes?cluster={cluster}")).await?;
    println!("a lost file: {total} of {full} attempts still answered; nodes: {nodes}");
    served.server.stop().await
}

/// Each delta records the stored rows it supersedes, and reading every file minus those rows
/// (no key join) gives exactly the rows the read by key gives: over two sessions of synthetic
/// traffic re-delivered and compacted in small batches, where later deltas do supersede rows.
/// A session whose deltas predate deletion vectors (the field stripped from its manifest) is
/// still read by key, with the same answer.
#[tokio::test]
async fn reading_without_superseded_rows_equals_reading_by_key() -> anyhow::Result<()> {
    use shared::query::read::params::Scope;
    use shared::query::read::snapshot::{Needs, snapshot};
    use shared::query::read::sql::newest_rows;
    use shared::query::{ApiRoute, QueryEngine};
    use shared::storage::FileCache;

    let scenario = Scenario::local()?;
    let storage = scenario.storage();
    let attempts = scenario
        .ingest_failing_sessions("positions", [11, 12], 6_000, 2)
        .await?;
    let (compactor, _scratch) = scenario.compactor(folding_past(100))?;
    for batch in compactor.raw_keys().await?.chunks(3) {
        compactor.compact(batch).await?;
    }

    let cache = FileCache::new(Arc::clone(&storage), scenario.dir()?.join("cache"), 4);
    let needs = Needs {
        attempts: true,
        ..Needs::default()
    };
    let by_position = snapshot(&storage, &cache, &Scope::default(), needs, u64::MAX).await?;
    let vectors = by_position
        .task_attempts
        .deletes
        .clone()
        .context("every delta was written with its deletion vector")?;
    let connection = shared::tables::open_duckdb()?;
    let mut superseded = 0i64;
    for vector in &vectors {
        let sql = format!(
            "SELECT count(*) FROM read_parquet('{}')",
            vector.path.display()
        );
        superseded += connection.query_row(&sql, [], |row| row.get::<_, i64>(0))?;
    }
    ensure!(superseded > 0, "no delta superseded a stored row");
    let mut by_key = by_position.task_attempts.clone();
    by_key.deletes = None;
    let rows = |files: &shared::tables::newest::LocalFiles| -> anyhow::Result<Vec<String>> {
        let relation = newest_rows(&files.files()).context("no files")?;
        let sql = format!(
            "SELECT concat_ws('|', session_name, task_id, attempt_number, state, error_type,
                              end_time_ms, node_id, worker_id)
             FROM {relation} WHERE type <> 'DRIVER_TASK' ORDER BY 1"
        );
        let mut statement = connection.prepare(&sql)?;
        let rows = statement
            .query_map([], |row| row.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    };
    let positional = rows(&by_position.task_attempts)?;
    let keyed = rows(&by_key)?;
    ensure!(
        positional.len() as u64 == attempts,
        "{} rows by position, {} by key, {attempts} generated",
        positional.len(),
        keyed.len()
    );
    ensure!(
        positional == keyed,
        "the read by position differs from the read by key"
    );
    println!(
        "{} attempts, {superseded} superseded rows in {} deletion vectors",
        positional.len(),
        vectors.len()
    );

    // A manifest whose deltas have no vectors, as an earlier build wrote it.
    let engine = scenario.engine("query")?;
    let before = engine.answer(&ApiRoute::Summary, &[]).await?;
    // Pages: the newest first, then the next by cursor, and the oldest first; a job's failures.
    async fn pages(engine: &QueryEngine) -> anyhow::Result<Vec<Json>> {
        let ask = |pairs: &[(&str, &str)]| {
            let params = query_params(pairs);
            async move { engine.answer(&ApiRoute::Tasks, &params).await }
        };
        let first = ask(&[("limit", "200")]).await?;
        let cursor = first["next"].as_str().context("a next page")?.to_owned();
        let second = ask(&[("limit", "200"), ("cursor", &cursor)]).await?;
        let oldest = ask(&[("limit", "50"), ("order", "asc"), ("sort", "duration")]).await?;
        let failed = ask(&[("limit", "100"), ("state", "FAILED")]).await?;
        // Small pages, whose first stored rows hold more superseded versions than newest
        // rows: read again with more rows until enough are newest.
        let mut small = Vec::new();
        for limit in ["1", "2", "5"] {
            small.push(ask(&[("limit", limit)]).await?);
            small.push(ask(&[("limit", limit), ("sort", "duration")]).await?);
        }
        Ok([vec![first, second, oldest, failed], small].concat())
    }
    let pages_by_position = pages(&engine).await?;
    ensure!(
        engine.page_retakes() > 0,
        "no page read more of the first rows: the test does not reach that path"
    );
    scenario
        .rewrite_manifests(|manifest| {
            for delta in &mut manifest.task_attempts.deltas {
                delta.deletes = None;
            }
        })
        .await?;
    let legacy = snapshot(&storage, &cache, &Scope::default(), needs, u64::MAX).await?;
    ensure!(legacy.task_attempts.deletes.is_none());
    let after = engine.answer(&ApiRoute::Summary, &[]).await?;
    ensure!(
        after["total"] == before["total"] && after["by_state"] == before["by_state"],
        "{after} != {before}"
    );
    ensure!(after["total"].as_u64() == Some(attempts), "{after}");
    let pages_by_key = pages(&engine).await?;
    for (by_position, by_key) in pages_by_position.iter().zip(&pages_by_key) {
        ensure!(
            by_position == by_key,
            "a page read by position differs from the page read by key:\n{by_position}\n{by_key}"
        );
    }
    Ok(())
}
