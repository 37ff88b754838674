//! Report times stored by reference: a `task_attempts` row keeps, for each single-valued fact,
//! when it was reported (`node_id_at`, `stdout_file_at`, …) so a later report can be ordered
//! against an earlier one. Facts arrive in groups (a worker's id with its node's, the log
//! position with the worker's pid, an error with its FAILED transition), so most of those
//! times equal another time of the same row, yet each stored as itself costs bytes on every
//! attempt all the same.
//!
//! A time equal to one of its candidate columns in the same row is written as NULL with the
//! candidate's code in its `…_ref` column (nearly constant, so it costs next to nothing); any
//! other time is written as itself, with no code. Reading takes the time itself, else the
//! referenced column's (decoded first: references only point at columns decoded before).
//! Files of an older format have no `…_ref` columns; read by name, their times are their own.
//!
//! Only compaction reads these columns (as merge state); queries never do. The one fact they
//! need from them, whether an attempt's definition arrived, is [`DEFINED`], which reads a
//! column never stored by reference.

use std::sync::Arc;

use duckdb::arrow::array::{Array, ArrayRef, AsArray, Int64Array, Int64Builder, UInt8Builder};
use duckdb::arrow::datatypes::{DataType, Field, FieldRef, Int64Type, Schema};
use duckdb::arrow::error::ArrowError;
use duckdb::arrow::record_batch::RecordBatch;

use super::columns::Column;

/// SQL true for a stored `task_attempts` row whose definition arrived (Ray's lists show only
/// those). `definition_at` may be stored by reference (NULL with a code), but the definition's
/// name is written exactly when the definition is, by every build.
pub const DEFINED: &str = "def_name IS NOT NULL";

/// The column [`DEFINED`] reads.
pub const DEFINED_COLUMN: &str = "def_name";

/// True for a time compaction may store by reference (NULL in its own column).
pub(crate) fn stored_by_reference(column: &str) -> bool {
    REFERENCED.iter().any(|(name, _)| *name == column)
}

/// The `…_ref` columns of codes, in [`REFERENCED`] order, with their field ids: compaction's
/// own encoding, never published, but written with ids like every stored column, so that an
/// Iceberg reader finds every column of a file by id.
pub(crate) const REFERENCE_COLUMNS: [Column; 11] = [
    Column::new(71, "definition_at_ref", "UTINYINT"),
    Column::new(72, "node_id_at_ref", "UTINYINT"),
    Column::new(73, "worker_id_at_ref", "UTINYINT"),
    Column::new(74, "worker_pid_at_ref", "UTINYINT"),
    Column::new(75, "stdout_file_at_ref", "UTINYINT"),
    Column::new(76, "stderr_file_at_ref", "UTINYINT"),
    Column::new(77, "stdout_start_at_ref", "UTINYINT"),
    Column::new(78, "stdout_end_at_ref", "UTINYINT"),
    Column::new(79, "stderr_start_at_ref", "UTINYINT"),
    Column::new(80, "stderr_end_at_ref", "UTINYINT"),
    Column::new(81, "reported_error_at_ref", "UTINYINT"),
];

/// True for a column of reference codes ([`REFERENCE_COLUMNS`]).
pub(crate) fn is_reference_column(column: &str) -> bool {
    REFERENCE_COLUMNS
        .iter()
        .any(|reference| reference.name == column)
}

/// A column a reference may point at, by its code (the position here).
const ANCHORS: [&str; 17] = [
    "ts_nil",
    "ts_pending_args_avail",
    "ts_pending_node_assignment",
    "ts_pending_obj_store_mem_avail",
    "ts_pending_args_fetch",
    "ts_submitted_to_worker",
    "ts_pending_actor_task_args_fetch",
    "ts_pending_actor_task_ordering_or_concurrency",
    "ts_running",
    "ts_running_in_ray_get",
    "ts_running_in_ray_wait",
    "ts_finished",
    "ts_failed",
    "ts_getting_and_pinning_args",
    "node_id_at",
    "worker_pid_at",
    "stdout_file_at",
];

/// Each time stored by reference, with the codes of the columns it may equal, most likely
/// first (as seen in Ray 2.60's captured runs). A code past [`ANCHORS`]' status columns names
/// a time listed earlier here, so decoding in this order always finds it decoded.
const REFERENCED: [(&str, &[u8]); 11] = [
    // Ray stamps a task's definition event with the time of its PENDING_ARGS_AVAIL transition
    // (equal in every captured Ray 2.60 run).
    ("definition_at", &[1]),
    // The executor reports node and worker at FINISHED (or FAILED, or when it took the task).
    ("node_id_at", &[11, 12, 5, 8]),
    ("worker_id_at", &[14, 11, 12, 5, 8]),
    ("worker_pid_at", &[8, 5, 11, 12]),
    // The log position arrives with the worker's pid.
    ("stdout_file_at", &[15, 8, 11, 12]),
    ("stderr_file_at", &[16, 15, 8, 11, 12]),
    ("stdout_start_at", &[16, 15, 8, 11, 12]),
    ("stdout_end_at", &[16, 15, 8, 11, 12]),
    ("stderr_start_at", &[16, 15, 8, 11, 12]),
    ("stderr_end_at", &[16, 15, 8, 11, 12]),
    ("reported_error_at", &[12, 11]),
];

/// The name of the column holding `column`'s reference code.
fn reference_column(column: &str) -> String {
    format!("{column}_ref")
}

/// The rows of `batch`, whose columns are [`COLUMNS`]' (times absolute), in this encoding: each
/// referenced time replaced by NULL where it equals one of its candidates (the first that it
/// equals giving the code), and a `…_ref` column of codes (`UTINYINT`) after the others for
/// each, in [`REFERENCED`] order. Candidates are compared as the row has them, before any is
/// itself replaced: [`decode`] restores them first.
///
/// [`COLUMNS`]: super::task_attempts
pub fn encode(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let times = |name: &str| -> Result<&Int64Array, ArrowError> {
        batch
            .column_by_name(name)
            .and_then(|column| column.as_primitive_opt::<Int64Type>())
            .ok_or_else(|| {
                ArrowError::SchemaError(format!("no BIGINT column {name} to encode times by"))
            })
    };
    let schema = batch.schema();
    let mut fields: Vec<FieldRef> = schema.fields().iter().cloned().collect();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    for (column, candidates) in REFERENCED {
        let values = times(column)?;
        let anchors = candidates
            .iter()
            .map(|code| times(ANCHORS[usize::from(*code)]).map(|anchor| (*code, anchor)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut kept = Int64Builder::with_capacity(batch.num_rows());
        let mut codes = UInt8Builder::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let time = values.is_valid(row).then(|| values.value(row));
            let code = time.and_then(|time| {
                anchors
                    .iter()
                    .find(|(_, anchor)| anchor.is_valid(row) && anchor.value(row) == time)
                    .map(|(code, _)| *code)
            });
            match code {
                Some(code) => {
                    kept.append_null();
                    codes.append_value(code);
                }
                None => {
                    kept.append_option(time);
                    codes.append_null();
                }
            }
        }
        let position = schema.index_of(column)?;
        columns[position] = Arc::new(kept.finish());
        fields.push(Arc::new(Field::new(
            reference_column(column),
            DataType::UInt8,
            true,
        )));
        columns.push(Arc::new(codes.finish()));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// Why a stored reference could not be followed.
#[derive(Debug, thiserror::Error)]
#[error("{column}: reference code {code} names no column it may equal")]
pub struct BadReference {
    column: String,
    code: i64,
}

/// Decodes the report times of one stored row: `value(name)` reads a column of the row (None
/// when null or absent). Returns each referenced time's value.
pub fn decode(
    mut value: impl FnMut(&str) -> Option<i64>,
) -> Result<Vec<(&'static str, Option<i64>)>, BadReference> {
    let mut decoded: Vec<(&'static str, Option<i64>)> = Vec::with_capacity(REFERENCED.len());
    for (column, candidates) in REFERENCED {
        let time = match (value(column), value(&reference_column(column))) {
            (Some(time), _) => Some(time),
            (None, None) => None,
            (None, Some(code)) => {
                let known = u8::try_from(code)
                    .ok()
                    .filter(|code| candidates.contains(code))
                    .and_then(|code| ANCHORS.get(usize::from(code)))
                    .ok_or_else(|| BadReference {
                        column: column.to_owned(),
                        code,
                    })?;
                match decoded.iter().find(|(name, _)| name == known) {
                    Some((_, time)) => *time,
                    None => value(known),
                }
            }
        };
        decoded.push((column, time));
    }
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_point_only_at_status_columns_or_times_decoded_before() {
        for (position, (column, candidates)) in REFERENCED.iter().enumerate() {
            for candidate in *candidates {
                let anchor = ANCHORS[usize::from(*candidate)];
                let earlier = REFERENCED[..position]
                    .iter()
                    .any(|(name, _)| *name == anchor);
                assert!(
                    anchor.starts_with("ts_") || earlier,
                    "{column} may refer to {anchor}, not decoded before it"
                );
            }
        }
    }

    #[test]
    fn each_referenced_time_has_its_code_column_with_an_id() {
        let names: Vec<String> = REFERENCED
            .iter()
            .map(|(column, _)| reference_column(column))
            .collect();
        let registered: Vec<&str> = REFERENCE_COLUMNS.iter().map(|column| column.name).collect();
        assert_eq!(names, registered);
    }

    #[test]
    fn a_bad_code_is_an_error_not_a_guess() {
        let row = |name: &str| match name {
            "node_id_at_ref" => Some(3),
            _ => None,
        };
        assert!(decode(row).is_err());
    }

    /// Every column [`encode`] reads (each referenced time and each anchor, once), as BIGINT
    /// columns holding `value(column, row)` for `rows` rows.
    fn times_batch(rows: usize, value: impl Fn(&str, usize) -> Option<i64>) -> RecordBatch {
        let mut names: Vec<&str> = ANCHORS.to_vec();
        for (column, _) in REFERENCED {
            if !names.contains(&column) {
                names.push(column);
            }
        }
        let fields: Vec<Field> = names
            .iter()
            .map(|name| Field::new(*name, DataType::Int64, true))
            .collect();
        let columns: Vec<ArrayRef> = names
            .iter()
            .map(|name| {
                let values: Int64Array = (0..rows).map(|row| value(name, row)).collect();
                Arc::new(values) as ArrayRef
            })
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("a batch")
    }

    /// Row `row` of `batch`'s column `name`: None when null, absent or not an integer.
    fn cell(batch: &RecordBatch, name: &str, row: usize) -> Option<i64> {
        let column = batch.column_by_name(name)?;
        if column.is_null(row) {
            return None;
        }
        if let Some(times) = column.as_primitive_opt::<Int64Type>() {
            return Some(times.value(row));
        }
        column
            .as_primitive_opt::<duckdb::arrow::datatypes::UInt8Type>()
            .map(|codes| i64::from(codes.value(row)))
    }

    #[test]
    fn a_time_equal_to_a_candidate_is_stored_as_the_first_candidate_it_equals() {
        // Row 0: node and worker reported at FINISHED. Row 1: the worker with the node, at no
        // transition. Row 2: nothing reported. Row 3: the error at FAILED, which FINISHED
        // also equals (FAILED comes first among the error's candidates).
        let batch = times_batch(4, |name, row| match (name, row) {
            ("ts_finished" | "node_id_at" | "worker_id_at", 0) => Some(100),
            ("node_id_at" | "worker_id_at", 1) => Some(7),
            ("ts_failed" | "ts_finished" | "reported_error_at", 3) => Some(5),
            _ => None,
        });
        let encoded = encode(&batch).expect("encodes");
        let stored = |name: &str| -> Vec<(Option<i64>, Option<i64>)> {
            (0..4)
                .map(|row| {
                    (
                        cell(&encoded, name, row),
                        cell(&encoded, &reference_column(name), row),
                    )
                })
                .collect()
        };
        // node_id_at equals FINISHED (11); worker_id_at equals the node's time (14, its first
        // candidate) as reported, though that is stored by reference itself.
        assert_eq!(
            stored("node_id_at"),
            [
                (None, Some(11)),
                (Some(7), None),
                (None, None),
                (None, None)
            ]
        );
        assert_eq!(
            stored("worker_id_at"),
            [
                (None, Some(14)),
                (None, Some(14)),
                (None, None),
                (None, None)
            ]
        );
        assert_eq!(
            stored("reported_error_at"),
            [(None, None), (None, None), (None, None), (None, Some(12))]
        );
        let codes = REFERENCED.len();
        assert_eq!(encoded.num_columns(), batch.num_columns() + codes);
    }

    #[test]
    fn encoded_times_decode_to_the_times_reported() -> Result<(), BadReference> {
        // Times drawn from a few values, so that most equal some other column of their row.
        let rows = 2_000;
        let value = |name: &str, row: usize| -> Option<i64> {
            let mixed = (row as u64 + 1)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(name.len() as u32 * 7);
            (!mixed.is_multiple_of(5)).then_some((mixed % 3) as i64)
        };
        let batch = times_batch(rows, value);
        let encoded = encode(&batch).expect("encodes");
        let mut by_reference = 0;
        for row in 0..rows {
            let decoded = decode(|name| cell(&encoded, name, row))?;
            for (column, time) in decoded {
                assert_eq!(time, value(column, row), "{column} of row {row}");
                by_reference +=
                    usize::from(cell(&encoded, &reference_column(column), row).is_some());
            }
        }
        assert!(
            by_reference > rows,
            "only {by_reference} times stored by reference"
        );
        Ok(())
    }

    /// The encoding as DuckDB computed it when it wrote the files (through fd24c07): a select
    /// list over rows with absolute times.
    fn encoding_in_sql() -> String {
        let mut replaced = Vec::new();
        let mut references = Vec::new();
        for (column, candidates) in REFERENCED {
            let mut code = String::from("CASE");
            let mut equal = Vec::new();
            for candidate in candidates {
                let anchor = ANCHORS[usize::from(*candidate)];
                code.push_str(&format!(" WHEN {column} = {anchor} THEN {candidate}"));
                equal.push(format!("{column} = {anchor}"));
            }
            code.push_str(" END::UTINYINT");
            references.push(format!("{code} AS {}", reference_column(column)));
            replaced.push(format!(
                "CASE WHEN coalesce({}, FALSE) THEN NULL ELSE {column} END AS {column}",
                equal.join(" OR ")
            ));
        }
        format!(
            "* REPLACE ({}), {}",
            replaced.join(", "),
            references.join(", ")
        )
    }

    #[test]
    fn times_are_encoded_as_duckdb_encoded_them() -> Result<(), Box<dyn std::error::Error>> {
        let rows = 2_000;
        let batch = times_batch(rows, |name, row| {
            let mixed = (row as u64 + 1)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(name.len() as u32 * 5);
            (!mixed.is_multiple_of(4)).then_some((mixed % 3) as i64)
        });
        let encoded = encode(&batch)?;
        let connection = duckdb::Connection::open_in_memory()?;
        let columns: Vec<String> = batch
            .schema()
            .fields()
            .iter()
            .map(|field| format!("{} BIGINT", field.name()))
            .collect();
        connection.execute_batch(&format!("CREATE TABLE t ({})", columns.join(", ")))?;
        {
            let mut appender = connection.appender("t")?;
            appender.append_record_batch(batch.clone())?;
            appender.flush()?;
        }
        let mut statement = connection.prepare(&format!(
            "SELECT {} FROM t ORDER BY rowid",
            encoding_in_sql()
        ))?;
        let by_duckdb: Vec<RecordBatch> = statement.query_arrow([])?.collect();
        let by_duckdb = duckdb::arrow::compute::concat_batches(&by_duckdb[0].schema(), &by_duckdb)?;
        assert_eq!(
            by_duckdb.schema(),
            encoded.schema(),
            "columns, their order and types"
        );
        assert_eq!(by_duckdb, encoded);
        let codes: usize = (0..REFERENCED.len())
            .map(|offset| rows - encoded.column(batch.num_columns() + offset).null_count())
            .sum();
        assert!(codes > rows, "only {codes} times stored by reference");
        Ok(())
    }
}
