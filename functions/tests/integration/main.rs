//! The binary's integration tests, in one test binary: each links the whole of DuckDB, so one
//! link instead of one per file. `cli` runs the real `afterglow` binary; `proxy` holds
//! `afterglow proxy`'s signing to an independent SigV4 implementation; `helpers` tests the
//! library's small helpers, which has no test harness of its own.

mod cli;
mod helpers;
mod proxy;
