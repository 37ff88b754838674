use super::super::newest::path_literal;
use super::*;

#[test]
fn completeness_is_read_as_every_other_reader_reads_it() {
    let complete = format!("{} AS complete", super::super::report_times::DEFINED);
    assert!(SOURCE.contains(&complete), "{SOURCE}");
}

/// Values around every power of ten and a spread between.
fn samples() -> Vec<i64> {
    let mut values: Vec<i64> = vec![-7, 0, 1, 42];
    let mut power = 10;
    while power <= 10_000_000_000 {
        values.extend([power - 1, power, power + 1, power * 3 - 1, power * 3 + 1]);
        power *= 10;
    }
    values.extend((0..2_000).map(|i| i * 97 + 3));
    values
}

#[test]
fn rounding_in_rust_is_rounding_in_sql() -> Result<(), Box<dyn std::error::Error>> {
    let connection = crate::tables::open_duckdb()?;
    let values = samples();
    let rows: Vec<String> = values.iter().map(|value| format!("({value})")).collect();
    let sql = format!(
        "SELECT v, {} FROM (VALUES {}) t(v)",
        rounded("v"),
        rows.join(", ")
    );
    let mut statement = connection.prepare(&sql)?;
    let rows = statement.query_map([], |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)))?;
    let mut compared = 0;
    for row in rows {
        let (value, in_sql) = row?;
        assert_eq!(round_up(value), in_sql, "{value}");
        compared += 1;
    }
    assert_eq!(compared, values.len());
    Ok(())
}

#[test]
fn a_rounding_bound_splits_rounded_values_where_the_values_split() {
    let values = samples();
    for at_least in [
        1, 99, 100, 101, 150, 999, 1_000, 1_001, 2_950, 3_000, 12_345,
    ] {
        let bound = rounding_bound(at_least);
        assert!(bound >= at_least, "{at_least} → {bound}");
        // No smaller bound would do: values between at_least and bound share a rounding
        // with values below at_least.
        assert!(
            bound == at_least || round_up(at_least - 1) == round_up(bound - 1),
            "{at_least} → {bound}"
        );
        for &value in &values {
            assert_eq!(
                value >= bound,
                round_up(value) >= round_up(bound),
                "{value} against bound {bound} (at least {at_least})"
            );
        }
    }
}

/// DuckDB's count of a set's rollup rows, every holder of an extreme counted by joining
/// the rows back to their cell (the way [`cells::write`] spares).
fn joined_cells(source: &str) -> String {
    let grouped: Vec<String> = grouping_sets()
        .map(|set| {
            let rows = cell_rows(&set, source);
            let on: Vec<String> = CELL
                .iter()
                .map(|part| format!("s.{part} IS NOT DISTINCT FROM c.{part}"))
                .collect();
            format!(
                "SELECT '{name}' AS grouping, c.*,
                        count_if(s.measure = c.d_min) AS d_min_n,
                        count_if(s.measure = c.d_max) AS d_max_n,
                        count_if(s.creation_time_ms = c.c_min) AS c_min_n,
                        count_if(s.last_ms = c.l_max) AS l_max_n
                 FROM {rows} s JOIN (SELECT {cell}, {aggregates} FROM {rows} GROUP BY ALL) c
                     ON {on}
                 GROUP BY ALL",
                name = set.name,
                cell = CELL.join(", "),
                aggregates = aggregates(&set),
                on = on.join(" AND "),
            )
        })
        .collect();
    grouped.join(" UNION ALL ")
}

/// Asserts that the relations `a` and `b` hold the same rows, each as many times.
fn assert_same_rows(
    connection: &Connection,
    a: &str,
    b: &str,
    what: &str,
) -> Result<(), duckdb::Error> {
    for (left, right) in [(a, b), (b, a)] {
        let extra: i64 = connection.query_row(
            &format!(
                "SELECT count(*) FROM (SELECT * FROM {left} EXCEPT ALL SELECT * FROM {right})"
            ),
            [],
            |row| row.get(0),
        )?;
        assert_eq!(extra, 0, "{what}: rows of {left} not in {right}");
    }
    Ok(())
}

/// Rows with nulls in every nullable column, ties at every extreme, both signs, and
/// failures with messages.
const SYNTHETIC_SOURCE: &str = "CREATE TABLE source AS SELECT
    'task' || (i % 7000) AS task_id,
    CASE WHEN i % 97 = 0 THEN NULL ELSE (i % 3)::INTEGER END AS attempt_number,
    CASE WHEN i % 11 = 0 THEN NULL ELSE 'job' || (i % 4) END AS job_id,
    ['FINISHED', 'FAILED', 'RUNNING'][1 + i % 3] AS state,
    CASE WHEN i % 7 = 0 THEN NULL ELSE ['NORMAL_TASK', 'ACTOR_TASK'][1 + i % 2] END AS type,
    CASE WHEN i % 13 = 0 THEN NULL ELSE 'f' || (i % 6) END AS name,
    CASE WHEN i % 17 = 0 THEN NULL ELSE 'm.f' || (i % 5) END AS func_or_class_name,
    CASE WHEN i % 3 = 1 AND i % 4 <> 0 THEN 'E' || (i % 2) END AS error_type,
    CASE WHEN i % 19 = 0 THEN NULL ELSE 'node' || (i % 5) END AS node_id,
    CASE WHEN i % 23 = 0 THEN NULL ELSE 'worker' || (i % 29) END AS worker_id,
    i % 9 <> 0 AS complete,
    CASE WHEN i % 10 = 0 THEN NULL ELSE (hash(i) % 40) * 37 END::BIGINT AS duration_ms,
    CASE WHEN i % 31 = 0 THEN NULL ELSE 1000 + (hash(i + 1) % 50) END::BIGINT
        AS creation_time_ms,
    CASE WHEN i % 37 = 0 THEN NULL ELSE 5000 + (hash(i + 2) % 60) END::BIGINT AS last_ms,
    CASE WHEN i % 8 = 0 THEN NULL ELSE (hash(i + 3) % 30) * 113 END::BIGINT AS wait_ms,
    CASE WHEN i % 3 = 1 AND i % 4 <> 0 THEN 'fp' || (i % 3) END AS fingerprint,
    CASE WHEN i % 3 = 1 AND i % 4 <> 0 THEN 'message ' || (hash(i + 4) % 9) END
        AS error_message,
    CASE WHEN i % 5 = 0 THEN -1 ELSE 1 END AS sign
FROM range(30000) t(i)";

/// A database whose table `source` holds [`SYNTHETIC_SOURCE`]'s rows.
fn synthetic_source() -> Result<Connection, TableError> {
    let connection = crate::tables::open_duckdb()?;
    connection.execute_batch(SYNTHETIC_SOURCE)?;
    Ok(connection)
}

/// Writes the rollup of `source` to `path` as built ([`cells::write`]). Returns its rows.
fn count_in_rust(connection: &Connection, path: &Path) -> Result<u64, TableError> {
    cells::write(connection, &source_rows(), &[], path, 1)
}

/// The query that streams `source`'s rows to be counted.
fn source_rows() -> String {
    format!("SELECT {} FROM source", cells::select_list())
}

/// Writes the rollup of `source` to `path` as DuckDB's join counts it ([`joined_cells`]).
fn count_joined(connection: &Connection, path: &Path) -> Result<(), duckdb::Error> {
    connection.execute_batch(&format!(
        "COPY ({}) TO {} (FORMAT parquet, COMPRESSION zstd)",
        joined_cells("source"),
        path_literal(path)
    ))
}

#[test]
fn cells_counted_in_rust_are_the_cells_duckdb_counts() -> Result<(), Box<dyn std::error::Error>> {
    // On one thread, and dealt to four whose cells are combined (each counting some rows).
    for threads in [1, 4] {
        let (written, counters) = cells_against_duckdb(threads)?;
        assert_eq!(counters, threads, "threads that counted rows");
        assert!(written > 1_000, "{written} cells");
    }
    Ok(())
}

/// Counts [`SYNTHETIC_SOURCE`] on `threads` threads and compares the rollup with DuckDB's
/// count. Returns the rollup's rows and how many threads counted any.
fn cells_against_duckdb(threads: usize) -> Result<(u64, usize), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let connection = synthetic_source()?;
    let ours = dir.path().join("ours.parquet");
    let (written, counters) = cells::write_on(&connection, &source_rows(), &[], &ours, threads)?;
    let theirs = dir.path().join("theirs.parquet");
    count_joined(&connection, &theirs)?;
    let count = |sql: &str| -> Result<i64, duckdb::Error> {
        connection.query_row(sql, [], |row| row.get::<_, i64>(0))
    };
    let (ours, theirs) = (
        format!("read_parquet({})", path_literal(&ours)),
        format!("read_parquet({})", path_literal(&theirs)),
    );
    let expected = count(&format!("SELECT count(*) FROM {theirs}"))?;
    assert_eq!(written, expected as u64);
    assert_same_rows(&connection, &ours, &theirs, "ours and DuckDB's")?;
    assert_eq!(
        crate::tables::columns(&connection, &ours)?,
        crate::tables::columns(&connection, &theirs)?
    );
    // The synthetic rows reach every case: minus rows, several holders of an extreme,
    // cells with no measure, examples.
    for condition in [
        "sign < 0",
        "d_min_n > 1 AND d_min IS NOT NULL",
        "l_max_n > 1",
        "d_min IS NULL AND n > 0",
        "example IS NOT NULL",
        "group_key IS NULL AND grouping = 'name'",
    ] {
        let rows = count(&format!("SELECT count(*) FROM {ours} WHERE {condition}"))?;
        assert!(rows > 0, "no cell where {condition}");
    }
    Ok((written, counters))
}

/// A delta's rollup adds in the stored rollups of the deltas before it: counting the rows
/// in three parts, each part's rollup adding in the one before, gives the rollup of all the
/// rows counted at once (which equals DuckDB's count, above), minus rows, tied extremes and
/// examples included.
#[test]
fn a_rollup_that_adds_in_earlier_rollups_counts_their_rows_too()
-> Result<(), Box<dyn std::error::Error>> {
    // Adding in splits the sets among the threads: on one thread all of them, on eight
    // one thread two of them.
    for threads in [1, 2, 8] {
        adds_in_earlier_rollups(threads)?;
    }
    Ok(())
}

/// Counts [`SYNTHETIC_SOURCE`] in three parts on `threads` threads, each part adding in
/// the one before, and compares the last with the whole counted at once.
fn adds_in_earlier_rollups(threads: usize) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let connection = synthetic_source()?;
    let whole = dir.path().join("whole.parquet");
    let written = count_in_rust(&connection, &whole)?;
    let mut previous: Vec<PathBuf> = Vec::new();
    let mut parts = Vec::new();
    // Parts that share cells and extremes: rows dealt by `hash`, not in ranges.
    for part in 0..3 {
        let path = dir.path().join(format!("part-{part}.parquet"));
        let query = format!("{} WHERE hash(task_id, sign) % 3 = {part}", source_rows());
        let rows = cells::write(&connection, &query, &previous, &path, threads)?;
        parts.push(rows);
        previous = vec![path];
    }
    let last = previous.first().ok_or("no part written")?;
    let count = |sql: &str| -> Result<i64, duckdb::Error> {
        connection.query_row(sql, [], |row| row.get::<_, i64>(0))
    };
    let (whole, added) = (
        format!("read_parquet({})", path_literal(&whole)),
        format!("read_parquet({})", path_literal(last)),
    );
    assert_same_rows(&connection, &whole, &added, &format!("{threads} threads"))?;
    assert_eq!(parts.last().copied(), Some(written));
    assert!(
        parts.first().is_some_and(|first| *first < written),
        "the first part already held every cell: {parts:?} of {written}"
    );
    // The parts split cells: a cell of the whole counted in more than one part.
    let split = count(&format!(
        "SELECT count(*) FROM read_parquet({}) p JOIN {whole} w
             USING (grouping, group_key, job_id, state, type, complete, error_type, retried,
                    dated, rounded, sign)
         WHERE p.n < w.n",
        path_literal(&dir.path().join("part-0.parquet"))
    ))?;
    assert!(split > 0, "no cell counted in two parts");
    Ok(())
}

#[test]
fn a_rollup_keeps_each_grouping_set_in_row_groups_of_its_own()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let connection = synthetic_source()?;
    let path = dir.path().join("rollup.parquet");
    let written = count_in_rust(&connection, &path)?;
    let file = path_literal(&path);
    // Each row against the one before it: by grouping set, then job (a null job first).
    let out_of_order: i64 = connection.query_row(
        &format!(
            "SELECT count(*) FROM (
                 SELECT grouping, job_id,
                        lag(grouping) OVER (ORDER BY file_row_number) AS previous,
                        lag(job_id) OVER (ORDER BY file_row_number) AS previous_job
                 FROM read_parquet({file}, file_row_number = true))
             WHERE grouping < previous
                OR (grouping = previous AND job_id IS NULL AND previous_job IS NOT NULL)
                OR (grouping = previous AND job_id < previous_job)"
        ),
        [],
        |row| row.get(0),
    )?;
    assert_eq!(out_of_order, 0, "rollup rows out of (grouping, job) order");
    // Row groups small enough that a set's rows are few of them, and the test's file has
    // several: a read of one set then opens only the row groups its rows are in, the
    // others' `grouping` statistics ruling it out.
    let (groups, largest): (u64, u64) = connection.query_row(
        &format!(
            "SELECT count(*), max(row_group_num_rows)
             FROM parquet_metadata({file}) WHERE path_in_schema = 'grouping'"
        ),
        [],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    assert!(
        groups >= 3,
        "{written} rows in {groups} row groups: too few to test"
    );
    assert!(
        largest <= cells::ROW_GROUP_ROWS,
        "a row group of {largest} rows"
    );
    let mut statement = connection.prepare(&format!(
        "SELECT s.grouping, s.n,
                (SELECT count(*) FROM parquet_metadata({file}) m
                 WHERE m.path_in_schema = 'grouping'
                   AND s.grouping BETWEEN m.stats_min_value AND m.stats_max_value)
         FROM (SELECT grouping, count(*) AS n FROM read_parquet({file}) GROUP BY ALL) s"
    ))?;
    let sets = statement.query_map([], |row| {
        Ok((
            row.get::<_, String>(0)?,
            row.get::<_, u64>(1)?,
            row.get::<_, u64>(2)?,
        ))
    })?;
    for set in sets {
        let (name, rows, opened) = set?;
        let needed = rows.div_ceil(cells::ROW_GROUP_ROWS) + 1;
        assert!(
            opened <= needed,
            "{name}: {rows} rows, yet {opened} row groups' statistics admit it"
        );
    }
    Ok(())
}

/// A counter that fails stops the count with its error; the thread handing it batches
/// is not left waiting for it.
#[test]
fn a_failed_count_on_several_threads_is_an_error() -> Result<(), TableError> {
    let dir = tempfile::tempdir().map_err(|err| TableError::Corrupt(err.to_string()))?;
    let connection = synthetic_source()?;
    let without_sign = source_rows().replace("sign", "1 AS signed");
    let failed = cells::write_on(&connection, &without_sign, &[], &dir.path().join("r"), 4);
    assert!(
        matches!(&failed, Err(TableError::Corrupt(reason)) if reason.contains("sign")),
        "{:?}",
        failed.map(|(rows, _)| rows)
    );
    Ok(())
}

/// An earlier rollup that cannot be read fails the count that adds it in, on every
/// thread count, rather than leaving the threads that take every batch waiting.
#[test]
fn an_unreadable_earlier_rollup_is_an_error_whatever_the_threads() -> Result<(), TableError> {
    let dir = tempfile::tempdir().map_err(|err| TableError::Corrupt(err.to_string()))?;
    let connection = synthetic_source()?;
    let damaged = dir.path().join("damaged.parquet");
    std::fs::write(&damaged, b"not a rollup")
        .map_err(|err| TableError::Corrupt(err.to_string()))?;
    // A Parquet file that is not a rollup: a column is missing.
    let other = dir.path().join("other.parquet");
    connection.execute_batch(&format!(
        "COPY (SELECT 1 AS n) TO {} (FORMAT parquet)",
        path_literal(&other)
    ))?;
    for previous in [damaged, other] {
        for threads in [1, 4] {
            let path = dir.path().join("r.parquet");
            let failed = cells::write(
                &connection,
                &source_rows(),
                std::slice::from_ref(&previous),
                &path,
                threads,
            );
            assert!(
                failed.is_err(),
                "{previous:?} on {threads} threads: {failed:?}"
            );
        }
    }
    Ok(())
}

/// A session's versions: 3 000 attempts in a base and three deltas, each delta holding a
/// new version of about two thirds of them. Versions move between states and extremes;
/// every fifth attempt's versions are alike (a replacement that changes nothing); attempts
/// waiting for arguments are in the base alone; a few have no state.
const SYNTHETIC_SESSION: &str = "CREATE TABLE versions AS
    WITH keys AS (SELECT t, f, CASE WHEN t % 5 = 0 THEN 0 ELSE f END AS g
                  FROM range(3000) a(t), range(4) b(f)
                  WHERE f = 0 OR (t % 7 <> 3 AND hash(t, f) % 3 <> 0)),
    hashed AS (SELECT *, (hash(t, g) % 3)::INTEGER AS h FROM keys)
    SELECT f AS file,
        'task' || (t // 2) AS task_id,
        (t % 2)::INTEGER AS attempt_number,
        'job' || (t % 4) AS job_id,
        CASE WHEN t % 41 = 0 THEN NULL WHEN t % 7 = 3 THEN 'PENDING_ARGS_AVAIL'
             ELSE ['RUNNING', 'FINISHED', 'FAILED'][1 + h] END AS state,
        'NORMAL_TASK' AS type,
        'f' || (t % 6) AS name,
        'm.f' || (t % 6) AS func_or_class_name,
        CASE WHEN h = 2 THEN 'E' || (t % 2) END AS error_type,
        'node' || (t % 3) AS node_id,
        'worker' || (t % 11) AS worker_id,
        CASE WHEN t % 13 = 0 THEN NULL ELSE 'f' || (t % 6) END AS def_name,
        CASE WHEN g = 0 AND t % 3 = 0 THEN NULL ELSE (hash(t, g, 1) % 20) * 7 END::BIGINT
            AS duration_ms,
        (1000 + t % 50 + g)::BIGINT AS creation_time_ms,
        (1100 + hash(t, g, 2) % 40)::BIGINT AS start_time_ms,
        CASE WHEN g = 0 THEN NULL ELSE 2000 + hash(t, g, 3) % 30 END::BIGINT AS end_time_ms,
        CASE WHEN h = 2 THEN 'message ' || (hash(t, g, 4) % 4) END
            AS error_message
    FROM hashed";

/// Writes [`SYNTHETIC_SESSION`]'s base and deltas into `dir` with their rollups, as
/// compaction does: delta 1 counts itself, delta 2 adds in delta 1's rollup, delta 3
/// counts itself. Returns the new base a fold writes (the newest versions) and the
/// rollups that add up to the session ([`crate::tables::manifest::TableFiles::rollups`]).
fn synthetic_session(
    connection: &Connection,
    dir: &Path,
) -> Result<(PathBuf, Vec<PathBuf>), Box<dyn std::error::Error>> {
    connection.execute_batch(SYNTHETIC_SESSION)?;
    let columns = "task_id, attempt_number, job_id, state, type, name, func_or_class_name, \
         error_type, node_id, worker_id, def_name, duration_ms, creation_time_ms, \
         start_time_ms, end_time_ms, error_message";
    let files: Vec<PathBuf> = (0..4)
        .map(|file| dir.join(format!("file-{file}.parquet")))
        .collect();
    connection.execute_batch(
        "CREATE TABLE stored (file INTEGER, task_id VARCHAR, attempt_number INTEGER, row BIGINT)",
    )?;
    for (number, path) in files.iter().enumerate() {
        connection.execute_batch(&format!(
            "COPY (SELECT {columns} FROM versions WHERE file = {number}
                   ORDER BY task_id, attempt_number) TO {path} (FORMAT parquet);
             INSERT INTO stored SELECT {number}, task_id, attempt_number, file_row_number
                 FROM read_parquet({path}, file_row_number = true);",
            path = path_literal(path),
        ))?;
    }
    let mut rollups = Vec::new();
    for (number, path) in files.iter().enumerate() {
        // The stored versions this file's rows replace: each key's newest before it.
        let mut superseded = RowsByFile::new();
        for (earlier, earlier_path) in files.iter().enumerate().take(number) {
            let mut statement = connection.prepare(&format!(
                "SELECT s.row FROM stored s JOIN stored n USING (task_id, attempt_number)
                 WHERE n.file = {number} AND s.file = {earlier}
                   AND NOT EXISTS (SELECT 1 FROM stored b
                       WHERE b.task_id = s.task_id AND b.attempt_number = s.attempt_number
                         AND b.file > {earlier} AND b.file < {number})
                 ORDER BY s.row"
            ))?;
            let rows = statement
                .query_map([], |row| row.get::<_, i64>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            if !rows.is_empty() {
                superseded.push((earlier_path.clone(), rows));
            }
        }
        let previous: Vec<PathBuf> = if number == 2 {
            rollups.pop().into_iter().collect()
        } else {
            Vec::new()
        };
        let rollup = dir.join(format!("rollup-{number}.parquet"));
        write_rollup(connection, path, &superseded, &previous, &rollup)?;
        rollups.push(rollup);
    }
    let base = dir.join("new-base.parquet");
    connection.execute_batch(&format!(
        "COPY (SELECT {columns} FROM versions v
               WHERE file = (SELECT max(file) FROM versions w
                   WHERE w.task_id = v.task_id AND w.attempt_number = v.attempt_number)
               ORDER BY job_id, creation_time_ms) TO {} (FORMAT parquet)",
        path_literal(&base)
    ))?;
    Ok((base, rollups))
}

/// A fold's rollup summed from the rollups of the files it replaces is row for row the
/// rollup counted from its new base: minus cells taken out, extremes held only by
/// superseded versions counted again by state, the other states' cells summed.
#[test]
fn a_folds_rollup_summed_from_the_rollups_it_replaces_is_the_one_counted()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let connection = crate::tables::open_duckdb()?;
    let (base, rollups) = synthetic_session(&connection, dir.path())?;
    assert_eq!(rollups.len(), 3, "base, deltas 1-2 and delta 3");
    let counted = dir.path().join("counted.parquet");
    let rows = write_rollup(&connection, &base, &RowsByFile::new(), &[], &counted)?;
    let count = |sql: &str| -> Result<i64, duckdb::Error> {
        connection.query_row(sql, [], |row| row.get::<_, i64>(0))
    };
    let minus = count(&format!(
        "SELECT count(*) FROM read_parquet([{}]) WHERE sign = -1",
        rollups
            .iter()
            .map(|path| path_literal(path))
            .collect::<Vec<_>>()
            .join(", ")
    ))?;
    assert!(minus > 100, "{minus} minus rows: too few to test");
    for threads in [1, 2, 8] {
        let path = dir.path().join(format!("summed-{threads}.parquet"));
        let summed = summed_on(&connection, &base, &rollups, &path, threads)?;
        assert_eq!(summed.rows, rows, "{threads} threads");
        let (counted, summed_rows) = (
            format!("read_parquet({})", path_literal(&counted)),
            format!("read_parquet({})", path_literal(&path)),
        );
        let what = format!("{threads} threads");
        assert_same_rows(&connection, &counted, &summed_rows, &what)?;
        // Both ways were taken: some slices counted again (of a null state too), and the
        // waiting attempts, never superseded, summed.
        let recounted = |state: Option<&str>| {
            summed
                .recounted
                .iter()
                .any(|slice| slice.state.as_deref() == state)
        };
        assert!(
            recounted(None) && summed.recounted.len() >= 2,
            "{threads} threads: {:?}",
            summed.recounted
        );
        assert!(
            !recounted(Some("PENDING_ARGS_AVAIL")),
            "{threads} threads: {:?}",
            summed.recounted
        );
        let waiting = count(&format!(
            "SELECT count(*) FROM {summed_rows} WHERE state = 'PENDING_ARGS_AVAIL'"
        ))?;
        assert!(waiting > 0, "{threads} threads: no waiting attempts' cells");
    }
    Ok(())
}

/// Rollups that do not add up to the session (the base's left out: its versions' minus
/// rows have nothing to be taken from), or add up to other rows than the new base's, are
/// an error, for the fold to count instead.
#[test]
fn rollups_that_do_not_add_up_are_not_summed() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let connection = crate::tables::open_duckdb()?;
    let (base, rollups) = synthetic_session(&connection, dir.path())?;
    let deltas = rollups.get(1..).ok_or("no deltas")?;
    let path = dir.path().join("summed.parquet");
    let summed = summed_on(&connection, &base, deltas, &path, 2);
    assert!(
        matches!(&summed, Err(TableError::Corrupt(reason)) if reason.contains("never counted")),
        "{summed:?}"
    );
    // Rollups that add up, but to other rows than the base's (the old base's here): the
    // netting finds nothing wrong, the rows by slice do.
    let old_base = dir.path().join("file-0.parquet");
    let summed = summed_on(&connection, &old_base, &rollups, &path, 2);
    assert!(
        matches!(&summed, Err(TableError::Corrupt(reason))
            if reason.contains("state and completeness")),
        "{summed:?}"
    );
    Ok(())
}

/// A file with no rows (a fold of nothing) still gets a rollup: empty, with the columns
/// DuckDB's own count writes, so that readers take its files and the older ones alike.
#[test]
fn an_empty_source_counts_into_an_empty_rollup_of_the_same_columns()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let connection = synthetic_source()?;
    connection.execute_batch("DELETE FROM source")?;
    let ours = dir.path().join("ours.parquet");
    let written = count_in_rust(&connection, &ours)?;
    assert_eq!(written, 0);
    let theirs = dir.path().join("theirs.parquet");
    count_joined(&connection, &theirs)?;
    let describe = |file: &Path| {
        crate::tables::columns(
            &connection,
            &format!("read_parquet({})", path_literal(file)),
        )
    };
    assert_eq!(describe(&ours)?, describe(&theirs)?);
    Ok(())
}

/// A cluster's rollup summed from its sessions' rollups is, grouping for grouping, the rollup
/// of all their rows counted at once, whether summed in one step or added to an earlier sum; it
/// keeps [`CLUSTER_GROUPINGS`] alone.
#[test]
fn a_clusters_rollup_is_its_sessions_rows_counted_at_once() -> Result<(), Box<dyn std::error::Error>>
{
    let dir = tempfile::tempdir()?;
    let connection = synthetic_source()?;
    // Each session's rollup as a fold leaves it: newest versions only.
    connection.execute_batch("DELETE FROM source WHERE sign = -1")?;
    let session = |part: u64| -> Result<PathBuf, TableError> {
        let path = dir.path().join(format!("session-{part}.parquet"));
        let rows = format!(
            "SELECT {} FROM source WHERE hash(task_id) % 3 = {part}",
            cells::select_list()
        );
        cells::write(&connection, &rows, &[], &path, 2)?;
        Ok(path)
    };
    let sessions = [session(0)?, session(1)?, session(2)?];
    let whole = dir.path().join("whole.parquet");
    count_in_rust(&connection, &whole)?;
    let summed = dir.path().join("summed.parquet");
    let rows = write_cluster_sum(&connection, &sessions, &summed)?;
    let earlier = dir.path().join("earlier.parquet");
    write_cluster_sum(&connection, &sessions[..2], &earlier)?;
    let stepwise = dir.path().join("stepwise.parquet");
    write_cluster_sum(&connection, &[earlier, sessions[2].clone()], &stepwise)?;

    let kept: Vec<String> = CLUSTER_GROUPINGS
        .iter()
        .map(|grouping| format!("'{grouping}'"))
        .collect();
    let whole = format!(
        "(SELECT * FROM read_parquet({}) WHERE grouping IN ({}))",
        path_literal(&whole),
        kept.join(", ")
    );
    let expected: i64 =
        connection.query_row(&format!("SELECT count(*) FROM {whole}"), [], |row| {
            row.get(0)
        })?;
    assert_eq!(rows, expected as u64);
    assert!(rows > 1_000, "{rows} cells");
    for (path, what) in [(&summed, "in one step"), (&stepwise, "added to a sum")] {
        let sum = format!("read_parquet({})", path_literal(path));
        assert_same_rows(&connection, &whole, &sum, what)?;
    }
    Ok(())
}

/// A session whose rollups hold an extreme only a superseded version held cannot be summed
/// into its cluster's rollup: the sum could not tell that cell's extreme.
#[test]
fn rollups_with_an_extreme_they_cannot_tell_are_not_summed_for_a_cluster()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let connection = crate::tables::open_duckdb()?;
    let (_, rollups) = synthetic_session(&connection, dir.path())?;
    let path = dir.path().join("cluster.parquet");
    let summed = write_cluster_sum(&connection, &rollups, &path);
    assert!(
        matches!(&summed, Err(TableError::Corrupt(reason)) if reason.contains("superseded")),
        "{summed:?}"
    );
    Ok(())
}
