//! Report times stored by reference: a `task_attempts` row keeps, for each single-valued fact,
//! when it was reported (`node_id_at`, `stdout_file_at`, …) so a later report can be ordered
//! against an earlier one. Facts arrive in groups (a worker's id with its node's, the log
//! position with the worker's pid, an error with its FAILED transition), so most of those
//! times equal another time of the same row; each took ~3.5 bytes an attempt all the same.
//!
//! A time equal to one of its candidate columns in the same row is written as NULL with the
//! candidate's code in its `…_ref` column (nearly constant, so it costs next to nothing); any
//! other time is written as itself, with no code. Reading takes the time itself, else the
//! referenced column's (decoded first: references only point at columns decoded before).
//! Files written before this have no `…_ref` columns; read by name, their times are their own.
//!
//! Only compaction reads these columns (as merge state); queries never do. The one fact they
//! need from them, whether an attempt's definition arrived, is [`DEFINED`], which reads a
//! column never stored by reference.

/// SQL true for a stored `task_attempts` row whose definition arrived (Ray's lists show only
/// those). `definition_at` may be stored by reference (NULL with a code), but the definition's
/// name is written exactly when the definition is, by every build.
pub const DEFINED: &str = "def_name IS NOT NULL";

/// The column [`DEFINED`] reads.
pub const DEFINED_COLUMN: &str = "def_name";

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

/// The select list that writes the rows of a relation with every [`COLUMNS`]-shaped column
/// (times absolute) in this encoding: `* REPLACE (…)` and the `…_ref` columns.
///
/// [`COLUMNS`]: super::task_attempts
pub fn encoded_select() -> String {
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
    fn a_bad_code_is_an_error_not_a_guess() {
        let row = |name: &str| match name {
            "node_id_at_ref" => Some(3),
            _ => None,
        };
        assert!(decode(row).is_err());
    }
}
