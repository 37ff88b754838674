//! Storage that fails the way S3 fails in production, wrapped around a real backend: the
//! faults are injected at the `Storage` boundary, the objects still live in the real store.
//! Beside them, storage that only watches ([`RecordsRequests`]) or holds reads back. A wrapper per
//! file:
//!
//! - writes that fail: [`LosesConditionalResponses`] (a lost response after the write landed),
//!   [`CommitsAfterRead`] (another writer between a read and its conditional write),
//!   [`UnreliableManifestWrites`] (every way a conditional `PutObject` ends), [`Refuses`]
//!   (a full disk or an outage) and [`SlowWrites`];
//! - reads that wait or race: [`HeldReads`], [`SweepsBetweenListAndRead`];
//! - storage that watches: [`RecordsRequests`].

mod commits_after_read;
mod held_reads;
mod lost_responses;
mod records_requests;
mod refuses;
mod slow_writes;
mod sweeps;
mod unreliable_manifests;

pub use commits_after_read::CommitsAfterRead;
pub use held_reads::HeldReads;
pub use lost_responses::LosesConditionalResponses;
pub use records_requests::RecordsRequests;
pub use refuses::Refuses;
pub use slow_writes::SlowWrites;
pub use sweeps::SweepsBetweenListAndRead;
pub use unreliable_manifests::{UnreliableManifestWrites, WriteFate};
