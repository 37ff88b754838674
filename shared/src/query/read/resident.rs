//! The rows of small sessions' `task_attempts` files, held in memory by task id, so that a
//! task lookup there answers without DuckDB.
//!
//! Why: planning a query and opening its Parquet files costs DuckDB the same however few rows
//! they hold, so in a small session that fixed cost is most of a lookup, while Ray's GCS
//! answers one from memory. A small session is what someone clicks through task by task.
//!
//! Data files are never rewritten, so rows held under a file's key never go stale: a file the
//! manifests stop naming is not asked for again and gives way, least recently used first, when
//! the rows held pass their limit. A file is loaded in the background after a lookup read it
//! from disk, so no request waits for more than its own read.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use duckdb::arrow::record_batch::RecordBatch;
use serde_json::Value as Json;

use super::json::{JsonRow, arrow_row, arrow_value};
use crate::query::QueryError;
use crate::storage::{ObjectKey, take_least_recent};
use crate::tables::newest::read_parquet;

/// Most attempts in scope for which a lookup keeps the files in memory: a session the fold
/// policy keeps in one file (`FoldPolicy::small_session_rows`), or a few of them.
pub const MOST_ROWS: u64 = 50_000;

/// Memory a row is taken to need before its file is loaded (Arrow's columns of the captured
/// Ray 2.60 runs and of the synthetic traffic need far less), so that a scope whose rows
/// would not fit is never loaded only to be evicted again by its own next file.
const ROW_BYTES_ESTIMATE: u64 = 2048;

/// Rows of whole files, by the file's key, within a limit of bytes.
#[derive(Debug)]
pub struct ResidentRows {
    limit: u64,
    held: Mutex<Held>,
}

/// What is held, for eviction.
#[derive(Debug, Default)]
struct Held {
    /// File → its rows and when they were last read (a counter, not a clock).
    files: HashMap<ObjectKey, (Arc<FileRows>, u64)>,
    /// Files being loaded, so that concurrent lookups load each once.
    loading: HashSet<ObjectKey>,
    /// Bytes in `files`.
    bytes: u64,
    /// The last use handed out.
    clock: u64,
}

/// Every row of one `task_attempts` file, as DuckDB reads it, by task id.
#[derive(Debug)]
pub struct FileRows {
    /// The rows (Arrow's columns: a few bytes a value, where JSON values take tens).
    batches: Vec<RecordBatch>,
    /// Task id → its rows, as (batch, row).
    by_task: HashMap<String, Vec<(usize, usize)>>,
    /// Memory held, roughly.
    bytes: u64,
}

impl FileRows {
    /// Reads every row of the `task_attempts` file at `path`.
    pub fn load(connection: &duckdb::Connection, path: &Path) -> Result<Self, QueryError> {
        let sql = format!("SELECT * FROM {}", read_parquet(&[path], ""));
        let mut statement = connection.prepare(&sql)?;
        let batches: Vec<RecordBatch> = statement.query_arrow([])?.collect();
        let mut by_task: HashMap<String, Vec<(usize, usize)>> = HashMap::new();
        let mut bytes = 0;
        for (at, batch) in batches.iter().enumerate() {
            let ids = batch.column_by_name("task_id").ok_or_else(|| {
                QueryError::Internal(format!("{} has no task_id column", path.display()))
            })?;
            for row in 0..batch.num_rows() {
                let Json::String(task_id) = arrow_value(ids, row)? else {
                    return Err(QueryError::Internal(format!(
                        "{} holds a row without a task id",
                        path.display()
                    )));
                };
                bytes += task_id.len() as u64 + 64;
                by_task.entry(task_id).or_default().push((at, row));
            }
            bytes += batch.get_array_memory_size() as u64;
        }
        Ok(Self {
            batches,
            by_task,
            bytes,
        })
    }

    /// The rows of `task_id` (every attempt this file has a version of), each value as
    /// [`super::json::query_rows`] gives it to a lookup that reads the file.
    pub fn rows_of(&self, task_id: &str) -> Result<Vec<JsonRow>, QueryError> {
        let Some(places) = self.by_task.get(task_id) else {
            return Ok(Vec::new());
        };
        places
            .iter()
            .map(|(at, row)| {
                let batch = self.batches.get(*at).ok_or_else(|| {
                    QueryError::Internal(format!("no batch {at} of {}", self.batches.len()))
                })?;
                arrow_row(batch, *row)
            })
            .collect()
    }

    /// Memory held, roughly.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl ResidentRows {
    /// Holds up to `limit` bytes of rows (0: none).
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            held: Mutex::new(Held::default()),
        }
    }

    /// The rows of the file `key`, when held.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<FileRows>> {
        let mut held = lock(&self.held);
        held.clock += 1;
        let now = held.clock;
        let (rows, used) = held.files.get_mut(key)?;
        *used = now;
        Some(Arc::clone(rows))
    }

    /// Which of `files` (key, rows) to load now: none unless all of them, together, are small
    /// enough to hold; of those, the ones neither held nor being loaded, marked as loading.
    /// Each must then be [`Self::insert`]ed or [`Self::abandon`]ed.
    pub fn claim(&self, files: &[(ObjectKey, u64)]) -> Vec<ObjectKey> {
        let rows: u64 = files.iter().map(|(_, rows)| rows).sum();
        if rows > MOST_ROWS || rows.saturating_mul(ROW_BYTES_ESTIMATE) > self.limit {
            return Vec::new();
        }
        let mut held = lock(&self.held);
        let mut claimed = Vec::new();
        for (key, _) in files {
            if !held.files.contains_key(key) && held.loading.insert(key.clone()) {
                claimed.push(key.clone());
            }
        }
        claimed
    }

    /// Holds the rows of `key`, loaded after [`Self::claim`], making room by dropping the
    /// files read least recently.
    pub fn insert(&self, key: ObjectKey, rows: FileRows) {
        let mut held = lock(&self.held);
        held.loading.remove(&key);
        if rows.bytes > self.limit {
            return;
        }
        while held.bytes + rows.bytes > self.limit {
            let Some(dropped) = take_least_recent(&mut held.files) else {
                break;
            };
            held.bytes -= dropped.bytes;
        }
        held.clock += 1;
        held.bytes += rows.bytes;
        let now = held.clock;
        if let Some((replaced, _)) = held.files.insert(key, (Arc::new(rows), now)) {
            held.bytes -= replaced.bytes;
        }
    }

    /// Gives up a claim on `key` whose load failed; a later lookup claims it again.
    pub fn abandon(&self, key: &ObjectKey) {
        lock(&self.held).loading.remove(key);
    }

    /// Files and bytes held.
    pub fn held(&self) -> (usize, u64) {
        let held = lock(&self.held);
        (held.files.len(), held.bytes)
    }
}

/// The bookkeeping; a panic while holding it leaves nothing half-updated that matters (at
/// worst a size is off), so a poisoned lock is used as is.
fn lock(held: &Mutex<Held>) -> std::sync::MutexGuard<'_, Held> {
    held.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(format!("tables/{name}.parquet")).expect("a key")
    }

    fn rows(bytes: u64) -> FileRows {
        FileRows {
            batches: Vec::new(),
            by_task: HashMap::new(),
            bytes,
        }
    }

    #[test]
    fn the_file_read_least_recently_gives_way() {
        let resident = ResidentRows::new(250);
        for name in ["a", "b"] {
            assert_eq!(resident.claim(&[(key(name), 0)]), vec![key(name)]);
            resident.insert(key(name), rows(100));
        }
        assert!(resident.get(&key("a")).is_some());
        resident.claim(&[(key("c"), 0)]);
        resident.insert(key("c"), rows(100));
        assert!(
            resident.get(&key("b")).is_none(),
            "b was read least recently"
        );
        assert!(resident.get(&key("a")).is_some() && resident.get(&key("c")).is_some());
        assert_eq!(resident.held(), (2, 200));
    }

    #[test]
    fn a_file_is_claimed_once_and_again_after_a_failed_load() {
        let resident = ResidentRows::new(1 << 30);
        let files = [(key("a"), 10), (key("b"), 10)];
        assert_eq!(resident.claim(&files).len(), 2);
        assert!(resident.claim(&files).is_empty(), "both are being loaded");
        resident.insert(key("a"), rows(1));
        resident.abandon(&key("b"));
        assert_eq!(resident.claim(&files), vec![key("b")]);
    }

    #[test]
    fn a_scope_too_large_to_hold_is_never_loaded() {
        let resident = ResidentRows::new(1 << 30);
        assert!(resident.claim(&[(key("a"), MOST_ROWS + 1)]).is_empty());
        let small = ResidentRows::new(ROW_BYTES_ESTIMATE * 10);
        assert!(small.claim(&[(key("a"), 6), (key("b"), 5)]).is_empty());
        assert_eq!(small.claim(&[(key("a"), 5), (key("b"), 5)]).len(), 2);
        small.insert(key("a"), rows(ROW_BYTES_ESTIMATE * 11));
        assert_eq!(
            small.held(),
            (0, 0),
            "a file larger than the limit is not held"
        );
    }
}
