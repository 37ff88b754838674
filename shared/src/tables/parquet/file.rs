//! [`ParquetFile`]: a Parquet file written from Arrow batches, in row groups, encodings and
//! compression as its [`Layout`] says.
//!
//! A file is encoded on the thread that writes it, or with its columns spread over several
//! threads ([`super::lanes`]) when that thread would otherwise set the pace (a fold's base). A
//! file on lanes also takes row groups of another file as they are encoded there
//! ([`ParquetFile::copy_row_group`]): a fold copies the base's groups no delta changed.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use duckdb::arrow::datatypes::{DataType, SchemaRef};
use duckdb::arrow::record_batch::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use super::lanes::ColumnLanes;

use crate::tables::TableError;
use crate::tables::columns::{Column, with_field_ids};

/// ZSTD's level, DuckDB's default, which every other file is written with.
const ZSTD_LEVEL: i32 = 3;

/// How a kind of file is written.
pub(crate) struct Layout {
    /// Rows per row group (the last may have fewer).
    pub(crate) row_group_rows: usize,
    /// Text columns holding a value (nearly) once each, as ids do: a dictionary of them is as
    /// large as they are.
    pub(crate) unique: &'static [&'static str],
    /// Integer columns of other types held in order (a key index's keys): delta-encoded, as
    /// every `BIGINT` is, rather than put in a dictionary as large as they are.
    pub(crate) ordered: &'static [&'static str],
    /// The table's columns, whose field ids are written (see [`crate::tables::columns`]);
    /// empty for a file no other engine reads (rollups, key indexes).
    pub(crate) columns: &'static [Column],
}

/// A Parquet file being written, batch by batch, in the order given. Its errors name it.
pub(crate) struct ParquetFile {
    path: PathBuf,
    writer: Writer,
}

/// Where a file's columns are encoded.
enum Writer {
    /// On the thread that writes.
    Here(ArrowWriter<File>),
    /// On lanes of their own.
    Lanes(ColumnLanes),
}

impl ParquetFile {
    /// Creates (or replaces) the file at `path` for rows of `schema`, laid out as `layout`
    /// says, encoded on the thread that writes it.
    pub(crate) fn create(
        path: &Path,
        schema: SchemaRef,
        layout: &Layout,
    ) -> Result<Self, TableError> {
        Self::create_on(path, schema, layout, 1)
    }

    /// As [`ParquetFile::create`], its columns encoded on `threads` threads of their own when
    /// that is more than one and no column is nested (else on the thread that writes).
    pub(crate) fn create_on(
        path: &Path,
        schema: SchemaRef,
        layout: &Layout,
        threads: usize,
    ) -> Result<Self, TableError> {
        Self::create_with(path, schema, layout, (threads > 1).then_some(threads))
    }

    /// As [`ParquetFile::create_on`], on lanes even when `threads` is one (unless a column is
    /// nested), so that [`ParquetFile::copy_row_group`] can append to it.
    pub(crate) fn create_on_lanes(
        path: &Path,
        schema: SchemaRef,
        layout: &Layout,
        threads: usize,
    ) -> Result<Self, TableError> {
        Self::create_with(path, schema, layout, Some(threads))
    }

    /// Creates the file, on `lanes` threads of their own when given (and no column is nested).
    fn create_with(
        path: &Path,
        schema: SchemaRef,
        layout: &Layout,
        lanes: Option<usize>,
    ) -> Result<Self, TableError> {
        Self::open(path, schema, layout, lanes).map_err(|source| TableError::Write {
            path: path.to_owned(),
            source,
        })
    }

    fn open(
        path: &Path,
        schema: SchemaRef,
        layout: &Layout,
        lanes: Option<usize>,
    ) -> Result<Self, ParquetError> {
        let schema = if layout.columns.is_empty() {
            schema
        } else {
            with_field_ids(&schema, layout.columns)
        };
        let file = File::create(path)?;
        let mut properties = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(ZSTD_LEVEL)?))
            // Version 1 pages, as DuckDB writes: a version 2 page keeps its null flags out of
            // the compressed bytes, and a mostly null column (an actor id) takes much more
            // room. Encodings are set per column below either way.
            .set_writer_version(WriterVersion::PARQUET_1_0)
            .set_max_row_group_row_count(Some(layout.row_group_rows))
            // Row groups' minimum and maximum are what DuckDB skips them by; pages' are unused.
            .set_statistics_enabled(EnabledStatistics::Chunk);
        for field in schema.fields() {
            // Times, sizes and offsets, nearly all distinct: a dictionary of them is as large
            // as the values, and delta encoding is smaller.
            if matches!(field.data_type(), DataType::Int64) {
                let column = ColumnPath::from(field.name().as_str());
                properties = properties
                    .set_column_dictionary_enabled(column.clone(), false)
                    .set_column_encoding(column, Encoding::DELTA_BINARY_PACKED);
            }
        }
        for name in layout.ordered {
            let column = ColumnPath::from(*name);
            properties = properties
                .set_column_dictionary_enabled(column.clone(), false)
                .set_column_encoding(column, Encoding::DELTA_BINARY_PACKED);
        }
        for name in layout.unique {
            // As DuckDB encodes them, lengths then bytes: smaller than a dictionary that falls
            // back.
            let column = ColumnPath::from(*name);
            properties = properties
                .set_column_dictionary_enabled(column.clone(), false)
                .set_column_encoding(column, Encoding::DELTA_LENGTH_BYTE_ARRAY);
        }
        // DuckDB reads the Parquet schema; the Arrow one would only add bytes.
        let options = ArrowWriterOptions::new()
            .with_properties(properties.build())
            .with_skip_arrow_metadata(true);
        // A lane pairs each column with one writer: a nested column has several.
        let flat = !schema
            .fields()
            .iter()
            .any(|field| field.data_type().is_nested());
        let whole = ArrowWriter::try_new_with_options(file, Arc::clone(&schema), options)?;
        let writer = match lanes {
            Some(threads) if flat => {
                let (file, factory) = whole.into_serialized_writer()?;
                Writer::Lanes(ColumnLanes::new(
                    file,
                    factory,
                    schema,
                    layout.row_group_rows,
                    threads,
                ))
            }
            _ => Writer::Here(whole),
        };
        Ok(Self {
            path: path.to_owned(),
            writer,
        })
    }

    /// Appends `batch`'s rows.
    pub(crate) fn write(&mut self, batch: &RecordBatch) -> Result<(), TableError> {
        let written = match &mut self.writer {
            Writer::Here(writer) => writer.write(batch),
            Writer::Lanes(lanes) => lanes.write(batch),
        };
        written.map_err(|source| self.failed(source))
    }

    /// Closes the open row group and appends row group `group` of the file `source` (whose
    /// footer, with its offset index, is `metadata`) as it is encoded there, without decoding
    /// it: a fold's base copies the row groups no delta changed (see [`crate::compact::fold`]). Its
    /// columns must be this file's, and the file one on lanes
    /// ([`ParquetFile::create_on_lanes`], no column nested).
    pub(crate) fn copy_row_group(
        &mut self,
        source: &File,
        metadata: &ParquetMetaData,
        group: usize,
    ) -> Result<(), TableError> {
        let copied = match &mut self.writer {
            Writer::Here(_) => Err(ParquetError::General(
                "a file encoded on one thread takes no copied row groups".into(),
            )),
            Writer::Lanes(lanes) => lanes.copy_row_group(source, metadata, group),
        };
        copied.map_err(|source| self.failed(source))
    }

    /// Writes the footer and closes the file. Returns the rows written.
    pub(crate) fn finish(self) -> Result<u64, TableError> {
        let Self { path, writer } = self;
        let closed: Result<ParquetMetaData, ParquetError> = match writer {
            Writer::Here(writer) => writer.close(),
            Writer::Lanes(lanes) => lanes.finish(),
        };
        let metadata = closed.map_err(|source| TableError::Write { path, source })?;
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

#[cfg(test)]
mod tests {
    use duckdb::arrow::array::{ArrayRef, BooleanArray, Int64Array, StringArray};
    use duckdb::arrow::datatypes::{Field, Schema};

    use super::*;

    const LAYOUT: Layout = Layout {
        row_group_rows: 128,
        unique: &["id"],
        ordered: &[],
        columns: &[],
    };

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("state", DataType::Utf8, true),
            Field::new("time", DataType::Int64, true),
            Field::new("done", DataType::Boolean, true),
        ]))
    }

    /// Rows `first..first + count`: unique ids, a few repeated states, nulls in every
    /// nullable column.
    fn batch(first: i64, count: i64) -> Result<RecordBatch, Box<dyn std::error::Error>> {
        let rows = first..first + count;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(
                rows.clone().map(|i| format!("task-{i:08}")),
            )),
            Arc::new(StringArray::from_iter(rows.clone().map(|i| {
                (i % 7 != 0).then(|| ["RUNNING", "FINISHED", "FAILED"][(i % 3) as usize])
            }))),
            Arc::new(Int64Array::from_iter(
                rows.clone()
                    .map(|i| (i % 11 != 0).then_some(i * i % 10_007)),
            )),
            Arc::new(BooleanArray::from_iter(
                rows.map(|i| (i % 5 != 0).then_some(i % 2 == 0)),
            )),
        ];
        Ok(RecordBatch::try_new(schema(), columns)?)
    }

    /// Writes `rows` rows in batches of `per_batch` on `threads` threads; returns the file's
    /// bytes and whether it was written on lanes.
    fn written(
        path: &Path,
        rows: i64,
        per_batch: i64,
        threads: usize,
    ) -> Result<(Vec<u8>, bool), Box<dyn std::error::Error>> {
        let mut file = ParquetFile::create_on(path, schema(), &LAYOUT, threads)?;
        let lanes = matches!(file.writer, Writer::Lanes(_));
        for first in (0..rows).step_by(usize::try_from(per_batch)?) {
            file.write(&batch(first, per_batch.min(rows - first))?)?;
        }
        assert_eq!(file.finish()?, u64::try_from(rows)?);
        Ok((std::fs::read(path)?, lanes))
    }

    /// Row groups' rows in the file at `path`.
    fn row_groups(path: &Path) -> Result<Vec<i64>, Box<dyn std::error::Error>> {
        let reader = parquet::file::reader::SerializedFileReader::new(File::open(path)?)?;
        Ok(parquet::file::reader::FileReader::metadata(&reader)
            .row_groups()
            .iter()
            .map(|group| group.num_rows())
            .collect())
    }

    #[test]
    fn a_file_encoded_on_lanes_is_the_file_encoded_on_one_thread()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        // Batches that straddle row groups of 128, that fill them exactly, that are larger
        // than one, and none at all.
        let cases: [(i64, i64, &[i64]); 4] = [
            (1000, 100, &[128, 128, 128, 128, 128, 128, 128, 104]),
            (512, 64, &[128, 128, 128, 128]),
            (600, 300, &[128, 128, 128, 128, 88]),
            (0, 1, &[]),
        ];
        for (rows, per_batch, groups) in cases {
            let one_path = dir.path().join(format!("{rows}-{per_batch}-one.parquet"));
            let (one, on_lanes) = written(&one_path, rows, per_batch, 1)?;
            assert!(!on_lanes);
            assert_eq!(row_groups(&one_path)?, groups, "{rows} rows");
            for threads in [2, 3, 8] {
                let path = dir
                    .path()
                    .join(format!("{rows}-{per_batch}-{threads}.parquet"));
                let (lanes, on_lanes) = written(&path, rows, per_batch, threads)?;
                assert!(on_lanes, "{threads} threads");
                // The same writers encode the same pages into the same places: byte for byte.
                assert!(
                    lanes == one,
                    "{rows} rows in batches of {per_batch} on {threads} threads: another file"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn a_batch_of_other_columns_fails_the_file_by_name_and_ends_it()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("short.parquet");
        let mut file = ParquetFile::create_on(&path, schema(), &LAYOUT, 2)?;
        assert!(matches!(file.writer, Writer::Lanes(_)));
        file.write(&batch(0, 100)?)?;
        let short = batch(100, 100)?.project(&[0, 1])?;
        match file.write(&short) {
            Err(TableError::Write { path: named, .. }) => assert_eq!(named, path),
            other => panic!("expected the write to fail, got {other:?}"),
        }
        // Whatever the lanes hold, a failed file writes nothing more.
        assert!(file.write(&batch(100, 100)?).is_err());
        assert!(file.finish().is_err());
        Ok(())
    }

    #[test]
    fn a_value_a_lane_cannot_encode_fails_the_file_by_name_and_ends_it()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("null-id.parquet");
        let mut file = ParquetFile::create_on(&path, schema(), &LAYOUT, 2)?;
        assert!(matches!(file.writer, Writer::Lanes(_)));
        file.write(&batch(0, 100)?)?;
        // The file's ids are required; a batch that says they may be null, and holds one,
        // passes the writing thread and fails in the lane that encodes them.
        let mut fields: Vec<Field> = schema()
            .fields()
            .iter()
            .map(|field| field.as_ref().clone())
            .collect();
        fields[0] = Field::new("id", DataType::Utf8, true);
        let mut columns = batch(100, 100)?.columns().to_vec();
        // Row 110 of the file, in its first row group.
        columns[0] = Arc::new(StringArray::from_iter(
            (100..200).map(|i| (i != 110).then(|| format!("task-{i:08}"))),
        ));
        let null_id = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
        let mut outcomes = vec![file.write(&null_id)];
        for first in (200..600).step_by(100) {
            outcomes.push(file.write(&batch(first, 100)?));
        }
        // A group's chunks are read when the group after it closes: the lane's error comes
        // then, and every call after it fails.
        let failed = outcomes
            .iter()
            .position(Result::is_err)
            .ok_or("no write failed")?;
        match &outcomes[failed] {
            Err(TableError::Write { path: named, .. }) => assert_eq!(named, &path),
            other => panic!("expected a write error, got {other:?}"),
        }
        assert!(outcomes[failed..].iter().all(Result::is_err));
        assert!(file.finish().is_err());
        Ok(())
    }
}
