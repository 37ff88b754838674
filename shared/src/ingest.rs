//! The ingest function's logic: check a POST from Ray, and store its events as one raw object
//! ([`crate::raw::write`]); and store a piece of a node's log file from `afterglow ship-logs`.
//!
//! Ray re-sends a batch on any status ≥ 400, on a connection error, or after 3 s, forever. So a
//! batch is answered `Ok` only once its object is durable, and refused (4xx) only when it is not
//! Ray traffic at all, exceeds the configured size, or starts sessions faster than its cluster's
//! budget ([`sessions`]): an array of unknown or malformed events is stored as received, for
//! compaction to quarantine what it cannot read. Events are not parsed here beyond their session
//! name.

pub mod sessions;

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::auth::ingest::IngestKeys;
use crate::event::{BatchError, RayEvent, split_batch};
use crate::keys::{ClusterName, NodeLogs};
use crate::logs::queue::LogQueue;
use crate::logs::queue::route::queue_or_store;
use crate::logs::store::{LogError, PieceOutcome, ReadPiece, put_pieces};
use crate::raw::write::{self, WriteError};
use crate::storage::{ObjectKey, Storage};
use sessions::{REMEMBERED_SESSIONS, SessionAdmission};

/// The Ray setting that bounds events per POST, named in every size refusal.
pub const RAY_BATCH_SIZE_VARIABLE: &str =
    "RAY_DASHBOARD_AGGREGATOR_AGENT_MAX_EVENT_SEND_BATCH_SIZE";

/// The setting that bounds new sessions per cluster per minute, named in its refusal.
pub const NEW_SESSIONS_VARIABLE: &str = "AFTERGLOW_NEW_SESSIONS_PER_MINUTE";

/// Most distinct sessions one body may carry. Ray runs one aggregator agent per node and
/// session, so each of its bodies carries one; the margin is for hand-made traffic.
pub const MAX_SESSIONS_PER_BODY: usize = 4;

/// Bounds of ingest requests: the size of one, and how fast a cluster may start sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IngestLimits {
    /// Largest accepted body. Lambda's synchronous payload limit is 6 MB, envelope included.
    pub max_body_bytes: usize,
    /// Most events accepted in one body (Ray sends at most 1000 since 2.55, 10 000 before).
    pub max_events: usize,
    /// Most sessions a cluster may start per minute on one ingest instance (a Ray cluster
    /// starts one at each `ray start`); see [`sessions`].
    pub new_sessions_per_minute: usize,
}

impl Default for IngestLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 5 * 1024 * 1024,
            max_events: 10_000,
            new_sessions_per_minute: 30,
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
    /// Events of more than [`MAX_SESSIONS_PER_BODY`] sessions: not Ray's export traffic.
    #[error(
        "request carries events of {sessions} sessions, more than the limit of {limit}: Ray's \
         aggregator agent sends the events of one session per request"
    )]
    TooManySessions {
        /// Distinct session names in the body.
        sessions: usize,
        /// The limit.
        limit: usize,
    },
    /// The body would start more sessions for its cluster than
    /// [`IngestLimits::new_sessions_per_minute`] allows.
    #[error(
        "request starts {new_sessions} new sessions for this cluster, past the limit of {limit} \
         new sessions per cluster per minute on this ingest instance ({NEW_SESSIONS_VARIABLE}): \
         retry in {retry_after_secs} s"
    )]
    SessionFlood {
        /// Sessions of the body this instance had not seen for the cluster.
        new_sessions: usize,
        /// The limit.
        limit: usize,
        /// Whole seconds until the body would be admitted (at least 1).
        retry_after_secs: u64,
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

/// The ingest service: configuration plus the storage it writes to, and the sessions it has
/// seen (shared by its clones).
#[derive(Clone, Debug)]
pub struct Ingestor {
    storage: Arc<dyn Storage>,
    access: IngestAccess,
    limits: IngestLimits,
    admission: Arc<SessionAdmission>,
    /// Where log requests go when they need not be stored at once (AWS); `None` stores each.
    log_queue: Option<Arc<dyn LogQueue>>,
}

impl Ingestor {
    /// An ingestor writing to `storage`.
    pub fn new(storage: Arc<dyn Storage>, access: IngestAccess, limits: IngestLimits) -> Self {
        Self {
            storage,
            access,
            limits,
            admission: Arc::new(SessionAdmission::new(
                limits.new_sessions_per_minute,
                REMEMBERED_SESSIONS,
            )),
            log_queue: None,
        }
    }

    /// The same ingestor, queueing log requests on `queue` ([`crate::logs::queue`]).
    #[must_use]
    pub fn with_log_queue(mut self, queue: Arc<dyn LogQueue>) -> Self {
        self.log_queue = Some(queue);
        self
    }

    /// The limits in force.
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
    pub async fn ingest(
        &self,
        cluster: &ClusterName,
        body: &[u8],
    ) -> Result<IngestReceipt, IngestError> {
        self.ingest_at(cluster, body, Instant::now()).await
    }

    /// [`Ingestor::ingest`] at `now`, the time the cluster's budget of new sessions is counted
    /// at (tests move it).
    #[tracing::instrument(name = "ingest", skip(self, body, now), fields(cluster = %cluster, bytes = body.len(), events))]
    pub async fn ingest_at(
        &self,
        cluster: &ClusterName,
        body: &[u8],
        now: Instant,
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
        let named = session_names(&events);
        if named.len() > MAX_SESSIONS_PER_BODY {
            return Err(IngestError::TooManySessions {
                sessions: named.len(),
                limit: MAX_SESSIONS_PER_BODY,
            });
        }
        let names: Vec<&str> = named.iter().map(|name| &**name).collect();
        self.admission
            .admit(cluster, &names, now)
            .map_err(|over| IngestError::SessionFlood {
                new_sessions: over.new_sessions,
                limit: self.admission.per_window(),
                retry_after_secs: whole_seconds(over.retry_after),
            })?;
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

    /// Stores or queues an authorized request's pieces of a node's log files
    /// (`POST /v1/logs/{cluster}`), returning only once they are durable; see [`put_pieces`]
    /// for re-sends and rewritten files, and [`queue_or_store`] for which are queued.
    pub async fn ingest_log_pieces(
        &self,
        node: &NodeLogs,
        pieces: &[ReadPiece<'_>],
    ) -> Result<Vec<PieceOutcome>, LogError> {
        match &self.log_queue {
            Some(queue) => {
                let sent_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |since| {
                        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
                    });
                queue_or_store(&*self.storage, &**queue, node, pieces, sent_ms).await
            }
            None => put_pieces(&*self.storage, node, pieces).await,
        }
    }
}

/// The one field of an event ingest reads: its session, in either key form, as serde reads it
/// into [`RayEvent`] (an escaped name is unescaped, so it counts as compaction will see it).
#[derive(Deserialize)]
struct SessionOf<'a> {
    #[serde(borrow, default, rename = "sessionName", alias = "session_name")]
    session_name: Cow<'a, str>,
}

/// The distinct sessions named by `events`. An event naming none, or an empty one, counts for
/// none: compaction sets it aside rather than starting a session for it.
fn session_names<'a>(events: &[&'a RawValue]) -> BTreeSet<Cow<'a, str>> {
    let mut names = BTreeSet::new();
    for &event in events {
        let text = event.get();
        let name = if text.trim_start().starts_with('[') {
            // serde reads a struct from an array too, by field position, and so does
            // compaction: such an event (never Ray's) is read the way compaction reads it.
            RayEvent::from_json(text)
                .ok()
                .map(|event| Cow::Owned(event.session_name))
        } else {
            serde_json::from_str::<SessionOf<'a>>(text)
                .ok()
                .map(|event| event.session_name)
        };
        if let Some(name) = name.filter(|name| !name.is_empty()) {
            names.insert(name);
        }
    }
    names
}

/// `duration` in whole seconds, rounded up, at least 1: what a `Retry-After` header carries.
fn whole_seconds(duration: Duration) -> u64 {
    let seconds = duration
        .as_secs()
        .saturating_add(u64::from(duration.subsec_nanos() > 0));
    seconds.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(body: &str) -> Result<Vec<String>, BatchError> {
        let events = split_batch(body.as_bytes())?;
        Ok(session_names(&events)
            .into_iter()
            .map(Cow::into_owned)
            .collect())
    }

    #[test]
    fn sessions_are_read_as_compaction_reads_them() -> Result<(), BatchError> {
        let body = r#"[
            {"eventType": "TASK_LIFECYCLE_EVENT", "sessionName": "session_a", "x": [[[1]]]},
            {"event_type": "TASK_LIFECYCLE_EVENT", "session_name": "session_b"},
            {"sessionName": "session_\u0063"},
            {"sessionName": "session_a"},
            [null, "CORE_WORKER", "FROM_THE_FUTURE_EVENT", null, "INFO", "", "session_d", null],
            {"sessionName": ""}, {"eventType": "X"}, {"sessionName": 7}, 42, "text", null, []
        ]"#;
        assert_eq!(
            names(body)?,
            ["session_a", "session_b", "session_c", "session_d"]
        );
        Ok(())
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1_001)), 2);
        assert_eq!(whole_seconds(Duration::from_secs(60)), 60);
    }
}
