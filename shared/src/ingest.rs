//! The ingest function's logic: check a POST from Ray, and store its events as one raw object
//! ([`crate::raw::write`]); and store a piece of a node's log file from `afterglow ship-logs`.
//!
//! Ray re-sends a batch on any status ≥ 400, on a connection error, or after 3 s, forever. So a
//! batch is answered `Ok` only once its object is durable, and refused (4xx) only when it is not
//! Ray traffic at all or exceeds the configured size: an array of unknown or malformed events is
//! stored as received, for compaction to quarantine what it cannot read.

use std::sync::Arc;

use crate::auth::ingest::IngestKeys;
use crate::event::{BatchError, split_batch};
use crate::keys::{ClusterName, LogFile};
use crate::logs::store::{ChunkReceipt, LogError, put_chunk};
use crate::raw::write::{self, WriteError};
use crate::storage::{ObjectKey, Storage};

/// The Ray setting that bounds events per POST, named in every size refusal.
pub const RAY_BATCH_SIZE_VARIABLE: &str =
    "RAY_DASHBOARD_AGGREGATOR_AGENT_MAX_EVENT_SEND_BATCH_SIZE";

/// Size bounds of one ingest request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IngestLimits {
    /// Largest accepted body. Lambda's synchronous payload limit is 6 MB, envelope included.
    pub max_body_bytes: usize,
    /// Most events accepted in one body (Ray sends at most 1000 since 2.55, 10 000 before).
    pub max_events: usize,
}

impl Default for IngestLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 5 * 1024 * 1024,
            max_events: 10_000,
        }
    }
}

/// Who may post events.
#[derive(Clone, Debug)]
pub enum IngestAccess {
    /// Only requests presenting the token of the cluster they write to.
    Keys(Arc<IngestKeys>),
    /// Anyone who can reach the listener: only for `serve` bound to loopback.
    Open,
}

/// Why a request was not stored.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// No `token` query parameter.
    #[error(
        "missing ingest token: the export URL ends in ?token=<the cluster's token> \
         (`afterglow export-url --cluster NAME --endpoint URL` prints it)"
    )]
    MissingToken,
    /// A token that is not the cluster's.
    #[error(
        "wrong ingest token for this cluster (each cluster has its own: \
         `afterglow export-url --cluster NAME --endpoint URL` prints its URL)"
    )]
    WrongToken,
    /// The body is larger than [`IngestLimits::max_body_bytes`].
    #[error(
        "request body of {bytes} bytes exceeds the limit of {limit} bytes: lower \
         {RAY_BATCH_SIZE_VARIABLE} on the Ray cluster (1000 is Ray's default since 2.55)"
    )]
    BodyTooLarge {
        /// Body size (or a lower bound of it, when reading stopped at the limit).
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// More events than [`IngestLimits::max_events`].
    #[error(
        "request carries {events} events, more than the limit of {limit}: set \
         {RAY_BATCH_SIZE_VARIABLE}={limit} or lower on the Ray cluster"
    )]
    TooManyEvents {
        /// Events in the body.
        events: usize,
        /// The limit.
        limit: usize,
    },
    /// Not a JSON array: not Ray's export traffic.
    #[error(transparent)]
    NotABatch(#[from] BatchError),
    /// The raw object could not be written ([`WriteError::Storage`]: the request should be
    /// retried; otherwise a bug, never the caller's fault).
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// What was stored for one accepted request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngestReceipt {
    /// The raw object written; `None` for an empty batch, which stores nothing.
    pub key: Option<ObjectKey>,
    /// Events stored.
    pub events: usize,
    /// Compressed bytes written.
    pub stored_bytes: usize,
}

/// The ingest service: configuration plus the storage it writes to.
#[derive(Clone, Debug)]
pub struct Ingestor {
    storage: Arc<dyn Storage>,
    access: IngestAccess,
    limits: IngestLimits,
}

impl Ingestor {
    /// An ingestor writing to `storage`.
    pub fn new(storage: Arc<dyn Storage>, access: IngestAccess, limits: IngestLimits) -> Self {
        Self {
            storage,
            access,
            limits,
        }
    }

    /// The size limits in force.
    pub fn limits(&self) -> IngestLimits {
        self.limits
    }

    /// Checks the token a request to write `cluster`'s history presented.
    pub async fn authorize(
        &self,
        cluster: &ClusterName,
        presented: Option<&str>,
    ) -> Result<(), IngestError> {
        match (&self.access, presented) {
            (IngestAccess::Open, _) => Ok(()),
            (IngestAccess::Keys(_), None) => Err(IngestError::MissingToken),
            (IngestAccess::Keys(keys), Some(presented)) => {
                if keys.admits(cluster, presented).await {
                    Ok(())
                } else {
                    Err(IngestError::WrongToken)
                }
            }
        }
    }

    /// Stores an authorized request body for `cluster` as one raw object, returning only once it
    /// is durable.
    #[tracing::instrument(name = "ingest", skip(self, body), fields(cluster = %cluster, bytes = body.len(), events))]
    pub async fn ingest(
        &self,
        cluster: &ClusterName,
        body: &[u8],
    ) -> Result<IngestReceipt, IngestError> {
        if body.len() > self.limits.max_body_bytes {
            return Err(IngestError::BodyTooLarge {
                bytes: body.len(),
                limit: self.limits.max_body_bytes,
            });
        }
        let events = split_batch(body)?;
        tracing::Span::current().record("events", events.len());
        if events.len() > self.limits.max_events {
            return Err(IngestError::TooManyEvents {
                events: events.len(),
                limit: self.limits.max_events,
            });
        }
        if events.is_empty() {
            return Ok(IngestReceipt {
                key: None,
                events: 0,
                stored_bytes: 0,
            });
        }
        let write::Stored {
            key,
            bytes: stored_bytes,
        } = write::store(&*self.storage, cluster, &events, body.len()).await?;
        tracing::info!(key = %key, stored_bytes, "stored raw batch");
        Ok(IngestReceipt {
            key: Some(key),
            events: events.len(),
            stored_bytes,
        })
    }

    /// Stores an authorized piece of a node's log file (`POST /v1/logs/{cluster}`), returning
    /// only once it is durable; see [`put_chunk`] for re-sends and rewritten files.
    pub async fn ingest_log_chunk(
        &self,
        file: &LogFile,
        offset: u64,
        bytes: &[u8],
    ) -> Result<ChunkReceipt, LogError> {
        put_chunk(&*self.storage, file, offset, bytes).await
    }
}
