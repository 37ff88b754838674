//! A cluster's rollup: the rollups of its ended sessions summed into one file
//! ([`crate::tables::rollup::write_cluster_sum`]), so a read of the whole cluster, or of the
//! fleet, counts a few files instead of fetching every session's manifest and rollups.
//!
//! The cluster's catalog document names it ([`crate::tables::catalog::ClusterCatalog::rollup`])
//! with the sessions it counts, each at the [`SessionStats::sequence`] it counted. A session is
//! counted once a newer session of its cluster has started (a Ray cluster runs one session at a
//! time, so the older one has ended), and its rows are then as good as final. Events that still
//! arrive for it change its sequence: the rollup then no longer [`ClusterRollup::holds`] for the
//! cluster's sessions, readers read each session's own rollups, and the next roll-up counts the
//! cluster again (`Compactor::roll_up_cluster`).
//!
//! It keeps [`crate::tables::rollup::CLUSTER_GROUPINGS`] only: a read grouped by node or worker
//! reads the sessions' own rollups.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::manifest::{RetiredFile, SessionStats};
use crate::storage::ObjectKey;

/// A cluster's rollup as its catalog document names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRollup {
    /// The file.
    pub key: ObjectKey,
    /// Its size in bytes.
    pub bytes: u64,
    /// Session → the [`SessionStats::sequence`] it was counted at.
    pub counts: BTreeMap<String, u64>,
    /// Earlier rollups of the cluster, kept until readers that started before can no longer
    /// need them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<RetiredFile>,
}

impl ClusterRollup {
    /// True when it counts `sessions` (a cluster's, from its catalog document) as they are now:
    /// every session it counts is still there, at the sequence it counted.
    pub fn holds(&self, sessions: &BTreeMap<String, SessionStats>) -> bool {
        self.counts.iter().all(|(session, sequence)| {
            sessions
                .get(session)
                .is_some_and(|stats| stats.sequence == Some(*sequence))
        })
    }
}

/// The sessions of a cluster its rollup may count: every session but the one that started last
/// (by first event time, [`super::catalog::newest_first`]), which may still be running.
pub fn ended(sessions: &BTreeMap<String, SessionStats>) -> Vec<&String> {
    super::catalog::newest_first(sessions)
        .into_iter()
        .skip(1)
        .map(|(session, _)| session)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(first_ms: i64, sequence: u64) -> SessionStats {
        SessionStats {
            first_ms: Some(first_ms),
            sequence: Some(sequence),
            ..SessionStats::default()
        }
    }

    fn rollup(counts: &[(&str, u64)]) -> Result<ClusterRollup, Box<dyn std::error::Error>> {
        Ok(ClusterRollup {
            key: ObjectKey::new("tables/cluster_rollups/cluster=c/rollup-1.parquet")?,
            bytes: 1,
            counts: counts
                .iter()
                .map(|(session, sequence)| ((*session).to_owned(), *sequence))
                .collect(),
            retired: Vec::new(),
        })
    }

    #[test]
    fn a_rollup_holds_while_every_session_it_counts_is_unchanged()
    -> Result<(), Box<dyn std::error::Error>> {
        let sessions = BTreeMap::from([
            ("a".to_owned(), stats(1, 4)),
            ("b".to_owned(), stats(2, 7)),
            ("c".to_owned(), stats(3, 1)),
        ]);
        assert!(rollup(&[("a", 4), ("b", 7)])?.holds(&sessions));
        assert!(rollup(&[])?.holds(&sessions));
        // A session that changed since, or is gone.
        assert!(!rollup(&[("a", 4), ("b", 6)])?.holds(&sessions));
        assert!(!rollup(&[("a", 4), ("z", 1)])?.holds(&sessions));
        Ok(())
    }

    #[test]
    fn every_session_but_the_one_that_started_last_has_ended() {
        let sessions = BTreeMap::from([
            ("a".to_owned(), stats(1, 4)),
            ("b".to_owned(), stats(3, 7)),
            ("c".to_owned(), stats(2, 1)),
        ]);
        let mut ended: Vec<&String> = ended(&sessions);
        ended.sort();
        assert_eq!(ended, ["a", "c"]);
        assert!(super::ended(&BTreeMap::new()).is_empty());
    }
}
