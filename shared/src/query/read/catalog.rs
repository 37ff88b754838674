//! What the catalog tells readers: the sessions in a scope, and pages of clusters with their
//! sessions, newest first. A scope of one cluster reads that cluster's document alone; a page
//! of every cluster reads the list of clusters, then the documents of as many clusters as the
//! page needs, several at a time and at most [`DOCUMENTS_PER_PAGE`] (see
//! [`crate::tables::catalog`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value as Json, json};

use super::params::{Cursor, Scope};
use crate::query::QueryError;
use crate::storage::Storage;
use crate::tables::catalog::{self, ClusterCatalog, ListedCluster, PARALLEL_DOCUMENTS};
use crate::tables::manifest::SessionStats;

/// What a [`Cursor`] of a page of every cluster belongs to.
pub const CURSOR_KIND: &str = "clusters";

/// What a [`Cursor`] of a page of one cluster (`cluster=`) belongs to. Its position has no
/// place among clusters, since that page does not read the list: applied to a page of every
/// cluster it would skip clusters, so it is a kind of its own.
pub const CLUSTER_CURSOR_KIND: &str = "clusters:cluster";

/// Most cluster documents one page of every cluster reads. When few clusters have sessions in
/// scope (a `session` filter), a page could otherwise read every cluster's document; past this
/// it ends, maybe empty, with a `next` after the last cluster it read.
pub const DOCUMENTS_PER_PAGE: usize = 64;

/// The kind of [`Cursor`] a page of `scope` returns and accepts: a page of one cluster and a
/// page of every cluster order by different positions.
pub fn cursor_kind(scope: &Scope) -> &'static str {
    if scope.cluster.is_some() {
        CLUSTER_CURSOR_KIND
    } else {
        CURSOR_KIND
    }
}

/// The statistics of every session in `scope`, from the catalog alone: the cluster's document
/// when the scope names a cluster, else every cluster's.
pub async fn session_stats(
    storage: &Arc<dyn Storage>,
    scope: &Scope,
) -> Result<BTreeMap<String, BTreeMap<String, SessionStats>>, QueryError> {
    Ok(documents_in_scope(storage, scope)
        .await?
        .into_iter()
        .map(|(cluster, document)| (cluster, document.sessions))
        .collect())
}

/// The catalog documents of the clusters in `scope` (see [`session_stats`]), each holding only
/// the sessions the scope selects; a cluster with none is left out.
pub async fn documents_in_scope(
    storage: &Arc<dyn Storage>,
    scope: &Scope,
) -> Result<BTreeMap<String, ClusterCatalog>, QueryError> {
    let mut clusters = match &scope.cluster {
        Some(cluster) => {
            let document = catalog::load_cluster(&**storage, cluster).await?;
            BTreeMap::from([(cluster.to_string(), document)])
        }
        None => catalog::load_documents(storage).await?,
    };
    clusters.retain(|cluster, document| {
        document
            .sessions
            .retain(|session, stats| scope.selects(cluster, session, stats));
        !document.sessions.is_empty()
    });
    Ok(clusters)
}

/// One page of the catalog.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CatalogPage {
    /// Clusters newest first, each with its sessions on this page.
    pub clusters: Vec<PagedCluster>,
    /// The cursor of the rest; `None` on the last page.
    pub next: Option<Cursor>,
}

/// A cluster on a page of the catalog.
#[derive(Clone, Debug, PartialEq)]
pub struct PagedCluster {
    /// Its name.
    pub cluster: String,
    /// Attempts in all of its sessions in scope, those on other pages too.
    pub attempts: u64,
    /// How many sessions it has in scope, those on other pages too.
    pub session_count: usize,
    /// Its sessions on this page, newest first.
    pub sessions: Vec<(String, SessionStats)>,
}

/// A page of at most `limit` sessions in `scope`, newest first, after `after` (the `next` of
/// the page before): clusters by when they were first recorded, latest first, and each
/// cluster's sessions by when they started, latest first (the first is the one Ray's `latest`
/// names). A cluster whose sessions go on past the page is on the next page again, with the
/// rest of them. A page of every cluster reads at most [`DOCUMENTS_PER_PAGE`] cluster
/// documents; it may end with a cursor to an empty page, when the clusters left have no session
/// in scope, or be empty itself with a cursor past the clusters it read. `after` must be of
/// [`cursor_kind`] of `scope`.
///
/// A session whose first event time moved earlier between two pages (a compaction found older
/// events) moves later in its cluster's order, so it may come again on a later page.
pub async fn catalog_page(
    storage: &Arc<dyn Storage>,
    scope: &Scope,
    limit: usize,
    after: Option<&Cursor>,
) -> Result<CatalogPage, QueryError> {
    let mut pager = Pager {
        scope,
        after: after
            .map(|cursor| Position::from_cursor(cursor, cursor_kind(scope)))
            .transpose()?,
        limit,
        taken: 0,
        page: CatalogPage::default(),
        last: None,
    };
    if let Some(cluster) = &scope.cluster {
        // The list is not read, so the cluster's place among clusters is not known: a cursor
        // within one cluster needs none.
        let document = catalog::load_cluster(&**storage, cluster).await?;
        let more = pager.take(cluster.as_str(), None, &document.sessions);
        return Ok(pager.finish(more));
    }
    let listing = catalog::listing(&**storage).await?;
    let mut clusters: Vec<(String, ListedCluster)> = listing.newest_first();
    if let Some(after) = &pager.after {
        clusters.retain(|(name, listed)| after.reaches(name, listed.since_ms));
    }
    let mut rest = clusters.as_slice();
    let mut read = 0;
    while !rest.is_empty() {
        if pager.is_full() {
            return Ok(pager.finish(true));
        }
        // Every cluster in scope adds a session at least, so no more documents are read at
        // once than the page has room for. `read` stays below the cap here: the loop ends
        // once it reaches it.
        let room = pager.limit.saturating_sub(pager.taken);
        let size = room
            .clamp(1, PARALLEL_DOCUMENTS)
            .min(DOCUMENTS_PER_PAGE.saturating_sub(read).max(1))
            .min(rest.len());
        let (batch, later) = rest.split_at(size);
        let names: Vec<String> = batch.iter().map(|(name, _)| name.clone()).collect();
        let documents = listing.documents(storage, &names).await?;
        read += batch.len();
        for ((name, listed), document) in batch.iter().zip(&documents) {
            if pager.take(name, listed.since_ms, &document.sessions) {
                return Ok(pager.finish(true));
            }
        }
        rest = later;
        // Every cluster of the batch is done: the next page starts after the last one.
        if read >= DOCUMENTS_PER_PAGE
            && !rest.is_empty()
            && let Some((name, listed)) = batch.last()
        {
            return Ok(pager.finish_after_cluster(name, listed.since_ms));
        }
    }
    Ok(pager.finish(false))
}

/// A page being filled.
struct Pager<'a> {
    scope: &'a Scope,
    after: Option<Position>,
    limit: usize,
    taken: usize,
    page: CatalogPage,
    /// The last session taken.
    last: Option<Position>,
}

impl Pager<'_> {
    fn is_full(&self) -> bool {
        self.taken >= self.limit
    }

    /// Adds the sessions of one cluster in scope that come after the cursor, newest first,
    /// while the page has room; true when some did not fit.
    fn take(
        &mut self,
        cluster: &str,
        since_ms: Option<i64>,
        sessions: &BTreeMap<String, SessionStats>,
    ) -> bool {
        let scope = self.scope;
        let in_scope: Vec<(&String, &SessionStats)> = catalog::newest_first(sessions)
            .into_iter()
            .filter(|(session, _)| scope.includes(cluster, session))
            .collect();
        let mut paged = PagedCluster {
            cluster: cluster.to_owned(),
            attempts: in_scope.iter().map(|(_, stats)| stats.attempts).sum(),
            session_count: in_scope.len(),
            sessions: Vec::new(),
        };
        let mut left_over = false;
        for (session, stats) in in_scope {
            if self
                .after
                .as_ref()
                .is_some_and(|after| !after.precedes(cluster, session, stats))
            {
                continue;
            }
            if self.is_full() {
                left_over = true;
                break;
            }
            paged.sessions.push((session.clone(), stats.clone()));
            self.taken += 1;
            self.last = Some(Position {
                since_ms,
                cluster: cluster.to_owned(),
                first_ms: stats.first_ms,
                session: session.clone(),
            });
        }
        if !paged.sessions.is_empty() {
            self.page.clusters.push(paged);
        }
        left_over
    }

    /// The page, with a cursor to the rest when there is `more`.
    fn finish(mut self, more: bool) -> CatalogPage {
        if more {
            let kind = cursor_kind(self.scope);
            self.page.next = self.last.as_ref().map(|last| last.cursor(kind));
        }
        self.page
    }

    /// The page, with a cursor to the clusters after `cluster` (listed since `since_ms`),
    /// every session of which in scope is on this page or an earlier one.
    fn finish_after_cluster(mut self, cluster: &str, since_ms: Option<i64>) -> CatalogPage {
        let done = Position::after_cluster(cluster, since_ms);
        self.page.next = Some(done.cursor(cursor_kind(self.scope)));
        self.page
    }
}

/// Where a page ended: its last session, and its cluster's place among clusters (unknown in a
/// scope of one cluster). No first event time and an empty session name (a name no session
/// has) mean the cluster is done: the page ended after its last session.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Position {
    since_ms: Option<i64>,
    cluster: String,
    first_ms: Option<i64>,
    session: String,
}

impl Position {
    /// A cursor's position: `[since_ms, cluster, first_ms, session]`, from a cursor of `kind`.
    fn from_cursor(cursor: &Cursor, kind: &str) -> Result<Self, QueryError> {
        let invalid =
            || QueryError::BadRequest("`cursor` is not a cursor this route returned".into());
        if cursor.kind != kind {
            return Err(invalid());
        }
        let [since_ms, cluster, first_ms, session] = cursor.after.as_slice() else {
            return Err(invalid());
        };
        let time = |value: &Json| match value {
            Json::Null => Ok(None),
            other => other.as_i64().map(Some).ok_or_else(invalid),
        };
        let text = |value: &Json| value.as_str().map(str::to_owned).ok_or_else(invalid);
        Ok(Self {
            since_ms: time(since_ms)?,
            cluster: text(cluster)?,
            first_ms: time(first_ms)?,
            session: text(session)?,
        })
    }

    /// The position after every session of `cluster` (listed since `since_ms`).
    fn after_cluster(cluster: &str, since_ms: Option<i64>) -> Self {
        Self {
            since_ms,
            cluster: cluster.to_owned(),
            first_ms: None,
            session: String::new(),
        }
    }

    /// Whether this position is after every session of its cluster ([`Self::after_cluster`]).
    fn is_cluster_done(&self) -> bool {
        self.first_ms.is_none() && self.session.is_empty()
    }

    /// This position as a cursor of `kind`.
    fn cursor(&self, kind: &str) -> Cursor {
        Cursor {
            kind: kind.to_owned(),
            after: vec![
                json!(self.since_ms),
                json!(self.cluster),
                json!(self.first_ms),
                json!(self.session),
            ],
        }
    }

    /// Whether a cluster is still to be paged after this position: it comes later, or it is
    /// this position's own cluster, whose sessions may go on unless it is done.
    fn reaches(&self, cluster: &str, since_ms: Option<i64>) -> bool {
        (cluster == self.cluster && !self.is_cluster_done())
            || (since_ms, cluster) < (self.since_ms, self.cluster.as_str())
    }

    /// Whether a session of `cluster` (in a cluster [`Self::reaches`]) comes after this
    /// position. None of a done cluster does: no `(first_ms, session)` sorts before
    /// `(None, "")`.
    fn precedes(&self, cluster: &str, session: &str, stats: &SessionStats) -> bool {
        cluster != self.cluster
            || (stats.first_ms, session) < (self.first_ms, self.session.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::ClusterName;

    fn stats(first_ms: Option<i64>) -> SessionStats {
        SessionStats {
            attempts: 1,
            first_ms,
            last_ms: first_ms,
            ..SessionStats::default()
        }
    }

    /// Pages of one cluster follow each other with no session lost or repeated, newest first,
    /// sessions with no event time last.
    #[test]
    fn pages_of_one_cluster_cover_it_newest_first() -> Result<(), Box<dyn std::error::Error>> {
        let sessions: BTreeMap<String, SessionStats> = (0..7)
            .map(|n| (format!("s{n}"), stats((n > 0).then_some(n * 10))))
            .chain([("t".to_owned(), stats(Some(30)))])
            .collect();
        let scope = Scope {
            cluster: Some(ClusterName::new("c")?),
            ..Scope::default()
        };
        let mut after: Option<Cursor> = None;
        let mut seen = Vec::new();
        loop {
            let mut pager = Pager {
                scope: &scope,
                after: after
                    .as_ref()
                    .map(|cursor| Position::from_cursor(cursor, CLUSTER_CURSOR_KIND))
                    .transpose()?,
                limit: 3,
                taken: 0,
                page: CatalogPage::default(),
                last: None,
            };
            let more = pager.take("c", None, &sessions);
            let page = pager.finish(more);
            for cluster in &page.clusters {
                assert_eq!((cluster.attempts, cluster.session_count), (8, 8));
                seen.extend(cluster.sessions.iter().map(|(name, _)| name.clone()));
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, ["s6", "s5", "s4", "t", "s3", "s2", "s1", "s0"]);
        Ok(())
    }

    #[test]
    fn a_cursor_of_another_shape_is_refused() {
        let cursor = Cursor {
            kind: CURSOR_KIND.to_owned(),
            after: vec![json!(1), json!("c")],
        };
        assert!(matches!(
            Position::from_cursor(&cursor, CURSOR_KIND),
            Err(QueryError::BadRequest(_))
        ));
    }

    /// A page of one cluster has no place among clusters: its cursor on a page of every
    /// cluster would skip clusters, so each kind is refused where the other is expected.
    #[test]
    fn a_cursor_of_the_other_scope_is_refused() {
        let position = Position {
            since_ms: None,
            cluster: "c".to_owned(),
            first_ms: Some(5),
            session: "s".to_owned(),
        };
        for (made, expected) in [
            (CLUSTER_CURSOR_KIND, CURSOR_KIND),
            (CURSOR_KIND, CLUSTER_CURSOR_KIND),
        ] {
            assert!(matches!(
                Position::from_cursor(&position.cursor(made), expected),
                Err(QueryError::BadRequest(_))
            ));
        }
    }

    /// A position after a cluster reaches neither that cluster nor any of its sessions (even
    /// one with no event time), and still reaches the clusters after it.
    #[test]
    fn a_position_after_a_cluster_skips_all_of_it() {
        let done = Position::after_cluster("m", Some(2_000));
        assert!(!done.reaches("m", Some(2_000)));
        assert!(!done.precedes("m", "s", &stats(None)));
        assert!(!done.precedes("m", "s", &stats(Some(i64::MIN))));
        assert!(done.reaches("z", Some(1_000)));
        assert!(done.reaches("a", Some(2_000)));
        assert!(!done.reaches("z", Some(2_000)));
    }
}
