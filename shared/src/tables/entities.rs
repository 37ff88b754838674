//! The `jobs`, `actors`, `nodes`, `workers` and `placement_groups` tables: one small file per
//! session and kind, rewritten whole when the session's entities change. Each row has the state-API
//! view columns queries read and a `record` column (JSON) holding the merge state compaction reads
//! back.

use std::path::Path;

use duckdb::Connection;
use duckdb::types::Value;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::TableError;
use super::newest::path_literal;
use crate::merge::entities::{
    ActorRecord, JobRecord, NodeRecord, PlacementGroupRecord, SessionEntities, WorkerRecord,
};

/// The entity tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EntityKind {
    /// Driver jobs.
    Jobs,
    /// Actors.
    Actors,
    /// Nodes.
    Nodes,
    /// Workers.
    Workers,
    /// Placement groups.
    PlacementGroups,
}

impl EntityKind {
    /// Every kind.
    pub const ALL: [Self; 5] = [
        Self::Jobs,
        Self::Actors,
        Self::Nodes,
        Self::Workers,
        Self::PlacementGroups,
    ];

    /// Table name (also the key segment).
    pub fn table(self) -> &'static str {
        match self {
            Self::Jobs => "jobs",
            Self::Actors => "actors",
            Self::Nodes => "nodes",
            Self::Workers => "workers",
            Self::PlacementGroups => "placement_groups",
        }
    }

    /// View columns after `cluster, session_name`, before `record`.
    fn columns(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Jobs => &[
                ("job_id", "VARCHAR"),
                ("state", "VARCHAR"),
                ("driver_pid", "BIGINT"),
                ("driver_node_id", "VARCHAR"),
                ("entrypoint", "VARCHAR"),
                ("start_time_ms", "BIGINT"),
                ("end_time_ms", "BIGINT"),
            ],
            Self::Actors => &[
                ("actor_id", "VARCHAR"),
                ("class_name", "VARCHAR"),
                ("name", "VARCHAR"),
                ("state", "VARCHAR"),
                ("job_id", "VARCHAR"),
                ("node_id", "VARCHAR"),
                ("pid", "BIGINT"),
                ("ray_namespace", "VARCHAR"),
                ("is_detached", "BOOLEAN"),
                ("num_restarts", "BIGINT"),
                ("repr_name", "VARCHAR"),
                ("death_message", "VARCHAR"),
                ("placement_group_id", "VARCHAR"),
            ],
            Self::Nodes => &[
                ("node_id", "VARCHAR"),
                ("node_ip", "VARCHAR"),
                ("node_name", "VARCHAR"),
                ("hostname", "VARCHAR"),
                ("state", "VARCHAR"),
                ("labels", "VARCHAR"),
                ("resources_total", "VARCHAR"),
                ("start_time_ms", "BIGINT"),
                ("end_time_ms", "BIGINT"),
            ],
            Self::Workers => &[
                ("worker_id", "VARCHAR"),
                ("worker_type", "VARCHAR"),
                ("node_id", "VARCHAR"),
                ("pid", "BIGINT"),
                ("job_id", "VARCHAR"),
                ("is_alive", "BOOLEAN"),
                ("exit_type", "VARCHAR"),
                ("exit_detail", "VARCHAR"),
                ("start_time_ms", "BIGINT"),
                ("end_time_ms", "BIGINT"),
            ],
            Self::PlacementGroups => &[
                ("placement_group_id", "VARCHAR"),
                ("name", "VARCHAR"),
                ("state", "VARCHAR"),
                ("strategy", "VARCHAR"),
                ("creator_job_id", "VARCHAR"),
                ("is_detached", "BOOLEAN"),
                ("bundles", "VARCHAR"),
            ],
        }
    }

    /// Rows of this kind, view columns then the record.
    fn rows(self, entities: &SessionEntities) -> Result<Vec<Vec<Value>>, TableError> {
        let ms = |ns: Option<i64>| ns.map(|ns| ns.div_euclid(1_000_000));
        match self {
            Self::Jobs => entities
                .jobs
                .values()
                .map(|job| {
                    let definition = job.definition.as_ref().map(|reported| &reported.value);
                    Ok(vec![
                        text(Some(job.id.clone())),
                        text(job.state().map(str::to_owned)),
                        big(definition.map(|d| d.driver_pid)),
                        text(definition.and_then(|d| d.driver_node_id.clone())),
                        text(definition.map(|d| d.entrypoint.clone())),
                        big(ms(job.start_ns())),
                        big(ms(job.end_ns())),
                        record(job)?,
                    ])
                })
                .collect(),
            Self::Actors => entities
                .actors
                .values()
                .map(|actor| {
                    let definition = actor.definition.as_ref().map(|reported| &reported.value);
                    Ok(vec![
                        text(Some(actor.id.clone())),
                        text(definition.map(|d| d.class_name.clone())),
                        text(definition.map(|d| d.name.clone())),
                        text(actor.state().map(str::to_owned)),
                        text(definition.and_then(|d| d.job_id.clone())),
                        text(actor.node_id()),
                        big(actor.pid().map(i64::from)),
                        text(definition.map(|d| d.ray_namespace.clone())),
                        definition.map_or(Value::Null, |d| Value::Boolean(d.is_detached)),
                        big(i64::try_from(actor.num_restarts()).ok()),
                        text(Some(actor.repr_name())),
                        text(actor.death_message()),
                        text(definition.and_then(|d| d.placement_group_id.clone())),
                        record(actor)?,
                    ])
                })
                .collect(),
            Self::Nodes => entities
                .nodes
                .values()
                .map(|node| {
                    let definition = node.definition.as_ref().map(|reported| &reported.value);
                    let resources = node
                        .transitions
                        .iter()
                        .rev()
                        .find(|transition| transition.state == "ALIVE")
                        .map(|transition| transition.resources.clone());
                    Ok(vec![
                        text(Some(node.id.clone())),
                        text(definition.map(|d| d.node_ip.clone())),
                        text(definition.map(|d| d.node_name.clone())),
                        text(definition.map(|d| d.hostname.clone())),
                        text(node.state().map(str::to_owned)),
                        text(definition.map(|d| d.labels.clone())),
                        text(resources),
                        big(ms(definition.and_then(|d| d.start_ns))),
                        big(ms(node.end_ns())),
                        record(node)?,
                    ])
                })
                .collect(),
            Self::Workers => entities
                .workers
                .values()
                .map(|worker| {
                    let definition = worker.definition.as_ref().map(|reported| &reported.value);
                    let death = worker.death();
                    Ok(vec![
                        text(Some(worker.id.clone())),
                        text(definition.map(|d| d.worker_type.clone())),
                        text(definition.and_then(|d| d.node_id.clone())),
                        big(definition.map(|d| i64::from(d.pid))),
                        text(worker.job_id()),
                        Value::Boolean(worker.is_alive()),
                        text(death.and_then(|death| death.exit_type.clone())),
                        text(death.and_then(|death| death.exit_detail.clone())),
                        big(worker.start_time_ms()),
                        big(death.map(|death| death.end_time_ms).filter(|&ms| ms > 0)),
                        record(worker)?,
                    ])
                })
                .collect(),
            Self::PlacementGroups => entities
                .placement_groups
                .values()
                .map(|group| {
                    let definition = group.definition.as_ref().map(|reported| &reported.value);
                    Ok(vec![
                        text(Some(group.id.clone())),
                        text(definition.map(|d| d.name.clone())),
                        text(group.state().map(str::to_owned)),
                        text(definition.map(|d| d.strategy.clone())),
                        text(definition.and_then(|d| d.creator_job_id.clone())),
                        definition.map_or(Value::Null, |d| Value::Boolean(d.is_detached)),
                        text(definition.map(|d| d.bundles.clone())),
                        record(group)?,
                    ])
                })
                .collect(),
        }
    }

    /// Merges stored records of this kind into `entities`.
    fn absorb(
        self,
        records: Vec<String>,
        entities: &mut SessionEntities,
    ) -> Result<(), TableError> {
        let mut partial = SessionEntities::default();
        for json in records {
            match self {
                Self::Jobs => {
                    let job: JobRecord = parse(&json)?;
                    partial.jobs.insert(job.id.clone(), job);
                }
                Self::Actors => {
                    let actor: ActorRecord = parse(&json)?;
                    partial.actors.insert(actor.id.clone(), actor);
                }
                Self::Nodes => {
                    let node: NodeRecord = parse(&json)?;
                    partial.nodes.insert(node.id.clone(), node);
                }
                Self::Workers => {
                    let worker: WorkerRecord = parse(&json)?;
                    partial.workers.insert(worker.id.clone(), worker);
                }
                Self::PlacementGroups => {
                    let group: PlacementGroupRecord = parse(&json)?;
                    partial.placement_groups.insert(group.id.clone(), group);
                }
            }
        }
        entities.merge(partial);
        Ok(())
    }

    /// Number of records of this kind.
    pub fn count(self, entities: &SessionEntities) -> usize {
        match self {
            Self::Jobs => entities.jobs.len(),
            Self::Actors => entities.actors.len(),
            Self::Nodes => entities.nodes.len(),
            Self::Workers => entities.workers.len(),
            Self::PlacementGroups => entities.placement_groups.len(),
        }
    }
}

fn text(value: Option<String>) -> Value {
    value.map_or(Value::Null, Value::Text)
}

fn big(value: Option<i64>) -> Value {
    value.map_or(Value::Null, Value::BigInt)
}

fn record(value: &impl Serialize) -> Result<Value, TableError> {
    serde_json::to_string(value)
        .map(Value::Text)
        .map_err(|err| TableError::Corrupt(err.to_string()))
}

fn parse<T: DeserializeOwned>(json: &str) -> Result<T, TableError> {
    serde_json::from_str(json).map_err(|err| TableError::Corrupt(format!("entity record: {err}")))
}

/// Writes the `kind` table of one session to `path` (ZSTD Parquet). Returns the row count.
pub fn write_entities(
    connection: &Connection,
    kind: EntityKind,
    cluster: &str,
    session: &str,
    entities: &SessionEntities,
    path: &Path,
) -> Result<u64, TableError> {
    let mut columns = vec![
        "cluster VARCHAR".to_owned(),
        "session_name VARCHAR".to_owned(),
    ];
    columns.extend(
        kind.columns()
            .iter()
            .map(|(name, sql_type)| format!("{name} {sql_type}")),
    );
    columns.push("record VARCHAR".to_owned());
    let table = format!("staged_{}", kind.table());
    connection.execute_batch(&format!(
        "DROP TABLE IF EXISTS {table}; CREATE TEMP TABLE {table} ({});",
        columns.join(", ")
    ))?;
    let rows = kind.rows(entities)?;
    {
        let mut appender = connection.appender(&table)?;
        for row in &rows {
            let mut values = vec![
                Value::Text(cluster.to_owned()),
                Value::Text(session.to_owned()),
            ];
            values.extend(row.iter().cloned());
            appender.append_row(duckdb::appender_params_from_iter(values))?;
        }
        appender.flush()?;
    }
    connection.execute_batch(&format!(
        "COPY {table} TO {} (FORMAT parquet, COMPRESSION zstd); DROP TABLE {table};",
        path_literal(path)
    ))?;
    Ok(rows.len() as u64)
}

/// Reads the records of a `kind` table file into `entities`.
pub fn read_entities(
    connection: &Connection,
    kind: EntityKind,
    path: &Path,
    entities: &mut SessionEntities,
) -> Result<(), TableError> {
    let mut statement = connection.prepare(&format!(
        "SELECT record FROM read_parquet({}, hive_partitioning = false)",
        path_literal(path)
    ))?;
    let records: Vec<String> = statement
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<Result<_, _>>()?;
    kind.absorb(records, entities)
}
