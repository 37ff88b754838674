//! The `afterglow` binary's pieces: thin adapters from Lambda events, HTTP requests and command
//! lines onto the `shared` library. No merge rules, SQL or storage keys live here.
//!
//! - [`cli`]: the command line, parsed and dispatched; each command's module below owns its
//!   flags (a clap `Args` struct) and its `run`.
//! - [`lambda`]: the Lambda entry point, chosen by `_HANDLER`.
//! - [`compact`]: S3/SQS notifications onto `shared::compact`.
//! - [`http`]: the one axum router that `serve` and API Gateway both drive; [`state`]: what
//!   its handlers share.
//! - [`ingest`]: `POST /v1/events/{cluster}` and `/v1/logs/{cluster}` onto `shared::ingest`.
//! - [`log_store`]: queued log requests (SQS) onto `shared::logs::queue`.
//! - [`page`]: the dashboard page at `/`.
//! - [`redelivery`]: the SQS-fed functions' answer for a message to deliver again.
//! - [`query`]: `GET /api/...` onto `shared::query`.
//! - [`serve`]: the embedded default: every function on a local directory.
//! - [`setup`]: configuration into parts (the store, a compactor, the ingest secrets).
//! - [`export_url`]: `afterglow export-url`, a cluster's export URL with its token.
//! - [`proxy`]: `afterglow proxy`, a loopback front that signs requests to a deployed query API.
//! - [`ship_logs`]: `afterglow ship-logs`, the per-node log shipper.
//! - [`maintenance`]: `compact` and `rebuild` from the command line.
//! - [`migrate_logs`]: `afterglow migrate-logs`, logs of the older layout moved into the index.
//! - [`sql`]: `afterglow sql`, DuckDB over the history's published tables.
//! - [`publish`]: `afterglow publish`, the published tables as Iceberg metadata.
//! - [`generate`]: `afterglow generate`, synthetic Ray traffic.
//! - [`bench`]: `afterglow bench`, the pipeline measured at scale.
//! - [`telemetry`]: tracing setup; [`progress`]: progress bars for long commands.

pub mod bench;
pub mod catalog;
pub mod cli;
pub mod compact;
pub mod export_url;
pub mod generate;
pub mod http;
pub mod ingest;
pub mod lambda;
pub mod log_store;
pub mod maintenance;
pub mod migrate_logs;
pub mod page;
pub mod progress;
pub mod proxy;
pub mod publish;
pub mod query;
pub mod redelivery;
pub mod serve;
pub mod setup;
pub use ::ship_logs::cli as ship_logs;
pub mod sql;
pub mod state;
pub mod telemetry;
