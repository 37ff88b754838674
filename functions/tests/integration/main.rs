//! The binary's integration tests, in one test binary: each links the whole of DuckDB, so one
//! link instead of one per file. `cli` runs the real `afterglow` binary; `proxy` holds
//! `afterglow proxy`'s signing to an independent SigV4 implementation.

mod cli;
mod proxy;
