//! What a session holds, as its manifest and the catalog keep it: attempts, and the spans of
//! its event and creation times.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// What a session holds, kept current by compaction for readers that list sessions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStats {
    /// Distinct task attempts in `task_attempts`.
    pub attempts: u64,
    /// Earliest event time seen (ms since the epoch).
    pub first_ms: Option<i64>,
    /// Latest event time seen (ms since the epoch).
    pub last_ms: Option<i64>,
    /// Earliest creation time (`creation_time_ms`) of an attempt. A time range on creation
    /// leaves out a session whose attempts were all created outside it; `None` (no attempt
    /// with a creation time, or recorded by a build that did not keep it) never does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_created_ms: Option<i64>,
    /// Latest creation time of an attempt (see [`Self::first_created_ms`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_created_ms: Option<i64>,
    /// The manifest's sequence after the last compaction run that changed the session's rows
    /// (a tidy moves rows between files and keeps it): a reader that finds it equal to the one
    /// a cluster's rollup counted knows the session is as that rollup counted it. `None` when
    /// recorded by a build that did not keep it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// The catalog's record of the manifest's own sequence, which every commit moves (a
    /// tidy's and a fold's too): a reader that has published the session at it knows the
    /// manifest has not moved since without reading it (see `iceberg::sessions`). Only the
    /// catalog keeps it (a manifest has its sequence); `None` there when recorded by a build
    /// that did not keep it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_sequence: Option<u64>,
    /// The catalog's record of the entity tables (`jobs`, `actors`, …) the session has rows
    /// in: a sync of a table the session has none in need not read its manifest. Only the
    /// catalog keeps it, as [`Self::manifest_sequence`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity_tables: Option<BTreeSet<String>>,
}

impl SessionStats {
    /// Widens the span of creation times to include `first..=last`.
    pub fn include_created(&mut self, first: Option<i64>, last: Option<i64>) {
        self.first_created_ms = widen(self.first_created_ms, first, i64::min);
        self.last_created_ms = widen(self.last_created_ms, last, i64::max);
    }

    /// True when an attempt may have been created in `[since, until)` (either end open).
    pub fn may_have_created(&self, since: Option<i64>, until: Option<i64>) -> bool {
        let (Some(first), Some(last)) = (self.first_created_ms, self.last_created_ms) else {
            return true;
        };
        since.is_none_or(|since| last >= since) && until.is_none_or(|until| first < until)
    }

    /// True when every attempt with a creation time was created in `[since, until)` (either
    /// end open); false when that is unknown.
    pub fn created_within(&self, since: Option<i64>, until: Option<i64>) -> bool {
        let (Some(first), Some(last)) = (self.first_created_ms, self.last_created_ms) else {
            return false;
        };
        since.is_none_or(|since| first >= since) && until.is_none_or(|until| last < until)
    }

    /// Widens the time span to include `first..=last`.
    pub fn include_span(&mut self, first: Option<i64>, last: Option<i64>) {
        self.first_ms = widen(self.first_ms, first, i64::min);
        self.last_ms = widen(self.last_ms, last, i64::max);
    }
}

/// `known` and `seen` combined by `pick`, either alone when the other is unknown.
fn widen(known: Option<i64>, seen: Option<i64>, pick: fn(i64, i64) -> i64) -> Option<i64> {
    match (known, seen) {
        (Some(a), Some(b)) => Some(pick(a, b)),
        (a, b) => a.or(b),
    }
}
