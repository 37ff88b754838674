//! The set-up the compaction and query tests share, built in one place: a store (a temporary
//! folder, or a backend a test was given), Ray's captured bodies or synthetic traffic stored in
//! it through ingest, compacted by a compactor of the test's settings, and read back as rows, a
//! manifest or a query engine's answers. A test then states only what differs:
//!
//! ```ignore
//! let run = FixtureRun::named("basic-workload")?;
//! let scenario = Scenario::local()?.with_raw(&run, "fold").await?;
//! let (compactor, _scratch) = scenario.compactor(keeping_deltas())?;
//! for key in compactor.raw_keys().await? {
//!     compactor.compact(&[key]).await?;
//! }
//! scenario.check(&run, "fold", "one raw object at a time").await?;
//! ```

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use shared::compact::{CompactSettings, Compactor};
use shared::query::{QueryEngine, QuerySettings};
use shared::storage::{ObjectKey, Storage};
use shared::tables::manifest::{self, DataFile, Manifest};

use crate::ray::{OurRows, check};
use crate::{
    FixtureRun, TestServer, bodies, compacting_settings, local_storage, post_all, store_bodies,
    store_raw, stored_task_rows,
};

/// A store, what a test put in it, and the temporary folder that holds it (when it is local).
pub struct Scenario {
    storage: Arc<dyn Storage>,
    dir: Option<tempfile::TempDir>,
}

/// A change to one body's events before it is sent.
type EditEvents<'a> = &'a mut dyn FnMut(&mut Vec<serde_json::Value>);

impl Scenario {
    /// An empty store in a fresh temporary folder (the store under its `data/`).
    pub fn local() -> anyhow::Result<Self> {
        let (dir, storage) = local_storage()?;
        Ok(Self {
            storage: Arc::new(storage),
            dir: Some(dir),
        })
    }

    /// A scenario over `storage`, a backend the test was given (see `for_each_backend!`).
    pub fn over(storage: Arc<dyn Storage>) -> Self {
        Self { storage, dir: None }
    }

    /// The store.
    pub fn storage(&self) -> Arc<dyn Storage> {
        Arc::clone(&self.storage)
    }

    /// The temporary folder of a [`Scenario::local`] store: the store under `data/`, room
    /// beside it for caches and scratch.
    pub fn dir(&self) -> anyhow::Result<&Path> {
        self.dir
            .as_ref()
            .map(tempfile::TempDir::path)
            .context("a scenario over a local folder")
    }

    /// `run`'s bodies stored for `cluster` through ingest, in arrival order, not compacted.
    pub async fn with_raw(self, run: &FixtureRun, cluster: &str) -> anyhow::Result<Self> {
        store_raw(&self.storage, run, cluster).await?;
        Ok(self)
    }

    /// `bodies` stored for `cluster` through ingest, in order, not compacted.
    pub async fn with_raw_bodies(self, cluster: &str, bodies: &[Vec<u8>]) -> anyhow::Result<Self> {
        store_bodies(&self.storage, cluster, bodies).await?;
        Ok(self)
    }

    /// `run`'s bodies posted for `cluster` through a server that compacts what it stores, and
    /// compacted (see [`Scenario::ingest_and_compact`]).
    pub async fn with_compacted(self, run: &FixtureRun, cluster: &str) -> anyhow::Result<Self> {
        self.ingest_and_compact(cluster, &bodies(run)?).await?;
        Ok(self)
    }

    /// Posts `bodies` for `cluster` through a server that compacts what it stores, waits until
    /// it has, and returns the rows a reader sees.
    pub async fn ingest_and_compact(
        &self,
        cluster: &str,
        bodies: &[Vec<u8>],
    ) -> anyhow::Result<OurRows> {
        let (settings, queue, _scratch) = compacting_settings(self.storage())?;
        let server = TestServer::start(settings).await?;
        post_all(&format!("{}/v1/events/{cluster}", server.url), bodies).await?;
        queue.idle().await;
        server.stop().await?;
        self.rows(cluster).await
    }

    /// Synthetic traffic made by `settings` (what `afterglow generate` and `bench` send), every
    /// body ingested for `cluster` and not compacted; what the generator says it generated.
    pub async fn ingest_synthetic(
        &self,
        cluster: &str,
        settings: synth::SynthSettings,
    ) -> anyhow::Result<synth::Truth> {
        self.ingest_generated(cluster, settings, None).await
    }

    /// [`Scenario::ingest_synthetic`], each body's events changed by `edit` before it is sent
    /// (the generator's truth then no longer holds where they were).
    pub async fn ingest_synthetic_edited(
        &self,
        cluster: &str,
        settings: synth::SynthSettings,
        mut edit: impl FnMut(&mut Vec<serde_json::Value>),
    ) -> anyhow::Result<synth::Truth> {
        self.ingest_generated(cluster, settings, Some(&mut edit))
            .await
    }

    /// The bodies `settings` generates, edited by `edit` if there is one, ingested for
    /// `cluster`.
    async fn ingest_generated(
        &self,
        cluster: &str,
        settings: synth::SynthSettings,
        mut edit: Option<EditEvents<'_>>,
    ) -> anyhow::Result<synth::Truth> {
        use shared::ingest::{IngestAccess, IngestLimits, Ingestor};

        let ingestor = Ingestor::new(self.storage(), IngestAccess::Open, IngestLimits::default());
        let cluster = shared::keys::ClusterName::new(cluster)?;
        let mut generator = synth::Generator::new(settings);
        for body in generator.by_ref() {
            let mut json = body?.json;
            if let Some(edit) = edit.as_mut() {
                let mut events: Vec<serde_json::Value> = serde_json::from_slice(&json)?;
                edit(&mut events);
                json = serde_json::to_vec(&events)?;
            }
            ingestor.ingest(&cluster, &json).await?;
        }
        Ok(generator.truth().clone())
    }

    /// Two sessions of synthetic traffic (one per seed) of `attempts` each over `jobs` jobs,
    /// with a tenth of first attempts failing (some retried) and a twentieth of bodies
    /// re-delivered, ingested as `cluster`. Returns the attempts generated.
    pub async fn ingest_failing_sessions(
        &self,
        cluster: &str,
        seeds: [u64; 2],
        attempts: u64,
        jobs: u32,
    ) -> anyhow::Result<u64> {
        let mut generated = 0;
        for seed in seeds {
            let settings = synth::SynthSettings {
                attempts,
                jobs,
                nodes: 4,
                failure_rate: 0.1,
                duplicate_rate: 0.05,
                seed,
                ..synth::SynthSettings::default()
            };
            generated += self.ingest_synthetic(cluster, settings).await?.attempts;
        }
        Ok(generated)
    }

    /// [`Scenario::ingest_failing_sessions`] as a step of building the scenario.
    pub async fn with_failing_sessions(
        self,
        cluster: &str,
        seeds: [u64; 2],
        attempts: u64,
        jobs: u32,
    ) -> anyhow::Result<Self> {
        self.ingest_failing_sessions(cluster, seeds, attempts, jobs)
            .await?;
        Ok(self)
    }

    /// A compactor over the store with `settings`, and the guard of its scratch folder.
    pub fn compactor(
        &self,
        settings: CompactSettings,
    ) -> anyhow::Result<(Compactor, tempfile::TempDir)> {
        crate::compactor(self.storage(), settings)
    }

    /// Every raw object stored, in key order.
    pub async fn raw_keys(&self) -> anyhow::Result<Vec<ObjectKey>> {
        Ok(shared::raw::list::list_keys(&*self.storage).await?)
    }

    /// The `task_attempts` rows a reader sees for `cluster` (see [`stored_task_rows`]).
    pub async fn rows(&self, cluster: &str) -> anyhow::Result<OurRows> {
        stored_task_rows(&*self.storage, cluster).await
    }

    /// The rows a reader sees for `cluster`, held to Ray's list for `run` (see [`check`]);
    /// `what` names the step in a failure's message.
    pub async fn check(&self, run: &FixtureRun, cluster: &str, what: &str) -> anyhow::Result<()> {
        check(run, &self.rows(cluster).await?, what)?;
        Ok(())
    }

    /// The manifest of `cluster`'s one session; an error when it has none or several.
    pub async fn only_manifest(&self, cluster: &str) -> anyhow::Result<Manifest> {
        let manifests = self
            .storage
            .list(&format!("tables/manifests/cluster={cluster}/"))
            .await?;
        let [meta] = manifests.as_slice() else {
            anyhow::bail!("expected one session, found {}", manifests.len());
        };
        Ok(manifest::load(&*self.storage, &meta.key).await?.manifest)
    }

    /// Rows the deltas of `cluster`'s one session supersede (their deletion vectors' rows): a
    /// test of superseded rows shows nothing unless some are.
    pub async fn superseded_rows(&self, cluster: &str) -> anyhow::Result<u64> {
        let manifest = self.only_manifest(cluster).await?;
        Ok(manifest
            .task_attempts
            .deltas
            .iter()
            .filter_map(|delta| delta.deletes.as_ref())
            .map(|deletes| deletes.rows)
            .sum())
    }

    /// Rewrites every session's manifest with `edit` applied, as an earlier build might have
    /// written it.
    pub async fn rewrite_manifests(&self, edit: impl Fn(&mut Manifest)) -> anyhow::Result<()> {
        for meta in self.storage.list("tables/manifests/").await? {
            let mut manifest = manifest::load(&*self.storage, &meta.key).await?.manifest;
            edit(&mut manifest);
            self.storage
                .put(
                    &meta.key,
                    serde_json::to_vec(&manifest)?.into(),
                    shared::storage::PutMode::Overwrite,
                )
                .await?;
        }
        Ok(())
    }

    /// Rewrites every session's manifest with `edit` applied to each of its `task_attempts`
    /// files, base and deltas, as an earlier build might have written them.
    pub async fn rewrite_attempt_files(&self, edit: impl Fn(&mut DataFile)) -> anyhow::Result<()> {
        self.rewrite_manifests(|manifest| {
            let files = &mut manifest.task_attempts;
            for file in files.base.iter_mut().chain(&mut files.deltas) {
                edit(file);
            }
        })
        .await
    }

    /// A query engine over the store, its cache and DuckDB's files in the folder's `name`.
    pub fn engine(&self, name: &str) -> anyhow::Result<QueryEngine> {
        self.engine_with(name, |settings| settings)
    }

    /// [`Scenario::engine`] with its settings changed by `configure`.
    pub fn engine_with(
        &self,
        name: &str,
        configure: impl FnOnce(QuerySettings) -> QuerySettings,
    ) -> anyhow::Result<QueryEngine> {
        let settings = configure(QuerySettings::under(&self.dir()?.join(name)));
        Ok(QueryEngine::open(self.storage(), settings)?)
    }
}

/// Query parameters as the engine takes them, from pairs of text.
pub fn query_params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}
