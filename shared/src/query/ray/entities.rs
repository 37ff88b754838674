//! Jobs, actors, nodes, workers and placement groups in Ray 2.60's shapes: the state API's
//! `*State` rows (`api/v0/{resource}`), and the dashboard's own views of the same records
//! (`api/jobs/`, `logical/actors`, `nodes?view=summary`, `nodes/{id}`).
//!
//! A session's entity tables are small (one file each), so rows are built from the merged
//! records in memory and filtered there with Ray's `do_filter` rules. Jobs, which join drivers
//! and submissions, are [`jobs`].

pub(super) mod jobs;

use serde_json::{Map, Value as Json, json};

use super::body::{RayBody, ResponseLimit, RowBudget, state_envelope};
use super::request::{Column, ColumnKind, RayQuery};
use crate::merge::entities::{
    ActorRecord, NodeRecord, PlacementGroupRecord, SessionEntities, WorkerRecord,
};
use crate::query::read::entity_records::records;
use crate::query::read::params::Scope;
use crate::query::redaction::redact_serialized_runtime_env;
use crate::query::{QueryEngine, QueryError};
use crate::tables::entities::EntityKind;

/// Filterable columns and the brief (non-`detail`) columns of each kind, as Ray 2.60 lists them.
fn columns(kind: EntityKind) -> (&'static [Column], &'static [&'static str]) {
    match kind {
        // Ray's jobs are its submissions and drivers, in one list ([`jobs`]).
        EntityKind::Jobs | EntityKind::Submissions => (
            &[
                ("job_id", ColumnKind::Id),
                ("type", ColumnKind::Enum),
                ("status", ColumnKind::Enum),
                ("submission_id", ColumnKind::Text),
            ],
            &[
                "job_id",
                "submission_id",
                "entrypoint",
                "type",
                "status",
                "message",
                "error_type",
                "driver_info",
            ],
        ),
        EntityKind::Actors => (
            &[
                ("actor_id", ColumnKind::Id),
                ("class_name", ColumnKind::Text),
                ("state", ColumnKind::Enum),
                ("job_id", ColumnKind::Id),
                ("name", ColumnKind::Text),
                ("node_id", ColumnKind::Id),
                ("pid", ColumnKind::Integer),
                ("ray_namespace", ColumnKind::Text),
                ("placement_group_id", ColumnKind::Id),
                ("repr_name", ColumnKind::Text),
            ],
            &[
                "actor_id",
                "class_name",
                "state",
                "job_id",
                "name",
                "node_id",
                "pid",
                "ray_namespace",
            ],
        ),
        EntityKind::Nodes => (
            &[
                ("node_id", ColumnKind::Id),
                ("node_ip", ColumnKind::Text),
                ("is_head_node", ColumnKind::Boolean),
                ("state", ColumnKind::Enum),
                ("node_name", ColumnKind::Text),
            ],
            &[
                "node_id",
                "node_ip",
                "is_head_node",
                "state",
                "state_message",
                "node_name",
                "resources_total",
                "labels",
            ],
        ),
        EntityKind::Workers => (
            &[
                ("worker_id", ColumnKind::Id),
                ("is_alive", ColumnKind::Boolean),
                ("worker_type", ColumnKind::Enum),
                ("exit_type", ColumnKind::Enum),
                ("node_id", ColumnKind::Id),
                ("ip", ColumnKind::Text),
                ("pid", ColumnKind::Integer),
                ("debugger_port", ColumnKind::Integer),
                ("num_paused_threads", ColumnKind::Integer),
            ],
            &[
                "worker_id",
                "is_alive",
                "worker_type",
                "exit_type",
                "node_id",
                "ip",
                "pid",
            ],
        ),
        EntityKind::PlacementGroups => (
            &[
                ("placement_group_id", ColumnKind::Id),
                ("name", ColumnKind::Text),
                ("creator_job_id", ColumnKind::Id),
                ("state", ColumnKind::Enum),
                ("is_detached", ColumnKind::Boolean),
            ],
            &["placement_group_id", "name", "creator_job_id", "state"],
        ),
    }
}

/// `GET api/v0/{resource}` for an entity kind, with the rows that fit the `response`.
pub(super) async fn list(
    engine: &QueryEngine,
    scope: &Scope,
    kind: EntityKind,
    pairs: &[(String, String)],
    response: ResponseLimit,
) -> Result<RayBody, QueryError> {
    let (filterable, brief) = columns(kind);
    let query = RayQuery::parse(pairs, filterable)?;
    let rows = match kind {
        EntityKind::Jobs | EntityKind::Submissions => {
            jobs::Jobs::read(engine, scope).await?.state_rows()
        }
        _ => state_rows(kind, &records(engine, scope, kind).await?),
    };
    let total = rows.len() as u64;
    let mut kept: Vec<Json> = Vec::new();
    let mut filtered = 0_u64;
    for row in rows {
        let Json::Object(row) = row else { continue };
        if !query.matches(&row) {
            continue;
        }
        filtered += 1;
        if kept.len() < query.limit {
            kept.push(if query.detail {
                Json::Object(row)
            } else {
                Json::Object(
                    brief
                        .iter()
                        .map(|column| {
                            (
                                (*column).to_owned(),
                                row.get(*column).cloned().unwrap_or(Json::Null),
                            )
                        })
                        .collect(),
                )
            });
        }
    }
    let listed = kept.len();
    let mut taken = RowBudget::new(response, kind.table());
    taken.admit_leading(kept);
    taken.into_list(total, filtered, listed)
}

/// Every record of `kind` as Ray's detail row, sorted by id as Ray sorts them (jobs, which
/// join two kinds: [`jobs::Jobs::state_rows`]).
fn state_rows(kind: EntityKind, entities: &SessionEntities) -> Vec<Json> {
    // The records are kept in maps keyed by id: already in Ray's order.
    match kind {
        EntityKind::Jobs | EntityKind::Submissions => Vec::new(),
        EntityKind::Actors => entities.actors.values().map(actor_state).collect(),
        EntityKind::Nodes => entities.nodes.values().map(node_state).collect(),
        EntityKind::Workers => entities.workers.values().map(worker_state).collect(),
        EntityKind::PlacementGroups => entities
            .placement_groups
            .values()
            .map(placement_group_state)
            .collect(),
    }
}

fn ms(ns: Option<i64>) -> Option<i64> {
    ns.map(|ns| ns.div_euclid(1_000_000))
}

fn parsed(text: &str) -> Json {
    serde_json::from_str(text).unwrap_or_else(|_| json!({}))
}

fn actor_state(actor: &ActorRecord) -> Json {
    let definition = actor.definition.as_ref().map(|reported| &reported.value);
    let text = |pick: fn(&crate::merge::entities::ActorDefinitionFacts) -> String| {
        definition.map(pick).unwrap_or_default()
    };
    let death_cause = actor.death_message().map(|message| {
        json!({"actor_died_error_context": {"error_message": message, "actor_id": actor.id}})
    });
    json!({
        "actor_id": actor.id,
        "class_name": text(|d| d.class_name.clone()),
        "state": actor.state().unwrap_or("DEPENDENCIES_UNREADY"),
        "job_id": definition.and_then(|d| d.job_id.clone()).unwrap_or_default(),
        "name": text(|d| d.name.clone()),
        "node_id": actor.node_id(),
        "pid": actor.pid().unwrap_or(0),
        "ray_namespace": text(|d| d.ray_namespace.clone()),
        "serialized_runtime_env": definition
            .map(|d| redact_serialized_runtime_env(&d.serialized_runtime_env))
            .unwrap_or_default(),
        "required_resources": definition.map_or_else(|| json!({}), |d| parsed(&d.required_resources)),
        "death_cause": death_cause,
        "is_detached": definition.is_some_and(|d| d.is_detached),
        "placement_group_id": definition.and_then(|d| d.placement_group_id.clone()),
        "repr_name": actor.repr_name(),
        "num_restarts": actor.num_restarts().to_string(),
        "num_restarts_due_to_lineage_reconstruction": "0",
        "num_restarts_due_to_node_preemption": "0",
        "call_site": definition.map(|d| d.call_site.clone()).filter(|site| !site.is_empty()),
        "label_selector": {},
        "fallback_strategy": null,
    })
}

/// Total resources of a node: those of its latest `ALIVE` report.
fn node_resources(node: &NodeRecord) -> Json {
    node.transitions
        .iter()
        .rev()
        .find(|transition| transition.state == "ALIVE")
        .map_or_else(|| json!({}), |transition| parsed(&transition.resources))
}

/// Ray's `compose_state_message` of a node's death.
fn node_state_message(node: &NodeRecord) -> Option<String> {
    let reason = node
        .transitions
        .iter()
        .rev()
        .find_map(|transition| transition.death_reason.clone())?;
    Some(match reason.as_str() {
        "EXPECTED_TERMINATION" => "Expected termination".to_owned(),
        "UNEXPECTED_TERMINATION" => "Unexpected termination".to_owned(),
        "AUTOSCALER_DRAIN_PREEMPTED" => "Terminated due to preemption".to_owned(),
        "AUTOSCALER_DRAIN_IDLE" => "Terminated due to idle (no Ray activity)".to_owned(),
        "UNSPECIFIED" => return None,
        message => message.to_owned(),
    })
}

/// Whether `node` is the head: the one holding Ray's head marker resource (the export has no
/// flag).
pub(super) fn is_head(node: &NodeRecord) -> bool {
    node_resources(node).get("node:__internal_head__").is_some()
}

fn node_state(node: &NodeRecord) -> Json {
    let definition = node.definition.as_ref().map(|reported| &reported.value);
    let resources = node_resources(node);
    json!({
        "node_id": node.id,
        "node_ip": definition.map(|d| d.node_ip.clone()).unwrap_or_default(),
        "is_head_node": is_head(node),
        "state": node.state().unwrap_or("ALIVE"),
        "state_message": node_state_message(node),
        "node_name": definition.map(|d| d.node_name.clone()).unwrap_or_default(),
        "resources_total": resources,
        "labels": definition.map_or_else(|| json!({}), |d| parsed(&d.labels)),
        "start_time_ms": ms(definition.and_then(|d| d.start_ns)).unwrap_or(0),
        "end_time_ms": ms(node.end_ns()).unwrap_or(0),
    })
}

fn worker_state(worker: &WorkerRecord) -> Json {
    let definition = worker.definition.as_ref().map(|reported| &reported.value);
    let death = worker.death();
    json!({
        "worker_id": worker.id,
        "is_alive": worker.is_alive(),
        "worker_type": definition.map(|d| d.worker_type.clone()).unwrap_or_else(|| "WORKER".into()),
        "exit_type": death.and_then(|death| death.exit_type.clone()),
        "node_id": definition.and_then(|d| d.node_id.clone()).unwrap_or_default(),
        "ip": "",
        "pid": definition.map_or(0, |d| d.pid),
        "exit_detail": death.and_then(|death| death.exit_detail.clone()),
        "worker_launch_time_ms": -1,
        "worker_launched_time_ms": -1,
        "start_time_ms": worker.start_time_ms().unwrap_or(0),
        "end_time_ms": death.map_or(0, |death| death.end_time_ms),
        "debugger_port": null,
        "num_paused_threads": null,
    })
}

fn placement_group_state(group: &PlacementGroupRecord) -> Json {
    let definition = group.definition.as_ref().map(|reported| &reported.value);
    let bundles = definition.map_or_else(|| json!([]), |d| parsed(&d.bundles));
    json!({
        "placement_group_id": group.id,
        "name": definition.map(|d| d.name.clone()).unwrap_or_default(),
        "creator_job_id": definition.and_then(|d| d.creator_job_id.clone()).unwrap_or_default(),
        "state": group.state().unwrap_or("PENDING"),
        "bundles": if bundles.is_array() { bundles } else { json!([]) },
        "is_detached": definition.is_some_and(|d| d.is_detached),
        "stats": null,
        "topology_strategy": {},
        "topology_assignments": {},
    })
}

/// An actor as the dashboard's `ActorDetail` (camelCase, `logical/actors`).
fn actor_detail(actor: &ActorRecord, node_ips: &Map<String, Json>) -> Json {
    let definition = actor.definition.as_ref().map(|reported| &reported.value);
    let class_name = definition.map(|d| d.class_name.clone()).unwrap_or_default();
    let node_id = actor.node_id();
    let ip = node_id
        .as_ref()
        .and_then(|node| node_ips.get(node))
        .cloned()
        .unwrap_or_else(|| json!(""));
    let worker_id = actor
        .transitions
        .iter()
        .rev()
        .find_map(|transition| transition.worker_id.clone());
    let start = actor
        .transitions
        .iter()
        .find(|transition| transition.state == "ALIVE")
        .map(|transition| transition.at);
    let end = actor
        .transitions
        .iter()
        .rev()
        .find(|transition| transition.state == "DEAD")
        .map(|transition| transition.at);
    let mut detail = json!({
        "actorId": actor.id,
        "jobId": definition.and_then(|d| d.job_id.clone()).unwrap_or_default(),
        "address": {"nodeId": node_id, "ipAddress": ip, "port": 0, "workerId": worker_id},
        "className": class_name,
        "state": actor.state().unwrap_or("DEPENDENCIES_UNREADY"),
        "numRestarts": actor.num_restarts().to_string(),
        "name": definition.map(|d| d.name.clone()).unwrap_or_default(),
        "timestamp": actor.current().map_or(0, |transition| transition.at.div_euclid(1_000_000)),
        "pid": actor.pid().unwrap_or(0),
        "startTime": ms(start).unwrap_or(0),
        "endTime": ms(end).unwrap_or(0),
        "reprName": actor.repr_name(),
        "labelSelector": {},
        "actorClass": class_name,
        "exitDetail": actor.death_message().unwrap_or_else(|| "-".into()),
        "requiredResources": definition.map_or_else(|| json!({}), |d| parsed(&d.required_resources)),
        "placementGroupId": definition.and_then(|d| d.placement_group_id.clone()),
        "gpus": [],
        "processStats": null,
        "mem": [],
        "tpus": [],
    });
    // Ray records where an actor was created only with `RAY_record_task_actor_creation_sites`,
    // and its answer has no `callSite` without one.
    if let Some(site) = definition
        .map(|d| d.call_site.as_str())
        .filter(|site| !site.is_empty())
    {
        detail["callSite"] = json!(site);
    }
    detail
}

/// Node id → IP, for actors' addresses.
pub(super) async fn node_ips(
    engine: &QueryEngine,
    scope: &Scope,
) -> Result<Map<String, Json>, QueryError> {
    let nodes = records(engine, scope, EntityKind::Nodes).await?;
    Ok(nodes
        .nodes
        .values()
        .filter_map(|node| {
            let ip = &node.definition.as_ref()?.value.node_ip;
            Some((node.id.clone(), json!(ip)))
        })
        .collect())
}

/// `GET logical/actors` (`?ids=a,b`).
pub(super) async fn logical_actors(
    engine: &QueryEngine,
    scope: &Scope,
    pairs: &[(String, String)],
) -> Result<Json, QueryError> {
    let wanted: Option<Vec<String>> = pairs
        .iter()
        .find(|(key, _)| key == "ids")
        .map(|(_, ids)| ids.split(',').map(str::to_ascii_lowercase).collect());
    let entities = records(engine, scope, EntityKind::Actors).await?;
    let ips = node_ips(engine, scope).await?;
    let actors: Map<String, Json> = entities
        .actors
        .values()
        .filter(|actor| wanted.as_ref().is_none_or(|ids| ids.contains(&actor.id)))
        .map(|actor| (actor.id.clone(), actor_detail(actor, &ips)))
        .collect();
    Ok(json!({"result": true, "msg": "All actors fetched.", "data": {"actors": actors}}))
}

/// `GET logical/actors/{id}`: `detail` is null for an unknown actor, as in Ray.
pub(super) async fn logical_actor(
    engine: &QueryEngine,
    scope: &Scope,
    id: &str,
) -> Result<Json, QueryError> {
    let entities = records(engine, scope, EntityKind::Actors).await?;
    let ips = node_ips(engine, scope).await?;
    let detail = entities
        .actors
        .get(&id.to_ascii_lowercase())
        .map_or(Json::Null, |actor| actor_detail(actor, &ips));
    Ok(json!({"result": true, "msg": "Actor details fetched.", "data": {"detail": detail}}))
}

/// A node as the dashboard's summary entry: what the GCS knows (`raylet`), with the live
/// statistics a history does not have left out or zero, so the pages render.
fn node_summary(node: &NodeRecord) -> Json {
    let definition = node.definition.as_ref().map(|reported| &reported.value);
    let state = node_state(node);
    let hostname = definition.map(|d| d.hostname.clone()).unwrap_or_default();
    let ip = definition.map(|d| d.node_ip.clone()).unwrap_or_default();
    json!({
        "hostname": hostname,
        "ip": ip,
        "raylet": {
            "objectStoreUsedMemory": 0,
            "objectStoreAvailableMemory": 0,
            "nodeId": node.id,
            "nodeManagerAddress": ip,
            "nodeManagerHostname": hostname,
            "nodeName": state.get("node_name"),
            "state": state.get("state"),
            "isHeadNode": state.get("is_head_node"),
            "resourcesTotal": state.get("resources_total"),
            "labels": state.get("labels"),
            "startTimeMs": state.get("start_time_ms"),
            "endTimeMs": state.get("end_time_ms"),
            "stateMessage": state.get("state_message"),
            "instanceId": definition.map(|d| d.instance_id.clone()).unwrap_or_default(),
            "instanceTypeName": definition.map(|d| d.instance_type_name.clone()).unwrap_or_default(),
        },
        "loadAvg": [[0, 0, 0], [0, 0, 0]],
        "networkSpeed": [0, 0],
        "cmdline": [],
        "tpus": [],
    })
}

/// `GET nodes?view=summary`.
pub(super) async fn nodes(engine: &QueryEngine, scope: &Scope) -> Result<Json, QueryError> {
    let entities = records(engine, scope, EntityKind::Nodes).await?;
    let summary: Vec<Json> = entities.nodes.values().map(node_summary).collect();
    Ok(json!({"result": true, "msg": "Node summary fetched.",
        "data": {"summary": summary, "nodeLogicalResources": {}}}))
}

/// `GET api/cluster_status?format=1`: the text behind the overview's node and resource cards,
/// laid out as Ray's `format_info_string` (the cards split it at `Node status` and
/// `Resources`), from each node's last known state. Live usage is not part of the history.
pub(super) async fn cluster_status(
    engine: &QueryEngine,
    scope: &Scope,
    session: &str,
) -> Result<Json, QueryError> {
    let entities = records(engine, scope, EntityKind::Nodes).await?;
    let (mut active, mut stopped, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    let mut totals: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    for node in entities.nodes.values() {
        let name = format!("node_{}", node.id);
        match (node.state(), node_state_message(node)) {
            (Some("DEAD"), Some(message)) if message == "Expected termination" => {
                stopped.push(format!(" {name}"));
            }
            (Some("DEAD"), message) => {
                failed.push(format!(
                    " {name}: {}",
                    message.unwrap_or_else(|| "died".into())
                ));
            }
            _ => active.push(format!(" 1 {name}")),
        }
        if let Json::Object(resources) = node_resources(node) {
            for (resource, amount) in resources {
                if resource.starts_with("node:") || resource.starts_with("accelerator_type:") {
                    continue;
                }
                *totals.entry(resource).or_default() += amount.as_f64().unwrap_or(0.0);
            }
        }
    }
    let lines = |rows: Vec<String>, none: &str| {
        if rows.is_empty() {
            format!(" ({none})")
        } else {
            rows.join("\n")
        }
    };
    let resources: Vec<String> = totals
        .iter()
        .map(|(resource, amount)| {
            if resource.ends_with("memory") {
                format!(" {:.2}GiB {resource}", amount / f64::from(1u32 << 30))
            } else {
                format!(" {amount:.1} {resource}")
            }
        })
        .collect();
    let text = format!(
        "======== Afterglow: the history of {session} (each node's last known state) ========\n\
         Node status\n\
         ---------------------------------------------------------------\n\
         Active:\n{}\n\
         Pending:\n (no pending nodes)\n\
         Stopped:\n{}\n\
         Recent failures:\n{}\n\
         \n\
         Resources\n\
         ---------------------------------------------------------------\n\
         Total:\n{}\n\
         Usage:\n (live usage is not part of the exported history)",
        lines(active, "no active nodes"),
        lines(stopped, "none"),
        lines(failed, "no failures"),
        lines(resources, "none reported"),
    );
    Ok(
        json!({"result": true, "msg": "Got formatted cluster status.",
        "data": {"clusterStatus": text}}),
    )
}

/// `GET nodes/{id}`: the summary entry plus the node's actors and (no) live workers.
pub(super) async fn node(
    engine: &QueryEngine,
    scope: &Scope,
    id: &str,
) -> Result<Json, QueryError> {
    let entities = records(engine, scope, EntityKind::Nodes).await?;
    let id = id.to_ascii_lowercase();
    let Some(node) = entities.nodes.get(&id) else {
        return Ok(
            json!({"result": true, "msg": "Node details fetched.", "data": {"detail": {
            "raylet": {"objectStoreUsedMemory": 0, "objectStoreAvailableMemory": 0,
                "stateMessage": null},
            "tpus": [], "actors": {}, "workers": [], "loadAvg": [[0, 0, 0], [0, 0, 0]],
            "networkSpeed": [0, 0], "cmdline": []}}}),
        );
    };
    let mut detail = node_summary(node);
    let actors = records(engine, scope, EntityKind::Actors).await?;
    let ips = node_ips(engine, scope).await?;
    let on_node: Map<String, Json> = actors
        .actors
        .values()
        .filter(|actor| actor.node_id().as_deref() == Some(id.as_str()))
        .map(|actor| (actor.id.clone(), actor_detail(actor, &ips)))
        .collect();
    if let Json::Object(fields) = &mut detail {
        fields.insert("actors".into(), Json::Object(on_node));
        fields.insert("workers".into(), json!([]));
    }
    Ok(json!({"result": true, "msg": "Node details fetched.", "data": {"detail": detail}}))
}

/// `GET api/v0/actors/summarize`: actors counted by class and state.
pub(super) async fn summarize_actors(
    engine: &QueryEngine,
    scope: &Scope,
) -> Result<Json, QueryError> {
    let entities = records(engine, scope, EntityKind::Actors).await?;
    let mut summary = Map::new();
    for actor in entities.actors.values() {
        let class = actor
            .definition
            .as_ref()
            .map(|reported| reported.value.class_name.clone())
            .unwrap_or_default();
        let group = summary
            .entry(class.clone())
            .or_insert_with(|| json!({"class_name": class, "state_counts": {}}));
        if let Some(counts) = group.get_mut("state_counts").and_then(Json::as_object_mut) {
            let state = actor.state().unwrap_or("DEPENDENCIES_UNREADY").to_owned();
            let count = counts.get(&state).and_then(Json::as_u64).unwrap_or(0);
            counts.insert(state, json!(count + 1));
        }
    }
    let total = entities.actors.len() as u64;
    Ok(state_envelope(
        total,
        total,
        total,
        json!({"node_id_to_summary": {"cluster": {
            "summary": summary, "total_actors": total, "summary_by": "class"}}}),
        Vec::new(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::Reported;
    use crate::merge::entities::ActorDefinitionFacts;

    #[test]
    fn an_actors_creation_site_is_answered_when_ray_recorded_one() {
        let actor = |call_site: &str| ActorRecord {
            id: "ab".into(),
            definition: Some(Reported {
                at: 0,
                value: ActorDefinitionFacts {
                    class_name: "Counter".into(),
                    call_site: call_site.into(),
                    ..ActorDefinitionFacts::default()
                },
            }),
            transitions: Vec::new(),
        };
        let site = "main at workload.py:12";
        assert_eq!(
            actor_detail(&actor(site), &Map::new())["callSite"],
            json!(site)
        );
        assert!(
            actor_detail(&actor(""), &Map::new())
                .get("callSite")
                .is_none()
        );
    }
}
