//! A stored column of a published table (see [`super::published`]): its name, its DuckDB type
//! and its field id, written into every Parquet file as `PARQUET:field_id`.
//!
//! Iceberg readers (Athena, Spark, Trino, PyIceberg, DuckDB) find a column by its field id,
//! not its name, so an id is never changed or reused: a new column takes the next free one.
//! docs/tables.md lists them, and a test holds this registry to it.

use std::collections::HashMap;
use std::sync::Arc;

use duckdb::arrow::datatypes::{Field, Schema, SchemaRef};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

/// One stored column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    /// Its field id.
    pub id: i32,
    /// Its name.
    pub name: &'static str,
    /// Its DuckDB type.
    pub sql_type: &'static str,
}

impl Column {
    /// The column `name` of DuckDB type `sql_type` with field id `id`.
    pub const fn new(id: i32, name: &'static str, sql_type: &'static str) -> Self {
        Self { id, name, sql_type }
    }
}

/// `first` then `second`, as one array of `N` columns (their lengths' sum).
pub(crate) const fn concat<const N: usize>(first: &[Column], second: &[Column]) -> [Column; N] {
    assert!(
        first.len() + second.len() == N,
        "N is the sum of the lengths"
    );
    let mut out = [Column::new(0, "", ""); N];
    let mut index = 0;
    while index < first.len() {
        out[index] = first[index];
        index += 1;
    }
    while index < N {
        out[index] = second[index - first.len()];
        index += 1;
    }
    out
}

/// `columns` as (name, DuckDB type) pairs.
pub fn names_and_types(columns: &[Column]) -> Vec<(&'static str, &'static str)> {
    columns
        .iter()
        .map(|column| (column.name, column.sql_type))
        .collect()
}

/// `schema` with the field id of each of its fields that `columns` names (the others as they
/// are): how the parquet crate writes field ids.
pub(crate) fn with_field_ids(schema: &Schema, columns: &[Column]) -> SchemaRef {
    let ids: HashMap<&str, i32> = columns
        .iter()
        .map(|column| (column.name, column.id))
        .collect();
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|field| match ids.get(field.name().as_str()) {
            Some(id) => {
                let mut metadata = field.metadata().clone();
                metadata.insert(PARQUET_FIELD_ID_META_KEY.to_owned(), id.to_string());
                field.as_ref().clone().with_metadata(metadata)
            }
            None => field.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// DuckDB's `COPY … TO` option giving each of `present` (the columns written) that `columns`
/// names its field id; empty when none is named.
pub(crate) fn duckdb_field_ids(columns: &[Column], present: &[String]) -> String {
    let named: Vec<String> = columns
        .iter()
        .filter(|column| present.iter().any(|name| name == column.name))
        .map(|column| format!("{}: {}", column.name, column.id))
        .collect();
    if named.is_empty() {
        String::new()
    } else {
        format!(", FIELD_IDS {{{}}}", named.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use duckdb::arrow::datatypes::DataType;

    #[test]
    fn field_ids_go_to_the_named_fields_only() {
        let schema = Schema::new(vec![
            Field::new("a", DataType::Utf8, true),
            Field::new("b", DataType::Int64, true),
        ]);
        let columns = [Column::new(7, "b", "BIGINT"), Column::new(8, "c", "BIGINT")];
        let with = with_field_ids(&schema, &columns);
        assert!(with.field(0).metadata().is_empty());
        assert_eq!(
            with.field(1).metadata().get(PARQUET_FIELD_ID_META_KEY),
            Some(&"7".to_owned())
        );
        assert_eq!(
            duckdb_field_ids(&columns, &["a".to_owned(), "b".to_owned()]),
            ", FIELD_IDS {b: 7}"
        );
        assert_eq!(duckdb_field_ids(&columns, &["a".to_owned()]), "");
    }
}
