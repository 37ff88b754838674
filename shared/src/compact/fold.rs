//! When a session's deltas are folded into a new base, so that no session stays slow to read
//! and nobody has to run `afterglow compact --fold`.
//!
//! Two rules. Every run applies a size-tiered policy ([`FoldPolicy::due`]): fold when the
//! deltas are too many files, or hold a large share of the base's rows. And a session that no
//! run has changed for [`FoldPolicy::quiet`] is tidied ([`Compactor::tidy_if_quiet`]): its
//! deltas folded, its retired files deleted once their grace period is over. Nothing runs on a
//! timer: each commit asks for a [`QuietCheck`] of its version later (a delayed SQS message on
//! AWS, a timer in `serve`), and the check does nothing if another commit came since.
//!
//! This module decides and commits; where checks wait is the caller's business.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::batch::BatchLimits;
use super::{CompactError, Compactor, now_ms};
use crate::layout::{self, ClusterName, SessionName};
use crate::tables::manifest::{self, Commit, Manifest, TableFiles, VersionedManifest};

/// When a session's deltas are folded into a new base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldPolicy {
    /// Fold once there are more deltas than this: each is a file every read opens.
    pub max_deltas: usize,
    /// Fold once the deltas hold this many percent of the base's rows…
    pub delta_share_percent: u64,
    /// …and at least this many rows: below it deltas cost a read little (a million rows in
    /// deltas read 1.5× slower than folded, all within DESIGN §7), while folding a young
    /// session early costs compaction a fifth of its speed (docs/performance.md).
    pub min_delta_rows: u64,
    /// Fold whenever the whole session, in more than one file, holds at most this many rows:
    /// a small session's reads cost what its files cost to open (the basic-workload run in
    /// eleven files answered its pages in 23 ms, in one 11), and its fold costs little (0.6 s
    /// for 100 000 rows, docs/performance.md).
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

/// A session as one commit left it: a quiet check of it tidies the session only if it is still
/// at `sequence`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuietCheck {
    /// The cluster.
    pub cluster: ClusterName,
    /// The session.
    pub session: SessionName,
    /// The manifest's sequence after that commit.
    pub sequence: u64,
}

/// What a quiet check did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tidied {
    /// The session changed since (or is gone): nothing done, a later commit asked for its
    /// own check.
    pub changed: bool,
    /// Its deltas were folded into a new base.
    pub folded: bool,
    /// Retired files deleted.
    pub deleted: usize,
    /// It still holds retired files in their grace period: check it again later, at
    /// [`Tidied::sequence`].
    pub again: bool,
    /// The manifest's sequence after this check.
    pub sequence: u64,
}

/// A message that says it is a quiet check but is not a valid one.
#[derive(Debug, thiserror::Error)]
#[error("not a valid quiet check: {0}")]
pub struct InvalidCheck(String);

/// A quiet check as a queue message carries it.
#[derive(Deserialize, Serialize)]
struct Wire {
    kind: String,
    cluster: String,
    session: String,
    sequence: u64,
}

impl QuietCheck {
    /// The marker that tells a quiet check from an S3 notification in the compact queue.
    const KIND: &'static str = "afterglow.quiet_check";

    /// The check as the body of a queue message.
    pub fn to_message(&self) -> String {
        let wire = Wire {
            kind: Self::KIND.to_owned(),
            cluster: self.cluster.to_string(),
            session: self.session.to_string(),
            sequence: self.sequence,
        };
        // Strings and a number: serializing cannot fail.
        serde_json::to_string(&wire).unwrap_or_default()
    }

    /// The check a message body holds; `None` when the body is something else (an S3
    /// notification), an error when it says it is a check but is not a valid one.
    pub fn from_message(body: &str) -> Result<Option<Self>, InvalidCheck> {
        #[derive(Deserialize)]
        struct Tagged {
            kind: Option<String>,
        }
        let Ok(Tagged { kind }) = serde_json::from_str::<Tagged>(body) else {
            return Ok(None);
        };
        if kind.as_deref() != Some(Self::KIND) {
            return Ok(None);
        }
        let wire: Wire = serde_json::from_str(body).map_err(|err| InvalidCheck(err.to_string()))?;
        Ok(Some(Self {
            cluster: ClusterName::new(&wire.cluster)
                .map_err(|err| InvalidCheck(err.to_string()))?,
            session: SessionName::new(&wire.session)
                .map_err(|err| InvalidCheck(err.to_string()))?,
            sequence: wire.sequence,
        }))
    }
}

impl Compactor {
    /// Tidies a session if it is still as `check` saw it: folds its deltas (or a base whose
    /// rollup or missing key index an earlier build wrote) into a new base, and deletes retired files whose grace
    /// period is over. A commit in between wins: the check then does nothing.
    #[tracing::instrument(name = "tidy_if_quiet", skip(self), fields(cluster = %check.cluster, session = %check.session, sequence = check.sequence))]
    pub async fn tidy_if_quiet(&self, check: &QuietCheck) -> Result<Tidied, CompactError> {
        let key = layout::manifest_key(&check.cluster, &check.session)?;
        let current = manifest::load(&*self.storage, &key).await?;
        if current.etag.is_none() || !current.manifest.quiet_since(check.sequence) {
            return Ok(Tidied {
                changed: true,
                sequence: current.manifest.sequence,
                ..Tidied::default()
            });
        }
        self.tidy(&check.cluster, &check.session, current).await
    }

    /// Folds every session's deltas into its base now, instead of waiting for the fold policy
    /// or a quiet check. Returns the number of sessions folded.
    #[tracing::instrument(name = "fold", skip(self))]
    pub async fn fold(&self) -> Result<usize, CompactError> {
        let mut folded = 0;
        for meta in self.storage.list(layout::MANIFESTS_PREFIX).await? {
            let Some((cluster, session)) = layout::manifest_session(&meta.key) else {
                continue;
            };
            let current = manifest::load(&*self.storage, &meta.key).await?;
            if self.tidy(&cluster, &session, current).await?.folded {
                folded += 1;
            }
        }
        Ok(folded)
    }

    /// Tidies the session whose manifest is `current` (see [`Compactor::tidy_if_quiet`]).
    async fn tidy(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        current: VersionedManifest,
    ) -> Result<Tidied, CompactError> {
        let key = layout::manifest_key(cluster, session)?;
        let mut next = current.manifest.next_tidy();
        let mut written = Vec::new();
        let folded = next.task_attempts.needs_fold();
        if folded {
            let base = self.merge_base(cluster, session, &next).await?;
            written = next.install_base(base, now_ms());
        }
        let deleted = self.prune_retired(&mut next);
        if !folded && deleted == 0 {
            return Ok(Tidied {
                again: !next.retired.is_empty(),
                sequence: current.manifest.sequence,
                ..Tidied::default()
            });
        }
        let commit =
            manifest::commit(&*self.storage, &key, &next, current.etag.as_ref(), &written).await?;
        match commit {
            Commit::Landed => {
                self.delete_expired(&next, &current.manifest).await;
                tracing::info!(folded, deleted, "tidied a session");
                Ok(Tidied {
                    changed: false,
                    folded,
                    deleted,
                    again: !next.retired.is_empty(),
                    sequence: next.sequence,
                })
            }
            Commit::Lost => {
                // A run committed meanwhile; it asked for its own check.
                self.delete_unreferenced(&written).await;
                Ok(Tidied {
                    changed: true,
                    sequence: current.manifest.sequence,
                    ..Tidied::default()
                })
            }
        }
    }

    /// Runs the quiet checks of a batch of queue messages (`(message id, check)`), each while
    /// the deadline allows. Returns the ids of the messages to retry (the check failed or was
    /// not reached) and the checks to queue again (sessions still holding retired files), each
    /// with the id of the message whose check asks for it.
    pub async fn tidy_messages(
        &self,
        checks: &[(String, QuietCheck)],
        limits: &BatchLimits,
    ) -> (Vec<String>, Vec<(String, QuietCheck)>) {
        let mut failed = Vec::new();
        let mut again = Vec::new();
        for (id, check) in checks {
            match self.within(limits, self.tidy_if_quiet(check)).await {
                Some(Ok(tidied)) => {
                    if tidied.again {
                        let follow_up = QuietCheck {
                            sequence: tidied.sequence,
                            ..check.clone()
                        };
                        again.push((id.clone(), follow_up));
                    }
                }
                Some(Err(err)) => {
                    tracing::warn!(message_id = %id, error = %err, "quiet check failed; it is retried");
                    failed.push(id.clone());
                }
                None => failed.push(id.clone()),
            }
        }
        (failed, again)
    }

    /// Drops from `next` the retired files whose grace period is over; returns how many.
    /// They are deleted once `next` has landed ([`Compactor::delete_expired`]).
    pub(super) fn prune_retired(&self, next: &mut Manifest) -> usize {
        let grace = i64::try_from(self.settings.retire_grace.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms().saturating_sub(grace);
        let before = next.retired.len();
        next.retired.retain(|file| file.retired_at_ms > cutoff);
        before - next.retired.len()
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

    #[test]
    fn a_check_reads_back_from_its_message_and_other_bodies_are_not_checks() {
        let check = QuietCheck {
            cluster: ClusterName::new("prod").expect("a valid name"),
            session: SessionName::new("session_2026-11-25_10-00-00_000000_1")
                .expect("a valid name"),
            sequence: 41,
        };
        assert_eq!(
            QuietCheck::from_message(&check.to_message()).ok(),
            Some(Some(check))
        );
        for other in [
            r#"{"Records": []}"#,
            r#"{"Event": "s3:TestEvent"}"#,
            "not json",
            r#"{"kind": "something else"}"#,
        ] {
            assert!(
                matches!(QuietCheck::from_message(other), Ok(None)),
                "{other}"
            );
        }
        for bad in [
            r#"{"kind": "afterglow.quiet_check", "cluster": "prod"}"#,
            r#"{"kind": "afterglow.quiet_check", "cluster": "../x", "session": "s", "sequence": 1}"#,
        ] {
            assert!(QuietCheck::from_message(bad).is_err(), "{bad}");
        }
    }
}
