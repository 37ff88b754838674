//! Ray's log files after the cluster is gone (DESIGN §4c): [`ship`] follows one node's session
//! logs and sends what is appended, [`store`] keeps the pieces and reads any byte range back.

pub mod ship;
pub mod store;
