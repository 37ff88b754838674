//! Iceberg's Avro files: a session's manifests (its data files, or its position-delete files)
//! and a snapshot's manifest list, written with the v2 schemas of the Iceberg spec
//! (`manifest_entry.avsc`, with this table's partition tuple, and `manifest_file.avsc`), whose
//! `field-id`s are what readers resolve fields by. A manifest list is also read back: it is
//! what the previous snapshot published, session by session.

use std::collections::BTreeMap;

use apache_avro::types::Value;
use apache_avro::{Reader, Schema, Writer};

use super::IcebergError;
use super::column_stats::ColumnStats;

/// `manifest_entry`, version 2: the partition tuple is `(cluster, session_name)`.
const MANIFEST_ENTRY: &str = include_str!("manifest_entry.avsc");

/// `manifest_file` (one manifest list entry), version 2.
const MANIFEST_FILE: &str = include_str!("manifest_file.avsc");

/// What a manifest's files hold (Iceberg's `content` of a manifest and of a file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Content {
    /// Rows.
    Data,
    /// Positions of rows deleted from data files.
    PositionDeletes,
}

impl Content {
    /// The manifest's `content`, in a manifest list and in an Avro file's metadata.
    fn manifest_code(self) -> i32 {
        match self {
            Self::Data => 0,
            Self::PositionDeletes => 1,
        }
    }

    /// A file's `content` in a manifest entry.
    fn file_code(self) -> i32 {
        match self {
            Self::Data => 0,
            Self::PositionDeletes => 1,
        }
    }

    fn from_manifest_code(code: i32) -> Option<Self> {
        match code {
            0 => Some(Self::Data),
            1 => Some(Self::PositionDeletes),
            _ => None,
        }
    }
}

/// The partition one session's files are in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Partition {
    /// `cluster`.
    pub(super) cluster: String,
    /// `session_name`.
    pub(super) session: String,
}

/// One file a manifest registers, always as added (its sequence number and snapshot inherited
/// from the manifest list entry that first named the manifest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ManifestFile {
    /// Its URI.
    pub(super) path: String,
    /// Rows (data) or positions (deletes) in it.
    pub(super) records: u64,
    /// Its size.
    pub(super) bytes: u64,
    /// For a position-delete file: the one data file its positions are in.
    pub(super) referenced_data_file: Option<String>,
    /// Its columns' statistics (none for a position-delete file).
    pub(super) stats: ColumnStats,
}

/// What a table's metadata says of itself in each manifest (the spec's Avro file metadata).
#[derive(Clone, Copy, Debug)]
pub(super) struct TableShape<'a> {
    /// The schema, as JSON.
    pub(super) schema: &'a str,
    /// The partition spec's fields, as JSON.
    pub(super) partition_fields: &'a str,
}

/// A manifest of `files`, all in `partition`, holding `content`.
pub(super) fn write_manifest(
    shape: TableShape<'_>,
    content: Content,
    partition: &Partition,
    files: &[ManifestFile],
) -> Result<Vec<u8>, IcebergError> {
    let schema = Schema::parse_str(MANIFEST_ENTRY)?;
    let mut writer = Writer::new(&schema, Vec::new());
    let content_name = match content {
        Content::Data => "data",
        Content::PositionDeletes => "deletes",
    };
    for (key, value) in [
        ("schema", shape.schema),
        ("schema-id", "0"),
        ("partition-spec", shape.partition_fields),
        ("partition-spec-id", "0"),
        ("format-version", "2"),
        ("content", content_name),
    ] {
        writer.add_user_metadata(key.to_owned(), value)?;
    }
    for file in files {
        writer.append(entry(content, partition, file))?;
    }
    Ok(writer.into_inner()?)
}

fn entry(content: Content, partition: &Partition, file: &ManifestFile) -> Value {
    let long = |value: u64| Value::Long(i64::try_from(value).unwrap_or(i64::MAX));
    let stats = &file.stats;
    let counted = |count: &i64| Value::Long(*count);
    let bound = |value: &Vec<u8>| Value::Bytes(value.clone());
    let data_file = Value::Record(vec![
        ("content".into(), Value::Int(content.file_code())),
        ("file_path".into(), Value::String(file.path.clone())),
        ("file_format".into(), Value::String("PARQUET".into())),
        (
            "partition".into(),
            Value::Record(vec![
                (
                    "cluster".into(),
                    some(Value::String(partition.cluster.clone())),
                ),
                (
                    "session_name".into(),
                    some(Value::String(partition.session.clone())),
                ),
            ]),
        ),
        ("record_count".into(), long(file.records)),
        ("file_size_in_bytes".into(), long(file.bytes)),
        ("column_sizes".into(), map(&stats.column_sizes, counted)),
        ("value_counts".into(), map(&stats.value_counts, counted)),
        (
            "null_value_counts".into(),
            map(&stats.null_value_counts, counted),
        ),
        ("nan_value_counts".into(), null()),
        ("lower_bounds".into(), map(&stats.lower_bounds, bound)),
        ("upper_bounds".into(), map(&stats.upper_bounds, bound)),
        ("key_metadata".into(), null()),
        ("split_offsets".into(), null()),
        ("equality_ids".into(), null()),
        ("sort_order_id".into(), null()),
        (
            "referenced_data_file".into(),
            file.referenced_data_file
                .clone()
                .map_or_else(null, |path| some(Value::String(path))),
        ),
    ]);
    Value::Record(vec![
        // ADDED: the only status a manifest written once and carried forward needs.
        ("status".into(), Value::Int(1)),
        ("snapshot_id".into(), null()),
        ("sequence_number".into(), null()),
        ("file_sequence_number".into(), null()),
        ("data_file".into(), data_file),
    ])
}

/// One manifest as a manifest list names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ListedManifest {
    /// Its URI.
    pub(super) path: String,
    /// Its size.
    pub(super) length: u64,
    /// What its files hold.
    pub(super) content: Content,
    /// The sequence number of the snapshot that added it, which its files inherit.
    pub(super) sequence_number: i64,
    /// The snapshot that added it.
    pub(super) added_snapshot_id: i64,
    /// Files in it.
    pub(super) files: u64,
    /// Rows (or positions) in them.
    pub(super) rows: u64,
    /// The one partition its files are in.
    pub(super) partition: Partition,
}

/// A manifest list of `manifests`, for snapshot `snapshot_id` (sequence number `sequence`,
/// after `parent`).
pub(super) fn write_manifest_list(
    snapshot_id: i64,
    parent: Option<i64>,
    sequence: i64,
    manifests: &[ListedManifest],
) -> Result<Vec<u8>, IcebergError> {
    let schema = Schema::parse_str(MANIFEST_FILE)?;
    let mut writer = Writer::new(&schema, Vec::new());
    writer.add_user_metadata("snapshot-id".to_owned(), snapshot_id.to_string())?;
    writer.add_user_metadata(
        "parent-snapshot-id".to_owned(),
        parent.map_or_else(|| "null".to_owned(), |parent| parent.to_string()),
    )?;
    writer.add_user_metadata("sequence-number".to_owned(), sequence.to_string())?;
    writer.add_user_metadata("format-version".to_owned(), "2")?;
    for manifest in manifests {
        writer.append(listed(manifest))?;
    }
    Ok(writer.into_inner()?)
}

fn listed(manifest: &ListedManifest) -> Value {
    let long = |value: u64| Value::Long(i64::try_from(value).unwrap_or(i64::MAX));
    let int = |value: u64| Value::Int(i32::try_from(value).unwrap_or(i32::MAX));
    let bound = |text: &str| some(Value::Bytes(text.as_bytes().to_vec()));
    let field_summary = |text: &str| {
        Value::Record(vec![
            ("contains_null".into(), Value::Boolean(false)),
            ("contains_nan".into(), null()),
            ("lower_bound".into(), bound(text)),
            ("upper_bound".into(), bound(text)),
        ])
    };
    Value::Record(vec![
        ("manifest_path".into(), Value::String(manifest.path.clone())),
        ("manifest_length".into(), long(manifest.length)),
        ("partition_spec_id".into(), Value::Int(0)),
        (
            "content".into(),
            Value::Int(manifest.content.manifest_code()),
        ),
        (
            "sequence_number".into(),
            Value::Long(manifest.sequence_number),
        ),
        (
            "min_sequence_number".into(),
            Value::Long(manifest.sequence_number),
        ),
        (
            "added_snapshot_id".into(),
            Value::Long(manifest.added_snapshot_id),
        ),
        ("added_files_count".into(), int(manifest.files)),
        ("existing_files_count".into(), Value::Int(0)),
        ("deleted_files_count".into(), Value::Int(0)),
        ("added_rows_count".into(), long(manifest.rows)),
        ("existing_rows_count".into(), Value::Long(0)),
        ("deleted_rows_count".into(), Value::Long(0)),
        (
            "partitions".into(),
            some(Value::Array(vec![
                field_summary(&manifest.partition.cluster),
                field_summary(&manifest.partition.session),
            ])),
        ),
        ("key_metadata".into(), null()),
    ])
}

/// The manifests a manifest list (as [`write_manifest_list`] writes it) names.
pub(super) fn read_manifest_list(bytes: &[u8]) -> Result<Vec<ListedManifest>, IcebergError> {
    let reader = Reader::new(bytes)?;
    let mut manifests = Vec::new();
    for value in reader {
        manifests.push(listed_from(&value?).ok_or_else(|| {
            IcebergError::Foreign("a manifest list entry this build does not read".into())
        })?);
    }
    Ok(manifests)
}

fn listed_from(value: &Value) -> Option<ListedManifest> {
    let Value::Record(fields) = value else {
        return None;
    };
    let field = |name: &str| {
        fields
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| unwrapped(value))
    };
    let long = |name: &str| match field(name)? {
        Value::Long(value) => Some(*value),
        Value::Int(value) => Some(i64::from(*value)),
        _ => None,
    };
    let count = |name: &str| long(name).and_then(|value| u64::try_from(value).ok());
    let text = |value: &Value| match unwrapped(value) {
        Value::Bytes(bytes) => String::from_utf8(bytes.clone()).ok(),
        _ => None,
    };
    let Some(Value::Array(partitions)) = field("partitions") else {
        return None;
    };
    let lower: Vec<String> = partitions
        .iter()
        .filter_map(|summary| match summary {
            Value::Record(summary) => summary
                .iter()
                .find(|(name, _)| name == "lower_bound")
                .and_then(|(_, value)| text(value)),
            _ => None,
        })
        .collect();
    let [cluster, session] = <[String; 2]>::try_from(lower).ok()?;
    Some(ListedManifest {
        path: match field("manifest_path")? {
            Value::String(path) => path.clone(),
            _ => return None,
        },
        length: count("manifest_length")?,
        content: Content::from_manifest_code(i32::try_from(long("content")?).ok()?)?,
        sequence_number: long("sequence_number")?,
        added_snapshot_id: long("added_snapshot_id")?,
        files: count("added_files_count")?,
        rows: count("added_rows_count")?,
        partition: Partition { cluster, session },
    })
}

fn unwrapped(value: &Value) -> &Value {
    match value {
        Value::Union(_, inner) => inner,
        other => other,
    }
}

/// A map by field id, as Iceberg's Avro writes one (an array of key-value records); null when
/// empty, which says nothing of any column.
fn map<T>(entries: &BTreeMap<i32, T>, value: impl Fn(&T) -> Value) -> Value {
    if entries.is_empty() {
        return null();
    }
    some(Value::Array(
        entries
            .iter()
            .map(|(id, entry)| {
                Value::Record(vec![
                    ("key".into(), Value::Int(*id)),
                    ("value".into(), value(entry)),
                ])
            })
            .collect(),
    ))
}

fn null() -> Value {
    Value::Union(0, Box::new(Value::Null))
}

fn some(value: Value) -> Value {
    Value::Union(1, Box::new(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed_manifest() -> ListedManifest {
        ListedManifest {
            path: "s3://bucket/iceberg/task_attempts/metadata/m.avro".into(),
            length: 1234,
            content: Content::PositionDeletes,
            sequence_number: 7,
            added_snapshot_id: 42,
            files: 3,
            rows: 99,
            partition: Partition {
                cluster: "prod-1".into(),
                session: "session_2026".into(),
            },
        }
    }

    #[test]
    fn a_manifest_list_reads_back_as_written() {
        let manifests = vec![listed_manifest()];
        let bytes = write_manifest_list(42, Some(41), 7, &manifests).expect("written");
        assert_eq!(read_manifest_list(&bytes).expect("read"), manifests);
    }

    #[test]
    fn the_written_schemas_keep_their_field_ids() {
        let shape = TableShape {
            schema: r#"{"type":"struct","schema-id":0,"fields":[]}"#,
            partition_fields: "[]",
        };
        let partition = listed_manifest().partition;
        let bytes = write_manifest(shape, Content::Data, &partition, &[]).expect("written");
        // The header holds the schema as written: what every reader resolves fields by.
        let header = String::from_utf8_lossy(&bytes);
        for id in [r#""field-id":0"#, r#""field-id":143"#, r#""field-id":1001"#] {
            assert!(header.contains(id), "{id} missing from {header}");
        }
        let reader = Reader::new(&bytes[..]).expect("readable");
        let metadata = reader.user_metadata();
        assert_eq!(
            metadata.get("content").map(Vec::as_slice),
            Some(&b"data"[..])
        );
    }
}
