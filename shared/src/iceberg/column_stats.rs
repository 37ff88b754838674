//! A data file's column statistics as Iceberg manifests carry them (sizes, value and null
//! counts, lower and upper bounds, by field id), taken from the file's own Parquet footer: with
//! them Athena, Spark, Trino and PyIceberg skip the files a filter rules out instead of opening
//! every file of every partition.
//!
//! Only the footer is read (two ranged reads at most). Bounds are given only where every row
//! group's statistics bound the column; a row group without them, or with statistics in the
//! deprecated sort order, leaves the column unbounded rather than wrongly bounded. A string
//! bound the writer cut short is still a bound (the Parquet writers shorten a maximum upwards),
//! which is all Iceberg asks of one.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio::task::JoinSet;

use parquet::basic::SortOrder;
use parquet::file::metadata::{FooterTail, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::statistics::Statistics;

use super::IcebergError;
use super::schema::iceberg_type;
use crate::storage::{ObjectKey, Storage};
use crate::tables::published::PublishedTable;

/// The tail read first: the whole footer of our files, whose few dozen columns and handful of
/// row groups take a few kilobytes.
const FIRST_READ: u64 = 64 * 1024;

/// Footers read at once.
const PARALLEL_FOOTERS: usize = 8;

/// The longest footer read; a longer length is taken for a damaged file.
const MAX_FOOTER: u64 = 16 * 1024 * 1024;

/// The Parquet trailer: the footer's length (4 bytes) and the magic `PAR1` (4 bytes).
const TRAILER: u64 = 8;

/// One data file's statistics, each by the column's field id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct ColumnStats {
    /// Bytes of each column, compressed, as stored.
    pub(super) column_sizes: BTreeMap<i32, i64>,
    /// Values of each column, nulls included.
    pub(super) value_counts: BTreeMap<i32, i64>,
    /// Nulls of each column.
    pub(super) null_value_counts: BTreeMap<i32, i64>,
    /// The least value of each bounded column, in Iceberg's single-value serialization.
    pub(super) lower_bounds: BTreeMap<i32, Vec<u8>>,
    /// The greatest value of each bounded column, likewise.
    pub(super) upper_bounds: BTreeMap<i32, Vec<u8>>,
}

/// The statistics of `table`'s published columns in each Parquet file of `files` (its key and
/// size), in order; [`PARALLEL_FOOTERS`] footers are read at a time.
pub(super) async fn read_column_stats(
    storage: &Arc<dyn Storage>,
    files: &[(ObjectKey, u64)],
    table: &PublishedTable,
) -> Result<Vec<ColumnStats>, IcebergError> {
    let mut stats = Vec::with_capacity(files.len());
    for batch in files.chunks(PARALLEL_FOOTERS) {
        let mut reads = JoinSet::new();
        for (index, (key, size)) in batch.iter().enumerate() {
            let storage = Arc::clone(storage);
            let (key, size) = (key.clone(), *size);
            reads.spawn(async move { (index, read_footer(&storage, &key, size).await) });
        }
        let mut footers = Vec::with_capacity(batch.len());
        while let Some(joined) = reads.join_next().await {
            let (index, footer) =
                joined.map_err(|err| IcebergError::Unreadable(format!("a footer read: {err}")))?;
            footers.push((index, footer?));
        }
        footers.sort_by_key(|(index, _)| *index);
        stats.extend(
            footers
                .iter()
                .map(|(_, footer)| column_stats(footer, table)),
        );
    }
    Ok(stats)
}

/// The footer of the Parquet file at `key`, read from its end.
async fn read_footer(
    storage: &Arc<dyn Storage>,
    key: &ObjectKey,
    size: u64,
) -> Result<ParquetMetaData, IcebergError> {
    let unreadable = |why: String| IcebergError::Unreadable(format!("{key}: {why}"));
    if size < TRAILER + 4 {
        return Err(unreadable(format!("{size} bytes is no Parquet file")));
    }
    let first = size.min(FIRST_READ);
    let tail = storage.get_range(key, size - first..size).await?;
    let trailer: [u8; TRAILER as usize] = tail
        .get(tail.len().saturating_sub(TRAILER as usize)..)
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(|| unreadable(format!("{} bytes read of its tail", tail.len())))?;
    let footer = FooterTail::try_new(&trailer).map_err(|err| unreadable(err.to_string()))?;
    if footer.is_encrypted_footer() {
        return Err(unreadable("its footer is encrypted".into()));
    }
    let length = footer.metadata_length() as u64;
    if length > MAX_FOOTER || length + TRAILER + 4 > size {
        return Err(unreadable(format!(
            "a footer of {length} bytes in a file of {size}"
        )));
    }
    let footer_bytes = if length + TRAILER <= first {
        let end = tail.len() - TRAILER as usize;
        tail.slice(end - length as usize..end)
    } else {
        storage
            .get_range(key, size - TRAILER - length..size - TRAILER)
            .await?
    };
    ParquetMetaDataReader::decode_metadata(&footer_bytes).map_err(|err| unreadable(err.to_string()))
}

/// The statistics of `table`'s published top-level columns in a file's footer. Columns the
/// file does not have, and nested ones, are left out (a reader then assumes nothing of them).
fn column_stats(metadata: &ParquetMetaData, table: &PublishedTable) -> ColumnStats {
    let published: HashMap<&str, (i32, &str)> = table
        .columns
        .iter()
        .filter_map(|column| Some((column.name, (column.id, iceberg_type(column.sql_type)?))))
        .collect();
    let mut stats = ColumnStats::default();
    let schema = metadata.file_metadata().schema_descr();
    for (index, column) in schema.columns().iter().enumerate() {
        let [name] = column.path().parts() else {
            continue;
        };
        let Some(&(id, kind)) = published.get(name.as_str()) else {
            continue;
        };
        // Bounds in another order than Iceberg's (an unsigned integer's) bound nothing here.
        let ordered = column.sort_order() == iceberg_order(kind);
        let mut size = 0i64;
        let mut values = 0i64;
        let mut nulls = Some(0i64);
        let mut bounds = Some(None::<(Value, Value)>);
        for group in metadata.row_groups() {
            let Some(chunk) = group.columns().get(index) else {
                continue;
            };
            size += chunk.compressed_size();
            values += chunk.num_values();
            let statistics = chunk.statistics();
            let group_nulls = statistics
                .and_then(Statistics::null_count_opt)
                .and_then(|count| i64::try_from(count).ok());
            nulls = nulls.zip(group_nulls).map(|(sum, count)| sum + count);
            let all_null = group_nulls == Some(chunk.num_values());
            let min_max = statistics
                .filter(|_| ordered)
                .and_then(|statistics| min_max(statistics, kind));
            bounds = match (bounds, min_max) {
                (Some(seen), Some((min, max))) => widen(seen, min, max),
                (Some(seen), None) if all_null => Some(seen),
                _ => None,
            };
        }
        stats.column_sizes.insert(id, size);
        stats.value_counts.insert(id, values);
        if let Some(nulls) = nulls {
            stats.null_value_counts.insert(id, nulls);
        }
        if let Some(Some((lower, upper))) = bounds {
            stats.lower_bounds.insert(id, lower.serialized());
            stats.upper_bounds.insert(id, upper.serialized());
        }
    }
    stats
}

/// The order in which Iceberg compares values of type `kind`, as Parquet names it (text by
/// its UTF-8 bytes, `false` before `true`).
fn iceberg_order(kind: &str) -> SortOrder {
    match kind {
        "string" | "boolean" => SortOrder::UNSIGNED,
        _ => SortOrder::SIGNED,
    }
}

/// `seen` bounds made to hold `min` and `max` too; `None` when the two cannot be compared.
fn widen(seen: Option<(Value, Value)>, min: Value, max: Value) -> Option<Option<(Value, Value)>> {
    let Some((lower, upper)) = seen else {
        return Some(Some((min, max)));
    };
    let lower = match min.partial_cmp(&lower)? {
        Ordering::Less => min,
        _ => lower,
    };
    let upper = match max.partial_cmp(&upper)? {
        Ordering::Greater => max,
        _ => upper,
    };
    Some(Some((lower, upper)))
}

/// A value of a bound, as the column's Iceberg type holds it.
#[derive(Clone, Debug, PartialEq, PartialOrd)]
enum Value {
    Boolean(bool),
    Int(i32),
    Long(i64),
    Double(f64),
    String(Vec<u8>),
}

impl Value {
    /// Iceberg's single-value serialization (little-endian numbers, UTF-8 text).
    fn serialized(&self) -> Vec<u8> {
        match self {
            Self::Boolean(value) => vec![u8::from(*value)],
            Self::Int(value) => value.to_le_bytes().to_vec(),
            Self::Long(value) => value.to_le_bytes().to_vec(),
            Self::Double(value) => value.to_le_bytes().to_vec(),
            Self::String(value) => value.clone(),
        }
    }
}

/// A row group's least and greatest values of a column of Iceberg type `kind`, when its
/// statistics give both in the type's own order.
fn min_max(statistics: &Statistics, kind: &str) -> Option<(Value, Value)> {
    if statistics.is_min_max_deprecated() {
        return None;
    }
    let pair = match (statistics, kind) {
        (Statistics::Boolean(s), "boolean") => {
            (Value::Boolean(*s.min_opt()?), Value::Boolean(*s.max_opt()?))
        }
        (Statistics::Int32(s), "int") => (Value::Int(*s.min_opt()?), Value::Int(*s.max_opt()?)),
        (Statistics::Int32(s), "long") => (
            Value::Long(i64::from(*s.min_opt()?)),
            Value::Long(i64::from(*s.max_opt()?)),
        ),
        (Statistics::Int64(s), "long") => (Value::Long(*s.min_opt()?), Value::Long(*s.max_opt()?)),
        (Statistics::Double(s), "double") => {
            (Value::Double(*s.min_opt()?), Value::Double(*s.max_opt()?))
        }
        (Statistics::ByteArray(s), "string") => (
            Value::String(s.min_opt()?.data().to_vec()),
            Value::String(s.max_opt()?.data().to_vec()),
        ),
        _ => return None,
    };
    // NaN bounds nothing (Iceberg keeps NaN out of bounds), nor does text that is not UTF-8.
    let valid = |value: &Value| match value {
        Value::Double(number) => !number.is_nan(),
        Value::String(text) => std::str::from_utf8(text).is_ok(),
        _ => true,
    };
    (valid(&pair.0) && valid(&pair.1) && pair.0 <= pair.1).then_some(pair)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use duckdb::arrow::array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::*;
    use crate::storage::{LocalDirStorage, PutMode};
    use crate::tables::columns::Column;
    use crate::tables::published::Source;

    fn table() -> PublishedTable {
        PublishedTable {
            name: "t",
            source: Source::Attempts,
            columns: vec![
                Column::new(1, "name", "VARCHAR"),
                Column::new(2, "count", "BIGINT"),
                Column::new(3, "ok", "BOOLEAN"),
                Column::new(4, "gone", "VARCHAR"),
                Column::new(5, "absent", "BIGINT"),
            ],
        }
    }

    /// Four rows in two row groups of two; `extra` is stored but not published.
    fn parquet_file() -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let columns: Vec<(&str, ArrayRef)> = vec![
            (
                "name",
                Arc::new(StringArray::from(vec![
                    Some("b"),
                    Some("a"),
                    None,
                    Some("d"),
                ])),
            ),
            (
                "count",
                Arc::new(Int64Array::from(vec![Some(5), Some(-3), Some(7), None])),
            ),
            (
                "ok",
                Arc::new(BooleanArray::from(vec![true, true, true, true])),
            ),
            ("gone", Arc::new(StringArray::from(vec![None::<&str>; 4]))),
            ("extra", Arc::new(Int64Array::from(vec![1, 2, 3, 4]))),
        ];
        let batch = RecordBatch::try_from_iter(columns)?;
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(2))
            .build();
        let mut body = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut body, batch.schema(), Some(properties))?;
        writer.write(&batch)?;
        writer.close()?;
        Ok(body)
    }

    #[tokio::test]
    async fn a_footer_gives_each_published_columns_counts_and_bounds()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let storage: Arc<dyn Storage> = Arc::new(LocalDirStorage::open(dir.path())?);
        let body = parquet_file()?;
        let key = ObjectKey::new("tables/t/f.parquet")?;
        let size = body.len() as u64;
        storage
            .put(&key, Bytes::from(body), PutMode::Create)
            .await?;
        let stats = read_column_stats(&storage, &[(key, size)], &table()).await?;
        assert_eq!(stats.len(), 1, "statistics for one file");
        let stats = &stats[0];
        let ids = |map: &BTreeMap<i32, _>| map.keys().copied().collect::<Vec<i32>>();
        assert_eq!(ids(&stats.column_sizes), [1, 2, 3, 4]);
        assert_eq!(
            stats.value_counts,
            BTreeMap::from([(1, 4), (2, 4), (3, 4), (4, 4)])
        );
        assert_eq!(
            stats.null_value_counts,
            BTreeMap::from([(1, 1), (2, 1), (3, 0), (4, 4)])
        );
        // A column of nulls alone has no bounds.
        assert_eq!(
            stats.lower_bounds,
            BTreeMap::from([
                (1, b"a".to_vec()),
                (2, (-3i64).to_le_bytes().to_vec()),
                (3, vec![1]),
            ])
        );
        assert_eq!(
            stats.upper_bounds,
            BTreeMap::from([
                (1, b"d".to_vec()),
                (2, 7i64.to_le_bytes().to_vec()),
                (3, vec![1]),
            ])
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_file_cut_short_is_unreadable_not_a_panic() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let storage: Arc<dyn Storage> = Arc::new(LocalDirStorage::open(dir.path())?);
        let body = parquet_file()?;
        for cut in [3, body.len() / 2, body.len() - 1] {
            let key = ObjectKey::new(format!("tables/t/cut-{cut}.parquet"))?;
            let short = Bytes::copy_from_slice(&body[..cut]);
            storage.put(&key, short, PutMode::Create).await?;
            let read = read_column_stats(&storage, &[(key, cut as u64)], &table()).await;
            assert!(
                matches!(read, Err(IcebergError::Unreadable(_))),
                "cut at {cut}: {read:?}"
            );
        }
        Ok(())
    }
}
