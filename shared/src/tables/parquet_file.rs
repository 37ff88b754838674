//! Parquet files written from Arrow batches in Rust, for the files compaction writes from rows
//! it holds as Arrow already: each run's delta, rollups, and the bases folds merge
//! ([`super::merged`]). DuckDB reads them as it reads its own: the same types, row groups and
//! row-group statistics. Unlike DuckDB's, they have no bloom filters (DuckDB writes them for
//! dictionary-encoded columns and may skip row groups by them; lookups go through key indexes
//! instead, and a 10 M base written here answered every route as fast as DuckDB's or faster,
//! docs/performance.md) and their text statistics are cut to 64 bytes (still bounds).
//!
//! DuckDB's `COPY … TO` costs per value: a run's delta (126 637 rows of 81 columns) took it
//! 0.34-0.40 s from a staged table, after 0.2-0.3 s staging the rows into it. Written here from
//! the Arrow batches themselves: 0.16 s, and 1 % smaller (the same ZSTD level, integers
//! delta-encoded as DuckDB encodes them; docs/performance.md).

use std::fs::File;
use std::path::{Path, PathBuf};

use duckdb::arrow::datatypes::{DataType, SchemaRef};
use duckdb::arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use super::task_attempts::TableError;

/// ZSTD's level, DuckDB's default, which every other file is written with.
const ZSTD_LEVEL: i32 = 3;

/// How a kind of file is written.
pub(crate) struct Layout {
    /// Rows per row group (the last may have fewer).
    pub(crate) row_group_rows: usize,
    /// Text columns holding a value (nearly) once each, as ids do: a dictionary of them is as
    /// large as they are.
    pub(crate) unique: &'static [&'static str],
}

/// A Parquet file being written, batch by batch, in the order given. Its errors name it.
pub(crate) struct ParquetFile {
    path: PathBuf,
    writer: ArrowWriter<File>,
}

impl ParquetFile {
    /// Creates (or replaces) the file at `path` for rows of `schema`, laid out as `layout`
    /// says.
    pub(crate) fn create(
        path: &Path,
        schema: SchemaRef,
        layout: &Layout,
    ) -> Result<Self, TableError> {
        Self::open(path, schema, layout).map_err(|source| TableError::Write {
            path: path.to_owned(),
            source,
        })
    }

    fn open(path: &Path, schema: SchemaRef, layout: &Layout) -> Result<Self, ParquetError> {
        let file = File::create(path)?;
        let mut properties = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL)?))
            // Version 1 pages, as DuckDB writes: a version 2 page keeps its null flags out of
            // the compressed bytes, and a mostly null column (an actor id) took half again as
            // much room. Encodings are set per column below either way.
            .set_writer_version(WriterVersion::PARQUET_1_0)
            .set_max_row_group_row_count(Some(layout.row_group_rows))
            // Row groups' minimum and maximum are what DuckDB skips them by; pages' are unused.
            .set_statistics_enabled(EnabledStatistics::Chunk);
        for field in schema.fields() {
            // Times, sizes and offsets, nearly all distinct: a dictionary of them is as large
            // as the values (the delta above was 10.8 MB with one, 7.4 without).
            if matches!(field.data_type(), DataType::Int64) {
                let column = ColumnPath::from(field.name().as_str());
                properties = properties
                    .set_column_dictionary_enabled(column.clone(), false)
                    .set_column_encoding(column, Encoding::DELTA_BINARY_PACKED);
            }
        }
        for name in layout.unique {
            // As DuckDB encodes them, lengths then bytes: 4 % smaller than a dictionary that
            // falls back (docs/performance.md).
            let column = ColumnPath::from(*name);
            properties = properties
                .set_column_dictionary_enabled(column.clone(), false)
                .set_column_encoding(column, Encoding::DELTA_LENGTH_BYTE_ARRAY);
        }
        // DuckDB reads the Parquet schema; the Arrow one would only add bytes.
        let options = ArrowWriterOptions::new()
            .with_properties(properties.build())
            .with_skip_arrow_metadata(true);
        Ok(Self {
            path: path.to_owned(),
            writer: ArrowWriter::try_new_with_options(file, schema, options)?,
        })
    }

    /// Appends `batch`'s rows.
    pub(crate) fn write(&mut self, batch: &RecordBatch) -> Result<(), TableError> {
        self.writer
            .write(batch)
            .map_err(|source| self.failed(source))
    }

    /// Writes the footer and closes the file. Returns the rows written.
    pub(crate) fn finish(mut self) -> Result<u64, TableError> {
        let path = std::mem::take(&mut self.path);
        let metadata = self
            .writer
            .close()
            .map_err(|source| TableError::Write { path, source })?;
        Ok(metadata
            .row_groups()
            .iter()
            .map(|group| group.num_rows().unsigned_abs())
            .sum())
    }

    /// `source` as this file's failure.
    fn failed(&self, source: ParquetError) -> TableError {
        TableError::Write {
            path: self.path.clone(),
            source,
        }
    }
}
