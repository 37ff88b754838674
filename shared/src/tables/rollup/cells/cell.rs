//! One rollup cell's counts: its rows, and each extreme with how many rows hold it, added to,
//! merged with another count of the same cell, and taken from by the cell's minus count.

use super::Row;
use crate::tables::TableError;

/// The smallest (or largest) value of a cell's rows and how many rows hold it; `None` while
/// no row had a value. SQL's `min`/`max` skip nulls, and a null is never equal to the extreme.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Extreme {
    pub(super) value: Option<i64>,
    pub(super) holders: i64,
}

impl Extreme {
    /// Adds a row's value, keeping the smallest when `smallest`, else the largest.
    pub(super) fn add(&mut self, value: Option<i64>, smallest: bool) {
        self.merge(Self { value, holders: 1 }, smallest);
    }

    /// Takes in the extreme of other rows of the same cell.
    pub(super) fn merge(&mut self, other: Self, smallest: bool) {
        let Some(value) = other.value else { return };
        let beyond = |held: i64| if smallest { value < held } else { value > held };
        match self.value {
            Some(held) if held == value => self.holders += other.holders,
            Some(held) if !beyond(held) => {}
            _ => *self = other,
        }
    }

    /// Takes out the extreme of superseded rows counted in the same cell (`gone`). Returns
    /// whether the extreme is still known: not when every row holding it was superseded.
    /// Superseded rows are rows counted here, so an extreme beyond this one, or more holders
    /// than this one has, means the rollups summed do not add up.
    pub(super) fn subtract(&mut self, gone: Self, smallest: bool) -> Result<bool, TableError> {
        let Some(value) = gone.value else {
            return Ok(true);
        };
        let beyond = |held: i64| if smallest { value < held } else { value > held };
        match self.value {
            Some(held) if held == value && gone.holders <= self.holders => {
                self.holders -= gone.holders;
                Ok(self.holders > 0)
            }
            Some(held) if held != value && !beyond(held) => Ok(true),
            _ => Err(TableError::Corrupt(
                "rollups summed: a superseded extreme was never counted".into(),
            )),
        }
    }
}

/// One rollup row being counted.
#[derive(Debug, Default)]
pub(super) struct Cell {
    pub(super) n: i64,
    pub(super) measure_min: Extreme,
    pub(super) measure_max: Extreme,
    pub(super) created_min: Extreme,
    pub(super) last_max: Extreme,
    /// The smallest error message, by its bytes (DuckDB's `min` of text).
    pub(super) example: Option<Box<str>>,
}

impl Cell {
    /// Adds a row to the cell.
    pub(super) fn add(&mut self, row: &Row, measure: Option<i64>, example: Option<&str>) {
        self.n += 1;
        self.measure_min.add(measure, true);
        self.measure_max.add(measure, false);
        self.created_min.add(row.created, true);
        self.last_max.add(row.last, false);
        if let Some(message) = example {
            self.take_example(message);
        }
    }

    /// Takes in the same cell's count of other rows.
    pub(super) fn merge(&mut self, other: Self) {
        self.n += other.n;
        self.measure_min.merge(other.measure_min, true);
        self.measure_max.merge(other.measure_max, false);
        self.created_min.merge(other.created_min, true);
        self.last_max.merge(other.last_max, false);
        if let Some(message) = other.example.as_deref() {
            self.take_example(message);
        }
    }

    /// Takes out the cell's count of superseded rows (`gone`, its minus cell). Returns whether
    /// the extremes and the example are still those of the rows left ([`Extreme::subtract`];
    /// an example a superseded row may have held is not, as no count of its holders is kept).
    /// More rows taken than counted, or an extreme beyond the cell's, is an error.
    pub(super) fn subtract(&mut self, gone: Self) -> Result<bool, TableError> {
        self.n -= gone.n;
        if self.n < 0 {
            return Err(TableError::Corrupt(
                "rollups summed: more rows superseded than counted".into(),
            ));
        }
        let mut known = true;
        for (held, taken, smallest) in [
            (&mut self.measure_min, gone.measure_min, true),
            (&mut self.measure_max, gone.measure_max, false),
            (&mut self.created_min, gone.created_min, true),
            (&mut self.last_max, gone.last_max, false),
        ] {
            known &= held.subtract(taken, smallest)?;
        }
        // A superseded message below the example, or where none is held, is no error: a
        // replacement that changed only a message's numbers (the same fingerprint) writes no
        // rows, so the message a stored rollup holds may be such a version's.
        match (self.example.as_deref(), gone.example.as_deref()) {
            (_, None) => {}
            (Some(held), Some(taken)) if taken > held => {}
            _ => known = false,
        }
        Ok(known)
    }

    /// Keeps `message` as the example if it is the smallest yet.
    pub(super) fn take_example(&mut self, message: &str) {
        if self.example.as_deref().is_none_or(|held| message < held) {
            self.example = Some(message.into());
        }
    }
}
