//! The columns of the batches a rollup count reads, of the Arrow types DuckDB streams them as:
//! text of any string type, flags, integers, and a row's value with its nulls.

use duckdb::arrow::array::{
    Array, ArrayAccessor, ArrayRef, AsArray, BooleanArray, LargeStringArray, PrimitiveArray,
    RecordBatch, StringArray, StringViewArray,
};
use duckdb::arrow::datatypes::{ArrowPrimitiveType, DataType};

use crate::tables::TableError;

/// The column `name` of `batch`.
pub(super) fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef, TableError> {
    batch
        .column_by_name(name)
        .ok_or_else(|| TableError::Corrupt(format!("rollup source without {name}")))
}

/// A text column, of whichever Arrow string type DuckDB streams it as.
pub(super) enum Texts<'a> {
    Utf8(&'a StringArray),
    LargeUtf8(&'a LargeStringArray),
    Utf8View(&'a StringViewArray),
}

impl<'a> Texts<'a> {
    /// The text column `array`.
    pub(super) fn of(array: &'a ArrayRef) -> Result<Self, TableError> {
        match array.data_type() {
            DataType::Utf8 => Ok(Self::Utf8(array.as_string::<i32>())),
            DataType::LargeUtf8 => Ok(Self::LargeUtf8(array.as_string::<i64>())),
            DataType::Utf8View => Ok(Self::Utf8View(array.as_string_view())),
            other => Err(unexpected("text", other)),
        }
    }

    /// The text at `at`.
    pub(super) fn get(&self, at: usize) -> Option<&'a str> {
        match self {
            Self::Utf8(texts) => texts.is_valid(at).then(|| texts.value(at)),
            Self::LargeUtf8(texts) => texts.is_valid(at).then(|| texts.value(at)),
            Self::Utf8View(texts) => texts.is_valid(at).then(|| texts.value(at)),
        }
    }
}

/// The `BOOLEAN` column `array`.
pub(super) fn flags(array: &ArrayRef) -> Result<&BooleanArray, TableError> {
    array
        .as_boolean_opt()
        .ok_or_else(|| unexpected("flag", array.data_type()))
}

/// The integer column `array`, of Arrow type `T` (DuckDB's `kind`).
pub(super) fn integers<'a, T: ArrowPrimitiveType>(
    array: &'a ArrayRef,
    kind: &str,
) -> Result<&'a PrimitiveArray<T>, TableError> {
    array
        .as_primitive_opt::<T>()
        .ok_or_else(|| unexpected(kind, array.data_type()))
}

/// The value at `at` of a typed column (within the batch the column was found in).
pub(super) fn value<A: ArrayAccessor>(array: A, at: usize) -> Option<A::Item> {
    array.is_valid(at).then(|| array.value(at))
}

/// The error of a column of type `found` where `wanted` was expected.
pub(super) fn unexpected(wanted: &str, found: &DataType) -> TableError {
    TableError::Corrupt(format!("rollup source: {wanted} expected, {found} found"))
}
