//! A published table as Iceberg describes it: its schema (the published columns with their
//! field ids), its partition spec (identity on `cluster` and `session_name`: a session's files
//! are one partition) and the name mapping by which readers find columns in files written
//! before they carried field ids.

use serde_json::{Value, json};

use super::IcebergError;
use crate::tables::published::{PublishedTable, stored_columns};

/// The partition field ids of `cluster` and `session_name` (the spec numbers partition fields
/// from 1000).
const PARTITION_FIELDS: [(&str, i32); 2] = [("cluster", 1000), ("session_name", 1001)];

/// The Iceberg type of a published column's DuckDB type.
pub(super) fn iceberg_type(sql_type: &str) -> Option<&'static str> {
    match sql_type {
        "VARCHAR" => Some("string"),
        "BIGINT" => Some("long"),
        "INTEGER" => Some("int"),
        "BOOLEAN" => Some("boolean"),
        "DOUBLE" => Some("double"),
        _ => None,
    }
}

/// The Glue (Hive) type of a published column's DuckDB type.
pub(super) fn hive_type(sql_type: &str) -> Option<&'static str> {
    match sql_type {
        "VARCHAR" => Some("string"),
        "BIGINT" => Some("bigint"),
        "INTEGER" => Some("int"),
        "BOOLEAN" => Some("boolean"),
        "DOUBLE" => Some("double"),
        _ => None,
    }
}

/// What every manifest and metadata version says of a table's columns and partitions.
#[derive(Clone, Debug)]
pub struct TableSchema {
    /// The schema (id 0) as JSON.
    pub schema: Value,
    /// The partition spec's fields as JSON.
    pub partition_fields: Value,
    /// The highest field id the table's files may carry (withheld columns' included, so a new
    /// column never takes one of theirs).
    pub last_column_id: i32,
    /// The name mapping (`schema.name-mapping.default`) as JSON text.
    pub name_mapping: String,
}

/// The last partition field id.
pub(super) const LAST_PARTITION_ID: i32 = 1001;

impl TableSchema {
    /// `table`'s schema; an error names a column whose type Iceberg cannot hold.
    pub fn of(table: &PublishedTable) -> Result<Self, IcebergError> {
        let mut fields = Vec::with_capacity(table.columns.len());
        for column in &table.columns {
            let kind = iceberg_type(column.sql_type).ok_or_else(|| {
                IcebergError::Unpublishable(format!(
                    "{}.{} has DuckDB type {}, which has no Iceberg type here",
                    table.name, column.name, column.sql_type
                ))
            })?;
            fields.push(json!({
                "id": column.id,
                "name": column.name,
                "required": false,
                "type": kind,
            }));
        }
        let mut partition_fields = Vec::new();
        for (name, field_id) in PARTITION_FIELDS {
            let source = table
                .columns
                .iter()
                .find(|column| column.name == name)
                .ok_or_else(|| {
                    IcebergError::Unpublishable(format!("{} has no column {name}", table.name))
                })?;
            partition_fields.push(json!({
                "source-id": source.id,
                "field-id": field_id,
                "name": name,
                "transform": "identity",
            }));
        }
        // Every stored column, withheld ones too: a reader maps a whole file by name or not at
        // all.
        let stored = stored_columns(table.source);
        let mapping: Vec<Value> = stored
            .iter()
            .map(|column| json!({"field-id": column.id, "names": [column.name]}))
            .collect();
        let last_column_id = stored
            .iter()
            .map(|column| column.id)
            .max()
            .unwrap_or_default();
        Ok(Self {
            schema: json!({"type": "struct", "schema-id": 0, "fields": fields}),
            partition_fields: Value::Array(partition_fields),
            last_column_id,
            name_mapping: Value::Array(mapping).to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tables::published::published_tables;

    #[test]
    fn every_published_column_has_an_iceberg_type() {
        for table in published_tables() {
            let schema = TableSchema::of(&table).expect("publishable");
            let fields = schema.schema["fields"].as_array().map(Vec::len);
            assert_eq!(fields, Some(table.columns.len()), "{}", table.name);
            assert!(schema.last_column_id >= table.columns.len() as i32);
        }
    }
}
