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
//! Most of a large base is not changed by the deltas folded into it: a session goes on at
//! each job's newest attempts, and replaces the versions of attempts that were still running.
//! The base's row groups that no delta row falls among and none of whose rows is replaced are
//! copied into the new base as they are encoded, without decoding a column
//! ([`copyable_groups`]); only the others are merged.
//!
//! Files this build cannot merge are left to DuckDB, which matches columns by name and sorts
//! whatever it is given: a delta without a deletion vector or files of other columns
//! ([`merge_newest`] answers `None`), and a file found out of order or unreadable here (an
//! error, after which nothing of the merge is left on disk).

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};

use duckdb::Connection;
use duckdb::arrow::array::RecordBatch;
use duckdb::arrow::compute::{SortOptions, interleave_record_batch};
use duckdb::arrow::datatypes::{Field, Schema, SchemaRef};
use duckdb::arrow::row::{OwnedRow, Row, RowConverter, Rows, SortField};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use parquet::arrow::{ArrowSchemaConverter, ProjectionMask};
use parquet::file::metadata::PageIndexPolicy;

use super::key_index::{KeyIndex, TASK_ID};
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
    /// The base's row groups still to be copied as they are, in order: each goes before the
    /// first merged row past its first key.
    copies: VecDeque<GroupCopy>,
}

/// A row group of the base to copy as it is, with the sort keys of its first and last rows.
struct GroupCopy {
    /// Its number in the base.
    group: usize,
    /// The sort key of its first row.
    first: OwnedRow,
    /// The sort key of its last row.
    last: OwnedRow,
}

/// What the merge hands the writer, in the order of the file.
enum Piece {
    /// Rows to encode.
    Rows(RecordBatch),
    /// The base's row group of this number, to append as it is encoded there.
    Copy(usize),
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
            let keys = sort_keys(&self.converter, self.sort_key, &batch)?;
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

/// Writes the newest rows of `files` (each sorted by `sort_key`, ascending, nulls last) to `path`,
/// merged in that order and laid out as `layout` says. Returns the rows written and their key index
/// ([`super::key_index`]), or `None` when the files are not for this merge (a delta without a
/// deletion vector, files of other columns): nothing is written then, nor after an error.
pub(super) fn merge_newest(
    connection: &Connection,
    files: &TableFiles<'_>,
    sort_key: &'static [&'static str],
    layout: &Layout,
    path: &Path,
) -> Result<Option<(u64, KeyIndex)>, TableError> {
    let merged = merge_in_batches(connection, files, sort_key, layout, BATCH_ROWS, path)?;
    Ok(merged.map(|merged| {
        tracing::debug!(
            rows = merged.rows,
            copied_groups = merged.copied_groups,
            "the fold's base merged"
        );
        (merged.rows, merged.index)
    }))
}

/// What a merge wrote.
#[derive(Debug)]
struct Merged {
    /// Rows in the file.
    rows: u64,
    /// Row groups of the base copied as they were, not decoded.
    copied_groups: usize,
    /// The key index of its rows.
    index: KeyIndex,
}

/// A file to merge, opened, with the rows of it that are dropped.
struct Source<'a> {
    /// Where it is: what errors name, and what the copying thread opens for itself.
    path: &'a Path,
    /// Read by the merging thread alone: handles cloned from it share one read position.
    file: File,
    /// Its footer (a base's with its offset index, which copying its row groups keeps).
    metadata: ArrowReaderMetadata,
    /// The rows its deletion vectors name, sorted.
    dropped: Vec<usize>,
}

impl Source<'_> {
    /// Opens `path`, with its offset index when `indexed`.
    fn open(path: &Path, indexed: bool, dropped: Vec<usize>) -> Result<Source<'_>, TableError> {
        let unreadable = |source| TableError::Read {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(|err| unreadable(err.into()))?;
        let options = if indexed {
            ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Optional)
        } else {
            ArrowReaderOptions::new()
        };
        let metadata = ArrowReaderMetadata::load(&file, options).map_err(unreadable)?;
        Ok(Source {
            path,
            file,
            metadata,
            dropped,
        })
    }

    /// A reader of the file's rows that are kept, in row groups other than `copied`, of the
    /// columns `projection` names (every column when none).
    fn reader(
        &self,
        batch_rows: usize,
        copied: &[usize],
        projection: Option<&[&str]>,
    ) -> Result<ParquetRecordBatchReader, TableError> {
        let unreadable = |source| TableError::Read {
            path: self.path.to_path_buf(),
            source,
        };
        let file = self
            .file
            .try_clone()
            .map_err(|err| unreadable(err.into()))?;
        let mut groups = Vec::new();
        let mut start = 0;
        for (group, meta) in self.metadata.metadata().row_groups().iter().enumerate() {
            let rows = usize::try_from(meta.num_rows()).map_err(|_| {
                TableError::Corrupt(format!(
                    "{}: a row group of {} rows",
                    self.path.display(),
                    meta.num_rows()
                ))
            })?;
            if !copied.contains(&group) {
                groups.push((group, start, rows));
            }
            start += rows;
        }
        let kept = kept_rows(
            &self.dropped,
            groups.iter().map(|(_, start, rows)| (*start, *rows)),
        );
        let mut builder =
            ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.metadata.clone())
                .with_batch_size(batch_rows)
                .with_row_groups(groups.iter().map(|(group, _, _)| *group).collect())
                .with_row_selection(kept);
        if let Some(names) = projection {
            let mask = ProjectionMask::columns(
                self.metadata.metadata().file_metadata().schema_descr(),
                names.iter().copied(),
            );
            builder = builder.with_projection(mask);
        }
        builder.build().map_err(unreadable)
    }
}

/// [`merge_newest`], reading and gathering `batch_rows` rows at a time.
fn merge_in_batches(
    connection: &Connection,
    files: &TableFiles<'_>,
    sort_key: &'static [&'static str],
    layout: &Layout,
    batch_rows: usize,
    path: &Path,
) -> Result<Option<Merged>, TableError> {
    let Some(vectors) = files.deletes.as_ref() else {
        return Ok(None);
    };
    let all: Vec<&Path> = files.base.iter().chain(&files.deltas).copied().collect();
    let mut superseded = superseded_rows(connection, vectors)?;
    let mut sources = Vec::with_capacity(all.len());
    for (index, file) in all.iter().enumerate() {
        let dropped = superseded.remove(&index).unwrap_or_default();
        sources.push(Source::open(file, index < files.base.len(), dropped)?);
    }
    let Some(schema) = common_schema(sources.iter().map(|source| source.metadata.schema())) else {
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
    let converter = RowConverter::new(fields)?;
    // One base: the row groups of it that no other file's row falls among are copied.
    let copies = match sources.split_first() {
        Some((base, others)) if files.base.len() == 1 => copyable_groups(
            base, others, &schema, &converter, sort_key, layout, batch_rows,
        )?,
        _ => Vec::new(),
    };
    let copied: Vec<usize> = copies.iter().map(|copy| copy.group).collect();
    let mut merge = Merge {
        converter,
        sort_key,
        schema: Arc::clone(&schema),
        batch_rows,
        held: Vec::new(),
        merged: Vec::with_capacity(batch_rows),
        copies: copies.into(),
    };
    let written = merge_to(&mut merge, &sources, &copied, layout, path);
    if written.is_err() {
        // A partial base is nobody's: the fold failed, and the next one writes anew.
        let _ = std::fs::remove_file(path);
    }
    written.map(|(rows, index)| {
        Some(Merged {
            rows,
            copied_groups: copied.len(),
            index,
        })
    })
}

/// The sort keys of `batch`'s rows.
fn sort_keys(
    converter: &RowConverter,
    sort_key: &[&str],
    batch: &RecordBatch,
) -> Result<Rows, TableError> {
    let columns = sort_key
        .iter()
        .map(|name| {
            batch
                .column_by_name(name)
                .cloned()
                .ok_or_else(|| TableError::Corrupt(format!("a file to fold has no {name} column")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(converter.convert_columns(&columns)?)
}

/// The row groups of `base` to copy into the new base as they are, in order: those of the
/// [`candidate_groups`] among whose rows no kept row of the `others` falls. A base's rows
/// change where its session goes on (each job's newest attempts), so most of a large base's
/// row groups are copied.
fn copyable_groups(
    base: &Source<'_>,
    others: &[Source<'_>],
    schema: &SchemaRef,
    converter: &RowConverter,
    sort_key: &[&str],
    layout: &Layout,
    batch_rows: usize,
) -> Result<Vec<GroupCopy>, TableError> {
    let candidates = candidate_groups(base, schema, layout);
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let bounded = group_bounds(base, &candidates, converter, sort_key, batch_rows)?;
    let touched = touched_groups(others, &bounded, converter, sort_key, batch_rows)?;
    Ok(bounded
        .into_iter()
        .zip(touched)
        .filter(|(_, touched)| !touched)
        .map(|(copy, _)| copy)
        .collect())
}

/// The row groups of `base` that may be copied, as (group, its first row, its rows): none of
/// their rows dropped, at least half as large as `layout`'s row groups (so that the groups
/// merged between two copies stay few), with offset indexes, in a file of the columns the new
/// base has (a base DuckDB wrote has other column descriptors).
fn candidate_groups(
    base: &Source<'_>,
    schema: &SchemaRef,
    layout: &Layout,
) -> Vec<(usize, usize, usize)> {
    let metadata = base.metadata.metadata();
    let flat = !schema
        .fields()
        .iter()
        .any(|field| field.data_type().is_nested());
    // A schema the writer cannot take fails there, naming the file.
    let Ok(written) = ArrowSchemaConverter::new().convert(schema) else {
        return Vec::new();
    };
    if !flat || written.columns() != metadata.file_metadata().schema_descr().columns() {
        return Vec::new();
    }
    let mut candidates = Vec::new();
    let mut start = 0;
    for (group, meta) in metadata.row_groups().iter().enumerate() {
        let rows = usize::try_from(meta.num_rows()).unwrap_or(0);
        let end = start + rows;
        let first_dropped = base.dropped.partition_point(|row| *row < start);
        let whole = base
            .dropped
            .get(first_dropped)
            .is_none_or(|row| *row >= end);
        let page_index = metadata.page_index_for_row_group(group);
        let indexed =
            (0..meta.num_columns()).all(|column| page_index.offset_index(column).is_some());
        if whole && indexed && rows > 0 && rows * 2 >= layout.row_group_rows {
            candidates.push((group, start, rows));
        }
        start = end;
    }
    candidates
}

/// Each of the `candidates` (as [`candidate_groups`] gives them) with the sort keys of its
/// first and last rows, read alone. Candidates out of order are an error, as a file out of
/// order is in the merge.
fn group_bounds(
    base: &Source<'_>,
    candidates: &[(usize, usize, usize)],
    converter: &RowConverter,
    sort_key: &[&str],
    batch_rows: usize,
) -> Result<Vec<GroupCopy>, TableError> {
    let mut selectors = Vec::new();
    for (_, _, rows) in candidates {
        selectors.push(RowSelector::select(1));
        if *rows > 1 {
            selectors.push(RowSelector::skip(rows - 2));
            selectors.push(RowSelector::select(1));
        }
    }
    let unreadable = |source| TableError::Read {
        path: base.path.to_path_buf(),
        source,
    };
    let file = base
        .file
        .try_clone()
        .map_err(|err| unreadable(err.into()))?;
    let metadata = base.metadata.metadata();
    let ends = ParquetRecordBatchReaderBuilder::new_with_metadata(file, base.metadata.clone())
        .with_projection(ProjectionMask::columns(
            metadata.file_metadata().schema_descr(),
            sort_key.iter().copied(),
        ))
        .with_row_groups(candidates.iter().map(|(group, _, _)| *group).collect())
        .with_row_selection(RowSelection::from(selectors))
        .with_batch_size(batch_rows)
        .build()
        .map_err(unreadable)?;
    let mut keys: Vec<OwnedRow> = Vec::with_capacity(2 * candidates.len());
    for batch in ends {
        let batch = batch.map_err(|err| unreadable(err.into()))?;
        keys.extend(
            sort_keys(converter, sort_key, &batch)?
                .iter()
                .map(|row| row.owned()),
        );
    }
    let mut bounded: Vec<GroupCopy> = Vec::with_capacity(candidates.len());
    let mut next = keys.into_iter();
    for (group, _, rows) in candidates {
        let first = next.next();
        let last = if *rows > 1 {
            next.next()
        } else {
            first.clone()
        };
        let (Some(first), Some(last)) = (first, last) else {
            return Err(TableError::Corrupt(format!(
                "{}: a row group's first and last rows were not read",
                base.path.display()
            )));
        };
        let after_previous = bounded
            .last()
            .is_none_or(|previous| previous.last.row() < first.row());
        if first.row() > last.row() || !after_previous {
            return Err(TableError::Corrupt(format!(
                "{} is not in the order it is folded in",
                base.path.display()
            )));
        }
        bounded.push(GroupCopy {
            group: *group,
            first,
            last,
        });
    }
    Ok(bounded)
}

/// Which of the `bounded` groups a kept row of the `others` falls among (from the group's
/// first key to its last): those are merged, not copied.
fn touched_groups(
    others: &[Source<'_>],
    bounded: &[GroupCopy],
    converter: &RowConverter,
    sort_key: &[&str],
    batch_rows: usize,
) -> Result<Vec<bool>, TableError> {
    let mut touched = vec![false; bounded.len()];
    for other in others {
        for batch in other.reader(batch_rows, &[], Some(sort_key))? {
            let batch = batch.map_err(|err| TableError::Read {
                path: other.path.to_path_buf(),
                source: err.into(),
            })?;
            for row in sort_keys(converter, sort_key, &batch)?.iter() {
                let after = bounded.partition_point(|copy| copy.first.row() <= row);
                if let Some(at) = after.checked_sub(1)
                    && bounded.get(at).is_some_and(|copy| row <= copy.last.row())
                    && let Some(hit) = touched.get_mut(at)
                {
                    *hit = true;
                }
            }
        }
    }
    Ok(touched)
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

/// Merges the kept rows of `sources` into `path`, the base's (the first source's) row groups
/// `copied` as they are: this thread merges, another encodes. Returns the rows written and
/// their key index.
fn merge_to(
    merge: &mut Merge,
    sources: &[Source<'_>],
    copied: &[usize],
    layout: &Layout,
    path: &Path,
) -> Result<(u64, KeyIndex), TableError> {
    let mut cursors = Vec::with_capacity(sources.len());
    for (index, source) in sources.iter().enumerate() {
        let skipped: &[usize] = if index == 0 { copied } else { &[] };
        let reader = source.reader(merge.batch_rows, skipped, None)?;
        if let Some(cursor) = merge.open(source.path, reader)? {
            cursors.push(cursor);
        }
    }
    let schema = Arc::clone(&merge.schema);
    let base = sources.first().filter(|_| !copied.is_empty());
    let (sender, pieces) = sync_channel::<Piece>(2);
    std::thread::scope(|scope| {
        // The copied groups' task ids are read meanwhile, for the key index: when most of the
        // base is copied, the merge leaves a core to spare.
        let keys = base.map(|base| scope.spawn(move || copied_keys(base, copied)));
        let writer = scope.spawn(|| write_all(path, schema, layout, base, pieces));
        let merged = merge_all(merge, &mut cursors, |piece| sender.send(piece).is_ok());
        drop(sender);
        let panicked = |what: &str| TableError::Corrupt(format!("the fold's {what} panicked"));
        let written = writer.join().unwrap_or_else(|_| Err(panicked("writer")));
        let keys = match keys {
            Some(keys) => keys.join().unwrap_or_else(|_| Err(panicked("key reader"))),
            None => Ok(Vec::new()),
        };
        // The merge's error first: the writer saw only that its batches ended.
        let Written {
            rows,
            mut index,
            placed,
        } = merged.and(written)?;
        let keys = keys?;
        if placed.len() != keys.len() {
            return Err(TableError::Corrupt(format!(
                "{} row groups copied, the task ids of {} read",
                placed.len(),
                keys.len()
            )));
        }
        for ((group, start), (read, keys)) in placed.into_iter().zip(keys) {
            if group != read {
                return Err(TableError::Corrupt(format!(
                    "row group {group} copied where the key index has {read}"
                )));
            }
            index.add_at(start, &keys);
        }
        // The index must place every row the file holds, or lookups would miss some.
        if index.rows() != rows {
            return Err(TableError::Corrupt(format!(
                "a key index placing {} rows for a file of {rows}",
                index.rows()
            )));
        }
        Ok((rows, index))
    })
}

/// Every row of `cursors` in order, and the base's row groups to copy where they go, handed
/// to `send`; stops early if `send` says the pieces are no longer taken (the writer failed and
/// reports why).
fn merge_all(
    merge: &mut Merge,
    cursors: &mut Vec<Cursor<'_>>,
    mut send: impl FnMut(Piece) -> bool,
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
        // A row group to copy whose rows come before the least row goes first; the least row
        // must then come after all of them, or the base was not in order.
        let least_key = key(&cursors[least]);
        let due = merge.copies.front().and_then(|copy| {
            (copy.first.row() < least_key).then(|| (copy.group, copy.last.row() < least_key))
        });
        if let Some((group, before_least)) = due {
            if !before_least {
                return Err(TableError::Corrupt(format!(
                    "row group {group} of the base is not in the order it is folded in"
                )));
            }
            if !copy_next(merge, cursors, &mut send)? {
                return Ok(());
            }
            continue;
        }
        loop {
            let cursor = &mut cursors[least];
            merge.merged.push((cursor.slot, cursor.at));
            let more = merge.advance(cursor)?;
            if merge.merged.len() >= merge.batch_rows
                && let Some(batch) = merge.gather(cursors)?
                && !send(Piece::Rows(batch))
            {
                return Ok(());
            }
            if !more {
                // Its last batch stays held while merged rows come from it.
                cursors.swap_remove(least);
                break;
            }
            let past = |bound: Row<'_>| key(&cursors[least]) > bound;
            if next.is_some_and(|next| past(key(&cursors[next])))
                || merge
                    .copies
                    .front()
                    .is_some_and(|copy| past(copy.first.row()))
            {
                break;
            }
        }
    }
    if let Some(batch) = merge.gather(cursors)?
        && !send(Piece::Rows(batch))
    {
        return Ok(());
    }
    while !merge.copies.is_empty() {
        if !copy_next(merge, cursors, &mut send)? {
            return Ok(());
        }
    }
    Ok(())
}

/// Hands `send` the rows merged so far and then the next row group to copy; false when the
/// writer no longer takes them.
fn copy_next(
    merge: &mut Merge,
    cursors: &mut [Cursor<'_>],
    send: &mut impl FnMut(Piece) -> bool,
) -> Result<bool, TableError> {
    if let Some(batch) = merge.gather(cursors)?
        && !send(Piece::Rows(batch))
    {
        return Ok(false);
    }
    Ok(match merge.copies.pop_front() {
        Some(copy) => send(Piece::Copy(copy.group)),
        None => true,
    })
}

/// The sort key of the row `cursor` is at.
fn key<'a>(cursor: &'a Cursor<'_>) -> Row<'a> {
    cursor.keys.row(cursor.at)
}

/// Writes the pieces received to `path`, laid out as `layout` says, its columns encoded on
/// one lane per core, the row groups to copy read from `base`.
fn write_all(
    path: &Path,
    schema: SchemaRef,
    layout: &Layout,
    base: Option<&Source<'_>>,
    pieces: Receiver<Piece>,
) -> Result<Written, TableError> {
    // The merge keeps a core busy; the columns are encoded on one lane per core beside it, as
    // one encoding thread set the fold's pace (docs/performance.md). Only a file on lanes
    // takes copied row groups.
    let encoders = std::thread::available_parallelism().map_or(1, usize::from);
    let mut file = match base {
        Some(_) => ParquetFile::create_on_lanes(path, schema, layout, encoders)?,
        None => ParquetFile::create_on(path, schema, layout, encoders)?,
    };
    // A handle of this thread's own: the merging thread reads the base meanwhile, and handles
    // cloned from one share its read position.
    let copied = base
        .map(|base| {
            File::open(base.path)
                .map(|file| (file, base))
                .map_err(|err| TableError::Read {
                    path: base.path.to_path_buf(),
                    source: err.into(),
                })
        })
        .transpose()?;
    let mut index = KeyIndex::default();
    let mut placed = Vec::new();
    for piece in pieces {
        match (piece, &copied) {
            (Piece::Rows(batch), _) => {
                file.write(&batch)?;
                let task_ids = batch.column_by_name(TASK_ID).ok_or_else(|| {
                    TableError::Corrupt(format!("merged rows without a {TASK_ID} column"))
                })?;
                index.push_column(task_ids)?;
            }
            (Piece::Copy(group), Some((source, base))) => {
                let metadata = base.metadata.metadata();
                file.copy_row_group(source, metadata, group)?;
                let rows = metadata
                    .row_groups()
                    .get(group)
                    .map(|meta| meta.num_rows().unsigned_abs())
                    .ok_or_else(|| {
                        TableError::Corrupt(format!(
                            "row group {group} copied from beyond the base"
                        ))
                    })?;
                placed.push((group, index.skip(rows)));
            }
            (Piece::Copy(group), None) => {
                return Err(TableError::Corrupt(format!(
                    "row group {group} to copy from no base"
                )));
            }
        }
    }
    Ok(Written {
        rows: file.finish()?,
        index,
        placed,
    })
}

/// What [`write_all`] wrote.
struct Written {
    /// Rows in the file.
    rows: u64,
    /// The key index of the rows merged; the copied groups' rows are passed over in it.
    index: KeyIndex,
    /// Each copied row group's number, and the row number it starts at in the file.
    placed: Vec<(usize, u64)>,
}

/// The keys ([`KeyIndex::keys_of`]) of the task ids of each of the row groups `copied` of
/// `base`, in order, each with its group's number. Read with a handle of this thread's own.
fn copied_keys(base: &Source<'_>, copied: &[usize]) -> Result<Vec<(usize, Vec<u32>)>, TableError> {
    let unreadable = |source| TableError::Read {
        path: base.path.to_path_buf(),
        source,
    };
    let file = File::open(base.path).map_err(|err| unreadable(err.into()))?;
    let mask = ProjectionMask::columns(
        base.metadata.metadata().file_metadata().schema_descr(),
        [TASK_ID],
    );
    let mut groups = Vec::with_capacity(copied.len());
    for &group in copied {
        // A handle per reader, all used in turn on this thread alone.
        let handle = file.try_clone().map_err(|err| unreadable(err.into()))?;
        let reader =
            ParquetRecordBatchReaderBuilder::new_with_metadata(handle, base.metadata.clone())
                .with_batch_size(BATCH_ROWS)
                .with_row_groups(vec![group])
                .with_projection(mask.clone())
                .build()
                .map_err(unreadable)?;
        let mut keys = Vec::new();
        for batch in reader {
            let batch = batch?;
            let task_ids = batch.column_by_name(TASK_ID).ok_or_else(|| {
                TableError::Corrupt(format!("{}: no {TASK_ID} column", base.path.display()))
            })?;
            keys.extend(KeyIndex::keys_of(task_ids)?);
        }
        groups.push((group, keys));
    }
    Ok(groups)
}

/// The rows kept, when the sorted row numbers `dropped` are not, of the row groups `groups`
/// (each as its first row in the file and its rows, in order) read one after another.
fn kept_rows(dropped: &[usize], groups: impl IntoIterator<Item = (usize, usize)>) -> RowSelection {
    let mut selectors = Vec::with_capacity(2 * dropped.len() + 1);
    for (start, rows) in groups {
        let end = start + rows;
        let mut next = start;
        let from = dropped.partition_point(|row| *row < start);
        let within = dropped.get(from..).unwrap_or_default();
        for &number in within.iter().take_while(|row| **row < end) {
            if number > next {
                selectors.push(RowSelector::select(number - next));
            }
            selectors.push(RowSelector::skip(1));
            next = number + 1;
        }
        if end > next {
            selectors.push(RowSelector::select(end - next));
        }
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
        ordered: &[],
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

    /// A session of `base` alone.
    fn alone(base: &Path) -> TableFiles<'_> {
        TableFiles {
            base: vec![base],
            deltas: Vec::new(),
            one_session: true,
            deletes: Some(Vec::new()),
        }
    }

    /// A session of `base` and `delta`, the delta replacing the `rows` rows of the base its
    /// vector at `deletes` names.
    fn replacing<'a>(
        base: &'a Path,
        delta: &'a Path,
        deletes: &'a Path,
        rows: u64,
    ) -> TableFiles<'a> {
        TableFiles {
            base: vec![base],
            deltas: vec![delta],
            one_session: true,
            deletes: Some(vec![DeletionVector {
                path: deletes,
                files: &[Some(0)],
                rows,
            }]),
        }
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
        let merged = merges_as_duckdb_orders(connection, files, &LAYOUT, batch_rows, &ours)?;
        assert_eq!(merged.copied_groups, 0, "a DuckDB file's row groups copied");
        let groups = |path: &Path| -> duckdb::Result<Vec<i64>> {
            let mut statement = connection.prepare(&format!(
                "SELECT row_group_num_rows FROM parquet_metadata({})
                 WHERE path_in_schema = 'task_id' ORDER BY row_group_id",
                path_literal(path)
            ))?;
            let rows = statement.query_map([], |row| row.get(0))?;
            rows.collect()
        };
        assert_eq!(
            groups(&ours)?,
            groups(&dir.join("theirs.parquet"))?,
            "row groups"
        );
        Ok(merged.rows)
    }

    /// Merges `files` into `ours` (laid out as `layout` says) reading `batch_rows` rows at a
    /// time and checks the file against DuckDB's sort of their newest rows (`theirs.parquet`
    /// beside it): the same rows at the same places, of the same column types.
    fn merges_as_duckdb_orders(
        connection: &Connection,
        files: &TableFiles<'_>,
        layout: &Layout,
        batch_rows: usize,
        ours: &Path,
    ) -> Result<Merged, Box<dyn std::error::Error>> {
        let written = merge_in_batches(connection, files, &SORT_KEY, layout, batch_rows, ours)?
            .ok_or("the merge declined the files")?;
        let theirs = ours.with_file_name("theirs.parquet");
        let expected = write_newest(
            connection,
            files,
            &SORT_KEY.join(", "),
            "FORMAT parquet, ROW_GROUP_SIZE 122880",
            &theirs,
        )?;
        assert_eq!(written.rows, expected, "rows merged");
        let count =
            |sql: &str| -> duckdb::Result<i64> { connection.query_row(sql, [], |row| row.get(0)) };
        let read = |path: &Path| {
            format!(
                "read_parquet({}, file_row_number = true)",
                path_literal(path)
            )
        };
        for (left, right) in [(read(ours), read(&theirs)), (read(&theirs), read(ours))] {
            let extra = count(&format!(
                "SELECT count(*) FROM (SELECT * FROM {left} EXCEPT ALL SELECT * FROM {right})"
            ))?;
            assert_eq!(extra, 0, "rows of {left} not at the same place in {right}");
        }
        let describe = |path: &Path| {
            crate::tables::columns(connection, &format!("read_parquet({})", path_literal(path)))
        };
        assert_eq!(describe(ours)?, describe(&theirs)?, "column types");
        Ok(written)
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

    /// Attempts `first..first + count` of two jobs, created in the order of `i` (so that new
    /// attempts go at each job's end, as a live session's do), their values salted by `salt`,
    /// with nulls in the sort key.
    fn attempts_in_order(first: i64, count: i64, salt: &str) -> String {
        format!(
            "SELECT CASE WHEN i % 997 = 0 THEN NULL ELSE 'job-' || (i % 2) END AS job_id,
                    CASE WHEN i % 991 = 0 THEN NULL ELSE i END AS creation_time_ms,
                    md5(i::VARCHAR) AS task_id,
                    0::INTEGER AS attempt_number,
                    '{salt}-' || i AS state,
                    (i % 7)::UTINYINT AS code,
                    i % 3 = 0 AS flag
             FROM range({first}, {first} + {count}) t(i)"
        )
    }

    /// Each row group's column chunks in the file at `path`, as their bytes.
    fn chunks(path: &Path) -> Result<Vec<Vec<Vec<u8>>>, Box<dyn std::error::Error>> {
        let bytes = std::fs::read(path)?;
        let reader = parquet::file::reader::SerializedFileReader::new(File::open(path)?)?;
        let metadata = parquet::file::reader::FileReader::metadata(&reader);
        let mut groups = Vec::new();
        for group in metadata.row_groups() {
            let mut columns = Vec::new();
            for column in group.columns() {
                let (start, length) = column.byte_range();
                let range = usize::try_from(start)?..usize::try_from(start + length)?;
                columns.push(bytes.get(range).ok_or("a chunk past the file")?.to_vec());
            }
            groups.push(columns);
        }
        Ok(groups)
    }

    /// Row groups of 30 000 rows: two pages in each whole one (the crate's pages hold at most
    /// 20 000 rows), ten in a base of 300 000 attempts.
    const GROUPS: Layout = Layout {
        row_group_rows: 30_000,
        unique: &["task_id"],
        ordered: &[],
    };

    /// A base of 300 000 attempts ([`attempts_in_order`]) as a fold writes it: DuckDB's sorted
    /// file merged by the crate into groups of [`GROUPS`], at `base.parquet` in `dir`.
    fn crate_base(
        connection: &Connection,
        dir: &Path,
    ) -> Result<std::path::PathBuf, Box<dyn std::error::Error>> {
        let sorted = dir.join("sorted.parquet");
        copy_sorted(connection, &attempts_in_order(0, 300_000, "base"), &sorted)?;
        let base = dir.join("base.parquet");
        let written = merge_in_batches(
            connection,
            &alone(&sorted),
            &SORT_KEY,
            &GROUPS,
            BATCH_ROWS,
            &base,
        )?
        .ok_or("the merge was declined")?;
        assert_eq!(
            (written.rows, written.copied_groups),
            (300_000, 0),
            "DuckDB's file is merged, not copied"
        );
        Ok(base)
    }

    /// A fold of a base the crate wrote copies the row groups no delta changed, byte for byte,
    /// and merges the others: those holding a row a delta replaces, and those a delta's new
    /// rows fall among (a job's last group, whose attempts without a creation time sort after
    /// the new ones). The file is DuckDB's sort of the newest rows, row for row, with an offset
    /// index through which the crate reads a task from copied and merged groups alike.
    #[test]
    fn a_fold_copies_the_row_groups_no_delta_changed() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = crate::tables::open_duckdb()?;
        let base = crate_base(&connection, dir.path())?;
        // New attempts, and two of the base's again (their creation time unchanged: they stay
        // where they were).
        let delta = dir.path().join("delta.parquet");
        copy_sorted(
            &connection,
            &format!(
                "{} WHERE i IN (12345, 150001) UNION ALL {}",
                attempts_in_order(0, 300_000, "again"),
                attempts_in_order(300_000, 4_000, "new")
            ),
            &delta,
        )?;
        let deletes = dir.path().join("deletes.parquet");
        let replaced = vector(&connection, &[&base, &delta], 1, 0, &deletes)?;
        assert_eq!(replaced, 2);
        let files = replacing(&base, &delta, &deletes, replaced);
        let base_chunks = chunks(&base)?;
        assert_eq!(base_chunks.len(), 10, "row groups in the base");
        for batch_rows in [BATCH_ROWS, 97] {
            let ours = dir.path().join(format!("folded-{batch_rows}.parquet"));
            let merged = merges_as_duckdb_orders(&connection, &files, &GROUPS, batch_rows, &ours)?;
            // Of the ten, the two replaced rows' groups and each job's last are merged.
            assert_eq!(merged.copied_groups, 6, "{batch_rows} rows a batch");
            let identical = chunks(&ours)?
                .iter()
                .filter(|group| base_chunks.contains(group))
                .count();
            assert_eq!(identical, 6, "row groups as the base has them");
            let footer = ArrowReaderMetadata::load(
                &File::open(&ours)?,
                ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Required),
            )?;
            let footer = footer.metadata();
            let groups = footer.row_groups().len();
            let indexed = (0..groups).all(|group| {
                let index = footer.page_index_for_row_group(group);
                (0..footer.row_group(group).num_columns())
                    .all(|column| index.offset_index(column).is_some())
            });
            assert!(indexed, "a row group without its offset index");
            // A task every 15 000 rows, read through the offset index.
            let footers = crate::tables::task_block::Footers::default();
            let mut read = 0;
            for row in (0..merged.rows).step_by(15_000) {
                let task_id: String = connection.query_row(
                    &format!(
                        "SELECT task_id FROM {} WHERE file_row_number = {row}",
                        read_parquet(&[&ours], ", file_row_number = true")
                    ),
                    [],
                    |found| found.get(0),
                )?;
                let block = (row - row % 30_000, row - row % 30_000 + 29_999);
                let batches =
                    crate::tables::task_block::task_rows(&footers, &ours, block, &task_id)?;
                let mut states = Vec::new();
                for batch in &batches {
                    for index in 0..batch.num_rows() {
                        let found = crate::query::json::arrow_row(batch, index)?;
                        states.push(found.get("state").cloned());
                    }
                }
                let expected: String = connection.query_row(
                    &format!(
                        "SELECT state FROM {} WHERE file_row_number = {row}",
                        read_parquet(&[&ours], ", file_row_number = true")
                    ),
                    [],
                    |found| found.get(0),
                )?;
                assert_eq!(
                    states,
                    [Some(serde_json::Value::from(expected))],
                    "row {row}"
                );
                read += 1;
            }
            assert!(read >= 20, "{read} tasks read");
            // The key index of merged and copied rows alike is the one DuckDB computes from
            // the file: copied groups start where no block does (groups of 30 000 rows).
            crate::tables::key_index::indexed_as_duckdb(
                &connection,
                merged.index,
                &ours,
                merged.rows,
                dir.path(),
            )?;
        }
        Ok(())
    }

    /// A fold whose delta falls among none of the base's row groups copies every one of them,
    /// each closed exactly full, between merged rows that sort before the first and after the
    /// last; its key index places them where they land.
    #[test]
    fn a_fold_copies_every_row_group_when_no_delta_row_falls_among_them()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = crate::tables::open_duckdb()?;
        let base = crate_base(&connection, dir.path())?;
        // A job before every other, and an attempt with no job or creation time whose id
        // sorts after every md5.
        let delta = dir.path().join("delta.parquet");
        copy_sorted(
            &connection,
            "SELECT 'a' AS job_id, 1::BIGINT AS creation_time_ms, 'first' AS task_id,
                    0::INTEGER AS attempt_number, 'new' AS state, 0::UTINYINT AS code,
                    false AS flag
             UNION ALL
             SELECT NULL::VARCHAR, NULL::BIGINT, 'last', 0::INTEGER, 'new', 1::UTINYINT, true",
            &delta,
        )?;
        let deletes = dir.path().join("deletes.parquet");
        let replaced = vector(&connection, &[&base, &delta], 1, 0, &deletes)?;
        assert_eq!(replaced, 0);
        let files = replacing(&base, &delta, &deletes, replaced);
        let base_chunks = chunks(&base)?;
        assert_eq!(base_chunks.len(), 10, "row groups in the base");
        for batch_rows in [BATCH_ROWS, 97] {
            let ours = dir.path().join(format!("folded-{batch_rows}.parquet"));
            let merged = merges_as_duckdb_orders(&connection, &files, &GROUPS, batch_rows, &ours)?;
            assert_eq!(merged.copied_groups, 10, "{batch_rows} rows a batch");
            let folded = chunks(&ours)?;
            assert_eq!(folded.len(), 12, "a group of one row on each side");
            assert!(
                folded.get(1..11) == Some(&base_chunks[..]),
                "groups copied in order"
            );
            crate::tables::key_index::indexed_as_duckdb(
                &connection,
                merged.index,
                &ours,
                300_002,
                dir.path(),
            )?;
        }
        Ok(())
    }

    /// A base whose row groups are out of order (rows of a group sort before the last of the
    /// group before it) is an error, not a misordered fold: a group that would be copied is
    /// never decoded, so the merge checks the keys that bound it. Nothing is left on disk, and
    /// the fold falls back to DuckDB's sort.
    #[test]
    fn a_base_whose_row_groups_are_out_of_order_is_an_error()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let connection = crate::tables::open_duckdb()?;
        // Two files of one row group each, as the crate writes them; each is sorted, and the
        // second's first rows sort before the first's last (both hold both jobs).
        let mut halves = Vec::new();
        for (first, name) in [(0, "a"), (30_000, "b")] {
            let sorted = dir.path().join(format!("sorted-{name}.parquet"));
            copy_sorted(
                &connection,
                &attempts_in_order(first, 30_000, name),
                &sorted,
            )?;
            let written = dir.path().join(format!("{name}.parquet"));
            merge_in_batches(
                &connection,
                &alone(&sorted),
                &SORT_KEY,
                &GROUPS,
                BATCH_ROWS,
                &written,
            )?;
            let footer = ArrowReaderMetadata::load(
                &File::open(&written)?,
                ArrowReaderOptions::new().with_offset_index_policy(PageIndexPolicy::Required),
            )?;
            halves.push((written, footer));
        }
        let base = dir.path().join("base.parquet");
        let schema = Arc::clone(halves.first().ok_or("no half")?.1.schema());
        let mut file = ParquetFile::create_on_lanes(&base, schema, &GROUPS, 1)?;
        for (path, footer) in &halves {
            file.copy_row_group(&File::open(path)?, footer.metadata(), 0)?;
        }
        assert_eq!(file.finish()?, 60_000);
        let files = alone(&base);
        let out = dir.path().join("out.parquet");
        let merged = merge_in_batches(&connection, &files, &SORT_KEY, &GROUPS, BATCH_ROWS, &out);
        assert!(
            matches!(&merged, Err(TableError::Corrupt(why)) if why.contains("not in the order")),
            "{merged:?}"
        );
        assert!(!out.exists(), "a partial base was left");
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
        let files = replacing(&base, &delta, &deletes, replaced);
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
        let (folded, index) = super::super::task_attempts::write_newest(&connection, &files, &out)?;
        assert_eq!((folded, index), (100_000, None));
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
