//! `serve`'s backlog: raw objects it stored but never compacted (a crash, a kill, a clock that
//! stepped back) are found and compacted at its next start, and a start after a clean run has
//! nothing to compact.

use afterglow_tests::ray::ensure_same;
use afterglow_tests::scenario::Scenario;
use afterglow_tests::{FixtureRun, bodies, keys_under, now_ms};
use anyhow::{Context as _, ensure};
use shared::compact::CompactSettings;
use shared::compact::schedule::queue::CompactionQueue;
use shared::storage::ObjectKey;

/// `serve` queues compaction in memory: a server that stopped after storing Ray's batches but
/// before compacting them (a crash, a kill, a stop while runs were failing) must not lose them.
/// The next start finds every raw object no compaction record names, and its rows agree with
/// Ray; a start after a clean run has nothing to compact.
#[tokio::test]
async fn raw_objects_left_uncompacted_are_compacted_at_the_next_start() -> anyhow::Result<()> {
    use shared::compact::schedule::backlog;

    let run = FixtureRun::all()?
        .into_iter()
        .next()
        .context("no fixture run")?;
    // The "crashed" server: ingest answered 200 and stored every batch; nothing compacted them.
    let scenario = Scenario::local()?.with_raw(&run, &run.name).await?;
    let storage = scenario.storage();
    ensure!(
        scenario.rows(&run.name).await?.is_empty(),
        "nothing compacted yet"
    );
    ensure!(
        storage
            .list(shared::keys::COMPACTED_RECORDS_PREFIX)
            .await?
            .is_empty(),
        "no compaction recorded yet"
    );

    // The next start: everything stored is queued and compacted.
    let raw_objects = {
        let (compactor, _scratch) = scenario.compactor(CompactSettings::default())?;
        let queue = CompactionQueue::spawn(compactor);
        let queued = queue.catch_up().await?;
        queue.idle().await;
        queued
    };
    let stored = storage.list("raw/").await?.len();
    ensure!(
        raw_objects == stored && stored > 0,
        "queued {raw_objects} of {stored} raw objects"
    );
    let rows = scenario.rows(&run.name).await?;
    afterglow_tests::ray::check(&run, &rows, "compacted at the next start")?;
    ensure!(
        backlog::uncompacted(&*storage).await?.is_empty(),
        "the runs recorded what they compacted"
    );

    // Another start right away: nothing left to compact, and nothing changes.
    let (compactor, _scratch) = scenario.compactor(CompactSettings::default())?;
    let queue = CompactionQueue::spawn(compactor);
    ensure!(queue.catch_up().await? == 0, "compacted again");
    queue.idle().await;
    let again = scenario.rows(&run.name).await?;
    ensure_same(&rows, &again, "a second catch-up")?;
    Ok(())
}

/// Raw objects are named by ULIDs from the wall clock, which can step back (NTP) or stall behind
/// a slow write. A server that compacted most of a run, then stored the rest under a clock an
/// hour behind and crashed before compacting it, must still find that rest at the next start;
/// a watermark of ULID times would skip anything older than its margin.
#[tokio::test]
async fn raw_objects_written_under_a_stepped_back_clock_are_compacted_at_the_next_start()
-> anyhow::Result<()> {
    use shared::keys::ClusterName;
    use shared::raw::key::raw_object_key;

    let run = FixtureRun::named("basic-workload")?;
    let delivered = bodies(&run)?;
    let (early, late) = delivered.split_at(delivered.len() / 2);

    // A server that compacts the first half (and records it).
    let scenario = Scenario::local()?;
    let storage = scenario.storage();
    scenario.ingest_and_compact(&run.name, early).await?;
    let compacted: Vec<ObjectKey> = keys_under(&*storage, "raw/").await?;

    // The second half stored, never compacted, under a clock an hour behind.
    let scenario = scenario.with_raw_bodies(&run.name, late).await?;
    let cluster = ClusterName::new(run.name.as_str())?;
    let hour_ago = now_ms()? - 3_600_000;
    let mut moved = 0_u128;
    for meta in storage.list("raw/").await? {
        if compacted.contains(&meta.key) {
            continue;
        }
        let body = storage.get(&meta.key).await?.body;
        let stepped = raw_object_key(&cluster, ulid::Ulid::from_parts(hour_ago, moved))?;
        storage
            .put(&stepped, body, shared::storage::PutMode::Create)
            .await?;
        storage.delete(&meta.key).await?;
        moved += 1;
    }
    ensure!(moved > 0, "nothing was written under the stepped clock");

    // The next start finds exactly those, and the history is whole.
    let (compactor, _scratch) = scenario.compactor(CompactSettings::default())?;
    let queue = CompactionQueue::spawn(compactor);
    let queued = queue.catch_up().await?;
    queue.idle().await;
    ensure!(
        queued == usize::try_from(moved)?,
        "queued {queued} of the {moved} objects written under the stepped clock"
    );
    scenario.check(&run, &run.name, "after a clock step").await
}
