//! Every integration test, in one test binary. Each file below is one suite (its own doc says
//! what it holds to what); they run as modules of a single crate because every test binary links
//! the whole of DuckDB, and one link instead of twelve is minutes off each build. Tests name
//! their module: `cargo test -p afterglow-tests --test integration compact::`.

mod compact;
mod entities;
mod events;
mod ingest;
mod insights;
mod logs;
mod merge;
mod query;
mod ray_routes;
mod secrets;
mod storage;
mod template;
