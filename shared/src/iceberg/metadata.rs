//! An Iceberg table's metadata document (format version 2): what [`super::sync`] reads of the
//! current version, and each new version with one more snapshot. Keys this build does not
//! write are kept as they were read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::schema::{LAST_PARTITION_ID, TableSchema};

/// The summary key every snapshot the sync commits carries: a snapshot without it was
/// committed by something else.
pub const PRODUCER_KEY: &str = "afterglow.producer";

/// How long snapshots are kept for time travel and for queries that started before a newer
/// one (the current one always is).
pub const SNAPSHOT_RETENTION_MS: i64 = 24 * 60 * 60 * 1000;

/// How long a file our manifests no longer name (a fold's inputs) is kept while the tables are
/// published: until the last kept snapshot naming it has expired (committed at most one sweep
/// of the catalog function after the fold, and kept [`SNAPSHOT_RETENTION_MS`]), and the
/// longest query that read from one of those snapshots has finished.
pub const RETIRED_FILE_GRACE: std::time::Duration = std::time::Duration::from_secs(
    SNAPSHOT_RETENTION_MS.unsigned_abs() / 1000 + SWEEP_SECS + LONGEST_QUERY_SECS,
);

/// The catalog function's sweep interval (the template's `Sweep` schedule).
const SWEEP_SECS: u64 = 60 * 60;

/// The longest query of the tables expected to be running (Athena stops DML at 30 minutes by
/// default).
const LONGEST_QUERY_SECS: u64 = 60 * 60;

/// Previous metadata versions the log keeps.
const METADATA_LOG_LENGTH: usize = 100;

/// One snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Snapshot {
    /// Its id.
    pub snapshot_id: i64,
    /// The snapshot it follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_snapshot_id: Option<i64>,
    /// Its sequence number.
    pub sequence_number: i64,
    /// When it was committed (ms since the epoch).
    pub timestamp_ms: i64,
    /// Its manifest list's URI.
    pub manifest_list: String,
    /// Its summary (`operation` and counts).
    pub summary: BTreeMap<String, String>,
    /// The schema it was written with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_id: Option<i32>,
}

/// The table metadata document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TableMetadata {
    /// Always 2.
    pub format_version: u32,
    /// The table's identity.
    pub table_uuid: String,
    /// The table's location.
    pub location: String,
    /// The newest snapshot's sequence number.
    pub last_sequence_number: i64,
    /// When this version was written.
    pub last_updated_ms: i64,
    /// The highest field id assigned.
    pub last_column_id: i32,
    /// The schemas.
    pub schemas: Vec<Value>,
    /// The current schema.
    pub current_schema_id: i32,
    /// The partition specs.
    pub partition_specs: Vec<Value>,
    /// The current partition spec.
    pub default_spec_id: i32,
    /// The highest partition field id assigned.
    pub last_partition_id: i32,
    /// Table properties (the name mapping among them).
    pub properties: BTreeMap<String, String>,
    /// The current snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_snapshot_id: Option<i64>,
    /// Snapshots kept.
    pub snapshots: Vec<Snapshot>,
    /// When each snapshot became current.
    #[serde(default)]
    pub snapshot_log: Vec<Value>,
    /// The previous metadata versions.
    #[serde(default)]
    pub metadata_log: Vec<Value>,
    /// The sort orders (the tables are not sorted as Iceberg knows sorts).
    pub sort_orders: Vec<Value>,
    /// The current sort order.
    pub default_sort_order_id: i32,
    /// Branches and tags.
    #[serde(default)]
    pub refs: BTreeMap<String, Value>,
    /// Whatever else the version read holds.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

impl TableMetadata {
    /// A table without snapshots at `location`, identified by `uuid`.
    pub fn new(location: String, uuid: String, schema: &TableSchema, now_ms: i64) -> Self {
        Self {
            format_version: 2,
            table_uuid: uuid,
            location,
            last_sequence_number: 0,
            last_updated_ms: now_ms,
            last_column_id: schema.last_column_id,
            schemas: vec![schema.schema.clone()],
            current_schema_id: 0,
            partition_specs: vec![json!({"spec-id": 0, "fields": schema.partition_fields})],
            default_spec_id: 0,
            last_partition_id: LAST_PARTITION_ID,
            properties: BTreeMap::from([
                (
                    "schema.name-mapping.default".to_owned(),
                    schema.name_mapping.clone(),
                ),
                ("format-version".to_owned(), "2".to_owned()),
            ]),
            current_snapshot_id: None,
            snapshots: Vec::new(),
            snapshot_log: Vec::new(),
            metadata_log: Vec::new(),
            sort_orders: vec![json!({"order-id": 0, "fields": []})],
            default_sort_order_id: 0,
            refs: BTreeMap::new(),
            other: BTreeMap::new(),
        }
    }

    /// The current snapshot.
    pub fn current(&self) -> Option<&Snapshot> {
        let id = self.current_snapshot_id.filter(|id| *id >= 0)?;
        self.snapshots
            .iter()
            .find(|snapshot| snapshot.snapshot_id == id)
    }

    /// The version after this one (read from `read_from`), with `snapshot` current; snapshots
    /// older than [`SNAPSHOT_RETENTION_MS`] are expired from it.
    pub fn with_snapshot(&self, read_from: Option<String>, snapshot: Snapshot) -> Self {
        let mut next = self.clone();
        let now_ms = snapshot.timestamp_ms;
        next.last_updated_ms = now_ms;
        next.last_sequence_number = snapshot.sequence_number;
        next.current_snapshot_id = Some(snapshot.snapshot_id);
        next.refs.insert(
            "main".to_owned(),
            json!({"snapshot-id": snapshot.snapshot_id, "type": "branch"}),
        );
        next.snapshot_log.push(json!({
            "timestamp-ms": now_ms,
            "snapshot-id": snapshot.snapshot_id,
        }));
        if let Some(previous) = read_from {
            next.metadata_log.push(json!({
                "timestamp-ms": self.last_updated_ms,
                "metadata-file": previous,
            }));
        }
        next.snapshots.push(snapshot);
        let cutoff = now_ms.saturating_sub(SNAPSHOT_RETENTION_MS);
        next.snapshots.retain(|kept| {
            kept.timestamp_ms >= cutoff || Some(kept.snapshot_id) == next.current_snapshot_id
        });
        let kept: Vec<i64> = next.snapshots.iter().map(|kept| kept.snapshot_id).collect();
        next.snapshot_log.retain(|entry| {
            entry["snapshot-id"]
                .as_i64()
                .is_some_and(|id| kept.contains(&id))
        });
        let excess = next.metadata_log.len().saturating_sub(METADATA_LOG_LENGTH);
        next.metadata_log.drain(..excess);
        next
    }

    /// The files this version names and `next` no longer does: the manifest lists of the
    /// snapshots `next` expired, and the metadata files its log let go (as URIs).
    pub(super) fn dropped_by(&self, next: &TableMetadata) -> Vec<String> {
        let lists = self
            .snapshots
            .iter()
            .filter(|snapshot| {
                !next
                    .snapshots
                    .iter()
                    .any(|kept| kept.snapshot_id == snapshot.snapshot_id)
            })
            .map(|snapshot| snapshot.manifest_list.clone());
        let logged = |log: &[Value]| -> Vec<String> {
            log.iter()
                .filter_map(|entry| entry["metadata-file"].as_str().map(str::to_owned))
                .collect()
        };
        let still_logged = logged(&next.metadata_log);
        let versions = logged(&self.metadata_log)
            .into_iter()
            .filter(|file| !still_logged.contains(file));
        lists.chain(versions).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tables::published::published_tables;

    fn snapshot(id: i64, timestamp_ms: i64) -> Snapshot {
        Snapshot {
            snapshot_id: id,
            parent_snapshot_id: None,
            sequence_number: id,
            timestamp_ms,
            manifest_list: format!("/t/metadata/snap-{id}.avro"),
            summary: BTreeMap::new(),
            schema_id: Some(0),
        }
    }

    /// A snapshot past the retention takes its manifest list with it, and a version past the
    /// log's length its metadata file; what is kept is not dropped.
    #[test]
    fn a_version_drops_the_expired_snapshots_lists_and_the_versions_out_of_its_log() {
        let schema = TableSchema::of(&published_tables()[0]).expect("publishable");
        let day = SNAPSHOT_RETENTION_MS;
        let mut metadata = TableMetadata::new("/t".into(), "u".into(), &schema, 0);
        for version in 1..=METADATA_LOG_LENGTH as i64 + 1 {
            metadata = metadata.with_snapshot(
                Some(format!("/t/metadata/v{version}.metadata.json")),
                snapshot(version, version),
            );
        }
        let last = METADATA_LOG_LENGTH as i64 + 1;
        let next = metadata.with_snapshot(
            Some(format!("/t/metadata/v{}.metadata.json", last + 1)),
            snapshot(last + 1, day + 2),
        );
        // At `day + 2` snapshot 1 is older than a day; the log, full at v2..v101, lets v2 go
        // (v1 went at the version before).
        assert_eq!(
            metadata.dropped_by(&next),
            ["/t/metadata/snap-1.avro", "/t/metadata/v2.metadata.json"]
        );
        assert!(next.dropped_by(&next).is_empty());
    }
}
