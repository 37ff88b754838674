//! Table retention, done by compaction: a session whose newest event is older than the
//! retention is removed whole, in the order readers tolerate — its manifest first (readers then
//! see an empty session), then every file the manifest named, then its catalog entry.
//!
//! Never an S3 age rule on `tables/`: such a rule deletes files by their write time, under a
//! live manifest, and a long-lived session's rarely rewritten files (its base, its nodes and
//! jobs) would vanish while the session is still read and written.

use std::time::Duration;

use super::{CompactError, Compactor, catalog, manifest};
use crate::layout::ClusterName;
use crate::storage::ObjectKey;

impl Compactor {
    /// Removes every session whose newest event is older than `retention` before `now_ms`;
    /// returns how many. A session with no event time is kept.
    #[tracing::instrument(name = "expire", skip(self))]
    pub async fn expire_sessions(
        &self,
        retention: Duration,
        now_ms: i64,
    ) -> Result<usize, CompactError> {
        let keep_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms.saturating_sub(keep_ms);
        let (catalog, _) = catalog::load(&**self.storage()).await?;
        let mut expired = 0;
        for (cluster, sessions) in &catalog.clusters {
            for (session, stats) in sessions {
                if stats.last_ms.is_none_or(|last| last >= cutoff) {
                    continue;
                }
                let Ok(cluster) = ClusterName::new(cluster) else {
                    tracing::warn!(%cluster, "catalog names an invalid cluster; left alone");
                    continue;
                };
                self.expire_session(&cluster, session).await?;
                expired += 1;
            }
        }
        if expired > 0 {
            tracing::info!(expired, "sessions past the retention removed");
        }
        Ok(expired)
    }

    async fn expire_session(
        &self,
        cluster: &ClusterName,
        session: &str,
    ) -> Result<(), CompactError> {
        let storage = &**self.storage();
        let key = manifest::manifest_key(cluster, session)?;
        let current = manifest::load(storage, &key).await?.manifest;
        storage.delete(&key).await?;
        let files = current
            .task_attempts
            .all()
            .chain(current.task_profile.all())
            .chain(current.entities.values())
            .map(|file| file.key.as_str())
            .chain(current.retired.iter().map(|file| file.key.as_str()));
        for file in files {
            storage.delete(&ObjectKey::new(file.to_owned())?).await?;
        }
        catalog::forget(storage, cluster, session).await?;
        tracing::info!(%cluster, session, "session expired");
        Ok(())
    }
}
