//! `GET api/v0/cluster_metadata`, the Ray and Python versions on the Cluster page's Info tab: the
//! head node's dashboard answer, which the shipper stores beside that node's logs
//! ([`crate::logs::metadata`]), answered as it was. A session shipped without it is answered
//! with the Ray version Afterglow reads and no Python version ([`super::fixed`]). `api/version`,
//! which `ray job` reads before every command, stays an answer of its own that reads nothing.

use serde_json::Value as Json;

use super::entities::is_head;
use super::fixed::fixed_answer;
use super::logs::place;
use super::route::FixedRoute;
use crate::keys::{LogFile, LogFileName, NodeId};
use crate::logs::metadata::{CLUSTER_METADATA_FILE, MAX_METADATA_BYTES};
use crate::logs::read::read_tail;
use crate::query::read::entity_records::records;
use crate::query::read::params::Scope;
use crate::query::{QueryEngine, QueryError};
use crate::tables::entities::EntityKind;

/// The answer for `session`: what its head node recorded, or Afterglow's own.
pub(super) async fn answer(
    engine: &QueryEngine,
    scope: &Scope,
    session: &str,
) -> Result<Json, QueryError> {
    Ok(match recorded(engine, scope).await? {
        Some(recorded) => recorded,
        None => fixed_answer(FixedRoute::ClusterMetadata, session, None),
    })
}

/// The stored answer of the session's head node, if one was shipped.
async fn recorded(engine: &QueryEngine, scope: &Scope) -> Result<Option<Json>, QueryError> {
    let (cluster, session) = place(scope)?;
    let nodes = records(engine, scope, EntityKind::Nodes).await?.nodes;
    let file = LogFileName::new(CLUSTER_METADATA_FILE)
        .map_err(|err| QueryError::Internal(err.to_string()))?;
    for node in nodes.values().filter(|node| is_head(node)) {
        let Ok(node_id) = NodeId::new(&node.id) else {
            continue;
        };
        let place = LogFile {
            cluster: cluster.clone(),
            session: session.clone(),
            node_id,
            file: file.clone(),
        };
        let tail = read_tail(&**engine.storage(), &place, 1, MAX_METADATA_BYTES)
            .await
            .map_err(|err| QueryError::Internal(format!("reading the cluster metadata: {err}")))?;
        // Only Ray's answer as the shipper checked it: anything else is as if none was shipped.
        if let Ok(answer) = serde_json::from_slice::<Json>(&tail.bytes)
            && answer.get("data").is_some_and(Json::is_object)
        {
            return Ok(Some(answer));
        }
    }
    Ok(None)
}
