//! `afterglow compact` and `afterglow rebuild`: compaction from the command line.

use anyhow::Context as _;
use shared::compact::{CompactReport, Compactor};
use shared::config::Config;
use shared::storage::ObjectKey;

use crate::cli::{CompactArgs, RebuildArgs, RunArgs, StoreArgs};
use crate::progress;
use crate::setup::{compactor_with_scratch, open_storage};

async fn compactor(
    store: &StoreArgs,
    config: &Config,
) -> anyhow::Result<(Compactor, tempfile::TempDir)> {
    let storage = open_storage(config, store.data_dir.clone()).await?;
    compactor_with_scratch(storage, config)
}

/// Compacts `keys` in runs of `--objects-per-run`, showing progress, and prints what they
/// did. An object that cannot be read, or a session that cannot be committed, is named and the
/// rest compacted; the command then fails, so that a script notices.
async fn compact_keys(
    compactor: &Compactor,
    keys: &[ObjectKey],
    runs: &RunArgs,
) -> anyhow::Result<()> {
    let per_run = runs.objects_per_run;
    let bar = progress::bar(keys.len() as u64, "compact");
    let outcome = compactor
        .compact_in_runs(keys, per_run, |objects| bar.inc(objects as u64))
        .await;
    bar.finish_and_clear();
    let outcome = outcome?;
    print(&outcome.report, keys.len().div_ceil(per_run.get()));
    for (key, err) in &outcome.unreadable {
        eprintln!("raw object left out: {key}: {err}");
    }
    for failed in &outcome.failed {
        eprintln!(
            "session {}/{} not compacted ({} raw objects): {}",
            failed.cluster,
            failed.session,
            failed.keys.len(),
            failed.error
        );
    }
    let left = outcome.not_compacted().len();
    anyhow::ensure!(
        left == 0,
        "{left} of {} raw objects were not compacted (why is above); the others were",
        keys.len()
    );
    Ok(())
}

fn print(report: &CompactReport, runs: usize) {
    println!(
        "{} raw objects read in {runs} runs: {} events ({} duplicates dropped, {} quarantined) in {} sessions; {} rows written",
        report.raw_objects,
        report.events,
        report.duplicates,
        report.quarantined,
        report.sessions,
        report.rows_written
    );
}

/// Compacts the given raw keys, or every raw object.
pub async fn compact(args: CompactArgs, config: Config) -> anyhow::Result<()> {
    let (compactor, _scratch) = compactor(&args.store, &config).await?;
    if args.fold {
        let folded = compactor.fold().await?;
        println!("folded the deltas of {folded} sessions into their base");
        return Ok(());
    }
    let keys = if args.keys.is_empty() {
        compactor.raw_keys().await?
    } else {
        args.keys
            .iter()
            .map(|key| ObjectKey::new(key.clone()))
            .collect::<Result<_, _>>()?
    };
    compact_keys(&compactor, &keys, &args.runs).await
}

/// Deletes every table and compacts every raw object again; first checks that the raw objects
/// still hold everything the tables do (`--force` skips the check).
pub async fn rebuild(args: RebuildArgs, config: Config) -> anyhow::Result<()> {
    let (compactor, _scratch) = compactor(&args.store, &config).await?;
    if !args.force {
        compactor
            .ensure_rebuildable()
            .await
            .context("refusing to rebuild (--force rebuilds anyway)")?;
    }
    let deleted = compactor.drop_tables().await?;
    println!("deleted {deleted} table objects");
    let keys = compactor.raw_keys().await?;
    compact_keys(&compactor, &keys, &args.runs).await
}
