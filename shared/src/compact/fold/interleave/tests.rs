//! Tests of the interleave: its files against DuckDB's sort of the same newest rows, and the
//! base's row groups it copies.

use super::*;
use crate::tables::newest::{path_literal, write_newest};

const SORT_KEY: [&str; 4] = ["job_id", "creation_time_ms", "task_id", "attempt_number"];

const LAYOUT: Layout = Layout {
    row_group_rows: 122_880,
    unique: &["task_id"],
    ordered: &[],
    columns: &[],
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
fn replacing<'a>(base: &'a Path, delta: &'a Path, deletes: &'a Path, rows: u64) -> TableFiles<'a> {
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

/// Interleaves `files` reading `batch_rows` rows at a time and checks the file against DuckDB's
/// sort of their newest rows: the same rows at the same places, of the same column types,
/// in row groups of the same sizes. Returns the rows.
fn interleaves_as_duckdb_sorts(
    connection: &Connection,
    files: &TableFiles<'_>,
    batch_rows: usize,
    dir: &Path,
) -> Result<u64, Box<dyn std::error::Error>> {
    let ours = dir.join(format!("ours-{batch_rows}.parquet"));
    let interleaved = interleaves_as_duckdb_orders(connection, files, &LAYOUT, batch_rows, &ours)?;
    assert_eq!(
        interleaved.copied_groups, 0,
        "a DuckDB file's row groups copied"
    );
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
    Ok(interleaved.rows)
}

/// Interleaves `files` into `ours` (laid out as `layout` says) reading `batch_rows` rows at a
/// time and checks the file against DuckDB's sort of their newest rows (`theirs.parquet`
/// beside it): the same rows at the same places, of the same column types.
fn interleaves_as_duckdb_orders(
    connection: &Connection,
    files: &TableFiles<'_>,
    layout: &Layout,
    batch_rows: usize,
    ours: &Path,
) -> Result<Interleaved, Box<dyn std::error::Error>> {
    let written = interleave_in_batches(connection, files, &SORT_KEY, layout, batch_rows, ours)?
        .ok_or("the interleave declined the files")?;
    let theirs = ours.with_file_name("theirs.parquet");
    let expected = write_newest(
        connection,
        files,
        &SORT_KEY.join(", "),
        "FORMAT parquet, ROW_GROUP_SIZE 122880",
        &[],
        &theirs,
    )?;
    assert_eq!(written.rows, expected, "rows interleaved");
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
/// session had one more: the interleave writes the rows DuckDB's sort of the newest rows
/// writes, in batches as read and in batches of a few rows (every batch boundary a case).
#[test]
fn an_interleave_of_sorted_files_is_duckdbs_sort_of_their_newest_rows()
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
        let rows = interleaves_as_duckdb_sorts(&connection, &files, batch_rows, dir.path())?;
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
    columns: &[],
};

/// A base of 300 000 attempts ([`attempts_in_order`]) as a fold writes it: DuckDB's sorted
/// file interleaved by the crate into groups of [`GROUPS`], at `base.parquet` in `dir`.
fn crate_base(
    connection: &Connection,
    dir: &Path,
) -> Result<std::path::PathBuf, Box<dyn std::error::Error>> {
    let sorted = dir.join("sorted.parquet");
    copy_sorted(connection, &attempts_in_order(0, 300_000, "base"), &sorted)?;
    let base = dir.join("base.parquet");
    let written = interleave_in_batches(
        connection,
        &alone(&sorted),
        &SORT_KEY,
        &GROUPS,
        BATCH_ROWS,
        &base,
    )?
    .ok_or("the interleave was declined")?;
    assert_eq!(
        (written.rows, written.copied_groups),
        (300_000, 0),
        "DuckDB's file is interleaved, not copied"
    );
    Ok(base)
}

/// A fold of a base the crate wrote copies the row groups no delta changed, byte for byte,
/// and interleaves the others: those holding a row a delta replaces, and those a delta's new
/// rows fall among (a job's last group, whose attempts without a creation time sort after
/// the new ones). The file is DuckDB's sort of the newest rows, row for row, with an offset
/// index through which the crate reads a task from copied and interleaved groups alike.
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
        let interleaved =
            interleaves_as_duckdb_orders(&connection, &files, &GROUPS, batch_rows, &ours)?;
        // Of the ten, the two replaced rows' groups and each job's last are interleaved.
        assert_eq!(interleaved.copied_groups, 6, "{batch_rows} rows a batch");
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
        for row in (0..interleaved.rows).step_by(15_000) {
            let task_id: String = connection.query_row(
                &format!(
                    "SELECT task_id FROM {} WHERE file_row_number = {row}",
                    read_parquet(&[&ours], ", file_row_number = true")
                ),
                [],
                |found| found.get(0),
            )?;
            let block = (row - row % 30_000, row - row % 30_000 + 29_999);
            let batches = crate::tables::task_block::task_rows(&footers, &ours, block, &task_id)?;
            let mut states = Vec::new();
            for batch in &batches {
                for index in 0..batch.num_rows() {
                    let found = crate::query::read::json::arrow_row(batch, index)?;
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
        // The key index of interleaved and copied rows alike is the one DuckDB computes from
        // the file: copied groups start where no block does (groups of 30 000 rows).
        crate::tables::key_index::indexed_as_duckdb(
            &connection,
            interleaved.index,
            &ours,
            interleaved.rows,
            dir.path(),
        )?;
    }
    Ok(())
}

/// A fold whose delta falls among none of the base's row groups copies every one of them,
/// each closed exactly full, between interleaved rows that sort before the first and after the
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
        let interleaved =
            interleaves_as_duckdb_orders(&connection, &files, &GROUPS, batch_rows, &ours)?;
        assert_eq!(interleaved.copied_groups, 10, "{batch_rows} rows a batch");
        let folded = chunks(&ours)?;
        assert_eq!(folded.len(), 12, "a group of one row on each side");
        assert!(
            folded.get(1..11) == Some(&base_chunks[..]),
            "groups copied in order"
        );
        crate::tables::key_index::indexed_as_duckdb(
            &connection,
            interleaved.index,
            &ours,
            300_002,
            dir.path(),
        )?;
    }
    Ok(())
}

/// A base whose row groups are out of order (rows of a group sort before the last of the
/// group before it) is an error, not a misordered fold: a group that would be copied is
/// never decoded, so the interleave checks the keys that bound it. Nothing is left on disk, and
/// the fold falls back to DuckDB's sort.
#[test]
fn a_base_whose_row_groups_are_out_of_order_is_an_error() -> Result<(), Box<dyn std::error::Error>>
{
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
        interleave_in_batches(
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
    let interleaved =
        interleave_in_batches(&connection, &files, &SORT_KEY, &GROUPS, BATCH_ROWS, &out);
    assert!(
        matches!(&interleaved, Err(TableError::Corrupt(why)) if why.contains("not in the order")),
        "{interleaved:?}"
    );
    assert!(!out.exists(), "a partial base was left");
    Ok(())
}

/// A file every row of which a later one replaced adds nothing, and the interleave goes on.
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
        interleaves_as_duckdb_sorts(&connection, &files, BATCH_ROWS, dir.path())?,
        1_500
    );
    Ok(())
}

/// A base whose columns DuckDB wrote as required (copied from a table that declared them
/// `NOT NULL`, as files of an older format were) interleaves with a delta holding nulls in
/// them.
#[test]
fn files_whose_columns_are_required_in_one_and_not_the_other_interleave()
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
    let rows = interleaves_as_duckdb_sorts(&connection, &files, BATCH_ROWS, dir.path())?;
    assert!(rows > 2_900, "{rows} rows");
    Ok(())
}

/// Files of other columns (a build's before) and deltas without deletion vectors are not
/// for this interleave: it declines them before reading a row, and DuckDB folds them.
#[test]
fn files_it_cannot_interleave_are_declined() -> Result<(), Box<dyn std::error::Error>> {
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
        interleave_newest(&connection, &files, &SORT_KEY, &LAYOUT, &out)?,
        None
    );
    files.base = vec![&new];
    files.deltas = vec![&new];
    files.deletes = None;
    assert_eq!(
        interleave_newest(&connection, &files, &SORT_KEY, &LAYOUT, &out)?,
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
    let interleaved = interleave_newest(&connection, &files, &SORT_KEY, &LAYOUT, &out);
    assert!(
        matches!(&interleaved, Err(TableError::Corrupt(why)) if why.contains("not in the order")),
        "{interleaved:?}"
    );
    assert!(!out.exists(), "a partial base was left");
    // What a fold does with them: DuckDB sorts the rows instead.
    let (folded, index) = crate::compact::fold::base::write_newest_rows(&connection, &files, &out)?;
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
    let interleaved = interleave_newest(&connection, &sorted, &SORT_KEY, &LAYOUT, &nowhere);
    assert!(
        matches!(interleaved, Err(TableError::Write { .. })),
        "{interleaved:?}"
    );
    Ok(())
}
