//! The catalog on both backends: records racing across many clusters lose no entry, each
//! cluster keeps a document of its own, and a store whose catalog is the single document an
//! earlier build wrote is moved into a document per cluster by its first record, even when the
//! response to the list's creation is lost.

use std::sync::Arc;

use afterglow_tests::faults::LosesConditionalResponses;
use anyhow::{Context as _, ensure};
use serde_json::Value as Json;
use shared::keys::{self, ClusterName, SessionName};
use shared::storage::{PutMode, Storage};
use shared::tables::catalog;
use shared::tables::manifest::SessionStats;

/// Clusters recorded at once.
const CLUSTERS: i64 = 20;
/// Sessions of each cluster recorded at once.
const SESSIONS: i64 = 10;

fn cluster_name(cluster: i64) -> String {
    format!("cluster-{cluster:02}")
}

fn session_name(cluster: i64, session: i64) -> String {
    format!("session_2026-12-01_00-00-{session:02}_000000_{cluster}")
}

fn stats_of(cluster: i64, session: i64) -> SessionStats {
    let first = 1_796_000_000_000 + session * 60_000;
    SessionStats {
        attempts: (cluster * 100 + session) as u64,
        first_ms: Some(first),
        last_ms: Some(first + 30_000),
        ..SessionStats::default()
    }
}

fn oldest_raw_ms(cluster: i64, session: i64) -> u64 {
    1_795_000_000_000 + (session * 1_000 + cluster) as u64
}

/// The single catalog document of the store fixture `7ed31af-basic-workload-first-half`, as an
/// earlier build wrote it: one cluster, `upgrade`, of one session. The values below are copied
/// from it by hand, so the tests check what the code reads against what is stored.
const FIXTURE_SINGLE: &str =
    "fixtures/stores/7ed31af-basic-workload-first-half/tables/catalog.json";
/// The fixture's session.
const FIXTURE_SESSION: &str = "session_2026-11-22_06-11-29_227665_10899";
/// The fixture session's attempts.
const FIXTURE_ATTEMPTS: u64 = 236;
/// The fixture session's first event time.
const FIXTURE_FIRST_MS: i64 = 1_795_327_897_652;
/// The fixture session's last event time.
const FIXTURE_LAST_MS: i64 = 1_795_327_912_584;
/// The ULID time of the oldest raw object compacted into the fixture cluster's tables.
const FIXTURE_RAW_FROM: u64 = 1_795_585_917_347;

/// Puts the fixture's single catalog document into `storage`, and returns its bytes.
async fn put_fixture_single(storage: &Arc<dyn Storage>) -> anyhow::Result<Vec<u8>> {
    let single =
        std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE_SINGLE))?;
    storage
        .put(
            &keys::single_catalog_key()?,
            bytes::Bytes::from(single.clone()),
            PutMode::Create,
        )
        .await?;
    Ok(single)
}

/// Checks that the stored document of the fixture's cluster `upgrade` holds, field by field in
/// its JSON, what the fixture's single document holds for it.
async fn ensure_upgrade_moved(storage: &Arc<dyn Storage>) -> anyhow::Result<()> {
    let key = keys::cluster_catalog_key(&ClusterName::new("upgrade")?)?;
    let stored = storage.get(&key).await.with_context(|| {
        format!("the single document's cluster has no document of its own ({key})")
    })?;
    let document: Json = serde_json::from_slice(&stored.body)?;
    let session = &document["sessions"][FIXTURE_SESSION];
    ensure!(
        session["attempts"] == FIXTURE_ATTEMPTS
            && session["first_ms"] == FIXTURE_FIRST_MS
            && session["last_ms"] == FIXTURE_LAST_MS
            && document["raw_from"] == FIXTURE_RAW_FROM,
        "{document}"
    );
    ensure!(
        document["sessions"]
            .as_object()
            .map(|sessions| sessions.len())
            == Some(1),
        "{document}"
    );
    Ok(())
}

/// 200 compactions recording at once, ten sessions in each of twenty clusters that have no
/// document yet (so the list of clusters is contended too): every session is in its cluster's
/// document with its statistics, every cluster is listed, each cluster's oldest raw object is
/// the oldest any of its records named, and the catalog is one document per cluster and the
/// list.
async fn racing_records_across_clusters_lose_no_entry(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let mut records = tokio::task::JoinSet::new();
    for cluster in 0..CLUSTERS {
        for session in 0..SESSIONS {
            let storage = Arc::clone(&storage);
            records.spawn(async move {
                let name = ClusterName::new(&cluster_name(cluster))?;
                let session_name = SessionName::new(&session_name(cluster, session))?;
                catalog::record(
                    &storage,
                    &name,
                    &session_name,
                    &stats_of(cluster, session),
                    Some(oldest_raw_ms(cluster, session)),
                )
                .await?;
                anyhow::Ok(())
            });
        }
    }
    while let Some(joined) = records.join_next().await {
        joined??;
    }
    let listed = catalog::load(&storage).await?;
    ensure!(
        listed.clusters.len() == CLUSTERS as usize,
        "{} of {CLUSTERS} clusters listed",
        listed.clusters.len()
    );
    for cluster in 0..CLUSTERS {
        let name = cluster_name(cluster);
        let sessions = listed
            .clusters
            .get(&name)
            .with_context(|| format!("{name} is not listed"))?;
        ensure!(
            sessions.len() == SESSIONS as usize,
            "{name}: {} of {SESSIONS} sessions",
            sessions.len()
        );
        for session in 0..SESSIONS {
            let session_name = session_name(cluster, session);
            ensure!(
                sessions.get(&session_name) == Some(&stats_of(cluster, session)),
                "{name} {session_name}: {:?}",
                sessions.get(&session_name)
            );
        }
        ensure!(
            listed.raw_from.get(&name) == Some(&oldest_raw_ms(cluster, 0)),
            "{name}: raw objects from {:?}",
            listed.raw_from.get(&name)
        );
    }
    let documents = storage.list(keys::CATALOG_PREFIX).await?;
    ensure!(
        documents.len() == CLUSTERS as usize + 1,
        "the catalog is {} objects: {:?}",
        documents.len(),
        documents.iter().map(|meta| &meta.key).collect::<Vec<_>>()
    );
    Ok(())
}

/// A store whose catalog is the single document an earlier build wrote (a fixture's): it is
/// read as it is; the first record, of a new cluster, lists the single document's clusters and
/// gives each a document of its own, with its sessions and its oldest raw object; expiry then
/// forgets a session in that document. The single document is left as it was.
async fn the_single_document_is_moved_by_the_first_record(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let single = put_fixture_single(&storage).await?;
    let single_key = keys::single_catalog_key()?;
    let fixture_stats = SessionStats {
        attempts: FIXTURE_ATTEMPTS,
        first_ms: Some(FIXTURE_FIRST_MS),
        last_ms: Some(FIXTURE_LAST_MS),
        ..SessionStats::default()
    };
    let read = catalog::load(&storage).await?;
    ensure!(
        read.clusters.len() == 1
            && read
                .clusters
                .get("upgrade")
                .and_then(|sessions| sessions.get(FIXTURE_SESSION))
                == Some(&fixture_stats)
            && read.raw_from.get("upgrade") == Some(&FIXTURE_RAW_FROM),
        "{read:?}"
    );
    let upgrade = ClusterName::new("upgrade")?;
    let session = SessionName::new(FIXTURE_SESSION)?;
    let before = catalog::load_cluster(&*storage, &upgrade).await?;
    ensure!(
        before.sessions.get(session.as_str()) == Some(&fixture_stats)
            && before.raw_from == Some(FIXTURE_RAW_FROM),
        "{before:?}"
    );

    let new = ClusterName::new("new")?;
    catalog::record(
        &storage,
        &new,
        &session,
        &stats_of(0, 0),
        Some(oldest_raw_ms(0, 0)),
    )
    .await?;
    ensure_upgrade_moved(&storage).await?;
    let moved = catalog::load(&storage).await?;
    ensure!(moved.clusters.contains_key("new"), "{moved:?}");
    ensure!(
        storage.get(&single_key).await?.body.as_ref() == single.as_slice(),
        "the single document was changed"
    );

    catalog::forget(&storage, &upgrade, &session, i64::MAX).await?;
    let after = catalog::load(&storage).await?;
    ensure!(!after.clusters.contains_key("upgrade"), "{after:?}");
    ensure!(!after.raw_from.contains_key("upgrade"), "{after:?}");
    ensure!(after.clusters.contains_key("new"), "{after:?}");
    Ok(())
}

/// The same move when the response to the list's creation is lost (it landed, and the SDK's
/// retry got 412): the record's redo finds its cluster listed, and the single document's other
/// clusters are moved all the same.
async fn a_lost_response_to_the_list_still_moves_the_single_document(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    put_fixture_single(&storage).await?;
    let lossy = Arc::new(LosesConditionalResponses::new(
        Arc::clone(&storage),
        "tables/catalog/clusters.json",
        1,
    ));
    let new = ClusterName::new("new")?;
    catalog::record(
        &(Arc::clone(&lossy) as Arc<dyn Storage>),
        &new,
        &SessionName::new(&session_name(0, 0))?,
        &stats_of(0, 0),
        Some(oldest_raw_ms(0, 0)),
    )
    .await?;
    ensure!(lossy.lost() == 1, "no response was lost");
    ensure_upgrade_moved(&storage).await?;
    let listed = catalog::load(&storage).await?;
    ensure!(
        listed.clusters.contains_key("new") && listed.clusters.contains_key("upgrade"),
        "{listed:?}"
    );
    Ok(())
}

afterglow_tests::for_each_backend!(
    racing_records_across_clusters_lose_no_entry,
    the_single_document_is_moved_by_the_first_record,
    a_lost_response_to_the_list_still_moves_the_single_document,
);
