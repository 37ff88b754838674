//! Counting: synthetic traffic is counted exactly as generated, and the counts answered from
//! rollups (per file, summed by folds and by each delta over the ones before it) equal a
//! scan's, also when an earlier rollup is damaged or gone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use afterglow_tests::api::counts_of;
use afterglow_tests::folding_past;
use afterglow_tests::scenario::{Scenario, query_params};
use anyhow::{Context as _, ensure};
use serde_json::Value as Json;
use shared::storage::Storage;

/// Synthetic traffic (what `afterglow generate` and `bench` send), ingested, compacted in small
/// batches that fold into a base several times, is counted exactly as the generator says it
/// generated it: by state, by task name and by error type, re-sent bodies counted once.
#[tokio::test]
async fn synthetic_traffic_is_counted_as_generated() -> anyhow::Result<()> {
    use shared::query::ApiRoute;
    use synth::SynthSettings;

    let scenario = Scenario::local()?;
    let truth = scenario
        .ingest_synthetic(
            "synthetic",
            SynthSettings {
                attempts: 20_000,
                jobs: 3,
                nodes: 5,
                failure_rate: 0.1,
                duplicate_rate: 0.05,
                seed: 7,
                ..SynthSettings::default()
            },
        )
        .await?;
    ensure!(truth.redeliveries > 0, "some bodies are sent twice");

    let (compactor, _scratch) = scenario.compactor(folding_past(3))?;
    let keys = compactor.raw_keys().await?;
    for batch in keys.chunks(6) {
        compactor.compact(batch).await?;
    }

    let engine = scenario.engine("query")?;
    let ask = |route: ApiRoute, params: &[(&str, &str)]| {
        let params = query_params(params);
        let engine = &engine;
        async move { engine.answer(&route, &params).await }
    };
    let summary = ask(ApiRoute::Summary, &[]).await?;
    ensure!(
        summary["total"].as_u64() == Some(truth.attempts),
        "{summary}"
    );
    let by_state: BTreeMap<String, u64> = truth.by_state.clone().into_iter().collect();
    let served: BTreeMap<String, u64> = counts_of(&summary["by_state"])?
        .into_iter()
        .map(|(state, count)| (state, count as u64))
        .collect();
    ensure!(served == by_state, "by state: {served:?} != {by_state:?}");

    let names =
        group_totals(&ask(ApiRoute::Aggregates, &[("by", "name"), ("limit", "1000")]).await?)?;
    let expected_names: BTreeMap<String, u64> = truth.by_name.clone().into_iter().collect();
    ensure!(
        names == expected_names,
        "by name: {names:?} != {expected_names:?}"
    );

    let mut errors = group_totals(
        &ask(
            ApiRoute::Aggregates,
            &[("by", "error_type"), ("limit", "1000")],
        )
        .await?,
    )?;
    errors.remove("");
    let expected_errors: BTreeMap<String, u64> = truth.by_error_type.clone().into_iter().collect();
    ensure!(
        errors == expected_errors,
        "by error type: {errors:?} != {expected_errors:?}"
    );
    Ok(())
}

/// An earlier delta's rollup that is gone or cannot be read (garbage bytes) does not stop
/// compaction: a run adds in earlier rollups only to save reads, so it writes its delta's
/// rollup counting that delta alone and goes on; a fold that cannot fetch or sum them counts
/// its new base. (Without the fallbacks a run would fail fetching the rollup and then reading
/// it, at every retry, and so would a fold.) The summary and aggregates read before and after
/// the fold equal a scan's.
#[tokio::test]
async fn an_earlier_rollup_that_is_damaged_or_gone_does_not_stop_compaction() -> anyhow::Result<()>
{
    use shared::query::ApiRoute;

    let scenario = Scenario::local()?
        .with_failing_sessions("damaged", [41, 42], 3_000, 2)
        .await?;
    let storage = scenario.storage();
    let (compactor, _scratch) = scenario.compactor(folding_past(100))?;
    let keys = compactor.raw_keys().await?;
    let batches: Vec<&[shared::storage::ObjectKey]> =
        keys.chunks(keys.len().div_ceil(3).max(1)).collect();
    ensure!(batches.len() == 3, "{} raw objects", keys.len());
    compactor.compact(batches[0]).await?;
    // Gone first, then garbage over every earlier delta's rollup key: the fold then fetches
    // them all and cannot read them.
    for (step, damage) in ["gone", "garbage"].into_iter().enumerate() {
        let before = deltas_by_session(&*storage).await?;
        for deltas in before.values() {
            for delta in deltas {
                let key = delta.rollup.as_ref().context("a rollup")?;
                if damage == "garbage" {
                    storage
                        .put(
                            key,
                            bytes::Bytes::from_static(b"not parquet"),
                            shared::storage::PutMode::Overwrite,
                        )
                        .await?;
                } else {
                    storage.delete(key).await?;
                }
            }
        }
        compactor.compact(batches[step + 1]).await?;
        let after = deltas_by_session(&*storage).await?;
        let mut checked = 0;
        for (session, deltas) in &after {
            let earlier = before.get(session).map_or(0, Vec::len);
            for delta in deltas.iter().skip(earlier) {
                ensure!(
                    delta.rollup_covers == Some(1),
                    "{damage}: a new delta after {earlier} covers {:?}",
                    delta.rollup_covers
                );
                checked += usize::from(earlier > 0);
            }
        }
        ensure!(
            checked > 0,
            "{damage}: no session added a delta after a damaged one"
        );
    }
    let requests: Vec<(ApiRoute, Vec<(String, String)>)> = vec![
        (ApiRoute::Summary, Vec::new()),
        (ApiRoute::Summary, vec![("state".into(), "FAILED".into())]),
        (ApiRoute::Aggregates, vec![("by".into(), "name".into())]),
    ];
    // The answers, and how many came from rollups.
    let ask = |name: &'static str| {
        let engine = scenario.engine(name);
        let requests = &requests;
        async move {
            let engine = engine?;
            let mut answers = Vec::new();
            for (route, params) in requests {
                answers.push(engine.answer(route, params).await?);
            }
            anyhow::Ok((answers, engine.rollup_answers()))
        }
    };
    // One session's newest rollup gone too: its fold cannot fetch the rollups it would sum,
    // the other's cannot read them.
    let sessions = deltas_by_session(&*storage).await?;
    let newest = sessions
        .values()
        .next()
        .and_then(|deltas| deltas.last())
        .and_then(|delta| delta.rollup.as_ref())
        .context("a newest delta's rollup")?;
    storage.delete(newest).await?;
    let (damaged, from_rollups) = ask("query-damaged").await?;
    ensure!(
        from_rollups == 0,
        "{from_rollups} answers from damaged rollups"
    );
    let folded = compactor.fold().await?;
    ensure!(folded == 2, "{folded} sessions folded");
    ensure!(
        compactor.folds_summed() == 0,
        "a fold summed unreadable rollups"
    );
    let (counted, from_rollups) = ask("query-folded").await?;
    ensure!(
        from_rollups > 0,
        "no answer from the counted bases' rollups"
    );
    forget_rollups(&scenario).await?;
    let (scanned, _) = ask("query-scanned").await?;
    for (answers, when) in [(&damaged, "before the fold"), (&counted, "after it")] {
        for ((request, answer), scan) in requests.iter().zip(answers).zip(&scanned) {
            ensure!(
                answer == scan,
                "{request:?} {when}:\n{answer}\nscanned:\n{scan}"
            );
        }
    }
    Ok(())
}

/// Every base and delta has a rollup (counts by grouping, job, state, type and rounded
/// duration, with minus rows for the versions a delta supersedes), and the summary and the
/// aggregates and insights answered from them equal the answers of a scan: over two sessions of
/// synthetic traffic with failures, retries and re-delivered bodies, compacted in small batches
/// that fold into a base, each delta's rollup adding in those of the deltas before it. The
/// engine's count of rollup answers proves which path ran; with the rollups marked as the first
/// format (as an earlier build wrote them) the same requests scan.
#[tokio::test]
async fn rollups_count_what_a_scan_counts() -> anyhow::Result<()> {
    use shared::query::ApiRoute;

    let scenario = Scenario::local()?
        .with_failing_sessions("rollups", [21, 22], 8_000, 3)
        .await?;
    let (storage, dir) = (scenario.storage(), scenario.dir()?);
    let (compactor, _scratch) = scenario.compactor(folding_past(4))?;
    // Every base a fold installed, seen in the manifests after each run.
    let mut bases = BTreeSet::new();
    for batch in compactor.raw_keys().await?.chunks(3) {
        compactor.compact(batch).await?;
        for meta in storage.list("tables/manifests/").await? {
            let manifest = shared::tables::manifest::load(&*storage, &meta.key)
                .await?
                .manifest;
            bases.extend(manifest.task_attempts.base.into_iter().map(|base| base.key));
        }
    }
    // Every fold summed its base's rollup from the rollups it replaced.
    ensure!(bases.len() >= 2, "{} folds", bases.len());
    ensure!(
        compactor.folds_summed() == u64::try_from(bases.len())?,
        "{} of {} folds summed their base's rollup",
        compactor.folds_summed(),
        bases.len()
    );
    let mut rollups = 0;
    let mut minus_rows = 0;
    // Rollups a read sums: each base's, and one per bit of the number of deltas (each delta's
    // rollup adds in the rollups before it that count no more deltas than it has gathered).
    let mut read = 0;
    let mut most_deltas = 0;
    let connection = shared::tables::open_duckdb()?;
    for meta in storage.list("tables/manifests/").await? {
        let manifest = shared::tables::manifest::load(&*storage, &meta.key)
            .await?
            .manifest;
        ensure!(
            manifest.task_attempts.has_rollups(),
            "a file without its rollup"
        );
        let deltas = &manifest.task_attempts.deltas;
        if let Some(newest) = deltas.last() {
            let lowest_bit = 1 << deltas.len().trailing_zeros();
            ensure!(
                newest.rollup_covers == Some(lowest_bit),
                "the newest of {} deltas covers {:?}",
                deltas.len(),
                newest.rollup_covers
            );
        }
        read += manifest.task_attempts.base.len() + deltas.len().count_ones() as usize;
        most_deltas = most_deltas.max(deltas.len());
        for base in &manifest.task_attempts.base {
            // A summed base rollup is the one counted from the base, row for row.
            let key = base.rollup.as_ref().context("rollup")?;
            let stored = dir.join("base-rollup.parquet");
            std::fs::write(&stored, storage.get(key).await?.body)?;
            let rows = dir.join("base.parquet");
            std::fs::write(&rows, storage.get(&base.key).await?.body)?;
            let counted = dir.join("base-counted.parquet");
            shared::tables::rollup::write_rollup(
                &connection,
                &rows,
                &shared::tables::rollup::RowsByFile::new(),
                &[],
                &counted,
            )?;
            for (left, right) in [(&stored, &counted), (&counted, &stored)] {
                let extra: i64 = connection.query_row(
                    &format!(
                        "SELECT count(*) FROM (SELECT * FROM read_parquet('{}')
                         EXCEPT ALL SELECT * FROM read_parquet('{}'))",
                        left.display(),
                        right.display()
                    ),
                    [],
                    |row| row.get(0),
                )?;
                ensure!(extra == 0, "{extra} rows of {left:?} not in {right:?}");
            }
        }
        for file in manifest.task_attempts.all() {
            let key = file.rollup.as_ref().context("rollup")?;
            let path = dir.join(format!("rollup-{rollups}.parquet"));
            std::fs::write(&path, storage.get(key).await?.body)?;
            rollups += 1;
            minus_rows += connection.query_row(
                &format!(
                    "SELECT count(*) FROM read_parquet('{}') WHERE sign < 0",
                    path.display()
                ),
                [],
                |row| row.get::<_, i64>(0),
            )?;
        }
    }
    ensure!(minus_rows > 0, "no rollup subtracts a superseded version");
    ensure!(
        most_deltas >= 2,
        "no session has two deltas: no rollup adds in another"
    );

    let engine = scenario.engine("query")?;
    let jobs = engine
        .answer(&ApiRoute::Aggregates, &[("by".into(), "job_id".into())])
        .await?;
    let job = jobs["groups"][0]["key"]
        .as_str()
        .context("a job")?
        .to_owned();
    let mut requests: Vec<(ApiRoute, Vec<(String, String)>)> = Vec::new();
    let filters: Vec<Vec<(&str, &str)>> = vec![
        vec![],
        vec![("job_id", &job)],
        vec![("state", "FAILED")],
        vec![("state", "RUNNING,FINISHED")],
        vec![("type", "ACTOR_TASK")],
        vec![("include_drivers", "true"), ("include_incomplete", "true")],
    ];
    for filter in &filters {
        let owned = |extra: &[(&str, &str)]| -> Vec<(String, String)> {
            filter
                .iter()
                .chain(extra)
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect()
        };
        requests.push((ApiRoute::Summary, owned(&[])));
        requests.push((ApiRoute::Insights, owned(&[])));
        for by in [
            "name",
            "func_or_class_name",
            "error_type",
            "job_id",
            "node_id",
        ] {
            requests.push((
                ApiRoute::Aggregates,
                owned(&[("by", by), ("limit", "1000")]),
            ));
        }
    }
    let mut rolled = Vec::new();
    for (route, params) in &requests {
        rolled.push(engine.answer(route, params).await?);
    }
    ensure!(
        engine.rollup_answers() == requests.len() as u64 + 1,
        "{} of {} requests answered from rollups",
        engine.rollup_answers(),
        requests.len() + 1
    );
    // Rollups are read without the attempts files (a cold Lambda would download the whole
    // base for nothing).
    let cache = shared::storage::FileCache::new(Arc::clone(&storage), dir.join("c"), 4);
    let rolled_only = shared::query::read::snapshot::snapshot(
        &storage,
        &cache,
        &shared::query::read::params::Scope::default(),
        shared::query::read::snapshot::Needs {
            rollups: true,
            ..Default::default()
        },
        u64::MAX,
    )
    .await?;
    ensure!(
        rolled_only.rollups.as_ref().map(Vec::len) == Some(read)
            && rolled_only.task_attempts.base.is_empty()
            && rolled_only.task_attempts.deltas.is_empty(),
        "a snapshot for rollups fetches them and nothing else"
    );

    forget_rollups(&scenario).await?;
    let scanning = scenario.engine("query-scan")?;
    for ((route, params), rolled) in requests.iter().zip(&rolled) {
        let scanned = scanning.answer(route, params).await?;
        ensure!(
            &scanned == rolled,
            "{route:?} {params:?}: from rollups\n{rolled}\nscanned\n{scanned}"
        );
    }
    ensure!(
        scanning.rollup_answers() == 0,
        "rollups of the first format were read"
    );
    let findings: usize = requests
        .iter()
        .zip(&rolled)
        .filter(|((route, _), _)| *route == ApiRoute::Insights)
        .map(|(_, answer)| answer["findings"].as_array().map_or(0, Vec::len))
        .sum();
    ensure!(findings > 0, "no insight to compare");
    println!(
        "{} requests equal ({findings} findings); {rollups} rollups, {minus_rows} minus rows",
        requests.len()
    );
    Ok(())
}

/// Counts over a time range (summary, aggregates, insights) read the rollups of the sessions
/// created wholly inside it, their dated rows alone (an attempt Ray reported no creation time
/// for is in no range), and count the attempts of a session the range cuts through into the
/// same rows: they equal a scan's answers. A range that cuts through every session it selects
/// is scanned. A tenth of the tasks here have no creation time.
#[tokio::test]
async fn time_ranges_count_from_rollups_what_a_scan_counts() -> anyhow::Result<()> {
    use shared::query::ApiRoute;

    const CLUSTER: &str = "ranges";
    const DAY_MS: i64 = 86_400_000;
    const HOUR_MS: i64 = 3_600_000;
    let scenario = Scenario::local()?;
    let mut undated = 0;
    for day in 0..2 {
        let settings = synth::SynthSettings {
            attempts: 3_000,
            jobs: 2,
            nodes: 3,
            failure_rate: 0.1,
            duplicate_rate: 0.05,
            seed: 31 + day as u64,
            start_ms: synth::START_MS + day * DAY_MS,
            ..synth::SynthSettings::default()
        };
        scenario
            .ingest_synthetic_edited(CLUSTER, settings, |events| {
                undated += take_out_creation(events);
            })
            .await?;
    }
    ensure!(undated > 0, "no creation time taken out");
    let (compactor, _scratch) = scenario.compactor(folding_past(3))?;
    for batch in compactor.raw_keys().await?.chunks(4) {
        compactor.compact(batch).await?;
    }
    let start = synth::START_MS;
    let range = |since: i64, until: Option<i64>| {
        let mut params = vec![("since_ms".to_owned(), since.to_string())];
        params.extend(until.map(|until| ("until_ms".to_owned(), until.to_string())));
        params
    };
    // Both sessions whole; the first whole and the second cut; the second whole, open-ended;
    // and the first cut, which has nothing to read from rollups.
    let by_rollups = [
        range(start - HOUR_MS, Some(start + 2 * DAY_MS)),
        range(start - HOUR_MS, Some(start + DAY_MS + 1_000)),
        range(start + DAY_MS - HOUR_MS, None),
    ];
    let cut = range(start + 1_000, Some(start + DAY_MS / 2));
    let mut requests: Vec<(ApiRoute, Vec<(String, String)>)> = Vec::new();
    for range in by_rollups.iter().chain([&cut]) {
        let with = |extra: &[(&str, &str)]| -> Vec<(String, String)> {
            let mut params = range.clone();
            params.extend(
                extra
                    .iter()
                    .map(|(key, value)| ((*key).to_owned(), (*value).to_owned())),
            );
            params
        };
        requests.push((ApiRoute::Summary, with(&[])));
        requests.push((ApiRoute::Summary, with(&[("state", "FAILED")])));
        requests.push((ApiRoute::Summary, with(&[("include_incomplete", "true")])));
        requests.push((ApiRoute::Insights, with(&[])));
        for by in ["name", "error_type", "node_id"] {
            requests.push((ApiRoute::Aggregates, with(&[("by", by), ("limit", "1000")])));
        }
    }
    let per_range = requests.len() / 4;
    let engine = scenario.engine("query")?;
    let mut answers = Vec::new();
    for (route, params) in &requests {
        answers.push(engine.answer(route, params).await?);
    }
    ensure!(
        engine.rollup_answers() == (3 * per_range) as u64,
        "{} of the {} requests over ranges with whole sessions answered from rollups",
        engine.rollup_answers(),
        3 * per_range
    );
    let total = |answer: &Json| answer["total"].as_u64().unwrap_or(0);
    let everything = engine.answer(&ApiRoute::Summary, &[]).await?;
    let (both, mixed, cut_total) = (
        total(&answers[0]),
        total(&answers[per_range]),
        total(&answers[3 * per_range]),
    );
    ensure!(
        both < total(&everything) && cut_total > 0 && cut_total < mixed && mixed < both,
        "every attempt {}, both sessions {both}, the first and part of the second {mixed}, \
         part of the first {cut_total}",
        total(&everything)
    );
    forget_rollups(&scenario).await?;
    let scanning = scenario.engine("query-scan")?;
    for ((route, params), answer) in requests.iter().zip(&answers) {
        let scanned = scanning.answer(route, params).await?;
        ensure!(
            &scanned == answer,
            "{route:?} {params:?}: from rollups\n{answer}\nscanned\n{scanned}"
        );
    }
    ensure!(scanning.rollup_answers() == 0, "rollups read after all");
    Ok(())
}

/// Takes the `PENDING_ARGS_AVAIL` transition out of the lifecycle events of a tenth of the
/// tasks (by their id), so that those attempts have no creation time. Returns how many.
fn take_out_creation(events: &mut [Json]) -> usize {
    let mut taken = 0;
    for event in events {
        let Some(lifecycle) = event.get_mut("taskLifecycleEvent") else {
            continue;
        };
        let chosen = lifecycle["taskId"]
            .as_str()
            .is_some_and(|id| id.bytes().map(u32::from).sum::<u32>() % 10 == 0);
        if let (true, Some(transitions)) = (
            chosen,
            lifecycle
                .get_mut("stateTransitions")
                .and_then(Json::as_array_mut),
        ) {
            let before = transitions.len();
            transitions.retain(|transition| transition["state"] != "PENDING_ARGS_AVAIL");
            taken += before - transitions.len();
        }
    }
    taken
}

/// Rewrites every manifest with its rollups' format unknown, so reads count by scanning.
async fn forget_rollups(scenario: &Scenario) -> anyhow::Result<()> {
    scenario
        .rewrite_attempt_files(|file| file.rollup_format = None)
        .await
}

/// The deltas of every session, by manifest key.
async fn deltas_by_session(
    storage: &dyn Storage,
) -> anyhow::Result<BTreeMap<String, Vec<shared::tables::manifest::DataFile>>> {
    let mut sessions = BTreeMap::new();
    for meta in storage.list("tables/manifests/").await? {
        let manifest = shared::tables::manifest::load(storage, &meta.key)
            .await?
            .manifest;
        sessions.insert(meta.key.to_string(), manifest.task_attempts.deltas);
    }
    Ok(sessions)
}

/// Counts of a response's `groups`: key → total.
fn group_totals(answer: &Json) -> anyhow::Result<BTreeMap<String, u64>> {
    ensure!(answer["next"].is_null(), "one page holds every group");
    answer["groups"]
        .as_array()
        .context("groups")?
        .iter()
        .map(|group| {
            Ok((
                group["key"].as_str().context("key")?.to_owned(),
                group["total"].as_u64().context("total")?,
            ))
        })
        .collect()
}
