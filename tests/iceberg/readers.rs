//! The Iceberg readers that are not ours (PyIceberg 0.12 and DuckDB's `iceberg_scan`, run by
//! `tests/iceberg/read.py`), and the comparison of what they read with what `afterglow sql`
//! answers and Ray lists.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use afterglow::sql::{Format, print};
use afterglow_tests::FixtureRun;
use afterglow_tests::api::our_rows;
use afterglow_tests::ray::check;
use anyhow::{Context as _, bail, ensure};
use serde_json::Value as Json;
use shared::iceberg::metadata_location;
use shared::query::read::params::Scope;
use shared::query::{QueryEngine, QuerySettings};
use shared::storage::Storage;

/// The tables compared: every published table the captured run has rows in.
pub(super) const TABLES: [&str; 5] = ["task_attempts", "jobs", "actors", "nodes", "workers"];

/// How the readers find the tables.
pub(super) enum Found<'a> {
    /// By each table's metadata file in the store.
    Directory,
    /// By name, in a Glue database of the catalog at `endpoint`.
    Glue {
        /// The database.
        database: &'a str,
        /// The catalog's URL.
        endpoint: &'a str,
    },
}

/// The Python with PyIceberg and DuckDB's extensions (`tests/iceberg/setup`), or `None` to
/// skip when it is not installed and `AFTERGLOW_TEST_ICEBERG` does not ask for it.
pub(super) fn readers_python() -> anyhow::Result<Option<PathBuf>> {
    let python = std::env::var_os("AFTERGLOW_ICEBERG_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|home| {
                PathBuf::from(home).join(".cache/afterglow/iceberg-readers-venv/bin/python")
            })
        })
        .context("neither AFTERGLOW_ICEBERG_PYTHON nor HOME is set")?;
    if python.exists() {
        return Ok(Some(python));
    }
    if std::env::var_os("AFTERGLOW_TEST_ICEBERG").is_some() {
        bail!(
            "{} is missing: run tests/iceberg/setup (scripts/test does)",
            python.display()
        );
    }
    eprintln!(
        "skipping the Iceberg readers: run tests/iceberg/setup, or set AFTERGLOW_TEST_ICEBERG=1"
    );
    Ok(None)
}

/// What `tests/iceberg/read.py` prints given `args` (and, for a Glue catalog, its endpoint), as
/// JSON.
async fn read_py(
    python: &PathBuf,
    args: &[String],
    glue_endpoint: Option<&str>,
) -> anyhow::Result<Json> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("iceberg/read.py");
    let mut command = tokio::process::Command::new(python);
    command.arg(&script).args(args);
    if let Some(endpoint) = glue_endpoint {
        command.env("AWS_ENDPOINT_URL_GLUE", endpoint);
    }
    let output = command
        .output()
        .await
        .with_context(|| format!("cannot run {}", python.display()))?;
    ensure!(
        output.status.success(),
        "{} {args:?} failed: {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).with_context(|| format!("read.py {args:?} is not JSON"))
}

/// Each table's newest metadata file.
async fn newest_metadata(storage: &dyn Storage) -> anyhow::Result<Vec<String>> {
    let mut found = Vec::with_capacity(TABLES.len());
    for table in TABLES {
        found.push(metadata_location(storage, table).await?);
    }
    Ok(found)
}

/// Every table's rows as each reader (`pyiceberg`, `duckdb`) reads them.
async fn read_with_readers(
    python: &PathBuf,
    found: &Found<'_>,
    storage: &dyn Storage,
) -> anyhow::Result<BTreeMap<String, BTreeMap<String, Vec<Json>>>> {
    let read = match found {
        Found::Directory => read_py(python, &newest_metadata(storage).await?, None).await?,
        Found::Glue { database, endpoint } => {
            let args: Vec<String> = ["--glue", database]
                .into_iter()
                .chain(TABLES)
                .map(str::to_owned)
                .collect();
            read_py(python, &args, Some(endpoint)).await?
        }
    };
    serde_json::from_value(read).context("the readers' answer is not rows by reader and table")
}

/// How many rows each reader (`pyiceberg`, `duckdb`) reads of each table at `metadata` (a
/// metadata file of each table, any version): a snapshot other than the newest.
pub(super) async fn rows_read_at(
    python: &PathBuf,
    metadata: &[String],
) -> anyhow::Result<BTreeMap<String, BTreeMap<String, u64>>> {
    let args: Vec<String> = std::iter::once("--count".to_owned())
        .chain(metadata.iter().cloned())
        .collect();
    serde_json::from_value(read_py(python, &args, None).await?)
        .context("the counts are not counts by table and reader")
}

/// Every data file's column statistics in the manifests bound what the file holds, as DuckDB
/// reads it (counts and integer bounds exact, text bounds around it), and bound it closely
/// enough that PyIceberg plans no file for a filter below every file's lower bound.
pub(super) async fn statistics_bound_every_file(
    python: &PathBuf,
    storage: &Arc<dyn Storage>,
    what: &str,
) -> anyhow::Result<()> {
    let args: Vec<String> = std::iter::once("--stats".to_owned())
        .chain(newest_metadata(&**storage).await?)
        .collect();
    let stats: Json = read_py(python, &args, None).await?;
    for table in TABLES {
        let of_table = &stats[table];
        let files = of_table["files"].as_u64().unwrap_or_default();
        ensure!(
            files > 0 && of_table["checked"].as_u64() > Some(files),
            "{what}: {table}'s statistics were not checked: {of_table}"
        );
        ensure!(
            of_table["wrong"].as_array().is_some_and(Vec::is_empty),
            "{what}: {table}'s statistics are wrong: {}",
            of_table["wrong"]
        );
        let pruned = &of_table["pruned"];
        ensure!(
            pruned["below"] == 0 && pruned["from"].as_u64() == Some(files),
            "{what}: {table}: a filter on {} planned {} of {files} files below every lower \
             bound and {} from it",
            pruned["column"],
            pruned["below"],
            pruned["from"]
        );
    }
    Ok(())
}

/// What `afterglow sql` answers for `SELECT * FROM {table}`.
async fn our_answer(engine: &QueryEngine, table: &str) -> anyhow::Result<Vec<Json>> {
    let printed = print(
        engine,
        &Scope::default(),
        &format!("SELECT * FROM {table}"),
        Format::Json,
        0,
        Vec::new(),
    )
    .await?;
    let rows: Json = serde_json::from_slice(&printed)?;
    Ok(rows.as_array().context("not an array")?.clone())
}

/// `rows` in an order of their own, each as its JSON text (its keys in order).
fn canonical(rows: &[Json]) -> Vec<String> {
    let mut texts: Vec<String> = rows.iter().map(Json::to_string).collect();
    texts.sort();
    texts
}

/// Both readers read every table exactly as `afterglow sql` answers it, and their attempts of
/// each of `clusters` agree with Ray's own list (no clusters: every table is empty).
pub(super) async fn readers_agree(
    python: &PathBuf,
    found: &Found<'_>,
    storage: &Arc<dyn Storage>,
    run: &FixtureRun,
    clusters: &[&str],
    what: &str,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let engine = QueryEngine::open(Arc::clone(storage), QuerySettings::under(dir.path()))?;
    let read = read_with_readers(python, found, &**storage).await?;
    for table in TABLES {
        let ours = canonical(&our_answer(&engine, table).await?);
        ensure!(
            ours.is_empty() == clusters.is_empty(),
            "{what}: afterglow sql has {} rows of {table}, with clusters {clusters:?}",
            ours.len()
        );
        for (reader, tables) in &read {
            let theirs = canonical(tables.get(table).map_or(&[][..], Vec::as_slice));
            if theirs != ours {
                let missing: Vec<&String> = ours
                    .iter()
                    .filter(|row| !theirs.contains(row))
                    .take(2)
                    .collect();
                let extra: Vec<&String> = theirs
                    .iter()
                    .filter(|row| !ours.contains(row))
                    .take(2)
                    .collect();
                bail!(
                    "{what}: {reader} read {} rows of {table}, afterglow sql answers {}; \
                     not read: {missing:?}; read but not answered: {extra:?}",
                    theirs.len(),
                    ours.len()
                );
            }
        }
    }
    for (reader, tables) in &read {
        let attempts = tables.get("task_attempts").context("no task_attempts")?;
        for cluster in clusters {
            let of_cluster: Vec<Json> = attempts
                .iter()
                .filter(|row| row["cluster"] == *cluster)
                .cloned()
                .collect();
            // `our_rows` refuses an attempt read twice: no superseded row is seen.
            check(
                run,
                &our_rows(&of_cluster)?,
                &format!("{reader}, {cluster}, {what}"),
            )?;
        }
    }
    Ok(())
}
