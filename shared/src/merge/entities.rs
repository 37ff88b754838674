//! Merge rules for the entities beside tasks: jobs, actors, nodes, workers and placement groups
//! (submitted jobs: [`super::submissions`]). Same contract as task attempts: every merge is
//! commutative, associative and idempotent. A definition is kept whole (latest report wins);
//! lifecycle transitions are a set ordered by time, and the current state is the latest
//! transition (these states are not monotonic: actors restart).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Reported;
use super::submissions::SubmissionRecord;
use crate::event::EventPayload;
use crate::event::encoding::Id;

/// Adds transitions to a sorted, duplicate-free list.
fn add_all<T: Ord>(list: &mut Vec<T>, items: impl IntoIterator<Item = T>) {
    for item in items {
        if let Err(position) = list.binary_search(&item) {
            list.insert(position, item);
        }
    }
}

/// What is known about one entity (job, actor, node, worker, placement group): its definition,
/// the latest report winning, and its state transitions, a set kept in time order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record<D, T> {
    /// The entity's id (hex).
    pub id: String,
    /// Its definition, once arrived.
    pub definition: Option<Reported<D>>,
    /// Its transitions, in time order, without duplicates.
    pub transitions: Vec<T>,
}

impl<D: Ord, T: Ord> Record<D, T> {
    /// Merges another partial record of the same entity in.
    pub fn merge(&mut self, other: Self) {
        if self.id.is_empty() {
            self.id = other.id;
        }
        super::keep_latest(&mut self.definition, other.definition);
        add_all(&mut self.transitions, other.transitions);
    }
}

/// Merges a partial record into the record of the same entity.
fn merge_in<D: Ord, T: Ord>(records: &mut BTreeMap<String, Record<D, T>>, record: Record<D, T>) {
    match records.entry(record.id.clone()) {
        std::collections::btree_map::Entry::Occupied(mut known) => known.get_mut().merge(record),
        std::collections::btree_map::Entry::Vacant(new) => {
            new.insert(record);
        }
    }
}

/// Merges a definition of entity `id`, reported at `at` (ns), into its record.
pub(super) fn define<D: Ord, T: Ord>(
    records: &mut BTreeMap<String, Record<D, T>>,
    id: String,
    at: i64,
    value: D,
) {
    let definition = Some(Reported { at, value });
    merge_in(
        records,
        Record {
            id,
            definition,
            transitions: Vec::new(),
        },
    );
}

/// Merges state transitions of entity `id` into its record.
pub(super) fn add_transitions<D: Ord, T: Ord>(
    records: &mut BTreeMap<String, Record<D, T>>,
    id: String,
    transitions: Vec<T>,
) {
    merge_in(
        records,
        Record {
            id,
            definition: None,
            transitions,
        },
    );
}

fn hex(id: Option<&Id>) -> Option<String> {
    id.map(|id| id.as_hex().to_owned())
}

/// What an actor definition says.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ActorDefinitionFacts {
    /// Owning job (hex).
    pub job_id: Option<String>,
    /// Class.
    pub class_name: String,
    /// Name, if named.
    pub name: String,
    /// Namespace.
    pub ray_namespace: String,
    /// Detached or not.
    pub is_detached: bool,
    /// Placement group (hex).
    pub placement_group_id: Option<String>,
    /// Required resources as JSON.
    pub required_resources: String,
    /// Runtime environment JSON.
    pub serialized_runtime_env: String,
    /// Creation call site.
    pub call_site: String,
}

/// One actor state transition.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ActorTransition {
    /// When (ns).
    pub at: i64,
    /// State name.
    pub state: String,
    /// Node (hex), when alive.
    pub node_id: Option<String>,
    /// Worker (hex), when alive.
    pub worker_id: Option<String>,
    /// Pid, when alive (0 otherwise).
    pub pid: u32,
    /// `__repr__`.
    pub repr_name: String,
    /// Why it died, when dead.
    pub death_message: Option<String>,
}

/// Everything known about one actor.
pub type ActorRecord = Record<ActorDefinitionFacts, ActorTransition>;

impl ActorRecord {
    /// The latest transition.
    pub fn current(&self) -> Option<&ActorTransition> {
        self.transitions.last()
    }

    /// The latest non-empty value of a per-transition fact.
    fn latest<T>(&self, pick: impl Fn(&ActorTransition) -> Option<T>) -> Option<T> {
        self.transitions.iter().rev().find_map(pick)
    }

    /// Ray's `state`.
    pub fn state(&self) -> Option<&str> {
        self.current().map(|transition| transition.state.as_str())
    }

    /// Node it last ran on.
    pub fn node_id(&self) -> Option<String> {
        self.latest(|transition| transition.node_id.clone())
    }

    /// Pid it last ran as.
    pub fn pid(&self) -> Option<u32> {
        self.latest(|transition| (transition.pid != 0).then_some(transition.pid))
    }

    /// Latest non-empty `__repr__` (empty when never reported).
    pub fn repr_name(&self) -> String {
        self.latest(|transition| {
            (!transition.repr_name.is_empty()).then(|| transition.repr_name.clone())
        })
        .unwrap_or_default()
    }

    /// Restarts: `RESTARTING` transitions.
    pub fn num_restarts(&self) -> usize {
        self.transitions
            .iter()
            .filter(|transition| transition.state == "RESTARTING")
            .count()
    }

    /// Why it died, if dead.
    pub fn death_message(&self) -> Option<String> {
        self.latest(|transition| transition.death_message.clone())
    }
}

/// What a driver-job definition says.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobDefinitionFacts {
    /// Driver pid.
    pub driver_pid: i64,
    /// Driver node (hex).
    pub driver_node_id: Option<String>,
    /// Driver command line.
    pub entrypoint: String,
    /// Runtime environment JSON.
    pub serialized_runtime_env: String,
    /// Metadata as JSON.
    pub metadata: String,
}

/// Everything known about one driver job.
pub type JobRecord = Record<JobDefinitionFacts, (i64, String)>;

impl JobRecord {
    /// `FINISHED` once finished, else `RUNNING` once created.
    pub fn state(&self) -> Option<&str> {
        if self.end_ns().is_some() {
            Some("FINISHED")
        } else if self.transitions.is_empty() && self.definition.is_none() {
            None
        } else {
            Some("RUNNING")
        }
    }

    /// When the job was created (ns).
    pub fn start_ns(&self) -> Option<i64> {
        self.transitions
            .iter()
            .find(|(_, state)| state == "CREATED")
            .map(|(at, _)| *at)
    }

    /// When the job finished (ns).
    pub fn end_ns(&self) -> Option<i64> {
        self.transitions
            .iter()
            .rev()
            .find(|(_, state)| state == "FINISHED")
            .map(|(at, _)| *at)
    }
}

/// What a node definition says.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeDefinitionFacts {
    /// IP address.
    pub node_ip: String,
    /// Node name.
    pub node_name: String,
    /// Host name.
    pub hostname: String,
    /// Labels as JSON.
    pub labels: String,
    /// Start time (ns).
    pub start_ns: Option<i64>,
    /// Cloud instance id.
    pub instance_id: String,
    /// Cloud instance type.
    pub instance_type_name: String,
}

/// One node state transition.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeTransition {
    /// When (ns).
    pub at: i64,
    /// `ALIVE` or `DEAD`.
    pub state: String,
    /// Total resources as JSON, when alive.
    pub resources: String,
    /// Why it died, when dead.
    pub death_reason: Option<String>,
}

/// Everything known about one node.
pub type NodeRecord = Record<NodeDefinitionFacts, NodeTransition>;

impl NodeRecord {
    /// The latest state.
    pub fn state(&self) -> Option<&str> {
        self.transitions
            .last()
            .map(|transition| transition.state.as_str())
    }

    /// When it died (ns).
    pub fn end_ns(&self) -> Option<i64> {
        self.transitions
            .iter()
            .rev()
            .find(|transition| transition.state == "DEAD")
            .map(|transition| transition.at)
    }
}

/// What a worker definition says.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerDefinitionFacts {
    /// Node (hex).
    pub node_id: Option<String>,
    /// Worker type name.
    pub worker_type: String,
    /// Pid.
    pub pid: u32,
}

/// One worker state transition.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerTransition {
    /// When (ns).
    pub at: i64,
    /// Job the worker served (hex), as its lifecycle event says.
    pub job_id: Option<String>,
    /// `ALIVE` or `DEAD`.
    pub state: String,
    /// Start time (ms; 0 = unset).
    pub start_time_ms: i64,
    /// End time (ms; 0 = unset).
    pub end_time_ms: i64,
    /// Exit type name, when dead.
    pub exit_type: Option<String>,
    /// Exit detail, when dead.
    pub exit_detail: Option<String>,
}

/// Everything known about one worker.
pub type WorkerRecord = Record<WorkerDefinitionFacts, WorkerTransition>;

impl WorkerRecord {
    /// The job the worker served.
    pub fn job_id(&self) -> Option<String> {
        self.transitions
            .iter()
            .rev()
            .find_map(|transition| transition.job_id.clone())
    }

    /// Alive until a `DEAD` transition.
    pub fn is_alive(&self) -> bool {
        !self
            .transitions
            .iter()
            .any(|transition| transition.state == "DEAD")
    }

    /// The `DEAD` transition, if any.
    pub fn death(&self) -> Option<&WorkerTransition> {
        self.transitions
            .iter()
            .rev()
            .find(|transition| transition.state == "DEAD")
    }

    /// Start time (ms), from any transition that reports it.
    pub fn start_time_ms(&self) -> Option<i64> {
        self.transitions
            .iter()
            .map(|transition| transition.start_time_ms)
            .find(|&ms| ms > 0)
    }
}

/// What a placement-group definition says.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PlacementGroupDefinitionFacts {
    /// Name, if named.
    pub name: String,
    /// Namespace.
    pub ray_namespace: String,
    /// Strategy name (`PACK`, `SPREAD`, …).
    pub strategy: String,
    /// Detached or not.
    pub is_detached: bool,
    /// Creating job (hex).
    pub creator_job_id: Option<String>,
    /// Creating actor (hex).
    pub creator_actor_id: Option<String>,
    /// Bundles as JSON (`[{"bundle_index", "unit_resources", "label_selector"}]`).
    pub bundles: String,
}

/// Everything known about one placement group.
pub type PlacementGroupRecord = Record<PlacementGroupDefinitionFacts, (i64, String)>;

impl PlacementGroupRecord {
    /// The latest state.
    pub fn state(&self) -> Option<&str> {
        self.transitions.last().map(|(_, state)| state.as_str())
    }
}

/// The entities of one session, collected from events in any order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEntities {
    /// Jobs by id.
    pub jobs: BTreeMap<String, JobRecord>,
    /// Actors by id.
    pub actors: BTreeMap<String, ActorRecord>,
    /// Nodes by id.
    pub nodes: BTreeMap<String, NodeRecord>,
    /// Workers by id.
    pub workers: BTreeMap<String, WorkerRecord>,
    /// Placement groups by id.
    #[serde(default)]
    pub placement_groups: BTreeMap<String, PlacementGroupRecord>,
    /// Submitted jobs by submission id.
    #[serde(default)]
    pub submissions: BTreeMap<String, SubmissionRecord>,
}

impl SessionEntities {
    /// Applies one event reported at `at` (ns); task events are ignored.
    pub fn apply(&mut self, at: i64, payload: &EventPayload) {
        match payload {
            EventPayload::DriverJobDefinition(event) => {
                let Some(id) = hex(event.job_id.as_ref()) else {
                    return;
                };
                define(
                    &mut self.jobs,
                    id,
                    at,
                    JobDefinitionFacts {
                        driver_pid: event.driver_pid,
                        driver_node_id: hex(event.driver_node_id.as_ref()),
                        entrypoint: event.entrypoint.clone(),
                        serialized_runtime_env: event.config.serialized_runtime_env.clone(),
                        metadata: json(&event.config.metadata),
                    },
                );
            }
            EventPayload::DriverJobLifecycle(event) => {
                let Some(id) = hex(event.job_id.as_ref()) else {
                    return;
                };
                let transitions = event
                    .state_transitions
                    .iter()
                    .map(|transition| (transition.timestamp.nanos(), transition.state.to_string()))
                    .collect();
                add_transitions(&mut self.jobs, id, transitions);
            }
            EventPayload::ActorDefinition(event) => {
                let Some(id) = hex(event.actor_id.as_ref()) else {
                    return;
                };
                define(
                    &mut self.actors,
                    id,
                    at,
                    ActorDefinitionFacts {
                        job_id: hex(event.job_id.as_ref()),
                        class_name: event.class_name.clone(),
                        name: event.name.clone(),
                        ray_namespace: event.ray_namespace.clone(),
                        is_detached: event.is_detached,
                        placement_group_id: event
                            .placement_group_id
                            .as_ref()
                            .filter(|id| !id.is_nil())
                            .map(|id| id.as_hex().to_owned()),
                        required_resources: json(&event.required_resources),
                        serialized_runtime_env: event.serialized_runtime_env.clone(),
                        call_site: event.call_site.clone(),
                    },
                );
            }
            EventPayload::ActorLifecycle(event) => {
                let Some(id) = hex(event.actor_id.as_ref()) else {
                    return;
                };
                let transitions = event
                    .state_transitions
                    .iter()
                    .map(|transition| ActorTransition {
                        at: transition.timestamp.nanos(),
                        state: transition.state.to_string(),
                        node_id: hex(transition.node_id.as_ref()),
                        worker_id: hex(transition.worker_id.as_ref()),
                        pid: transition.pid,
                        repr_name: transition.repr_name.clone(),
                        death_message: transition
                            .death_cause
                            .as_ref()
                            .and_then(|cause| cause.message())
                            .map(super::strip_ansi),
                    })
                    .collect();
                add_transitions(&mut self.actors, id, transitions);
            }
            EventPayload::NodeDefinition(event) => {
                let Some(id) = hex(event.node_id.as_ref()) else {
                    return;
                };
                define(
                    &mut self.nodes,
                    id,
                    at,
                    NodeDefinitionFacts {
                        node_ip: event.node_ip_address.clone(),
                        node_name: event.node_name.clone(),
                        hostname: event.hostname.clone(),
                        labels: json(&event.labels),
                        start_ns: event.start_timestamp.map(|start| start.nanos()),
                        instance_id: event.instance_id.clone(),
                        instance_type_name: event.instance_type_name.clone(),
                    },
                );
            }
            EventPayload::NodeLifecycle(event) => {
                let Some(id) = hex(event.node_id.as_ref()) else {
                    return;
                };
                let transitions = event
                    .state_transitions
                    .iter()
                    .map(|transition| NodeTransition {
                        at: transition.timestamp.nanos(),
                        state: transition.state.to_string(),
                        resources: json(&transition.resources),
                        death_reason: transition.death_info.as_ref().map(|info| {
                            if info.reason_message.is_empty() {
                                info.reason.to_string()
                            } else {
                                info.reason_message.clone()
                            }
                        }),
                    })
                    .collect();
                add_transitions(&mut self.nodes, id, transitions);
            }
            EventPayload::WorkerDefinition(event) => {
                let Some(id) = hex(event.worker_id.as_ref()) else {
                    return;
                };
                define(
                    &mut self.workers,
                    id,
                    at,
                    WorkerDefinitionFacts {
                        node_id: hex(event.node_id.as_ref()),
                        worker_type: event.worker_type.to_string(),
                        pid: event.pid,
                    },
                );
            }
            EventPayload::WorkerLifecycle(event) => {
                let Some(id) = hex(event.worker_id.as_ref()) else {
                    return;
                };
                let transitions = event
                    .state_transitions
                    .iter()
                    .map(|transition| WorkerTransition {
                        at: transition.timestamp.nanos(),
                        job_id: hex(event.job_id.as_ref()),
                        state: transition.state.to_string(),
                        start_time_ms: transition.start_time_ms,
                        end_time_ms: transition.end_time_ms,
                        exit_type: transition
                            .death_info
                            .as_ref()
                            .map(|info| info.exit_type.to_string()),
                        exit_detail: transition
                            .death_info
                            .as_ref()
                            .map(|info| info.exit_detail.clone()),
                    })
                    .collect();
                add_transitions(&mut self.workers, id, transitions);
            }
            EventPayload::PlacementGroupDefinition(event) => {
                let Some(id) = hex(event.placement_group_id.as_ref()) else {
                    return;
                };
                let bundles: Vec<serde_json::Value> = event
                    .bundles
                    .iter()
                    .map(|bundle| {
                        serde_json::json!({
                            "bundle_index": bundle.bundle_index,
                            "unit_resources": bundle.unit_resources,
                            "label_selector": bundle.label_selector,
                        })
                    })
                    .collect();
                let facts = PlacementGroupDefinitionFacts {
                    name: event.name.clone(),
                    ray_namespace: event.ray_namespace.clone(),
                    strategy: event.strategy.to_string(),
                    is_detached: event.is_detached,
                    creator_job_id: hex(event.creator_job_id.as_ref()),
                    creator_actor_id: hex(event.creator_actor_id.as_ref())
                        .filter(|id| !id.bytes().all(|digit| digit == b'f')),
                    bundles: serde_json::Value::Array(bundles).to_string(),
                };
                define(&mut self.placement_groups, id, at, facts);
            }
            EventPayload::PlacementGroupLifecycle(event) => {
                let Some(id) = hex(event.placement_group_id.as_ref()) else {
                    return;
                };
                let transitions = event
                    .state_transitions
                    .iter()
                    .map(|transition| (transition.timestamp.nanos(), transition.state.to_string()))
                    .collect();
                add_transitions(&mut self.placement_groups, id, transitions);
            }
            EventPayload::SubmissionJobDefinition(_) | EventPayload::SubmissionJobLifecycle(_) => {
                super::submissions::apply(&mut self.submissions, at, payload);
            }
            _ => {}
        }
    }

    /// Merges another partial view of the same session in.
    pub fn merge(&mut self, other: Self) {
        for (id, record) in other.jobs {
            self.jobs.entry(id).or_default().merge(record);
        }
        for (id, record) in other.actors {
            self.actors.entry(id).or_default().merge(record);
        }
        for (id, record) in other.nodes {
            self.nodes.entry(id).or_default().merge(record);
        }
        for (id, record) in other.workers {
            self.workers.entry(id).or_default().merge(record);
        }
        for (id, record) in other.placement_groups {
            self.placement_groups.entry(id).or_default().merge(record);
        }
        for (id, record) in other.submissions {
            self.submissions.entry(id).or_default().merge(record);
        }
    }
}

/// A map as canonical JSON text (keys sorted), so facts holding it stay totally ordered.
/// Maps of strings and numbers always serialize.
fn json<V: Serialize>(map: &BTreeMap<String, V>) -> String {
    serde_json::to_string(map).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Placement-group events never appeared in the 2.60 captures; this one follows the proto
    /// (`events_placement_group_definition_event.proto`, `…_lifecycle_event.proto`).
    #[test]
    fn placement_groups_merge_in_any_order() -> Result<(), crate::event::EventError> {
        let definition = crate::event::RayEvent::from_json(
            r#"{"eventType": "PLACEMENT_GROUP_DEFINITION_EVENT", "timestamp": "2026-11-22T06:11:54.347Z",
                "placementGroupDefinitionEvent": {"placementGroupId": "l10+4KP1bNCzm82Nq5MCAAAA",
                  "name": "capture-pg", "strategy": "PACK", "creatorJobId": "AgAAAA==",
                  "bundles": [{"bundleIndex": 0, "unitResources": {"CPU": 1.0}}],
                  "creationRequestReceivedNs": "1795327914347809047"}}"#,
        )?;
        let lifecycle = crate::event::RayEvent::from_json(
            r#"{"eventType": "PLACEMENT_GROUP_LIFECYCLE_EVENT", "timestamp": "2026-11-22T06:11:58Z",
                "placementGroupLifecycleEvent": {"placementGroupId": "l10+4KP1bNCzm82Nq5MCAAAA",
                  "stateTransitions": [{"state": "CREATED", "timestamp": "2026-11-22T06:11:55.308Z"},
                                       {"state": "REMOVED", "timestamp": "2026-11-22T06:11:57Z"}]}}"#,
        )?;
        let apply = |events: &[&crate::event::RayEvent]| {
            let mut entities = SessionEntities::default();
            for event in events {
                entities.apply(event.timestamp.map_or(0, |t| t.nanos()), &event.payload);
            }
            entities
        };
        let forward = apply(&[&definition, &lifecycle]);
        assert_eq!(forward, apply(&[&lifecycle, &definition, &lifecycle]));
        let group = &forward.placement_groups["975d3ee0a3f56cd0b39bcd8dab9302000000"];
        assert_eq!(group.state(), Some("REMOVED"));
        let facts = group.definition.as_ref().map(|reported| &reported.value);
        assert_eq!(facts.map(|facts| facts.name.as_str()), Some("capture-pg"));
        assert_eq!(
            facts.and_then(|facts| facts.creator_job_id.as_deref()),
            Some("02000000")
        );
        Ok(())
    }

    #[test]
    fn merged_records_keep_their_ids() {
        let mut entities = SessionEntities::default();
        entities
            .jobs
            .entry("01000000".to_owned())
            .or_default()
            .merge(Record {
                id: "01000000".to_owned(),
                ..JobRecord::default()
            });
        assert_eq!(entities.jobs["01000000"].id, "01000000");
        let mut copy = SessionEntities::default();
        copy.merge(entities.clone());
        assert_eq!(copy, entities);
    }
}
