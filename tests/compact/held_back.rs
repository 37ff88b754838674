//! A fault that outlasts a run's retries (a full disk, an unreadable object, a session whose
//! commits fail, a quarantine that cannot be written) holds back only the raw objects it
//! touches: in `serve`'s queue and in the runs of `rebuild` and `compact`, everything else is
//! compacted and recorded, and once the fault clears what was held back is compacted too, with
//! no restart, to Ray's history.

use std::sync::Arc;
use std::time::Duration;

use afterglow_tests::faults::Refuses;
use afterglow_tests::scenario::Scenario;
use afterglow_tests::{FixtureRun, compactor_over};
use anyhow::{Context as _, ensure};
use shared::compact::CompactSettings;
use shared::compact::schedule::backlog;
use shared::compact::schedule::queue::{CompactionQueue, QueueTiming};
use shared::storage::{ObjectKey, Storage};

/// `serve` keeps what a fault outlasting a run's retries kept it from compacting: writes
/// refused as by a full disk (no session can be committed), or one raw object that cannot be
/// read (the others are compacted and recorded). Once the fault clears, the same queue compacts
/// the rest with no new key and no restart (they are not left for the next start), and the
/// history equals Ray's.
#[tokio::test]
async fn serve_compacts_what_a_fault_held_back_once_it_clears_without_a_restart()
-> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    for fault in ["a full disk", "an unreadable raw object"] {
        let scenario = Scenario::local()?.with_raw(&run, &run.name).await?;
        let local = scenario.storage();
        let raw = scenario.raw_keys().await?;
        let first = raw.first().context("nothing stored")?.clone();
        let faulty = Arc::new(if fault == "a full disk" {
            Refuses::writes_under(Arc::clone(&local), "tables/")
        } else {
            Refuses::reads_of(Arc::clone(&local), vec![first.clone()])
        });
        let (compactor, _scratch) = compactor_over(&faulty, CompactSettings::default())?;
        let queue = CompactionQueue::spawn(compactor);
        ensure!(queue.catch_up().await? == raw.len());
        let parked = queue.idle().await;
        ensure!(faulty.refused() > 0, "{fault}: nothing was refused");
        let left = backlog::uncompacted(&*local).await?;
        ensure!(
            parked == Some(left.len()),
            "{fault}: idle reports {parked:?} keys parked, {} are not compacted",
            left.len()
        );
        if fault == "a full disk" {
            ensure!(
                left.len() == raw.len(),
                "{fault}: {} of {} left",
                left.len(),
                raw.len()
            );
        } else {
            ensure!(
                left == [first.clone()],
                "{fault}: left {left:?}, not only {first}"
            );
        }

        faulty.clear();
        all_compacted_within(&*local, Duration::from_secs(60))
            .await
            .with_context(|| format!("{fault}, once cleared"))?;
        ensure!(
            queue.idle().await == Some(0),
            "{fault}: keys still parked once all were compacted"
        );
        scenario
            .check(&run, &run.name, &format!("after {fault} cleared"))
            .await?;
    }
    Ok(())
}

/// A session whose commits fail (here its manifest cannot be written; a corrupt stored file
/// would do the same) holds back only its own raw objects: `serve`'s run commits the other
/// sessions it read and records their objects, and parks the failing session's, which are
/// compacted once the fault clears. Both histories then equal Ray's. The run does not fail as a
/// whole, parking every object in it; and a group of parked objects that keeps failing is split
/// even when no other run has succeeded since, so objects parked with a session that always
/// fails do not wait for the next start.
#[tokio::test]
async fn a_session_that_cannot_be_committed_holds_back_only_its_own_objects() -> anyhow::Result<()>
{
    use shared::raw::key::raw_object_cluster;

    let healthy = FixtureRun::named("basic-workload")?;
    let failing = FixtureRun::named("edge-cases")?;
    // Sorted first, so that a run which stopped at the first failing session would commit
    // nothing of the healthy one.
    let failing_cluster = "always-failing";
    let scenario = Scenario::local()?
        .with_raw(&healthy, &healthy.name)
        .await?
        .with_raw(&failing, failing_cluster)
        .await?;
    let local = scenario.storage();
    let raw = scenario.raw_keys().await?;
    let mut failing_keys: Vec<ObjectKey> = raw
        .iter()
        .filter(|key| raw_object_cluster(key).is_some_and(|c| c.as_str() == failing_cluster))
        .cloned()
        .collect();
    failing_keys.sort();
    ensure!(
        !failing_keys.is_empty() && failing_keys.len() < raw.len(),
        "{} of {} objects failing",
        failing_keys.len(),
        raw.len()
    );

    let faulty = Arc::new(Refuses::writes_under(
        Arc::clone(&local),
        "tables/manifests/cluster=always-failing/",
    ));
    let (queue, _scratch) = retrying_quickly(&faulty)?;
    ensure!(queue.catch_up().await? == raw.len());
    let parked = queue.idle().await;
    ensure!(faulty.refused() > 0, "nothing was refused");
    let mut left = backlog::uncompacted(&*local).await?;
    left.sort();
    ensure!(
        left == failing_keys,
        "{} objects left uncompacted, {} of them the failing session's",
        left.len(),
        failing_keys.len()
    );
    ensure!(
        parked == Some(failing_keys.len()),
        "idle reports {parked:?} keys parked, not the failing session's {}",
        failing_keys.len()
    );
    scenario
        .check(
            &healthy,
            &healthy.name,
            "beside a session that cannot be committed",
        )
        .await?;

    faulty.clear();
    all_compacted_within(&*local, Duration::from_secs(30))
        .await
        .context("the failing session's objects, once the fault cleared")?;
    ensure!(queue.idle().await == Some(0), "keys still parked");
    scenario
        .check(
            &failing,
            failing_cluster,
            "once its commits were no longer refused",
        )
        .await
}

/// A key that breaks every run it is in (here an object with a bad line, whose quarantine
/// cannot be written) holds back only itself in `serve`, even with no other traffic: its run
/// fails as a whole, the run's keys are parked together, and after a few failed tries they are
/// split although no run has succeeded since, until the key is alone. Once the fault clears it
/// is compacted too, and the history equals Ray's. Splitting only after some other run had
/// succeeded would leave every object of that run, with no traffic, for the next start, which
/// fails the same way.
#[tokio::test]
async fn a_key_that_breaks_every_run_holds_back_only_itself_with_no_other_traffic()
-> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::local()?.with_raw(&run, &run.name).await?;
    let local = scenario.storage();
    let raw = scenario.raw_keys().await?;
    ensure!(raw.len() >= 4, "only {} objects", raw.len());
    let spoiled = raw.get(raw.len() / 2).context("a middle object")?.clone();
    add_a_line_that_is_not_an_event(&*local, &spoiled).await?;

    let faulty = Arc::new(Refuses::writes_under(
        Arc::clone(&local),
        shared::keys::QUARANTINE_PREFIX,
    ));
    let (queue, _scratch) = retrying_quickly(&faulty)?;
    // Every object in one batch: a run without the spoiled one would succeed, which splits
    // the rest by the older rule.
    ensure!(queue.catch_up().await? == raw.len());
    let started = tokio::time::Instant::now();
    loop {
        let left = backlog::uncompacted(&*local).await?;
        if left == [spoiled.clone()] {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "{} of {} objects still uncompacted after 30 s with no other traffic",
            left.len(),
            raw.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(faulty.refused() > 0, "the quarantine was not refused");

    faulty.clear();
    all_compacted_within(&*local, Duration::from_secs(30))
        .await
        .context("the spoiled object, once the fault cleared")?;
    scenario
        .check(
            &run,
            &run.name,
            "a key that broke every run, compacted once the fault cleared",
        )
        .await
}

/// A run that fails as a whole (here its quarantine cannot be written) holds back only its own
/// raw objects when compacting in runs, as `afterglow rebuild` and `compact` do: the later runs
/// still run, and once the fault clears the failed run's objects compact to Ray's history. A
/// command stopped by the first such run would leave every later run's history out until it
/// was run again from the start.
#[tokio::test]
async fn a_run_that_fails_as_a_whole_holds_back_only_its_own_objects() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::local()?.with_raw(&run, &run.name).await?;
    let local = scenario.storage();
    let raw = scenario.raw_keys().await?;
    let per_run = std::num::NonZeroUsize::new(4).context("four")?;
    let chunks: Vec<&[ObjectKey]> = raw.chunks(per_run.get()).collect();
    ensure!(chunks.len() >= 3, "only {} runs", chunks.len());
    // One object of a middle run gets a line that is not an event, which is quarantined.
    let failing = *chunks.get(chunks.len() / 2).context("a middle run")?;
    let spoiled = failing.first().context("an object")?;
    add_a_line_that_is_not_an_event(&*local, spoiled).await?;

    let faulty = Arc::new(Refuses::writes_under(
        Arc::clone(&local),
        shared::keys::QUARANTINE_PREFIX,
    ));
    let (compactor, _scratch) = compactor_over(&faulty, CompactSettings::default())?;
    let in_runs = compactor.compact_in_runs(&raw, per_run, |_| ()).await;
    ensure!(faulty.refused() > 0, "the quarantine was not refused");
    let failed: Vec<&[ObjectKey]> = in_runs
        .failed_runs
        .iter()
        .map(|run| run.keys.as_slice())
        .collect();
    ensure!(
        failed == [failing],
        "failed runs: {:?}",
        in_runs.failed_runs
    );
    ensure!(
        in_runs.outcome.not_compacted().is_empty(),
        "{:?}",
        in_runs.outcome.failed
    );
    // Every other run ran, those after the failed one included.
    let read = in_runs.outcome.report.raw_objects;
    ensure!(
        read == raw.len() - failing.len(),
        "{read} of {} objects read",
        raw.len()
    );

    faulty.clear();
    compactor.compact(failing).await?;
    scenario
        .check(&run, &run.name, "a failed run compacted after the others")
        .await
}

/// `serve`'s compaction queue over `faulty` with the default compaction settings, retrying a
/// failed run after 10 ms and parking what keeps failing from 50 to 400 ms, so that a test sees
/// parked keys split and compacted within seconds; and the guard of its compactor's scratch.
fn retrying_quickly(faulty: &Arc<Refuses>) -> anyhow::Result<(CompactionQueue, tempfile::TempDir)> {
    let (compactor, scratch) = compactor_over(faulty, CompactSettings::default())?;
    let timing = QueueTiming {
        retry_delay: Duration::from_millis(10),
        park_first: Duration::from_millis(50),
        park_max: Duration::from_millis(400),
    };
    Ok((CompactionQueue::spawn_with(compactor, timing), scratch))
}

/// Waits until `serve`'s backlog in `storage` holds no uncompacted raw object, for `within` at
/// most.
async fn all_compacted_within(storage: &dyn Storage, within: Duration) -> anyhow::Result<()> {
    let started = tokio::time::Instant::now();
    loop {
        let left = backlog::uncompacted(storage).await?.len();
        if left == 0 {
            return Ok(());
        }
        ensure!(
            started.elapsed() < within,
            "{left} raw objects still not compacted after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Appends to the raw object at `key` a line that is not an event, which compaction quarantines.
async fn add_a_line_that_is_not_an_event(
    storage: &dyn Storage,
    key: &ObjectKey,
) -> anyhow::Result<()> {
    let mut text = afterglow_tests::gunzip(&storage.get(key).await?.body)?;
    text.extend_from_slice(b"not an event\n");
    let body = shared::gzip::gzip(&text)?;
    storage
        .put(key, body.into(), shared::storage::PutMode::Overwrite)
        .await?;
    Ok(())
}
