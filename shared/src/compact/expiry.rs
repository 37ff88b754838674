//! Table retention, done by compaction: a session whose newest event is older than the
//! retention leaves the tables whole, in the order readers tolerate — its manifest first
//! (readers then see an empty session), then its catalog entry. Its files are retired in that
//! manifest, not deleted: the session's quiet check deletes them once the grace period is over
//! ([`Compactor::tidy_if_quiet`]), as it does the files a fold replaced, so a query already
//! reading the session, or an Iceberg reader on a snapshot from before the expiry, keeps them.
//!
//! The manifest is not deleted but replaced by an empty one, conditionally on the version read:
//! a compaction committing into the session meanwhile makes that write fail, and the session is
//! kept; one committing afterwards builds on the empty manifest, so nothing it writes is
//! orphaned. The empty manifest (a few hundred bytes) stays: the storage API has no conditional
//! delete, and an unconditional one could remove a commit made on top of it.
//!
//! The session's shipped logs go with it, once its manifest is expired and before its catalog
//! entry: nothing reads a session's logs but through the tables, and a run that stops part-way
//! finds the session in the catalog again and finishes.
//!
//! Never an S3 age rule on `tables/`: such a rule deletes files by their write time, under a
//! live manifest, and a long-lived session's rarely rewritten files (its base, its nodes and
//! jobs) would vanish while the session is still read and written.

use std::time::Duration;

use super::schedule::quiet::QuietCheck;
use super::{CompactError, Compactor};
use crate::keys::{self, ClusterName, SessionName};
use crate::storage::{ObjectKey, Storage};
use crate::tables::manifest::Commit;
use crate::tables::{catalog, manifest};

impl Compactor {
    /// Removes every session whose newest event is older than `retention` before `now_ms`;
    /// returns each as the quiet check that deletes its files once their grace period is over.
    /// A session with no event time is kept. Reads every cluster's catalog document (see
    /// [`catalog::load`]).
    #[tracing::instrument(name = "expire", skip(self))]
    pub async fn expire_sessions(
        &self,
        retention: Duration,
        now_ms: i64,
    ) -> Result<Vec<QuietCheck>, CompactError> {
        let keep_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms.saturating_sub(keep_ms);
        let catalog = catalog::load(self.storage()).await?;
        let mut expired = Vec::new();
        for (cluster, sessions) in &catalog.clusters {
            let expired_before = expired.len();
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
                if let Some(check) = self
                    .expire_session(&cluster, &session, cutoff, now_ms)
                    .await?
                {
                    expired.push(check);
                }
            }
            // The cluster's rollup counts the sessions just removed until it is counted again.
            if expired.len() > expired_before
                && let Ok(cluster) = ClusterName::new(cluster)
            {
                self.roll_up_after(&cluster).await;
            }
        }
        if !expired.is_empty() {
            tracing::info!(
                expired = expired.len(),
                "sessions past the retention removed"
            );
        }
        Ok(expired)
    }

    /// Removes one session unless it was written since the catalog was read; its quiet check
    /// if removed.
    async fn expire_session(
        &self,
        cluster: &ClusterName,
        session: &SessionName,
        cutoff: i64,
        now_ms: i64,
    ) -> Result<Option<QuietCheck>, CompactError> {
        let storage = &**self.storage();
        let key = keys::manifest_key(cluster, session)?;
        let read = manifest::load(storage, &key).await?;
        let current = read.manifest;
        if current.stats.last_ms.is_some_and(|last| last >= cutoff) {
            tracing::info!(%cluster, %session, "events arrived since the catalog was read; kept");
            return Ok(None);
        }
        let mut sequence = current.sequence;
        if read.etag.is_some() {
            let expired = current.expired(now_ms);
            if manifest::commit(storage, &key, &expired, read.etag.as_ref(), &[]).await?
                == Commit::Lost
            {
                tracing::info!(%cluster, %session, "written while expiring; kept");
                return Ok(None);
            }
            sequence = expired.sequence;
        }
        let logs = delete_logs(storage, cluster, session).await?;
        catalog::forget(self.storage(), cluster, session, cutoff).await?;
        tracing::info!(%cluster, %session, logs, "session expired");
        Ok(Some(QuietCheck {
            cluster: cluster.clone(),
            session: session.clone(),
            sequence,
        }))
    }
}

/// Deletes every log object shipped for `session` (segments and indexes of all its nodes);
/// returns how many.
async fn delete_logs(
    storage: &dyn Storage,
    cluster: &ClusterName,
    session: &SessionName,
) -> Result<usize, CompactError> {
    let listed: Vec<ObjectKey> = storage
        .list(&keys::session_logs_prefix(cluster, session))
        .await?
        .into_iter()
        .map(|meta| meta.key)
        .collect();
    storage.delete_all(&listed).await?;
    Ok(listed.len())
}
