//! Where things live in storage, in one place (docs/architecture.md, "Storage keys"), and the
//! validated names that become key segments ([`ClusterName`], [`SessionName`], [`NodeId`],
//! [`LogFileName`]).
//!
//! `raw/{cluster}/{yyyy}/{mm}/{dd}/{hh}/{ulid}.ndjson.gz` holds each accepted ingest request
//! (its keys are [`crate::raw::key`]'s);
//! `tables/{table}/cluster={cluster}/session={session}/{delta|base|table}-{ulid}.parquet` the
//! tables' files, `tables/manifests/cluster={cluster}/session={session}.json` which of them are
//! live, `tables/catalog/cluster={cluster}.json` one cluster's sessions and
//! `tables/catalog/clusters.json` which clusters have one (`tables/catalog.json`, every cluster in
//! one document, is the catalog's older format, still read),
//! `tables/cluster_rollups/cluster={cluster}/rollup-{ulid}.parquet` a cluster's rollup;
//! `logs/{cluster}/{session}/{node_id}/segments/{ulid}.gz` the log bytes one request shipped from
//! a node (or a merge of earlier ones), and `logs/{cluster}/{session}/{node_id}/index.json` where
//! each of the node's files' bytes are in them; `quarantine/{ulid}.ndjson` lines
//! compaction could not use; `state/serve/compacted/{ulid}.txt` what `serve` has compacted;
//! `iceberg/{table}/` each published table as Apache Iceberg metadata over those same files
//! (`metadata/v{n}.metadata.json` its versions, `metadata/version-hint.text` the newest,
//! `metadata/snap-{id}.avro` manifest lists, `metadata/cluster={c}/session={s}/{sequence}-{rows}-
//! {data|deletes}.avro` one session's manifests as of its manifest's sequence, and
//! `deletes/cluster={c}/session={s}/{sequence}/{data file}` its position-delete files, and
//! `retired/v{n}.json` the files version `n` stopped naming, deleted after a grace period).

use ulid::Ulid;

use crate::storage::{InvalidKey, ObjectKey};
use crate::tables::entities::EntityKind;

/// The name of a Ray cluster, taken from the export URL (`/v1/events/{cluster}`).
///
/// Ray's events carry a session but no cluster id, so the URL names the cluster. It becomes a
/// key segment, hence the strict alphabet: 1–64 of `A–Z a–z 0–9 - _ .`, not starting with `.`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterName(String);

/// A cluster name that breaks the rules.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid cluster name {0:?}: use 1-64 characters from A-Z a-z 0-9 - _ . (not starting with '.')"
)]
pub struct InvalidClusterName(String);

impl ClusterName {
    /// Checks a cluster name.
    pub fn new(name: &str) -> Result<Self, InvalidClusterName> {
        let valid = (1..=64).contains(&name.len())
            && !name.starts_with('.')
            && name
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || b"-_.".contains(&byte));
        if valid {
            Ok(Self(name.to_owned()))
        } else {
            Err(InvalidClusterName(name.to_owned()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ClusterName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Top-level prefix of the tables, their manifests and the catalog.
pub const TABLES_PREFIX: &str = "tables/";

/// Where the manifests live: one per session.
pub const MANIFESTS_PREFIX: &str = "tables/manifests/";

/// Where the catalog lives: a document per cluster and the list of clusters.
pub const CATALOG_PREFIX: &str = "tables/catalog/";

/// The catalog's older format: every cluster's sessions in one document. This build reads it
/// and moves it into a document per cluster (see [`crate::tables::catalog`]).
pub const SINGLE_CATALOG_KEY: &str = "tables/catalog.json";

/// Lines compaction could not use, kept for a look.
pub const QUARANTINE_PREFIX: &str = "quarantine/";

/// `serve`'s records of the raw objects it has compacted (its crash recovery).
pub const COMPACTED_RECORDS_PREFIX: &str = "state/serve/compacted/";

/// A table with files per session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// One merged row per task attempt.
    TaskAttempts,
    /// Profile spans as a table of their own, which stored sessions may still hold (the spans
    /// are on each attempt now): listed so that their files are still collected.
    TaskProfile,
    /// Jobs, actors, nodes, workers or placement groups: one whole file per session.
    Entity(EntityKind),
}

impl Table {
    /// Every table, in a fixed order.
    pub fn all() -> impl Iterator<Item = Self> {
        [Self::TaskAttempts, Self::TaskProfile]
            .into_iter()
            .chain(EntityKind::ALL.map(Self::Entity))
    }

    /// The table's name: its key segment.
    pub fn name(self) -> &'static str {
        match self {
            Self::TaskAttempts => "task_attempts",
            Self::TaskProfile => "task_profile",
            Self::Entity(kind) => kind.table(),
        }
    }
}

/// Which file of a table: the task tables have one base and deltas over it, an entity table is
/// rewritten whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableFile {
    /// A base: every row of the session when it was written.
    Base,
    /// A delta: full merged rows of the attempts one run touched.
    Delta,
    /// An entity table's one file.
    Whole,
    /// The rows a delta supersedes in the files before it (its deletion vector).
    Deletes,
    /// A base's or delta's counts by group, state and rounded duration (its rollup).
    Rollup,
    /// A base's or delta's task-id keys and where their rows are (its key index).
    KeyIndex,
}

/// Where one table's files of one session live: `tables/{table}/cluster={c}/session={s}/`.
pub fn table_prefix(table: Table, cluster: &ClusterName, session: &SessionName) -> String {
    format!(
        "{TABLES_PREFIX}{}/cluster={cluster}/session={session}/",
        table.name()
    )
}

/// The key of a new file of `table`, named by `id`.
pub fn table_file_key(
    table: Table,
    cluster: &ClusterName,
    session: &SessionName,
    file: TableFile,
    id: Ulid,
) -> Result<ObjectKey, InvalidKey> {
    let kind = match file {
        TableFile::Base => "base",
        TableFile::Delta => "delta",
        TableFile::Whole => table.name(),
        TableFile::Deletes => "deletes",
        TableFile::Rollup => "rollup",
        TableFile::KeyIndex => "keys",
    };
    ObjectKey::new(format!(
        "{}{kind}-{id}.parquet",
        table_prefix(table, cluster, session)
    ))
}

/// The key of a session's manifest.
pub fn manifest_key(cluster: &ClusterName, session: &SessionName) -> Result<ObjectKey, InvalidKey> {
    ObjectKey::new(format!(
        "{MANIFESTS_PREFIX}cluster={cluster}/session={session}.json"
    ))
}

/// The prefix of every manifest of one cluster.
pub fn cluster_manifests_prefix(cluster: &ClusterName) -> String {
    format!("{MANIFESTS_PREFIX}cluster={cluster}/")
}

/// The session a manifest key names; `None` for any other key.
pub fn manifest_session(key: &ObjectKey) -> Option<(ClusterName, SessionName)> {
    let rest = key.as_str().strip_prefix(MANIFESTS_PREFIX)?;
    let (cluster, rest) = rest.strip_prefix("cluster=")?.split_once("/session=")?;
    let session = rest.strip_suffix(".json")?;
    Some((
        ClusterName::new(cluster).ok()?,
        SessionName::new(session).ok()?,
    ))
}

/// The key of one cluster's catalog document: its sessions and their statistics.
pub fn cluster_catalog_key(cluster: &ClusterName) -> Result<ObjectKey, InvalidKey> {
    ObjectKey::new(format!("{CATALOG_PREFIX}cluster={cluster}.json"))
}

/// Where clusters' rollups live ([`crate::tables::cluster_rollup`]).
pub const CLUSTER_ROLLUPS_PREFIX: &str = "tables/cluster_rollups/";

/// The key of a new rollup of `cluster`, named by `id`.
pub fn cluster_rollup_key(cluster: &ClusterName, id: Ulid) -> Result<ObjectKey, InvalidKey> {
    ObjectKey::new(format!(
        "{CLUSTER_ROLLUPS_PREFIX}cluster={cluster}/rollup-{id}.parquet"
    ))
}

/// The key of the list of clusters the catalog has a document for.
pub fn cluster_list_key() -> Result<ObjectKey, InvalidKey> {
    ObjectKey::new(format!("{CATALOG_PREFIX}clusters.json"))
}

/// The key of the catalog's older, single document ([`SINGLE_CATALOG_KEY`]).
pub fn single_catalog_key() -> Result<ObjectKey, InvalidKey> {
    ObjectKey::new(SINGLE_CATALOG_KEY)
}

/// The key of a new quarantine object, named by `id`.
pub fn quarantine_key(id: Ulid) -> Result<ObjectKey, InvalidKey> {
    ObjectKey::new(format!("{QUARANTINE_PREFIX}{id}.ndjson"))
}

/// The key of a new record of `serve`'s compacted raw objects, named by `id`.
pub fn compacted_record_key(id: Ulid) -> Result<ObjectKey, InvalidKey> {
    ObjectKey::new(format!("{COMPACTED_RECORDS_PREFIX}{id}.txt"))
}

/// Top-level prefix of shipped logs.
pub const LOGS_PREFIX: &str = "logs/";

// The names a shipped log piece carries are the shipper's (it builds without this crate), and
// key segments here.
pub use ship_logs::names::{
    InvalidLogFileName, InvalidNodeId, InvalidSessionName, LogFileName, NodeId, SessionName,
};

/// The prefix of every log object of one session, all its nodes' (ends with `/`).
pub fn session_logs_prefix(cluster: &ClusterName, session: &SessionName) -> String {
    format!("{LOGS_PREFIX}{cluster}/{session}/")
}

/// One node's logs in one session: its index and segments.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeLogs {
    /// The cluster (from the export URL).
    pub cluster: ClusterName,
    /// The Ray session.
    pub session: SessionName,
    /// The node.
    pub node_id: NodeId,
}

impl NodeLogs {
    /// The prefix of every object of the node's logs (ends with `/`).
    pub fn prefix(&self) -> String {
        format!(
            "{}{}/",
            session_logs_prefix(&self.cluster, &self.session),
            self.node_id
        )
    }

    /// The key of the node's log index.
    pub fn index_key(&self) -> Result<ObjectKey, InvalidKey> {
        ObjectKey::new(format!("{}index.json", self.prefix()))
    }

    /// The key of segment `id`.
    pub fn segment_key(&self, id: Ulid) -> Result<ObjectKey, InvalidKey> {
        ObjectKey::new(format!("{}segments/{id}.gz", self.prefix()))
    }

    /// The node's file `name`.
    pub fn file(&self, name: LogFileName) -> LogFile {
        LogFile {
            cluster: self.cluster.clone(),
            session: self.session.clone(),
            node_id: self.node_id.clone(),
            file: name,
        }
    }
}

/// One node's log file in one session.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LogFile {
    /// The cluster (from the export URL).
    pub cluster: ClusterName,
    /// The Ray session.
    pub session: SessionName,
    /// The node the file is on.
    pub node_id: NodeId,
    /// The file's name in the session's `logs/` folder.
    pub file: LogFileName,
}

impl LogFile {
    /// The node's logs the file is among.
    pub fn node(&self) -> NodeLogs {
        NodeLogs {
            cluster: self.cluster.clone(),
            session: self.session.clone(),
            node_id: self.node_id.clone(),
        }
    }
}

/// `{cluster}/{session}/{node_id}/{file}`, for messages.
impl std::fmt::Display for LogFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.cluster, self.session, self.node_id, self.file
        )
    }
}

/// Where the published tables' Iceberg metadata lives.
pub const ICEBERG_PREFIX: &str = "iceberg/";

/// What an Iceberg manifest of one session lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IcebergManifest {
    /// Its data files.
    Data,
    /// Its position-delete files.
    Deletes,
}

/// The location of published table `table` (`iceberg/{table}`).
pub fn iceberg_table_key(table: &str) -> Result<ObjectKey, InvalidKey> {
    ObjectKey::new(format!("{ICEBERG_PREFIX}{table}"))
}

/// Version `version` of a published table's Iceberg metadata.
pub fn iceberg_metadata_key(table: &str, version: u64) -> Result<ObjectKey, InvalidKey> {
    ObjectKey::new(format!(
        "{ICEBERG_PREFIX}{table}/metadata/v{version}.metadata.json"
    ))
}

/// The version an [`iceberg_metadata_key`] of `table` names, given as the key or its URI
/// (`None` for any other file, such as another writer's metadata).
pub fn iceberg_metadata_version(table: &str, path: &str) -> Option<u64> {
    let (directory, name) = path.rsplit_once('/')?;
    if !directory.ends_with(&format!("{ICEBERG_PREFIX}{table}/metadata")) {
        return None;
    }
    let digits = name.strip_prefix('v')?.strip_suffix(".metadata.json")?;
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The newest version of a published table's Iceberg metadata, as readers that find a table by
/// its directory look for it.
pub fn iceberg_version_hint_key(table: &str) -> Result<ObjectKey, InvalidKey> {
    ObjectKey::new(format!(
        "{ICEBERG_PREFIX}{table}/metadata/version-hint.text"
    ))
}

/// The manifest list of snapshot `snapshot_id`.
pub fn iceberg_manifest_list_key(table: &str, snapshot_id: i64) -> Result<ObjectKey, InvalidKey> {
    ObjectKey::new(format!(
        "{ICEBERG_PREFIX}{table}/metadata/snap-{snapshot_id}.avro"
    ))
}

/// One session's Iceberg manifest of `content`, as of its manifest's `sequence`, whose rows are
/// those of compaction run `rows` (see [`iceberg_manifest_versions`]).
pub fn iceberg_manifest_key(
    table: &str,
    cluster: &ClusterName,
    session: &SessionName,
    (sequence, rows): (u64, u64),
    content: IcebergManifest,
) -> Result<ObjectKey, InvalidKey> {
    let content = match content {
        IcebergManifest::Data => "data",
        IcebergManifest::Deletes => "deletes",
    };
    ObjectKey::new(format!(
        "{ICEBERG_PREFIX}{table}/metadata/cluster={cluster}/session={session}/{sequence}-{rows}-{content}.avro"
    ))
}

/// The `(sequence, rows)` an [`iceberg_manifest_key`] (or its URI) was named by.
pub fn iceberg_manifest_versions(path: &str) -> Option<(u64, u64)> {
    let name = path.rsplit('/').next()?;
    let mut parts = name.split('-');
    let sequence = parts.next()?.parse().ok()?;
    let rows = parts.next()?.parse().ok()?;
    Some((sequence, rows))
}

/// The position-delete file of data file `data_file` (its name) in a session as of its
/// manifest's `sequence`.
pub fn iceberg_deletes_key(
    table: &str,
    cluster: &ClusterName,
    session: &SessionName,
    sequence: u64,
    data_file: &str,
) -> Result<ObjectKey, InvalidKey> {
    ObjectKey::new(format!(
        "{}{data_file}",
        iceberg_deletes_folder(table, cluster, session, sequence)
    ))
}

/// The folder of a session's position-delete files as of its manifest's `sequence`, ending in
/// `/`.
pub fn iceberg_deletes_folder(
    table: &str,
    cluster: &ClusterName,
    session: &SessionName,
    sequence: u64,
) -> String {
    format!("{ICEBERG_PREFIX}{table}/deletes/cluster={cluster}/session={session}/{sequence}/")
}

/// The record of the files version `version` of a published table stopped naming.
pub fn iceberg_retired_key(table: &str, version: u64) -> Result<ObjectKey, InvalidKey> {
    ObjectKey::new(format!("{ICEBERG_PREFIX}{table}/retired/v{version}.json"))
}

/// Where a published table's records of retired files are.
pub fn iceberg_retired_prefix(table: &str) -> String {
    format!("{ICEBERG_PREFIX}{table}/retired/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metadata_version_is_read_back_from_its_key_or_uri_alone()
    -> Result<(), Box<dyn std::error::Error>> {
        let key = iceberg_metadata_key("jobs", 12)?;
        assert_eq!(iceberg_metadata_version("jobs", key.as_str()), Some(12));
        let uri = format!("s3://bucket/prefix/{}", key.as_str());
        assert_eq!(iceberg_metadata_version("jobs", &uri), Some(12));
        for other in [
            "s3://b/iceberg/jobs/metadata/00012-6f2c0e0a.metadata.json",
            "s3://b/iceberg/actors/metadata/v12.metadata.json",
            "s3://b/iceberg/jobs/metadata/v.metadata.json",
            "s3://b/iceberg/jobs/metadata/v+1.metadata.json",
            "s3://b/iceberg/jobs/data/v3.metadata.json",
        ] {
            assert_eq!(iceberg_metadata_version("jobs", other), None, "{other}");
        }
        Ok(())
    }

    #[test]
    fn a_nodes_logs_live_under_one_prefix() -> Result<(), Box<dyn std::error::Error>> {
        let node = NodeLogs {
            cluster: ClusterName::new("c")?,
            session: SessionName::new("session_2026-11-22_06-14-46_050039_15318")?,
            node_id: NodeId::new(&"0a".repeat(28))?,
        };
        let prefix = format!(
            "logs/c/session_2026-11-22_06-14-46_050039_15318/{}/",
            "0a".repeat(28)
        );
        assert_eq!(node.index_key()?.as_str(), format!("{prefix}index.json"));
        let segment = node.segment_key(Ulid::nil())?;
        assert_eq!(
            segment.as_str(),
            format!("{prefix}segments/00000000000000000000000000.gz")
        );
        let file = node.file(LogFileName::new("worker-ab-01000000-77.out")?);
        assert_eq!(file.node(), node);
        Ok(())
    }

    #[test]
    fn log_names_are_single_safe_segments() {
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "session_a/b",
            "sp ace",
            &"s".repeat(129),
        ] {
            assert!(SessionName::new(bad).is_err(), "{bad:?}");
        }
        for bad in ["", &"0A".repeat(28), &"0".repeat(55), &"g".repeat(56)] {
            assert!(NodeId::new(bad).is_err(), "{bad:?}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "sp ace", &"x".repeat(256)] {
            assert!(LogFileName::new(bad).is_err(), "{bad:?}");
        }
        assert!(LogFileName::new("raylet.out").is_ok());
    }

    #[test]
    fn table_keys_name_their_session_and_parse_back() -> Result<(), Box<dyn std::error::Error>> {
        let cluster = ClusterName::new("prod-1")?;
        let session = SessionName::new("session_2026-11-22_06-11-29_227665_10899")?;
        let id = Ulid::from_parts(1_795_328_094_627, 1);
        let manifest = manifest_key(&cluster, &session)?;
        assert_eq!(
            manifest.as_str(),
            "tables/manifests/cluster=prod-1/session=session_2026-11-22_06-11-29_227665_10899.json"
        );
        assert_eq!(
            manifest_session(&manifest),
            Some((cluster.clone(), session.clone()))
        );
        assert!(manifest_session(&single_catalog_key()?).is_none());
        assert!(manifest_session(&cluster_list_key()?).is_none());
        let catalog = cluster_catalog_key(&cluster)?;
        assert_eq!(catalog.as_str(), "tables/catalog/cluster=prod-1.json");
        assert!(manifest_session(&catalog).is_none());
        assert_ne!(catalog, cluster_list_key()?);
        let jobs = Table::Entity(EntityKind::Jobs);
        assert_eq!(
            table_file_key(jobs, &cluster, &session, TableFile::Whole, id)?.as_str(),
            format!("tables/jobs/cluster=prod-1/session={session}/jobs-{id}.parquet")
        );
        let delta = table_file_key(
            Table::TaskAttempts,
            &cluster,
            &session,
            TableFile::Delta,
            id,
        )?;
        assert!(
            delta
                .as_str()
                .starts_with(&table_prefix(Table::TaskAttempts, &cluster, &session))
        );
        assert!(delta.as_str().ends_with(&format!("/delta-{id}.parquet")));
        Ok(())
    }

    #[test]
    fn cluster_names_are_single_safe_segments() {
        for bad in ["", ".hidden", "a/b", "..", "spa ce", "ü", &"x".repeat(65)] {
            assert!(ClusterName::new(bad).is_err(), "{bad:?}");
        }
        assert!(ClusterName::new(&"x".repeat(64)).is_ok());
    }
}
