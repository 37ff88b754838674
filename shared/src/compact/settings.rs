//! [`CompactSettings`]: how compaction is tuned (folds, grace periods, retries, memory, retention,
//! the local cache).

use std::time::Duration;

use super::fold::FoldPolicy;
use crate::tables::stored_keys;

/// Tuning of compaction.
#[derive(Clone, Debug)]
pub struct CompactSettings {
    /// When deltas are folded into a new base (see [`super::fold`]).
    pub fold: FoldPolicy,
    /// Keep retired files this long, so queries that started before can finish.
    pub retire_grace: Duration,
    /// Give up after this many lost manifest races in a row.
    pub max_manifest_retries: usize,
    /// DuckDB's memory limit for folds (MiB); beyond it, sorts spill to the scratch
    /// directory. `None`: DuckDB's default (80 % of the machine).
    pub memory_limit_mib: Option<u64>,
    /// Remove sessions whose newest event is older than this, after each run (see
    /// [`super::expiry`]). `None`: keep history forever.
    pub retention: Option<Duration>,
    /// A session's table file that its manifest does not name (written by a run that was cut
    /// off before committing) is deleted once the store says it is this old (see
    /// [`super::orphans`]). Far longer than any run, so files a running compaction has written
    /// but not yet committed are never taken.
    pub orphan_age: Duration,
    /// Most bytes of fetched table files kept in the scratch directory between runs (the
    /// least recently used go first); `None`: no limit.
    pub cache_bytes: Option<u64>,
    /// Most bytes of memory kept between runs for where each stored attempt is (see
    /// [`crate::tables::stored_keys`]); a session whose files need more is located by a scan.
    pub stored_keys_bytes: u64,
}

impl Default for CompactSettings {
    fn default() -> Self {
        Self {
            fold: FoldPolicy::default(),
            retire_grace: Duration::from_secs(15 * 60),
            max_manifest_retries: 20,
            memory_limit_mib: None,
            retention: None,
            orphan_age: Duration::from_secs(86_400),
            cache_bytes: None,
            stored_keys_bytes: stored_keys::DEFAULT_BUDGET,
        }
    }
}
