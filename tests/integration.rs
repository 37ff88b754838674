//! Every integration test, in one test binary. Each module below is one suite, named after the
//! surface it holds to what it promises: a file, or for compaction and queries a folder with a
//! file per behaviour (its `mod.rs` maps them). They run as modules of a single crate because
//! every test binary links the whole of DuckDB, and one link instead of one per suite is minutes
//! off each build. Tests name their module: `cargo test -p afterglow-tests --test integration
//! compact::`, or `compact::folds::` for one behaviour. A new test joins the suite of the
//! behaviour it proves; set-up that several suites repeat belongs in the support library
//! (`support/`, crate `afterglow_tests`), such as its `scenario` builder.

mod compact;
mod entities;
mod events;
mod iceberg;
mod ingest;
mod insights;
mod logs;
mod merge;
mod query;
mod ray_routes;
mod secrets;
mod storage;
mod template;
