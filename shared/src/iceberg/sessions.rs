//! The sessions a sync publishes: every session the catalog lists, and the manifests of those a
//! table's current snapshot may not reflect.
//!
//! A sync requested after a commit reads only the manifests of sessions whose catalog entry
//! records a newer manifest ([`manifest::SessionStats::manifest_sequence`]) than the one the
//! table publishes, or records none, and of those the table does not publish unless the
//! catalog shows they have no rows in it ([`manifest::SessionStats::entity_tables`]): a
//! history of a thousand sessions costs the catalog's documents and the few manifests that
//! moved, not a thousand reads per table. The catalog is written after the manifest, so it can
//! lag (a record that failed after its commit landed); the catalog function's scheduled sweep
//! reads every manifest ([`Reads::Every`]) and so publishes within one sweep whatever a
//! lagging entry hid, as the grace of retired files assumes ([`super::RETIRED_FILE_GRACE`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tokio::sync::Mutex;

use super::IcebergError;
use super::avro::Partition;
use super::sync::PublishedSession;
use crate::keys::{ClusterName, SessionName};
use crate::storage::Storage;
use crate::tables::catalog;
use crate::tables::manifest::{self, Manifest};
use crate::tables::published::{PublishedTable, Source};

/// Which sessions' manifests a sync reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reads {
    /// Every session's, whatever the catalog says: the scheduled sweep's.
    Every,
    /// Those the catalog shows moved since the table published them (see the module's doc):
    /// a sync requested after a commit.
    Changed,
}

/// A session as our manifest has it now.
pub(super) struct Session {
    pub(super) cluster: ClusterName,
    pub(super) session: SessionName,
    pub(super) manifest: Manifest,
}

impl Session {
    pub(super) fn partition(&self) -> Partition {
        partition(&self.cluster, &self.session)
    }

    /// The manifest's version, and that of the compaction run that last changed its rows.
    pub(super) fn versions(&self) -> (u64, u64) {
        let sequence = self.manifest.sequence;
        (sequence, self.manifest.stats.sequence.unwrap_or(sequence))
    }
}

/// A session the catalog lists.
struct Listed {
    cluster: ClusterName,
    session: SessionName,
    /// The manifest sequence the catalog records of it, if it does.
    recorded: Option<u64>,
    /// The entity tables the catalog records it has rows in, if it does.
    entity_tables: Option<BTreeSet<String>>,
}

/// Every session the catalog lists, with the manifests read of them so far (shared by the
/// tables of one publish).
pub(super) struct Sessions {
    listed: Vec<Listed>,
    reads: Reads,
    /// Manifests read, by position in `listed`.
    manifests: Mutex<BTreeMap<usize, Arc<Session>>>,
}

/// Where a listed session stands for one table.
pub(super) enum Standing {
    /// The table's snapshot is current for it, as far as the catalog shows: it publishes the
    /// session at the manifest the catalog records, or the session has no rows in the table.
    Current(Partition),
    /// Its manifest, read.
    Read(Arc<Session>),
}

impl Sessions {
    /// The sessions the catalog lists; with [`Reads::Every`], every manifest is read now.
    pub(super) async fn list(
        storage: &Arc<dyn Storage>,
        reads: Reads,
    ) -> Result<Self, IcebergError> {
        let catalog = catalog::load(storage).await?;
        let mut listed = Vec::new();
        for (cluster, sessions) in &catalog.clusters {
            let Ok(cluster) = ClusterName::new(cluster) else {
                continue;
            };
            for (session, stats) in sessions {
                if let Ok(session) = SessionName::new(session) {
                    listed.push(Listed {
                        cluster: cluster.clone(),
                        session,
                        recorded: stats.manifest_sequence,
                        entity_tables: stats.entity_tables.clone(),
                    });
                }
            }
        }
        let sessions = Self {
            listed,
            reads,
            manifests: Mutex::new(BTreeMap::new()),
        };
        if reads == Reads::Every {
            let all: Vec<usize> = (0..sessions.listed.len()).collect();
            sessions.read(storage, &all).await?;
        }
        Ok(sessions)
    }

    /// Each listed session as it stands against `published` (what `table`'s current snapshot
    /// publishes), in the catalog's order: the manifests it needs are read, in parallel, unless
    /// read before.
    pub(super) async fn against(
        &self,
        storage: &Arc<dyn Storage>,
        table: &PublishedTable,
        published: &BTreeMap<Partition, PublishedSession>,
    ) -> Result<Vec<Standing>, IcebergError> {
        let current = |listed: &Listed| {
            if self.reads == Reads::Every {
                return false;
            }
            match published.get(&partition(&listed.cluster, &listed.session)) {
                Some(before) => listed
                    .recorded
                    .is_some_and(|recorded| before.versions.0 >= recorded),
                None => match table.source {
                    Source::Entities(kind) => listed
                        .entity_tables
                        .as_ref()
                        .is_some_and(|tables| !tables.contains(kind.table())),
                    Source::Attempts => false,
                },
            }
        };
        let needed: Vec<usize> = self
            .listed
            .iter()
            .enumerate()
            .filter(|(_, listed)| !current(listed))
            .map(|(at, _)| at)
            .collect();
        let read = self.read(storage, &needed).await?;
        Ok(self
            .listed
            .iter()
            .enumerate()
            .map(|(at, listed)| match read.get(&at) {
                Some(session) => Standing::Read(Arc::clone(session)),
                None => Standing::Current(partition(&listed.cluster, &listed.session)),
            })
            .collect())
    }

    /// Reads the manifests of the sessions at `positions` not read before; returns every one
    /// of `positions`.
    async fn read(
        &self,
        storage: &Arc<dyn Storage>,
        positions: &[usize],
    ) -> Result<BTreeMap<usize, Arc<Session>>, IcebergError> {
        let mut manifests = self.manifests.lock().await;
        let missing: Vec<usize> = positions
            .iter()
            .copied()
            .filter(|at| !manifests.contains_key(at))
            .collect();
        let named: Vec<(ClusterName, SessionName)> = missing
            .iter()
            .filter_map(|at| self.listed.get(*at))
            .map(|listed| (listed.cluster.clone(), listed.session.clone()))
            .collect();
        let loaded = manifest::load_each(storage, &named).await?;
        for ((at, (cluster, session)), manifest) in missing.into_iter().zip(named).zip(loaded) {
            manifests.insert(
                at,
                Arc::new(Session {
                    cluster,
                    session,
                    manifest,
                }),
            );
        }
        Ok(positions
            .iter()
            .filter_map(|at| Some((*at, Arc::clone(manifests.get(at)?))))
            .collect())
    }
}

/// A session's partition of the published tables.
fn partition(cluster: &ClusterName, session: &SessionName) -> Partition {
    Partition {
        cluster: cluster.as_str().to_owned(),
        session: session.as_str().to_owned(),
    }
}
