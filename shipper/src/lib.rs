//! Afterglow's log shipper (docs/architecture.md, "Logs"), as a library of its own so that it
//! builds without DuckDB: the `afterglow-ship-logs` binary a Ray node installs, and
//! `afterglow ship-logs` in the main binary, are this crate.
//!
//! - [`names`]: the names a shipped piece carries (session, node, file), checked as the store
//!   checks them.
//! - [`ship`]: what to send: following one node's session folders.
//! - [`frames`]: one request's body (a piece of every file that grew) and its answer.
//! - [`submissions`]: on the head node, submitted jobs as Ray's own events, read from Ray's job
//!   API (Ray exports none for them).
//! - [`metadata`]: on the head node, the cluster's Ray and Python versions, read from Ray's
//!   dashboard and stored beside the node's logs.
//! - [`cli`]: the command: its flags, the loop, the signals and the HTTP client.

pub mod cli;
pub mod frames;
pub mod metadata;
pub mod names;
pub mod ship;
pub mod submissions;
