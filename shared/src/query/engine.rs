//! The engine every route runs on: its settings, the process's one DuckDB database (a
//! connection per request), the file cache, the rows held in memory for task lookups, the
//! deadline each query runs under, and the counters that tell tests and `bench` which read path
//! answered.
//!
//! It knows no route: the routes (see [`super`]) borrow it to take a snapshot, run SQL and
//! count what they did.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::QueryError;
use super::read::{page, params, resident, snapshot, sql};
use crate::config::GrafanaUrl;
use crate::storage::{FileCache, Storage};

/// How the query engine runs.
#[derive(Clone, Debug)]
pub struct QuerySettings {
    /// Where fetched Parquet files are kept (`/tmp/...` on Lambda).
    pub cache_dir: PathBuf,
    /// DuckDB's spill directory and home.
    pub temp_dir: PathBuf,
    /// DuckDB's memory limit in MiB; `None` keeps DuckDB's default (80% of RAM).
    pub memory_limit_mib: Option<u64>,
    /// DuckDB worker threads; `None` keeps DuckDB's default (one per core).
    pub threads: Option<usize>,
    /// Longest a query may run before it is interrupted.
    pub timeout: Duration,
    /// Files fetched at once.
    pub fetch_parallelism: usize,
    /// Most bytes of rows in one answer of Ray's routes, which have no pages: Lambda refuses a
    /// response over 6 MB (carried as an escaped JSON string), a local server has no such limit.
    pub response_bytes: usize,
    /// Most bytes of fetched table files kept in `cache_dir` (the least recently used go
    /// first); `None`: no limit.
    pub cache_bytes: Option<u64>,
    /// Most bytes of small sessions' rows kept in memory for task lookups (see
    /// [`resident`]); 0: none.
    pub resident_bytes: u64,
    /// Most bytes of table files one request may copy from storage: a wider scope is refused
    /// with a 400 naming narrower filters, before anything is copied, rather than filling the
    /// disk or outlasting the deadline. A local store's files are read in place and count
    /// nothing.
    pub copy_budget_bytes: u64,
    /// The Grafana dashboard of the clusters' metrics: the page links node and worker ids to it,
    /// and Ray's dashboard opens it over a session's time range; `None`: metrics are not shown.
    pub grafana_url: Option<GrafanaUrl>,
}

/// The default of [`QuerySettings::copy_budget_bytes`].
pub const COPY_BUDGET_BYTES: u64 = 64 << 20;

impl QuerySettings {
    /// Settings with everything under `dir`, DuckDB's own defaults, and a 25 s deadline (API
    /// Gateway gives up at 30 s).
    pub fn under(dir: &std::path::Path) -> Self {
        Self {
            cache_dir: dir.join("cache"),
            temp_dir: dir.join("duckdb"),
            memory_limit_mib: None,
            threads: None,
            timeout: Duration::from_secs(25),
            fetch_parallelism: 16,
            response_bytes: 512 * 1024 * 1024,
            cache_bytes: None,
            resident_bytes: 128 * 1024 * 1024,
            copy_budget_bytes: COPY_BUDGET_BYTES,
            grafana_url: None,
        }
    }

    /// Sized for a Lambda function with `memory_mib` of memory: DuckDB gets 60% of it (the
    /// rest is the runtime, response building and the page cache of `/tmp`), and one thread
    /// per vCPU Lambda allots (one per 1769 MiB, at least one).
    pub fn for_lambda(dir: &std::path::Path, memory_mib: u64) -> Self {
        let vcpus = usize::try_from(memory_mib.div_ceil(1769))
            .unwrap_or(1)
            .max(1);
        Self {
            memory_limit_mib: Some(memory_mib * 6 / 10),
            threads: Some(vcpus),
            response_bytes: page::PAGE_BYTES,
            ..Self::under(dir)
        }
    }
}

/// Answers dashboard API requests over one store.
#[derive(Debug)]
pub struct QueryEngine {
    storage: Arc<dyn Storage>,
    cache: FileCache,
    /// The first connection of the process's one in-memory database; each request uses a
    /// clone, so Parquet metadata cached by DuckDB is shared across requests.
    database: Mutex<duckdb::Connection>,
    pub(super) settings: QuerySettings,
    /// Requests answered from rollups (see [`Self::rollup_answers`]).
    rollup_answers: AtomicU64,
    /// Pages read again with more rows (see [`Self::page_retakes`]).
    page_retakes: AtomicU64,
    /// Task lookups read through key indexes (see [`Self::key_index_lookups`]).
    key_index_lookups: AtomicU64,
    /// Rows of small sessions' files held for task lookups.
    pub(super) resident: Arc<resident::ResidentRows>,
    /// Files task lookups read from memory (see [`Self::resident_reads`]).
    resident_reads: AtomicU64,
    /// Footers of the files task lookups read with the parquet crate.
    pub(super) footers: Arc<crate::tables::task_block::Footers>,
    /// Bytes of table files copied into the cache (see [`Self::copied_bytes`]).
    copied_bytes: AtomicU64,
}

impl QueryEngine {
    /// An engine reading `storage`, with DuckDB configured by `settings`.
    pub fn open(storage: Arc<dyn Storage>, settings: QuerySettings) -> Result<Self, QueryError> {
        for dir in [&settings.cache_dir, &settings.temp_dir] {
            std::fs::create_dir_all(dir).map_err(|err| {
                QueryError::Internal(format!("cannot create {}: {err}", dir.display()))
            })?;
        }
        let connection =
            crate::tables::open_duckdb().map_err(|err| QueryError::Internal(err.to_string()))?;
        let mut setup = vec![
            "SET autoinstall_known_extensions = false".to_owned(),
            format!(
                "SET temp_directory = {}",
                sql::path_literal(&settings.temp_dir)
            ),
            format!(
                "SET home_directory = {}",
                sql::path_literal(&settings.temp_dir)
            ),
        ];
        if let Some(memory) = settings.memory_limit_mib {
            setup.push(format!("SET memory_limit = '{memory}MiB'"));
        }
        if let Some(threads) = settings.threads {
            setup.push(format!("SET threads = {threads}"));
        }
        for statement in setup {
            connection.execute_batch(&statement)?;
        }
        let cache = FileCache::bounded(
            Arc::clone(&storage),
            settings.cache_dir.clone(),
            settings.fetch_parallelism,
            settings.cache_bytes,
        );
        Ok(Self {
            storage,
            cache,
            database: Mutex::new(connection),
            rollup_answers: AtomicU64::new(0),
            page_retakes: AtomicU64::new(0),
            key_index_lookups: AtomicU64::new(0),
            resident: Arc::new(resident::ResidentRows::new(settings.resident_bytes)),
            resident_reads: AtomicU64::new(0),
            footers: Arc::default(),
            copied_bytes: AtomicU64::new(0),
            settings,
        })
    }

    /// The Grafana dashboard of the clusters' metrics ([`QuerySettings::grafana_url`]).
    pub fn grafana_url(&self) -> Option<&GrafanaUrl> {
        self.settings.grafana_url.as_ref()
    }

    /// Bytes of table files the routes' reads copied from storage into the cache, since the
    /// engine opened (a local store's files are read in place and copy nothing).
    pub fn copied_bytes(&self) -> u64 {
        self.copied_bytes.load(Ordering::Relaxed)
    }

    /// How many requests the summary and aggregates answered from rollups instead of
    /// scanning, since the engine opened: how tests and `bench` know which path ran.
    pub fn rollup_answers(&self) -> u64 {
        self.rollup_answers.load(Ordering::Relaxed)
    }

    pub(super) fn count_rollup_answer(&self) {
        self.rollup_answers.fetch_add(1, Ordering::Relaxed);
    }

    /// How many times a table page took more of the first stored rows because too few of
    /// those it took were newest (see `sql::FirstRows::tries`), since the engine opened.
    pub fn page_retakes(&self) -> u64 {
        self.page_retakes.load(Ordering::Relaxed)
    }

    pub(super) fn count_page_retake(&self) {
        self.page_retakes.fetch_add(1, Ordering::Relaxed);
    }

    /// How many task lookups read only the blocks their key indexes named instead of
    /// scanning, since the engine opened.
    pub fn key_index_lookups(&self) -> u64 {
        self.key_index_lookups.load(Ordering::Relaxed)
    }

    pub(super) fn count_key_index_lookup(&self) {
        self.key_index_lookups.fetch_add(1, Ordering::Relaxed);
    }

    /// How many files task lookups read from memory instead of through their key indexes
    /// (see [`resident`]), since the engine opened.
    pub fn resident_reads(&self) -> u64 {
        self.resident_reads.load(Ordering::Relaxed)
    }

    pub(super) fn count_resident_read(&self) {
        self.resident_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Files (and bytes) of rows held in memory for task lookups.
    pub fn resident_held(&self) -> (usize, u64) {
        self.resident.held()
    }

    /// Loads into memory, in the background, the rows of the `files` (data key, rows) a lookup
    /// read from, when [`resident::ResidentRows::claim`] finds them small enough to hold.
    pub(super) fn keep_resident(&self, files: &[(crate::storage::ObjectKey, u64)]) {
        for key in self.resident.claim(files) {
            let connection = match self.connection() {
                Ok(connection) => connection,
                Err(err) => {
                    tracing::warn!(error = %err, "no connection to load resident rows");
                    self.resident.abandon(&key);
                    continue;
                }
            };
            let cache = self.cache.clone();
            let resident = Arc::clone(&self.resident);
            let span = tracing::info_span!("resident_load", key = %key);
            tokio::spawn(tracing::Instrument::instrument(
                async move {
                    let loaded = match cache.files_if_present(std::slice::from_ref(&key)).await {
                        Ok(pins) => tokio::task::spawn_blocking(move || {
                            match pins.files().first().cloned().flatten() {
                                Some(path) => resident::FileRows::load(&connection, &path),
                                None => Err(QueryError::Internal("the file is gone".into())),
                            }
                        })
                        .await
                        .map_err(|err| QueryError::Internal(err.to_string()))
                        .and_then(|loaded| loaded),
                        Err(err) => Err(err.into()),
                    };
                    match loaded {
                        Ok(rows) => {
                            tracing::debug!(bytes = rows.bytes(), "rows held for lookups");
                            resident.insert(key, rows);
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "could not hold rows for lookups");
                            resident.abandon(&key);
                        }
                    }
                },
                span,
            ));
        }
    }

    /// The store the engine reads.
    pub(super) fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// Local copies of `keys` (`None` for an object that is gone), held in the cache while the
    /// answer lives.
    pub(super) async fn fetch(
        &self,
        keys: &[crate::storage::ObjectKey],
    ) -> Result<snapshot::Pins, QueryError> {
        Ok(std::sync::Arc::new(
            self.cache.files_if_present(keys).await?,
        ))
    }

    /// Local copies of the tables `needs` names, for every session in `scope` (see
    /// [`snapshot::snapshot`]).
    pub(super) async fn snapshot(
        &self,
        scope: &params::Scope,
        needs: snapshot::Needs,
    ) -> Result<snapshot::Snapshot, QueryError> {
        let snapshot = snapshot::snapshot(
            &self.storage,
            &self.cache,
            scope,
            needs,
            self.settings.copy_budget_bytes,
        )
        .await?;
        let copied = snapshot.pins.as_ref().map_or(0, |pins| pins.copied());
        self.copied_bytes.fetch_add(copied, Ordering::Relaxed);
        Ok(snapshot)
    }

    /// A connection of its own to the engine's database.
    fn connection(&self) -> Result<duckdb::Connection, QueryError> {
        Ok(self
            .database
            .lock()
            .map_err(|_| QueryError::Internal("the DuckDB pool is poisoned".into()))?
            .try_clone()?)
    }

    /// Runs `work` on its own connection off the async executor, interrupting DuckDB when the
    /// deadline passes.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&duckdb::Connection) -> Result<T, QueryError> + Send + 'static,
    ) -> Result<T, QueryError> {
        let connection = self.connection()?;
        let interrupt = connection.interrupt_handle();
        let job = tokio::task::spawn_blocking(move || work(&connection));
        within_deadline(self.settings.timeout, job, move || interrupt.interrupt()).await
    }

    /// Runs `work` that is not DuckDB's (the parquet crate's block reads) off the async
    /// executor under the deadline [`Self::run`] keeps: once it passes, or the request is
    /// dropped, `work`'s flag is set, and `work` gives up at its next check of it.
    pub(super) async fn run_stoppable<T: Send + 'static>(
        &self,
        work: impl FnOnce(&AtomicBool) -> Result<T, QueryError> + Send + 'static,
    ) -> Result<T, QueryError> {
        let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
        let flag = Arc::clone(&stop.0);
        let job = tokio::task::spawn_blocking(move || work(&flag));
        within_deadline(self.settings.timeout, job, || stop.set()).await
    }
}

/// A flag that work off the executor checks, set when it is dropped: a request whose future is
/// dropped (its client gone) stops its work too.
struct StopOnDrop(Arc<AtomicBool>);

impl StopOnDrop {
    fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.set();
    }
}

/// `job`'s answer if it comes within `timeout`; else `stop` tells it to give up, and the request
/// is a timeout once it has: no work outlives the request.
async fn within_deadline<T>(
    timeout: Duration,
    mut job: tokio::task::JoinHandle<Result<T, QueryError>>,
    stop: impl FnOnce(),
) -> Result<T, QueryError> {
    match tokio::time::timeout(timeout, &mut job).await {
        Ok(joined) => joined.map_err(|err| QueryError::Internal(err.to_string()))?,
        Err(_) => {
            stop();
            let _ = job.await;
            Err(QueryError::Timeout(timeout))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work past its deadline is told to stop and is waited for: the request's timeout comes
    /// only once the work has ended, so none outlives the request. The work here ends only when
    /// told (or after ten seconds, failing the test instead of hanging it).
    #[tokio::test]
    async fn work_past_its_deadline_is_stopped_and_waited_for()
    -> Result<(), Box<dyn std::error::Error>> {
        let stop = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicBool::new(false));
        let (flag, done) = (Arc::clone(&stop), Arc::clone(&ended));
        let job = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            while !flag.load(Ordering::Relaxed) {
                if started.elapsed() > Duration::from_secs(10) {
                    return Ok("never told to stop");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            done.store(true, Ordering::Relaxed);
            Ok("stopped")
        });
        let answer = within_deadline(Duration::from_millis(50), job, move || {
            stop.store(true, Ordering::Relaxed);
        })
        .await;
        assert!(matches!(answer, Err(QueryError::Timeout(_))), "{answer:?}");
        assert!(
            ended.load(Ordering::Relaxed),
            "the timeout came before the work ended"
        );
        // Work within its deadline is answered.
        let quick = tokio::task::spawn_blocking(|| Ok(7));
        assert_eq!(
            within_deadline(Duration::from_secs(10), quick, || ()).await?,
            7
        );
        Ok(())
    }
}
