//! One task's attempts, found without a scan: through the key indexes of the files in scope
//! (see [`crate::tables::key_index`]), reading only the blocks they name with the parquet
//! crate, or in the rows of small sessions held in memory ([`super::resident`]). Both the task
//! detail and Ray's task list for one task id look tasks up this way.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value as Json, json};

use super::json::{JsonRow, arrow_row};
use super::params::TaskFilter;
use super::snapshot::{IndexedFile, Needs};
use crate::query::{QueryEngine, QueryError};
use crate::tables::{key_index, task_block};

/// The attempts of `task_id` that `filter` selects, in attempt order, found through the key
/// indexes of the files in scope (or in the rows held in memory, which a lookup through them
/// has the engine load when the scope is small); `None`, to scan instead, when a file in scope
/// has no key index, `filter` is not one decided in Rust, or a block is one the parquet crate
/// cannot read.
pub(crate) async fn task_attempts_indexed(
    engine: &QueryEngine,
    filter: &TaskFilter,
    task_id: &str,
) -> Result<Option<Vec<JsonRow>>, QueryError> {
    // The rows found are checked in Rust, whether held in memory or read from their block.
    if !filter.decided_in_rust() {
        return Ok(None);
    }
    // The key indexes first, alone: a cold Lambda then downloads them and the few files they
    // name, not the session's base.
    let indexed = engine
        .snapshot(
            &filter.scope,
            Needs {
                key_indexes: true,
                ..Needs::default()
            },
        )
        .await?;
    let Some(indexes) = indexed.key_indexes else {
        return Ok(None);
    };
    let Some(rows) = task_in_indexed_files(engine, &indexes, task_id, filter).await? else {
        return Ok(None);
    };
    let files: Vec<_> = indexes
        .iter()
        .map(|file| (file.data.clone(), file.rows))
        .collect();
    engine.keep_resident(&files);
    Ok(Some(rows))
}

/// The attempts of `task_id` that `filter` (one [`TaskFilter::decided_in_rust`]) selects among
/// the `indexes` in scope, in attempt order: each attempt's version in the newest file that has
/// it is its newest (see [`crate::tables::newest`]). Files held in memory
/// ([`super::resident`]) are read there; the others through their key indexes. `None` when a
/// block is one the parquet crate cannot read.
async fn task_in_indexed_files(
    engine: &QueryEngine,
    indexes: &[IndexedFile],
    task_id: &str,
    filter: &TaskFilter,
) -> Result<Option<Vec<JsonRow>>, QueryError> {
    let held: Vec<_> = indexes
        .iter()
        .map(|file| engine.resident.get(&file.data))
        .collect();
    let mut versions = Vec::new();
    for (position, rows) in held.iter().enumerate() {
        let Some(rows) = rows else { continue };
        engine.count_resident_read();
        for row in rows.rows_of(task_id)? {
            versions.push(version(row, position, filter));
        }
    }
    // Positions (in `indexes`) of the files read from disk.
    let unheld: Vec<usize> = (0..indexes.len())
        .filter(|position| held[*position].is_none())
        .collect();
    if !unheld.is_empty() {
        let paths: Vec<PathBuf> = unheld
            .iter()
            .map(|position| indexes[*position].index.clone())
            .collect();
        let id = task_id.to_owned();
        let blocks = engine
            .run(move |connection| {
                let paths: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
                key_index::blocks_of(connection, &paths, &id)
                    .map_err(|err| QueryError::Internal(err.to_string()))
            })
            .await?;
        engine.count_key_index_lookup();
        let blocks: Vec<(usize, u32)> = blocks
            .into_iter()
            .filter_map(|(at, block)| unheld.get(at).map(|position| (*position, block)))
            .collect();
        let Some(read) = task_in_blocks(engine, indexes, &blocks, task_id, filter).await? else {
            return Ok(None);
        };
        versions.extend(read);
    }
    Ok(Some(newest_passing(versions)))
}

/// Every version of `task_id`'s attempts in the `blocks` (position in `indexes`, block) its
/// key indexes name, each made a [`version`]. Only the files named are fetched; one that is
/// gone costs its rows. The parquet crate reads them: the block's task ids, and of the other
/// columns only the pages that hold the task's rows ([`task_block`]). `None` when it cannot
/// read one (logged): the lookup then scans with DuckDB, as a fold falls back to DuckDB for
/// files the crate cannot interleave. The reads keep the deadline of each of the engine's calls
/// (`QuerySettings::timeout`), as DuckDB's statements do.
async fn task_in_blocks(
    engine: &QueryEngine,
    indexes: &[IndexedFile],
    blocks: &[(usize, u32)],
    task_id: &str,
    filter: &TaskFilter,
) -> Result<Option<Vec<JsonRow>>, QueryError> {
    let mut named: Vec<usize> = blocks.iter().map(|(file, _)| *file).collect();
    named.sort_unstable();
    named.dedup();
    let keys = named
        .iter()
        .map(|file| {
            indexes
                .get(*file)
                .map(|indexed| indexed.data.clone())
                .ok_or_else(|| {
                    QueryError::Internal(format!(
                        "a key index names file {file} of the {} in scope",
                        indexes.len()
                    ))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pins = engine.fetch(&keys).await?;
    // Each block to read: (position in `indexes`, local file, its rows).
    let reads: Vec<(usize, PathBuf, (u64, u64))> = blocks
        .iter()
        .filter_map(|(file, block)| {
            let path = named
                .iter()
                .position(|named| named == file)
                .and_then(|at| pins.files().get(at).cloned().flatten())?;
            Some((*file, path, key_index::block_rows(*block)))
        })
        .collect();
    let footers = Arc::clone(&engine.footers);
    let (task_id, filter) = (task_id.to_owned(), filter.clone());
    engine
        .run_stoppable(move |stop| {
            // Pinned, the files stay in the cache until every block is read.
            let _pins = pins;
            read_blocks(&footers, &reads, &task_id, &filter, stop)
        })
        .await
}

/// Every version of `task_id`'s attempts in the `reads` (position in scope, local file, its
/// block's rows), each made a [`version`]; `None` when the parquet crate cannot read one
/// (logged). Once `stop` is set (the deadline passed, or the request is gone) it reads no
/// further block.
fn read_blocks(
    footers: &task_block::Footers,
    reads: &[(usize, PathBuf, (u64, u64))],
    task_id: &str,
    filter: &TaskFilter,
    stop: &AtomicBool,
) -> Result<Option<Vec<JsonRow>>, QueryError> {
    let mut versions = Vec::new();
    for (file, path, rows) in reads {
        if stop.load(Ordering::Relaxed) {
            return Err(QueryError::Internal(
                "the lookup's block reads were stopped at its deadline".into(),
            ));
        }
        let batches = match task_block::task_rows(footers, path, *rows, task_id) {
            Ok(batches) => batches,
            Err(err) => {
                tracing::warn!(error = %err, "a block the parquet crate cannot read: the lookup scans");
                return Ok(None);
            }
        };
        for batch in &batches {
            for row in 0..batch.num_rows() {
                versions.push(version(arrow_row(batch, row)?, *file, filter));
            }
        }
    }
    Ok(Some(versions))
}

/// A stored version of an attempt, saying which file it came from (`file_position`, its
/// position in scope) and whether it passes `filter` (`passes`), for [`newest_passing`].
fn version(mut row: JsonRow, file_position: usize, filter: &TaskFilter) -> JsonRow {
    let passes = filter.passes_stored(&row);
    row.insert("file_position".to_owned(), json!(file_position));
    row.insert("passes".to_owned(), json!(passes));
    row
}

/// Each attempt's newest version (from the file latest in the manifest), in attempt order,
/// kept when it passes the filter, without the columns that said which and whether.
fn newest_passing(mut versions: Vec<JsonRow>) -> Vec<JsonRow> {
    let text = |row: &JsonRow, column: &str| {
        row.get(column)
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let number = |row: &JsonRow, column: &str| row.get(column).and_then(Json::as_i64);
    let attempt = |row: &JsonRow| {
        (
            text(row, "cluster"),
            text(row, "session_name"),
            number(row, "attempt_number"),
        )
    };
    versions.sort_by_cached_key(|row| {
        (
            attempt(row),
            std::cmp::Reverse(number(row, "file_position")),
        )
    });
    let mut newest: Vec<JsonRow> = Vec::new();
    let mut previous = None;
    for mut row in versions {
        let this = attempt(&row);
        if previous.as_ref() == Some(&this) {
            continue;
        }
        previous = Some(this);
        let passes = row.remove("passes").and_then(|passes| passes.as_bool());
        row.remove("file_position");
        if passes == Some(true) {
            newest.push(row);
        }
    }
    newest
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past the deadline no block is read: the read stops instead of going on to a file (here
    /// one that is gone, which a read would report as a block the crate cannot read).
    #[test]
    fn block_reads_stop_at_the_deadline() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let reads = [(0, dir.path().join("gone.parquet"), (0, 122_879))];
        let footers = task_block::Footers::default();
        let filter = TaskFilter::default();
        let task_id = "ab".repeat(24);
        let on_time = read_blocks(&footers, &reads, &task_id, &filter, &AtomicBool::new(false));
        assert!(matches!(on_time, Ok(None)), "{on_time:?}");
        let late = read_blocks(&footers, &reads, &task_id, &filter, &AtomicBool::new(true));
        assert!(matches!(late, Err(QueryError::Internal(_))), "{late:?}");
        Ok(())
    }
}
