//! The commit protocol on both backends: compactions racing for one session both land, a
//! manifest write whose response was lost still counts, and files written by a run that never
//! committed are collected once old.

use std::sync::Arc;

use afterglow_tests::faults::{LosesConditionalResponses, UnreliableManifestWrites, WriteFate};
use afterglow_tests::scenario::Scenario;
use afterglow_tests::{FixtureRun, bodies, compactor_over, folding_past, keys_under};
use anyhow::{Context as _, ensure};
use shared::compact::CompactSettings;
use shared::storage::{ObjectKey, Storage};

/// Two compactions of different raw objects of the same session, racing: both finish, and the
/// manifest holds both results (the rows equal one compaction of everything).
async fn racing_compactions_both_land(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::over(Arc::clone(&storage))
        .with_raw(&run, "race")
        .await?;
    let keys: Vec<ObjectKey> = keys_under(&*storage, "raw/race/").await?;
    let (even, odd): (Vec<_>, Vec<_>) = keys
        .iter()
        .cloned()
        .enumerate()
        .partition(|(index, _)| index % 2 == 0);
    let even: Vec<ObjectKey> = even.into_iter().map(|(_, key)| key).collect();
    let odd: Vec<ObjectKey> = odd.into_iter().map(|(_, key)| key).collect();
    let (first, _a) = scenario.compactor(CompactSettings::default())?;
    let (second, _b) = scenario.compactor(CompactSettings::default())?;
    let (one, two) = tokio::join!(first.compact(&even), second.compact(&odd));
    let (one, two) = (one?, two?);
    println!("race: {} and {} manifest retries", one.retries, two.retries);
    scenario.check(&run, "race", "two racing compactions").await
}

/// A manifest write whose response was lost (it landed, and the SDK's retry of the same
/// request got 412) is a commit, not a lost race: compaction must keep the files the manifest
/// now names. Every manifest response is lost here, one raw object per compaction, so each
/// compaction after the first also reads the files the one before wrote.
async fn lost_manifest_responses_lose_no_file(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::over(Arc::clone(&storage))
        .with_raw(&run, "lost")
        .await?;
    let faulty = Arc::new(LosesConditionalResponses::of_manifests(
        Arc::clone(&storage),
        usize::MAX,
    ));
    let (compactor, _scratch) = compactor_over(&faulty, CompactSettings::default())?;
    let keys = compactor.raw_keys().await?;
    for key in &keys {
        compactor
            .compact(std::slice::from_ref(key))
            .await
            .with_context(|| format!("compacting {key} after {} lost responses", faulty.lost()))?;
    }
    ensure!(
        faulty.lost() >= keys.len(),
        "only {} of {} manifest responses were lost",
        faulty.lost(),
        keys.len()
    );
    scenario
        .check(&run, "lost", "every manifest response lost")
        .await
}

/// No sequence of timeouts, lost answers and writes still in flight makes a manifest name a
/// deleted file. Each seed is one sequence of manifest-write fates ([`WriteFate`]), over a run
/// compacted two raw objects at a time, folding often; a compaction that fails is run again,
/// as SQS delivers its message again. After every compaction, every file the manifest names
/// exists, and at the end the rows are Ray's. Across the seeds, every fate happened.
async fn no_fault_sequence_makes_a_manifest_name_a_deleted_file(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    const SEEDS: u64 = 3;
    const DELIVERIES: usize = 12;
    let run = FixtureRun::named("basic-workload")?;
    let mut fates = std::collections::BTreeMap::<WriteFate, usize>::new();
    for seed in 0..SEEDS {
        let cluster = format!("unreliable{seed}");
        let scenario = Scenario::over(Arc::clone(&storage))
            .with_raw(&run, &cluster)
            .await?;
        // One write stuck in flight in all: its caller waits seconds before giving up.
        let faulty = Arc::new(UnreliableManifestWrites::new(
            Arc::clone(&storage),
            seed,
            seed == 0,
        ));
        let (compactor, _scratch) = compactor_over(&faulty, folding_past(3))?;
        let keys = keys_under(&*storage, &format!("raw/{cluster}/")).await?;
        for pair in keys.chunks(2) {
            let key = &pair[0];
            let mut failures = Vec::new();
            while let Err(err) = compactor.compact(pair).await {
                failures.push(format!("{err:#}"));
                ensure!(
                    failures.len() < DELIVERIES,
                    "seed {seed}: {key} failed {} times: {failures:?}",
                    failures.len()
                );
            }
            let manifest = scenario.only_manifest(&cluster).await?;
            let deleted = faulty.deleted();
            for file in manifest.keys() {
                ensure!(
                    !deleted.contains(file),
                    "seed {seed}, after {key}: the manifest names {file}, which was deleted \
                     (fates so far: {:?})",
                    faulty.fates()
                );
                storage
                    .get(file)
                    .await
                    .with_context(|| format!("seed {seed}: the manifest names {file}"))?;
            }
        }
        for (fate, count) in faulty.fates() {
            *fates.entry(fate).or_default() += count;
        }
        scenario
            .check(
                &run,
                &cluster,
                &format!("manifest writes failing with seed {seed}"),
            )
            .await?;
    }
    for fate in [
        WriteFate::Answered,
        WriteFate::AnswerLost,
        WriteFate::TimedOutBefore,
        WriteFate::TimedOutAfter,
        WriteFate::InFlightLands,
        WriteFate::InFlightFails,
    ] {
        ensure!(
            fates.get(&fate).copied().unwrap_or(0) > 0,
            "no manifest write met {fate:?} (fates: {fates:?})"
        );
    }
    println!("manifest write fates over {SEEDS} seeds: {fates:?}");
    Ok(())
}

/// Files a cut-off run wrote but never committed are deleted once old enough, by the store's
/// clock; younger ones (perhaps a run still going) and every file the manifest names stay.
async fn orphan_files_are_collected_once_old(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let scenario = Scenario::over(Arc::clone(&storage));
    // In two halves, so the second run supersedes rows of the first (a deletion vector).
    let all = bodies(&run)?;
    let (first, second) = all.split_at(all.len() / 2);
    for half in [first, second] {
        scenario.ingest_and_compact("orphaned", half).await?;
    }
    let manifests = storage.list("tables/manifests/cluster=orphaned/").await?;
    let [manifest] = manifests.as_slice() else {
        anyhow::bail!("expected one session, found {}", manifests.len());
    };
    let (cluster, session) =
        shared::keys::manifest_session(&manifest.key).context("a manifest key")?;
    let strays = [
        format!("tables/task_attempts/cluster=orphaned/session={session}/delta-01STRAY.parquet"),
        format!("tables/jobs/cluster=orphaned/session={session}/jobs-01STRAY.parquet"),
    ];
    for stray in &strays {
        storage
            .put(
                &ObjectKey::new(stray.clone())?,
                bytes::Bytes::from_static(b"PAR1 cut off"),
                shared::storage::PutMode::Overwrite,
            )
            .await?;
    }
    let before = storage.list("tables/").await?.len();
    // Deletion vectors are files the manifest names too (beside their deltas): they must stay.
    let vectors = keys_under(&*storage, "tables/task_attempts/cluster=orphaned/")
        .await?
        .iter()
        .filter(|key| key.as_str().contains("/deletes-"))
        .count();
    ensure!(vectors > 0, "the runs superseded no stored row");

    let (patient, _scratch) = scenario.compactor(CompactSettings::default())?;
    let young = patient.collect_orphans(&cluster, &session).await?;
    ensure!(young == 0, "collected {young} files younger than a day");

    let settings = CompactSettings {
        orphan_age: std::time::Duration::ZERO,
        ..CompactSettings::default()
    };
    let (eager, _scratch) = scenario.compactor(settings)?;
    let collected = eager.collect_orphans(&cluster, &session).await?;
    ensure!(collected == strays.len(), "collected {collected} files");
    for stray in &strays {
        ensure!(
            matches!(
                storage.get(&ObjectKey::new(stray.clone())?).await,
                Err(shared::storage::StorageError::NotFound { .. })
            ),
            "{stray} is left"
        );
    }
    ensure!(storage.list("tables/").await?.len() == before - strays.len());
    scenario
        .check(&run, "orphaned", "after collecting orphans")
        .await
}

afterglow_tests::for_each_backend!(
    racing_compactions_both_land,
    lost_manifest_responses_lose_no_file,
    no_fault_sequence_makes_a_manifest_name_a_deleted_file,
    orphan_files_are_collected_once_old
);
