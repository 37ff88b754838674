//! Log requests through a queue (docs/architecture.md, "Logs"). On AWS the log ingest function
//! answers a request by queueing its pieces ([`route`]), and the log store function stores each
//! batch of queued requests at once ([`drain`]): one index write per node per batch, and a
//! segment when the index's inline members fill, where storing each request would make up to
//! two. S3 PUTs are most of what a node shipping every 5 s costs; batching them is what keeps
//! it within docs/performance.md's targets.
//! Without a queue (`afterglow serve`, a local folder) ingest stores each request itself.

use async_trait::async_trait;

use crate::keys::NodeLogs;

pub mod drain;
pub mod message;
pub mod route;
pub mod shard;
pub mod sqs;

/// Pieces that could not be queued; the request is answered 503 and the shipper retries it.
#[derive(Debug, thiserror::Error)]
#[error("could not queue log pieces on {queue_url}: {reason}")]
pub struct QueueError {
    /// The queue.
    pub queue_url: String,
    /// What the queue said.
    pub reason: String,
}

/// Where ingest sends the messages of [`message::QueuedPieces`].
#[async_trait]
pub trait LogQueue: Send + Sync + std::fmt::Debug {
    /// Sends one message body of `node`'s, returning once the queue holds it durably.
    async fn send(&self, node: &NodeLogs, message: String) -> Result<(), QueueError>;
}
