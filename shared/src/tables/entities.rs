//! The `jobs`, `actors`, `nodes`, `workers`, `placement_groups` and `submissions` tables: one
//! small file per session and kind, rewritten whole when the session's entities change. Each row has the state-API
//! view columns queries read and a `record` column (JSON) holding the merge state compaction reads
//! back.

use std::path::Path;

use duckdb::Connection;
use duckdb::types::Value;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::TableError;
use super::columns::{Column, duckdb_field_ids};
use super::newest::path_literal;
use crate::merge::entities::{
    ActorRecord, JobRecord, NodeRecord, PlacementGroupRecord, SessionEntities, WorkerRecord,
};
use crate::merge::submissions::SubmissionRecord;

/// The first column of every entity table.
const CLUSTER: Column = Column::new(1, "cluster", "VARCHAR");
/// The second column of every entity table.
const SESSION_NAME: Column = Column::new(2, "session_name", "VARCHAR");
/// The last column of every entity table, the merge state as JSON: its field id is far past
/// the view columns', which take the ids after theirs as they are added.
const RECORD: Column = Column::new(100, "record", "VARCHAR");

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
    /// Submitted jobs (`ray job submit`).
    Submissions,
}

impl EntityKind {
    /// Every kind.
    pub const ALL: [Self; 6] = [
        Self::Jobs,
        Self::Actors,
        Self::Nodes,
        Self::Workers,
        Self::PlacementGroups,
        Self::Submissions,
    ];

    /// Table name (also the key segment).
    pub fn table(self) -> &'static str {
        match self {
            Self::Jobs => "jobs",
            Self::Actors => "actors",
            Self::Nodes => "nodes",
            Self::Workers => "workers",
            Self::PlacementGroups => "placement_groups",
            Self::Submissions => "submissions",
        }
    }

    /// View columns after `cluster, session_name`, before `record`, with their field ids
    /// (see [`Column`]): from 3 on, as [`CLUSTER`] and [`SESSION_NAME`] are 1 and 2.
    pub(crate) fn columns(self) -> &'static [Column] {
        match self {
            Self::Jobs => {
                const COLUMNS: &[Column] = &[
                    Column::new(3, "job_id", "VARCHAR"),
                    Column::new(4, "state", "VARCHAR"),
                    Column::new(5, "driver_pid", "BIGINT"),
                    Column::new(6, "driver_node_id", "VARCHAR"),
                    Column::new(7, "entrypoint", "VARCHAR"),
                    Column::new(8, "start_time_ms", "BIGINT"),
                    Column::new(9, "end_time_ms", "BIGINT"),
                ];
                COLUMNS
            }
            Self::Actors => {
                const COLUMNS: &[Column] = &[
                    Column::new(3, "actor_id", "VARCHAR"),
                    Column::new(4, "class_name", "VARCHAR"),
                    Column::new(5, "name", "VARCHAR"),
                    Column::new(6, "state", "VARCHAR"),
                    Column::new(7, "job_id", "VARCHAR"),
                    Column::new(8, "node_id", "VARCHAR"),
                    Column::new(9, "pid", "BIGINT"),
                    Column::new(10, "ray_namespace", "VARCHAR"),
                    Column::new(11, "is_detached", "BOOLEAN"),
                    Column::new(12, "num_restarts", "BIGINT"),
                    Column::new(13, "repr_name", "VARCHAR"),
                    Column::new(14, "death_message", "VARCHAR"),
                    Column::new(15, "placement_group_id", "VARCHAR"),
                ];
                COLUMNS
            }
            Self::Nodes => {
                const COLUMNS: &[Column] = &[
                    Column::new(3, "node_id", "VARCHAR"),
                    Column::new(4, "node_ip", "VARCHAR"),
                    Column::new(5, "node_name", "VARCHAR"),
                    Column::new(6, "hostname", "VARCHAR"),
                    Column::new(7, "state", "VARCHAR"),
                    Column::new(8, "labels", "VARCHAR"),
                    Column::new(9, "resources_total", "VARCHAR"),
                    Column::new(10, "start_time_ms", "BIGINT"),
                    Column::new(11, "end_time_ms", "BIGINT"),
                ];
                COLUMNS
            }
            Self::Workers => {
                const COLUMNS: &[Column] = &[
                    Column::new(3, "worker_id", "VARCHAR"),
                    Column::new(4, "worker_type", "VARCHAR"),
                    Column::new(5, "node_id", "VARCHAR"),
                    Column::new(6, "pid", "BIGINT"),
                    Column::new(7, "job_id", "VARCHAR"),
                    Column::new(8, "is_alive", "BOOLEAN"),
                    Column::new(9, "exit_type", "VARCHAR"),
                    Column::new(10, "exit_detail", "VARCHAR"),
                    Column::new(11, "start_time_ms", "BIGINT"),
                    Column::new(12, "end_time_ms", "BIGINT"),
                ];
                COLUMNS
            }
            Self::PlacementGroups => {
                const COLUMNS: &[Column] = &[
                    Column::new(3, "placement_group_id", "VARCHAR"),
                    Column::new(4, "name", "VARCHAR"),
                    Column::new(5, "state", "VARCHAR"),
                    Column::new(6, "strategy", "VARCHAR"),
                    Column::new(7, "creator_job_id", "VARCHAR"),
                    Column::new(8, "is_detached", "BOOLEAN"),
                    Column::new(9, "bundles", "VARCHAR"),
                ];
                COLUMNS
            }
            Self::Submissions => {
                const COLUMNS: &[Column] = &[
                    Column::new(3, "submission_id", "VARCHAR"),
                    Column::new(4, "state", "VARCHAR"),
                    Column::new(5, "entrypoint", "VARCHAR"),
                    Column::new(6, "message", "VARCHAR"),
                    Column::new(7, "error_type", "VARCHAR"),
                    Column::new(8, "driver_node_id", "VARCHAR"),
                    Column::new(9, "driver_exit_code", "BIGINT"),
                    Column::new(10, "start_time_ms", "BIGINT"),
                    Column::new(11, "end_time_ms", "BIGINT"),
                ];
                COLUMNS
            }
        }
    }

    /// Every stored column, in order: `cluster`, `session_name`, the view columns, `record`.
    pub(crate) fn stored_columns(self) -> Vec<Column> {
        let mut columns = vec![CLUSTER, SESSION_NAME];
        columns.extend_from_slice(self.columns());
        columns.push(RECORD);
        columns
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
            Self::Submissions => entities
                .submissions
                .values()
                .map(|submission| {
                    let definition = submission
                        .definition
                        .as_ref()
                        .map(|reported| &reported.value);
                    let current = submission.current();
                    Ok(vec![
                        text(Some(submission.id.clone())),
                        text(submission.state().map(str::to_owned)),
                        text(definition.map(|d| d.entrypoint.clone())),
                        text(current.map(|t| t.message.clone())),
                        text(
                            current
                                .map(|t| t.error_type.clone())
                                .filter(|e| !e.is_empty()),
                        ),
                        text(submission.latest(|t| t.driver_node_id.clone())),
                        big(submission.latest(|t| t.driver_exit_code).map(i64::from)),
                        big(ms(submission.start_ns())),
                        big(ms(submission.end_ns())),
                        record(submission)?,
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
                Self::Submissions => {
                    let submission: SubmissionRecord = parse(&json)?;
                    partial
                        .submissions
                        .insert(submission.id.clone(), submission);
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
            Self::Submissions => entities.submissions.len(),
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
    let stored = kind.stored_columns();
    let columns: Vec<String> = stored
        .iter()
        .map(|column| format!("{} {}", column.name, column.sql_type))
        .collect();
    let names: Vec<String> = stored.iter().map(|column| column.name.to_owned()).collect();
    let field_ids = duckdb_field_ids(&stored, &names);
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
        "COPY {table} TO {} (FORMAT parquet, COMPRESSION zstd{field_ids}); DROP TABLE {table};",
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
