//! The Parquet mechanics: files written from Arrow batches in Rust with the parquet crate, for
//! the files compaction writes from rows it holds as Arrow already: each run's delta, rollups,
//! key indexes, and the bases folds interleave ([`crate::compact::fold`]).
//!
//! DuckDB reads them as it reads its own: the same types, row groups and row-group statistics.
//! Unlike DuckDB's, they have no bloom filters (DuckDB writes them for dictionary-encoded
//! columns and may skip row groups by them; lookups go through key indexes instead) and their
//! text statistics are cut to 64 bytes (still bounds). DuckDB's `COPY … TO` costs per value,
//! after the rows are staged into a table; written here from the Arrow batches themselves, a
//! run's delta takes a fraction of that time and is no larger (the same ZSTD level, integers
//! delta-encoded as DuckDB encodes them).
//!
//! - `file`: [`ParquetFile`], a file being written, as a [`Layout`] says.
//! - `lanes`: a row group's columns encoded on several threads, when the writing thread would
//!   otherwise set the pace (a fold's base).
//! - `arrow_rows`: [`ArrowRows`], rows filled as Arrow columns one row at a time, for the
//!   parquet crate and for DuckDB's appender.

mod arrow_rows;
mod file;
mod lanes;

pub(crate) use self::arrow_rows::ArrowRows;
pub(crate) use self::file::{Layout, ParquetFile};
