//! Table retention, done by compaction: a session whose newest event is older than the
//! retention is removed whole, in the order readers tolerate — its manifest first (readers then
//! see an empty session), then every file the manifest named, then its catalog entry.
//!
//! The manifest is not deleted but replaced by an empty one, conditionally on the version read:
//! a compaction committing into the session meanwhile makes that write fail, and the session is
//! kept; one committing afterwards builds on the empty manifest, so nothing it writes is
//! orphaned. The empty manifest (a few hundred bytes) stays: the storage API has no conditional
//! delete, and an unconditional one could remove a commit made on top of it.
//!
//! Never an S3 age rule on `tables/`: such a rule deletes files by their write time, under a
//! live manifest, and a long-lived session's rarely rewritten files (its base, its nodes and
//! jobs) would vanish while the session is still read and written.

use std::time::Duration;

use super::{CompactError, Compactor};
use crate::keys::{self, ClusterName, SessionName};
use crate::tables::manifest::{Commit, DataFile, Document as _, Manifest};
use crate::tables::{catalog, manifest};

impl Compactor {
    /// Removes every session whose newest event is older than `retention` before `now_ms`;
    /// returns how many. A session with no event time is kept. Reads every cluster's catalog
    /// document (see [`catalog::load`]).
    #[tracing::instrument(name = "expire", skip(self))]
    pub async fn expire_sessions(
        &self,
        retention: Duration,
        now_ms: i64,
    ) -> Result<usize, CompactError> {
        let keep_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms.saturating_sub(keep_ms);
        let catalog = catalog::load(self.storage()).await?;
        let mut expired = 0;
        for (cluster, sessions) in &catalog.clusters {
            let expired_before = expired;
            for (session, stats) in sessions {
                if stats.last_ms.is_none_or(|last| last >= cutoff) {
                    continue;
                }
                let (Ok(cluster), Ok(session)) =
                    (ClusterName::new(cluster), SessionName::new(session))
                else {
                    tracing::warn!(%cluster, session, "catalog names an invalid session; left alone");
                    continue;
                };
                if self.expire_session(&cluster, &session, cutoff).await? {
                    expired += 1;
                }
            }
            // The cluster's rollup counts the sessions just removed until it is counted again.
            if expired > expired_before
                && let Ok(cluster) = ClusterName::new(cluster)
            {
                self.roll_up_after(&cluster).await;
            }
        }
        if expired > 0 {
            tracing::info!(expired, "sessions past the retention removed");
        }
        Ok(expired)
    }

    /// Removes one session unless it was written since the catalog was read; true if removed.
    async fn expire_session(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        cutoff: i64,
    ) -> Result<bool, CompactError> {
        let storage = &**self.storage();
        let key = keys::manifest_key(cluster, session)?;
        let read = manifest::load(storage, &key).await?;
        let current = read.manifest;
        if current.stats.last_ms.is_some_and(|last| last >= cutoff) {
            tracing::info!(%cluster, %session, "events arrived since the catalog was read; kept");
            return Ok(false);
        }
        if read.etag.is_some() {
            let emptied = Manifest {
                sequence: current.sequence.saturating_add(1),
                ..Manifest::empty()
            };
            if manifest::commit(storage, &key, &emptied, read.etag.as_ref(), &[]).await?
                == Commit::Lost
            {
                tracing::info!(%cluster, %session, "written while expiring; kept");
                return Ok(false);
            }
        }
        let files = current
            .task_attempts
            .all()
            .chain(current.task_profile.all())
            .chain(current.entities.values())
            // With each file its deletion vector, rollup and key index.
            .flat_map(DataFile::keys)
            .chain(current.retired.iter().map(|file| &file.key));
        for file in files {
            storage.delete(file).await?;
        }
        catalog::forget(self.storage(), cluster, session, cutoff).await?;
        tracing::info!(%cluster, %session, "session expired");
        Ok(true)
    }
}
