//! DuckDB result rows as JSON objects by column name, or as typed structs ([`query_as`]) for
//! code that reads the values itself; and stored rows read as Arrow ([`arrow_row`]) as the
//! same JSON DuckDB's would be.

use duckdb::arrow::array::{Array, ArrayRef, AsArray};
use duckdb::arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use duckdb::arrow::record_batch::RecordBatch;
use duckdb::types::{Value, ValueRef};
use serde_json::{Map, Value as Json};

use crate::query::QueryError;

/// One result row: column name → value.
pub type JsonRow = Map<String, Json>;

/// Runs `sql` with bound `params` and returns every row as a JSON object.
pub fn query_rows(
    connection: &duckdb::Connection,
    sql: &str,
    params: &[Value],
) -> Result<Vec<JsonRow>, QueryError> {
    let mut out = Vec::new();
    for_each_row(connection, sql, params, |row| {
        out.push(row);
        true
    })?;
    Ok(out)
}

/// Runs `sql` with bound `params` and hands each row to `visit` as a JSON object, until
/// `visit` answers `false`: a list that stops at a byte budget converts no row past it.
pub fn for_each_row(
    connection: &duckdb::Connection,
    sql: &str,
    params: &[Value],
    mut visit: impl FnMut(JsonRow) -> bool,
) -> Result<(), QueryError> {
    let mut statement = connection.prepare(sql)?;
    let mut rows = statement.query(duckdb::params_from_iter(params.iter()))?;
    let names: Vec<String> = rows
        .as_ref()
        .map(|statement| statement.column_names())
        .unwrap_or_default();
    while let Some(row) = rows.next()? {
        let mut object = Map::with_capacity(names.len());
        for (index, name) in names.iter().enumerate() {
            object.insert(name.clone(), to_json(row.get_ref(index)?)?);
        }
        if !visit(object) {
            break;
        }
    }
    Ok(())
}

/// Runs `sql` with bound `params` and reads every row as a `T`, its fields named by the
/// columns: a missing or mistyped column is an error, not a silent default.
pub fn query_as<T: serde::de::DeserializeOwned>(
    connection: &duckdb::Connection,
    sql: &str,
    params: &[Value],
) -> Result<Vec<T>, QueryError> {
    query_rows(connection, sql, params)?
        .into_iter()
        .map(|row| {
            serde_json::from_value(Json::Object(row))
                .map_err(|err| QueryError::Internal(format!("unexpected result row: {err}")))
        })
        .collect()
}

/// A DuckDB value as JSON. Integers stay integers; 128-bit ones (sums) become `i64` when they
/// fit, which every count here does.
fn to_json(value: ValueRef<'_>) -> Result<Json, QueryError> {
    Ok(match value {
        ValueRef::Null => Json::Null,
        ValueRef::Boolean(flag) => Json::Bool(flag),
        ValueRef::TinyInt(number) => number.into(),
        ValueRef::SmallInt(number) => number.into(),
        ValueRef::Int(number) => number.into(),
        ValueRef::BigInt(number) => number.into(),
        ValueRef::UTinyInt(number) => number.into(),
        ValueRef::USmallInt(number) => number.into(),
        ValueRef::UInt(number) => number.into(),
        ValueRef::UBigInt(number) => number.into(),
        ValueRef::HugeInt(number) => i64::try_from(number)
            .map(Json::from)
            .map_err(|_| QueryError::Internal(format!("{number} does not fit 64 bits")))?,
        ValueRef::Float(number) => Json::from(f64::from(number)),
        ValueRef::Double(number) => Json::from(number),
        ValueRef::Text(bytes) => Json::String(String::from_utf8_lossy(bytes).into_owned()),
        other => {
            return Err(QueryError::Internal(format!(
                "unexpected DuckDB value type {:?}",
                other.data_type()
            )));
        }
    })
}

/// The value at `row` of `column` as JSON, as [`query_rows`] makes DuckDB's: rows of the
/// stored table read as Arrow (held in memory, or read by the parquet crate) answer as if
/// DuckDB had read them: text, integers, floats and flags (the table stores no other kind);
/// anything else is refused, as [`query_rows`] refuses it.
pub fn arrow_value(column: &ArrayRef, row: usize) -> Result<Json, QueryError> {
    if column.is_null(row) {
        return Ok(Json::Null);
    }
    Ok(match column.data_type() {
        DataType::Utf8 => column.as_string::<i32>().value(row).into(),
        DataType::LargeUtf8 => column.as_string::<i64>().value(row).into(),
        DataType::Utf8View => column.as_string_view().value(row).into(),
        DataType::Boolean => column.as_boolean().value(row).into(),
        DataType::Float32 => f64::from(column.as_primitive::<Float32Type>().value(row)).into(),
        DataType::Float64 => column.as_primitive::<Float64Type>().value(row).into(),
        DataType::Int8 => column.as_primitive::<Int8Type>().value(row).into(),
        DataType::Int16 => column.as_primitive::<Int16Type>().value(row).into(),
        DataType::Int32 => column.as_primitive::<Int32Type>().value(row).into(),
        DataType::Int64 => column.as_primitive::<Int64Type>().value(row).into(),
        DataType::UInt8 => column.as_primitive::<UInt8Type>().value(row).into(),
        DataType::UInt16 => column.as_primitive::<UInt16Type>().value(row).into(),
        DataType::UInt32 => column.as_primitive::<UInt32Type>().value(row).into(),
        DataType::UInt64 => column.as_primitive::<UInt64Type>().value(row).into(),
        other => {
            return Err(QueryError::Internal(format!(
                "no JSON for a stored {other} value"
            )));
        }
    })
}

/// Row `row` of `batch` as [`query_rows`] gives DuckDB's `SELECT *` of it: column name →
/// value, in the batch's order.
pub fn arrow_row(batch: &RecordBatch, row: usize) -> Result<JsonRow, QueryError> {
    batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(field, column)| Ok((field.name().clone(), arrow_value(column, row)?)))
        .collect()
}
