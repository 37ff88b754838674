//! The `task_attempts` table's columns: each with its field id and DuckDB type, in file order,
//! and which `ts_*` column keeps which status's time.

use super::super::columns::{Column, concat};
use super::super::report_times;
use crate::event::common::TaskStatus;

/// Every status whose time a row keeps, with its column name.
pub(super) const STATUS_COLUMNS: [(i32, &str); 14] = [
    (0, "ts_nil"),
    (1, "ts_pending_args_avail"),
    (2, "ts_pending_node_assignment"),
    (3, "ts_pending_obj_store_mem_avail"),
    (4, "ts_pending_args_fetch"),
    (5, "ts_submitted_to_worker"),
    (6, "ts_pending_actor_task_args_fetch"),
    (7, "ts_pending_actor_task_ordering_or_concurrency"),
    (8, "ts_running"),
    (9, "ts_running_in_ray_get"),
    (10, "ts_running_in_ray_wait"),
    (11, "ts_finished"),
    (12, "ts_failed"),
    (13, "ts_getting_and_pinning_args"),
];

/// Every column a `task_attempts` file may hold: [`COLUMNS`], then the codes of the report
/// times stored by reference ([`report_times::REFERENCE_COLUMNS`]).
pub(crate) const STORED_COLUMNS: [Column; COLUMNS.len() + report_times::REFERENCE_COLUMNS.len()] =
    concat(COLUMNS, &report_times::REFERENCE_COLUMNS);

/// The table's columns, in order, with their field ids (see [`Column`]) and DuckDB types.
pub(crate) const COLUMNS: &[Column] = &[
    Column::new(1, "cluster", "VARCHAR"),
    Column::new(2, "session_name", "VARCHAR"),
    Column::new(3, "task_id", "VARCHAR"),
    Column::new(4, "attempt_number", "INTEGER"),
    Column::new(5, "job_id", "VARCHAR"),
    // The state-API view.
    Column::new(6, "state", "VARCHAR"),
    Column::new(7, "synthesized_failure", "BOOLEAN"),
    Column::new(8, "name", "VARCHAR"),
    Column::new(9, "func_or_class_name", "VARCHAR"),
    Column::new(10, "type", "VARCHAR"),
    Column::new(11, "language", "VARCHAR"),
    Column::new(12, "actor_id", "VARCHAR"),
    Column::new(13, "parent_task_id", "VARCHAR"),
    Column::new(14, "placement_group_id", "VARCHAR"),
    Column::new(15, "node_id", "VARCHAR"),
    Column::new(16, "worker_id", "VARCHAR"),
    Column::new(17, "worker_pid", "INTEGER"),
    Column::new(18, "error_type", "VARCHAR"),
    Column::new(19, "error_message", "VARCHAR"),
    Column::new(20, "creation_time_ms", "BIGINT"),
    Column::new(21, "start_time_ms", "BIGINT"),
    Column::new(22, "end_time_ms", "BIGINT"),
    Column::new(23, "duration_ms", "BIGINT"),
    // Merge state: status times (ns).
    Column::new(24, "ts_nil", "BIGINT"),
    Column::new(25, "ts_pending_args_avail", "BIGINT"),
    Column::new(26, "ts_pending_node_assignment", "BIGINT"),
    Column::new(27, "ts_pending_obj_store_mem_avail", "BIGINT"),
    Column::new(28, "ts_pending_args_fetch", "BIGINT"),
    Column::new(29, "ts_submitted_to_worker", "BIGINT"),
    Column::new(30, "ts_pending_actor_task_args_fetch", "BIGINT"),
    Column::new(
        31,
        "ts_pending_actor_task_ordering_or_concurrency",
        "BIGINT",
    ),
    Column::new(32, "ts_running", "BIGINT"),
    Column::new(33, "ts_running_in_ray_get", "BIGINT"),
    Column::new(34, "ts_running_in_ray_wait", "BIGINT"),
    Column::new(35, "ts_finished", "BIGINT"),
    Column::new(36, "ts_failed", "BIGINT"),
    Column::new(37, "ts_getting_and_pinning_args", "BIGINT"),
    // Merge state: single-valued facts and when they were reported (ns).
    Column::new(38, "node_id_at", "BIGINT"),
    Column::new(39, "worker_id_at", "BIGINT"),
    Column::new(40, "worker_pid_at", "BIGINT"),
    Column::new(41, "reported_error_type", "VARCHAR"),
    Column::new(42, "reported_error_message", "VARCHAR"),
    Column::new(43, "reported_error_at", "BIGINT"),
    Column::new(44, "actor_repr_name", "VARCHAR"),
    Column::new(45, "actor_repr_name_at", "BIGINT"),
    Column::new(46, "is_debugger_paused", "BOOLEAN"),
    Column::new(47, "is_debugger_paused_at", "BIGINT"),
    Column::new(48, "stdout_file", "VARCHAR"),
    Column::new(49, "stdout_file_at", "BIGINT"),
    Column::new(50, "stderr_file", "VARCHAR"),
    Column::new(51, "stderr_file_at", "BIGINT"),
    Column::new(52, "stdout_start", "BIGINT"),
    Column::new(53, "stdout_start_at", "BIGINT"),
    Column::new(54, "stdout_end", "BIGINT"),
    Column::new(55, "stdout_end_at", "BIGINT"),
    Column::new(56, "stderr_start", "BIGINT"),
    Column::new(57, "stderr_start_at", "BIGINT"),
    Column::new(58, "stderr_end", "BIGINT"),
    Column::new(59, "stderr_end_at", "BIGINT"),
    // Merge state: the definition.
    Column::new(60, "definition_at", "BIGINT"),
    Column::new(61, "def_name", "VARCHAR"),
    Column::new(62, "module_name", "VARCHAR"),
    Column::new(63, "class_name", "VARCHAR"),
    Column::new(64, "function_name", "VARCHAR"),
    Column::new(65, "def_actor_id", "VARCHAR"),
    Column::new(66, "required_resources", "VARCHAR"),
    Column::new(67, "serialized_runtime_env", "VARCHAR"),
    Column::new(68, "call_site", "VARCHAR"),
    Column::new(69, "label_selector", "VARCHAR"),
    // Profile spans (JSON array), when Ray exports TASK_PROFILE_EVENT.
    Column::new(70, "profile_events", "VARCHAR"),
];

/// The status a stored `ts_*` column holds, for readers that rebuild transitions.
pub fn status_columns() -> impl Iterator<Item = (TaskStatus, &'static str)> {
    STATUS_COLUMNS
        .iter()
        .map(|(number, column)| (TaskStatus::from_number(i64::from(*number)), *column))
}
