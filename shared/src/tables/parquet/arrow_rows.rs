//! Rows as Arrow columns, filled one row at a time: for DuckDB's appender, and for the parquet
//! crate (a run's delta, see [`super::ParquetFile`]).
//!
//! DuckDB's row appender boxes every value of every row (75 per attempt) and converts each on
//! its own; handing it whole Arrow columns costs one conversion per column, and text is copied
//! once, from the borrowed `&str`, instead of into an owned value first. Compaction spent a
//! sixth of its time appending rows the other way.

use std::sync::Arc;

use duckdb::arrow::array::{ArrayRef, BooleanBuilder, Int32Builder, Int64Builder, StringBuilder};
use duckdb::arrow::datatypes::{DataType, Field, Schema};
use duckdb::arrow::record_batch::RecordBatch;

use crate::tables::TableError;

/// Room made for each text value at the start, in bytes. A column that outgrows its room is
/// copied to one twice as large, into memory the kernel faults in again: with little room,
/// most of an attempt's ids, names and paths would do so two or three times.
/// Room no value reaches is never touched, so it costs address space, not memory.
const TEXT_BYTES: usize = 128;

/// One column being filled.
enum Column {
    Text(StringBuilder),
    Integer(Int32Builder),
    BigInt(Int64Builder),
    Boolean(BooleanBuilder),
}

impl Column {
    fn of(kind: &str, rows: usize) -> Result<Self, TableError> {
        Ok(match kind {
            "VARCHAR" => Self::Text(StringBuilder::with_capacity(rows, rows * TEXT_BYTES)),
            "INTEGER" => Self::Integer(Int32Builder::with_capacity(rows)),
            "BIGINT" => Self::BigInt(Int64Builder::with_capacity(rows)),
            "BOOLEAN" => Self::Boolean(BooleanBuilder::with_capacity(rows)),
            other => {
                return Err(TableError::Corrupt(format!(
                    "no Arrow column for DuckDB type {other}"
                )));
            }
        })
    }

    fn data_type(&self) -> DataType {
        match self {
            Self::Text(_) => DataType::Utf8,
            Self::Integer(_) => DataType::Int32,
            Self::BigInt(_) => DataType::Int64,
            Self::Boolean(_) => DataType::Boolean,
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Self::Text(builder) => Arc::new(builder.finish()),
            Self::Integer(builder) => Arc::new(builder.finish()),
            Self::BigInt(builder) => Arc::new(builder.finish()),
            Self::Boolean(builder) => Arc::new(builder.finish()),
        }
    }
}

/// Rows of a table with the given columns, built column by column.
///
/// Each row is written as one call per column, in the table's column order; a value of the
/// wrong type or a row with too few or too many values is an error, not a misplaced value.
pub(crate) struct ArrowRows {
    names: Vec<&'static str>,
    columns: Vec<Column>,
    /// The column the next value goes to.
    next: usize,
}

impl ArrowRows {
    /// Empty rows for `columns` (name, DuckDB type), with room for `rows` of them.
    pub(crate) fn new(columns: &[(&'static str, &str)], rows: usize) -> Result<Self, TableError> {
        Ok(Self {
            names: columns.iter().map(|(name, _)| *name).collect(),
            columns: columns
                .iter()
                .map(|(_, kind)| Column::of(kind, rows))
                .collect::<Result<_, _>>()?,
            next: 0,
        })
    }

    /// The next column and its name.
    fn next_column(&mut self) -> Result<(&'static str, &mut Column), TableError> {
        let index = self.next;
        self.next += 1;
        let count = self.columns.len();
        match (self.names.get(index), self.columns.get_mut(index)) {
            (Some(name), Some(column)) => Ok((name, column)),
            _ => Err(TableError::Corrupt(format!(
                "a value past the last of {count} columns"
            ))),
        }
    }

    /// Appends a `VARCHAR` value.
    pub(crate) fn text(&mut self, value: Option<&str>) -> Result<(), TableError> {
        match self.next_column()? {
            (_, Column::Text(builder)) => {
                builder.append_option(value);
                Ok(())
            }
            (name, _) => Err(not_of_type(name, "VARCHAR")),
        }
    }

    /// Appends an `INTEGER` value.
    pub(crate) fn integer(&mut self, value: Option<i32>) -> Result<(), TableError> {
        match self.next_column()? {
            (_, Column::Integer(builder)) => {
                builder.append_option(value);
                Ok(())
            }
            (name, _) => Err(not_of_type(name, "INTEGER")),
        }
    }

    /// Appends a `BIGINT` value.
    pub(crate) fn big_int(&mut self, value: Option<i64>) -> Result<(), TableError> {
        match self.next_column()? {
            (_, Column::BigInt(builder)) => {
                builder.append_option(value);
                Ok(())
            }
            (name, _) => Err(not_of_type(name, "BIGINT")),
        }
    }

    /// Appends a `BOOLEAN` value.
    pub(crate) fn boolean(&mut self, value: Option<bool>) -> Result<(), TableError> {
        match self.next_column()? {
            (_, Column::Boolean(builder)) => {
                builder.append_option(value);
                Ok(())
            }
            (name, _) => Err(not_of_type(name, "BOOLEAN")),
        }
    }

    /// Ends a row, which must have had a value for every column.
    pub(crate) fn end_row(&mut self) -> Result<(), TableError> {
        if self.next != self.columns.len() {
            return Err(TableError::Corrupt(format!(
                "a row of {} values for {} columns",
                self.next,
                self.columns.len()
            )));
        }
        self.next = 0;
        Ok(())
    }

    /// The rows so far as one record batch; the builders start over empty.
    pub(crate) fn finish(&mut self) -> Result<RecordBatch, TableError> {
        let fields: Vec<Field> = self
            .names
            .iter()
            .zip(&self.columns)
            .map(|(name, column)| Field::new(*name, column.data_type(), true))
            .collect();
        let arrays = self.columns.iter_mut().map(Column::finish).collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
            .map_err(|err| TableError::Corrupt(format!("Arrow rows: {err}")))
    }
}

fn not_of_type(column: &str, kind: &str) -> TableError {
    TableError::Corrupt(format!("column {column} is not {kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const COLUMNS: &[(&str, &str)] = &[("a", "VARCHAR"), ("b", "BIGINT")];

    #[test]
    fn rows_fill_their_columns_in_order() -> Result<(), TableError> {
        let mut rows = ArrowRows::new(COLUMNS, 2)?;
        rows.text(Some("x"))?;
        rows.big_int(None)?;
        rows.end_row()?;
        rows.text(None)?;
        rows.big_int(Some(7))?;
        rows.end_row()?;
        let batch = rows.finish()?;
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.schema().field(1).name(), "b");
        assert_eq!(batch.column(1).null_count(), 1);
        Ok(())
    }

    #[test]
    fn a_value_of_the_wrong_type_or_count_is_refused() -> Result<(), TableError> {
        let mut rows = ArrowRows::new(COLUMNS, 1)?;
        assert!(
            rows.big_int(Some(1)).is_err(),
            "a BIGINT went to a VARCHAR column"
        );
        let mut rows = ArrowRows::new(COLUMNS, 1)?;
        rows.text(Some("x"))?;
        assert!(rows.end_row().is_err(), "a short row was accepted");
        rows.big_int(Some(1))?;
        assert!(
            rows.text(Some("y")).is_err(),
            "a value past the last column"
        );
        Ok(())
    }
}
