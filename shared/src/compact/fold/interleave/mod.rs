//! The k-way interleave that writes a fold's new base: the newest rows of a table's files,
//! each sorted already, interleaved in their order and written as deltas are
//! ([`crate::tables::parquet`]).
//!
//! Every file a run or a fold writes is in one order ([`crate::tables::task_attempts`]'s sort
//! key), and a fold keeps every row its deletion vectors do not drop, so the newest rows in that
//! order are an interleave of sorted files, not a sort. A sort (DuckDB's `ORDER BY … COPY`)
//! would hold and sort every row, ~80 wide columns of them; here each file is read once in
//! order, and the interleaved rows are encoded on threads of their own while the next are
//! interleaved.
//!
//! Most of a large base is not changed by the deltas folded into it: a session goes on at
//! each job's newest attempts, and replaces the versions of attempts that were still running.
//! The base's row groups that no delta row falls among and none of whose rows is replaced are
//! copied into the new base as they are encoded, without decoding a column (`copy`); only the
//! others are interleaved.
//!
//! Files this build cannot interleave are left to DuckDB, which matches columns by name and
//! sorts whatever it is given: a delta without a deletion vector or files of other columns
//! ([`interleave_newest`] answers `None`), and a file found out of order or unreadable here (an
//! error, after which nothing of the interleave is left on disk).

mod copy;

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};

use duckdb::Connection;
use duckdb::arrow::array::RecordBatch;
use duckdb::arrow::compute::{SortOptions, interleave_record_batch};
use duckdb::arrow::datatypes::{Field, Schema, SchemaRef};
use duckdb::arrow::row::{Row, RowConverter, Rows, SortField};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use parquet::file::metadata::PageIndexPolicy;

use self::copy::{GroupCopy, copied_keys, copyable_groups};
use crate::tables::TableError;
use crate::tables::key_index::{KeyIndex, TASK_ID};
use crate::tables::newest::{DeletionVector, TableFiles, read_parquet};
use crate::tables::parquet::{Layout, ParquetFile};

/// Rows decoded from a file at a time, and rows gathered into each batch written.
const BATCH_ROWS: usize = 8192;

/// One file being read in order, its rows dropped where its deletion vectors name them.
struct Cursor<'a> {
    path: &'a Path,
    reader: ParquetRecordBatchReader,
    /// The batch being interleaved: its place in [`Interleave::held`].
    slot: usize,
    /// The sort keys of the batch's rows.
    keys: Rows,
    /// The batch's rows.
    rows: usize,
    /// The next row of the batch to interleave.
    at: usize,
}

/// The interleave of sorted files into batches of their rows in order.
struct Interleave {
    converter: RowConverter,
    sort_key: &'static [&'static str],
    schema: SchemaRef,
    /// Rows per batch read and per batch gathered.
    batch_rows: usize,
    /// Batches that interleaved rows still come from, until they are gathered.
    held: Vec<RecordBatch>,
    /// The rows interleaved and not yet gathered: (batch in `held`, row).
    interleaved: Vec<(usize, usize)>,
    /// The base's row groups still to be copied as they are, in order: each goes before the
    /// first interleaved row past its first key.
    copies: VecDeque<GroupCopy>,
}

/// What the interleave hands the writer, in the order of the file.
enum Piece {
    /// Rows to encode.
    Rows(RecordBatch),
    /// The base's row group of this number, to append as it is encoded there.
    Copy(usize),
}

impl Interleave {
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

    /// The rows interleaved so far as one batch; batches no cursor is in are let go.
    fn gather(&mut self, cursors: &mut [Cursor<'_>]) -> Result<Option<RecordBatch>, TableError> {
        if self.interleaved.is_empty() {
            return Ok(None);
        }
        let held: Vec<&RecordBatch> = self.held.iter().collect();
        let gathered = interleave_record_batch(&held, &self.interleaved)?;
        self.interleaved.clear();
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
/// interleaved in that order and laid out as `layout` says. Returns the rows written and their key
/// index ([`crate::tables::key_index`]), or `None` when the files are not for this interleave (a
/// delta without a deletion vector, files of other columns): nothing is written then, nor after an
/// error.
pub(super) fn interleave_newest(
    connection: &Connection,
    files: &TableFiles<'_>,
    sort_key: &'static [&'static str],
    layout: &Layout,
    path: &Path,
) -> Result<Option<(u64, KeyIndex)>, TableError> {
    let interleaved = interleave_in_batches(connection, files, sort_key, layout, BATCH_ROWS, path)?;
    Ok(interleaved.map(|interleaved| {
        tracing::debug!(
            rows = interleaved.rows,
            copied_groups = interleaved.copied_groups,
            "the fold's base interleaved"
        );
        (interleaved.rows, interleaved.index)
    }))
}

/// What an interleave wrote.
#[derive(Debug)]
struct Interleaved {
    /// Rows in the file.
    rows: u64,
    /// Row groups of the base copied as they were, not decoded.
    copied_groups: usize,
    /// The key index of its rows.
    index: KeyIndex,
}

/// A file to interleave, opened, with the rows of it that are dropped.
struct Source<'a> {
    /// Where it is: what errors name, and what the copying thread opens for itself.
    path: &'a Path,
    /// Read by the interleaving thread alone: handles cloned from it share one read position.
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

/// [`interleave_newest`], reading and gathering `batch_rows` rows at a time.
fn interleave_in_batches(
    connection: &Connection,
    files: &TableFiles<'_>,
    sort_key: &'static [&'static str],
    layout: &Layout,
    batch_rows: usize,
    path: &Path,
) -> Result<Option<Interleaved>, TableError> {
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
    let mut interleave = Interleave {
        converter,
        sort_key,
        schema: Arc::clone(&schema),
        batch_rows,
        held: Vec::new(),
        interleaved: Vec::with_capacity(batch_rows),
        copies: copies.into(),
    };
    let written = interleave_to(&mut interleave, &sources, &copied, layout, path);
    if written.is_err() {
        // A partial base is nobody's: the fold failed, and the next one writes anew.
        let _ = std::fs::remove_file(path);
    }
    written.map(|(rows, index)| {
        Some(Interleaved {
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

/// Interleaves the kept rows of `sources` into `path`, the base's (the first source's) row groups
/// `copied` as they are: this thread interleaves, another encodes. Returns the rows written and
/// their key index.
fn interleave_to(
    interleave: &mut Interleave,
    sources: &[Source<'_>],
    copied: &[usize],
    layout: &Layout,
    path: &Path,
) -> Result<(u64, KeyIndex), TableError> {
    let mut cursors = Vec::with_capacity(sources.len());
    for (index, source) in sources.iter().enumerate() {
        let skipped: &[usize] = if index == 0 { copied } else { &[] };
        let reader = source.reader(interleave.batch_rows, skipped, None)?;
        if let Some(cursor) = interleave.open(source.path, reader)? {
            cursors.push(cursor);
        }
    }
    let schema = Arc::clone(&interleave.schema);
    let base = sources.first().filter(|_| !copied.is_empty());
    let (sender, pieces) = sync_channel::<Piece>(2);
    std::thread::scope(|scope| {
        // The copied groups' task ids are read meanwhile, for the key index: when most of the
        // base is copied, the interleave leaves a core to spare.
        let keys = base.map(|base| scope.spawn(move || copied_keys(base, copied)));
        let writer = scope.spawn(|| write_all(path, schema, layout, base, pieces));
        let interleaved =
            interleave_all(interleave, &mut cursors, |piece| sender.send(piece).is_ok());
        drop(sender);
        let panicked = |what: &str| TableError::Corrupt(format!("the fold's {what} panicked"));
        let written = writer.join().unwrap_or_else(|_| Err(panicked("writer")));
        let keys = match keys {
            Some(keys) => keys.join().unwrap_or_else(|_| Err(panicked("key reader"))),
            None => Ok(Vec::new()),
        };
        // The interleave's error first: the writer saw only that its batches ended.
        let Written {
            rows,
            mut index,
            placed,
        } = interleaved.and(written)?;
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
fn interleave_all(
    interleave: &mut Interleave,
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
        let due = interleave.copies.front().and_then(|copy| {
            (copy.first.row() < least_key).then(|| (copy.group, copy.last.row() < least_key))
        });
        if let Some((group, before_least)) = due {
            if !before_least {
                return Err(TableError::Corrupt(format!(
                    "row group {group} of the base is not in the order it is folded in"
                )));
            }
            if !copy_next(interleave, cursors, &mut send)? {
                return Ok(());
            }
            continue;
        }
        loop {
            let cursor = &mut cursors[least];
            interleave.interleaved.push((cursor.slot, cursor.at));
            let more = interleave.advance(cursor)?;
            if interleave.interleaved.len() >= interleave.batch_rows
                && let Some(batch) = interleave.gather(cursors)?
                && !send(Piece::Rows(batch))
            {
                return Ok(());
            }
            if !more {
                // Its last batch stays held while interleaved rows come from it.
                cursors.swap_remove(least);
                break;
            }
            let past = |bound: Row<'_>| key(&cursors[least]) > bound;
            if next.is_some_and(|next| past(key(&cursors[next])))
                || interleave
                    .copies
                    .front()
                    .is_some_and(|copy| past(copy.first.row()))
            {
                break;
            }
        }
    }
    if let Some(batch) = interleave.gather(cursors)?
        && !send(Piece::Rows(batch))
    {
        return Ok(());
    }
    while !interleave.copies.is_empty() {
        if !copy_next(interleave, cursors, &mut send)? {
            return Ok(());
        }
    }
    Ok(())
}

/// Hands `send` the rows interleaved so far and then the next row group to copy; false when the
/// writer no longer takes them.
fn copy_next(
    interleave: &mut Interleave,
    cursors: &mut [Cursor<'_>],
    send: &mut impl FnMut(Piece) -> bool,
) -> Result<bool, TableError> {
    if let Some(batch) = interleave.gather(cursors)?
        && !send(Piece::Rows(batch))
    {
        return Ok(false);
    }
    Ok(match interleave.copies.pop_front() {
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
    // The interleave keeps a core busy; the columns are encoded on one lane per core beside it,
    // as one encoding thread would set the fold's pace. Only a file on lanes takes copied row
    // groups.
    let encoders = std::thread::available_parallelism().map_or(1, usize::from);
    let mut file = match base {
        Some(_) => ParquetFile::create_on_lanes(path, schema, layout, encoders)?,
        None => ParquetFile::create_on(path, schema, layout, encoders)?,
    };
    // A handle of this thread's own: the interleaving thread reads the base meanwhile, and handles
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
                    TableError::Corrupt(format!("interleaved rows without a {TASK_ID} column"))
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
    /// The key index of the rows interleaved; the copied groups' rows are passed over in it.
    index: KeyIndex,
    /// Each copied row group's number, and the row number it starts at in the file.
    placed: Vec<(usize, u64)>,
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
/// `NOT NULL` (files of an older format were staged in one), the crate's files never do, and a base
/// interleaved from both must take either's rows.
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
mod tests;
