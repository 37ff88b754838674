//! Test support shared by every test file: the captured Ray runs, the storage backends under
//! test, an in-process server, and (in `scenario`) the store set-up the compaction and query
//! suites build their tests on.
//!
//! S3 tests run against a real S3-protocol server when `AFTERGLOW_TEST_S3=1` (`scripts/test`
//! starts SeaweedFS on 127.0.0.1 and always sets it); otherwise they print "skipping".

pub mod api;
pub mod faults;
pub mod glue_race;
pub mod moto;
pub mod ray;
pub mod ray_entities;
pub mod scenario;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use afterglow::serve::ServeSettings;
use anyhow::Context as _;
use shared::storage::{LocalDirStorage, S3Settings, S3Storage, Storage};
use tokio::sync::oneshot;

/// The token `cluster`'s export URL carries under `secret`:
/// `hex(HMAC-SHA256(secret, "afterglow-ingest:" + cluster))`, computed here from the primitives
/// rather than by the code under test.
pub fn cluster_token(secret: &str, cluster: &str) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(b"afterglow-ingest:");
    mac.update(cluster.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// The prefix of every manifest of `cluster`.
pub fn manifests_of(cluster: &str) -> anyhow::Result<String> {
    Ok(shared::keys::cluster_manifests_prefix(
        &shared::keys::ClusterName::new(cluster)?,
    ))
}

/// Ingest keys that never change, from `secret`.
pub fn ingest_keys(secret: &str) -> anyhow::Result<Arc<shared::auth::ingest::IngestKeys>> {
    let secret = shared::auth::ingest::IngestSecret::new(secret)?;
    Ok(Arc::new(shared::auth::ingest::IngestKeys::fixed(secret)))
}

/// Folder of the captured Ray 2.60 runs (copied from the reference fixtures).
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/ray-2.60")
}

/// One captured run: the POST bodies Ray sent, in order, and Ray's own state-API answers.
#[derive(Debug, Clone)]
pub struct FixtureRun {
    /// Folder name, such as `basic-workload`.
    pub name: String,
    /// Its folder.
    pub dir: PathBuf,
}

/// One captured HTTP request.
#[derive(Debug, Clone)]
pub struct CapturedRequest {
    /// Arrival order.
    pub seq: u64,
    /// The exact body.
    pub body: Vec<u8>,
    /// What the recording sink answered (500 = Ray re-sent the same body later).
    pub response_status: u16,
}

impl FixtureRun {
    /// Every run, sorted by name.
    pub fn all() -> anyhow::Result<Vec<Self>> {
        let mut runs = Vec::new();
        for entry in std::fs::read_dir(fixtures_dir()).context("fixtures folder")? {
            let dir = entry?.path();
            if dir.join("requests.jsonl").is_file() {
                let name = dir
                    .file_name()
                    .and_then(|name| name.to_str())
                    .context("fixture folder name")?
                    .to_owned();
                runs.push(Self { name, dir });
            }
        }
        runs.sort_by(|a, b| a.name.cmp(&b.name));
        anyhow::ensure!(
            runs.len() >= 6,
            "expected the six captured runs, found {}",
            runs.len()
        );
        Ok(runs)
    }

    /// One run by name.
    pub fn named(name: &str) -> anyhow::Result<Self> {
        Self::all()?
            .into_iter()
            .find(|run| run.name == name)
            .with_context(|| format!("no fixture run {name}"))
    }

    /// Every request in arrival order, retried deliveries included.
    pub fn requests(&self) -> anyhow::Result<Vec<CapturedRequest>> {
        let log = std::fs::read_to_string(self.dir.join("requests.jsonl"))?;
        let mut requests = Vec::new();
        for line in log.lines().filter(|line| !line.trim().is_empty()) {
            let entry: serde_json::Value = serde_json::from_str(line)?;
            let body_file = entry["body_file"].as_str().context("body_file")?;
            requests.push(CapturedRequest {
                seq: entry["seq"].as_u64().context("seq")?,
                body: std::fs::read(self.dir.join(body_file))
                    .with_context(|| format!("{}/{body_file}", self.name))?,
                response_status: u16::try_from(
                    entry["response_status"]
                        .as_u64()
                        .context("response_status")?,
                )?,
            });
        }
        Ok(requests)
    }

    /// A ground-truth file (Ray's own answer), parsed; `redacted-runtime-envs.json` holds the
    /// runtime envs of `tasks.json`, `actors.json` and `jobs.json` with their secrets masked by
    /// Ray's own redaction, as Ray's dashboard shows them.
    pub fn ground_truth(&self, file: &str) -> anyhow::Result<serde_json::Value> {
        let path = self.dir.join("ground-truth").join(file);
        let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
        Ok(serde_json::from_str(&text)?)
    }
}

/// The events of a body as their exact JSON texts, read with serde_json alone.
pub fn raw_events(body: &[u8]) -> anyhow::Result<Vec<String>> {
    let events: Vec<&serde_json::value::RawValue> = serde_json::from_slice(body)?;
    Ok(events.iter().map(|event| event.get().to_owned()).collect())
}

/// A fresh local-directory backend in a temporary folder (kept alive by the returned guard).
pub fn local_storage() -> anyhow::Result<(tempfile::TempDir, LocalDirStorage)> {
    let dir = tempfile::tempdir()?;
    let storage = LocalDirStorage::open(dir.path().join("data"))?;
    Ok((dir, storage))
}

/// True when S3 tests should run.
pub fn s3_enabled() -> bool {
    std::env::var("AFTERGLOW_TEST_S3").is_ok_and(|value| value == "1")
}

/// S3 settings for the test server, isolated under a fresh prefix.
pub fn s3_test_settings() -> S3Settings {
    S3Settings {
        bucket: std::env::var("AFTERGLOW_TEST_BUCKET").unwrap_or_else(|_| "afterglow-test".into()),
        prefix: format!("test-{}", ulid::Ulid::new().to_string().to_lowercase()),
        endpoint_url: std::env::var("AWS_ENDPOINT_URL_S3").ok(),
        force_path_style: true,
        operation_timeout: None,
        stall_timeout: S3Settings::DEFAULT_STALL_TIMEOUT,
    }
}

/// A real S3 backend under a fresh prefix, or `None` (with a note) when S3 tests are off.
pub async fn s3_storage(test: &str) -> Option<S3Storage> {
    if !s3_enabled() {
        eprintln!("skipping the S3 variant of {test}: set AFTERGLOW_TEST_S3=1 (scripts/test does)");
        return None;
    }
    Some(S3Storage::connect(s3_test_settings()).await)
}

/// Runs an `async fn(Arc<dyn Storage>) -> anyhow::Result<()>` against both backends: a local
/// directory always, and S3 when enabled. One test, every implementation.
#[macro_export]
macro_rules! for_each_backend {
    ($($test:ident),+ $(,)?) => {
        mod local_dir {
            $(
                #[tokio::test]
                async fn $test() -> anyhow::Result<()> {
                    let (_guard, storage) = $crate::local_storage()?;
                    super::$test(std::sync::Arc::new(storage)).await
                }
            )+
        }
        mod s3 {
            $(
                #[tokio::test]
                async fn $test() -> anyhow::Result<()> {
                    match $crate::s3_storage(stringify!($test)).await {
                        Some(storage) => super::$test(std::sync::Arc::new(storage)).await,
                        None => Ok(()),
                    }
                }
            )+
        }
    };
}

/// An Afterglow server running in this process on `127.0.0.1:0`.
pub struct TestServer {
    /// Base URL, such as `http://127.0.0.1:41234`.
    pub url: String,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl TestServer {
    /// Starts a server with `settings`.
    pub async fn start(settings: ServeSettings) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (shutdown, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(afterglow::serve::run(settings, listener, async {
            let _ = stopped.await;
        }));
        Ok(Self {
            url,
            shutdown: Some(shutdown),
            task,
        })
    }

    /// Stops the server and reports how it ended.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        (&mut self.task).await?
    }
}

/// A `serve` with every function in this process, and what it posted, compacted.
pub struct Served {
    /// The server.
    pub server: TestServer,
    /// Where it keeps everything.
    pub storage: Arc<dyn Storage>,
    /// Its compaction queue: `idle()` after posting more.
    pub queue: shared::compact::schedule::queue::CompactionQueue,
    _scratch: tempfile::TempDir,
    _data: Option<tempfile::TempDir>,
}

impl Served {
    /// `GET path` (with its query): the status and the JSON body (`null` when it is not JSON).
    /// Unlike [`api::Api`], nothing is checked against `openapi.yaml`: Ray's routes are Ray's.
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, serde_json::Value)> {
        let response = reqwest::get(format!("{}{path}", self.server.url)).await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        ))
    }

    /// [`Served::get`], insisting on a 2xx answer.
    pub async fn ok(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        let (status, body) = self.get(path).await?;
        anyhow::ensure!((200..300).contains(&status), "{path}: {status} {body}");
        Ok(body)
    }
}

/// `serve` over `storage` with settings changed by `configure`, every fixture run posted to it
/// (one cluster per run) and compacted.
pub async fn serve_runs(
    storage: Arc<dyn Storage>,
    runs: &[FixtureRun],
    configure: impl FnOnce(ServeSettings) -> anyhow::Result<ServeSettings>,
) -> anyhow::Result<Served> {
    let (settings, queue, scratch) = serving_settings(Arc::clone(&storage))?;
    let server = TestServer::start(configure(settings)?).await?;
    for run in runs {
        post_all(
            &format!("{}/v1/events/{}", server.url, run.name),
            &bodies(run)?,
        )
        .await?;
    }
    queue.idle().await;
    Ok(Served {
        server,
        storage,
        queue,
        _scratch: scratch,
        _data: None,
    })
}

/// [`serve_runs`] over a local folder.
pub async fn serve_runs_locally(
    runs: &[FixtureRun],
    configure: impl FnOnce(ServeSettings) -> anyhow::Result<ServeSettings>,
) -> anyhow::Result<Served> {
    let (data, storage) = local_storage()?;
    let mut served = serve_runs(Arc::new(storage), runs, configure).await?;
    served._data = Some(data);
    Ok(served)
}

/// Settings with open ingest and default limits over `storage`.
pub fn open_settings(storage: Arc<dyn Storage>) -> ServeSettings {
    ServeSettings {
        storage,
        ingest_keys: None,
        ingest_limits: shared::ingest::IngestLimits::default(),
        compaction: None,
        query: None,
        query_token: None,
    }
}

/// Stores `run`'s bodies for `cluster` through ingest, without compacting them.
pub async fn store_raw(
    storage: &Arc<dyn Storage>,
    run: &FixtureRun,
    cluster: &str,
) -> anyhow::Result<()> {
    store_bodies(storage, cluster, &bodies(run)?).await
}

/// Stores `bodies` for `cluster` through ingest (open, and no compaction behind it), without
/// compacting them.
pub async fn store_bodies(
    storage: &Arc<dyn Storage>,
    cluster: &str,
    bodies: &[Vec<u8>],
) -> anyhow::Result<()> {
    let server = TestServer::start(open_settings(Arc::clone(storage))).await?;
    post_all(&format!("{}/v1/events/{cluster}", server.url), bodies).await?;
    server.stop().await
}

/// Commits made to the manifests of `cluster` (each compaction run commits once per session).
pub async fn manifest_commits(storage: &dyn Storage, cluster: &str) -> anyhow::Result<u64> {
    let mut commits = 0;
    for meta in storage
        .list(&format!("tables/manifests/cluster={cluster}/"))
        .await?
    {
        commits += shared::tables::manifest::load(storage, &meta.key)
            .await?
            .manifest
            .sequence;
    }
    Ok(commits)
}

/// Posts each body to `url` as Ray does, insisting on 200.
pub async fn post_all(url: &str, bodies: &[Vec<u8>]) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    for body in bodies {
        let response = client
            .post(url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await?;
        anyhow::ensure!(
            response.status() == 200,
            "ingest answered {}",
            response.status()
        );
    }
    Ok(())
}

/// Every body a run delivered, in arrival order (failed deliveries and their retries included).
pub fn bodies(run: &FixtureRun) -> anyhow::Result<Vec<Vec<u8>>> {
    Ok(run
        .requests()?
        .into_iter()
        .map(|request| request.body)
        .collect())
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> anyhow::Result<u64> {
    Ok(u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?)
}

/// `bytes` bytes of text that compress poorly: lines of 99 characters drawn from 64 by a
/// xorshift from `seed` (so that a failure reproduces), each ending in a newline.
pub fn noisy_lines(bytes: usize, seed: u64) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut state = seed | 1;
    (0..bytes)
        .map(|at| {
            if at % 100 == 99 {
                return b'\n';
            }
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ALPHABET[usize::try_from(state % 64).unwrap_or(0)]
        })
        .collect()
}

/// A deterministic shuffle (xorshift), so that a failure reproduces.
pub fn shuffled<T: Clone>(items: &[T], seed: u64) -> Vec<T> {
    let mut items = items.to_vec();
    let mut state = seed | 1;
    for index in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let bound = u64::try_from(index + 1).unwrap_or(u64::MAX);
        let other = usize::try_from(state % bound).unwrap_or(0);
        items.swap(index, other);
    }
    items
}

/// A compactor over `storage` with its own scratch directory (kept alive by the guard).
pub fn compactor(
    storage: Arc<dyn Storage>,
    settings: shared::compact::CompactSettings,
) -> anyhow::Result<(shared::compact::Compactor, tempfile::TempDir)> {
    let scratch = tempfile::tempdir()?;
    let compactor =
        shared::compact::Compactor::new(storage, settings, scratch.path().to_path_buf());
    Ok((compactor, scratch))
}

/// A compactor over `storage`, a wrapper (a fault, a recorder) around a test's store, with its
/// own scratch directory (kept alive by the guard).
pub fn compactor_over<S: Storage + 'static>(
    storage: &Arc<S>,
    settings: shared::compact::CompactSettings,
) -> anyhow::Result<(shared::compact::Compactor, tempfile::TempDir)> {
    compactor(Arc::clone(storage) as Arc<dyn Storage>, settings)
}

/// Compaction as configured by default, except that a small session keeps its deltas until
/// another rule folds them: for tests of deltas, whose sessions are small.
pub fn keeping_deltas() -> shared::compact::CompactSettings {
    shared::compact::CompactSettings {
        fold: shared::compact::fold::FoldPolicy {
            small_session_rows: 0,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// [`keeping_deltas`], folding a session's deltas into a base once there are more than
/// `max_deltas` of them (the rest of the fold policy as deployed).
pub fn folding_past(max_deltas: usize) -> shared::compact::CompactSettings {
    shared::compact::CompactSettings {
        fold: shared::compact::fold::FoldPolicy {
            max_deltas,
            // These sessions are small; the tests are about their deltas.
            small_session_rows: 0,
            ..shared::compact::fold::FoldPolicy::default()
        },
        ..shared::compact::CompactSettings::default()
    }
}

/// Settings for `serve`, the compaction queue they hand stored batches to, and the guard of the
/// temporary folder that holds the compactor's scratch (and the query cache, when served).
pub type QueuedSettings = (
    ServeSettings,
    shared::compact::schedule::queue::CompactionQueue,
    tempfile::TempDir,
);

/// Open-ingest settings whose stored batches are compacted in the background, as in `serve`.
pub fn compacting_settings(storage: Arc<dyn Storage>) -> anyhow::Result<QueuedSettings> {
    let (compactor, scratch) = compactor(Arc::clone(&storage), Default::default())?;
    let queue = shared::compact::schedule::queue::CompactionQueue::spawn(compactor);
    let settings = ServeSettings {
        compaction: Some(queue.clone()),
        ..open_settings(storage)
    };
    Ok((settings, queue, scratch))
}

/// Settings of a full `serve`: open ingest, background compaction and the query API, with
/// scratch and query cache in a temporary folder (kept alive by the guard).
pub fn serving_settings(storage: Arc<dyn Storage>) -> anyhow::Result<QueuedSettings> {
    let (settings, queue, scratch) = compacting_settings(storage)?;
    let query = shared::query::QuerySettings::under(&scratch.path().join("query"));
    Ok((
        ServeSettings {
            query: Some(query),
            ..settings
        },
        queue,
        scratch,
    ))
}

/// Copies the live files of one table of every session of `cluster` into a temporary folder,
/// named in manifest order (so a later name is a newer file).
async fn fetch_live_files(
    storage: &dyn Storage,
    cluster: &str,
    table: fn(&shared::tables::manifest::Manifest) -> &shared::tables::manifest::TableFiles,
) -> anyhow::Result<(tempfile::TempDir, Vec<PathBuf>)> {
    let scratch = tempfile::tempdir()?;
    let mut files: Vec<PathBuf> = Vec::new();
    for meta in storage.list(&manifests_of(cluster)?).await? {
        let loaded = shared::tables::manifest::load(storage, &meta.key).await?;
        for file in table(&loaded.manifest).all() {
            let path = scratch.path().join(format!("{:06}.parquet", files.len()));
            std::fs::write(&path, storage.get(&file.key).await?.body)?;
            files.push(path);
        }
    }
    Ok((scratch, files))
}

/// The `task_attempts` rows a reader sees for `cluster`: every session's manifest, its files
/// read with DuckDB, and for each attempt the row of the newest file that has it.
pub async fn stored_task_rows(
    storage: &dyn Storage,
    cluster: &str,
) -> anyhow::Result<ray::OurRows> {
    let (_scratch, files) =
        fetch_live_files(storage, cluster, |manifest| &manifest.task_attempts).await?;
    let mut rows = ray::OurRows::new();
    if files.is_empty() {
        return Ok(rows);
    }
    let connection = duckdb::Connection::open_in_memory()?;
    let fields: Vec<String> = ray::COMPARED_FIELDS
        .iter()
        .map(|field| format!("CAST({field} AS VARCHAR)"))
        .collect();
    let list: Vec<String> = files
        .iter()
        .map(|path| format!("'{}'", path.display()))
        .collect();
    let sql = format!(
        "SELECT task_id, {}, synthesized_failure, filename FROM read_parquet([{}], filename = true, union_by_name = true)          ORDER BY filename",
        fields.join(", "),
        list.join(", ")
    );
    let mut statement = connection.prepare(&sql)?;
    let mut result = statement.query([])?;
    // Files are named in manifest order, so later rows come from newer files and replace.
    while let Some(row) = result.next()? {
        let task_id: String = row.get(0)?;
        let mut our = ray::OurRow::default();
        for (index, field) in ray::COMPARED_FIELDS.iter().enumerate() {
            our.fields
                .insert(field, row.get::<_, Option<String>>(index + 1)?);
        }
        our.synthesized_failure = row
            .get::<_, Option<bool>>(ray::COMPARED_FIELDS.len() + 1)?
            .unwrap_or(false);
        let attempt: i64 = our
            .fields
            .get("attempt_number")
            .cloned()
            .flatten()
            .context("attempt_number")?
            .parse()?;
        rows.insert((task_id, attempt), our);
    }
    Ok(rows)
}

/// The profile spans a reader sees for `cluster`: per attempt, the `profile_events` of the
/// newest `task_attempts` file that has the attempt, in microseconds.
pub async fn stored_spans(
    storage: &dyn Storage,
    cluster: &str,
) -> anyhow::Result<std::collections::BTreeMap<(String, i64), Vec<ray::Span>>> {
    let (_scratch, files) =
        fetch_live_files(storage, cluster, |manifest| &manifest.task_attempts).await?;
    let mut spans = std::collections::BTreeMap::new();
    if files.is_empty() {
        return Ok(spans);
    }
    let connection = duckdb::Connection::open_in_memory()?;
    let list: Vec<String> = files
        .iter()
        .map(|path| format!("'{}'", path.display()))
        .collect();
    let sql = format!(
        "SELECT task_id, attempt_number, profile_events FROM read_parquet([{}], filename = true) \
         ORDER BY filename",
        list.join(", ")
    );
    let mut statement = connection.prepare(&sql)?;
    let mut rows = statement.query([])?;
    // Files are named in manifest order: a newer file's row replaces the attempt's spans.
    while let Some(row) = rows.next()? {
        let key: (String, i64) = (row.get(0)?, row.get(1)?);
        let text: Option<String> = row.get(2)?;
        let events: Vec<serde_json::Value> = match text {
            Some(text) => serde_json::from_str(&text)?,
            None => Vec::new(),
        };
        let mut list = Vec::new();
        for event in events {
            let time = |field: &str| {
                event[field]
                    .as_i64()
                    .map(|ns| ns.div_euclid(1000))
                    .with_context(|| format!("{field} of {event}"))
            };
            let name = event["event_name"].as_str().context("event_name")?;
            list.push((name.to_owned(), time("start_ns")?, time("end_ns")?));
        }
        spans.insert(key, list);
    }
    Ok(spans)
}

/// The entity records (jobs, actors, nodes, workers) stored for `cluster`, all sessions merged.
pub async fn stored_entities(
    storage: &dyn Storage,
    cluster: &str,
) -> anyhow::Result<shared::merge::entities::SessionEntities> {
    use shared::tables::entities::{EntityKind, read_entities};
    let scratch = tempfile::tempdir()?;
    let connection = duckdb::Connection::open_in_memory()?;
    let mut entities = shared::merge::entities::SessionEntities::default();
    for meta in storage.list(&manifests_of(cluster)?).await? {
        let loaded = shared::tables::manifest::load(storage, &meta.key).await?;
        for kind in EntityKind::ALL {
            if let Some(file) = loaded.manifest.entities.get(kind.table()) {
                let path = scratch.path().join(format!("{}.parquet", kind.table()));
                std::fs::write(&path, storage.get(&file.key).await?.body)?;
                read_entities(&connection, kind, &path, &mut entities)?;
            }
        }
    }
    Ok(entities)
}

/// The keys stored under `prefix`, in key order.
pub async fn keys_under(
    storage: &dyn Storage,
    prefix: &str,
) -> anyhow::Result<Vec<shared::storage::ObjectKey>> {
    Ok(storage
        .list(prefix)
        .await?
        .into_iter()
        .map(|meta| meta.key)
        .collect())
}

/// Every line of every plain-text object under `prefix`, in key order.
pub async fn stored_lines(storage: &dyn Storage, prefix: &str) -> anyhow::Result<Vec<String>> {
    let mut lines = Vec::new();
    for object in storage.list(prefix).await? {
        let stored = storage.get(&object.key).await?;
        lines.extend(
            String::from_utf8(stored.body.to_vec())?
                .lines()
                .map(str::to_owned),
        );
    }
    Ok(lines)
}

/// Every line of every raw object under `prefix`, in key order.
pub async fn stored_raw_lines(storage: &dyn Storage, prefix: &str) -> anyhow::Result<Vec<String>> {
    let mut lines = Vec::new();
    for object in storage.list(prefix).await? {
        let stored = storage.get(&object.key).await?;
        let text = String::from_utf8(gunzip(&stored.body).context(object.key)?)?;
        lines.extend(text.lines().map(str::to_owned));
    }
    Ok(lines)
}

/// `bytes` gzip-decoded (every member).
pub fn gunzip(bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut decoded = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .read_to_end(&mut decoded)
        .context("gzip that does not decode")?;
    Ok(decoded)
}

/// An answer as it crossed the wire, before and after any `Content-Encoding`.
#[derive(Debug)]
pub struct Fetched {
    /// HTTP status.
    pub status: u16,
    /// `Content-Encoding`, when one was sent.
    pub encoding: Option<String>,
    /// `Vary`, when one was sent.
    pub vary: Option<String>,
    /// The body as sent.
    pub sent: Vec<u8>,
    /// The body, gunzipped when it was gzipped.
    pub body: Vec<u8>,
}

/// `GET url` with `Accept-Encoding: accept_encoding` (none when `None`), by a client that
/// decodes nothing itself, so the answer is seen as sent.
pub async fn fetch_encoded(url: &str, accept_encoding: Option<&str>) -> anyhow::Result<Fetched> {
    let client = reqwest::Client::builder().no_gzip().build()?;
    let mut request = client.get(url);
    if let Some(value) = accept_encoding {
        request = request.header("accept-encoding", value);
    }
    let response = request.send().await?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let (status, encoding, vary) = (
        response.status().as_u16(),
        header("content-encoding"),
        header("vary"),
    );
    let sent = response.bytes().await?.to_vec();
    let body = match encoding.as_deref() {
        Some("gzip") => gunzip(&sent).context(url.to_owned())?,
        Some(other) => anyhow::bail!("{url}: unexpected Content-Encoding {other}"),
        None => sent.clone(),
    };
    Ok(Fetched {
        status,
        encoding,
        vary,
        sent,
        body,
    })
}
