//! The Parquet tables compaction writes and queries read, via embedded DuckDB. Each table
//! module owns its schema and the mapping between rows and the merge model.

pub mod entities;
pub mod task_attempts;
pub mod task_profile;
