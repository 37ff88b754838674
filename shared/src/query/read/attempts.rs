//! The newest attempts in scope, as a [`Relation`] over the `task_attempts` files a snapshot
//! fetched: what every route over attempts reads, filtered further by its own conditions.

use super::params::{Scope, TaskFilter};
use super::snapshot::{Needs, Snapshot};
use super::sql::{Relation, SupersededRead, newest_rows};
use crate::query::{QueryEngine, QueryError};

/// The newest rows of `task_attempts` in scope, or `None` when there are none.
pub(crate) async fn attempts_relation(
    engine: &QueryEngine,
    scope: &Scope,
) -> Result<Option<Relation>, QueryError> {
    let snapshot = engine
        .snapshot(
            scope,
            Needs {
                attempts: true,
                ..Needs::default()
            },
        )
        .await?;
    Ok(newest_of(&snapshot))
}

/// The newest rows of the `task_attempts` files in `snapshot`.
pub(crate) fn newest_of(snapshot: &Snapshot) -> Option<Relation> {
    let files = snapshot.task_attempts.files();
    if let Some(read) = SupersededRead::of(&files) {
        return Some(Relation::over_superseded_read(read, snapshot.pins.clone()));
    }
    newest_rows(&files).map(|text| Relation::over_files(text, snapshot.pins.clone()))
}

/// The attempts a task filter reads: those of its sessions, or with `latest_attempt` each
/// task's latest only. `None` when no session in scope has any.
pub(crate) async fn filtered_relation(
    engine: &QueryEngine,
    filter: &TaskFilter,
) -> Result<Option<Relation>, QueryError> {
    let relation = attempts_relation(engine, &filter.scope).await?;
    Ok(if filter.latest_attempt {
        relation.map(Relation::latest_attempts)
    } else {
        relation
    })
}
