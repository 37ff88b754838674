//! `GET /api/clusters` and Ray's `latest` over the catalog: pages newest first with a cursor
//! (every answer checked against `openapi.yaml`), pages of many clusters (each session once, and
//! a bound on the documents a page reads), a cluster of many sessions paged from its own
//! document alone, and a store whose catalog is the single document an earlier build wrote.

use std::path::Path;
use std::sync::Arc;

use afterglow::http::router;
use afterglow::state::{AppState, QueryService};
use afterglow_tests::api::Api;
use afterglow_tests::faults::RecordsRequests;
use afterglow_tests::scenario::{Scenario, query_params};
use anyhow::{Context as _, ensure};
use serde_json::{Value as Json, json};
use shared::keys::{self, ClusterName, SessionName};
use shared::query::ray::RayRequest;
use shared::query::{ApiRoute, QueryEngine, QueryError, QuerySettings};
use shared::storage::{PutMode, Storage};
use shared::tables::catalog;
use shared::tables::manifest::SessionStats;

fn stats(attempts: u64, first_ms: i64) -> SessionStats {
    SessionStats {
        attempts,
        first_ms: Some(first_ms),
        last_ms: Some(first_ms + 500),
        ..SessionStats::default()
    }
}

/// Records `session` of `cluster` as a compaction does after a commit.
async fn record(
    storage: &Arc<dyn Storage>,
    cluster: &str,
    session: &str,
    stats: &SessionStats,
) -> anyhow::Result<()> {
    catalog::record(
        storage,
        &ClusterName::new(cluster)?,
        &SessionName::new(session)?,
        stats,
        None,
    )
    .await?;
    Ok(())
}

/// The dashboard API over `storage`, as the Lambda query function serves it, its cache in
/// `dir`.
fn api_over(storage: Arc<dyn Storage>, dir: &Path) -> anyhow::Result<Api> {
    let engine = QueryEngine::open(storage, QuerySettings::under(dir))?;
    let state = Arc::new(AppState {
        query: Some(QueryService {
            engine,
            token: None,
        }),
        ..AppState::default()
    });
    Ok(Api::Lambda(router(state)))
}

/// Every `(cluster, session)` of the pages a list of clusters was answered in, in order.
fn pairs(clusters: &[Json]) -> anyhow::Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for cluster in clusters {
        let name = cluster["cluster"].as_str().context("cluster")?;
        for session in cluster["sessions"].as_array().context("sessions")? {
            let session = session["session_name"].as_str().context("session_name")?;
            pairs.push((name.to_owned(), session.to_owned()));
        }
    }
    Ok(pairs)
}

/// Pages of `/api/clusters` follow each other through `next`, newest first: clusters by when
/// they were first recorded, each cluster's sessions by when they started; a cluster split
/// between pages comes on both, each time with the counts of all of its sessions. The same
/// within one cluster, and a cursor this route did not return, or one of the other scope, is a
/// 400. Names are chosen so that newest first is not the order of names, either way.
async fn the_route_pages_newest_first_with_a_cursor(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    // `z` is recorded first, with its oldest session, and `a` last; within a cluster, the
    // session that started later has the smaller name.
    record(&storage, "z", "z9", &stats(1, 1_000)).await?;
    record(&storage, "m", "m9", &stats(10, 2_000)).await?;
    record(&storage, "z", "z5", &stats(2, 3_000)).await?;
    record(&storage, "a", "a1", &stats(100, 4_000)).await?;
    record(&storage, "z", "z1", &stats(3, 5_000)).await?;
    record(&storage, "m", "m1", &stats(20, 6_000)).await?;
    let dir = tempfile::tempdir()?;
    let api = api_over(Arc::clone(&storage), dir.path())?;

    let first = api.ok("/api/clusters?limit=2").await?;
    ensure!(first["next"].is_string(), "{first}");
    ensure!(
        first["clusters"]
            == json!([
                {"cluster": "a", "attempts": 100, "session_count": 1, "sessions": [
                    {"session_name": "a1", "attempts": 100, "first_ms": 4_000, "last_ms": 4_500}]},
                {"cluster": "m", "attempts": 30, "session_count": 2, "sessions": [
                    {"session_name": "m1", "attempts": 20, "first_ms": 6_000, "last_ms": 6_500}]},
            ]),
        "{first}"
    );
    let every = api
        .all_pages("/api/clusters", "limit=2", "clusters")
        .await?;
    let expected: Vec<(String, String)> = [
        ("a", "a1"),
        ("m", "m1"),
        ("m", "m9"),
        ("z", "z1"),
        ("z", "z5"),
        ("z", "z9"),
    ]
    .iter()
    .map(|(cluster, session)| ((*cluster).to_owned(), (*session).to_owned()))
    .collect();
    ensure!(pairs(&every)? == expected, "{every:?}");
    ensure!(
        every
            .iter()
            .filter(|cluster| cluster["cluster"] == "m")
            .all(|cluster| cluster["attempts"] == 30 && cluster["session_count"] == 2),
        "{every:?}"
    );

    let one = api
        .all_pages("/api/clusters", "cluster=z&limit=1", "clusters")
        .await?;
    ensure!(one.len() == 3, "three pages of one session each: {one:?}");
    ensure!(pairs(&one)? == expected[3..], "{one:?}");
    let scoped = api.ok("/api/clusters?session=m9").await?;
    ensure!(
        pairs(scoped["clusters"].as_array().context("clusters")?)?
            == [("m".to_owned(), "m9".to_owned())]
            && scoped["clusters"][0]["attempts"] == 10
            && scoped["next"].is_null(),
        "{scoped}"
    );

    // `{"kind":"clusters","after":[1]}`: this route's kind, a position of another shape; and
    // `{"kind":"clusters","after":["x","big",1,"s"]}`: the right shape, not the right types.
    for cursor in [
        "nonsense",
        "eyJraW5kIjoiY2x1c3RlcnMiLCJhZnRlciI6WzFdfQ",
        "eyJraW5kIjoiY2x1c3RlcnMiLCJhZnRlciI6WyJ4IiwiYmlnIiwxLCJzIl19",
    ] {
        let refused = api.get(&format!("/api/clusters?cursor={cursor}")).await?;
        ensure!(refused.status == 400, "{cursor}: {refused:?}");
    }
    // A cursor of one cluster's pages has no place among clusters, and one of every cluster's
    // pages none within one cluster: each is refused in the other scope.
    let within = api.ok("/api/clusters?cluster=z&limit=1").await?;
    let within = within["next"].as_str().context("a next page of `z`")?;
    let refused = api
        .get(&format!("/api/clusters?limit=1&cursor={within}"))
        .await?;
    ensure!(refused.status == 400, "{refused:?}");
    let across = first["next"].as_str().context("a next page")?;
    let refused = api
        .get(&format!("/api/clusters?cluster=z&limit=1&cursor={across}"))
        .await?;
    ensure!(refused.status == 400, "{refused:?}");
    Ok(())
}

/// A store whose catalog is the single document an earlier build wrote (a fixture's) lists its
/// clusters and sessions, and Ray's `latest` finds the session in it; once a compaction has
/// recorded another cluster (and so moved the single document), both are listed.
async fn a_store_with_the_single_catalog_document_is_listed(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/stores/7ed31af-basic-workload-first-half/tables/catalog.json");
    storage
        .put(
            &keys::single_catalog_key()?,
            bytes::Bytes::from(std::fs::read(&fixture)?),
            PutMode::Create,
        )
        .await?;
    let session = "session_2026-11-22_06-11-29_227665_10899";
    let dir = tempfile::tempdir()?;
    let api = api_over(Arc::clone(&storage), &dir.path().join("api"))?;
    let engine = QueryEngine::open(
        Arc::clone(&storage),
        QuerySettings::under(&dir.path().join("engine")),
    )?;
    let upgrade = json!([{"cluster": "upgrade", "attempts": 236, "session_count": 1,
        "sessions": [{"session_name": session, "attempts": 236,
            "first_ms": 1_795_327_897_652_i64, "last_ms": 1_795_327_912_584_i64}]}]);
    for path in ["/api/clusters", "/api/clusters?cluster=upgrade"] {
        let listed = api.ok(path).await?;
        ensure!(
            listed["clusters"] == upgrade && listed["next"].is_null(),
            "{path}: {listed}"
        );
    }
    let latest = RayRequest::parse("GET", "upgrade/latest/api/version")?;
    let version: Json = serde_json::from_slice(engine.answer_ray(&latest, &[]).await?.as_bytes())?;
    ensure!(version["session_name"] == session, "{version}");

    record(
        &storage,
        "later",
        "session_later",
        &stats(7, 1_796_000_000_000),
    )
    .await?;
    let listed = api.ok("/api/clusters").await?;
    ensure!(
        pairs(listed["clusters"].as_array().context("clusters")?)?
            == [
                ("later".to_owned(), "session_later".to_owned()),
                ("upgrade".to_owned(), session.to_owned()),
            ],
        "{listed}"
    );
    let version: Json = serde_json::from_slice(engine.answer_ray(&latest, &[]).await?.as_bytes())?;
    ensure!(version["session_name"] == session, "{version}");
    Ok(())
}

/// The name of cluster `n` of the tests of many clusters below.
fn numbered_cluster(n: i64) -> String {
    format!("cluster-{n:03}")
}

/// The name of the one session of cluster `n`.
fn numbered_session(n: i64) -> String {
    format!("session_{n:03}")
}

/// When the session of cluster `n` of `count` started: 37 is prime to the counts used, so this
/// shuffles the clusters, and newest first is not the order of names. Cluster 0 is the oldest.
fn numbered_first_ms(n: i64, count: i64) -> i64 {
    1_000_000 + (n * 37 % count) * 1_000
}

/// Records `count` clusters of one session each, started in a shuffled order.
async fn record_numbered(storage: &Arc<dyn Storage>, count: i64) -> anyhow::Result<()> {
    for n in 0..count {
        record(
            storage,
            &numbered_cluster(n),
            &numbered_session(n),
            &stats(1, numbered_first_ms(n, count)),
        )
        .await?;
    }
    Ok(())
}

/// Forty clusters of one session each, five sessions a page: pages cross the batches of
/// cluster documents read at once, and a page ending at a cluster's last session is followed
/// by one that reads that cluster again. Every `(cluster, session)` comes exactly once, newest
/// first.
async fn pages_of_many_clusters_hold_each_session_once(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    const CLUSTERS: i64 = 40;
    record_numbered(&storage, CLUSTERS).await?;
    let dir = tempfile::tempdir()?;
    let api = api_over(Arc::clone(&storage), dir.path())?;
    let every = api
        .all_pages("/api/clusters", "limit=5", "clusters")
        .await?;
    let mut by_time: Vec<(i64, String, String)> = (0..CLUSTERS)
        .map(|n| {
            (
                numbered_first_ms(n, CLUSTERS),
                numbered_cluster(n),
                numbered_session(n),
            )
        })
        .collect();
    by_time.sort_by_key(|entry| std::cmp::Reverse(entry.0));
    let expected: Vec<(String, String)> = by_time
        .into_iter()
        .map(|(_, cluster, session)| (cluster, session))
        .collect();
    ensure!(pairs(&every)? == expected, "{every:?}");
    Ok(())
}

afterglow_tests::for_each_backend!(
    the_route_pages_newest_first_with_a_cursor,
    a_store_with_the_single_catalog_document_is_listed,
    pages_of_many_clusters_hold_each_session_once,
);

/// A hundred clusters, and a page of every cluster asking for the session of the oldest: a
/// page reads at most 64 cluster documents, so the first page ends empty with a `next` past
/// the clusters it read, and the second finds the session and ends the paging.
#[tokio::test]
async fn a_page_reads_at_most_64_cluster_documents() -> anyhow::Result<()> {
    const CLUSTERS: i64 = 100;
    let scenario = Scenario::local()?;
    let storage = scenario.storage();
    record_numbered(&storage, CLUSTERS).await?;
    let recorded = Arc::new(RecordsRequests::new(Arc::clone(&storage)));
    let engine = QueryEngine::open(
        Arc::clone(&recorded) as Arc<dyn Storage>,
        QuerySettings::under(&scenario.dir()?.join("query")),
    )?;
    let oldest = numbered_session(0);
    let mut found = Vec::new();
    let mut clusters_a_page = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        ensure!(clusters_a_page.len() < 10, "paging never ended");
        let before = recorded.gets().len();
        let mut params = vec![("session", oldest.as_str()), ("limit", "1000")];
        if let Some(cursor) = &cursor {
            params.push(("cursor", cursor.as_str()));
        }
        let page = engine
            .answer(&ApiRoute::Clusters, &query_params(&params))
            .await?;
        let documents = recorded
            .gets()
            .iter()
            .skip(before)
            .filter(|key| key.starts_with("tables/catalog/cluster="))
            .count();
        ensure!(
            documents <= 64,
            "page {} read {documents} cluster documents",
            clusters_a_page.len() + 1
        );
        let clusters = page["clusters"].as_array().context("clusters")?;
        clusters_a_page.push(clusters.len());
        found.extend(pairs(clusters)?);
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    ensure!(
        found == [(numbered_cluster(0), oldest.clone())],
        "{found:?}"
    );
    ensure!(clusters_a_page == [0, 1], "{clusters_a_page:?}");
    Ok(())
}

/// A cluster of 10 000 sessions among others: its newest page, the page after it, and Ray's
/// `latest` for it each read its own catalog document and nothing else (neither the list of
/// clusters nor another cluster's document).
#[tokio::test]
async fn a_large_cluster_pages_from_its_own_document_alone() -> anyhow::Result<()> {
    const SESSIONS: i64 = 10_000;
    let scenario = Scenario::local()?;
    let storage = scenario.storage();
    let session_name = |n: i64| format!("session_2026-12-01_00-00-00_{n:06}_1");
    for other in 0..5 {
        record(
            &storage,
            &format!("other-{other}"),
            &session_name(0),
            &stats(1, 1_000),
        )
        .await?;
    }
    let big = ClusterName::new("big")?;
    record(&storage, "big", &session_name(0), &stats(1, 0)).await?;
    // The rest are written into its document at once: recorded one by one, the document would
    // be rewritten 10 000 times.
    let mut document = catalog::load_cluster(&*storage, &big).await?;
    for n in 0..SESSIONS {
        document
            .sessions
            .insert(session_name(n), stats(1, 1_000_000 + n * 1_000));
    }
    let big_key = keys::cluster_catalog_key(&big)?;
    storage
        .put(
            &big_key,
            bytes::Bytes::from(serde_json::to_vec(&document)?),
            PutMode::Overwrite,
        )
        .await?;

    let recorded = Arc::new(RecordsRequests::new(Arc::clone(&storage)));
    let engine = QueryEngine::open(
        Arc::clone(&recorded) as Arc<dyn Storage>,
        QuerySettings::under(&scenario.dir()?.join("query")),
    )?;
    let page = |cursor: Option<String>| {
        let engine = &engine;
        async move {
            let mut params = vec![("cluster", "big"), ("limit", "100")];
            if let Some(cursor) = &cursor {
                params.push(("cursor", cursor.as_str()));
            }
            engine
                .answer(&ApiRoute::Clusters, &query_params(&params))
                .await
        }
    };
    let first = page(None).await?;
    let cluster = &first["clusters"][0];
    let sessions = cluster["sessions"].as_array().context("sessions")?;
    ensure!(
        sessions.len() == 100
            && cluster["session_count"] == SESSIONS
            && cluster["attempts"] == SESSIONS
            && sessions[0]["session_name"] == session_name(SESSIONS - 1)
            && sessions[99]["session_name"] == session_name(SESSIONS - 100),
        "{cluster}"
    );
    let next = first["next"].as_str().context("a next page")?.to_owned();
    let second = page(Some(next)).await?;
    ensure!(
        second["clusters"][0]["sessions"][0]["session_name"] == session_name(SESSIONS - 101),
        "{second}"
    );
    let latest = RayRequest::parse("GET", "big/latest/api/version")?;
    let version: Json = serde_json::from_slice(engine.answer_ray(&latest, &[]).await?.as_bytes())?;
    ensure!(
        version["session_name"] == session_name(SESSIONS - 1),
        "{version}"
    );
    let gets = recorded.gets();
    ensure!(
        gets == vec![big_key.to_string(); 3],
        "two pages and a `latest` read more than the cluster's own document: {gets:?}"
    );
    // `e30` is `{}`, which no cursor decodes from; the other is a cursor of this scope's kind
    // whose position has the right shape and the wrong types:
    // `{"kind":"clusters:cluster","after":["x","big",1,"s"]}`.
    for cursor in [
        "e30",
        "eyJraW5kIjoiY2x1c3RlcnM6Y2x1c3RlciIsImFmdGVyIjpbIngiLCJiaWciLDEsInMiXX0",
    ] {
        let unknown = engine
            .answer(
                &ApiRoute::Clusters,
                &query_params(&[("cluster", "big"), ("cursor", cursor)]),
            )
            .await;
        ensure!(
            matches!(unknown, Err(QueryError::BadRequest(_))),
            "{cursor}: {unknown:?}"
        );
    }
    Ok(())
}
