//! Afterglow's library: everything the three functions and the CLI share.
//!
//! Afterglow keeps the history of Ray clusters after they are gone. Ray's aggregator agents POST
//! their exported events to the ingest function, which stores each batch as a raw object; later
//! stages roll those into Parquet tables and serve them to a dashboard. This crate knows nothing
//! about Lambda or HTTP: the `afterglow` binary translates requests into calls on it.
//!
//! # Modules
//!
//! The pipeline's stages, in the order data goes through them:
//!
//! - [`ingest`]: checking a Ray POST (token, size, shape, sessions) before [`raw`] stores it.
//! - [`raw`]: the raw stage: each accepted batch as one gzip NDJSON object, its key, its
//!   encoding both ways, and listing.
//! - [`compact`]: raw objects → Parquet tables, per session: the run, the commit protocol, the
//!   folds of deltas into a base, and the schedulers that decide when each happens.
//! - [`tables`]: the tables' schemas, their manifests and catalog (the commit protocol both
//!   sides share), and the Parquet mechanics; most files are written with the parquet crate,
//!   read with DuckDB.
//! - [`query`]: the dashboard API and Ray's own routes, answered by DuckDB over those tables.
//! - [`iceberg`]: the published tables as Apache Iceberg metadata over the same files, for
//!   other engines.
//! - [`logs`]: Ray's log files, shipped from each node and read back by byte range.
//!
//! And what the stages share:
//!
//! - [`event`]: the Ray event model, every exported event type in both key forms.
//! - [`merge`]: Ray's rules for merging a task attempt's or entity's events into one row (pure).
//! - [`keys`]: where things live in storage, and the validated names that become key segments.
//! - [`storage`]: the object-store trait with its S3 and local-directory backends.
//! - [`aws`]: the AWS SDK's configuration, one HTTPS client for every AWS client.
//! - [`gzip`]: compressing buffers (log chunks, answers), and answers built a row at a time.
//! - [`auth`]: the ingest token.
//! - [`config`]: the environment variables, read in one place.

#![deny(missing_docs, unreachable_pub)]

pub mod auth;
pub mod aws;
pub mod compact;
pub mod config;
pub mod event;
pub mod gzip;
pub mod iceberg;
pub mod ingest;
pub mod keys;
pub mod logs;
pub mod merge;
pub mod query;
pub mod raw;
pub mod storage;
pub mod tables;
