//! `afterglow compact` and `afterglow rebuild`: compaction from the command line.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use shared::compact::schedule::check_queue::CheckQueue;
use shared::compact::schedule::quiet::QuietCheck;
use shared::compact::{CompactError, CompactReport, Compactor};
use shared::config::{Config, StorageConfig};
use shared::storage::ObjectKey;

use crate::progress;
use crate::setup::{compactor_with_scratch, open_storage};

/// Which store a maintenance command works on.
#[derive(Debug, clap::Args)]
pub struct StoreArgs {
    /// A local data directory. Overrides AFTERGLOW_DATA_DIR and AFTERGLOW_BUCKET.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

/// Flags of `afterglow rebuild`.
#[derive(Debug, clap::Args)]
pub struct RebuildArgs {
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Rebuild even when raw objects the tables were built from are gone: the history only
    /// the tables still hold is dropped.
    #[arg(long)]
    pub force: bool,
    /// How many raw objects are compacted per run.
    #[command(flatten)]
    pub runs: RunArgs,
}

/// How `compact` and `rebuild` split their raw objects into runs.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Raw objects per compaction run, as the compact function's batch: a run holds its
    /// objects' attempts in memory until it commits, so a larger run needs more memory.
    #[arg(long, value_name = "N", default_value_t = run_objects())]
    pub objects_per_run: NonZeroUsize,
}

/// [`shared::compact::RUN_OBJECTS`], which is not zero.
fn run_objects() -> NonZeroUsize {
    NonZeroUsize::new(shared::compact::RUN_OBJECTS).unwrap_or(NonZeroUsize::MIN)
}

/// Flags of `afterglow compact`.
#[derive(Debug, clap::Args)]
pub struct CompactArgs {
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Raw object keys (`raw/{cluster}/…ndjson.gz`); all raw objects when none are given.
    #[arg(value_name = "KEY")]
    pub keys: Vec<String>,
    /// Only fold every session's delta files into its base now, then sum each cluster's ended
    /// sessions into its rollup (compaction also does both on its own, once a session has gone
    /// quiet); no raw object is read.
    #[arg(long, conflicts_with = "keys")]
    pub fold: bool,
    /// How many raw objects are compacted per run.
    #[command(flatten)]
    pub runs: RunArgs,
}

async fn compactor(
    store: &StoreArgs,
    config: &Config,
) -> anyhow::Result<(Compactor, tempfile::TempDir)> {
    let storage = open_storage(config, store.data_dir.clone()).await?;
    compactor_with_scratch(storage, config)
}

/// What [`compact_keys`] does once the runs are over.
#[derive(Clone, Copy, Debug)]
enum AfterRuns {
    /// Fold each session the runs committed into one base (`rebuild`, and `compact` of every
    /// raw object), as the quiet check of its last commit would.
    Fold,
    /// Leave folding to the fold policy and to the sessions' quiet checks, as the compact
    /// function does (`compact KEY…`, which may run beside it and is used to time single
    /// runs).
    LeaveToPolicy,
}

/// Compacts `keys` in runs of `--objects-per-run`, showing progress, then does `then`, and
/// prints what they did. The sessions' quiet checks still to come (to fold a session, or to
/// delete the files a fold replaced once their grace period is over) go to `queue`, the
/// compact function's, when there is one. An object that cannot be read, a session that
/// cannot be committed or folded, a run that fails as a whole, or checks that cannot be
/// queued are named and the rest done; the command then fails, listing the objects to compact
/// again, so that a script notices.
async fn compact_keys(
    compactor: &Compactor,
    keys: &[ObjectKey],
    runs: &RunArgs,
    then: AfterRuns,
    queue: Option<CheckQueue>,
) -> anyhow::Result<()> {
    let per_run = runs.objects_per_run;
    let bar = progress::bar(keys.len() as u64, "compact");
    let in_runs = compactor
        .compact_in_runs(keys, per_run, |objects| bar.inc(objects as u64))
        .await;
    bar.finish_and_clear();
    let outcome = &in_runs.outcome;
    print(
        &outcome.report,
        keys.len().div_ceil(per_run.get()),
        in_runs.failed_runs.len(),
    );
    for run in &in_runs.failed_runs {
        eprintln!(
            "a run of {} raw objects failed, none of them compacted: {}",
            run.keys.len(),
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
    let (folds, unqueued) =
        after_runs(compactor, &outcome.report.committed, then, queue.as_ref()).await;
    let mut left: Vec<&ObjectKey> = in_runs.not_compacted().into_iter().collect();
    left.sort();
    if !left.is_empty() {
        eprintln!("not compacted (compact them again with `afterglow compact KEY…`):");
        for key in &left {
            eprintln!("{key}");
        }
    }
    let mut problems = Vec::new();
    if !left.is_empty() {
        problems.push(format!(
            "{} of {} raw objects were not compacted",
            left.len(),
            keys.len()
        ));
    }
    if !folds.failed.is_empty() {
        problems.push(format!("{} session(s) were not folded", folds.failed.len()));
    }
    if unqueued > 0 {
        problems.push(format!(
            "the quiet checks of {unqueued} session(s) were not queued"
        ));
    }
    anyhow::ensure!(
        problems.is_empty(),
        "{} (why is above); everything else was",
        problems.join(" and ")
    );
    Ok(())
}

/// Does `then` for the sessions `committed` names, and queues their quiet checks still to
/// come on `queue`, if any. Returns what folding came to and how many checks were not queued.
async fn after_runs<'a>(
    compactor: &Compactor,
    committed: &'a [QuietCheck],
    then: AfterRuns,
    queue: Option<&CheckQueue>,
) -> (Folds<'a>, usize) {
    let newest = newest_per_session(committed);
    let (folds, to_check) = match then {
        AfterRuns::Fold => {
            let folds = fold_committed(compactor, &newest).await;
            folds.print(compactor.settings().retire_grace, queue.is_some());
            // A session that could not be folded is checked again from its last commit.
            let again = folds.holding.iter().cloned();
            let unfolded = folds.failed.iter().map(|(check, _)| (*check).clone());
            let to_check: Vec<QuietCheck> = again.chain(unfolded).collect();
            (folds, to_check)
        }
        AfterRuns::LeaveToPolicy => {
            let to_check = newest.into_iter().cloned().collect();
            (Folds::default(), to_check)
        }
    };
    let unqueued = match queue {
        Some(queue) => hand_over(queue, &to_check).await,
        None => 0,
    };
    (folds, unqueued)
}

/// What folding the sessions a command committed came to ([`fold_committed`]).
#[derive(Debug, Default)]
struct Folds<'a> {
    /// Sessions now in one base, folded here or already.
    whole: usize,
    /// Of those, the ones folded here.
    folded: usize,
    /// Sessions keeping the files a fold replaced through their grace period, as their tidy
    /// left them: checked again once that is over, they delete those files.
    holding: Vec<QuietCheck>,
    /// Sessions committed to meanwhile (by `serve` on the same store), left to that commit's
    /// own quiet check.
    changed: usize,
    /// Sessions that could not be folded, and why.
    failed: Vec<(&'a QuietCheck, CompactError)>,
}

impl Folds<'_> {
    /// Prints the counts, and names the sessions that could not be folded. `grace` is how long
    /// replaced files are kept; `queued` says whether the checks that delete them afterwards
    /// go to the compact function.
    fn print(&self, grace: Duration, queued: bool) {
        let changed = if self.changed > 0 {
            format!(
                "; changed meanwhile, left to their own check: {}",
                self.changed
            )
        } else {
            String::new()
        };
        println!(
            "sessions in one base: {} ({} folded now){changed}",
            self.whole, self.folded
        );
        if !self.holding.is_empty() {
            println!(
                "sessions keeping the files their fold replaced for {} s, for readers that may \
                 still use them: {}",
                grace.as_secs(),
                self.holding.len()
            );
            if !queued {
                println!(
                    "`afterglow compact --fold` after that, or the next `serve` on this store, \
                     deletes them"
                );
            }
        }
        for (check, err) in &self.failed {
            eprintln!(
                "session {}/{} compacted but not folded (`afterglow compact --fold` folds it): {err}",
                check.cluster, check.session
            );
        }
    }
}

/// Each session's newest check among `committed`: an older one's would find it changed.
fn newest_per_session(committed: &[QuietCheck]) -> Vec<&QuietCheck> {
    let mut latest: BTreeMap<_, &QuietCheck> = BTreeMap::new();
    for check in committed {
        let newest = latest
            .entry((&check.cluster, &check.session))
            .or_insert(check);
        if check.sequence > newest.sequence {
            *newest = check;
        }
    }
    latest.into_values().collect()
}

/// Tidies each session as the quiet check of its newest commit (`latest`) does: its deltas
/// folded into one base. `serve` and the compact function run those checks once a session has
/// gone quiet; a command has no later, and a large session would otherwise keep up to
/// [`shared::compact::fold::FoldPolicy::max_deltas`] deltas for every read to open until the
/// next compaction. A session that could not be folded does not stop the others.
async fn fold_committed<'a>(compactor: &Compactor, latest: &[&'a QuietCheck]) -> Folds<'a> {
    let bar = progress::bar(latest.len() as u64, "fold");
    let mut folds = Folds::default();
    for &check in latest {
        match compactor.tidy_if_quiet(check).await {
            Ok(tidied) if tidied.changed => folds.changed += 1,
            Ok(tidied) => {
                folds.whole += 1;
                folds.folded += usize::from(tidied.folded);
                if tidied.again {
                    folds.holding.push(QuietCheck {
                        sequence: tidied.sequence,
                        ..check.clone()
                    });
                }
            }
            Err(err) => folds.failed.push((check, err)),
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    folds
}

fn print(report: &CompactReport, runs: usize, failed_runs: usize) {
    let failed = if failed_runs > 0 {
        format!(" ({failed_runs} failed)")
    } else {
        String::new()
    };
    println!(
        "{} raw objects read in {runs} runs{failed}: {} events ({} duplicates dropped, {} quarantined), sessions: {}, rows written: {}",
        report.raw_objects,
        report.events,
        report.duplicates,
        report.quarantined,
        report.sessions,
        report.rows_written
    );
}

/// Queues `checks` on the compact function's queue, which runs each once the quiet period
/// has passed; returns how many could not be queued (said why).
async fn hand_over(queue: &CheckQueue, checks: &[QuietCheck]) -> usize {
    if checks.is_empty() {
        return 0;
    }
    match queue.send(checks).await {
        Ok(()) => {
            println!(
                "quiet checks of {} session(s) queued for the compact function: it folds them \
                 and deletes the files folds replaced once their grace period is over",
                checks.len()
            );
            0
        }
        Err(err) => {
            eprintln!("could not queue the quiet checks for the compact function: {err}");
            err.failed
        }
    }
}

/// The compact function's queue, when the command works on the deployment's bucket (no
/// `--data-dir`) and AFTERGLOW_COMPACT_QUEUE_URL names the queue (the stack's `CompactQueueUrl`
/// output): the function then runs the quiet checks of the sessions the command committed, as
/// it does for its own commits, each after AFTERGLOW_FOLD_QUIET_SECONDS.
async fn function_queue(store: &StoreArgs, config: &Config) -> Option<CheckQueue> {
    match (&store.data_dir, &config.storage, &config.compact_queue_url) {
        (None, StorageConfig::S3(_), Some(url)) => {
            Some(CheckQueue::connect(url.clone(), config.fold_quiet).await)
        }
        _ => None,
    }
}

/// Compacts the given raw keys, or every raw object.
pub async fn compact(args: CompactArgs, config: Config) -> anyhow::Result<()> {
    let (compactor, _scratch) = compactor(&args.store, &config).await?;
    if args.fold {
        let folded = compactor.fold().await?;
        println!("folded {folded} sessions into one base each (the others were one already)");
        return Ok(());
    }
    let (keys, then) = if args.keys.is_empty() {
        (compactor.raw_keys().await?, AfterRuns::Fold)
    } else {
        let keys = args
            .keys
            .iter()
            .map(|key| ObjectKey::new(key.clone()))
            .collect::<Result<_, _>>()?;
        (keys, AfterRuns::LeaveToPolicy)
    };
    let queue = function_queue(&args.store, &config).await;
    compact_keys(&compactor, &keys, &args.runs, then, queue).await
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
    println!("dropped {deleted} table objects (the manifests emptied, the rest deleted)");
    let keys = compactor.raw_keys().await?;
    let queue = function_queue(&args.store, &config).await;
    compact_keys(&compactor, &keys, &args.runs, AfterRuns::Fold, queue).await
}
