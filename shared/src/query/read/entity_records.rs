//! A session's entity records (jobs, actors, nodes, workers, placement groups), read from its
//! entity tables and merged by Ray's rules (see [`crate::merge::entities`]). A session's entity
//! tables are small (one file each), so Ray's routes build their rows from these records in
//! memory.

use super::params::Scope;
use super::snapshot::Needs;
use crate::merge::entities::SessionEntities;
use crate::query::{QueryEngine, QueryError};
use crate::tables::entities::{EntityKind, read_entities};

/// The merged records of `kind` in the session of `scope`.
pub(crate) async fn records(
    engine: &QueryEngine,
    scope: &Scope,
    kind: EntityKind,
) -> Result<SessionEntities, QueryError> {
    let snapshot = engine
        .snapshot(
            scope,
            Needs {
                entity: Some(kind),
                ..Needs::default()
            },
        )
        .await?;
    let files = snapshot.entities.get(&kind).cloned().unwrap_or_default();
    let pins = snapshot.pins.clone();
    engine
        .run(move |connection| {
            let _pins = pins;
            let mut entities = SessionEntities::default();
            for file in &files {
                read_entities(connection, kind, file, &mut entities)
                    .map_err(|err| QueryError::Internal(err.to_string()))?;
            }
            Ok(entities)
        })
        .await
}
