//! The dashboard API over Ray's captured traffic (and synthetic traffic where size matters):
//! posted to ingest, compacted, then queried through `serve` (HTTP), through the Lambda query
//! function on SeaweedFS, or through the query engine itself. Answers are held to Ray's own
//! state-API output for the same runs, and every HTTP answer (errors included) is checked
//! against `openapi.yaml`. A file per behaviour; each sets up its store with
//! [`afterglow_tests::scenario::Scenario`] or a `serve` of the captured runs:
//!
//! - `ad_hoc_sql`: `afterglow sql` over a run kept in deltas: each attempt once, as Ray lists it,
//!   on a local store and on S3.
//! - `agreement`: every run agrees with Ray through `serve`, through the Lambda function on S3,
//!   and through a query cache smaller than a session.
//! - `task_routes`: search, cursor pages in every order, 400s that name the bad parameter, a
//!   task's attempts, the timeline.
//! - `serving`: bearer tokens, freshness within the target, the dashboard's page and assets,
//!   gzip.
//! - `counts`: synthetic traffic counted as generated; rollups count what a scan counts, also
//!   when an earlier rollup is damaged or gone.
//! - `table_files`: a lost file costs its rows, not the session; deletion vectors read as
//!   reads by key.
//! - `lookups`: task lookups through key indexes and from rows held in memory equal a scan.
//! - `clusters`: `/api/clusters` pages newest first with a cursor (each session of many
//!   clusters once, at most 64 cluster documents read a page), a large cluster is paged (and
//!   Ray's `latest` found) from its own catalog document alone, and a store whose catalog is the
//!   single document an earlier build wrote is still listed.
//! - `history`: reads over many sessions: a time range reads only the sessions created in it,
//!   a scope over the copy budget is refused before anything is copied, the table pages newest
//!   session first reading only what a page needs, cluster-wide counts sum the sessions'.

mod ad_hoc_sql;
mod agreement;
mod clusters;
mod counts;
mod history;
mod lookups;
mod serving;
mod table_files;
mod task_routes;
