//! The `task_profile` table: one row per profile span (`TASK_PROFILE_EVENT`, when Ray exports
//! them), for timelines. It is a projection of the spans kept on each attempt's merge state, so
//! every `task_attempts` file that carries spans is written with a matching `task_profile`
//! file, and a reader takes an attempt's spans from the newest file that has the attempt.

use std::path::Path;

use duckdb::{Connection, params};

use super::newest::{TableFiles, path_literal};
use super::task_attempts::TableError;
use crate::merge::TaskAttempt;

/// The order of spans in every file.
const SORT_ORDER: &str = "task_id, attempt_number, start_ns";

/// How files are written.
const PARQUET_OPTIONS: &str = "FORMAT parquet, COMPRESSION zstd";

/// Writes the spans of `attempts` to `path` (ZSTD Parquet, sorted by task and start). Returns
/// the number of spans; with none, nothing is written.
pub fn write_profile(
    connection: &Connection,
    cluster: &str,
    session: &str,
    attempts: &[TaskAttempt],
    path: &Path,
) -> Result<u64, TableError> {
    let spans: u64 = attempts
        .iter()
        .map(|attempt| attempt.profile.len() as u64)
        .sum();
    if spans == 0 {
        return Ok(0);
    }
    connection.execute_batch(
        "DROP TABLE IF EXISTS staged_profile;
         CREATE TEMP TABLE staged_profile (cluster VARCHAR, session_name VARCHAR, task_id VARCHAR,
           attempt_number INTEGER, job_id VARCHAR, event_name VARCHAR, start_ns BIGINT,
           end_ns BIGINT, component_type VARCHAR, component_id VARCHAR, node_ip_address VARCHAR,
           extra_data VARCHAR);",
    )?;
    {
        let mut appender = connection.appender("staged_profile")?;
        for attempt in attempts {
            let task_id = attempt.task_id.as_ref().map(|id| id.as_hex().to_owned());
            let job_id = attempt.job_id.as_ref().map(|id| id.as_hex().to_owned());
            for span in &attempt.profile {
                appender.append_row(params![
                    cluster,
                    session,
                    task_id,
                    attempt.attempt_number,
                    job_id,
                    span.event_name,
                    span.start_ns,
                    span.end_ns,
                    span.component_type,
                    span.component_id,
                    span.node_ip_address,
                    span.extra_data,
                ])?;
            }
        }
        appender.flush()?;
    }
    connection.execute_batch(&format!(
        "COPY (SELECT * FROM staged_profile ORDER BY {SORT_ORDER}) TO {} ({PARQUET_OPTIONS});
         DROP TABLE staged_profile;",
        path_literal(path)
    ))?;
    Ok(spans)
}

/// Folds the spans of base and deltas into one file at `path`: each attempt's spans from the
/// newest file that has the attempt. Returns the span count (0, and no file, when none).
pub fn write_newest(
    connection: &Connection,
    files: &TableFiles<'_>,
    path: &Path,
) -> Result<u64, TableError> {
    Ok(super::newest::write_newest(
        connection,
        files,
        SORT_ORDER,
        PARQUET_OPTIONS,
        path,
    )?)
}
