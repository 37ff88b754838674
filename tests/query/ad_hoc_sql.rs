//! `afterglow sql` over a captured Ray run compacted one raw object at a time, so that its
//! attempts sit in a base and deltas whose deletion vectors supersede earlier rows: the
//! published tables hold each attempt once, as Ray lists it, and each actor and node in Ray's
//! state; on a local store (read in place) and on S3 (copied).

use std::collections::BTreeMap;
use std::sync::Arc;

use afterglow::sql::{Format, print};
use afterglow_tests::api::our_rows;
use afterglow_tests::ray::check;
use afterglow_tests::scenario::Scenario;
use afterglow_tests::{FixtureRun, keeping_deltas};
use anyhow::{Context as _, ensure};
use serde_json::Value as Json;
use shared::query::read::params::Scope;
use shared::query::{QueryEngine, QuerySettings};
use shared::storage::Storage;

const CLUSTER: &str = "sql";

/// The JSON rows `afterglow sql --format json` prints for `query` over the whole store.
async fn json_rows(engine: &QueryEngine, query: &str) -> anyhow::Result<Vec<Json>> {
    let printed = print(
        engine,
        &Scope::default(),
        query,
        Format::Json,
        0,
        Vec::new(),
    )
    .await?;
    let rows: Json = serde_json::from_slice(&printed)
        .with_context(|| format!("not JSON: {}", String::from_utf8_lossy(&printed)))?;
    Ok(rows.as_array().context("not an array")?.clone())
}

async fn published_tables_hold_each_attempt_once_as_ray_lists_it(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::over(Arc::clone(&storage))
        .with_raw(&run, CLUSTER)
        .await?;
    let (compactor, _scratch) = scenario.compactor(keeping_deltas())?;
    for key in compactor.raw_keys().await? {
        compactor.compact(&[key]).await?;
    }
    ensure!(
        scenario.superseded_rows(CLUSTER).await? > 0,
        "no delta supersedes a row: the test would not show deletion vectors applied"
    );
    let dir = tempfile::tempdir()?;
    let engine = QueryEngine::open(storage, QuerySettings::under(dir.path()))?;

    let attempts = json_rows(
        &engine,
        "SELECT * FROM task_attempts ORDER BY task_id, attempt_number;",
    )
    .await?;
    // `our_rows` refuses an attempt listed twice: no superseded row is seen.
    let rows = our_rows(&attempts)?;
    check(&run, &rows, "afterglow sql's task_attempts")?;

    // A withheld column is not there to select, and every published column is.
    let withheld = print(
        &engine,
        &Scope::default(),
        "SELECT serialized_runtime_env FROM task_attempts",
        Format::Json,
        0,
        Vec::new(),
    )
    .await;
    ensure!(
        withheld.is_err(),
        "serialized_runtime_env was selectable: {withheld:?}"
    );
    let columns: Vec<String> = attempts
        .first()
        .and_then(Json::as_object)
        .context("no attempt")?
        .keys()
        .cloned()
        .collect();
    ensure!(
        columns.contains(&"ts_running".to_owned()) && columns.contains(&"session_name".to_owned()),
        "columns {columns:?}"
    );

    // Actors and nodes in Ray's states.
    for (table, file, id) in [
        ("actors", "actors.json", "actor_id"),
        ("nodes", "nodes.json", "node_id"),
    ] {
        let ours: BTreeMap<String, String> =
            json_rows(&engine, &format!("SELECT {id}, state FROM {table}"))
                .await?
                .iter()
                .map(|row| {
                    (
                        row[id].as_str().unwrap_or_default().to_owned(),
                        row["state"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect();
        let theirs: BTreeMap<String, String> = run
            .ground_truth(file)?
            .as_array()
            .context("entities")?
            .iter()
            .map(|row| {
                (
                    row[id].as_str().unwrap_or_default().to_owned(),
                    row["state"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        ensure!(ours == theirs, "{table}: {ours:?} vs Ray's {theirs:?}");
    }

    // A count as a table and as CSV, the way a user reads it.
    let query = "SELECT count(*) AS attempts, count(DISTINCT session_name) AS sessions \
                 FROM task_attempts";
    let table = print(
        &engine,
        &Scope::default(),
        query,
        Format::Table,
        10,
        Vec::new(),
    )
    .await?;
    let table = String::from_utf8(table)?;
    let expected_count = rows.len();
    let row = table
        .lines()
        .nth(2)
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "));
    ensure!(
        row == Some(format!("{expected_count} | 1")),
        "table:\n{table}"
    );
    ensure!(table.trim_end().ends_with("(1 row)"), "table:\n{table}");
    let csv = print(
        &engine,
        &Scope::default(),
        query,
        Format::Csv,
        0,
        Vec::new(),
    )
    .await?;
    ensure!(
        String::from_utf8(csv)? == format!("attempts,sessions\n{expected_count},1\n"),
        "csv"
    );

    // A scope without the cluster has empty tables, with their columns.
    let elsewhere = Scope {
        cluster: Some(shared::keys::ClusterName::new("elsewhere")?),
        ..Scope::default()
    };
    let empty = print(
        &engine,
        &elsewhere,
        "SELECT count(*) AS n, max(ts_running) AS last FROM task_attempts",
        Format::Csv,
        0,
        Vec::new(),
    )
    .await?;
    ensure!(String::from_utf8(empty)? == "n,last\n0,\n", "empty scope");
    Ok(())
}

afterglow_tests::for_each_backend!(published_tables_hold_each_attempt_once_as_ray_lists_it);
