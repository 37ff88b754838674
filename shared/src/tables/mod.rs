//! The Parquet tables compaction writes and queries read, via embedded DuckDB. Each table
//! module owns its schema and the mapping between rows and the merge model; [`newest`] is the
//! log-structured read over a table's base and delta files.

pub mod entities;
pub mod newest;
pub mod task_attempts;
pub mod task_profile;
