//! The `afterglow` binary's pieces: thin adapters from Lambda events, HTTP requests and command
//! lines onto the `shared` library. No merge rules, SQL or storage keys live here.
//!
//! - [`cli`]: the command line (`serve`, …).
//! - [`lambda`]: the Lambda entry point, chosen by `_HANDLER`.
//! - [`http`]: the one axum router that `serve` and API Gateway both drive.
//! - [`ingest`]: `POST /v1/events/{cluster}` onto `shared::ingest`.
//! - [`serve`]: the embedded default: every function on a local directory.
//! - [`telemetry`]: tracing setup.

pub mod cli;
pub mod http;
pub mod ingest;
pub mod lambda;
pub mod serve;
pub mod telemetry;
