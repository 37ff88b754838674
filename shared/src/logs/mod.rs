//! Ray's log files after the cluster is gone (docs/architecture.md, "Logs"): [`ship`] (the
//! shipper's own crate, which builds without DuckDB) follows one node's session logs and sends what
//! is appended in requests framed by [`frames`], [`store`] keeps each request's pieces, [`index`]
//! says where each file's bytes are (the newest [`inline`] in it), [`read`] reads any byte range
//! or tail back by that index, and [`markers`] cuts one task's output out of a range by Ray's
//! marker lines. Beside a head node's logs, the shipper stores the cluster's [`metadata`].
//! [`migrate`] moves logs stored in the older layout, an object per shipped piece, into
//! segments and the index.

pub mod index;
pub mod inline;
pub mod markers;
pub mod migrate;
pub mod queue;
pub mod read;
pub use ship_logs::{frames, metadata, ship};
pub mod store;
