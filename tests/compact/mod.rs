//! Compaction end to end: Ray's captured bodies are posted to ingest, compacted into Parquet,
//! and the rows a reader sees are held to Ray's own state-API output. A file per behaviour;
//! each sets up its store with [`afterglow_tests::scenario::Scenario`]:
//!
//! - `agreement`: the rows agree with Ray; order, duplicates, compacting again and `rebuild`
//!   change no row; unreadable events are quarantined; placement groups land in their table.
//! - `commits`: the commit protocol on both backends: racing compactions both land, a manifest
//!   write whose response was lost still counts, files no manifest names are collected.
//! - `folds`: a session's deltas fold into a base by count, by share and on request; a small
//!   session stays in one file.
//! - `field_ids`: every table file carries its columns' field ids, however it was written.
//! - `earlier_build`: a store an earlier build wrote is carried on by this one.
//! - `batches`: the compact Lambda function's SQS batches: S3 notifications, failures per
//!   message, byte caps and deadlines.
//! - `queue`: the function's own queue: the delayed quiet checks that fold a session no run
//!   changed, and messages past a batch's byte cap sent back to it.
//! - `tidying`: `serve` folds and tidies quiet sessions, those an earlier process left too.
//! - `backlog`: `serve` compacts at its next start what it stored and never compacted.
//! - `held_back`: a fault holds back only the raw objects it touches, and they are compacted
//!   once it clears.
//! - `published_grace`: with the Iceberg catalog on, a fold's replaced files outlive every
//!   snapshot that names them.
//! - `retention`: expiry removes old sessions whole; `rebuild` is refused once the raw history
//!   it would replay is gone.
//! - `catalog`: on both backends, records racing across clusters lose no entry, each cluster
//!   keeps a document of its own, and the single document an earlier build wrote is moved,
//!   even when the response to the list's creation is lost.
//!
//! `sqs` is no suite: it holds the compact function and the messages its tests drive it with
//! (the Iceberg catalog's test drives it too).

mod agreement;
mod backlog;
mod batches;
mod catalog;
mod commits;
mod earlier_build;
mod field_ids;
mod folds;
mod held_back;
mod published_grace;
mod queue;
mod retention;
pub(crate) mod sqs;
mod tidying;
