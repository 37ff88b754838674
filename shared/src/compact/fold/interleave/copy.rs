//! The base's row groups a fold copies into the new base as they are, without decoding a
//! column: those that no kept row of a delta falls among and none of whose rows is replaced
//! ([`copyable_groups`]), and the task ids of the groups copied, for the new base's key index
//! ([`copied_keys`]).

use std::fs::File;

use duckdb::arrow::datatypes::SchemaRef;
use duckdb::arrow::row::{OwnedRow, RowConverter};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReaderBuilder, RowSelection, RowSelector};
use parquet::arrow::{ArrowSchemaConverter, ProjectionMask};

use super::{BATCH_ROWS, Source, sort_keys};
use crate::tables::TableError;
use crate::tables::key_index::{KeyIndex, TASK_ID};
use crate::tables::parquet::Layout;

/// A row group of the base to copy as it is, with the sort keys of its first and last rows.
pub(super) struct GroupCopy {
    /// Its number in the base.
    pub(super) group: usize,
    /// The sort key of its first row.
    pub(super) first: OwnedRow,
    /// The sort key of its last row.
    pub(super) last: OwnedRow,
}

/// The row groups of `base` to copy into the new base as they are, in order: those of the
/// [`candidate_groups`] among whose rows no kept row of the `others` falls. A base's rows
/// change where its session goes on (each job's newest attempts), so most of a large base's
/// row groups are copied.
pub(super) fn copyable_groups(
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
/// interleaved between two copies stay few), with offset indexes, in a file of the columns the new
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
/// order is in the interleave.
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
/// first key to its last): those are interleaved, not copied.
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

/// The keys ([`KeyIndex::keys_of`]) of the task ids of each of the row groups `copied` of
/// `base`, in order, each with its group's number. Read with a handle of this thread's own.
pub(super) fn copied_keys(
    base: &Source<'_>,
    copied: &[usize],
) -> Result<Vec<(usize, Vec<u32>)>, TableError> {
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
