//! Where each stored attempt is, kept between runs, so that a run finds the stored versions of
//! the attempts it merges without scanning every task id of its session again.
//!
//! Finding them by a scan ([`task_attempts::read_attempts`]) reads the task id of every stored row,
//! a cost that grows with the session, not with the run. Table files are immutable under their
//! keys, so what each one holds where can be kept: its rows as `(hash of task id and attempt
//! number, row number)`, sorted by hash. A run reads the keys of the files it has not seen (the
//! last run's delta; after a fold, the new base once) and looks its attempts up in the rest by
//! walking two sorted lists together.
//!
//! A hash names a row exactly only when no two keys share it, which 64 bits make all but
//! certain, not certain. So the rows read are checked: each must hold one of the attempts asked
//! for, and the attempts asked for must not share a hash among themselves (then each row read
//! is the attempt whose hash found it); no row of an asked-for attempt is missed, as it hashes
//! to the hash asked for. A run that fails either check, cannot read a file's keys, or whose
//! session's keys do not fit the memory allowed is located by the scan instead: whatever the
//! keys held, a run never finds other rows than the scan would.

use std::collections::HashMap;
use std::fs::File;
use std::hash::BuildHasher as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use duckdb::Connection;
use duckdb::arrow::array::{Array, AsArray};
use duckdb::arrow::datatypes::Int32Type;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};

use super::TableError;
use super::key_index::{TASK_ID, each_task_id};
use super::task_attempts::{self, Located, RowFilter, StoredRows, read_located, unfinished_keys};
use crate::merge::TaskAttempt;
use crate::storage::{ObjectKey, take_least_recent};

/// The attempt number's column.
const ATTEMPT_NUMBER: &str = "attempt_number";

/// Memory one row's entry takes (a hash and a row number, aligned).
const ENTRY_BYTES: u64 = std::mem::size_of::<(u64, u32)>() as u64;

/// Rows decoded at a time when reading a file's keys.
const BATCH_ROWS: usize = 8192;

/// How an attempt's key is hashed.
type KeyHash = fn(&str, i32) -> u64;

/// The hash of an attempt's key. Fixed within a process (the entries never leave it).
fn key_hash(task_id: &str, attempt_number: i32) -> u64 {
    foldhash::fast::FixedState::with_seed(0x6166_7465_7267_6c6f).hash_one((task_id, attempt_number))
}

/// One stored file a run may find attempts in.
#[derive(Clone, Copy, Debug)]
pub struct StoredFile<'a> {
    /// Its key: what it holds never changes under it.
    pub key: &'a ObjectKey,
    /// Its local copy.
    pub path: &'a Path,
    /// Its rows, as its manifest records them.
    pub rows: u64,
}

/// Every row of one file as `(key hash, row number)`, sorted.
#[derive(Debug)]
struct FileKeys {
    entries: Vec<(u64, u32)>,
}

impl FileKeys {
    /// Reads the keys of the `task_attempts` file at `path`, its row groups shared among the
    /// cores (a fold's new base has millions of rows, read by the run after the fold). A row
    /// without a task id or an attempt number is left out: no key equals it (SQL's `=` on a
    /// null).
    fn read(path: &Path, hash: KeyHash) -> Result<Self, TableError> {
        let unreadable = |source| TableError::Read {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(|err| unreadable(err.into()))?;
        let metadata =
            ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).map_err(unreadable)?;
        // Each row group with the number of its first row.
        let mut groups = Vec::new();
        let mut rows: u64 = 0;
        for (index, group) in metadata.metadata().row_groups().iter().enumerate() {
            let start = u32::try_from(rows).map_err(|_| {
                TableError::Corrupt(format!("{}: more rows than 2^32", path.display()))
            })?;
            groups.push((index, start));
            rows += u64::try_from(group.num_rows()).unwrap_or_default();
        }
        if u32::try_from(rows).is_err() {
            return Err(TableError::Corrupt(format!(
                "{}: more rows than 2^32",
                path.display()
            )));
        }
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let share = groups.len().div_ceil(cores).max(1);
        let sorted: Vec<Vec<(u64, u32)>> = std::thread::scope(|scope| {
            let readers: Vec<_> = groups
                .chunks(share)
                .map(|share| {
                    let metadata = metadata.clone();
                    scope.spawn(move || -> Result<Vec<(u64, u32)>, TableError> {
                        // A descriptor of its own: clones of one share its offset, which the
                        // reader seeks, so two threads reading through clones read each
                        // other's bytes.
                        let handle = File::open(path).map_err(|err| unreadable(err.into()))?;
                        let rows: i64 = share
                            .iter()
                            .map(|&(group, _)| metadata.metadata().row_group(group).num_rows())
                            .sum();
                        let mut entries =
                            Vec::with_capacity(usize::try_from(rows).unwrap_or_default());
                        for &(group, start) in share {
                            let handle =
                                handle.try_clone().map_err(|err| unreadable(err.into()))?;
                            read_group(path, handle, &metadata, group, start, hash, &mut entries)?;
                        }
                        entries.sort_unstable();
                        Ok(entries)
                    })
                })
                .collect();
            // Every reader joined before an error is reported: one left to the scope that had
            // panicked would panic the scope.
            let joined: Vec<Result<Vec<(u64, u32)>, TableError>> = readers
                .into_iter()
                .map(|reader| {
                    reader.join().unwrap_or_else(|_| {
                        Err(TableError::Corrupt("a key reader panicked".into()))
                    })
                })
                .collect();
            joined.into_iter().collect::<Result<_, _>>()
        })?;
        // Combined in pairs, so each entry is moved once per halving, however many cores.
        let mut lists = sorted;
        while lists.len() > 1 {
            let mut pairs = lists.into_iter();
            let mut merged = Vec::new();
            while let Some(first) = pairs.next() {
                merged.push(match pairs.next() {
                    Some(second) => merge_sorted(first, second),
                    None => first,
                });
            }
            lists = merged;
        }
        let entries = lists.pop().unwrap_or_default();
        Ok(Self { entries })
    }

    /// Memory the entries take, as the budget counts it.
    fn bytes(&self) -> u64 {
        self.entries.len() as u64 * ENTRY_BYTES
    }

    /// Calls `found` with the position in `wanted` (sorted hashes) and the row number of each
    /// row whose hash is wanted. Both lists are sorted, so each step gallops from the last.
    fn find(&self, wanted: &[u64], mut found: impl FnMut(usize, u32)) {
        let entries = &self.entries;
        let mut at = 0;
        for (position, &hash) in wanted.iter().enumerate() {
            let rest = &entries[at..];
            let mut step = 1;
            while step < rest.len() && rest[step].0 < hash {
                step *= 2;
            }
            let (low, high) = (step / 2, (step + 1).min(rest.len()));
            at += low + rest[low..high].partition_point(|entry| entry.0 < hash);
            for entry in entries[at..].iter().take_while(|entry| entry.0 == hash) {
                found(position, entry.1);
            }
        }
    }
}

/// Appends to `entries` the keys of row group `group` of the file at `path` (`handle`), whose
/// first row is `start`.
fn read_group(
    path: &Path,
    handle: File,
    metadata: &ArrowReaderMetadata,
    group: usize,
    start: u32,
    hash: KeyHash,
    entries: &mut Vec<(u64, u32)>,
) -> Result<(), TableError> {
    let unreadable = |source| TableError::Read {
        path: path.to_path_buf(),
        source,
    };
    let schema = metadata.metadata().file_metadata().schema_descr();
    let mask = ProjectionMask::columns(schema, [TASK_ID, ATTEMPT_NUMBER]);
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(handle, metadata.clone())
        .with_row_groups(vec![group])
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(unreadable)?;
    let expected = metadata.metadata().row_group(group).num_rows();
    let mut row = start;
    for batch in reader {
        let batch = batch?;
        let column = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| TableError::Corrupt(format!("{}: no {name} column", path.display())))
        };
        let attempts = column(ATTEMPT_NUMBER)?
            .as_primitive_opt::<Int32Type>()
            .ok_or_else(|| {
                TableError::Corrupt(format!("{}: {ATTEMPT_NUMBER} not INTEGER", path.display()))
            })?;
        let mut index = 0;
        each_task_id(column(TASK_ID)?, |id| {
            if let Some(id) = id
                && attempts.is_valid(index)
            {
                entries.push((hash(id, attempts.value(index)), row));
            }
            index += 1;
            row = row.wrapping_add(1);
        })
        .map_err(|err| TableError::Corrupt(format!("{}: {err}", path.display())))?;
    }
    if i64::from(row.wrapping_sub(start)) != expected {
        return Err(TableError::Corrupt(format!(
            "{}: row group {group} read as {} rows of {expected}",
            path.display(),
            row.wrapping_sub(start)
        )));
    }
    Ok(())
}

/// The entries of two sorted lists, sorted.
fn merge_sorted(a: Vec<(u64, u32)>, b: Vec<(u64, u32)>) -> Vec<(u64, u32)> {
    let mut merged = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
        let next = if x <= y { a.next() } else { b.next() };
        merged.extend(next);
    }
    merged.extend(a);
    merged.extend(b);
    merged
}

/// The keys of the files runs have read, least recently used first out of `budget` bytes.
/// Shared by clones.
#[derive(Clone, Debug)]
pub struct StoredKeys {
    budget: u64,
    hash: KeyHash,
    held: Arc<Mutex<Held>>,
}

/// What [`StoredKeys`] holds, under its lock.
#[derive(Debug, Default)]
struct Held {
    /// Each file's keys, with when they were last used (on `clock`).
    files: HashMap<ObjectKey, (Arc<FileKeys>, u64)>,
    /// Memory of every file's keys held.
    bytes: u64,
    /// Counts uses, for least recently used first out.
    clock: u64,
    /// Keys read from files, over all runs (see [`StoredKeys::rows_read`]).
    rows_read: u64,
    /// Runs located by the scan after a check failed.
    scans_after_check: u64,
    /// Runs located by the scan because a file's keys could not be read.
    scans_after_error: u64,
}

/// The attempts a run asks for, with their hashes.
struct Wanted<'a> {
    /// Sorted by hash, no hash twice.
    keys: Vec<(u64, &'a str, i32)>,
    hash: KeyHash,
}

impl<'a> Wanted<'a> {
    /// `None` when two different attempts share a hash.
    fn new(keys: impl Iterator<Item = (&'a str, i32)>, hash: KeyHash) -> Option<Self> {
        let mut keys: Vec<(u64, &str, i32)> = keys
            .map(|(task, attempt)| (hash(task, attempt), task, attempt))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let shared = keys.windows(2).any(|pair| pair[0].0 == pair[1].0);
        (!shared).then_some(Self { keys, hash })
    }

    /// Their hashes, in order.
    fn hashes(&self) -> Vec<u64> {
        self.keys.iter().map(|key| key.0).collect()
    }

    /// True when `attempt` is one of them.
    fn holds(&self, attempt: &TaskAttempt) -> bool {
        let Some(task) = attempt.task_id.as_ref().map(|id| id.as_hex()) else {
            return false;
        };
        let hash = (self.hash)(task, attempt.attempt_number);
        let at = self.keys.partition_point(|key| key.0 < hash);
        self.keys
            .get(at)
            .is_some_and(|key| key.0 == hash && key.1 == task && key.2 == attempt.attempt_number)
    }
}

impl StoredKeys {
    /// Keys kept in at most `budget` bytes.
    pub fn new(budget: u64) -> Self {
        Self::hashing(budget, key_hash)
    }

    /// Keys hashed by `hash` (tests make hashes collide with it).
    fn hashing(budget: u64, hash: KeyHash) -> Self {
        Self {
            budget,
            hash,
            held: Arc::new(Mutex::new(Held::default())),
        }
    }

    /// Reads the stored rows `filter` selects from `files` (oldest first, as the manifest
    /// lists them), as [`task_attempts::read_attempts`] does: the same rows, found from the
    /// keys held, or by its scan when they cannot be (see the module's doc).
    pub fn read_attempts(
        &self,
        connection: &Connection,
        files: &[StoredFile<'_>],
        filter: &RowFilter,
    ) -> Result<StoredRows, TableError> {
        let paths: Vec<PathBuf> = files.iter().map(|file| file.path.to_path_buf()).collect();
        if files.is_empty() {
            return Ok(StoredRows::default());
        }
        let needed = files
            .iter()
            .map(|file| file.rows.saturating_mul(ENTRY_BYTES))
            .fold(0, u64::saturating_add);
        if needed > self.budget {
            return task_attempts::read_attempts(connection, &paths, filter);
        }
        let unfinished = unfinished_keys(connection, &paths, filter)?;
        let keys = filter
            .keys
            .iter()
            .chain(&unfinished)
            .map(|(task, attempt)| (task.as_str(), *attempt));
        match Wanted::new(keys, self.hash) {
            Some(wanted) => match self.locate(files, &wanted) {
                Ok(located) => {
                    let stored = read_located(connection, &paths, &located)?;
                    if stored.attempts.iter().all(|attempt| wanted.holds(attempt)) {
                        return Ok(stored);
                    }
                    tracing::warn!("a stored row's key hash was another attempt's; scanning");
                    self.lock().scans_after_check += 1;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "stored keys not read; scanning");
                    self.lock().scans_after_error += 1;
                }
            },
            None => {
                tracing::warn!("two attempts of the run share a key hash; scanning");
                self.lock().scans_after_check += 1;
            }
        }
        // The unfinished attempts are known by key now: asking for them so selects the same
        // rows in one scan, not two.
        let by_key = RowFilter {
            keys: filter.keys.iter().chain(&unfinished).cloned().collect(),
            ..RowFilter::default()
        };
        task_attempts::read_attempts(connection, &paths, &by_key)
    }

    /// Where the `wanted` attempts are in `files`.
    fn locate(&self, files: &[StoredFile<'_>], wanted: &Wanted<'_>) -> Result<Located, TableError> {
        let hashes = wanted.hashes();
        // (wanted position, file index, row)
        let mut found: Vec<(usize, usize, u32)> = Vec::new();
        for (index, file) in files.iter().enumerate() {
            let keys = self.keys_of(file)?;
            keys.find(&hashes, |position, row| found.push((position, index, row)));
        }
        found.sort_unstable();
        let mut located = Located::default();
        for versions in found.chunk_by(|a, b| a.0 == b.0) {
            let newest = versions.iter().map(|version| version.1).max();
            for &(_, index, row) in versions {
                located.rows.entry(index).or_default().push(i64::from(row));
                if Some(index) == newest {
                    located.live.entry(index).or_default().push(i64::from(row));
                }
            }
        }
        for rows in located.rows.values_mut().chain(located.live.values_mut()) {
            rows.sort_unstable();
            rows.dedup();
        }
        Ok(located)
    }

    /// The keys of `file`, held or read now (and held, evicting the least recently used).
    fn keys_of(&self, file: &StoredFile<'_>) -> Result<Arc<FileKeys>, TableError> {
        {
            let mut held = self.lock();
            held.clock += 1;
            let now = held.clock;
            if let Some((keys, used)) = held.files.get_mut(file.key) {
                *used = now;
                return Ok(Arc::clone(keys));
            }
        }
        let keys = Arc::new(FileKeys::read(file.path, self.hash)?);
        let mut held = self.lock();
        held.rows_read += keys.entries.len() as u64;
        held.bytes += keys.bytes();
        held.clock += 1;
        let now = held.clock;
        if let Some((replaced, _)) = held
            .files
            .insert(file.key.clone(), (Arc::clone(&keys), now))
        {
            held.bytes -= replaced.bytes();
        }
        while held.bytes > self.budget {
            let Some(evicted) = take_least_recent(&mut held.files) else {
                break;
            };
            held.bytes -= evicted.bytes();
        }
        Ok(keys)
    }

    /// Keys runs have read from files so far (a row's, unless its task id or attempt number
    /// is null): what tests tell a run that read only its new files by.
    pub fn rows_read(&self) -> u64 {
        self.lock().rows_read
    }

    /// Runs located by the scan because a file's keys could not be read.
    pub fn scans_after_error(&self) -> u64 {
        self.lock().scans_after_error
    }

    /// Lets go of the keys of files no run will read again (those a fold replaced).
    pub fn forget<'a>(&self, keys: impl Iterator<Item = &'a ObjectKey>) {
        let mut held = self.lock();
        for key in keys {
            if let Some((forgotten, _)) = held.files.remove(key) {
                held.bytes -= forgotten.bytes();
            }
        }
    }

    /// Runs located by the scan because a hash named another attempt, or two asked-for
    /// attempts shared one.
    pub fn scans_after_check(&self) -> u64 {
        self.lock().scans_after_check
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // Nothing held is left half-changed by a panic: the counts at worst.
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Memory kept for files' keys, over every session a compactor serves, by default: room for the
/// files of the largest sessions the bench builds (docs/performance.md).
pub const DEFAULT_BUDGET: u64 = 512 << 20;

#[cfg(test)]
mod tests {
    use std::ops::Range;

    use super::*;
    use crate::event::common::TaskStatus;
    use crate::merge::FailureContext;
    use crate::tables::rollup::RowsByFile;
    use crate::tables::task_attempts::tests::attempt;
    use crate::tables::task_attempts::write_delta;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// A stored file of synthetic attempts.
    struct Written {
        key: ObjectKey,
        path: PathBuf,
        rows: u64,
    }

    impl Written {
        /// The attempts `numbers`; a later version of them (finished at `finished`) when
        /// given.
        fn new(dir: &Path, name: &str, numbers: Range<u64>, finished: Option<i64>) -> Self {
            let finished_status = TaskStatus::FINISHED.number().unwrap_or_default();
            let attempts: Vec<TaskAttempt> = numbers
                .map(|n| {
                    let mut attempt = attempt(n);
                    if let Some(at) = finished {
                        attempt.status_times.insert(finished_status, at);
                    }
                    attempt
                })
                .collect();
            let references: Vec<&TaskAttempt> = attempts.iter().collect();
            let path = dir.join(format!("{name}.parquet"));
            let (rows, _) = write_delta(&path, "c", "s", &references, &FailureContext::default())
                .expect("the file is written");
            Self {
                key: ObjectKey::new(format!("tables/{name}.parquet")).expect("a key"),
                path,
                rows,
            }
        }

        fn stored(&self) -> StoredFile<'_> {
            StoredFile {
                key: &self.key,
                path: &self.path,
                rows: self.rows,
            }
        }
    }

    /// The keys of the synthetic attempts `numbers`, as a run asks for them.
    fn keys(numbers: impl Iterator<Item = u64>) -> Vec<(String, i32)> {
        numbers
            .map(attempt)
            .filter_map(|attempt| {
                let task = attempt.task_id.as_ref()?.as_hex().to_owned();
                Some((task, attempt.attempt_number))
            })
            .collect()
    }

    /// What a read returned, comparable: positions, live rows, and the attempts read.
    fn seen(stored: &StoredRows) -> (Vec<(i64, i64)>, RowsByFile, String) {
        (
            stored.positions.clone(),
            stored.live.clone(),
            format!("{:?}", stored.attempts),
        )
    }

    fn scanned(files: &[StoredFile<'_>], filter: &RowFilter) -> Result<StoredRows, TableError> {
        let paths: Vec<PathBuf> = files.iter().map(|file| file.path.to_path_buf()).collect();
        task_attempts::read_attempts(&Connection::open_in_memory()?, &paths, filter)
    }

    #[test]
    fn a_files_keys_are_its_rows_hashes_across_row_groups_and_cores() -> TestResult {
        let dir = tempfile::tempdir()?;
        // Three row groups, shared between the cores' readers.
        let rows = 2 * task_attempts::ROW_GROUP_ROWS + 5_000;
        let file = Written::new(dir.path(), "big", 0..rows, None);
        let connection = Connection::open_in_memory()?;
        let groups: i64 = connection.query_row(
            &format!(
                "SELECT count(DISTINCT row_group_id) FROM parquet_metadata({})",
                crate::tables::newest::path_literal(&file.path)
            ),
            [],
            |row| row.get(0),
        )?;
        assert_eq!(groups, 3);
        let mut statement = connection.prepare(&format!(
            "SELECT task_id, attempt_number, file_row_number FROM {}",
            crate::tables::newest::read_parquet(&[file.path.as_path()], ", file_row_number = true")
        ))?;
        let mut expected: Vec<(u64, u32)> = statement
            .query_map([], |row| {
                let task: String = row.get(0)?;
                let attempt: i32 = row.get(1)?;
                let number: i64 = row.get(2)?;
                Ok((
                    key_hash(&task, attempt),
                    u32::try_from(number).unwrap_or(u32::MAX),
                ))
            })?
            .collect::<Result<_, _>>()?;
        expected.sort_unstable();
        assert_eq!(expected.len() as u64, rows);
        // Several times: the cores' readers once shared a file offset, and read each other's
        // bytes only when their reads interleaved.
        for _ in 0..8 {
            assert_eq!(FileKeys::read(&file.path, key_hash)?.entries, expected);
        }
        Ok(())
    }

    #[test]
    fn two_sorted_lists_merge_sorted() {
        let a = vec![(1, 0), (3, 0), (3, 2), (9, 1)];
        let b = vec![(0, 5), (3, 1), (10, 0)];
        let mut both = [a.clone(), b.clone()].concat();
        both.sort_unstable();
        assert_eq!(merge_sorted(a.clone(), b.clone()), both);
        assert_eq!(merge_sorted(b, a.clone()), both);
        assert_eq!(merge_sorted(Vec::new(), a.clone()), a);
    }

    #[test]
    fn a_lookup_finds_every_entry_of_each_hash_asked_for_and_no_other() {
        // Runs of equal hashes, gaps of every size, hashes asked for before the first entry,
        // between entries, and after the last.
        let mut entries: Vec<(u64, u32)> = Vec::new();
        for (row, hash) in (0u32..).zip((0..300u64).map(|n| 10 + n * n % 977)) {
            entries.push((hash, row));
            if hash % 7 == 0 {
                entries.push((hash, row + 10_000));
            }
        }
        entries.sort_unstable();
        let keys = FileKeys { entries };
        for wanted in [
            vec![],
            vec![0, 5],
            vec![10],
            (0..1_100).collect::<Vec<u64>>(),
            (0..1_100).step_by(3).collect(),
            (0..1_100).step_by(97).collect(),
            vec![985, 986, 2_000],
        ] {
            let mut found = Vec::new();
            keys.find(&wanted, |position, row| found.push((wanted[position], row)));
            let expected: Vec<(u64, u32)> = keys
                .entries
                .iter()
                .copied()
                .filter(|(hash, _)| wanted.contains(hash))
                .collect();
            assert_eq!(found, expected, "asked for {} hashes", wanted.len());
        }
    }

    #[test]
    fn held_keys_find_every_version_the_scan_finds_and_read_each_file_once() -> TestResult {
        let dir = tempfile::tempdir()?;
        // A base and two deltas whose attempts overlap, so that some attempts have versions
        // in two or three files and only the newest is live.
        let base = Written::new(dir.path(), "base", 0..3_000, None);
        let first = Written::new(
            dir.path(),
            "first",
            2_000..4_000,
            Some(1_800_000_000_000_000_000),
        );
        let second = Written::new(
            dir.path(),
            "second",
            2_500..4_500,
            Some(1_900_000_000_000_000_000),
        );
        let files = [base.stored(), first.stored(), second.stored()];
        // Attempts in one, two and three files, and some stored nowhere; plus the unfinished
        // attempts of one job, as a run that saw the job end asks for them.
        let filter = RowFilter {
            keys: keys((1_500..2_700).chain(9_000..9_100)),
            unfinished_of_jobs: vec![format!("{:08x}", 3)],
            unfinished_on_workers: Vec::new(),
        };
        let connection = Connection::open_in_memory()?;
        let paths: Vec<PathBuf> = files.iter().map(|file| file.path.to_path_buf()).collect();
        let unfinished = unfinished_keys(&connection, &paths, &filter)?;
        let asked: Vec<&(String, i32)> = filter.keys.iter().collect();
        assert!(
            unfinished.iter().any(|key| !asked.contains(&key)),
            "the job's unfinished attempts add attempts not asked for by key"
        );

        let held = StoredKeys::new(DEFAULT_BUDGET);
        let scan = scanned(&files, &filter)?;
        let found = held.read_attempts(&connection, &files, &filter)?;
        assert_eq!(seen(&found), seen(&scan));
        let live: usize = scan.live.iter().map(|(_, rows)| rows.len()).sum();
        assert!(
            live > 1_000 && scan.positions.len() > live + 500,
            "{} versions, {live} live: some attempts have several",
            scan.positions.len()
        );
        let all_rows = base.rows + first.rows + second.rows;
        assert_eq!(held.rows_read(), all_rows);

        // The next run reads only the file it has not seen.
        let third = Written::new(dir.path(), "third", 4_000..4_300, None);
        let files = [
            base.stored(),
            first.stored(),
            second.stored(),
            third.stored(),
        ];
        let filter = RowFilter {
            keys: keys(3_900..4_200),
            ..RowFilter::default()
        };
        let found = held.read_attempts(&connection, &files, &filter)?;
        assert_eq!(seen(&found), seen(&scanned(&files, &filter)?));
        assert!(!found.positions.is_empty());
        assert_eq!(held.rows_read(), all_rows + third.rows);
        assert_eq!(held.scans_after_check(), 0);
        Ok(())
    }

    #[test]
    fn a_hash_naming_another_attempt_is_caught_and_the_run_scans() -> TestResult {
        let dir = tempfile::tempdir()?;
        let base = Written::new(dir.path(), "base", 0..2_000, None);
        let delta = Written::new(
            dir.path(),
            "delta",
            1_000..2_500,
            Some(1_800_000_000_000_000_000),
        );
        let files = [base.stored(), delta.stored()];
        let connection = Connection::open_in_memory()?;

        // Every task id of a length shares one hash: the one attempt asked for finds the rows
        // of hundreds of others, which the check on the rows read turns away.
        let by_length: KeyHash = |task, _| task.len() as u64;
        let held = StoredKeys::hashing(DEFAULT_BUDGET, by_length);
        let filter = RowFilter {
            keys: keys(1_500..1_501),
            ..RowFilter::default()
        };
        let found = held.read_attempts(&connection, &files, &filter)?;
        assert_eq!(seen(&found), seen(&scanned(&files, &filter)?));
        assert_eq!(found.positions.len(), 2, "one attempt, in both files");
        assert_eq!(held.scans_after_check(), 1);

        // Attempts asked for that share a hash cannot tell their rows apart: scanned too.
        let by_attempt: KeyHash = |_, attempt| u64::from(attempt.unsigned_abs());
        let held = StoredKeys::hashing(DEFAULT_BUDGET, by_attempt);
        let filter = RowFilter {
            keys: keys(1_400..1_600),
            ..RowFilter::default()
        };
        let found = held.read_attempts(&connection, &files, &filter)?;
        assert_eq!(seen(&found), seen(&scanned(&files, &filter)?));
        assert!(found.positions.len() > 200);
        assert_eq!(held.scans_after_check(), 1);
        assert_eq!(held.rows_read(), 0, "nothing looked up");
        Ok(())
    }

    #[test]
    fn keys_past_the_budget_are_not_held_and_the_least_recently_used_go_first() -> TestResult {
        let dir = tempfile::tempdir()?;
        let a = Written::new(dir.path(), "a", 0..1_000, None);
        let b = Written::new(dir.path(), "b", 1_000..2_000, None);
        let c = Written::new(dir.path(), "c", 2_000..3_000, None);
        let connection = Connection::open_in_memory()?;
        let filter = RowFilter {
            keys: keys((500..600).chain(1_500..1_600).chain(2_500..2_600)),
            ..RowFilter::default()
        };
        let read = |held: &StoredKeys, files: &[StoredFile<'_>]| -> Result<u64, TableError> {
            let before = held.rows_read();
            let found = held.read_attempts(&connection, files, &filter)?;
            assert_eq!(seen(&found), seen(&scanned(files, &filter)?));
            assert_eq!(found.positions.len(), 100 * files.len());
            Ok(held.rows_read() - before)
        };

        // Two files' keys fit, three do not: a session of three is scanned.
        let held = StoredKeys::new(2_000 * ENTRY_BYTES);
        assert_eq!(read(&held, &[a.stored(), b.stored(), c.stored()])?, 0);
        assert_eq!(read(&held, &[a.stored()])?, 1_000);
        assert_eq!(read(&held, &[b.stored()])?, 1_000);
        assert_eq!(read(&held, &[a.stored()])?, 0, "held");
        // c's keys push out b's, used least recently.
        assert_eq!(read(&held, &[c.stored()])?, 1_000);
        assert_eq!(read(&held, &[a.stored(), c.stored()])?, 0, "both held");
        assert_eq!(read(&held, &[b.stored()])?, 1_000, "read again");
        Ok(())
    }
}
