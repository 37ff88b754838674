//! Afterglow's library: everything the three functions and the CLI share.
//!
//! Afterglow keeps the history of Ray clusters after they are gone. Ray's aggregator agents POST
//! their exported events to the ingest function, which stores each batch as a raw object; later
//! stages roll those into Parquet tables and serve them to a dashboard. This crate knows nothing
//! about Lambda or HTTP: the `afterglow` binary translates requests into calls on it.
//!
//! # Layout
//!
//! - [`event`]: the Ray event model, every exported event type in both key forms.
//! - [`storage`]: the object-store trait with its S3 and local-directory backends.
//! - [`ingest`]: checking a Ray POST and storing it durably as NDJSON.
//! - [`compact`]: raw NDJSON → merged Parquet tables, with a conditionally replaced manifest.
//! - [`tables`]: the Parquet tables' schemas, written and read with DuckDB.
//! - [`query`]: the dashboard API, answered by DuckDB over those tables.
//! - [`logs`]: Ray's log files, shipped from each node and read back by byte range.
//! - [`layout`]: the storage key layout.
//! - [`gzip`]: compressing whole buffers (log chunks, answers).
//! - [`merge`]: Ray's rules for merging a task attempt's events into one row (pure).
//! - [`auth`]: the ingest token.
//! - [`config`]: the environment variables, read in one place.

#![deny(missing_docs, unreachable_pub)]

pub mod auth;
pub mod compact;
pub mod config;
pub mod event;
pub mod gzip;
pub mod ingest;
pub mod layout;
pub mod logs;
pub mod merge;
pub mod query;
pub mod storage;
pub mod tables;
