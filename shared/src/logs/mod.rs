//! Ray's log files after the cluster is gone (docs/architecture.md, "Logs"): [`ship`] (the
//! shipper's own crate, which builds without DuckDB) follows one node's session logs and sends
//! what is appended, [`store`] keeps the pieces and reads any byte
//! range back, and [`markers`] cuts one task's output out of a range by Ray's marker lines.

pub mod markers;
pub use ship_logs::ship;
pub mod store;
