//! Our deletion vectors as Iceberg position-delete files.
//!
//! A delta's deletion vector names the rows it supersedes as `(file, row)` pairs, `file` being
//! the superseded row's file as a position in the session's files when the delta was written
//! ([`crate::tables::manifest::Deletes`]). Iceberg v2 names them as `(file_path, pos)` in a
//! position-delete file. Each data file with superseded rows gets one such file holding all of
//! them (gathered from every delta's vector), with `referenced_data_file` set, so a reader
//! applies exactly one delete file to each data file.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use duckdb::arrow::array::{Array, Int64Array, RecordBatch, StringArray};
use duckdb::arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{ArrowWriter, PARQUET_FIELD_ID_META_KEY};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use super::IcebergError;

/// The field id of `file_path` in every position-delete file (reserved by the spec).
const FILE_PATH_ID: i32 = 2_147_483_546;

/// The field id of `pos` in every position-delete file (reserved by the spec).
const POS_ID: i32 = 2_147_483_545;

/// The `(file, row)` pairs of one deletion vector, as file position → rows.
pub(super) fn read_vector(
    bytes: Bytes,
    into: &mut BTreeMap<usize, Vec<i64>>,
) -> Result<(), IcebergError> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
    for batch in reader {
        let batch = batch?;
        let column = |name: &str| {
            batch
                .column_by_name(name)
                .and_then(|column| column.as_any().downcast_ref::<Int64Array>())
                .ok_or_else(|| {
                    IcebergError::Unreadable(format!("a deletion vector without `{name}`"))
                })
        };
        let (files, rows) = (column("file")?, column("row")?);
        for index in 0..batch.num_rows() {
            if files.is_null(index) || rows.is_null(index) {
                return Err(IcebergError::Unreadable(
                    "a deletion vector with a NULL position".into(),
                ));
            }
            let file = usize::try_from(files.value(index)).map_err(|_| {
                IcebergError::Unreadable("a deletion vector with a negative file".into())
            })?;
            into.entry(file).or_default().push(rows.value(index));
        }
    }
    Ok(())
}

/// A position-delete file of `positions` (sorted here, duplicates dropped) in the data file
/// at `data_file`.
pub(super) fn write(data_file: &str, positions: &mut Vec<i64>) -> Result<Vec<u8>, IcebergError> {
    positions.sort_unstable();
    positions.dedup();
    let field = |name: &str, data_type: DataType, id: i32| {
        Field::new(name, data_type, false).with_metadata(
            [(PARQUET_FIELD_ID_META_KEY.to_owned(), id.to_string())]
                .into_iter()
                .collect::<std::collections::HashMap<_, _>>(),
        )
    };
    let schema = Arc::new(Schema::new(vec![
        field("file_path", DataType::Utf8, FILE_PATH_ID),
        field("pos", DataType::Int64, POS_ID),
    ]));
    let paths = StringArray::from(vec![data_file; positions.len()]);
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(paths),
            Arc::new(Int64Array::from(positions.clone())),
        ],
    )?;
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let mut writer = ArrowWriter::try_new(Vec::new(), schema, Some(properties))?;
    writer.write(&batch)?;
    Ok(writer.into_inner()?)
}
