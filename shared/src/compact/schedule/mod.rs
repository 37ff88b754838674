//! When compaction runs: the schedulers around [`Compactor`](super::Compactor), which itself only
//! compacts the objects and tidies the sessions it is told to.
//!
//! - [`batch`]: a batch of notifications (the compact function's SQS batch) compacted as one
//!   unit, with an answer per message.
//! - [`quiet`]: quiet checks, a session looked at again once it may have gone quiet, and
//!   tidied if no commit came since.
//! - [`check_queue`]: on AWS, the compact function's own queue, where quiet checks wait as
//!   delayed messages and deferred notifications are sent back.
//! - [`queue`]: in `serve`, the in-process stand-in for S3 → SQS → compact, and for the delayed
//!   quiet checks.
//! - [`backlog`]: what `serve` had stored but not compacted when it last stopped.

pub mod backlog;
pub mod batch;
pub mod check_queue;
pub mod queue;
pub mod quiet;
