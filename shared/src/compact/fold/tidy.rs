//! Tidying a session: its deltas folded into a new base and its retired files deleted once
//! their grace period is over, when a quiet check finds it unchanged
//! ([`Compactor::tidy_if_quiet`]) or for every session at once ([`Compactor::fold`], `afterglow
//! compact --fold`). A commit in between wins: the tidy's own commit then loses, and it does
//! nothing. Either then rolls up the session's cluster ([`crate::compact::cluster_rollup`]).

use crate::compact::schedule::quiet::QuietCheck;
use crate::compact::{CompactError, Compactor, now_ms};
use crate::keys::{self, ClusterName, SessionName};
use crate::tables::catalog;
use crate::tables::manifest::{self, Commit, Manifest, VersionedManifest};

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

impl Compactor {
    /// Tidies a session if it is still as `check` saw it: folds its deltas (or a base of an
    /// older format, its rollup outdated or its key index missing) into a new base, and deletes
    /// retired files whose grace period is over. A commit in between wins: the check then does
    /// nothing.
    #[tracing::instrument(name = "tidy_if_quiet", skip(self), fields(cluster = %check.cluster, session = %check.session, sequence = check.sequence))]
    pub async fn tidy_if_quiet(&self, check: &QuietCheck) -> Result<Tidied, CompactError> {
        let key = keys::manifest_key(&check.cluster, &check.session)?;
        let current = manifest::load(&*self.storage, &key).await?;
        if current.etag.is_none() || !current.manifest.quiet_since(check.sequence) {
            return Ok(Tidied {
                changed: true,
                sequence: current.manifest.sequence,
                ..Tidied::default()
            });
        }
        let tidied = self.tidy(&check.cluster, &check.session, current).await?;
        // A quiet session may be one a newer session of its cluster has ended.
        self.roll_up_after(&check.cluster).await;
        Ok(tidied)
    }

    /// Folds every session's deltas into its base now, instead of waiting for the fold policy
    /// or a quiet check. Returns the number of sessions folded.
    #[tracing::instrument(name = "fold", skip(self))]
    pub async fn fold(&self) -> Result<usize, CompactError> {
        let mut folded = 0;
        let mut clusters = Vec::new();
        for meta in self.storage.list(keys::MANIFESTS_PREFIX).await? {
            let Some((cluster, session)) = keys::manifest_session(&meta.key) else {
                continue;
            };
            let current = manifest::load(&*self.storage, &meta.key).await?;
            if self.tidy(&cluster, &session, current).await?.folded {
                folded += 1;
            }
            if !clusters.contains(&cluster) {
                clusters.push(cluster);
            }
        }
        for cluster in &clusters {
            self.roll_up_after(cluster).await;
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
        let key = keys::manifest_key(cluster, session)?;
        let mut next = current.manifest.next_tidy();
        let mut written = Vec::new();
        let folded = next.task_attempts.needs_fold();
        if folded {
            let base = self.fold_base(cluster, session, &next).await?;
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
                // The catalog follows, so that the next sync reads the session again. One that
                // lags is made up by the catalog function's sweep, which reads every manifest
                // (`iceberg::sessions`).
                if let Err(err) =
                    catalog::note_manifest(&self.storage, cluster, session, next.sequence).await
                {
                    tracing::warn!(error = %err, "the catalog does not show the tidied manifest");
                }
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

    /// Drops from `next` the retired files whose grace period is over; returns how many.
    /// They are deleted once `next` has landed ([`Compactor::delete_expired`]).
    pub(in crate::compact) fn prune_retired(&self, next: &mut Manifest) -> usize {
        let grace = i64::try_from(self.settings.retire_grace.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms().saturating_sub(grace);
        let before = next.retired.len();
        next.retired.retain(|file| file.retired_at_ms > cutoff);
        before - next.retired.len()
    }
}
