//! `afterglow compact` and `afterglow rebuild`: compaction from the command line.

use std::collections::BTreeMap;

use anyhow::Context as _;
use shared::compact::fold::QuietCheck;
use shared::compact::{CompactError, CompactReport, Compactor};
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

/// Compacts `keys` in runs of `--objects-per-run`, showing progress, then folds the sessions
/// they committed, and prints what they did. An object that cannot be read, or a session that
/// cannot be committed, is named and the rest compacted; the command then fails, so that a
/// script notices.
async fn compact_keys(
    compactor: &Compactor,
    keys: &[ObjectKey],
    runs: &RunArgs,
) -> anyhow::Result<()> {
    let per_run = runs.objects_per_run;
    let bar = progress::bar(keys.len() as u64, "compact");
    let in_runs = compactor
        .compact_in_runs(keys, per_run, |objects| bar.inc(objects as u64))
        .await;
    bar.finish_and_clear();
    let outcome = &in_runs.outcome;
    print(&outcome.report, keys.len().div_ceil(per_run.get()));
    for run in &in_runs.failed_runs {
        eprintln!(
            "a run of {} raw objects failed, none of them compacted (the first {}): {}",
            run.keys.len(),
            run.keys.first().map_or("", |key| key.as_str()),
            run.error
        );
    }
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
    let (folded, unfolded) = tidy_committed(compactor, &outcome.report.committed).await;
    println!("sessions folded into one base: {folded}");
    for (check, err) in &unfolded {
        eprintln!(
            "session {}/{} compacted but not folded (`afterglow compact --fold` folds it): {err}",
            check.cluster, check.session
        );
    }
    let left = in_runs.not_compacted().len();
    anyhow::ensure!(
        left == 0 && unfolded.is_empty(),
        "{left} of {} raw objects were not compacted and {} sessions not folded (why is above); the others were",
        keys.len(),
        unfolded.len()
    );
    Ok(())
}

/// Tidies each session the runs committed as the quiet check of its last commit does: its
/// deltas folded into one base. `serve` and the compact function run those checks once a
/// session has gone quiet; a command has no later, and a large session would otherwise keep
/// up to [`shared::compact::fold::FoldPolicy::max_deltas`] deltas for every read to open until
/// the next compaction. A session committed to meanwhile (by `serve` on the same store) is left
/// to that commit's own check. Returns how many sessions were folded, and those that could not
/// be (the others are folded all the same).
async fn tidy_committed<'a>(
    compactor: &Compactor,
    committed: &'a [QuietCheck],
) -> (usize, Vec<(&'a QuietCheck, CompactError)>) {
    // In commit order: a session's last check is its latest version.
    let latest: BTreeMap<_, _> = committed
        .iter()
        .map(|check| ((&check.cluster, &check.session), check))
        .collect();
    let bar = progress::bar(latest.len() as u64, "fold");
    let mut folded = 0;
    let mut failed = Vec::new();
    for check in latest.into_values() {
        match compactor.tidy_if_quiet(check).await {
            Ok(tidied) => folded += usize::from(tidied.folded),
            Err(err) => failed.push((check, err)),
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    (folded, failed)
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
        println!("sessions folded into one base: {folded}");
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
