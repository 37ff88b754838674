//! The rows of one task in one block of a `task_attempts` file (the block its key index names,
//! see [`super::key_index`]), read with the parquet crate.
//!
//! Why not DuckDB: it decodes the block's pages in every column to return the one row it
//! filters for (81 columns of 122 880 rows in a base), which puts a large session's lookups
//! past their target (docs/performance.md, "Targets"). The crate compares the
//! block's task ids and then, through the file's offset index, decodes only the page of each
//! other column that holds a matching row. A file written without an offset index (DuckDB's)
//! is still read correctly, its pages found by their headers.
//!
//! The key indexes stay DuckDB's to read: DuckDB writes their `UINTEGER` keys delta-encoded
//! with first values past `i32::MAX`, which the crate refuses ("first value too large").

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use duckdb::arrow::array::{Array, RecordBatch, Scalar, StringArray};
use duckdb::arrow::compute::cast;
use duckdb::arrow::compute::kernels::cmp::eq;
use duckdb::arrow::error::ArrowError;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowPredicateFn, ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
    RowFilter, RowSelection, RowSelector,
};
use parquet::errors::ParquetError;
use parquet::file::metadata::PageIndexPolicy;

use super::TableError;

/// Memory the footers held may take (as the crate counts it), beyond which the one read least
/// recently gives way: a few sessions' bases and deltas.
const FOOTER_BYTES: usize = 64 << 20;

/// Parsed footers (with offset indexes) of the files lookups read, so a lookup does not parse
/// a large base's thousands of column chunks and their page locations again. Files are never
/// rewritten under a name; a footer is used only while its file's length and modification
/// time are those it was read at. One larger than the whole budget is used once, not held.
#[derive(Debug)]
pub struct Footers {
    held: Mutex<Held>,
    /// Bytes the footers held may take.
    budget: usize,
}

impl Default for Footers {
    fn default() -> Self {
        Self::within(FOOTER_BYTES)
    }
}

/// The footers held, for eviction.
#[derive(Debug, Default)]
struct Held {
    footers: HashMap<PathBuf, Footer>,
    /// Bytes in `footers`.
    bytes: usize,
    /// The last use handed out (a counter, not a clock).
    clock: u64,
}

/// One file's footer.
#[derive(Debug)]
struct Footer {
    stamp: Stamp,
    metadata: ArrowReaderMetadata,
    bytes: usize,
    used: u64,
}

/// What tells one file at a path from another.
type Stamp = (u64, Option<SystemTime>);

impl Footers {
    /// Footers within `budget` bytes.
    fn within(budget: usize) -> Self {
        Self {
            held: Mutex::default(),
            budget,
        }
    }

    /// The footer of `file` (at `path`), parsed now or before.
    fn of(&self, path: &Path, file: &File) -> Result<ArrowReaderMetadata, TableError> {
        let unreadable = |source| TableError::Read {
            path: path.to_path_buf(),
            source,
        };
        let stat = file.metadata().map_err(|err| unreadable(err.into()))?;
        let stamp = (stat.len(), stat.modified().ok());
        {
            let mut held = self.lock();
            held.clock += 1;
            let now = held.clock;
            if let Some(footer) = held.footers.get_mut(path)
                && footer.stamp == stamp
            {
                footer.used = now;
                return Ok(footer.metadata.clone());
            }
        }
        // Parsed outside the lock: other lookups go on meanwhile.
        let options = ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional);
        let metadata = ArrowReaderMetadata::load(file, options).map_err(unreadable)?;
        let bytes = metadata.metadata().memory_size();
        let mut held = self.lock();
        if let Some(gone) = held.footers.remove(path) {
            held.bytes -= gone.bytes;
        }
        // A footer larger than the whole budget is used for this read only: holding it would
        // evict every other footer and still exceed the budget.
        if bytes > self.budget {
            return Ok(metadata);
        }
        while held.bytes + bytes > self.budget {
            let Some(oldest) = held
                .footers
                .iter()
                .min_by_key(|(_, footer)| footer.used)
                .map(|(path, _)| path.clone())
            else {
                break;
            };
            if let Some(gone) = held.footers.remove(&oldest) {
                held.bytes -= gone.bytes;
            }
        }
        held.clock += 1;
        let used = held.clock;
        held.bytes += bytes;
        held.footers.insert(
            path.to_path_buf(),
            Footer {
                stamp,
                metadata: metadata.clone(),
                bytes,
                used,
            },
        );
        Ok(metadata)
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        // Only whole entries are changed under it, so a panic leaves it consistent.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every row of `task_id` among rows `first..=last` of the `task_attempts` file at `path`,
/// every column as stored, in file order.
pub fn task_rows(
    footers: &Footers,
    path: &Path,
    (first, last): (u64, u64),
    task_id: &str,
) -> Result<Vec<RecordBatch>, TableError> {
    let unreadable = |source| TableError::Read {
        path: path.to_path_buf(),
        source,
    };
    let corrupt = |what: String| TableError::Corrupt(format!("{}: {what}", path.display()));
    let file = File::open(path).map_err(|err| unreadable(err.into()))?;
    let footer = footers.of(path, &file)?;
    let group_rows = footer
        .metadata()
        .row_groups()
        .iter()
        .map(|group| {
            u64::try_from(group.num_rows())
                .map_err(|_| corrupt(format!("a row group of {} rows", group.num_rows())))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (groups, selectors) = rows_in_groups(group_rows, first, last);
    if groups.is_empty() {
        return Ok(Vec::new());
    }
    let schema = footer.metadata().file_metadata().schema_descr();
    let Some(leaf) = schema
        .columns()
        .iter()
        .position(|column| column.path().parts() == ["task_id"])
    else {
        return Err(corrupt("no task_id column".to_owned()));
    };
    let wanted = StringArray::from(vec![task_id]);
    let is_task = ArrowPredicateFn::new(
        ProjectionMask::leaves(schema, [leaf]),
        move |batch: RecordBatch| {
            let ids = batch.columns().first().ok_or_else(|| {
                ArrowError::SchemaError("the task_id column was not read".to_owned())
            })?;
            // The stored type (text, or a view of it) decides the wanted id's.
            let wanted = cast(&wanted, ids.data_type())?;
            eq(ids, &Scalar::new(wanted))
        },
    );
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, footer)
        .with_row_groups(groups)
        .with_row_selection(RowSelection::from(selectors))
        .with_row_filter(RowFilter::new(vec![Box::new(is_task)]))
        .build()
        .map_err(unreadable)?;
    let mut batches = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|err| unreadable(ParquetError::External(err.into())))?;
        if batch.num_rows() > 0 {
            batches.push(batch);
        }
    }
    Ok(batches)
}

/// The row groups (of `group_rows` rows each, in order) that hold any of rows `first..=last`,
/// and the selection of those rows within them.
fn rows_in_groups(
    group_rows: impl IntoIterator<Item = u64>,
    first: u64,
    last: u64,
) -> (Vec<usize>, Vec<RowSelector>) {
    let mut groups = Vec::new();
    let mut selectors = Vec::new();
    let mut start = 0;
    for (group, rows) in group_rows.into_iter().enumerate() {
        let end = start + rows;
        let (from, to) = (first.max(start), last.saturating_add(1).min(end));
        if from < to {
            groups.push(group);
            let count = |rows: u64| usize::try_from(rows).unwrap_or(usize::MAX);
            for selector in [
                RowSelector::skip(count(from - start)),
                RowSelector::select(count(to - from)),
                RowSelector::skip(count(end - to)),
            ] {
                if selector.row_count > 0 {
                    selectors.push(selector);
                }
            }
        }
        start = end;
    }
    (groups, selectors)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use duckdb::arrow::array::{ArrayRef, BooleanArray, Int32Array, Int64Array, UInt8Array};
    use duckdb::arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::query::read::json::{JsonRow, arrow_row, query_rows};
    use crate::tables::newest::{path_literal, read_parquet};
    use crate::tables::parquet::{Layout, ParquetFile};

    /// The task id of `row` in [`rows`]: every seventh row's repeats one of 13, so tasks recur
    /// within a page, a row group and a block, and across them.
    fn id_of(row: usize) -> String {
        match row % 7 {
            0 => format!("{:048x}", row % 13),
            _ => format!("{:048x}", 1000 + row),
        }
    }

    /// `count` rows of [`id_of`] ids, with columns of each kind the table stores, some null.
    fn rows(count: usize, salt: i64) -> Result<RecordBatch, Box<dyn std::error::Error>> {
        let index = |row: usize| i64::try_from(row).unwrap_or_default();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values((0..count).map(id_of))),
            Arc::new(Int32Array::from_iter(
                (0..count).map(|row| i32::try_from(row % 3).ok()),
            )),
            Arc::new(Int64Array::from_iter((0..count).map(|row| {
                (row % 5 != 0).then(|| index(row) * 1_000_003 + salt)
            }))),
            Arc::new(BooleanArray::from_iter(
                (0..count).map(|row| (row % 4 != 0).then_some(row % 2 == 0)),
            )),
            Arc::new(UInt8Array::from_iter((0..count).map(|row| {
                u8::try_from(row % 200).ok().filter(|code| code % 3 != 0)
            }))),
            Arc::new(StringArray::from_iter((0..count).map(|row| {
                (row % 6 != 0).then(|| format!("message {row} {salt}"))
            }))),
        ];
        let schema = Schema::new(vec![
            Field::new("task_id", DataType::Utf8, false),
            Field::new("attempt_number", DataType::Int32, true),
            Field::new("ts_running", DataType::Int64, true),
            Field::new("is_debugger_paused", DataType::Boolean, true),
            Field::new("node_id_at_ref", DataType::UInt8, true),
            Field::new("error_message", DataType::Utf8, true),
        ]);
        Ok(RecordBatch::try_new(Arc::new(schema), columns)?)
    }

    /// Writes `batch` at `path` as `task_attempts` files are written (the crate's pages of at
    /// most 20 000 rows), in row groups of 30 000 rows: two pages in each whole group.
    fn write(path: &Path, batch: &RecordBatch) -> Result<(), Box<dyn std::error::Error>> {
        let layout = Layout {
            row_group_rows: 30_000,
            unique: &["task_id"],
            ordered: &[],
            columns: &[],
        };
        let mut file = ParquetFile::create(path, batch.schema(), &layout)?;
        file.write(batch)?;
        file.finish()?;
        Ok(())
    }

    /// The rows DuckDB reads for the same lookup, as the lookup read them before.
    fn read_by_duckdb(
        connection: &duckdb::Connection,
        path: &Path,
        (first, last): (u64, u64),
        task_id: &str,
    ) -> Result<Vec<JsonRow>, Box<dyn std::error::Error>> {
        let sql = format!(
            "SELECT * EXCLUDE (file_row_number) FROM {} WHERE file_row_number BETWEEN {first} AND {last} AND task_id = ?",
            read_parquet(&[path], ", file_row_number = true")
        );
        Ok(query_rows(connection, &sql, &[task_id.to_owned().into()])?)
    }

    fn read_by_crate(
        footers: &Footers,
        path: &Path,
        rows: (u64, u64),
        task_id: &str,
    ) -> Result<Vec<JsonRow>, Box<dyn std::error::Error>> {
        let mut read = Vec::new();
        for batch in task_rows(footers, path, rows, task_id)? {
            for row in 0..batch.num_rows() {
                read.push(arrow_row(&batch, row)?);
            }
        }
        Ok(read)
    }

    /// Pages skipped through the offset index (the crate's file, written as the table's are)
    /// or row groups read whole (DuckDB's, which has none), for blocks within a page, across
    /// pages, across row groups and past the end, and for the ids on and next to each block's
    /// edges: the rows read are DuckDB's, value for value.
    #[test]
    fn a_task_read_from_a_block_is_the_rows_duckdb_reads() -> Result<(), Box<dyn std::error::Error>>
    {
        const ROWS: usize = 70_000;
        let dir = tempfile::tempdir()?;
        let connection = crate::tables::open_duckdb()?;
        let ours = dir.path().join("ours.parquet");
        write(&ours, &rows(ROWS, 7)?)?;
        let footers = Footers::default();
        let footer = footers.of(&ours, &File::open(&ours)?)?;
        assert!(
            footer
                .metadata()
                .page_index()
                .is_some_and(|index| index.has_offset_indexes()),
            "no offset index: every page would be decoded"
        );
        // As DuckDB writes data files (older files; a fold's base when the crate's interleave
        // declines).
        let theirs = dir.path().join("theirs.parquet");
        connection.execute_batch(&format!(
            "COPY (SELECT * FROM {}) TO {} (FORMAT parquet, COMPRESSION zstd, PARQUET_VERSION V2, ROW_GROUP_SIZE 20480)",
            read_parquet(&[&ours], ""),
            path_literal(&theirs)
        ))?;
        let blocks: [(u64, u64); 6] = [
            (0, 29_999),
            (19_990, 20_010),
            (25_000, 35_000),
            (52_000, 52_100),
            (65_000, 80_000),
            (80_000, 90_000),
        ];
        let mut found = 0;
        for path in [&ours, &theirs] {
            for (first, last) in blocks {
                let edges = [
                    first.checked_sub(1),
                    Some(first),
                    Some(last),
                    Some(last + 1),
                ];
                let ids: Vec<String> = edges
                    .into_iter()
                    .flatten()
                    .filter_map(|row| usize::try_from(row).ok())
                    .filter(|row| *row < ROWS)
                    .map(id_of)
                    .chain([4, 12, 99_999_999].map(|id| format!("{id:048x}")))
                    .collect();
                for id in &ids {
                    let expected = read_by_duckdb(&connection, path, (first, last), id)?;
                    let read = read_by_crate(&footers, path, (first, last), id)?;
                    assert_eq!(
                        read,
                        expected,
                        "{} rows {first}..={last} of {id}",
                        path.display()
                    );
                    found += read.len();
                }
            }
        }
        assert!(found > 1000, "{found} rows found: the test reaches little");
        Ok(())
    }

    /// Past their budget, the footer read least recently gives way, and one held is used.
    #[test]
    fn the_footer_read_least_recently_gives_way() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let paths: Vec<PathBuf> = ["a", "b", "c"]
            .iter()
            .map(|name| dir.path().join(format!("{name}.parquet")))
            .collect();
        for path in &paths {
            write(path, &rows(100, 0)?)?;
        }
        let size = Footers::default()
            .of(&paths[0], &File::open(&paths[0])?)?
            .metadata()
            .memory_size();
        let footers = Footers::within(2 * size + size / 2);
        let read = |at: usize| -> Result<ArrowReaderMetadata, Box<dyn std::error::Error>> {
            Ok(footers.of(&paths[at], &File::open(&paths[at])?)?)
        };
        let first = read(0)?;
        read(1)?;
        // Held: the same footer, not parsed again.
        assert!(Arc::ptr_eq(read(0)?.metadata(), first.metadata()));
        read(2)?;
        let held = footers.lock();
        let mut names: Vec<_> = held.footers.keys().collect();
        names.sort();
        assert_eq!(names, vec![&paths[0], &paths[2]]);
        assert_eq!(held.bytes, 2 * size);
        Ok(())
    }

    /// A footer larger than the budget is not held, and costs the footers held nothing.
    #[test]
    fn a_footer_larger_than_the_budget_is_not_held() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let (small, large) = (
            dir.path().join("small.parquet"),
            dir.path().join("large.parquet"),
        );
        write(&small, &rows(100, 0)?)?;
        write(&large, &rows(70_000, 0)?)?;
        let size = |path: &Path| -> Result<usize, Box<dyn std::error::Error>> {
            Ok(Footers::default()
                .of(path, &File::open(path)?)?
                .metadata()
                .memory_size())
        };
        let (small_size, large_size) = (size(&small)?, size(&large)?);
        assert!(small_size < large_size, "{small_size} {large_size}");
        let footers = Footers::within(large_size - 1);
        footers.of(&small, &File::open(&small)?)?;
        let read = footers.of(&large, &File::open(&large)?)?;
        assert_eq!(read.metadata().file_metadata().num_rows(), 70_000);
        {
            let held = footers.lock();
            assert_eq!(held.footers.keys().collect::<Vec<_>>(), vec![&small]);
            assert_eq!(held.bytes, small_size);
        }
        // A file too large to hold, written over one held: the held footer goes too.
        write(&small, &rows(70_000, 0)?)?;
        footers.of(&small, &File::open(&small)?)?;
        let held = footers.lock();
        assert!(held.footers.is_empty());
        assert_eq!(held.bytes, 0);
        Ok(())
    }

    /// A footer is parsed again once its file's modification time is not the one it was read
    /// at, though the length is the same.
    #[test]
    fn a_footer_is_parsed_again_when_its_file_was_modified()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("file.parquet");
        write(&path, &rows(100, 0)?)?;
        let footers = Footers::default();
        let first = footers.of(&path, &File::open(&path)?)?;
        let again = footers.of(&path, &File::open(&path)?)?;
        assert!(Arc::ptr_eq(first.metadata(), again.metadata()));
        let file = File::options().write(true).open(&path)?;
        let modified = file.metadata()?.modified()?;
        file.set_modified(modified - std::time::Duration::from_secs(60))?;
        let after = footers.of(&path, &File::open(&path)?)?;
        assert!(!Arc::ptr_eq(first.metadata(), after.metadata()));
        Ok(())
    }

    /// A file written again at the same path is read, not the footer of the one before.
    #[test]
    fn a_footer_is_not_used_for_another_file_at_its_path() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("file.parquet");
        let footers = Footers::default();
        let id = format!("{:048x}", 1000 + 1);
        write(&path, &rows(3_000, 1)?)?;
        let before = read_by_crate(&footers, &path, (0, 2999), &id)?;
        write(&path, &rows(1_500, 2)?)?;
        let after = read_by_crate(&footers, &path, (0, 2999), &id)?;
        assert_eq!(before.len(), 1);
        assert_eq!(after.len(), 1);
        assert_ne!(before, after);
        assert_eq!(after[0].get("error_message"), Some(&"message 1 2".into()));
        Ok(())
    }

    /// Selectors as (skip?, rows), for comparing.
    fn plain(selectors: &[RowSelector]) -> Vec<(bool, usize)> {
        selectors
            .iter()
            .map(|selector| (selector.skip, selector.row_count))
            .collect()
    }

    #[test]
    fn a_block_is_selected_in_the_row_groups_that_hold_it() {
        // One group per block, as in a base.
        let (groups, selectors) = rows_in_groups([10, 10, 10], 10, 19);
        assert_eq!(groups, vec![1]);
        assert_eq!(plain(&selectors), vec![(false, 10)]);
        // Smaller groups than blocks, and a block past the file's last row.
        let (groups, selectors) = rows_in_groups([4, 4, 4, 3], 6, 13);
        assert_eq!(groups, vec![1, 2, 3]);
        assert_eq!(
            plain(&selectors),
            vec![(true, 2), (false, 2), (false, 4), (false, 2), (true, 1)]
        );
        let (groups, selectors) = rows_in_groups([4, 4], 8, 11);
        assert!(groups.is_empty() && selectors.is_empty());
    }
}
