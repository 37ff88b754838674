//! Publishing: each table's Iceberg metadata made to reflect our manifests ([`super::sync`]),
//! then, with a catalog, the catalog pointed at its current version ([`super::glue`]), and the
//! Iceberg files its commits retired deleted once their grace period is over
//! ([`super::retired`]).

use std::sync::Arc;

use super::IcebergError;
use super::glue::{GlueCatalog, Pointed};
use super::retired::delete_retired;
use super::sessions::{Reads, Sessions};
use super::sync::{Published, sync_with};
use crate::storage::Storage;
use crate::tables::published::PublishedTable;

/// What publishing one table did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cataloged {
    /// What the sync of its metadata did.
    pub published: Published,
    /// What pointing the catalog at it did; `None` without a catalog.
    pub pointed: Option<Pointed>,
}

/// Publishes each of `tables`, one after the other. Each table's outcome is its own: one that
/// fails (another writer's snapshot, a catalog out of reach) leaves the others published, and
/// is made up by the next publish. A table the catalog shows committed by another writer is
/// not synced at all. `reads` says which sessions' manifests are read ([`Reads`]).
pub async fn publish(
    storage: &Arc<dyn Storage>,
    catalog: Option<&GlueCatalog>,
    tables: &[PublishedTable],
    reads: Reads,
    now_ms: i64,
) -> Result<Vec<(&'static str, Result<Cataloged, IcebergError>)>, IcebergError> {
    let sessions = Sessions::list(storage, reads).await?;
    let mut outcomes = Vec::with_capacity(tables.len());
    for table in tables {
        let outcome = async {
            if let Some(catalog) = catalog {
                catalog.current(&**storage, table).await?;
            }
            let published = sync_with(storage, table, &sessions, now_ms).await?;
            let pointed = match catalog {
                Some(catalog) => Some(catalog.point(&**storage, table, published.current).await?),
                None => None,
            };
            Ok(Cataloged { published, pointed })
        }
        .await;
        if let Err(err) = &outcome {
            tracing::error!(table = table.name, error = %err, "table not published");
        }
        // What is left for now is deleted by the next publish.
        if let Err(err) = delete_retired(storage, table.name, now_ms).await {
            tracing::warn!(table = table.name, error = %err, "retired Iceberg files not deleted");
        }
        outcomes.push((table.name, outcome));
    }
    Ok(outcomes)
}
