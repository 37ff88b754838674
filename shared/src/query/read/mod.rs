//! The read code the routes share, ours and Ray's: a route takes what it needs from here, never
//! from another route. One concept per file:
//!
//! - [`params`]: the query string, parsed strictly into a [`params::Scope`], a
//!   [`params::TaskFilter`] and a [`params::Cursor`].
//! - [`catalog`]: the sessions in a scope, and pages of clusters and their sessions, newest
//!   first, from the catalog alone.
//! - [`snapshot`]: what one request reads: the sessions in scope and local copies of the live
//!   files their manifests name.
//! - [`sql`]: SQL text from fixed pieces and bound values, [`sql::Relation`]s over the files a
//!   snapshot fetched, and a filter's conditions.
//! - [`json`]: rows of DuckDB, or of Arrow, as JSON.
//! - `attempts`: the newest attempts in scope, as a relation.
//! - `counts`: counting attempts: from rollups when they answer the filter, else by a scan.
//! - `rollups`: the rollup rows a filter selects, and the extremes they still know.
//! - `page`: a page's size budget, its cursor, and the task table's cursor positions.
//! - `task_page`: one page of the task table, read fast from millions of rows.
//! - `session_walk`: a page that spans sessions, reading them one at a time in order.
//! - `lookup`: one task's attempts, found through key indexes or in rows held in memory.
//! - [`resident`]: the rows of small sessions held in memory for those lookups.
//! - `entity_records`: a session's entity records, merged by Ray's rules.
//!
//! Nothing here reads a route's own parameters or shapes its answer.

pub(crate) mod attempts;
pub mod catalog;
pub(crate) mod counts;
pub(crate) mod entity_records;
pub mod json;
pub(crate) mod lookup;
pub(crate) mod page;
pub mod params;
pub mod resident;
pub(crate) mod rollups;
pub(crate) mod session_walk;
pub mod snapshot;
pub mod sql;
pub(crate) mod task_page;
