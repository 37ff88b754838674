//! Folds: a session's deltas written into a new base once there are too many, once they hold a
//! share of the base, or on request (`afterglow compact --fold`); a small session stays in one
//! file. The rows are Ray's after every fold, and the files a fold replaced are retired, not
//! deleted at once.

use afterglow_tests::scenario::Scenario;
use afterglow_tests::{FixtureRun, keeping_deltas};
use anyhow::ensure;
use shared::compact::CompactSettings;
use shared::compact::fold::FoldPolicy;

/// Many small compactions fold their deltas into a base; the rows stay the same and the old
/// files are retired, not deleted at once.
#[tokio::test]
async fn deltas_fold_into_a_base_without_changing_rows() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::local()?.with_raw(&run, "fold").await?;
    let storage = scenario.storage();
    let settings = CompactSettings {
        fold: FoldPolicy {
            max_deltas: 3,
            ..FoldPolicy::default()
        },
        ..CompactSettings::default()
    };
    let (compactor, _scratch) = scenario.compactor(settings)?;
    for key in compactor.raw_keys().await? {
        compactor.compact(&[key]).await?;
    }
    // Runs after a fold found stored versions in the new base from its keys, read once.
    let held = compactor.stored_keys();
    ensure!(held.rows_read() > 0 && held.scans_after_error() == 0 && held.scans_after_check() == 0);
    let manifest = scenario.only_manifest("fold").await?;
    ensure!(manifest.task_attempts.base.len() == 1, "{manifest:?}");
    ensure!(manifest.task_attempts.deltas.len() <= 3, "{manifest:?}");
    ensure!(
        !manifest.retired.is_empty(),
        "superseded files wait out the grace period"
    );
    for retired in &manifest.retired {
        ensure!(
            storage.get(&retired.key).await.is_ok(),
            "{} deleted too early",
            retired.key
        );
    }
    scenario.check(&run, "fold", "folded into a base").await
}

/// `fold` (`afterglow compact --fold`) turns a quiet session's deltas into one base at once;
/// the rows are still Ray's.
#[tokio::test]
async fn fold_turns_every_delta_into_one_base() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::local()?.with_raw(&run, "quiet").await?;
    let (compactor, _scratch) = scenario.compactor(keeping_deltas())?;
    for key in compactor.raw_keys().await? {
        compactor.compact(&[key]).await?;
    }
    let before = scenario.only_manifest("quiet").await?;
    ensure!(before.task_attempts.deltas.len() > 1, "{before:?}");
    ensure!(compactor.fold().await? == 1, "one session folded");
    let after = scenario.only_manifest("quiet").await?;
    ensure!(after.task_attempts.base.len() == 1, "{after:?}");
    ensure!(after.task_attempts.deltas.is_empty(), "{after:?}");
    ensure!(compactor.fold().await? == 0, "nothing left to fold");
    scenario.check(&run, "quiet", "folded on request").await
}

/// Deltas fold once they hold half the base's rows, however few they are: compacted one raw
/// object at a time with a delta limit never reached, the session still gets a base, and after
/// every run its deltas hold less than half of it (or fewer rows than the minimum).
#[tokio::test]
async fn deltas_fold_once_they_hold_a_share_of_the_base() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::local()?.with_raw(&run, "tiers").await?;
    let policy = FoldPolicy {
        max_deltas: 1_000,
        delta_share_percent: 50,
        min_delta_rows: 10,
        ..FoldPolicy::default()
    };
    let settings = CompactSettings {
        fold: policy.clone(),
        ..CompactSettings::default()
    };
    let (compactor, _scratch) = scenario.compactor(settings)?;
    let mut bases = std::collections::BTreeSet::new();
    for key in compactor.raw_keys().await? {
        compactor.compact(&[key]).await?;
        let manifest = scenario.only_manifest("tiers").await?;
        let table = &manifest.task_attempts;
        ensure!(
            policy.due(table).is_none(),
            "left due for a fold: {table:?}"
        );
        bases.extend(table.base.iter().map(|file| file.key.clone()));
    }
    ensure!(
        bases.len() >= 2,
        "the base was rewritten {} time(s)",
        bases.len()
    );
    scenario.check(&run, "tiers", "folded by share").await
}

/// A small session stays in one file: compacted one raw object at a time with the default
/// policy, after every run it is one base or one delta, never more, and its rows still agree
/// with Ray.
#[tokio::test]
async fn a_small_session_stays_in_one_file() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::local()?.with_raw(&run, "small").await?;
    let (compactor, _scratch) = scenario.compactor(CompactSettings::default())?;
    let keys = compactor.raw_keys().await?;
    ensure!(keys.len() > 2, "{} raw objects tell nothing", keys.len());
    let mut folds = 0;
    for key in keys {
        compactor.compact(&[key]).await?;
        let table = scenario.only_manifest("small").await?.task_attempts;
        ensure!(
            table.base.len() + table.deltas.len() <= 1,
            "a small session left in several files: {table:?}"
        );
        folds += usize::from(!table.base.is_empty() && table.deltas.is_empty());
    }
    ensure!(folds > 1, "folded {folds} time(s)");
    scenario.check(&run, "small", "kept in one file").await
}
