//! A `task_attempts` file's key index: for every row, a 32-bit key of its task id and the block
//! of rows it sits in, sorted by key. A point lookup reads the index files (row-group
//! statistics on the sorted key leave one small row group each) and then only the blocks of
//! the data files that may hold the task, instead of comparing the task id of every row of
//! the task's job in the base and of every row of every delta.
//!
//! Data files are sorted by job and creation time for the table page, so a task id alone
//! prunes nothing there; a Parquet bloom filter would need dictionary-encoded ids (DuckDB
//! writes none otherwise, and forcing dictionaries would make the base far larger). The index
//! costs a few bytes per attempt.
//!
//! A key is a hash, so it may name blocks that do not hold the task (a rare lookup reads one block
//! more): readers compare the task id itself in the blocks named. Files of an older format have
//! none; a session with such a file is read the plain way.
//!
//! Compaction builds a file's index from the task ids of the rows it writes ([`KeyIndex`]): a
//! run's delta as its batches are built, a fold's interleaved rows as they are written and its
//! copied row groups' from their task id column alone. Only a base DuckDB sorted (files the
//! crate's interleave declines) is indexed by DuckDB reading it back ([`write_key_index`]).

use std::path::Path;
use std::sync::Arc;

use duckdb::Connection;
use duckdb::arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use duckdb::arrow::datatypes::{DataType, Field, Schema};

use super::TableError;
use super::newest::{path_literal, read_parquet};
use super::parquet::{Layout, ParquetFile};
use super::task_attempts::{ROW_GROUP_ROWS, file_rows};

/// The column of a `task_attempts` file a key index is of.
pub const TASK_ID: &str = "task_id";

/// How DuckDB writes a key index: sorted by key, so each row group's min/max statistics bound
/// its keys and a lookup reads one of them (row groups of [`index_row_group_rows`]).
const PARQUET_OPTIONS: &str = "FORMAT parquet, COMPRESSION zstd, PARQUET_VERSION V2";

/// Rows per row group of the key index of a file of `rows` rows: a quarter of them (rounded up, so
/// the crate writes four), from 16 384 to [`ROW_GROUP_ROWS`]. A lookup decodes one row group of
/// every index, and a run's delta would otherwise fit in one row group, so each delta's whole
/// index would be decoded; a base's index gains nothing from smaller ones, as DuckDB's planner
/// reads the statistics of every row group.
fn index_row_group_rows(rows: u64) -> u64 {
    rows.div_ceil(4).clamp(16_384, ROW_GROUP_ROWS)
}

/// The key of the task id `operand` (SQL of a hex string): bytes 0–3 of the id xor bytes 8–11.
/// Normal and actor tasks have random first bytes; an actor-creation task's first eight bytes
/// are constant, but bytes 8–11 are its actor's random ones. Text that is not hex counts as
/// zero, so the key is total (and such ids simply share a key).
fn key_of(operand: &str) -> String {
    let word = |start: u32| {
        format!("coalesce(try_cast('0x' || substr({operand}, {start}, 8) AS UBIGINT), 0)")
    };
    format!("xor({}, {})::UINTEGER", word(1), word(17))
}

/// The first and last row number of `block` in a data file.
pub fn block_rows(block: u32) -> (u64, u64) {
    let first = u64::from(block) * ROW_GROUP_ROWS;
    (first, first + ROW_GROUP_ROWS - 1)
}

/// Writes the key index of the `task_attempts` file `data`, of `rows` rows, to `path`.
/// Returns its rows (the data file's).
pub fn write_key_index(
    connection: &Connection,
    data: &Path,
    rows: u64,
    path: &Path,
) -> Result<u64, TableError> {
    let copy = format!(
        "COPY (SELECT {key} AS key, (row_number // {ROW_GROUP_ROWS})::UINTEGER AS block
               FROM {data} ORDER BY key)
         TO {path} ({PARQUET_OPTIONS}, ROW_GROUP_SIZE {group})",
        key = key_of(TASK_ID),
        data = file_rows(data),
        path = path_literal(path),
        group = index_row_group_rows(rows),
    );
    Ok(connection.execute(&copy, [])? as u64)
}

/// A key index built from the task ids of a data file being written, row by row in the
/// file's order, and written by the parquet crate: the rows [`write_key_index`] writes, without
/// DuckDB reading back every task id of the file just written (a cost every run and every fold
/// would pay).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct KeyIndex {
    /// The entry of each row added ([`entry`]: its key and its block).
    entries: Vec<u64>,
    /// Rows of the data file placed so far: those added and those [`KeyIndex::skip`]ped.
    rows: u64,
}

/// Hands `each` the task id of every row of `task_ids` (a text column of any of Arrow's
/// string types, as DuckDB and the parquet crate read them), in order.
pub fn each_task_id(
    task_ids: &dyn Array,
    mut each: impl FnMut(Option<&str>),
) -> Result<(), TableError> {
    match task_ids.data_type() {
        DataType::Utf8 => task_ids.as_string::<i32>().iter().for_each(each),
        DataType::LargeUtf8 => task_ids.as_string::<i64>().iter().for_each(each),
        DataType::Utf8View => task_ids.as_string_view().iter().for_each(&mut each),
        other => {
            return Err(TableError::Corrupt(format!(
                "task ids of type {other}, not text"
            )));
        }
    }
    Ok(())
}

impl KeyIndex {
    /// An empty index with room for `rows` rows.
    pub fn with_capacity(rows: usize) -> Self {
        Self {
            entries: Vec::with_capacity(rows),
            rows: 0,
        }
    }

    /// Rows of the data file placed so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Adds the data file's next row, of task id `task_id` (hex).
    pub fn push(&mut self, task_id: &str) {
        self.entries.push(entry(key(task_id), self.rows));
        self.rows += 1;
    }

    /// Adds the data file's next rows, of the task ids `task_ids` (a text column).
    pub fn push_column(&mut self, task_ids: &dyn Array) -> Result<(), TableError> {
        self.push_keys(&Self::keys_of(task_ids)?);
        Ok(())
    }

    /// Adds the data file's next rows, of the keys `keys` ([`KeyIndex::keys_of`] their task
    /// ids).
    pub fn push_keys(&mut self, keys: &[u32]) {
        let start = self.skip(keys.len() as u64);
        self.add_at(start, keys);
    }

    /// Passes over the data file's next `rows` rows, to be added later with
    /// [`KeyIndex::add_at`]. Returns the first one's row number.
    pub fn skip(&mut self, rows: u64) -> u64 {
        let start = self.rows;
        self.rows += rows;
        start
    }

    /// Adds rows passed over ([`KeyIndex::skip`]) from row number `start` on, of the keys
    /// `keys` ([`KeyIndex::keys_of`] their task ids).
    pub fn add_at(&mut self, start: u64, keys: &[u32]) {
        self.entries
            .extend((start..).zip(keys).map(|(row, key)| entry(*key, row)));
    }

    /// The keys of the task ids `task_ids` (a text column), in order. A null has the key of
    /// no digits, as in SQL ([`key_of`]).
    pub fn keys_of(task_ids: &dyn Array) -> Result<Vec<u32>, TableError> {
        let mut keys = Vec::with_capacity(task_ids.len());
        each_task_id(task_ids, |id| keys.push(key(id.unwrap_or_default())))?;
        Ok(keys)
    }

    /// Writes the index to `path`, sorted by key (then block), in row groups of
    /// [`index_row_group_rows`]. Returns its rows (the data file's).
    pub fn write(self, path: &Path) -> Result<u64, TableError> {
        let rows = self.rows;
        // Every row placed must have been added: an index missing rows would send lookups
        // past tasks it holds.
        if self.entries.len() as u64 != rows {
            return Err(TableError::Corrupt(format!(
                "a key index of {} rows for a file of {rows}",
                self.entries.len()
            )));
        }
        let mut entries = self.entries;
        entries.sort_unstable();
        // The high half is the key, the low the block (see `entry`).
        let (keys, blocks): (Vec<u32>, Vec<u32>) = entries
            .into_iter()
            .map(|entry| ((entry >> 32) as u32, entry as u32))
            .unzip();
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", DataType::UInt32, true),
            Field::new("block", DataType::UInt32, true),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(UInt32Array::from(keys)),
                Arc::new(UInt32Array::from(blocks)),
            ],
        )?;
        // Sorted keys differ by little from one row to the next; their blocks are few values,
        // which a dictionary holds.
        let layout = Layout {
            row_group_rows: usize::try_from(index_row_group_rows(rows)).unwrap_or(usize::MAX),
            unique: &[],
            ordered: &["key"],
            columns: &[],
        };
        let mut file = ParquetFile::create(path, schema, &layout)?;
        file.write(&batch)?;
        file.finish()
    }
}

/// The index's entry for a row of `key` at row number `row`: the key in the high half and the
/// row's block in the low, so that entries sort by key, then block, as one word each. A block
/// past `u32::MAX` would need 500 trillion rows.
fn entry(key: u32, row: u64) -> u64 {
    let block = u32::try_from(row / ROW_GROUP_ROWS).unwrap_or(u32::MAX);
    (u64::from(key) << 32) | u64::from(block)
}

/// The key of `task_id`, as [`key_of`] computes it in the index: the same words, each zero
/// unless it is all hex digits. Computed here, a lookup asks DuckDB one question fewer.
fn key(task_id: &str) -> u32 {
    let word = |start: usize| {
        let bytes = task_id.as_bytes();
        let digits = bytes
            .get(start..bytes.len().min(start + 8))
            .unwrap_or_default();
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_hexdigit) {
            return 0;
        }
        // Up to 8 hex digits fit in 32 bits.
        digits.iter().fold(0u32, |word, digit| {
            let value = char::from(*digit).to_digit(16).unwrap_or_default();
            (word << 4) | value
        })
    };
    word(0) ^ word(16)
}

/// A query over the key indexes `indexes` (`key` bound as its one parameter) returning
/// `(index, block)` for every row of the key, `index` being the position in `indexes` of the
/// data file its block is in. (Made distinct and ordered by the caller: in SQL that would be a
/// large share of the query.)
fn locate(indexes: &[&Path]) -> String {
    format!(
        "SELECT file_index::BIGINT AS file_index, block FROM {} WHERE key = ?",
        read_parquet(indexes, "")
    )
}

/// Runs [`locate`] for `task_id`: the `(position in indexes, block)` pairs that may hold it,
/// in order, each once.
pub fn blocks_of(
    connection: &Connection,
    indexes: &[&Path],
    task_id: &str,
) -> Result<Vec<(usize, u32)>, TableError> {
    if indexes.is_empty() {
        return Ok(Vec::new());
    }
    let key = key(task_id);
    let mut statement = connection.prepare(&locate(indexes))?;
    let rows = statement.query_map([key], |row| {
        Ok((row.get::<_, i64>(0)?, row.get::<_, u32>(1)?))
    })?;
    let mut blocks = Vec::new();
    for row in rows {
        let (index, block) = row?;
        let index = usize::try_from(index)
            .map_err(|_| TableError::Corrupt(format!("key index position {index}")))?;
        blocks.push((index, block));
    }
    blocks.sort_unstable();
    blocks.dedup();
    Ok(blocks)
}

/// A key index as read back: its rows, sorted, and its columns with their types.
#[cfg(test)]
type IndexRows = (Vec<(u32, u32)>, Vec<String>);

/// The rows of the key index at `path`, sorted, and the types of its columns: what two indexes
/// of one file must agree on.
#[cfg(test)]
fn index_rows(connection: &Connection, path: &Path) -> Result<IndexRows, TableError> {
    let index = read_parquet(&[path], "");
    let mut statement = connection.prepare(&format!(
        "SELECT key, block FROM {index} ORDER BY key, block"
    ))?;
    let rows = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let mut statement = connection.prepare(&format!("DESCRIBE SELECT * FROM {index}"))?;
    let types = statement
        .query_map([], |row| {
            Ok(format!(
                "{} {}",
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?
            ))
        })?
        .collect::<Result<_, _>>()?;
    Ok((rows, types))
}

/// Checks `index`, built as the data file `data` (of `rows` rows) was written, against the key
/// index DuckDB computes from `data` ([`write_key_index`]): the same rows and column types.
/// Both are written in `dir`.
#[cfg(test)]
pub(crate) fn indexed_as_duckdb(
    connection: &Connection,
    index: KeyIndex,
    data: &Path,
    rows: u64,
    dir: &Path,
) -> Result<(), TableError> {
    let (ours, theirs) = (dir.join("ours-index"), dir.join("theirs-index"));
    assert_eq!(index.write(&ours)?, rows);
    write_key_index(connection, data, rows, &theirs)?;
    assert_eq!(
        index_rows(connection, &ours)?,
        index_rows(connection, &theirs)?,
        "{}",
        data.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection() -> Connection {
        crate::tables::open_duckdb().expect("an in-memory DuckDB")
    }

    /// The key the index stores for `task_id`: [`key_of`] run by DuckDB.
    fn stored_key(connection: &Connection, task_id: &str) -> u32 {
        let sql = format!("SELECT {} FROM (SELECT ?::VARCHAR AS id)", key_of("id"));
        connection
            .query_row(&sql, [task_id], |row| row.get::<_, u32>(0))
            .expect("a key")
    }

    #[test]
    fn keys_mix_the_random_bytes_of_every_kind_of_task_id() {
        // A normal task (random, then the nil actor id of job 01000000), an actor task, and
        // an actor-creation task (constant first bytes, random actor bytes).
        let normal = "0a1b2c3d4e5f6071ffffffffffffffffffffffff01000000";
        let creation = "ffffffffffffffff91a2b3c4d5e6f7081929a3b401000000";
        let other_creation = "ffffffffffffffff0102030405060708090a0b0c01000000";
        assert_eq!(key(normal), 0x0a1b_2c3d ^ 0xffff_ffff);
        assert_eq!(key(creation), 0xffff_ffff ^ 0x91a2_b3c4);
        assert_ne!(key(creation), key(other_creation));
        // Not hex: a key all the same, never an error.
        assert_eq!(key("zz"), 0);
    }

    #[test]
    fn a_lookup_computes_the_key_the_index_stores() {
        let connection = connection();
        let mut ids: Vec<String> = [
            "0a1b2c3d4e5f6071ffffffffffffffffffffffff01000000",
            "ffffffffffffffff91a2b3c4d5e6f7081929a3b401000000",
            "ABCDEF0123456789FFFFFFFFFFFFFFFF0000000002000000",
            // Shorter than one word, one word, between the words, part of the second.
            "",
            "7",
            "0123456789abcdef",
            "0123456789abcdef01",
            "0123456789abcdef0123",
            // Not hex in the first word, the second, or a sign DuckDB's cast refuses.
            "zz23456789abcdef01234567",
            "0123456789abcdef0123456z",
            "+1234567",
            "+1234567ffffffff+1234567",
            "01 34567ffffffff 1234567",
        ]
        .iter()
        .map(|id| (*id).to_owned())
        .collect();
        // And ids of every length from a fixed generator.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for length in 0..=48 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            ids.push(format!("{state:016x}{state:016x}{state:016x}")[..length].to_owned());
        }
        for id in &ids {
            assert_eq!(key(id), stored_key(&connection, id), "task id {id:?}");
        }
    }

    #[test]
    fn a_lookup_finds_every_block_holding_the_task_and_reads_no_other() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let connection = connection();
        let data = dir.path().join("data.parquet");
        let index = dir.path().join("keys.parquet");
        // Three blocks of rows: ids from row numbers, one id in two blocks (its two attempts).
        let rows = 2 * ROW_GROUP_ROWS + 10;
        connection
            .execute_batch(&format!(
                "COPY (SELECT CASE WHEN i IN (5, {twice}) THEN 'abcdef0123456789ffffffffffffffffffffffff01000000'
                            ELSE printf('%016x', hash(i + 1)) || 'ffffffffffffffffffffffff01000000' END AS task_id,
                       i AS attempt_number
                       FROM range({rows}) t(i))
                 TO {path} (FORMAT parquet, ROW_GROUP_SIZE {ROW_GROUP_ROWS})",
                twice = 2 * ROW_GROUP_ROWS + 3,
                path = path_literal(&data),
            ))
            .expect("data written");
        assert_eq!(
            write_key_index(&connection, &data, rows, &index).expect("index written"),
            rows
        );
        let found = blocks_of(
            &connection,
            &[&index],
            "abcdef0123456789ffffffffffffffffffffffff01000000",
        )
        .expect("located");
        assert_eq!(found, vec![(0, 0), (0, 2)]);
        assert_eq!(block_rows(2), (2 * ROW_GROUP_ROWS, 3 * ROW_GROUP_ROWS - 1));
        // The index in row groups of about a quarter of its rows, each a range of keys, so a
        // lookup decodes one of them.
        let bounds = |path: &Path| -> Vec<(u32, u32)> {
            connection
                .prepare(&format!(
                    "SELECT stats_min_value::UINTEGER, stats_max_value::UINTEGER
                     FROM parquet_metadata({}) WHERE path_in_schema = 'key'
                     ORDER BY row_group_id",
                    path_literal(path)
                ))
                .and_then(|mut statement| {
                    statement
                        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
                        .collect::<Result<_, _>>()
                })
                .expect("row groups")
        };
        // Each group of the index is a range of keys that leaves one group to read for a key:
        // ranges in order, as unsigned numbers (keys from 2^31 up included).
        let one_group_holds = |groups: &[(u32, u32)], wanted: u32| {
            let ranges_in_order = groups.windows(2).all(|pair| pair[0].1 <= pair[1].0);
            let holding = groups
                .iter()
                .filter(|(min, max)| (*min..=*max).contains(&wanted))
                .count();
            ranges_in_order && holding == 1
        };
        let groups = bounds(&index);
        assert!((4..=5).contains(&groups.len()), "{groups:?}");
        let wanted = key("abcdef0123456789ffffffffffffffffffffffff01000000");
        assert!(one_group_holds(&groups, wanted), "{groups:?}");
        assert!(groups.iter().any(|(_, max)| *max >= 1 << 31), "{groups:?}");
        let absent = blocks_of(
            &connection,
            &[&index],
            "0000000000000001ffffffffffffffffffffffff01000000",
        )
        .expect("located");
        assert!(absent.is_empty(), "{absent:?}");

        // The same index built from the task ids in the file's order, some rows passed over
        // and added later (as a fold adds the row groups it copies): DuckDB's rows, types and
        // row groups, and the same blocks found.
        let ids: Vec<String> = connection
            .prepare(&format!(
                "SELECT task_id FROM {} ORDER BY row_number",
                file_rows(&data)
            ))
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| row.get(0))?
                    .collect::<Result<_, _>>()
            })
            .expect("task ids");
        let (before, rest) = ids.split_at(100_000);
        let (passed, after) = rest.split_at(50_000);
        let mut built = KeyIndex::default();
        before.iter().for_each(|id| built.push(id));
        let start = built.skip(passed.len() as u64);
        let column = duckdb::arrow::array::StringArray::from_iter_values(after);
        built.push_column(&column).expect("a text column");
        let column = duckdb::arrow::array::StringViewArray::from_iter_values(passed);
        built.add_at(start, &KeyIndex::keys_of(&column).expect("a text column"));
        let ours = dir.path().join("built.parquet");
        assert_eq!(built.write(&ours).expect("index written"), rows);
        assert_eq!(
            index_rows(&connection, &ours).expect("read"),
            index_rows(&connection, &index).expect("read")
        );
        let groups = |path: &Path| -> i64 {
            connection
                .query_row(
                    &format!(
                        "SELECT count(DISTINCT row_group_id) FROM parquet_metadata({})",
                        path_literal(path)
                    ),
                    [],
                    |row| row.get(0),
                )
                .expect("row groups")
        };
        // DuckDB cuts row groups at whole vectors of rows; the crate exactly. Its statistics
        // bound each group's keys as DuckDB's do.
        assert_eq!(groups(&ours), 4);
        let built_groups = bounds(&ours);
        assert!(one_group_holds(&built_groups, wanted), "{built_groups:?}");
        let high = ids
            .iter()
            .map(|id| key(id))
            .find(|key| *key >= 1 << 31)
            .expect("a key from 2^31 up");
        assert!(one_group_holds(&built_groups, high), "{built_groups:?}");
        assert_eq!(
            blocks_of(
                &connection,
                &[&ours],
                "abcdef0123456789ffffffffffffffffffffffff01000000",
            )
            .expect("located"),
            vec![(0, 0), (0, 2)]
        );
        // An index missing a row it passed over is not written.
        let mut short = KeyIndex::default();
        short.push("ab");
        short.skip(1);
        assert!(matches!(
            short.write(&dir.path().join("short.parquet")),
            Err(TableError::Corrupt(_))
        ));
    }
}
