//! Reads over many sessions, on SeaweedFS: a time range reads only the sessions created in it,
//! a scope wider than the copy budget is refused before anything is copied (while a session, a
//! cluster's time range, and the table's pages still answer), the table pages across sessions
//! newest session first reading only the sessions a page needs, and cluster-wide counts are
//! the sums of the sessions' own, also when a cluster's rollup counts its ended sessions (and
//! not once one of them changed since).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use afterglow_tests::faults::RecordsRequests;
use afterglow_tests::s3_storage;
use afterglow_tests::scenario::{Scenario, query_params};
use anyhow::{Context as _, ensure};
use serde_json::Value as Json;
use shared::keys::ClusterName;
use shared::query::{ApiRoute, QueryEngine, QueryError, QuerySettings};
use shared::storage::Storage;

const CLUSTER: &str = "history";
const DAY_MS: i64 = 86_400_000;
/// Attempts asked of the generator per session (it may make a few more: retries of the last).
const ATTEMPTS: u64 = 400;

/// One synthetic session a day for three days, compacted; their names, oldest first, and the
/// attempts the generator made in each.
async fn three_days(storage: Arc<dyn Storage>) -> anyhow::Result<(Vec<String>, Vec<u64>)> {
    let scenario = Scenario::over(storage);
    let mut sessions = Vec::new();
    let mut attempts = Vec::new();
    for day in 0..3 {
        let truth = scenario
            .ingest_synthetic(
                CLUSTER,
                synth::SynthSettings {
                    attempts: ATTEMPTS,
                    jobs: 2,
                    nodes: 2,
                    failure_rate: 0.1,
                    seed: 11 + day as u64,
                    start_ms: synth::START_MS + day * DAY_MS,
                    ..synth::SynthSettings::default()
                },
            )
            .await?;
        sessions.push(truth.session_name.clone());
        attempts.push(truth.attempts);
    }
    let (compactor, _scratch) = scenario.compactor(shared::compact::CompactSettings::default())?;
    compactor.compact(&scenario.raw_keys().await?).await?;
    Ok((sessions, attempts))
}

/// Three days of history on SeaweedFS, and an engine over it that records what it reads.
struct History {
    /// The sessions, oldest first.
    sessions: Vec<String>,
    /// The attempts generated in each.
    attempts: Vec<u64>,
    /// The store, as compaction writes it.
    storage: Arc<dyn Storage>,
    /// Every GET of the engine.
    recorder: Arc<RecordsRequests>,
    engine: QueryEngine,
    _cache: tempfile::TempDir,
}

impl History {
    /// [`three_days`] under a fresh prefix, read by an engine whose settings `configure`
    /// changes; `None` when S3 tests are off.
    async fn stored(
        test: &str,
        configure: impl FnOnce(QuerySettings) -> QuerySettings,
    ) -> anyhow::Result<Option<Self>> {
        let Some(storage) = s3_storage(test).await else {
            return Ok(None);
        };
        let storage: Arc<dyn Storage> = Arc::new(storage);
        let (sessions, attempts) = three_days(Arc::clone(&storage)).await?;
        let recorder = Arc::new(RecordsRequests::new(Arc::clone(&storage)));
        let cache = tempfile::tempdir()?;
        let engine = QueryEngine::open(
            Arc::clone(&recorder) as Arc<dyn Storage>,
            configure(QuerySettings::under(cache.path())),
        )?;
        Ok(Some(Self {
            sessions,
            attempts,
            storage,
            recorder,
            engine,
            _cache: cache,
        }))
    }
}

async fn ask(
    engine: &QueryEngine,
    route: ApiRoute,
    params: &[(&str, &str)],
) -> anyhow::Result<Json> {
    Ok(engine.answer(&route, &query_params(params)).await?)
}

/// Keys asked for that belong to `session`.
fn gets_of(recorder: &RecordsRequests, session: &str) -> Vec<String> {
    recorder
        .gets()
        .into_iter()
        .filter(|key| key.contains(session))
        .collect()
}

/// A time range on creation reads the sessions whose attempts were created in it and no
/// other: not even their manifests are fetched. A session created wholly inside it is counted
/// by its rollups, one the range cuts through by its attempts.
#[tokio::test]
async fn a_time_range_reads_only_the_sessions_created_in_it() -> anyhow::Result<()> {
    let Some(history) = History::stored("time range", |settings| settings).await? else {
        return Ok(());
    };
    let since = (synth::START_MS + DAY_MS).to_string();
    let until = (synth::START_MS + 2 * DAY_MS).to_string();
    let range = [
        ("cluster", CLUSTER),
        ("since_ms", &since),
        ("until_ms", &until),
    ];
    let in_range = ask(&history.engine, ApiRoute::Summary, &range).await?;
    ensure!(
        in_range["total"].as_u64() == Some(history.attempts[1]),
        "the middle day's session alone: {in_range}"
    );
    // Created wholly inside the range, the session is counted by its rollups alone.
    let read = gets_of(&history.recorder, &history.sessions[1]);
    ensure!(
        read.iter().any(|key| key.contains("/rollup-"))
            && !read
                .iter()
                .any(|key| key.contains("/base-") || key.contains("/delta-")),
        "the session in range is read by its rollups alone: {read:?}"
    );
    for outside in [&history.sessions[0], &history.sessions[2]] {
        let read = gets_of(&history.recorder, outside);
        ensure!(
            read.is_empty(),
            "{outside} is outside the range, yet read: {read:?}"
        );
    }
    let session_alone = ask(
        &history.engine,
        ApiRoute::Summary,
        &[("session", &history.sessions[1])],
    )
    .await?;
    ensure!(
        in_range["by_state"] == session_alone["by_state"],
        "{in_range} != {session_alone}"
    );
    // A range that begins inside the middle session copies that session's attempts (to count
    // those created in it) and the newest session's rollups, and no attempts of the newest.
    let newest_gets = gets_of(&history.recorder, &history.sessions[2]).len();
    let middle = shared::tables::manifest::load(
        &*history.storage,
        &shared::keys::manifest_key(
            &ClusterName::new(CLUSTER)?,
            &shared::keys::SessionName::new(&history.sessions[1])?,
        )?,
    )
    .await?
    .manifest
    .stats;
    let (first, last) = (middle.first_created_ms, middle.last_created_ms);
    let since = first
        .zip(last)
        .map(|(first, last)| first + (last - first) / 2 + 1)
        .context("the middle session's creation times")?
        .to_string();
    let cut = ask(
        &history.engine,
        ApiRoute::Summary,
        &[("cluster", CLUSTER), ("since_ms", &since)],
    )
    .await?;
    let newest = &gets_of(&history.recorder, &history.sessions[2])[newest_gets..];
    ensure!(
        newest.iter().any(|key| key.contains("/rollup-"))
            && !newest
                .iter()
                .any(|key| key.contains("/base-") || key.contains("/delta-")),
        "the newest session is read by its rollups alone: {newest:?}"
    );
    ensure!(
        gets_of(&history.recorder, &history.sessions[1])
            .iter()
            .any(|key| key.contains("/base-") || key.contains("/delta-")),
        "the session the range cuts through is scanned"
    );
    let cut_total = cut["total"].as_u64().context("a total")?;
    ensure!(
        cut_total > history.attempts[2] && cut_total < history.attempts[1] + history.attempts[2],
        "part of the middle session and the newest: {cut}"
    );
    let page = ask(
        &history.engine,
        ApiRoute::Tasks,
        &[range.as_slice(), &[("limit", "1000")]].concat(),
    )
    .await?;
    let rows = page["tasks"].as_array().context("tasks")?;
    ensure!(
        rows.len() as u64 == history.attempts[1]
            && rows
                .iter()
                .all(|row| row["session_name"] == history.sessions[1].as_str()),
        "the table in range holds the middle session's attempts alone"
    );
    Ok(())
}

/// A scope of several sessions whose files would come to more than the copy budget answers
/// 400 naming narrower filters, and copies nothing; each of those filters then answers, and
/// the table, which reads one session at a time, pages on.
#[tokio::test]
async fn a_scope_wider_than_the_copy_budget_is_refused_before_anything_is_copied()
-> anyhow::Result<()> {
    let Some(history) = History::stored("copy budget", |settings| QuerySettings {
        copy_budget_bytes: 1,
        ..settings
    })
    .await?
    else {
        return Ok(());
    };
    for (route, params) in [
        (ApiRoute::Summary, vec![("cluster", CLUSTER)]),
        (ApiRoute::Aggregates, vec![("by", "name")]),
        (ApiRoute::Insights, vec![("cluster", CLUSTER)]),
    ] {
        match history.engine.answer(&route, &query_params(&params)).await {
            Err(QueryError::BadRequest(message)) => ensure!(
                ["`session`", "`cluster`", "`since_ms`"]
                    .iter()
                    .all(|named| message.contains(named)),
                "the refusal names narrower filters: {message}"
            ),
            other => anyhow::bail!("{route:?} {params:?}: expected a 400, got {other:?}"),
        }
    }
    ensure!(
        history.engine.copied_bytes() == 0,
        "a refused request copies nothing"
    );
    let one = ask(
        &history.engine,
        ApiRoute::Summary,
        &[("session", &history.sessions[0])],
    )
    .await?;
    ensure!(one["total"].as_u64() == Some(history.attempts[0]), "{one}");
    let since = (synth::START_MS + 2 * DAY_MS).to_string();
    let newest = ask(
        &history.engine,
        ApiRoute::Summary,
        &[("cluster", CLUSTER), ("since_ms", &since)],
    )
    .await?;
    ensure!(
        newest["total"].as_u64() == Some(history.attempts[2]),
        "{newest}"
    );
    let page = ask(
        &history.engine,
        ApiRoute::Tasks,
        &[("cluster", CLUSTER), ("limit", "10")],
    )
    .await?;
    ensure!(
        page["tasks"].as_array().map(Vec::len) == Some(10) && page["next"].is_string(),
        "{page}"
    );
    ensure!(
        history.engine.copied_bytes() > 0,
        "the answers copied their sessions' files"
    );
    Ok(())
}

/// The table over a cluster pages newest session first: its first page reads the newest
/// session's files alone, and its pages together hold every attempt once, a session's rows
/// together. Cluster-wide counts (summary and aggregates) are the sums of each session's.
#[tokio::test]
async fn pages_across_sessions_read_only_the_sessions_they_need() -> anyhow::Result<()> {
    let Some(history) = History::stored("pages across sessions", |settings| settings).await? else {
        return Ok(());
    };

    let first = ask(
        &history.engine,
        ApiRoute::Tasks,
        &[("cluster", CLUSTER), ("limit", "50")],
    )
    .await?;
    let rows = first["tasks"].as_array().context("tasks")?;
    ensure!(
        rows.len() == 50
            && rows
                .iter()
                .all(|row| row["session_name"] == history.sessions[2].as_str()),
        "the first page is the newest session's"
    );
    for older in &history.sessions[..2] {
        let files: Vec<String> = gets_of(&history.recorder, older)
            .into_iter()
            .filter(|key| key.starts_with("tables/task_attempts/"))
            .collect();
        ensure!(
            files.is_empty(),
            "the first page read {older}'s files: {files:?}"
        );
    }

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut params = vec![("cluster", CLUSTER), ("limit", "150")];
        if let Some(cursor) = &cursor {
            params.push(("cursor", cursor));
        }
        let page = ask(&history.engine, ApiRoute::Tasks, &params).await?;
        for row in page["tasks"].as_array().context("tasks")? {
            seen.push((
                row["session_name"].as_str().unwrap_or_default().to_owned(),
                row["task_id"].as_str().unwrap_or_default().to_owned(),
                row["attempt_number"].as_i64().unwrap_or(-1),
            ));
        }
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let distinct: BTreeSet<_> = seen.iter().collect();
    ensure!(
        seen.len() as u64 == history.attempts.iter().sum::<u64>() && distinct.len() == seen.len(),
        "{} rows, {} distinct",
        seen.len(),
        distinct.len()
    );
    let mut order: Vec<&str> = seen
        .iter()
        .map(|(session, _, _)| session.as_str())
        .collect();
    order.dedup();
    let newest_first: Vec<&str> = history.sessions.iter().rev().map(String::as_str).collect();
    ensure!(order == newest_first, "sessions walked {order:?}");

    // No cluster rollup yet: every session is read.
    history.expect_sums(&history.sessions, false).await?;
    Ok(())
}

/// Once the cluster is rolled up, whole-cluster and fleet-wide counts read its rollup instead of
/// its ended sessions (not even their manifests are fetched) and still equal the sums of the
/// sessions' own. Events that arrive later for an ended session are counted at once: the
/// rollup no longer holds, the sessions are read, and the next roll-up counts them again.
#[tokio::test]
async fn whole_clusters_are_counted_from_their_rollup() -> anyhow::Result<()> {
    let Some(history) = History::stored("cluster rollup", |settings| settings).await? else {
        return Ok(());
    };
    let scenario = Scenario::over(Arc::clone(&history.storage));
    let (compactor, _scratch) = scenario.compactor(shared::compact::CompactSettings::default())?;
    let cluster = ClusterName::new(CLUSTER)?;
    let rolled = compactor.roll_up_cluster(&cluster).await?;
    ensure!(
        rolled.written && rolled.sessions == 2,
        "every session but the newest is counted: {rolled:?}"
    );
    let ended = &history.sessions[..2];
    history.expect_sums(ended, true).await?;

    // Events for the oldest session arrive after it was rolled up.
    let compacted = scenario.raw_keys().await?;
    scenario
        .ingest_synthetic(
            CLUSTER,
            synth::SynthSettings {
                attempts: ATTEMPTS + 50,
                jobs: 2,
                nodes: 2,
                failure_rate: 0.1,
                seed: 11,
                start_ms: synth::START_MS + 3_600_000,
                ..synth::SynthSettings::default()
            },
        )
        .await?;
    let late: Vec<_> = scenario
        .raw_keys()
        .await?
        .into_iter()
        .filter(|key| !compacted.contains(key))
        .collect();
    compactor.compact(&late).await?;
    history.expect_sums(ended, false).await?;

    let rolled = compactor.roll_up_cluster(&cluster).await?;
    ensure!(
        rolled.written && rolled.sessions == 2 && rolled.added == 2,
        "counted again from every ended session: {rolled:?}"
    );
    history.expect_sums(ended, true).await?;
    Ok(())
}

impl History {
    /// Asserts that the cluster-wide and fleet-wide summary and aggregates by name equal the
    /// sums of the sessions' own, and that they read the manifests of `ended` exactly when not
    /// `rolled_up`.
    async fn expect_sums(&self, ended: &[String], rolled_up: bool) -> anyhow::Result<()> {
        let mut summed: BTreeMap<String, i64> = BTreeMap::new();
        let mut by_name: BTreeMap<String, i64> = BTreeMap::new();
        for session in &self.sessions {
            let summary = ask(&self.engine, ApiRoute::Summary, &[("session", session)]).await?;
            add_counts(&mut summed, &summary["by_state"])?;
            let groups = ask(
                &self.engine,
                ApiRoute::Aggregates,
                &[("session", session), ("by", "name"), ("limit", "1000")],
            )
            .await?;
            add_groups(&mut by_name, &groups)?;
        }
        for scope in [vec![("cluster", CLUSTER)], vec![]] {
            let before = self.recorder.gets().len();
            let mut counts = BTreeMap::new();
            add_counts(
                &mut counts,
                &ask(&self.engine, ApiRoute::Summary, &scope).await?["by_state"],
            )?;
            ensure!(
                counts == summed,
                "summary {scope:?}: {counts:?} != {summed:?}"
            );
            let mut names = BTreeMap::new();
            let by = [scope.as_slice(), &[("by", "name"), ("limit", "1000")]].concat();
            add_groups(
                &mut names,
                &ask(&self.engine, ApiRoute::Aggregates, &by).await?,
            )?;
            ensure!(
                names == by_name,
                "aggregates {scope:?}: {names:?} != {by_name:?}"
            );
            let manifests: Vec<String> = self.recorder.gets()[before..]
                .iter()
                .filter(|key| key.starts_with("tables/manifests/"))
                .filter(|key| ended.iter().any(|session| key.contains(session.as_str())))
                .cloned()
                .collect();
            ensure!(
                manifests.is_empty() == rolled_up,
                "{scope:?}: the ended sessions' manifests read {manifests:?}, from the \
                 cluster's rollup: {rolled_up}"
            );
        }
        Ok(())
    }
}

/// Adds a `by_state` object's counts into `into`.
fn add_counts(into: &mut BTreeMap<String, i64>, by_state: &Json) -> anyhow::Result<()> {
    for (state, count) in by_state.as_object().context("by_state")? {
        *into.entry(state.clone()).or_default() += count.as_i64().context("count")?;
    }
    Ok(())
}

/// Adds an aggregates answer's counts, by group and state, into `into`.
fn add_groups(into: &mut BTreeMap<String, i64>, answer: &Json) -> anyhow::Result<()> {
    ensure!(answer["next"].is_null(), "one page of groups");
    for group in answer["groups"].as_array().context("groups")? {
        let key = group["key"].as_str().unwrap_or_default();
        for (state, count) in group["by_state"].as_object().context("by_state")? {
            *into.entry(format!("{key}/{state}")).or_default() +=
                count.as_i64().context("count")?;
        }
    }
    Ok(())
}
