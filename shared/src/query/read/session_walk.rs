//! A page that spans sessions reads them one at a time, in session order (newest first for a
//! descending page), and only as many as it needs: it stops once it has its rows, and it reads
//! a further session only while those it read hold fewer than [`WALK_ATTEMPTS`] attempts, so a
//! filter that few rows pass ends a page early with a cursor instead of reading every session.
//!
//! The sessions come from the catalog alone ([`super::catalog::session_stats`]), so a page
//! costs the catalog's documents in scope and the files of the sessions it reads.

use std::cmp::Ordering;
use std::sync::Arc;

use serde_json::{Value as Json, json};

use super::attempts::filtered_relation;
use super::catalog::session_stats;
use super::json::JsonRow;
use super::page::{page_cursor, task_position};
use super::params::{Cursor, Scope, TaskFilter};
use super::task_page::{TIE_BREAK, TaskPage, TaskSort};
use crate::keys::ClusterName;
use crate::query::{QueryEngine, QueryError};
use crate::storage::Storage;

/// Attempts (as the catalog counts them) after which a page reads no further session; the
/// first session it reads is read whatever its size.
pub(crate) const WALK_ATTEMPTS: u64 = 1_000_000;

/// A page of the task table over every session in its filter's scope.
pub(crate) struct WalkedPage<'a> {
    /// Which attempts (and sessions).
    pub filter: &'a TaskFilter,
    /// The order within a session.
    pub sort: TaskSort,
    /// Largest first, newest session first.
    pub descending: bool,
    /// Rows wanted.
    pub limit: usize,
    /// The columns returned, besides `sort_key`.
    pub columns: &'a [&'static str],
    /// The kind of the cursors it returns.
    pub kind: &'a str,
}

impl WalkedPage<'_> {
    /// The page's rows (each with its `sort_key`) after `cursor`, and the cursor of the rest.
    pub(crate) async fn read(
        &self,
        engine: &QueryEngine,
        cursor: Option<&Cursor>,
    ) -> Result<(Vec<JsonRow>, Option<String>), QueryError> {
        let resume = cursor
            .map(|cursor| WalkPosition::from_values(&cursor.after))
            .transpose()?;
        let sessions =
            sessions_in_order(engine.storage(), &self.filter.scope, self.descending).await?;
        let mut rows = Vec::new();
        let mut walked_attempts = 0_u64;
        let mut last_walked: Option<&WalkedSession> = None;
        let mut cut_short = false;
        for session in &sessions {
            let after = match &resume {
                None => None,
                Some(position) => match position.compare(session, self.descending) {
                    Ordering::Less => continue,
                    Ordering::Equal => match &position.within {
                        None => continue,
                        Some(within) => Some(task_position(within)?),
                    },
                    Ordering::Greater => None,
                },
            };
            if last_walked.is_some() && walked_attempts >= WALK_ATTEMPTS {
                cut_short = true;
                break;
            }
            last_walked = Some(session);
            walked_attempts += session.attempts;
            let filter = TaskFilter {
                scope: session.scope(&self.filter.scope)?,
                ..self.filter.clone()
            };
            let Some(relation) = filtered_relation(engine, &filter).await? else {
                continue;
            };
            let page = TaskPage {
                filter: &filter,
                sort: self.sort,
                descending: self.descending,
                limit: self.limit - rows.len(),
                after,
                columns: self.columns,
            };
            rows.extend(page.rows(engine, &relation).await?);
            if rows.len() > self.limit {
                break;
            }
        }
        let mut next = page_cursor(&mut rows, self.limit, |last| {
            self.cursor_after(last, &sessions)
        });
        if next.is_none()
            && cut_short
            && let Some(session) = last_walked
        {
            let cursor = Cursor {
                kind: self.kind.to_owned(),
                after: WalkPosition::after_session(session).to_values(),
            };
            next = Some(cursor.encode());
        }
        Ok((rows, next))
    }

    /// The cursor after `last`, a row of one of `sessions`.
    fn cursor_after(&self, last: &JsonRow, sessions: &[WalkedSession]) -> Cursor {
        let text = |column: &str| last.get(column).and_then(Json::as_str).unwrap_or_default();
        let first_ms = sessions
            .iter()
            .find(|session| {
                session.cluster == text("cluster") && session.session == text("session_name")
            })
            .and_then(|session| session.first_ms);
        let within = std::iter::once("sort_key")
            .chain(TIE_BREAK)
            .map(|column| last.get(column).cloned().unwrap_or(Json::Null))
            .collect();
        Cursor {
            kind: self.kind.to_owned(),
            after: WalkPosition::within(first_ms, text("cluster"), text("session_name"), within)
                .to_values(),
        }
    }
}

/// A session in a walk, by its place in the order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct WalkedSession {
    /// Its earliest event time (the catalog's `first_ms`), which orders sessions.
    pub first_ms: Option<i64>,
    /// Its cluster.
    pub cluster: String,
    /// Its name.
    pub session: String,
    /// Its attempts, as the catalog counts them.
    pub attempts: u64,
}

impl WalkedSession {
    /// The scope of this session alone, within `scope`'s time range.
    pub(crate) fn scope(&self, scope: &Scope) -> Result<Scope, QueryError> {
        Ok(Scope {
            cluster: Some(
                ClusterName::new(&self.cluster)
                    .map_err(|err| QueryError::Internal(format!("catalog: {err}")))?,
            ),
            session: Some(self.session.clone()),
            created: scope.created,
        })
    }

    fn place(&self) -> (Option<i64>, &str, &str) {
        (self.first_ms, &self.cluster, &self.session)
    }
}

/// The sessions in `scope`, in the order a page walks them: by earliest event time, then
/// cluster and name, newest first when `descending`.
pub(crate) async fn sessions_in_order(
    storage: &Arc<dyn Storage>,
    scope: &Scope,
    descending: bool,
) -> Result<Vec<WalkedSession>, QueryError> {
    let mut sessions: Vec<WalkedSession> = session_stats(storage, scope)
        .await?
        .into_iter()
        .flat_map(|(cluster, sessions)| {
            sessions
                .into_iter()
                .map(move |(session, stats)| WalkedSession {
                    first_ms: stats.first_ms,
                    cluster: cluster.clone(),
                    session,
                    attempts: stats.attempts,
                })
        })
        .collect();
    sessions.sort();
    if descending {
        sessions.reverse();
    }
    Ok(sessions)
}

/// Where a walk resumes: within a session, after a row (its page position, as the route's
/// cursor holds it), or after all of a session.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct WalkPosition {
    /// The session's place.
    first_ms: Option<i64>,
    cluster: String,
    session: String,
    /// The position within it; `None`: past all of it.
    pub within: Option<Vec<Json>>,
}

impl WalkPosition {
    /// After the row at `within` of `session` of `cluster` (earliest event at `first_ms`).
    pub(crate) fn within(
        first_ms: Option<i64>,
        cluster: &str,
        session: &str,
        within: Vec<Json>,
    ) -> Self {
        Self {
            first_ms,
            cluster: cluster.to_owned(),
            session: session.to_owned(),
            within: Some(within),
        }
    }

    /// After every row of `session`.
    pub(crate) fn after_session(session: &WalkedSession) -> Self {
        Self {
            first_ms: session.first_ms,
            cluster: session.cluster.clone(),
            session: session.session.clone(),
            within: None,
        }
    }

    /// As a cursor's values: `[first_ms, cluster, session]`, then the position within.
    pub(crate) fn to_values(&self) -> Vec<Json> {
        let mut values = vec![
            json!(self.first_ms),
            json!(self.cluster),
            json!(self.session),
        ];
        values.extend(self.within.iter().flatten().cloned());
        values
    }

    /// From a cursor's values (see [`Self::to_values`]).
    pub(crate) fn from_values(values: &[Json]) -> Result<Self, QueryError> {
        let invalid =
            || QueryError::BadRequest("`cursor` is not a cursor this route returned".into());
        let [first_ms, cluster, session, within @ ..] = values else {
            return Err(invalid());
        };
        let first_ms = match first_ms {
            Json::Null => None,
            value => Some(value.as_i64().ok_or_else(invalid)?),
        };
        let text = |value: &Json| value.as_str().map(str::to_owned).ok_or_else(invalid);
        Ok(Self {
            first_ms,
            cluster: text(cluster)?,
            session: text(session)?,
            within: (!within.is_empty()).then(|| within.to_vec()),
        })
    }

    /// Where `session` stands against this position in a walk ordered `descending`:
    /// `Less` before it (already walked), `Equal` the position's own session, `Greater` after.
    pub(crate) fn compare(&self, session: &WalkedSession, descending: bool) -> Ordering {
        let own = (self.first_ms, self.cluster.as_str(), self.session.as_str());
        let order = session.place().cmp(&own);
        if descending { order.reverse() } else { order }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(first_ms: Option<i64>, name: &str) -> WalkedSession {
        WalkedSession {
            first_ms,
            cluster: "c".into(),
            session: name.into(),
            attempts: 1,
        }
    }

    #[test]
    fn a_position_round_trips_through_a_cursor() -> Result<(), QueryError> {
        let walked = session(Some(5), "s");
        for position in [
            WalkPosition::after_session(&walked),
            WalkPosition::within(Some(5), "c", "s", vec![json!(7), json!("c"), json!("s")]),
            WalkPosition::after_session(&session(None, "t")),
        ] {
            assert_eq!(WalkPosition::from_values(&position.to_values())?, position);
        }
        assert!(WalkPosition::from_values(&[json!(1), json!("c")]).is_err());
        assert!(WalkPosition::from_values(&[json!("x"), json!("c"), json!("s")]).is_err());
        Ok(())
    }

    #[test]
    fn sessions_before_a_position_are_the_ones_walked() {
        let at = WalkPosition::after_session(&session(Some(5), "s"));
        // Newest first: a later session was walked before it, an earlier one comes after.
        assert_eq!(at.compare(&session(Some(9), "s"), true), Ordering::Less);
        assert_eq!(at.compare(&session(Some(5), "s"), true), Ordering::Equal);
        assert_eq!(at.compare(&session(Some(1), "s"), true), Ordering::Greater);
        assert_eq!(at.compare(&session(None, "s"), true), Ordering::Greater);
        assert_eq!(at.compare(&session(Some(9), "s"), false), Ordering::Greater);
    }
}
