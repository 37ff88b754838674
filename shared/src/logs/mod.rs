//! Ray's log files after the cluster is gone (docs/architecture.md, "Logs"): [`ship`] follows one
//! node's session logs and sends what is appended, [`store`] keeps the pieces and reads any byte
//! range back, and [`markers`] cuts one task's output out of a range by Ray's marker lines.

pub mod markers;
pub mod ship;
pub mod store;
