//! A fold's base merged in Rust: the newest rows of a table's files, which are each sorted
//! already, merged in their order and written as deltas are ([`super::parquet_file`]).
//!
//! Every file a run or a fold writes is in one order ([`super::task_attempts`]'s sort key),
//! and a fold keeps every row its deletion vectors do not drop, so the newest rows in that
//! order are a merge of sorted files, not a sort. DuckDB's `ORDER BY … COPY` sorted them all
//! again, ~80 wide columns of them (a fold of a million rows peaked at 2.3 GB); here each file
//! is read once in order, and the merged rows are encoded on a thread of their own while the
//! next are merged (docs/performance.md).
//!
//! Files this build cannot merge are left to DuckDB, which matches columns by name and sorts
//! whatever it is given: a delta without a deletion vector or files of other columns
//! ([`merge_newest`] answers `None`), and a file found out of order or unreadable here (an
//! error, after which nothing of the merge is left on disk).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};

use duckdb::Connection;
use duckdb::arrow::array::RecordBatch;
use duckdb::arrow::compute::{SortOptions, interleave_record_batch};
use duckdb::arrow::datatypes::{Field, Schema, SchemaRef};
use duckdb::arrow::row::{Row, RowConverter, Rows, SortField};
use parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};

use super::newest::{DeletionVector, TableFiles, read_parquet};
use super::parquet_file::{Layout, ParquetFile};
use super::task_attempts::TableError;

/// Rows decoded from a file at a time, and rows gathered into each batch written.
const BATCH_ROWS: usize = 8192;

/// One file being read in order, its rows dropped where its deletion vectors name them.
struct Cursor<'a> {
    path: &'a Path,
    reader: ParquetRecordBatchReader,
    /// The batch being merged: its place in [`Merge::held`].
    slot: usize,
    /// The sort keys of the batch's rows.
    keys: Rows,
    /// The batch's rows.
    rows: usize,
    /// The next row of the batch to merge.
    at: usize,
}

/// The merge of sorted files into batches of their rows in order.
struct Merge {
    converter: RowConverter,
    sort_key: &'static [&'static str],
    schema: SchemaRef,
    /// Rows per batch read and per batch gathered.
    batch_rows: usize,
    /// Batches that merged rows still come from, until they are gathered.
    held: Vec<RecordBatch>,
    /// The rows merged and not yet gathered: (batch in `held`, row).
    merged: Vec<(usize, usize)>,
}

impl Merge {
    /// The next non-empty batch of `reader` (reading `path`), with its place in `held`, its
    /// sort keys and its rows. Its rows must be in order, and none before `after` (the last
    /// row of the file's batch before): a file out of order is an error, not a misordered base.
    fn next_batch(
        &mut self,
        path: &Path,
        reader: &mut ParquetRecordBatchReader,
        after: Option<Row<'_>>,
    ) -> Result<Option<(usize, Rows, usize)>, TableError> {
        for batch in reader {
            let batch = batch.map_err(|err| TableError::Read {
                path: path.to_owned(),
                source: err.into(),
            })?;
            if batch.num_rows() == 0 {
                continue;
            }
            let batch = RecordBatch::try_new(Arc::clone(&self.schema), batch.columns().to_vec())?;
            let columns = self
                .sort_key
                .iter()
                .map(|name| {
                    batch.column_by_name(name).cloned().ok_or_else(|| {
                        TableError::Corrupt(format!("a file to fold has no {name} column"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let keys = self.converter.convert_columns(&columns)?;
            let ordered = keys.iter().zip(keys.iter().skip(1)).all(|(a, b)| a <= b)
                && after.is_none_or(|last| last <= keys.row(0));
            if !ordered {
                return Err(TableError::Corrupt(format!(
                    "{} is not in the order it is folded in",
                    path.display()
                )));
            }
            let rows = batch.num_rows();
            self.held.push(batch);
            return Ok(Some((self.held.len() - 1, keys, rows)));
        }
        Ok(None)
    }

    /// A cursor at the first row `reader` reads of `path`, or none when it reads no row.
    fn open<'a>(
        &mut self,
        path: &'a Path,
        mut reader: ParquetRecordBatchReader,
    ) -> Result<Option<Cursor<'a>>, TableError> {
        Ok(self
            .next_batch(path, &mut reader, None)?
            .map(|(slot, keys, rows)| Cursor {
                path,
                reader,
                slot,
                keys,
                rows,
                at: 0,
            }))
    }

    /// Moves `cursor` past its row; false once its file is done.
    fn advance(&mut self, cursor: &mut Cursor<'_>) -> Result<bool, TableError> {
        cursor.at += 1;
        if cursor.at < cursor.rows {
            return Ok(true);
        }
        let last = cursor.keys.row(cursor.rows - 1);
        match self.next_batch(cursor.path, &mut cursor.reader, Some(last))? {
            Some((slot, keys, rows)) => {
                cursor.slot = slot;
                cursor.keys = keys;
                cursor.rows = rows;
                cursor.at = 0;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The rows merged so far as one batch; batches no cursor is in are let go.
    fn gather(&mut self, cursors: &mut [Cursor<'_>]) -> Result<Option<RecordBatch>, TableError> {
        if self.merged.is_empty() {
            return Ok(None);
        }
        let held: Vec<&RecordBatch> = self.held.iter().collect();
        let gathered = interleave_record_batch(&held, &self.merged)?;
        self.merged.clear();
        let mut kept = Vec::with_capacity(cursors.len());
        for cursor in cursors.iter_mut() {
            let batch = self.held.get(cursor.slot).ok_or_else(|| {
                TableError::Corrupt(format!(
                    "a fold lost the batch of {}",
                    cursor.path.display()
                ))
            })?;
            kept.push(batch.clone());
            cursor.slot = kept.len() - 1;
        }
        self.held = kept;
        Ok(Some(gathered))
    }
}

/// Writes the newest rows of `files` (each sorted by `sort_key`, ascending, nulls last) to
/// `path`, merged in that order and laid out as `layout` says. Returns the rows written, or
/// `None` when the files are not for this merge (a delta without a deletion vector, files of
/// other columns): nothing is written then, nor after an error.
pub(super) fn merge_newest(
    connection: &Connection,
    files: &TableFiles<'_>,
    sort_key: &'static [&'static str],
    layout: &Layout,
    path: &Path,
) -> Result<Option<u64>, TableError> {
    merge_in_batches(connection, files, sort_key, layout, BATCH_ROWS, path)
}

/// [`merge_newest`], reading and gathering `batch_rows` rows at a time.
fn merge_in_batches(
    connection: &Connection,
    files: &TableFiles<'_>,
    sort_key: &'static [&'static str],
    layout: &Layout,
    batch_rows: usize,
    path: &Path,
) -> Result<Option<u64>, TableError> {
    let Some(vectors) = files.deletes.as_ref() else {
        return Ok(None);
    };
    let all: Vec<&Path> = files.base.iter().chain(&files.deltas).copied().collect();
    let mut superseded = superseded_rows(connection, vectors)?;
    let mut builders = Vec::with_capacity(all.len());
    for (index, file) in all.iter().enumerate() {
        let unreadable = |source| TableError::Read {
            path: file.to_path_buf(),
            source,
        };
        let opened = File::open(file).map_err(|err| unreadable(err.into()))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(opened).map_err(unreadable)?;
        let rows = builder.metadata().file_metadata().num_rows();
        let rows = usize::try_from(rows).map_err(|_| {
            TableError::Corrupt(format!("{}: a footer of {rows} rows", file.display()))
        })?;
        let dropped = superseded.remove(&index).unwrap_or_default();
        let kept = kept_rows(&dropped, rows);
        builders.push((*file, builder.with_batch_size(batch_rows), kept));
    }
    let Some(schema) = common_schema(builders.iter().map(|(_, builder, _)| builder.schema()))
    else {
        return Ok(None);
    };
    let options = SortOptions {
        descending: false,
        nulls_first: false,
    };
    let fields = sort_key
        .iter()
        .map(|name| {
            schema
                .field_with_name(name)
                .map(|field| SortField::new_with_options(field.data_type().clone(), options))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut merge = Merge {
        converter: RowConverter::new(fields)?,
        sort_key,
        schema: Arc::clone(&schema),
        batch_rows,
        held: Vec::new(),
        merged: Vec::with_capacity(batch_rows),
    };
    let written = merge_to(&mut merge, builders, layout, path);
    if written.is_err() {
        // A partial base is nobody's: the fold failed, and the next one writes anew.
        let _ = std::fs::remove_file(path);
    }
    written.map(Some)
}

/// The rows `vectors` name, by the index among the files read of the file holding them,
/// sorted.
fn superseded_rows(
    connection: &Connection,
    vectors: &[DeletionVector<'_>],
) -> Result<BTreeMap<usize, Vec<usize>>, TableError> {
    let mut superseded: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for vector in vectors {
        let mut statement = connection.prepare(&format!(
            "SELECT file, row FROM {}",
            read_parquet(&[vector.path], "")
        ))?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let (file, number): (i64, i64) = (row.get(0)?, row.get(1)?);
            // A position in a file not read matches nothing, as in `newest`'s reads.
            let read = usize::try_from(file)
                .ok()
                .and_then(|file| vector.files.get(file).copied().flatten());
            if let (Some(read), Ok(number)) = (read, usize::try_from(number)) {
                superseded.entry(read).or_default().push(number);
            }
        }
    }
    for rows in superseded.values_mut() {
        rows.sort_unstable();
        rows.dedup();
    }
    Ok(superseded)
}

/// Merges the files `builders` open (each with the rows it keeps) into `path`: this thread
/// merges, another encodes. Returns the rows written.
fn merge_to(
    merge: &mut Merge,
    builders: Vec<(&Path, ParquetRecordBatchReaderBuilder<File>, RowSelection)>,
    layout: &Layout,
    path: &Path,
) -> Result<u64, TableError> {
    let mut cursors = Vec::with_capacity(builders.len());
    for (file, builder, kept) in builders {
        let reader =
            builder
                .with_row_selection(kept)
                .build()
                .map_err(|source| TableError::Read {
                    path: file.to_path_buf(),
                    source,
                })?;
        if let Some(cursor) = merge.open(file, reader)? {
            cursors.push(cursor);
        }
    }
    let schema = Arc::clone(&merge.schema);
    let (sender, batches) = sync_channel::<RecordBatch>(2);
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| write_all(path, schema, layout, batches));
        let merged = merge_all(merge, &mut cursors, |batch| sender.send(batch).is_ok());
        drop(sender);
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(TableError::Corrupt("the fold's writer panicked".into())));
        // The merge's error first: the writer saw only that its batches ended.
        merged.and(written)
    })
}

/// Every row of `cursors` in order, handed to `send` in batches; stops early if `send` says
/// the batches are no longer taken (the writer failed and reports why).
fn merge_all(
    merge: &mut Merge,
    cursors: &mut Vec<Cursor<'_>>,
    mut send: impl FnMut(RecordBatch) -> bool,
) -> Result<(), TableError> {
    while !cursors.is_empty() {
        // The cursor at the least row, and the least row of the others: its rows up to that
        // one go next, a run at a time (a base's rows come in long runs between a delta's).
        // A fold has a base and at most a few dozen deltas, so a scan of them beats a heap.
        let mut least = 0;
        let mut next: Option<usize> = None;
        for index in 1..cursors.len() {
            if key(&cursors[index]) < key(&cursors[least]) {
                next = Some(least);
                least = index;
            } else if next.is_none_or(|next| key(&cursors[index]) < key(&cursors[next])) {
                next = Some(index);
            }
        }
        loop {
            let cursor = &mut cursors[least];
            merge.merged.push((cursor.slot, cursor.at));
            let more = merge.advance(cursor)?;
            if merge.merged.len() >= merge.batch_rows
                && let Some(batch) = merge.gather(cursors)?
                && !send(batch)
            {
                return Ok(());
            }
            if !more {
                // Its last batch stays held while merged rows come from it.
                cursors.swap_remove(least);
                break;
            }
            if next.is_some_and(|next| key(&cursors[least]) > key(&cursors[next])) {
                break;
            }
        }
    }
    if let Some(batch) = merge.gather(cursors)? {
        send(batch);
    }
    Ok(())
}

/// The sort key of the row `cursor` is at.
fn key<'a>(cursor: &'a Cursor<'_>) -> Row<'a> {
    cursor.keys.row(cursor.at)
}

/// Writes the batches received to `path`, laid out as `layout` says, its columns encoded on
/// one lane per core. Returns the rows written.
fn write_all(
    path: &Path,
    schema: SchemaRef,
    layout: &Layout,
    batches: Receiver<RecordBatch>,
) -> Result<u64, TableError> {
    // The merge keeps a core busy; the columns are encoded on one lane per core beside it, as
    // one encoding thread set the fold's pace (docs/performance.md).
    let encoders = std::thread::available_parallelism().map_or(1, usize::from);
    let mut file = ParquetFile::create_on(path, schema, layout, encoders)?;
    for batch in batches {
        file.write(&batch)?;
    }
    file.finish()
}

/// The rows of a file of `rows` rows that are kept when the sorted row numbers `dropped` are
/// not.
fn kept_rows(dropped: &[usize], rows: usize) -> RowSelection {
    let mut selectors = Vec::with_capacity(2 * dropped.len() + 1);
    let mut next = 0;
    for &number in dropped.iter().filter(|number| **number < rows) {
        if number > next {
            selectors.push(RowSelector::select(number - next));
        }
        selectors.push(RowSelector::skip(1));
        next = number + 1;
    }
    if rows > next {
        selectors.push(RowSelector::select(rows - next));
    }
    RowSelection::from(selectors)
}

/// The one schema of every file, by column names and types, every column nullable; none if
/// two files differ. DuckDB marks a column required when the table it copied declared it
/// `NOT NULL` (earlier builds staged rows in one), the crate's files never do, and a base
/// merged from both must take either's rows.
fn common_schema<'a>(mut schemas: impl Iterator<Item = &'a SchemaRef>) -> Option<SchemaRef> {
    let first = schemas.next()?;
    let same = |other: &SchemaRef| {
        other.fields().len() == first.fields().len()
            && other
                .fields()
                .iter()
                .zip(first.fields())
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type())
    };
    if !schemas.all(same) {
        return None;
    }
    let fields: Vec<Field> = first
        .fields()
        .iter()
        .map(|field| field.as_ref().clone().with_nullable(true))
        .collect();
    Some(Arc::new(Schema::new(fields)))
}

#[cfg(test)]
mod tests {
    use super::super::newest::{path_literal, write_newest};
    use super::*;

    const SORT_KEY: [&str; 4] = ["job_id", "creation_time_ms", "task_id", "attempt_number"];

    const LAYOUT: Layout = Layout {
        row_group_rows: 122_880,
        unique: &["task_id"],
    };

    /// Writes `select` to `path` in `order`, in DuckDB, compressed as table files are.
    fn copy_in_order(
        connection: &Connection,
        select: &str,
        order: &str,
        path: &Path,
    ) -> duckdb::Result<()> {
        connection.execute_batch(&format!(
            "COPY ({select} ORDER BY {order}) TO {}
                 (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 122880)",
            path_literal(path)
        ))
    }

    /// [`copy_in_order`] sorted as every table file is.
    fn copy_sorted(connection: &Connection, select: &str, path: &Path) -> duckdb::Result<()> {
        copy_in_order(connection, select, &SORT_KEY.join(", "), path)
    }

    /// Attempts `first..first + count` as rows of a table file, their values salted by
    /// `salt`, with nulls in the sort key.
    fn rows(first: i64, count: i64, salt: &str) -> String {
        format!(
            "SELECT CASE WHEN i % 97 = 0 THEN NULL ELSE 'job-' || (i % 5) END AS job_id,
                    CASE WHEN i % 89 = 0 THEN NULL ELSE 1000 + hash(i || '{salt}') % 50000 END
                        AS creation_time_ms,
                    md5(i::VARCHAR) AS task_id,
                    (i % 2)::INTEGER AS attempt_number,
                    '{salt}-' || i AS state,
                    (i % 7)::UTINYINT AS code,
                    i % 3 = 0 AS flag
             FROM range({first}, {first} + {count}) t(i)"
        )
    }

    /// The deletion vector of the file `file` among `paths` (oldest first): the rows of the
    /// files before it that it replaces, each named by its file's index plus `shift` (as a
    /// vector names files when the session had `shift` files more then).
    fn vector(
        connection: &Connection,
        paths: &[&Path],
        file: usize,
        shift: usize,
        path: &Path,
    ) -> duckdb::Result<u64> {
        let versions: Vec<String> = paths
            .iter()
            .enumerate()
            .map(|(index, path)| {
                format!(
                    "SELECT {index} AS f, file_row_number AS r, task_id, attempt_number
                     FROM read_parquet({}, file_row_number = true)",
                    path_literal(path)
                )
            })
            .collect();
        connection.execute_batch(&format!(
            "COPY (WITH versions AS ({})
                   SELECT v.f + {shift} AS file, v.r AS row FROM versions v
                   JOIN versions n USING (task_id, attempt_number)
                   WHERE n.f = {file} AND v.f < {file} ORDER BY 1, 2)
             TO {} (FORMAT parquet)",
            versions.join(" UNION ALL "),
            path_literal(path)
        ))?;
        connection.query_row(
            &format!("SELECT count(*) FROM read_parquet({})", path_literal(path)),
            [],
            |row| row.get(0),
        )
    }

    /// Paths for a base and a delta in `dir`.
    fn base_and_delta(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
        (dir.join("base.parquet"), dir.join("delta.parquet"))
    }

    /// A session of `base` and `delta`, the delta replacing no row.
    fn replacing_nothing<'a>(base: &'a Path, delta: &'a Path) -> TableFiles<'a> {
        TableFiles {
            base: vec![base],
            deltas: vec![delta],
            one_session: true,
            deletes: Some(Vec::new()),
        }
    }

    /// Merges `files` reading `batch_rows` rows at a time and checks the file against DuckDB's
    /// sort of their newest rows: the same rows at the same places, of the same column types,
    /// in row groups of the same sizes. Returns the rows.
    fn merges_as_duckdb_sorts(
        connection: &Connection,
        files: &TableFiles<'_>,
        batch_rows: usize,
        dir: &Path,
    ) -> Result<u64, Box<dyn std::error::Error>> {
        let ours = dir.join(format!("ours-{batch_rows}.parquet"));
        let written = merge_in_batches(connection, files, &SORT_KEY, &LAYOUT, batch_rows, &ours)?;
        let theirs = dir.join("theirs.parquet");
        let expected = write_newest(
            connection,
            files,
            &SORT_KEY.join(", "),
            "FORMAT parquet, ROW_GROUP_SIZE 122880",
            &theirs,
        )?;
        assert_eq!(written, Some(expected), "rows merged");
        let count =
            |sql: &str| -> duckdb::Result<i64> { connection.query_row(sql, [], |row| row.get(0)) };
        let read = |path: &Path| {
            format!(
                "read_parquet({}, file_row_number = true)",
                path_literal(path)
            )
        };
        for (left, right) in [(read(&ours), read(&theirs)), (read(&theirs), read(&ours))] {
            let extra = count(&format!(
                "SELECT count(*) FROM (SELECT * FROM {left} EXCEPT ALL SELECT * FROM {right})"
            ))?;
            assert_eq!(extra, 0, "rows of {left} not at the same place in {right}");
        }
        let describe = |path: &Path| {
            crate::tables::columns(connection, &format!("read_parquet({})", path_literal(path)))
        };
        assert_eq!(describe(&ours)?, describe(&theirs)?, "column types");
        let groups = |path: &Path| -> duckdb::Result<Vec<i64>> {
            let mut statement = connection.prepare(&format!(
                "SELECT row_group_num_rows FROM parquet_metadata({})
                 WHERE path_in_schema = 'task_id' ORDER BY row_group_id",
                path_literal(path)
            ))?;
            let rows = statement.query_map([], |row| row.get(0))?;
            rows.collect()
        };
        assert_eq!(groups(&ours)?, groups(&theirs)?, "row groups");
        Ok(expected)
    }

    /// A base of several row groups and two deltas that replace some of its rows (some moved
    /// to other places in the order, some the second delta replaces again) and add new ones,
    /// with nulls in the sort key, the second delta's vector naming files as it did when the
    /// session had one more: the merge writes the rows DuckDB's sort of the newest rows
    /// writes, in batches as read and in batches of a few rows (every batch boundary a case).
    #[test]
    fn a_merge_of_sorted_files_is_duckdbs_sort_of_their_newest_rows()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = crate::tables::open_duckdb()?;
        let base = dir.path().join("base.parquet");
        let first = dir.path().join("delta-1.parquet");
        let second = dir.path().join("delta-2.parquet");
        copy_sorted(&connection, &rows(0, 300_000, "base"), &base)?;
        // Every tenth attempt again (its creation time changed: it moves), and new ones.
        copy_sorted(
            &connection,
            &format!(
                "{} WHERE i % 10 = 0 UNION ALL {}",
                rows(0, 300_000, "one"),
                rows(300_000, 20_000, "one")
            ),
            &first,
        )?;
        // Some of those again, other base rows, and new ones.
        copy_sorted(
            &connection,
            &format!(
                "{} WHERE i % 30 = 0 OR i % 10 = 3 UNION ALL {}",
                rows(0, 320_000, "two"),
                rows(320_000, 5_000, "two")
            ),
            &second,
        )?;
        let paths = [base.as_path(), &first, &second];
        let (first_vector, second_vector) = (
            dir.path().join("deletes-1.parquet"),
            dir.path().join("deletes-2.parquet"),
        );
        let first_rows = vector(&connection, &paths, 1, 0, &first_vector)?;
        let second_rows = vector(&connection, &paths, 2, 1, &second_vector)?;
        let (same, shifted) = ([Some(0)], [None, Some(0), Some(1)]);
        let files = TableFiles {
            base: vec![&base],
            deltas: vec![&first, &second],
            one_session: true,
            deletes: Some(vec![
                DeletionVector {
                    path: &first_vector,
                    files: &same,
                    rows: first_rows,
                },
                DeletionVector {
                    path: &second_vector,
                    files: &shifted,
                    rows: second_rows,
                },
            ]),
        };
        for batch_rows in [BATCH_ROWS, 97] {
            let rows = merges_as_duckdb_sorts(&connection, &files, batch_rows, dir.path())?;
            assert!(rows > 300_000, "{rows} rows");
        }
        let nulls = |column: &str| -> duckdb::Result<i64> {
            connection.query_row(
                &format!(
                    "SELECT count(*) FROM read_parquet({}) WHERE {column} IS NULL",
                    path_literal(&dir.path().join("theirs.parquet"))
                ),
                [],
                |row| row.get(0),
            )
        };
        for column in ["job_id", "creation_time_ms"] {
            assert!(nulls(column)? > 0, "no NULL {column}");
        }
        Ok(())
    }

    /// A file every row of which a later one replaced adds nothing, and the merge goes on.
    #[test]
    fn a_file_whose_rows_were_all_replaced_adds_none() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = crate::tables::open_duckdb()?;
        let (base, delta) = base_and_delta(dir.path());
        copy_sorted(&connection, &rows(0, 1_000, "base"), &base)?;
        copy_sorted(&connection, &rows(0, 1_500, "again"), &delta)?;
        let deletes = dir.path().join("deletes.parquet");
        let replaced = vector(&connection, &[&base, &delta], 1, 0, &deletes)?;
        assert_eq!(replaced, 1_000);
        let files = TableFiles {
            base: vec![&base],
            deltas: vec![&delta],
            one_session: true,
            deletes: Some(vec![DeletionVector {
                path: &deletes,
                files: &[Some(0)],
                rows: replaced,
            }]),
        };
        assert_eq!(
            merges_as_duckdb_sorts(&connection, &files, BATCH_ROWS, dir.path())?,
            1_500
        );
        Ok(())
    }

    /// A base whose columns DuckDB wrote as required (copied from a table that declared them
    /// `NOT NULL`, as earlier builds staged rows) merges with a delta holding nulls in them.
    #[test]
    fn files_whose_columns_are_required_in_one_and_not_the_other_merge()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = crate::tables::open_duckdb()?;
        let (base, delta) = base_and_delta(dir.path());
        connection.execute_batch(&format!(
            "CREATE TABLE staged AS SELECT * FROM ({}) WHERE job_id IS NOT NULL
                 AND creation_time_ms IS NOT NULL;
             ALTER TABLE staged ALTER job_id SET NOT NULL;
             ALTER TABLE staged ALTER creation_time_ms SET NOT NULL;
             ALTER TABLE staged ALTER task_id SET NOT NULL;
             ALTER TABLE staged ALTER attempt_number SET NOT NULL;
             ALTER TABLE staged ALTER state SET NOT NULL;",
            rows(0, 2_000, "base")
        ))?;
        copy_sorted(&connection, "SELECT * FROM staged", &base)?;
        copy_sorted(&connection, &rows(2_000, 1_000, "new"), &delta)?;
        let required: i64 = connection.query_row(
            &format!(
                "SELECT count(*) FROM parquet_schema({}) WHERE repetition_type = 'REQUIRED'",
                path_literal(&base)
            ),
            [],
            |row| row.get(0),
        )?;
        // The five declared `NOT NULL` (and, by DuckDB's count, the schema's root).
        assert!(required >= 5, "{required} required columns in the base");
        let files = replacing_nothing(&base, &delta);
        let rows = merges_as_duckdb_sorts(&connection, &files, BATCH_ROWS, dir.path())?;
        assert!(rows > 2_900, "{rows} rows");
        Ok(())
    }

    /// Files of other columns (a build's before) and deltas without deletion vectors are not
    /// for this merge: it declines them before reading a row, and DuckDB folds them.
    #[test]
    fn files_it_cannot_merge_are_declined() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = crate::tables::open_duckdb()?;
        let (old, new) = (
            dir.path().join("old.parquet"),
            dir.path().join("new.parquet"),
        );
        copy_sorted(
            &connection,
            "SELECT 'job' AS job_id, 1 AS creation_time_ms, 'a' AS task_id, 0 AS attempt_number",
            &old,
        )?;
        copy_sorted(
            &connection,
            "SELECT 'job' AS job_id, 2 AS creation_time_ms, 'b' AS task_id, 0 AS attempt_number,
                    'FINISHED' AS state",
            &new,
        )?;
        let out = dir.path().join("out.parquet");
        let mut files = replacing_nothing(&old, &new);
        assert_eq!(
            merge_newest(&connection, &files, &SORT_KEY, &LAYOUT, &out)?,
            None
        );
        files.base = vec![&new];
        files.deltas = vec![&new];
        files.deletes = None;
        assert_eq!(
            merge_newest(&connection, &files, &SORT_KEY, &LAYOUT, &out)?,
            None
        );
        Ok(())
    }

    /// A file not in the order (a bug, or a sort key changed under older files) would make a
    /// misordered base whose row groups no longer skip: it is an error instead, and nothing
    /// written is left behind. So is a base that cannot be written, without waiting forever.
    #[test]
    fn a_file_out_of_order_or_a_failed_write_is_an_error_that_leaves_no_file()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = crate::tables::open_duckdb()?;
        let (base, delta) = base_and_delta(dir.path());
        copy_sorted(&connection, &rows(0, 50_000, "base"), &base)?;
        copy_in_order(
            &connection,
            &rows(50_000, 50_000, "new"),
            "task_id DESC",
            &delta,
        )?;
        let files = replacing_nothing(&base, &delta);
        let out = dir.path().join("out.parquet");
        let merged = merge_newest(&connection, &files, &SORT_KEY, &LAYOUT, &out);
        assert!(
            matches!(&merged, Err(TableError::Corrupt(why)) if why.contains("not in the order")),
            "{merged:?}"
        );
        assert!(!out.exists(), "a partial base was left");
        // What a fold does with them: DuckDB sorts the rows instead.
        let folded = super::super::task_attempts::write_newest(&connection, &files, &out)?;
        assert_eq!(folded, 100_000);
        let misplaced: i64 = connection.query_row(
            &format!(
                "SELECT count(*) FROM (
                     SELECT job_id, lag(job_id) OVER (ORDER BY file_row_number) AS previous
                     FROM read_parquet({}, file_row_number = true))
                 WHERE job_id < previous",
                path_literal(&out)
            ),
            [],
            |row| row.get(0),
        )?;
        assert_eq!(misplaced, 0, "the fold is not in job order");
        let sorted = TableFiles {
            deltas: Vec::new(),
            ..files
        };
        let nowhere = dir.path().join("missing").join("out.parquet");
        let merged = merge_newest(&connection, &sorted, &SORT_KEY, &LAYOUT, &nowhere);
        assert!(
            matches!(merged, Err(TableError::Write { .. })),
            "{merged:?}"
        );
        Ok(())
    }
}
