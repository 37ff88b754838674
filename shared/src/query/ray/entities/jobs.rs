//! Jobs in Ray 2.60's `JobDetails` shape, as its job API (`api/jobs/`, `ray job list`) and its
//! state API (`api/v0/jobs`, `ray list jobs`) answer them: the submissions (`ray job submit`,
//! [`crate::merge::submissions`]) and the drivers no submission claims.
//!
//! Ray joins the two by the driver's metadata: the job supervisor gives a submission's driver
//! `job_submission_id`, and a submission takes its `job_id` and `driver_info` from that driver
//! (the last by job id, when several). A driver so claimed is not listed on its own.

use std::collections::BTreeMap;

use serde_json::{Map, Value as Json, json};

use super::{ms, parsed};
use crate::keys::{LogFile, LogFileName, NodeId, SessionName};
use crate::merge::entities::{JobRecord, SessionEntities};
use crate::merge::submissions::SubmissionRecord;
use crate::query::read::entity_records::records;
use crate::query::read::params::Scope;
use crate::query::redaction::redact_runtime_env;
use crate::query::{QueryEngine, QueryError};
use crate::tables::entities::EntityKind;

/// A session's jobs and submissions, with its nodes' addresses.
pub(super) struct Jobs {
    entities: SessionEntities,
    node_ips: Map<String, Json>,
}

impl Jobs {
    /// Reads the session's jobs, submissions and node addresses.
    pub(super) async fn read(engine: &QueryEngine, scope: &Scope) -> Result<Self, QueryError> {
        let mut entities = records(engine, scope, EntityKind::Jobs).await?;
        entities.merge(records(engine, scope, EntityKind::Submissions).await?);
        let node_ips = super::node_ips(engine, scope).await?;
        Ok(Self { entities, node_ips })
    }

    /// The drivers of each submission, by submission id: the driver Ray keeps last.
    fn drivers(&self) -> BTreeMap<String, &JobRecord> {
        // Job ids ascend in the map, so a later driver replaces an earlier one, as in Ray.
        self.entities
            .jobs
            .values()
            .filter_map(|job| Some((submission_of(job)?, job)))
            .filter(|(id, _)| self.entities.submissions.contains_key(id))
            .collect()
    }

    /// Every job as Ray's job API lists it: the submissions first (in the order they were
    /// submitted), then the drivers no submission claims, by job id.
    pub(super) fn listed(&self) -> Vec<Json> {
        let drivers = self.drivers();
        let mut submissions: Vec<&SubmissionRecord> = self.entities.submissions.values().collect();
        submissions.sort_by_key(|submission| (submission.start_ns(), submission.id.clone()));
        let mut rows: Vec<Json> = submissions
            .into_iter()
            .map(|submission| {
                let driver = drivers.get(&submission.id).copied();
                submission_details(submission, driver, &self.node_ips)
            })
            .collect();
        rows.extend(self.entities.jobs.values().filter_map(|job| {
            let claimed = submission_of(job).is_some_and(|id| drivers.contains_key(&id));
            (!claimed).then(|| driver_details(job, &self.node_ips))
        }));
        rows
    }

    /// Every job in the state API's order (`ray list jobs`): by job id, those without one first.
    pub(super) fn state_rows(&self) -> Vec<Json> {
        let mut rows = self.listed();
        rows.sort_by_key(|row| row.get("job_id").and_then(Json::as_str).map(str::to_owned));
        rows
    }

    /// One job, as Ray's `find_job_by_ids` finds it: a driver's job id, a submission's driver's
    /// job id, or a submission id.
    pub(super) fn find(&self, id: &str) -> Option<Json> {
        let lowercase = id.to_ascii_lowercase();
        let listed = self.listed();
        let by = |field: &str, wanted: &str| {
            listed
                .iter()
                .find(|row| row.get(field).and_then(Json::as_str) == Some(wanted))
                .cloned()
        };
        by("job_id", &lowercase).or_else(|| by("submission_id", id))
    }
}

/// The submission id a driver's metadata names.
fn submission_of(job: &JobRecord) -> Option<String> {
    let metadata = parsed(&job.definition.as_ref()?.value.metadata);
    metadata
        .get("job_submission_id")
        .and_then(Json::as_str)
        .map(str::to_owned)
}

/// Ray's `JobDriverInfo` of a driver; its node's address is empty when the node is unknown,
/// as the field is a required string.
fn driver_info(job: &JobRecord, node_ips: &Map<String, Json>) -> Json {
    let definition = job.definition.as_ref().map(|reported| &reported.value);
    let node_ip = definition
        .and_then(|d| d.driver_node_id.as_ref())
        .and_then(|node| node_ips.get(node))
        .cloned()
        .unwrap_or_else(|| json!(""));
    json!({
        "id": job.id,
        "node_ip_address": node_ip,
        "pid": definition.map(|d| d.driver_pid.to_string()).unwrap_or_default(),
    })
}

/// A driver no submission claims, as `JobDetails` of type `DRIVER`.
fn driver_details(job: &JobRecord, node_ips: &Map<String, Json>) -> Json {
    let definition = job.definition.as_ref().map(|reported| &reported.value);
    let status = match job.state() {
        Some("FINISHED") => "SUCCEEDED",
        _ => "RUNNING",
    };
    json!({
        "type": "DRIVER",
        "job_id": job.id,
        "submission_id": null,
        "driver_info": driver_info(job, node_ips),
        "status": status,
        "entrypoint": definition.map(|d| d.entrypoint.clone()).unwrap_or_default(),
        "message": null,
        "error_type": null,
        "start_time": ms(job.start_ns()).unwrap_or(0),
        "end_time": ms(job.end_ns()).unwrap_or(0),
        "metadata": definition.map_or_else(|| json!({}), |d| parsed(&d.metadata)),
        // `env_vars` values masked, as Ray's job routes mask them for its dashboard.
        "runtime_env": redact_runtime_env(
            definition.map_or_else(|| json!({}), |d| parsed(&d.serialized_runtime_env)),
        ),
        "driver_agent_http_address": null,
        // Ray names the driver's node only for jobs submitted through its job API.
        "driver_node_id": definition
            .filter(|d| parsed(&d.metadata).get("job_submission_id").is_some())
            .and_then(|d| d.driver_node_id.clone()),
        "driver_exit_code": null,
    })
}

/// A submission, as `JobDetails` of type `SUBMISSION`, with its driver when it started one.
/// The address of the job agent that ran it is left out: it was the live cluster's.
fn submission_details(
    submission: &SubmissionRecord,
    driver: Option<&JobRecord>,
    node_ips: &Map<String, Json>,
) -> Json {
    let definition = submission
        .definition
        .as_ref()
        .map(|reported| &reported.value);
    let current = submission.current();
    json!({
        "type": "SUBMISSION",
        "job_id": driver.map(|job| job.id.clone()),
        "submission_id": submission.id,
        "driver_info": driver.map(|job| driver_info(job, node_ips)),
        "status": submission.state().unwrap_or("PENDING"),
        "entrypoint": definition.map(|d| d.entrypoint.clone()).unwrap_or_default(),
        "message": current.map(|t| t.message.clone()).filter(|message| !message.is_empty()),
        "error_type": current.map(|t| t.error_type.clone()).filter(|error| !error.is_empty()),
        "start_time": ms(submission.start_ns()),
        "end_time": ms(submission.end_ns()),
        "metadata": definition.map_or_else(|| json!({}), |d| parsed(&d.metadata)),
        // `env_vars` values masked, as Ray's job routes mask them for its dashboard.
        "runtime_env": redact_runtime_env(
            definition.map_or_else(|| json!({}), |d| parsed(&d.serialized_runtime_env)),
        ),
        "driver_agent_http_address": null,
        "driver_node_id": submission.latest(|t| t.driver_node_id.clone()),
        "driver_exit_code": submission.latest(|t| t.driver_exit_code),
    })
}

/// `GET api/jobs/`: the jobs page's bare array of `JobDetails`.
pub(in crate::query::ray) async fn jobs(
    engine: &QueryEngine,
    scope: &Scope,
) -> Result<Json, QueryError> {
    Ok(Json::Array(Jobs::read(engine, scope).await?.listed()))
}

/// `GET api/jobs/{id}`.
pub(in crate::query::ray) async fn job(
    engine: &QueryEngine,
    scope: &Scope,
    id: &str,
) -> Result<Json, QueryError> {
    Jobs::read(engine, scope)
        .await?
        .find(id)
        .ok_or_else(|| QueryError::NotFound(format!("Job {id} does not exist")))
}

/// `GET api/jobs/{id}/logs`: `{"logs": …}`, the whole driver log of a submission
/// (`job-driver-{submission_id}.log` on its driver's node, as shipped), within the response's
/// size. A driver started outside the job API has no such log (400, as Ray answers).
pub(in crate::query::ray) async fn job_logs(
    engine: &QueryEngine,
    scope: &Scope,
    id: &str,
) -> Result<Json, QueryError> {
    let job = Jobs::read(engine, scope)
        .await?
        .find(id)
        .ok_or_else(|| QueryError::NotFound(format!("Job {id} does not exist")))?;
    let text = |field: &str| job.get(field).and_then(Json::as_str).map(str::to_owned);
    let (Some(submission_id), Some(node_id)) = (text("submission_id"), text("driver_node_id"))
    else {
        return if text("submission_id").is_some() {
            // Its driver never started: Ray has no log to answer either.
            Ok(json!({"logs": ""}))
        } else {
            Err(QueryError::BadRequest(
                "Can only get logs of submission type jobs".into(),
            ))
        };
    };
    let (Some(cluster), Some(session)) = (&scope.cluster, &scope.session) else {
        return Err(QueryError::Internal(
            "a Ray route without its session".into(),
        ));
    };
    let invalid = |err: &dyn std::fmt::Display| QueryError::NotFound(err.to_string());
    let file = LogFile {
        cluster: cluster.clone(),
        session: SessionName::new(session).map_err(|err| invalid(&err))?,
        node_id: NodeId::new(&node_id).map_err(|err| invalid(&err))?,
        file: LogFileName::new(&format!("job-driver-{submission_id}.log"))
            .map_err(|err| invalid(&err))?,
    };
    let log = engine.log_tail(&file, None).await?;
    Ok(json!({"logs": String::from_utf8_lossy(&log.bytes)}))
}
