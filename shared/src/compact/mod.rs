//! Compaction: raw NDJSON objects → Parquet tables, per `(cluster, session)`.
//!
//! A run (`run`) reads the raw objects it is given, parses and de-duplicates their events (by
//! `eventId`), and applies each session's events to its attempts and entities with the rules of
//! [`crate::merge`]. Each session is then committed on its own (`commit`): its attempts merged
//! with the rows already stored for them, written as a new immutable delta file, and the
//! session's manifest replaced conditionally; a lost race re-reads the manifest and redoes the
//! merge, so concurrent runs never lose each other's work. Because every merge is idempotent and
//! order-independent, re-delivered notifications and re-read raw objects change no row.
//!
//! When deltas pile up they are folded into a new base ([`fold`]: the policy, the base's writing
//! and the tidying of quiet sessions). What decides when compaction runs lives in [`schedule`]:
//! the compact function's batches and quiet checks on AWS, `serve`'s in-process queue, and what
//! `serve` left uncompacted. Retention ([`expiry`]) and orphan files ([`orphans`]) are cleaned
//! up after runs; [`cluster_rollup`] sums each cluster's ended sessions' rollups; [`report`]
//! says what a run did.
//!
//! This module owns the orchestration: the raw objects' format is [`crate::raw`]'s, the tables'
//! schemas and Parquet I/O are [`crate::tables`]'s.

pub mod cluster_rollup;
mod commit;
mod error;
pub mod expiry;
pub mod fold;
pub mod notification;
pub mod orphans;
mod rebuild;
pub mod report;
mod run;
pub mod schedule;
mod scratch;
mod seen;
mod settings;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::storage::{FileCache, Storage};
use crate::tables::stored_keys::StoredKeys;

pub use self::error::CompactError;
pub use self::report::CompactReport;
pub use self::run::RUN_OBJECTS;
pub use self::settings::CompactSettings;

/// Runs compactions against one store.
#[derive(Clone, Debug)]
pub struct Compactor {
    storage: Arc<dyn Storage>,
    settings: CompactSettings,
    scratch: PathBuf,
    cache: FileCache,
    /// Where each stored attempt is, by file, kept between runs; shared by clones.
    stored_keys: StoredKeys,
    /// Folds whose base's rollup was summed (see [`Compactor::folds_summed`]), shared by
    /// clones.
    folds_summed: Arc<AtomicU64>,
}

impl Compactor {
    /// A compactor writing through `storage`, with local scratch files under `scratch`.
    pub fn new(storage: Arc<dyn Storage>, settings: CompactSettings, scratch: PathBuf) -> Self {
        let cache = FileCache::bounded(
            Arc::clone(&storage),
            scratch.join("cache"),
            8,
            settings.cache_bytes,
        );
        Self {
            stored_keys: StoredKeys::new(settings.stored_keys_bytes),
            storage,
            settings,
            scratch,
            cache,
            folds_summed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// How many folds wrote their base's rollup by summing the rollups it replaces rather
    /// than counting the base: tests tell the two ways apart by it.
    pub fn folds_summed(&self) -> u64 {
        self.folds_summed.load(Ordering::Relaxed)
    }

    /// Where runs found stored attempts (tests tell by it what a run read).
    pub fn stored_keys(&self) -> &StoredKeys {
        &self.stored_keys
    }

    /// The store compacted into.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// How it compacts.
    pub fn settings(&self) -> &CompactSettings {
        &self.settings
    }
}

/// The clock compaction stamps retired files with, in ms since the epoch.
fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
