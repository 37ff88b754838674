//! A fold's base merged in Rust: the newest rows of a table's files, which are each sorted
//! already, merged in their order and written as deltas are ([`super::parquet_file`]).
//!
//! Every file a run or a fold writes is in one order ([`super::task_attempts`]'s sort key),
//! and a fold keeps every row its deletion vectors do not drop, so the newest rows in that
//! order are a merge of sorted files, not a sort. DuckDB's `ORDER BY … COPY` sorted them all
//! again (a sort of ~80 wide columns that spills to disk) before encoding them at ~2.7 core-µs a
//! row; here each file is read once in order, and the merged rows are encoded on a thread of
//! their own while the next are merged.
//!
//! Only files this build can merge are merged here: every delta with a deletion vector, and
//! every file with the same columns. Otherwise ([`merge_newest`] answers `None`) the fold is
//! left to DuckDB, which matches columns by name.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};

use duckdb::Connection;
use duckdb::arrow::array::RecordBatch;
use duckdb::arrow::compute::{SortOptions, interleave_record_batch};
use duckdb::arrow::datatypes::SchemaRef;
use duckdb::arrow::row::{Row, RowConverter, Rows, SortField};
use parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};

use super::newest::{TableFiles, read_parquet};
use super::parquet_file::{Layout, ParquetFile};
use super::task_attempts::TableError;

/// Rows decoded from a file at a time, and rows gathered into each batch written: a few
/// megabytes of each file's columns in memory at once.
const BATCH_ROWS: usize = 8192;

/// One file being read in order, its rows dropped where its deletion vectors name them.
struct Cursor<'a> {
    path: &'a Path,
    reader: ParquetRecordBatchReader,
    /// The batch being merged, its place in [`Merge::held`], and its rows' sort keys.
    slot: usize,
    keys: Rows,
    rows: usize,
    /// The next row of the batch to merge.
    at: usize,
}

/// The merge of sorted files into batches of their rows in order.
struct Merge {
    converter: RowConverter,
    sort_key: &'static [&'static str],
    schema: SchemaRef,
    /// Batches that merged rows still come from, until they are gathered.
    held: Vec<RecordBatch>,
    /// The rows merged and not yet gathered: (batch in `held`, row).
    merged: Vec<(usize, usize)>,
}

impl Merge {
    /// The next non-empty batch of `reader` (reading `path`), with its place in `held`, its
    /// sort keys and its rows.
    fn next_batch(
        &mut self,
        path: &Path,
        reader: &mut ParquetRecordBatchReader,
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
            .next_batch(path, &mut reader)?
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
        match self.next_batch(cursor.path, &mut cursor.reader)? {
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
            if let Some(batch) = self.held.get(cursor.slot) {
                kept.push(batch.clone());
                cursor.slot = kept.len() - 1;
            }
        }
        self.held = kept;
        Ok(Some(gathered))
    }
}

/// Writes the newest rows of `files` (each sorted by `sort_key`, ascending, nulls last) to
/// `path`, merged in that order. Returns the rows written, or `None` when the files cannot be
/// merged here (a delta without a deletion vector, or files of other columns): nothing is
/// written then.
pub(super) fn merge_newest(
    connection: &Connection,
    files: &TableFiles<'_>,
    sort_key: &'static [&'static str],
    layout: &Layout,
    path: &Path,
) -> Result<Option<u64>, TableError> {
    let Some(vectors) = files.deletes.as_ref() else {
        return Ok(None);
    };
    let all: Vec<&Path> = files.base.iter().chain(&files.deltas).copied().collect();
    let mut superseded: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for vector in vectors {
        let mut statement = connection.prepare(&format!(
            "SELECT file, row FROM {}",
            read_parquet(&[vector.path], "")
        ))?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let (file, number): (i64, i64) = (row.get(0)?, row.get(1)?);
            let read = usize::try_from(file)
                .ok()
                .and_then(|file| vector.files.get(file).copied().flatten());
            if let (Some(read), Ok(number)) = (read, usize::try_from(number)) {
                superseded.entry(read).or_default().push(number);
            }
        }
    }
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
        let mut dropped = superseded.remove(&index).unwrap_or_default();
        dropped.sort_unstable();
        dropped.dedup();
        builders.push((
            *file,
            builder.with_batch_size(BATCH_ROWS),
            kept_rows(&dropped, rows),
        ));
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
        held: Vec::new(),
        merged: Vec::with_capacity(BATCH_ROWS),
    };
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
    let (sender, batches) = sync_channel::<RecordBatch>(2);
    let written = std::thread::scope(|scope| {
        let writer = scope.spawn(|| write_all(path, Arc::clone(&schema), layout, batches));
        let merged = merge_all(&mut merge, &mut cursors, |batch| sender.send(batch).is_ok());
        drop(sender);
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(TableError::Corrupt("the fold's writer panicked".into())));
        merged.and(written)
    })?;
    Ok(Some(written))
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
            if merge.merged.len() >= BATCH_ROWS
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

/// Writes the batches received to `path`, laid out as `layout` says. Returns the rows
/// written.
fn write_all(
    path: &Path,
    schema: SchemaRef,
    layout: &Layout,
    batches: Receiver<RecordBatch>,
) -> Result<u64, TableError> {
    let failed = |source| TableError::Write {
        path: path.to_owned(),
        source,
    };
    let mut file = ParquetFile::create(path, schema, layout).map_err(failed)?;
    for batch in batches {
        file.write(&batch).map_err(failed)?;
    }
    file.finish().map_err(failed)
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

/// The one schema of every file, by column names and types; none if two differ.
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
    schemas.all(same).then(|| Arc::clone(first))
}

#[cfg(test)]
mod tests {
    use super::super::newest::{DeletionVector, path_literal, write_newest};
    use super::*;

    const SORT_KEY: [&str; 4] = ["job_id", "creation_time_ms", "task_id", "attempt_number"];

    const LAYOUT: Layout = Layout {
        row_group_rows: 122_880,
        unique: &["task_id"],
    };

    /// Writes `select` to `path` sorted as every table file is, in DuckDB, compressed as
    /// table files are (ZSTD) or as DuckDB compresses by default (Snappy).
    fn copy_sorted(
        connection: &Connection,
        select: &str,
        path: &Path,
        zstd: bool,
    ) -> duckdb::Result<()> {
        let compression = if zstd { "zstd" } else { "snappy" };
        connection.execute_batch(&format!(
            "COPY ({select} ORDER BY {}) TO {}
                 (FORMAT parquet, COMPRESSION {compression}, ROW_GROUP_SIZE 122880)",
            SORT_KEY.join(", "),
            path_literal(path)
        ))
    }

    /// The rows of `versions` (a table of every version written, with the file `f` holding it
    /// and its row `r` there) that a later file replaced, as a deletion vector for the file
    /// `file`.
    fn vector(connection: &Connection, file: i64, path: &Path) -> duckdb::Result<u64> {
        connection.execute_batch(&format!(
            "COPY (SELECT v.f AS file, v.r AS row FROM versions v
                   JOIN versions n USING (task_id, attempt_number)
                   WHERE n.f = {file} AND v.f < {file} ORDER BY 1, 2)
             TO {} (FORMAT parquet)",
            path_literal(path)
        ))?;
        connection.query_row(
            &format!("SELECT count(*) FROM read_parquet({})", path_literal(path)),
            [],
            |row| row.get(0),
        )
    }

    /// A base of several row groups and two deltas that replace some of its rows (some moved
    /// to other places in the order, some the second delta replaces again) and add new ones,
    /// with nulls in the sort key: the merge writes the rows DuckDB's sort of the newest rows
    /// writes, in the same order, in row groups of the same size.
    #[test]
    fn a_merge_of_sorted_files_is_duckdbs_sort_of_their_newest_rows()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = crate::tables::open_duckdb()?;
        let rows = |first: i64, count: i64, salt: &str| {
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
        };
        let base = dir.path().join("base.parquet");
        let first = dir.path().join("delta-1.parquet");
        let second = dir.path().join("delta-2.parquet");
        copy_sorted(&connection, &rows(0, 300_000, "base"), &base, true)?;
        // Every tenth attempt again (its creation time changed: it moves), and new ones.
        copy_sorted(
            &connection,
            &format!(
                "{} WHERE i % 10 = 0 UNION ALL {}",
                rows(0, 300_000, "one"),
                rows(300_000, 20_000, "one")
            ),
            &first,
            false,
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
            true,
        )?;
        let versions: Vec<String> = [&base, &first, &second]
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
            "CREATE TABLE versions AS {}",
            versions.join(" UNION ALL ")
        ))?;
        let (first_vector, second_vector) = (
            dir.path().join("deletes-1.parquet"),
            dir.path().join("deletes-2.parquet"),
        );
        let first_rows = vector(&connection, 1, &first_vector)?;
        let second_rows = vector(&connection, 2, &second_vector)?;
        let positions = [Some(0), Some(1), Some(2)];
        let files = TableFiles {
            base: vec![&base],
            deltas: vec![&first, &second],
            one_session: true,
            deletes: Some(vec![
                DeletionVector {
                    path: &first_vector,
                    files: &positions[..1],
                    rows: first_rows,
                },
                DeletionVector {
                    path: &second_vector,
                    files: &positions[..2],
                    rows: second_rows,
                },
            ]),
        };
        let ours = dir.path().join("ours.parquet");
        let written = merge_newest(&connection, &files, &SORT_KEY, &LAYOUT, &ours)?;
        let theirs = dir.path().join("theirs.parquet");
        let expected = write_newest(
            &connection,
            &files,
            &SORT_KEY.join(", "),
            "FORMAT parquet, ROW_GROUP_SIZE 122880",
            &theirs,
        )?;
        assert_eq!(written, Some(expected), "rows merged");
        assert!(expected > 300_000, "{expected} rows");
        let count =
            |sql: &str| -> duckdb::Result<i64> { connection.query_row(sql, [], |row| row.get(0)) };
        let (ours, theirs) = (
            format!(
                "read_parquet({}, file_row_number = true)",
                path_literal(&ours)
            ),
            format!(
                "read_parquet({}, file_row_number = true)",
                path_literal(&theirs)
            ),
        );
        for (left, right) in [(&ours, &theirs), (&theirs, &ours)] {
            let extra = count(&format!(
                "SELECT count(*) FROM (SELECT * FROM {left} EXCEPT ALL SELECT * FROM {right})"
            ))?;
            assert_eq!(extra, 0, "rows of {left} not at the same place in {right}");
        }
        for column in ["job_id", "creation_time_ms"] {
            let nulls = count(&format!(
                "SELECT count(*) FROM {ours} WHERE {column} IS NULL"
            ))?;
            assert!(nulls > 0, "no NULL {column}");
        }
        let groups = |file: &str| -> duckdb::Result<Vec<i64>> {
            let mut statement = connection.prepare(&format!(
                "SELECT row_group_num_rows FROM parquet_metadata({file})
                 WHERE path_in_schema = 'task_id' ORDER BY row_group_id"
            ))?;
            let rows = statement.query_map([], |row| row.get(0))?;
            rows.collect()
        };
        let (ours_path, theirs_path) = (
            path_literal(&dir.path().join("ours.parquet")),
            path_literal(&dir.path().join("theirs.parquet")),
        );
        assert_eq!(groups(&ours_path)?, groups(&theirs_path)?, "row groups");
        Ok(())
    }

    /// Files of other columns (a build's before) and deltas without deletion vectors are left
    /// to DuckDB, which matches columns by name and finds superseded rows by key.
    #[test]
    fn files_it_cannot_merge_are_not_merged() -> Result<(), Box<dyn std::error::Error>> {
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
            true,
        )?;
        copy_sorted(
            &connection,
            "SELECT 'job' AS job_id, 2 AS creation_time_ms, 'b' AS task_id, 0 AS attempt_number,
                    'FINISHED' AS state",
            &new,
            true,
        )?;
        let out = dir.path().join("out.parquet");
        let mut files = TableFiles {
            base: vec![&old],
            deltas: vec![&new],
            one_session: true,
            deletes: Some(Vec::new()),
        };
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
        assert!(!out.exists(), "a file was written");
        Ok(())
    }
}
