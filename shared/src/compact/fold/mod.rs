//! Folding: a session's base and deltas rewritten as one new base, so that no session stays
//! slow to read and nobody has to run `afterglow compact --fold`. This is the one home of
//! folding:
//!
//! - here, the policy ([`FoldPolicy::due`]): fold when the deltas are too many files, or hold a
//!   large share of the base's rows, or the whole session is small and spans several files;
//! - `base`, the new base written from the base and deltas with its rollup and key index;
//! - `interleave`, the k-way interleave of the sorted files that writes the base's rows;
//! - `tidy`, folding a session that has gone quiet ([`Compactor::tidy_if_quiet`]) or every
//!   session at once ([`Compactor::fold`]), and deleting retired files whose grace period is
//!   over.
//!
//! Every run applies the policy as it commits. A session that no run has changed for
//! [`FoldPolicy::quiet`] is tidied: nothing runs on a timer, each commit asks for a
//! [`QuietCheck`] of its version later (see [`super::schedule`]), and the check does nothing if
//! another commit came since.
//!
//! [`Compactor::tidy_if_quiet`]: super::Compactor::tidy_if_quiet
//! [`Compactor::fold`]: super::Compactor::fold
//! [`QuietCheck`]: super::schedule::quiet::QuietCheck

mod base;
mod interleave;
mod tidy;

use std::time::Duration;

use crate::tables::manifest::TableFiles;

pub use self::tidy::Tidied;

/// When a session's deltas are folded into a new base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldPolicy {
    /// Fold once there are more deltas than this: each is a file every read opens.
    pub max_deltas: usize,
    /// Fold once the deltas hold this many percent of the base's rows…
    pub delta_share_percent: u64,
    /// …and at least this many rows: below it deltas cost a read little (reads stay within
    /// the targets of docs/performance.md, "Targets"), while folding a young session early
    /// costs compaction much of its speed.
    pub min_delta_rows: u64,
    /// Fold whenever the whole session, in more than one file, holds at most this many rows:
    /// a small session's reads cost what its files cost to open, and its fold costs little.
    pub small_session_rows: u64,
    /// Tidy a session no run has changed for this long (on AWS at most 15 minutes, SQS's
    /// longest delay).
    pub quiet: Duration,
}

impl Default for FoldPolicy {
    fn default() -> Self {
        Self {
            max_deltas: 16,
            delta_share_percent: 50,
            min_delta_rows: 1_000_000,
            small_session_rows: 50_000,
            quiet: crate::config::DEFAULT_FOLD_QUIET,
        }
    }
}

/// Why a run folds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoldReason {
    /// More deltas than [`FoldPolicy::max_deltas`].
    Deltas(usize),
    /// The session's rows, in more than one file, are no more than
    /// [`FoldPolicy::small_session_rows`].
    Small(u64),
    /// The deltas' rows reached [`FoldPolicy::delta_share_percent`] of the base's.
    Share {
        /// Rows in the deltas.
        delta_rows: u64,
        /// Rows in the base.
        base_rows: u64,
    },
}

impl FoldPolicy {
    /// Whether a table with these files is to be folded now, and why.
    pub fn due(&self, table: &TableFiles) -> Option<FoldReason> {
        let deltas = table.deltas.len();
        if deltas > self.max_deltas {
            return Some(FoldReason::Deltas(deltas));
        }
        let delta_rows: u64 = table.deltas.iter().map(|file| file.rows).sum();
        let base_rows: u64 = table.base.iter().map(|file| file.rows).sum();
        let rows = base_rows.saturating_add(delta_rows);
        if deltas > 0 && table.base.len() + deltas > 1 && rows <= self.small_session_rows {
            return Some(FoldReason::Small(rows));
        }
        let share = u128::from(delta_rows) * 100
            >= u128::from(base_rows) * u128::from(self.delta_share_percent);
        (delta_rows >= self.min_delta_rows && share).then_some(FoldReason::Share {
            delta_rows,
            base_rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::ObjectKey;
    use crate::tables::manifest::DataFile;

    fn file(rows: u64) -> DataFile {
        DataFile {
            key: ObjectKey::new(format!("tables/x/{rows}.parquet")).expect("a valid key"),
            rows,
            bytes: rows * 90,
            deletes: None,
            rollup: None,
            rollup_format: None,
            rollup_covers: None,
            key_index: None,
            rollup_bytes: None,
            key_index_bytes: None,
        }
    }

    fn table(base: &[u64], deltas: &[u64]) -> TableFiles {
        TableFiles {
            base: base.iter().map(|rows| file(*rows)).collect(),
            deltas: deltas.iter().map(|rows| file(*rows)).collect(),
        }
    }

    /// At most 3 deltas, deltas folded at half the base and 1 000 rows, sessions of at most
    /// `small_session_rows` folded whenever they span files.
    fn policy(small_session_rows: u64) -> FoldPolicy {
        FoldPolicy {
            max_deltas: 3,
            delta_share_percent: 50,
            min_delta_rows: 1_000,
            small_session_rows,
            ..FoldPolicy::default()
        }
    }

    #[test]
    fn the_policy_folds_on_many_deltas_or_a_large_share() {
        let policy = policy(0);
        let rows: [(&str, TableFiles, Option<FoldReason>); 7] = [
            ("no files", table(&[], &[]), None),
            ("small deltas, no base", table(&[], &[400, 500]), None),
            (
                "deltas past the minimum, no base",
                table(&[], &[600, 500]),
                Some(FoldReason::Share {
                    delta_rows: 1_100,
                    base_rows: 0,
                }),
            ),
            (
                "under half the base",
                table(&[10_000], &[2_000, 2_999]),
                None,
            ),
            (
                "half the base",
                table(&[10_000], &[2_000, 3_000]),
                Some(FoldReason::Share {
                    delta_rows: 5_000,
                    base_rows: 10_000,
                }),
            ),
            (
                "too many deltas, however small",
                table(&[10_000], &[1, 1, 1, 1]),
                Some(FoldReason::Deltas(4)),
            ),
            (
                "as many deltas as allowed",
                table(&[10_000], &[1, 1, 1]),
                None,
            ),
        ];
        for (name, files, expected) in rows {
            assert_eq!(policy.due(&files), expected, "{name}");
        }
    }

    #[test]
    fn the_policy_folds_a_small_session_in_more_than_one_file() {
        let policy = policy(100);
        let rows: [(&str, TableFiles, Option<FoldReason>); 6] = [
            ("one delta", table(&[], &[60]), None),
            ("a base alone", table(&[60], &[]), None),
            (
                "two deltas",
                table(&[], &[60, 40]),
                Some(FoldReason::Small(100)),
            ),
            (
                "a base and a delta",
                table(&[99], &[1]),
                Some(FoldReason::Small(100)),
            ),
            ("one row too many", table(&[60], &[41]), None),
            (
                "too many deltas comes first",
                table(&[], &[1, 1, 1, 1]),
                Some(FoldReason::Deltas(4)),
            ),
        ];
        for (name, files, expected) in rows {
            assert_eq!(policy.due(&files), expected, "{name}");
        }
    }
}
