//! `serve` tidies quiet sessions itself, its compaction queue standing in for the delayed
//! checks: it folds a session no run changed for the quiet period and deletes the files a fold
//! replaced once their grace is over; at its start it tidies what an earlier process left, one
//! session at a time, without waiting for the scan that finds them; a check that keeps failing
//! waits longer each time.

use std::sync::Arc;
use std::time::Duration;

use afterglow_tests::scenario::Scenario;
use afterglow_tests::{FixtureRun, compactor_over};
use anyhow::{Context as _, ensure};
use shared::compact::CompactSettings;
use shared::compact::fold::FoldPolicy;
use shared::compact::schedule::queue::CompactionQueue;

/// In `serve`, the compaction queue stands in for the delayed checks: a session no run has
/// changed for the quiet period is folded into one base, and with no grace period the files it
/// replaced are deleted at once. Rows still agree with Ray.
#[tokio::test]
async fn serve_folds_a_session_once_it_goes_quiet() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::local()?.with_raw(&run, "idle").await?;
    let storage = scenario.storage();
    let quiet = Duration::from_secs(3);
    let settings = CompactSettings {
        fold: FoldPolicy {
            quiet,
            ..FoldPolicy::default()
        },
        retire_grace: Duration::ZERO,
        ..CompactSettings::default()
    };
    let (compactor, _scratch) = scenario.compactor(settings)?;
    let keys = compactor.raw_keys().await?;
    let queue = CompactionQueue::spawn(compactor);
    let started = tokio::time::Instant::now();
    for key in keys {
        queue.notify(key);
    }
    queue.idle().await;
    let compacted = scenario.only_manifest("idle").await?;
    ensure!(
        started.elapsed() < quiet,
        "compaction took longer than the quiet period; the test cannot tell"
    );
    ensure!(!compacted.task_attempts.deltas.is_empty(), "{compacted:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let folded = loop {
        let manifest = scenario.only_manifest("idle").await?;
        if manifest.task_attempts.deltas.is_empty() {
            break manifest;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "not folded a minute after going quiet: {manifest:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    ensure!(folded.task_attempts.base.len() == 1, "{folded:?}");
    ensure!(folded.retired.is_empty(), "{folded:?}");
    for delta in &compacted.task_attempts.deltas {
        for key in delta.keys() {
            ensure!(
                storage.get(key).await.is_err(),
                "{key} was replaced but is still stored"
            );
        }
    }
    scenario
        .check(&run, "idle", "folded once quiet in serve")
        .await
}

/// A store as a rebuild in runs leaves it: basic-workload under each of `clusters`, compacted
/// in runs of four objects, every object recorded as compacted. Each run folds the small
/// session, so every session keeps the files its folds replaced until their grace period is
/// over and a quiet check deletes them. A `serve` stopped before its quiet checks ran leaves
/// the same. With the settings of the tests that tidy it: a short grace and quiet period.
struct UntidyStore {
    run: FixtureRun,
    scenario: Scenario,
    settings: CompactSettings,
    clusters: Vec<String>,
}

impl UntidyStore {
    async fn new(clusters: &[&str]) -> anyhow::Result<Self> {
        use shared::compact::schedule::backlog;

        let run = FixtureRun::named("basic-workload")?;
        let mut scenario = Scenario::local()?;
        for cluster in clusters {
            scenario = scenario.with_raw(&run, cluster).await?;
        }
        let raw = scenario.raw_keys().await?;
        let settings = CompactSettings {
            retire_grace: Duration::from_millis(300),
            fold: FoldPolicy {
                quiet: Duration::from_millis(100),
                ..FoldPolicy::default()
            },
            ..CompactSettings::default()
        };
        let (earlier, _scratch) = scenario.compactor(settings.clone())?;
        let per_run = std::num::NonZeroUsize::new(4).context("four")?;
        let in_runs = earlier.compact_in_runs(&raw, per_run, |_| ()).await;
        ensure!(in_runs.not_compacted().is_empty(), "{in_runs:?}");
        backlog::record(&*scenario.storage(), &raw).await?;
        let store = Self {
            run,
            scenario,
            settings,
            clusters: clusters
                .iter()
                .map(|cluster| (*cluster).to_owned())
                .collect(),
        };
        for cluster in &store.clusters {
            ensure!(
                store.retired(cluster).await? > 0,
                "{cluster}: the runs replaced no file"
            );
        }
        Ok(store)
    }

    /// How many replaced files the manifest of `cluster`'s only session still keeps.
    async fn retired(&self, cluster: &str) -> anyhow::Result<usize> {
        use shared::keys::ClusterName;
        use shared::tables::manifest;

        let local = self.scenario.storage();
        let manifests = local
            .list(&shared::keys::cluster_manifests_prefix(&ClusterName::new(
                cluster,
            )?))
            .await?;
        let [only] = manifests.as_slice() else {
            anyhow::bail!("{cluster}: {} manifests", manifests.len());
        };
        Ok(manifest::load(&*local, &only.key)
            .await?
            .manifest
            .retired
            .len())
    }

    /// Waits until no session keeps a replaced file (20 s at most), then checks every
    /// cluster's rows against Ray's.
    async fn tidied(&self) -> anyhow::Result<()> {
        let started = tokio::time::Instant::now();
        for cluster in &self.clusters {
            while self.retired(cluster).await? > 0 {
                ensure!(
                    started.elapsed() < Duration::from_secs(20),
                    "{cluster}: {} replaced files still kept after 20 s",
                    self.retired(cluster).await?
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        for cluster in &self.clusters {
            self.scenario
                .check(
                    &self.run,
                    cluster,
                    &format!("{cluster}, tidied by a later serve"),
                )
                .await?;
        }
        Ok(())
    }
}

/// `serve` started on a store whose sessions still hold deltas or replaced files tidies them
/// once they have been quiet, although no commit of its own asks for those checks (see
/// [`UntidyStore`]); they do not wait for the session to change again.
#[tokio::test]
async fn serve_tidies_at_start_what_an_earlier_process_left_untidy() -> anyhow::Result<()> {
    let store = UntidyStore::new(&["basic-workload"]).await?;
    let (compactor, _scratch) = store.scenario.compactor(store.settings.clone())?;
    let queue = CompactionQueue::spawn(compactor);
    ensure!(queue.catch_up().await? == 0, "objects left to compact");
    store.tidied().await
}

/// The sessions a restart finds untidy are all due at the same moment; `serve` tidies them
/// one at a time, as the compact function tidies one invocation's checks: after a restart over
/// many large sessions, folds that each hold a session's rows must not all run together.
/// Writes under `tables/` are slowed so that tidies started together overlap; which cluster
/// each write is for shows whether they did.
#[tokio::test]
async fn serve_tidies_what_it_finds_untidy_one_session_at_a_time() -> anyhow::Result<()> {
    use afterglow_tests::faults::SlowWrites;

    let store = UntidyStore::new(&["first", "second", "third"]).await?;
    let slow = Arc::new(SlowWrites::under(
        store.scenario.storage(),
        "tables/",
        Duration::from_millis(50),
    ));
    let (compactor, _scratch) = compactor_over(&slow, store.settings.clone())?;
    let queue = CompactionQueue::spawn(compactor);
    ensure!(queue.catch_up().await? == 0, "objects left to compact");
    store.tidied().await?;
    ensure!(slow.writes() > 0, "the tidies wrote nothing");
    ensure!(
        slow.most_clusters_at_once() == 1,
        "{} sessions were tidied at once",
        slow.most_clusters_at_once()
    );
    Ok(())
}

/// A quiet check that fails every time (here its session's manifest cannot be written) waits
/// twice as long after each failure, up to the queue's longest wait for what failed; once the
/// fault clears, the session is tidied. Trying again every quiet period for as long as the
/// fault lasted would take the one tidy permit each time, and where the session needed a fold,
/// a fold's memory and cores; this session needs none, so its tries are quick. Each try stops
/// at its first refused write, so the refusals, watched every 10 ms, show when the tries were.
#[tokio::test]
async fn a_quiet_check_that_keeps_failing_waits_longer_each_time() -> anyhow::Result<()> {
    use afterglow_tests::faults::Refuses;
    use shared::compact::schedule::queue::QueueTiming;

    let store = UntidyStore::new(&["basic-workload"]).await?;
    let refusing = Arc::new(Refuses::writes_under(store.scenario.storage(), "tables/"));
    let (compactor, _scratch) = compactor_over(&refusing, store.settings.clone())?;
    let timing = QueueTiming {
        park_max: Duration::from_millis(1600),
        ..QueueTiming::default()
    };
    let queue = CompactionQueue::spawn_with(compactor, timing);
    ensure!(queue.catch_up().await? == 0, "objects left to compact");
    let watching = tokio::time::Instant::now();
    let mut refused = 0;
    let mut tries: Vec<tokio::time::Instant> = Vec::new();
    while watching.elapsed() < Duration::from_millis(3500) {
        let now = refusing.refused();
        if now > refused {
            // Refusals closer than 80 ms, under the quiet period of 100 ms, are one try's.
            if tries
                .last()
                .is_none_or(|last| last.elapsed() >= Duration::from_millis(80))
            {
                tries.push(tokio::time::Instant::now());
            }
            refused = now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let gaps: Vec<u128> = tries
        .windows(2)
        .map(|pair| (pair[1] - pair[0]).as_millis())
        .collect();
    ensure!(
        tries.len() >= 3,
        "only {} tries in 3.5 s: {gaps:?} ms apart",
        tries.len()
    );
    // Doubling from the quiet period: 200, 400, 800, 1600 ms apart, so at most 5 tries in
    // 3.5 s; every quiet period would be about 30.
    ensure!(
        tries.len() <= 6,
        "{} tries in 3.5 s, {gaps:?} ms apart: a failing check does not wait longer",
        tries.len()
    );
    refusing.clear();
    store.tidied().await
}

/// `serve` does not wait, before it answers, for the scan that finds untidy sessions: it reads
/// one manifest per session, over a bucket one request each. Here those reads are held; the
/// start must not be, and the sessions are tidied once the reads go through.
#[tokio::test]
async fn serve_starts_before_its_scan_for_untidy_sessions_ends() -> anyhow::Result<()> {
    use afterglow_tests::faults::HeldReads;

    let store = UntidyStore::new(&["basic-workload"]).await?;
    let held = Arc::new(HeldReads::under(
        store.scenario.storage(),
        shared::keys::MANIFESTS_PREFIX,
    ));
    let (compactor, _scratch) = compactor_over(&held, store.settings.clone())?;
    let queue = CompactionQueue::spawn(compactor);
    let started = tokio::time::timeout(Duration::from_secs(10), queue.catch_up()).await;
    ensure!(
        matches!(started, Ok(Ok(0))),
        "the start waited for the manifests: {started:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        store.retired("basic-workload").await? > 0,
        "tidied without reading its manifest"
    );
    held.release();
    store.tidied().await
}
