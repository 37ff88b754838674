//! The snapshot producer: one published table's Iceberg metadata made to reflect our manifests.
//!
//! A sync reads the catalog, the manifests of the sessions that may have moved (every one, or
//! those the catalog says moved: [`super::sessions`]), and the current snapshot's manifest
//! list, which names each published session's manifests by the version of our manifest they
//! reflect ([`keys::iceberg_manifest_versions`]). A session whose manifest moved on gets new
//! manifests (its data files, and one position-delete file per data file with superseded
//! rows); the others' are carried forward as they are. Nothing changed, nothing is committed,
//! so syncing again is harmless, and a sync that was missed is made up by the next. A session
//! is never taken back to an older version (a concurrent sync may have read a newer manifest)
//! and leaves only once its manifest is gone. The new version of the metadata is created only
//! if absent, so of two concurrent commits one loses and redoes its work.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use ulid::Ulid;

use super::IcebergError;
use super::avro::{self, Content, ListedManifest, ManifestFile, Partition, TableShape};
use super::column_stats::{self, ColumnStats};
use super::metadata::{PRODUCER_KEY, Snapshot, TableMetadata};
use super::position_deletes;
use super::retired::{self, retired_by};
use super::schema::TableSchema;
use super::sessions::{Reads, Session, Sessions, Standing};
use crate::keys::{self, ClusterName, IcebergManifest, SessionName};
use crate::storage::{ObjectKey, PutMode, Storage, StorageError};
use crate::tables::manifest::{self, DataFile};
use crate::tables::published::{PublishedTable, Source, published_tables};

/// Commits that lose a race before a sync gives up.
const MAX_RACES: usize = 20;

/// Sessions whose changes a snapshot's summary names.
const SUMMARY_SESSIONS: usize = 100;

/// What one sync of one table did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// The table.
    pub table: &'static str,
    /// The metadata version committed; `None` when the current one already reflected every
    /// session.
    pub version: Option<u64>,
    /// The table's current metadata version after the sync: the one committed, or the one
    /// that already reflected every session.
    pub current: u64,
    /// Sessions the table holds.
    pub sessions: usize,
    /// Sessions whose manifests were written.
    pub changed: usize,
    /// Sessions that left the table.
    pub removed: usize,
    /// Sessions that could not be published yet, with why (they keep what was published of them
    /// before).
    pub deferred: Vec<String>,
}

/// What the current snapshot publishes of one session.
pub(super) struct PublishedSession {
    /// The versions of our manifest its manifests reflect (as [`Session::versions`]).
    pub(super) versions: (u64, u64),
    /// Its manifests in the current snapshot's manifest list.
    pub(super) manifests: Vec<ListedManifest>,
}

/// Syncs every published table, in order, reading every session's manifest.
pub async fn sync_tables(
    storage: &Arc<dyn Storage>,
    now_ms: i64,
) -> Result<Vec<Published>, IcebergError> {
    let sessions = Sessions::list(storage, Reads::Every).await?;
    let mut published = Vec::new();
    for table in published_tables() {
        published.push(sync_with(storage, &table, &sessions, now_ms).await?);
    }
    Ok(published)
}

/// Makes `table`'s Iceberg metadata reflect every session's manifest.
pub async fn sync_table(
    storage: &Arc<dyn Storage>,
    table: &PublishedTable,
    now_ms: i64,
) -> Result<Published, IcebergError> {
    let sessions = Sessions::list(storage, Reads::Every).await?;
    sync_with(storage, table, &sessions, now_ms).await
}

/// Makes `table`'s Iceberg metadata reflect `sessions` (every session the catalog lists).
#[tracing::instrument(name = "iceberg_sync", skip_all, fields(table = table.name))]
pub(super) async fn sync_with(
    storage: &Arc<dyn Storage>,
    table: &PublishedTable,
    sessions: &Sessions,
    now_ms: i64,
) -> Result<Published, IcebergError> {
    let schema = TableSchema::of(table)?;
    let schema_text = schema.schema.to_string();
    let partition_text = schema.partition_fields.to_string();
    let shape = TableShape {
        schema: &schema_text,
        partition_fields: &partition_text,
    };
    for _ in 0..MAX_RACES {
        let current = load_current(storage, table.name).await?;
        let published = match &current {
            Some((_, metadata)) => published_sessions(storage, table.name, metadata).await?,
            None => BTreeMap::new(),
        };
        let mut outcome = Published {
            table: table.name,
            version: None,
            current: current.as_ref().map_or(0, |(version, _)| *version),
            sessions: 0,
            changed: 0,
            removed: 0,
            deferred: Vec::new(),
        };
        let mut listed: Vec<ListedManifest> = Vec::new();
        let mut fresh: Vec<(Partition, Vec<ListedManifest>)> = Vec::new();
        let mut changes = Changes::default();
        let mut seen = BTreeSet::new();
        for standing in sessions.against(storage, table, &published).await? {
            let session = match standing {
                Standing::Read(session) => session,
                Standing::Current(partition) => {
                    if let Some(before) = published.get(&partition) {
                        listed.extend(before.manifests.iter().cloned());
                        outcome.sessions += usize::from(!before.manifests.is_empty());
                    }
                    seen.insert(partition);
                    continue;
                }
            };
            let session = &*session;
            let partition = session.partition();
            seen.insert(partition.clone());
            let before = published.get(&partition);
            if let Some(before) = before
                && before.versions.0 >= session.versions().0
            {
                listed.extend(before.manifests.iter().cloned());
                outcome.sessions += usize::from(!before.manifests.is_empty());
                continue;
            }
            match session_manifests(storage, table, shape, session).await? {
                // A session with no rows in this table, never published in it: nothing to do.
                Ok(manifests) if manifests.is_empty() && before.is_none() => {}
                Ok(manifests) => {
                    changes.note(before.map(|before| before.versions), session, &manifests);
                    outcome.changed += 1;
                    outcome.sessions += usize::from(!manifests.is_empty());
                    fresh.push((partition, manifests));
                }
                Err(why) => {
                    outcome.deferred.push(format!(
                        "{}/{}: {why}",
                        partition.cluster, partition.session
                    ));
                    if let Some(before) = before {
                        listed.extend(before.manifests.iter().cloned());
                        outcome.sessions += 1;
                    }
                }
            }
        }
        for (partition, before) in &published {
            if seen.contains(partition) {
                continue;
            }
            if still_stored(storage, table, partition).await? {
                listed.extend(before.manifests.iter().cloned());
                outcome.sessions += 1;
            } else {
                changes.removed = true;
                outcome.removed += 1;
            }
        }
        if fresh.is_empty() && outcome.removed == 0 && current.is_some() {
            return Ok(outcome);
        }
        let (version, metadata) = match &current {
            Some((version, metadata)) => (*version, metadata.clone()),
            None => (0, new_metadata(&**storage, table.name, &schema, now_ms)?),
        };
        let parent = metadata.current().map(|snapshot| snapshot.snapshot_id);
        let snapshot_id = new_snapshot_id();
        let sequence = metadata.last_sequence_number + 1;
        for (_, manifests) in &mut fresh {
            for manifest in manifests.iter_mut() {
                manifest.sequence_number = sequence;
                manifest.added_snapshot_id = snapshot_id;
            }
        }
        let changed_sessions: Vec<String> = fresh
            .iter()
            .take(SUMMARY_SESSIONS)
            .map(|(partition, _)| format!("{}/{}", partition.cluster, partition.session))
            .collect();
        listed.extend(fresh.into_iter().flat_map(|(_, manifests)| manifests));
        listed.sort_by(|a, b| (&a.partition, &a.path).cmp(&(&b.partition, &b.path)));
        let list_key = keys::iceberg_manifest_list_key(table.name, snapshot_id)?;
        let list = avro::write_manifest_list(snapshot_id, parent, sequence, &listed)?;
        storage
            .put(&list_key, Bytes::from(list), PutMode::Overwrite)
            .await?;
        let summary = BTreeMap::from([
            ("operation".to_owned(), changes.operation().to_owned()),
            (PRODUCER_KEY.to_owned(), "afterglow".to_owned()),
            (
                "afterglow.sessions".to_owned(),
                outcome.sessions.to_string(),
            ),
            (
                "afterglow.changed-sessions".to_owned(),
                changed_sessions.join(","),
            ),
            (
                "afterglow.removed-sessions".to_owned(),
                outcome.removed.to_string(),
            ),
        ]);
        let snapshot = Snapshot {
            snapshot_id,
            parent_snapshot_id: parent,
            sequence_number: sequence,
            timestamp_ms: now_ms,
            manifest_list: storage.uri(&list_key),
            summary,
            schema_id: Some(0),
        };
        let read_from = (version > 0)
            .then(|| keys::iceberg_metadata_key(table.name, version))
            .transpose()?
            .map(|key| storage.uri(&key));
        let next = metadata.with_snapshot(read_from, snapshot);
        let retired = retired_by(storage, table.name, &published, &listed, &metadata, &next);
        let next_key = keys::iceberg_metadata_key(table.name, version + 1)?;
        let body = serde_json::to_vec_pretty(&next)?;
        match storage
            .put(&next_key, Bytes::from(body), PutMode::Create)
            .await
        {
            Ok(_) => {}
            Err(StorageError::Precondition { .. } | StorageError::Conflict { .. }) => {
                tracing::info!(
                    table = table.name,
                    version = version + 1,
                    "lost a commit race; redoing"
                );
                continue;
            }
            Err(err) => return Err(err.into()),
        }
        // Readers that find the table by its directory read the hint; a hint left behind (a
        // crash just here) only makes them probe for the newer versions.
        storage
            .put(
                &keys::iceberg_version_hint_key(table.name)?,
                Bytes::from((version + 1).to_string()),
                PutMode::Overwrite,
            )
            .await?;
        if let Err(err) = retired::record(storage, table.name, version + 1, &retired).await {
            tracing::warn!(table = table.name, error = %err, "the files this commit retired are not recorded; they stay");
        }
        outcome.version = Some(version + 1);
        outcome.current = version + 1;
        tracing::info!(
            table = table.name,
            version = version + 1,
            sessions = outcome.sessions,
            changed = outcome.changed,
            removed = outcome.removed,
            "published"
        );
        return Ok(outcome);
    }
    Err(IcebergError::Contended {
        table: table.name.to_owned(),
        races: MAX_RACES,
    })
}

/// What kind of change a snapshot makes (its summary's `operation`).
#[derive(Default)]
struct Changes {
    /// A session's rows changed, or a new session has deletes.
    rows_replaced: bool,
    /// A new session came.
    added: bool,
    /// A session's files were rewritten without changing its rows (a fold).
    rewritten: bool,
    /// A session left.
    removed: bool,
}

impl Changes {
    fn note(
        &mut self,
        before: Option<(u64, u64)>,
        session: &Session,
        manifests: &[ListedManifest],
    ) {
        let has_deletes = manifests
            .iter()
            .any(|manifest| manifest.content == Content::PositionDeletes);
        match before {
            None if has_deletes => self.rows_replaced = true,
            None => self.added = true,
            Some((_, rows)) if rows == session.versions().1 => self.rewritten = true,
            Some(_) => self.rows_replaced = true,
        }
    }

    fn operation(&self) -> &'static str {
        match (self.rows_replaced, self.added, self.rewritten, self.removed) {
            (false, true, false, false) => "append",
            (false, false, true, false) => "replace",
            (false, false, false, true) => "delete",
            _ => "overwrite",
        }
    }
}

/// True when a session's manifest still names files of `table` (a session missing from the
/// catalog read may have come since). An expired session's manifest stays, emptied.
async fn still_stored(
    storage: &Arc<dyn Storage>,
    table: &PublishedTable,
    partition: &Partition,
) -> Result<bool, IcebergError> {
    let (Ok(cluster), Ok(session)) = (
        ClusterName::new(&partition.cluster),
        SessionName::new(&partition.session),
    ) else {
        return Ok(false);
    };
    let key = keys::manifest_key(&cluster, &session)?;
    let stored = manifest::load(&**storage, &key).await?;
    let holds_rows = match table.source {
        Source::Attempts => stored.manifest.task_attempts.all().next().is_some(),
        Source::Entities(kind) => stored.manifest.entities.contains_key(kind.table()),
    };
    Ok(stored.etag.is_some() && holds_rows)
}

/// The newest metadata version and its document, if the table was ever published.
async fn load_current(
    storage: &Arc<dyn Storage>,
    table: &str,
) -> Result<Option<(u64, TableMetadata)>, IcebergError> {
    let mut version = match storage.get(&keys::iceberg_version_hint_key(table)?).await {
        Ok(hint) => std::str::from_utf8(&hint.body)
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .unwrap_or(0),
        Err(StorageError::NotFound { .. }) => 0,
        Err(err) => return Err(err.into()),
    };
    let mut newest = None;
    loop {
        match storage
            .get(&keys::iceberg_metadata_key(table, version + 1)?)
            .await
        {
            Ok(found) => {
                version += 1;
                newest = Some(found.body);
            }
            Err(StorageError::NotFound { .. }) => break,
            Err(err) => return Err(err.into()),
        }
    }
    let body = match newest {
        Some(body) => body,
        None if version == 0 => return Ok(None),
        None => {
            storage
                .get(&keys::iceberg_metadata_key(table, version)?)
                .await?
                .body
        }
    };
    Ok(Some((version, serde_json::from_slice(&body)?)))
}

/// What `metadata`'s current snapshot publishes, session by session.
async fn published_sessions(
    storage: &Arc<dyn Storage>,
    table: &str,
    metadata: &TableMetadata,
) -> Result<BTreeMap<Partition, PublishedSession>, IcebergError> {
    let Some(snapshot) = metadata.current() else {
        return Ok(BTreeMap::new());
    };
    if !snapshot.summary.contains_key(PRODUCER_KEY) {
        return Err(IcebergError::Foreign(format!(
            "the current snapshot of table {table} ({}, {}) was committed by another writer",
            snapshot.snapshot_id,
            snapshot
                .summary
                .get("operation")
                .map_or("no operation", String::as_str)
        )));
    }
    let list_key = key_of(storage, &snapshot.manifest_list)?;
    let list = storage.get(&list_key).await?;
    let mut sessions: BTreeMap<Partition, PublishedSession> = BTreeMap::new();
    for manifest in avro::read_manifest_list(&list.body)? {
        let versions = keys::iceberg_manifest_versions(&manifest.path).ok_or_else(|| {
            IcebergError::Foreign(format!(
                "table {table} lists manifest {}, which Afterglow did not write",
                manifest.path
            ))
        })?;
        let entry = sessions
            .entry(manifest.partition.clone())
            .or_insert_with(|| PublishedSession {
                versions,
                manifests: Vec::new(),
            });
        entry.manifests.push(manifest);
    }
    Ok(sessions)
}

/// The key of an object of ours named by its URI.
pub(super) fn key_of(storage: &Arc<dyn Storage>, uri: &str) -> Result<ObjectKey, IcebergError> {
    let root = storage.uri(&ObjectKey::new("x")?);
    let prefix = root.strip_suffix('x').unwrap_or(&root);
    let key = uri
        .strip_prefix(prefix)
        .ok_or_else(|| IcebergError::Foreign(format!("{uri} is outside the store ({prefix})")))?;
    Ok(ObjectKey::new(key)?)
}

/// The manifests that publish `session` of `table` (none when it has no rows there), or why it
/// cannot be published as it is.
async fn session_manifests(
    storage: &Arc<dyn Storage>,
    table: &PublishedTable,
    shape: TableShape<'_>,
    session: &Session,
) -> Result<Result<Vec<ListedManifest>, String>, IcebergError> {
    let versions = session.versions();
    let files: Vec<&DataFile> = match table.source {
        Source::Attempts => {
            let files = &session.manifest.task_attempts;
            if !files.has_deletion_vectors() {
                return Ok(Err(
                    "a delta without a deletion vector (an older build's); published after its next fold".into(),
                ));
            }
            files.all().collect()
        }
        Source::Entities(kind) => session
            .manifest
            .entities
            .get(kind.table())
            .into_iter()
            .collect(),
    };
    if files.is_empty() {
        return Ok(Ok(Vec::new()));
    }
    let located: Vec<(ObjectKey, u64)> = files
        .iter()
        .map(|file| (file.key.clone(), file.bytes))
        .collect();
    let stats = column_stats::read_column_stats(storage, &located, table).await?;
    let data: Vec<ManifestFile> = files
        .iter()
        .zip(stats)
        .map(|(file, stats)| ManifestFile {
            path: storage.uri(&file.key),
            records: file.rows,
            bytes: file.bytes,
            referenced_data_file: None,
            stats,
        })
        .collect();
    let mut manifests = vec![
        write_session_manifest(storage, table, shape, session, IcebergManifest::Data, &data)
            .await?,
    ];
    let mut superseded: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
    for file in &files {
        if let Some(vector) = file
            .deletes
            .as_ref()
            .and_then(|deletes| deletes.key.as_ref())
        {
            let stored = storage.get(vector).await?;
            position_deletes::read_vector(stored.body, &mut superseded)?;
        }
    }
    let mut deletes = Vec::new();
    for (index, mut positions) in superseded {
        let target = files.get(index).ok_or_else(|| {
            IcebergError::Unreadable(format!(
                "a deletion vector of {}/{} names file {index} of {}",
                session.cluster,
                session.session,
                files.len()
            ))
        })?;
        let target_uri = storage.uri(&target.key);
        let name = target
            .key
            .as_str()
            .rsplit('/')
            .next()
            .unwrap_or("file.parquet");
        let key = keys::iceberg_deletes_key(
            table.name,
            &session.cluster,
            &session.session,
            versions.0,
            name,
        )?;
        let body = position_deletes::write(&target_uri, &mut positions)?;
        let bytes = body.len() as u64;
        storage
            .put(&key, Bytes::from(body), PutMode::Overwrite)
            .await?;
        deletes.push(ManifestFile {
            path: storage.uri(&key),
            records: positions.len() as u64,
            bytes,
            referenced_data_file: Some(target_uri),
            stats: ColumnStats::default(),
        });
    }
    if !deletes.is_empty() {
        manifests.push(
            write_session_manifest(
                storage,
                table,
                shape,
                session,
                IcebergManifest::Deletes,
                &deletes,
            )
            .await?,
        );
    }
    Ok(Ok(manifests))
}

/// Writes one manifest of `session`, returning it as the manifest list will name it (its
/// sequence number and snapshot set at commit).
async fn write_session_manifest(
    storage: &Arc<dyn Storage>,
    table: &PublishedTable,
    shape: TableShape<'_>,
    session: &Session,
    kind: IcebergManifest,
    files: &[ManifestFile],
) -> Result<ListedManifest, IcebergError> {
    let content = match kind {
        IcebergManifest::Data => Content::Data,
        IcebergManifest::Deletes => Content::PositionDeletes,
    };
    let partition = session.partition();
    let body = avro::write_manifest(shape, content, &partition, files)?;
    let length = body.len() as u64;
    let key = keys::iceberg_manifest_key(
        table.name,
        &session.cluster,
        &session.session,
        session.versions(),
        kind,
    )?;
    storage
        .put(&key, Bytes::from(body), PutMode::Overwrite)
        .await?;
    Ok(ListedManifest {
        path: storage.uri(&key),
        length,
        content,
        sequence_number: 0,
        added_snapshot_id: 0,
        files: files.len() as u64,
        rows: files.iter().map(|file| file.records).sum(),
        partition,
    })
}

/// A new table's metadata, with a fresh identity.
fn new_metadata(
    storage: &dyn Storage,
    table: &str,
    schema: &TableSchema,
    now_ms: i64,
) -> Result<TableMetadata, IcebergError> {
    let location = storage.uri(&keys::iceberg_table_key(table)?);
    Ok(TableMetadata::new(location, new_uuid(), schema, now_ms))
}

/// A random (version 4) UUID.
fn new_uuid() -> String {
    let mut bytes = Ulid::new().0.to_be_bytes();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// A random positive snapshot id.
fn new_snapshot_id() -> i64 {
    let random = Ulid::new().random();
    i64::try_from(random & u128::from(i64::MAX.unsigned_abs()))
        .unwrap_or(1)
        .max(1)
}
