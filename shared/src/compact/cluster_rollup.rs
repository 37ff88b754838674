//! Rolling up a cluster: its ended sessions' rollups summed into the cluster's rollup
//! ([`crate::tables::cluster_rollup`]), after a quiet check, a fold of every session, or an
//! expiry. Each roll-up adds the sessions that ended since the last one to the rollup it finds;
//! one that no longer holds (a session it counts changed or expired) is counted again from every
//! ended session. Derived data: a roll-up that fails or loses a race leaves readers reading the
//! sessions' own rollups, and the next one tries again.

use std::collections::BTreeMap;

use ulid::Ulid;

use super::scratch::run_blocking;
use super::{CompactError, Compactor, now_ms};
use crate::keys::{self, ClusterName, SessionName};
use crate::storage::ObjectKey;
use crate::tables::cluster_rollup::{self, ClusterRollup};
use crate::tables::manifest::{self, RetiredFile};
use crate::tables::{catalog, rollup};

/// What a roll-up did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RolledUp {
    /// A new rollup is named in the cluster's catalog document (or the old one was dropped).
    pub written: bool,
    /// Sessions the named rollup counts.
    pub sessions: usize,
    /// Of those, sessions counted by this roll-up (the others were in the rollup it started
    /// from).
    pub added: usize,
}

impl Compactor {
    /// Brings the rollup of `cluster` up to its ended sessions (see the module's doc). A session
    /// whose manifest or catalog entry does not yet say which compaction it is at, or one of
    /// whose files has no rollup this build reads, waits for a later roll-up.
    #[tracing::instrument(name = "roll_up_cluster", skip(self), fields(cluster = %cluster))]
    pub async fn roll_up_cluster(&self, cluster: &ClusterName) -> Result<RolledUp, CompactError> {
        let document = catalog::load_cluster(&*self.storage, cluster).await?;
        let read = document.rollup.clone();
        let ended = cluster_rollup::ended(&document.sessions);
        let start = read.as_ref().filter(|rollup| {
            rollup.holds(&document.sessions)
                && rollup.counts.keys().all(|session| ended.contains(&session))
        });
        let mut counts: BTreeMap<String, u64> = start
            .map(|rollup| rollup.counts.clone())
            .unwrap_or_default();
        let mut sources: Vec<ObjectKey> =
            start.map(|rollup| rollup.key.clone()).into_iter().collect();
        let mut added = 0;
        for session in ended {
            if counts.contains_key(session) {
                continue;
            }
            let Ok(name) = SessionName::new(session) else {
                tracing::warn!(
                    session,
                    "the catalog names an invalid session; not rolled up"
                );
                continue;
            };
            let current = manifest::load(&*self.storage, &keys::manifest_key(cluster, &name)?)
                .await?
                .manifest;
            let recorded = document
                .sessions
                .get(session)
                .and_then(|stats| stats.sequence);
            let (Some(sequence), Some(rollups)) =
                (current.stats.sequence, current.task_attempts.rollups())
            else {
                continue;
            };
            // The catalog says the sequence readers compare; a commit it has not recorded yet
            // is counted by the next roll-up.
            if recorded != Some(sequence) {
                continue;
            }
            counts.insert(session.clone(), sequence);
            sources.extend(rollups.into_iter().cloned());
            added += 1;
        }
        let sessions = counts.len();
        if (start.is_some() && added == 0) || (read.is_none() && counts.is_empty()) {
            return Ok(RolledUp {
                written: false,
                sessions,
                added,
            });
        }
        let mut retired = read
            .as_ref()
            .map(|rollup| rollup.retired.clone())
            .unwrap_or_default();
        retired.extend(read.as_ref().map(|rollup| RetiredFile {
            key: rollup.key.clone(),
            retired_at_ms: now_ms(),
        }));
        let grace = i64::try_from(self.settings.retire_grace.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms().saturating_sub(grace);
        let (kept, expired): (Vec<RetiredFile>, Vec<RetiredFile>) = retired
            .into_iter()
            .partition(|file| file.retired_at_ms > cutoff);
        let next_retired = if counts.is_empty() {
            kept.clone()
        } else {
            Vec::new()
        };
        let next = if counts.is_empty() {
            None
        } else {
            match self.write_cluster_rollup(cluster, &sources).await? {
                Some((key, bytes)) => Some(ClusterRollup {
                    key,
                    bytes,
                    counts,
                    retired: kept,
                }),
                None => {
                    return Ok(RolledUp::default());
                }
            }
        };
        let read_key = read.as_ref().map(|rollup| &rollup.key);
        let named = catalog::name_rollup(&self.storage, cluster, read_key, next.as_ref()).await?;
        let unused: Vec<ObjectKey> = if named {
            // A cluster left without a rollup has nowhere to keep its retired files: they go
            // now, and a reader still at one reads without it (a file gone costs its rows).
            let gone = if next.is_none() {
                kept_keys(&next_retired)
            } else {
                Vec::new()
            };
            expired
                .into_iter()
                .map(|file| file.key)
                .chain(gone)
                .collect()
        } else {
            next.iter().map(|rollup| rollup.key.clone()).collect()
        };
        for key in &unused {
            self.cache.forget(key).await;
        }
        self.delete_unreferenced(&unused).await;
        tracing::info!(named, sessions, added, "rolled up a cluster");
        Ok(RolledUp {
            written: named,
            sessions: if named { sessions } else { 0 },
            added: if named { added } else { 0 },
        })
    }

    /// Rolls up `cluster` after work that may have ended or changed one of its sessions; a
    /// roll-up that fails is only logged (see the module's doc).
    pub(super) async fn roll_up_after(&self, cluster: &ClusterName) {
        if let Err(err) = self.roll_up_cluster(cluster).await {
            tracing::warn!(cluster = %cluster, error = %err, "cluster not rolled up; readers read its sessions' own rollups");
        }
    }

    /// Sums the rollups at `sources` into a new rollup file of `cluster`; returns its key and
    /// size, or `None` when they do not sum exactly (logged; the sessions are then read by their
    /// own rollups).
    async fn write_cluster_rollup(
        &self,
        cluster: &ClusterName,
        sources: &[ObjectKey],
    ) -> Result<Option<(ObjectKey, u64)>, CompactError> {
        let fetched = self.fetch_keys(sources.iter()).await?;
        let paths = fetched.files().clone();
        let key = keys::cluster_rollup_key(cluster, Ulid::new())?;
        let path = self
            .scratch
            .join(format!("cluster-rollup-{}.parquet", Ulid::new()));
        let write_path = path.clone();
        let summed = run_blocking(move || {
            let connection = crate::tables::open_duckdb()?;
            Ok(rollup::write_cluster_sum(&connection, &paths, &write_path))
        })
        .await?;
        drop(fetched);
        if let Err(err) = summed {
            tracing::warn!(error = %err, "the cluster's rollups do not sum exactly; not rolled up");
            let _ = tokio::fs::remove_file(&path).await;
            return Ok(None);
        }
        let bytes = self.upload(&path, &key).await;
        let _ = tokio::fs::remove_file(&path).await;
        Ok(Some((key, bytes?)))
    }
}

/// The keys of `files`.
fn kept_keys(files: &[RetiredFile]) -> Vec<ObjectKey> {
    files.iter().map(|file| file.key.clone()).collect()
}
