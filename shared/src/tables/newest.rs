//! The log-structured read: the newest version of every row of a keyed table, from its base
//! files and deltas. Queries read through it, and compaction folds deltas into a new base with
//! it, so both apply one rule.
//!
//! Compaction writes full merged rows into each delta, so the newest file holding a key holds
//! that key's merge of everything before: a read never merges fragments, it only picks. Each
//! delta also records the stored rows it supersedes (its deletion vector: file position and row
//! number), so the pick is a scan of every file minus those positions, an anti join on two
//! integers over the few superseded rows, with no key comparison at all. Deltas without a
//! deletion vector (an older format) are read by keys instead: a hash table of the delta keys,
//! probed by the base's keys.

use std::path::{Path, PathBuf};

use super::columns::{Column, duckdb_field_ids};

/// The key of a `task_attempts` row and of the profile spans of an attempt.
pub const ATTEMPT_KEY: [&str; 4] = ["cluster", "session_name", "task_id", "attempt_number"];

/// A SQL string literal of a path this process chose.
pub fn path_literal(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "''"))
}

/// `read_parquet([...])` over `paths`. Hive partitioning stays off: the storage keys'
/// `cluster=…/session=…` folders would otherwise add columns the files already have. Columns
/// are matched by name, as files of different builds may hold different ones (a column a file
/// lacks reads as null).
pub fn read_parquet(paths: &[&Path], extra: &str) -> String {
    let list: Vec<String> = paths.iter().map(|path| path_literal(path)).collect();
    format!(
        "read_parquet([{}], hive_partitioning = false, union_by_name = true{extra})",
        list.join(", ")
    )
}

/// Row numbers named in one statement of [`rows_at`] (the SQL stays small).
const ROW_NUMBERS_PER_READ: usize = 4096;

/// Statements selecting `columns` of the rows at `numbers` in the Parquet file at `path`, a
/// few thousand numbers each: literal row numbers let the reader skip row groups that hold
/// none of them.
pub fn rows_at(path: &Path, numbers: &[i64], columns: &str) -> Vec<String> {
    numbers
        .chunks(ROW_NUMBERS_PER_READ)
        .map(|chunk| {
            let numbers: Vec<String> = chunk.iter().map(i64::to_string).collect();
            format!(
                "SELECT {columns} FROM {} WHERE file_row_number IN ({})",
                read_parquet(&[path], ", file_row_number = true"),
                numbers.join(", ")
            )
        })
        .collect()
}

/// The files of one table as a reader sees them.
#[derive(Clone, Debug, Default)]
pub struct TableFiles<'a> {
    /// Base files (written by folds): no key repeats among them.
    pub base: Vec<&'a Path>,
    /// Delta files, oldest first (across sessions, whose keys never collide).
    pub deltas: Vec<&'a Path>,
    /// True when every file belongs to one session: the key is then just the attempt's
    /// (task id, attempt number), a cheaper join than one that also compares names.
    pub one_session: bool,
    /// Every delta's deletion vector, when each delta read has one; `None`: read by key.
    pub deletes: Option<Vec<DeletionVector<'a>>>,
}

/// One delta's deletion vector as a reader sees it.
#[derive(Clone, Debug)]
pub struct DeletionVector<'a> {
    /// Its local copy: `(file, row)` pairs.
    pub path: &'a Path,
    /// For each file position the vector may name (its session's files when the delta was
    /// written, oldest first), that file's index among the files read: base files first, then
    /// deltas, as in [`TableFiles`]. `None` for a file not read.
    pub files: &'a [Option<usize>],
    /// Positions in it.
    pub rows: u64,
}

/// Local copies of one table's live files.
#[derive(Clone, Debug, Default)]
pub struct LocalFiles {
    /// Base files (written by folds).
    pub base: Vec<PathBuf>,
    /// Deltas, oldest first within each session.
    pub deltas: Vec<PathBuf>,
    /// True when every file belongs to one session.
    pub one_session: bool,
    /// Deletion vectors of every delta, or `None` to read by key (see [`TableFiles::deletes`]).
    pub deletes: Option<Vec<LocalDeletes>>,
}

/// A local copy of one deletion vector (see [`DeletionVector`]).
#[derive(Clone, Debug)]
pub struct LocalDeletes {
    /// The copy.
    pub path: PathBuf,
    /// Index among the files read of each position the vector may name.
    pub files: Vec<Option<usize>>,
    /// Positions in it.
    pub rows: u64,
}

impl LocalFiles {
    /// The files as [`TableFiles`].
    pub fn files(&self) -> TableFiles<'_> {
        TableFiles {
            base: self.base.iter().map(PathBuf::as_path).collect(),
            deltas: self.deltas.iter().map(PathBuf::as_path).collect(),
            one_session: self.one_session,
            deletes: self.deletes.as_ref().map(|vectors| {
                vectors
                    .iter()
                    .map(|vector| DeletionVector {
                        path: &vector.path,
                        files: &vector.files,
                        rows: vector.rows,
                    })
                    .collect()
            }),
        }
    }
}

/// A relation with the newest version of every key: base rows whose key no delta has, plus
/// each key's rows from the newest delta that has it. `None` when there are no files.
pub fn newest_rows(files: &TableFiles<'_>) -> Option<String> {
    if files.base.is_empty() && files.deltas.is_empty() {
        return None;
    }
    if files.deltas.is_empty() {
        return Some(format!("(SELECT * FROM {})", read_parquet(&files.base, "")));
    }
    if let Some(read) = SupersededRead::of(files) {
        return Some(read.rows());
    }
    let key_columns: &[&str] = if files.one_session {
        &ATTEMPT_KEY[2..]
    } else {
        &ATTEMPT_KEY
    };
    let key = key_columns.join(", ");
    // `file_index` is the position in the list (deltas are oldest first): the newest file of a
    // key is its largest index. An integer per row, where file names would be strings.
    let deltas = read_parquet(&files.deltas, "");
    let newest =
        format!("SELECT {key}, max(file_index) AS file_index FROM {deltas} GROUP BY {key}");
    let on = |left: &str| -> String {
        key_columns
            .iter()
            .map(|column| format!("{left}.{column} = n.{column}"))
            .collect::<Vec<_>>()
            .join(" AND ")
    };
    let delta_rows = format!(
        "SELECT d.* FROM {deltas} d
         SEMI JOIN newest_keys n ON {on} AND d.file_index = n.file_index",
        on = on("d"),
    );
    if files.base.is_empty() {
        return Some(format!("(WITH newest_keys AS ({newest}) {delta_rows})"));
    }
    Some(format!(
        "(WITH newest_keys AS ({newest})
          SELECT b.* FROM {base} b ANTI JOIN newest_keys n ON {on}
          UNION ALL BY NAME
          {delta_rows})",
        base = read_parquet(&files.base, ""),
        on = on("b"),
    ))
}

/// A read by deletion vectors in its two parts, for a query that wants only the first rows in
/// some order: it can take the first `n + count` rows of the plain scan (where DuckDB's top-N
/// skips row groups by their statistics, which it cannot do through a join) and only then drop
/// the superseded ones, as at most `count` of those rows can be superseded.
#[derive(Clone, Debug)]
pub struct SupersededRead {
    files: String,
    /// The same files in the reverse order, without positions (see
    /// [`Self::rows_newest_files_first`]).
    newest_files_first: String,
    superseded: Option<String>,
    count: u64,
}

impl SupersededRead {
    /// The read by deletion vectors of `files`; `None` unless every delta has one.
    pub fn of(files: &TableFiles<'_>) -> Option<Self> {
        let vectors = files.deletes.as_ref()?;
        let all: Vec<&Path> = files.base.iter().chain(&files.deltas).copied().collect();
        if all.is_empty() {
            return None;
        }
        let superseded: Vec<String> = vectors.iter().map(superseded_positions).collect();
        let reversed: Vec<&Path> = all.iter().rev().copied().collect();
        Some(Self {
            files: read_parquet(&all, ", file_row_number = true"),
            newest_files_first: read_parquet(&reversed, ""),
            superseded: (!superseded.is_empty()).then(|| superseded.join(" UNION ALL ")),
            count: vectors.iter().map(|vector| vector.rows).sum(),
        })
    }

    /// The newest rows: every row except the superseded positions.
    pub fn rows(&self) -> String {
        match &self.superseded {
            None => format!("(SELECT * EXCLUDE (file_row_number) FROM {})", self.files),
            Some(superseded) => format!(
                "(SELECT * EXCLUDE (file_row_number) FROM {} t
                  ANTI JOIN ({superseded}) d
                  ON t.file_index = d.file_index AND t.file_row_number = d.file_row_number)",
                self.files
            ),
        }
    }

    /// Every stored row, superseded or not, with its position as the columns `file_number`
    /// and `file_row_number`.
    pub fn rows_with_positions(&self) -> String {
        format!("(SELECT *, file_index AS file_number FROM {})", self.files)
    }

    /// Every stored row, superseded or not, its files in the reverse of the order they are
    /// read in: each session's deltas newest first, then the bases. For a top-N by creation,
    /// newest first: DuckDB scans the files in the order listed, and once the newest rows
    /// have filled the top-N, its threshold skips nearly every older row group by its
    /// statistics. Listed bases first, the base's row groups (each job's, from its oldest)
    /// would be scanned before the threshold could skip them: a large table page's bound would
    /// read about half of the row groups instead of a few.
    pub fn rows_newest_files_first(&self) -> String {
        self.newest_files_first.clone()
    }

    /// The superseded positions, as `file_index` and `file_row_number` (no rows when none).
    pub fn superseded(&self) -> String {
        match &self.superseded {
            Some(superseded) => format!("({superseded})"),
            None => "(SELECT NULL::BIGINT AS file_index, NULL::BIGINT AS file_row_number \
                     WHERE FALSE)"
                .to_owned(),
        }
    }

    /// How many positions the vectors name (an upper bound on the rows they drop).
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// One vector's positions as read indices (see [`DeletionVector::files`]).
fn superseded_positions(vector: &DeletionVector<'_>) -> String {
    let identity = vector
        .files
        .iter()
        .enumerate()
        .all(|(position, index)| *index == Some(position));
    // A position whose file is not read maps to NULL, which matches no row.
    let file_index = if identity {
        "file".to_owned()
    } else {
        let arms: String = vector
            .files
            .iter()
            .enumerate()
            .filter_map(|(position, index)| {
                index.map(|index| format!(" WHEN {position} THEN {index}"))
            })
            .collect();
        if arms.is_empty() {
            "NULL::BIGINT".to_owned()
        } else {
            format!("CASE file{arms} END")
        }
    };
    format!(
        "SELECT {file_index} AS file_index, row AS file_row_number FROM {}",
        read_parquet(&[vector.path], "")
    )
}

/// Writes the newest rows of `files` to `path` as one Parquet file, sorted by `order` and
/// written with COPY `options`, each column `columns` names with its field id: a fold of
/// deltas into a base, in DuckDB alone (the sort spills to disk rather than needing memory for
/// every row), for files that cannot be interleaved as they are sorted (see
/// [`crate::compact::fold`]). Returns the row count; with no files, nothing is written.
pub fn write_newest(
    connection: &duckdb::Connection,
    files: &TableFiles<'_>,
    order: &str,
    options: &str,
    columns: &[Column],
    path: &Path,
) -> Result<u64, duckdb::Error> {
    let Some(relation) = newest_rows(files) else {
        return Ok(0);
    };
    // Files of older builds may lack columns, which DuckDB's field ids may not name.
    let mut described = connection.prepare(&format!("DESCRIBE SELECT * FROM {relation}"))?;
    let present: Vec<String> = described
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    let field_ids = duckdb_field_ids(columns, &present);
    let copy = format!(
        "COPY (SELECT * FROM {relation} ORDER BY {order}) TO {} ({options}{field_ids})",
        path_literal(path)
    );
    Ok(connection.execute(&copy, [])? as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reversed_read_lists_the_newest_delta_first_and_the_base_last() -> Result<(), String> {
        let (base, old, new) = (
            Path::new("/d/base.parquet"),
            Path::new("/d/delta-1.parquet"),
            Path::new("/d/delta-2.parquet"),
        );
        let files = TableFiles {
            base: vec![base],
            deltas: vec![old, new],
            one_session: true,
            deletes: Some(Vec::new()),
        };
        let read = SupersededRead::of(&files).ok_or("no read by deletion vectors")?;
        let text = read.rows_newest_files_first();
        let at = |path: &Path| text.find(&path_literal(path)).unwrap_or(usize::MAX);
        assert!(
            at(new) < at(old) && at(old) < at(base) && at(base) < text.len(),
            "{text}"
        );
        // Positions are the other relation's: listed oldest first, they index the vectors.
        let positions = read.rows_with_positions();
        let at = |path: &Path| positions.find(&path_literal(path)).unwrap_or(usize::MAX);
        assert!(
            at(base) < at(old) && at(old) < at(new) && at(new) < positions.len(),
            "{positions}"
        );
        Ok(())
    }
}
