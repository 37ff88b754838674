//! Task lookups: through the key indexes of the files that hold a task (reading only the blocks
//! they name, and over remote storage only the files they name), and from rows held in memory
//! for a small session; each answers what a scan answers, in every scope, for Ray's route for
//! one task too. The engine's counts prove which path ran.

use std::sync::Arc;
use std::time::{Duration, Instant};

use afterglow_tests::faults::RecordsRequests;
use afterglow_tests::folding_past;
use afterglow_tests::scenario::Scenario;
use anyhow::{Context as _, ensure};
use serde_json::Value as Json;
use shared::storage::Storage;

/// A task lookup reads only the blocks its key indexes name and answers what a scan answers:
/// over two sessions of synthetic traffic with failures, retries and re-delivered bodies,
/// compacted into a base and deltas, for tasks whose attempts are stored in several of those
/// files (some in different states: only the newest file's version is the task's), for tasks
/// stored once, and for an id nobody has. The engine's count of indexed lookups proves which
/// path ran. With every data file rewritten in a form the parquet crate cannot read, the
/// lookups scan and answer the same; with the indexes gone from the manifests (as an earlier
/// build wrote them) too.
#[tokio::test]
async fn a_lookup_through_key_indexes_equals_a_lookup_by_scan() -> anyhow::Result<()> {
    use shared::query::{ApiRoute, QueryEngine, QueryError, QuerySettings};

    let scenario = Scenario::local()?
        .with_failing_sessions("indexed", [21, 22], 5_000, 2)
        .await?;
    let (storage, dir) = (scenario.storage(), scenario.dir()?);
    let (_compactor, _scratch, _) = in_base_and_deltas(&scenario, 0).await?;

    let LookupCases {
        ids,
        session,
        recent,
    } = lookup_cases(&storage, &dir.join("cache")).await?;

    // Rows held in memory would answer repeated lookups without the key indexes.
    let engine = scenario.engine_with("query", |settings| QuerySettings {
        resident_bytes: 0,
        ..settings
    })?;
    let lookup = |id: &str| {
        let route = ApiRoute::Task(id.to_owned());
        let engine = &engine;
        async move { engine.answer(&route, &[]).await }
    };
    // And in a scope that keeps some of the tasks: one of the two sessions.
    let scoped_params = [("session".to_owned(), session.clone())];
    let scoped = |id: &str| {
        let route = ApiRoute::Task(id.to_owned());
        let (engine, params) = (&engine, &scoped_params);
        async move {
            match engine.answer(&route, params).await {
                Ok(answer) => Ok(Some(answer)),
                Err(QueryError::NotFound(_)) => Ok(None),
                Err(err) => Err(err),
            }
        }
    };
    let mut indexed = Vec::new();
    let mut indexed_in_scope = Vec::new();
    for id in &ids {
        indexed.push(lookup(id).await?);
        indexed_in_scope.push(scoped(id).await?);
    }
    let kept = indexed_in_scope
        .iter()
        .filter(|answer| answer.is_some())
        .count();
    ensure!(
        kept > 0 && kept < ids.len(),
        "the scope kept {kept} of {} tasks: it tells nothing",
        ids.len()
    );
    let nobody = "0123456789abcdef0123456789abcdef0123456789abcdef";
    ensure!(matches!(lookup(nobody).await, Err(QueryError::NotFound(_))));
    ensure!(
        engine.key_index_lookups() == 2 * ids.len() as u64 + 1,
        "{} of {} lookups read through key indexes",
        engine.key_index_lookups(),
        2 * ids.len() + 1
    );

    // Over storage that is not a local directory (as on Lambda, where files are downloaded
    // into the cache), a lookup of a task only deltas hold fetches its key indexes and the
    // deltas named, never the base.
    let recorded = Arc::new(RecordsRequests::new(Arc::clone(&storage)));
    // (A small session's files are all downloaded after a lookup, to be held in memory.)
    let remote = QueryEngine::open(
        Arc::clone(&recorded) as Arc<dyn Storage>,
        QuerySettings {
            resident_bytes: 0,
            ..QuerySettings::under(&dir.join("remote-query"))
        },
    )?;
    let answer = remote.answer(&ApiRoute::Task(recent.clone()), &[]).await?;
    ensure!(answer == lookup(&recent).await?, "{recent}: {answer}");
    let fetched = recorded.gets();
    ensure!(
        fetched.iter().any(|key| key.contains("/keys-"))
            && fetched.iter().any(|key| key.contains("/delta-")),
        "{fetched:?}"
    );
    ensure!(
        !fetched.iter().any(|key| key.contains("/base-")),
        "a lookup of a task only deltas hold downloaded the base: {fetched:?}"
    );

    // A block the parquet crate cannot read sends the lookup to the scan: every data file
    // rewritten by DuckDB, rows in the same order, with snappy pages (a codec this build's
    // crate does not decode), answers as before.
    // (Read as the engine reads them: without the hive columns the folders' names would add.)
    use shared::tables::newest::{path_literal, read_parquet};
    let connection = shared::tables::open_duckdb()?;
    let data_files: Vec<std::path::PathBuf> = connection
        .prepare(&format!(
            "SELECT file FROM glob({})
             WHERE regexp_matches(file, '/(base|delta)-[^/]*$')",
            path_literal(&dir.join("data/tables/task_attempts/*/*/*.parquet"))
        ))?
        .query_map([], |row| row.get::<_, String>(0))?
        .map(|file| file.map(std::path::PathBuf::from))
        .collect::<Result<_, _>>()?;
    ensure!(data_files.len() > 2, "{data_files:?}");
    for file in &data_files {
        let snappy = file.with_extension("snappy");
        connection.execute_batch(&format!(
            "COPY (SELECT * FROM {}) TO {} (FORMAT parquet, COMPRESSION snappy)",
            read_parquet(&[file.as_path()], ""),
            path_literal(&snappy)
        ))?;
        std::fs::rename(&snappy, file)?;
    }
    let unreadable = shared::tables::task_block::task_rows(
        &shared::tables::task_block::Footers::default(),
        &data_files[0],
        (0, u64::MAX),
        &ids[0],
    );
    ensure!(
        unreadable.is_err(),
        "the crate reads the rewritten files: the fallback is not reached"
    );
    let before = engine.key_index_lookups();
    for (id, by_index) in ids.iter().zip(&indexed) {
        let by_scan = lookup(id).await?;
        ensure!(
            &by_scan == by_index,
            "{id}: the lookup of unreadable blocks differs:\n{by_index}\n{by_scan}"
        );
    }
    ensure!(engine.key_index_lookups() - before == ids.len() as u64);

    scenario
        .rewrite_attempt_files(|file| file.key_index = None)
        .await?;
    let before = engine.key_index_lookups();
    for ((id, by_index), in_scope) in ids.iter().zip(&indexed).zip(&indexed_in_scope) {
        let by_scan = lookup(id).await?;
        ensure!(
            &by_scan == by_index,
            "{id}: the lookup through key indexes differs from the scan:\n{by_index}\n{by_scan}"
        );
        let by_scan = scoped(id).await?;
        ensure!(
            &by_scan == in_scope,
            "{id} in {session}: the lookup through key indexes differs from the scan:\n\
             {in_scope:?}\n{by_scan:?}"
        );
    }
    ensure!(matches!(lookup(nobody).await, Err(QueryError::NotFound(_))));
    ensure!(
        engine.key_index_lookups() == before,
        "a lookup used a key index it no longer has"
    );
    Ok(())
}

/// Compacts the raw objects of `scenario`: half of them folded into a base, the rest in deltas
/// of three objects each over it, but for the last `held_back`, which are returned with the
/// compactor.
async fn in_base_and_deltas(
    scenario: &Scenario,
    held_back: usize,
) -> anyhow::Result<(
    shared::compact::Compactor,
    tempfile::TempDir,
    Vec<shared::storage::ObjectKey>,
)> {
    let (compactor, scratch) = scenario.compactor(folding_past(100))?;
    let mut keys = compactor.raw_keys().await?;
    let later = keys.split_off(keys.len().saturating_sub(held_back));
    let (first, rest) = keys.split_at(keys.len() / 2);
    for batch in first.chunks(3) {
        compactor.compact(batch).await?;
    }
    ensure!(compactor.fold().await? > 0, "nothing folded");
    for batch in rest.chunks(3) {
        compactor.compact(batch).await?;
    }
    Ok((compactor, scratch, later))
}

/// A lookup in a small session answers from the rows held in memory after a lookup read its
/// files (loaded in the background), with no DuckDB query, and answers what a lookup through
/// the files does: for the tasks of [`LookupCases`], in every session and in one. When the
/// session moves on, a lookup reads the new delta from disk and the files held from memory,
/// still the same answers, until the delta is held too. With too little memory for the
/// session, nothing is held and the lookups read files. The engine's counts prove which path
/// ran.
#[tokio::test]
async fn a_lookup_from_rows_held_in_memory_equals_one_from_files() -> anyhow::Result<()> {
    use shared::query::QuerySettings;

    let scenario = Scenario::local()?
        .with_failing_sessions("held", [31, 32], 2_000, 2)
        .await?;
    let storage = scenario.storage();
    let (compactor, _scratch, later) = in_base_and_deltas(&scenario, 3).await?;
    ensure!(later.len() == 3);
    let LookupCases { ids, session, .. } =
        lookup_cases(&storage, &scenario.dir()?.join("cache")).await?;
    let engine = |name: &str, resident_bytes: u64| {
        scenario.engine_with(name, |settings| QuerySettings {
            resident_bytes,
            ..settings
        })
    };
    let from_files = engine("from-files", 0)?;
    let held = engine("held", 128 << 20)?;
    let starved = engine("starved", 4096)?;
    let scopes = [Vec::new(), vec![("session".to_owned(), session)]];
    let nobody = "0123456789abcdef0123456789abcdef0123456789abcdef";

    // Loaded after a lookup read the files.
    looked_up(&held, &ids[0], &[]).await?;
    let files = held_all_files(&storage, &held).await?;
    ensure!(files > 2, "{files} files: the test reaches no delta");
    let (_, bytes) = held.resident_held();
    let rows: u64 = shared::query::read::snapshot::manifests(&storage, &Default::default())
        .await?
        .iter()
        .flat_map(|session| session.manifest.task_attempts.all().map(|file| file.rows))
        .sum();
    println!("{files} files of {rows} rows held in {bytes} bytes");
    let (indexed, reads) = (held.key_index_lookups(), held.resident_reads());
    let mut lookups = 0;
    for id in ids.iter().map(String::as_str).chain([nobody]) {
        for params in &scopes {
            let expected = looked_up(&from_files, id, params).await?;
            ensure!(
                looked_up(&held, id, params).await? == expected,
                "{id} {params:?}: held rows answer differently"
            );
            ensure!(looked_up(&starved, id, params).await? == expected);
            lookups += 1;
        }
    }
    ensure!(
        held.key_index_lookups() == indexed,
        "a lookup ran DuckDB though every file was held"
    );

    ensure!(
        held.resident_reads() - reads >= lookups,
        "a lookup read no file from memory"
    );
    // Ray's route for one task id (its dashboard's task page, `ray get tasks`) answers from the
    // same lookup, and as its scan of the session does: reached with one more filter that
    // every attempt passes.
    let (cluster_of_session, session_name) = {
        let manifests = shared::query::read::snapshot::manifests(
            &storage,
            &shared::query::read::params::Scope::default(),
        )
        .await?;
        let first = manifests.first().context("a session")?;
        (first.cluster.clone(), first.session.clone())
    };
    let request = shared::query::ray::RayRequest::parse(
        "GET",
        &format!("{cluster_of_session}/{session_name}/api/v0/tasks"),
    )?;
    let pair = |key: &str, value: &str| (key.to_owned(), value.to_owned());
    let (indexed, reads) = (held.key_index_lookups(), held.resident_reads());
    for (at, id) in ids.iter().enumerate() {
        // Ray's dashboard asks with detail; `ray get tasks` without, drivers shown.
        let mut asked = vec![
            pair("filter_keys", "task_id"),
            pair("filter_predicates", "="),
            pair("filter_values", &id.to_uppercase()),
        ];
        if at % 2 == 0 {
            asked.push(pair("detail", "1"));
        } else {
            asked.push(pair("exclude_driver", "false"));
        }
        let mut scanned = asked.clone();
        scanned.extend([
            pair("filter_keys", "attempt_number"),
            pair("filter_predicates", "!="),
            pair("filter_values", "-1"),
        ]);
        let expected = ray_list(&from_files, &request, &scanned).await?;
        ensure!(
            ray_list(&from_files, &request, &asked).await? == expected,
            "{id}: Ray's route through key indexes answers differently from its scan"
        );
        ensure!(
            ray_list(&held, &request, &asked).await? == expected,
            "{id}: Ray's route from held rows answers differently from its scan:\n{expected}"
        );
    }
    ensure!(
        held.key_index_lookups() == indexed && held.resident_reads() > reads,
        "Ray's route for one task did not answer from held rows"
    );
    ensure!(starved.resident_held() == (0, 0) && starved.resident_reads() == 0);

    // The session moves on: one more delta, not held yet.
    compactor.compact(&later).await?;
    let (indexed, reads) = (held.key_index_lookups(), held.resident_reads());
    for id in &ids {
        ensure!(
            looked_up(&held, id, &[]).await? == looked_up(&from_files, id, &[]).await?,
            "{id}: a lookup from held rows and a new delta answers differently"
        );
    }
    ensure!(
        held.key_index_lookups() > indexed && held.resident_reads() > reads,
        "no lookup after the new delta read it from disk and the rest from memory"
    );
    let files_now = held_all_files(&storage, &held).await?;
    ensure!(
        files_now > files,
        "the new delta was folded away: {files_now} files"
    );
    let indexed = held.key_index_lookups();
    for id in &ids {
        ensure!(looked_up(&held, id, &[]).await? == looked_up(&from_files, id, &[]).await?);
    }
    ensure!(held.key_index_lookups() == indexed);
    Ok(())
}

/// `engine`'s answer to the Ray route `request` with `pairs`, as JSON.
async fn ray_list(
    engine: &shared::query::QueryEngine,
    request: &shared::query::ray::RayRequest,
    pairs: &[(String, String)],
) -> anyhow::Result<Json> {
    let body = engine.answer_ray(request, pairs).await?;
    Ok(serde_json::from_slice(body.as_bytes())?)
}

/// The answer of `engine` to a lookup of task `id` with `params`; `None` for a task it does
/// not find.
async fn looked_up(
    engine: &shared::query::QueryEngine,
    id: &str,
    params: &[(String, String)],
) -> Result<Option<Json>, shared::query::QueryError> {
    match engine
        .answer(&shared::query::ApiRoute::Task(id.to_owned()), params)
        .await
    {
        Ok(answer) => Ok(Some(answer)),
        Err(shared::query::QueryError::NotFound(_)) => Ok(None),
        Err(err) => Err(err),
    }
}

/// Waits until `engine` holds in memory as many files as the manifests in `storage` name (its
/// loads run in the background), and returns that number.
async fn held_all_files(
    storage: &Arc<dyn Storage>,
    engine: &shared::query::QueryEngine,
) -> anyhow::Result<usize> {
    let manifests = shared::query::read::snapshot::manifests(
        storage,
        &shared::query::read::params::Scope::default(),
    )
    .await?;
    let files: usize = manifests
        .iter()
        .map(|session| session.manifest.task_attempts.all().count())
        .sum();
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine.resident_held().0 < files {
        ensure!(Instant::now() < deadline, "{files} files were never held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(files)
}

/// Tasks to look up in a store of [`ingest_failing_sessions`] compacted into a base and
/// deltas, as a lookup test needs them.
struct LookupCases {
    /// Tasks stored in several files (those in different states first), tasks stored once,
    /// and tasks with more than one attempt.
    ids: Vec<String>,
    /// The first session's name: a scope that keeps some of the tasks.
    session: String,
    /// A task only deltas hold.
    recent: String,
}

/// Finds [`LookupCases`] by reading every stored file of `storage` (cached under `cache_dir`).
async fn lookup_cases(
    storage: &Arc<dyn Storage>,
    cache_dir: &std::path::Path,
) -> anyhow::Result<LookupCases> {
    use shared::query::read::params::Scope;
    use shared::query::read::snapshot::{Needs, snapshot};
    use shared::query::read::sql::read_parquet;
    use shared::storage::FileCache;

    let cache = FileCache::new(Arc::clone(storage), cache_dir.to_owned(), 4);
    let needs = Needs {
        attempts: true,
        key_indexes: true,
        ..Needs::default()
    };
    let stored = snapshot(storage, &cache, &Scope::default(), needs, u64::MAX).await?;
    ensure!(
        stored.key_indexes.is_some(),
        "every base and delta was written with its key index"
    );
    ensure!(!stored.task_attempts.base.is_empty() && !stored.task_attempts.deltas.is_empty());
    // Tasks by how many files hold a version of them, and how many states those versions show.
    let files = stored.task_attempts.files();
    let all: Vec<&std::path::Path> = files.base.iter().chain(&files.deltas).copied().collect();
    let connection = shared::tables::open_duckdb()?;
    let sql = format!(
        "SELECT task_id, count(DISTINCT file_index) AS files, count(DISTINCT state) AS states
         FROM {} GROUP BY task_id ORDER BY files DESC, states DESC, task_id LIMIT 300",
        read_parquet(&all, ", file_row_number = true")
    );
    let mut statement = connection.prepare(&sql)?;
    let tasks: Vec<(String, i64, i64)> = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
        .collect::<Result<_, _>>()?;
    ensure!(
        tasks
            .iter()
            .any(|(_, files, states)| *files > 1 && *states > 1),
        "no task is stored in several files in different states: the test reaches nothing"
    );
    let sql = format!(
        "SELECT task_id FROM {} GROUP BY task_id HAVING count(*) = 1 ORDER BY task_id LIMIT 100",
        read_parquet(&all, "")
    );
    let mut statement = connection.prepare(&sql)?;
    let once: Vec<String> = statement
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    ensure!(!once.is_empty());
    let sql = format!(
        "SELECT task_id FROM {} GROUP BY task_id HAVING count(DISTINCT attempt_number) > 1
         ORDER BY task_id LIMIT 50",
        read_parquet(&all, "")
    );
    let mut statement = connection.prepare(&sql)?;
    let retried: Vec<String> = statement
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    ensure!(!retried.is_empty(), "no task was retried");
    let ids: Vec<String> = tasks
        .into_iter()
        .map(|(id, _, _)| id)
        .chain(once)
        .chain(retried)
        .collect();
    let session: String = connection.query_row(
        &format!("SELECT min(session_name) FROM {}", read_parquet(&all, "")),
        [],
        |row| row.get(0),
    )?;
    let sql = format!(
        "SELECT task_id FROM {} GROUP BY task_id HAVING min(file_index) >= {} ORDER BY task_id
         LIMIT 1",
        read_parquet(&all, ", file_row_number = true"),
        files.base.len()
    );
    let recent: String = connection.query_row(&sql, [], |row| row.get(0))?;
    Ok(LookupCases {
        ids,
        session,
        recent,
    })
}
