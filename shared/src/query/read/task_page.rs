//! One page of the task table in its order: the first `limit + 1` newest attempts that pass a
//! filter, after a cursor. It owns how that page is read fast from millions of rows, not what
//! the route answers around it (the `tasks` route's module).
//!
//! Two things make a page slow, and each has its answer here:
//! - A top-N over wide rows: DuckDB decodes every column of each row that may still make the
//!   page, which over millions of attempts is most of the work. The page first finds its
//!   *bound*, the value of the sort column at which its `take` first rows end, by a top-N of
//!   that column alone, and then reads whole rows only at or beyond it, where row-group
//!   statistics skip nearly everything.
//! - Superseded rows (a read by deletion vectors): they drop out only through a join, which
//!   the top-N cannot see through. The page takes the first stored rows in order and drops
//!   the superseded ones among them afterwards, taking more (up to every superseded row) only
//!   when too few of those it took were newest ([`FirstRows::tries`]).

use duckdb::types::Value;
use serde::Deserialize;
use serde_json::Value as Json;

use super::json::{JsonRow, query_as, query_rows};
use super::params::TaskFilter;
use super::sql::{FirstRows, Relation, Sql, keyset_after, task_conditions};
use crate::query::{QueryEngine, QueryError};

/// The columns after the sort value that make the order total.
pub(crate) const TIE_BREAK: [&str; 4] = ["cluster", "session_name", "task_id", "attempt_number"];

/// The orderings of the task table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaskSort {
    /// By creation time.
    Creation,
    /// By running time.
    Duration,
}

/// The sort expression's stand-in for a null: (almost) the smallest BIGINT, below every real
/// value (durations can be negative under clock skew).
const NULL_KEY: i64 = -9_223_372_036_854_775_807;

impl TaskSort {
    /// Its name in cursors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Creation => "creation",
            Self::Duration => "duration",
        }
    }

    /// The sort expression; never null (nulls become [`NULL_KEY`]), so keyset comparisons
    /// stay simple.
    fn expression(self) -> &'static str {
        match self {
            Self::Creation => "coalesce(creation_time_ms, -9223372036854775807)",
            Self::Duration => "coalesce(duration_ms, -9223372036854775807)",
        }
    }

    /// The column the expression reads. Pages are ordered by it, with nulls where the
    /// expression's stand-in value would put them (below every real value): the same order,
    /// but one DuckDB's top-N can push into the scan as a filter on row-group statistics.
    fn column(self) -> &'static str {
        match self {
            Self::Creation => "creation_time_ms",
            Self::Duration => "duration_ms",
        }
    }
}

/// One page's request.
pub(crate) struct TaskPage<'a> {
    /// Which attempts.
    pub filter: &'a TaskFilter,
    /// The order.
    pub sort: TaskSort,
    /// Largest first.
    pub descending: bool,
    /// Rows wanted (one more is read, to know whether there is a next page).
    pub limit: usize,
    /// The sort key and tie-break values of the last row of the page before, if any.
    pub after: Option<Vec<(&'static str, Value)>>,
    /// The columns returned, besides `sort_key`.
    pub columns: &'a [&'static str],
}

/// The value of the sort expression at which a page's first rows end.
#[derive(Deserialize)]
struct Bound {
    bound: Option<i64>,
}

/// Where a page's rows come from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// Newest rows only.
    Newest(&'a Relation),
    /// The first `take` stored rows in order, less the superseded ones among them.
    First(&'a FirstRows, u64),
}

impl TaskPage<'_> {
    /// The page's rows from `relation` (the attempts in scope), `limit + 1` at most, each with
    /// its `sort_key`.
    pub(crate) async fn rows(
        &self,
        engine: &QueryEngine,
        relation: &Relation,
    ) -> Result<Vec<JsonRow>, QueryError> {
        let wanted = self.limit as u64 + 1;
        let Some(first) = relation.first_rows(wanted) else {
            return self.read(engine, Source::Newest(relation)).await;
        };
        let mut rows = Vec::new();
        for (attempt, take) in first.tries().into_iter().enumerate() {
            if attempt > 0 {
                engine.count_page_retake();
            }
            rows = self.read(engine, Source::First(&first, take)).await?;
            let stored = rows
                .first()
                .and_then(|row| row.get("stored_rows"))
                .and_then(Json::as_u64);
            // Enough newest rows among the first `take`, or no more to take.
            if rows.len() as u64 >= wanted || stored.is_some_and(|stored| stored < take) {
                break;
            }
        }
        for row in &mut rows {
            row.remove("stored_rows");
        }
        Ok(rows)
    }

    /// Reads the page from `source`: its bound first, then the rows at or beyond it.
    async fn read(
        &self,
        engine: &QueryEngine,
        source: Source<'_>,
    ) -> Result<Vec<JsonRow>, QueryError> {
        let (stored, take) = match source {
            Source::Newest(relation) => (relation, self.limit as u64 + 1),
            // The newest rows are in the newest files, so reading those first lets the top-N
            // skip the rest early; the bound is a value, not rows, so any order gives it.
            Source::First(first, take) if self.newest_first() => (&first.newest_files_first, take),
            Source::First(first, take) => (&first.stored, take),
        };
        let bound = self.bound_sql(stored, take)?;
        let found: Vec<Bound> = engine
            .run(move |connection| query_as(connection, &bound.text, &bound.params))
            .await?;
        let Some(bound) = found.first().and_then(|found| found.bound) else {
            // Nothing passes the filter.
            return Ok(Vec::new());
        };
        let sql = self.page_sql(source, bound)?;
        engine
            .run(move |connection| query_rows(connection, &sql.text, &sql.params))
            .await
    }

    /// Whether the page wants the newest attempts first, which the newest files hold.
    fn newest_first(&self) -> bool {
        self.descending && self.sort == TaskSort::Creation
    }

    /// The sort key at which the first `take` rows of `relation` end, by a top-N of the sort
    /// column alone (ties share a key, so the tie-breaks change nothing here).
    fn bound_sql(&self, relation: &Relation, take: u64) -> Result<Sql, QueryError> {
        let mut sql = Sql::default();
        sql.push(if self.descending {
            "SELECT min(sort_key) AS bound FROM (SELECT sort_key FROM ("
        } else {
            "SELECT max(sort_key) AS bound FROM (SELECT sort_key FROM ("
        });
        self.ordered(&mut sql, relation, None)?;
        sql.push(") ORDER BY ")
            .push(self.sort.column())
            .push(self.direction())
            .push(self.nulls())
            .push(" LIMIT ")
            .number(take)
            .push(")");
        Ok(sql)
    }

    /// The page's rows from `source`, none beyond `bound`.
    fn page_sql(&self, source: Source<'_>, bound: i64) -> Result<Sql, QueryError> {
        let mut sql = Sql::default();
        sql.push("SELECT ").columns(self.columns).push(", sort_key");
        match source {
            Source::First(first, take) => {
                sql.push(", stored_rows FROM (SELECT *, count(*) OVER () AS stored_rows FROM (");
                self.ordered(&mut sql, &first.stored, Some(bound))?;
                self.order(&mut sql);
                sql.push(" LIMIT ")
                    .number(take)
                    .push(")) page ANTI JOIN ")
                    .relation(&first.superseded)
                    .push(
                        " d ON page.file_number = d.file_index \
                         AND page.file_row_number = d.file_row_number",
                    );
            }
            Source::Newest(relation) => {
                sql.push(" FROM (");
                self.ordered(&mut sql, relation, Some(bound))?;
                sql.push(")");
            }
        }
        self.order(&mut sql);
        sql.push(" LIMIT ").number(self.limit + 1);
        Ok(sql)
    }

    /// The rows of `relation` that pass the filter, come after the cursor and (with `bound`)
    /// are not beyond the bound, each with its `sort_key`.
    fn ordered(
        &self,
        sql: &mut Sql,
        relation: &Relation,
        bound: Option<i64>,
    ) -> Result<(), QueryError> {
        sql.push("SELECT * FROM (SELECT *, ")
            .push(self.sort.expression())
            .push(" AS sort_key FROM ")
            .relation(relation)
            .push(" WHERE ")
            .append(task_conditions(self.filter));
        if let Some(bound) = bound {
            // On the column itself, not the sort expression, so that row-group statistics
            // skip what lies beyond (nulls sort below every value).
            let column = self.sort.column();
            match (self.descending, bound == NULL_KEY) {
                (true, true) => {}
                (true, false) => {
                    sql.push(" AND ").push(column).push(" >= ").number(bound);
                }
                (false, true) => {
                    sql.push(" AND ").push(column).push(" IS NULL");
                }
                (false, false) => {
                    sql.push(" AND (")
                        .push(column)
                        .push(" IS NULL OR ")
                        .push(column)
                        .push(" <= ")
                        .number(bound)
                        .push(")");
                }
            }
        }
        sql.push(")");
        if let Some(after) = &self.after {
            let position: Vec<(&'static str, Value, bool)> = after
                .iter()
                .map(|(column, value)| (*column, value.clone(), self.descending))
                .collect();
            sql.push(" WHERE ").append(keyset_after(&position));
        }
        Ok(())
    }

    /// ` ORDER BY` the page's order, tie-breaks included.
    fn order(&self, sql: &mut Sql) {
        sql.push(" ORDER BY ")
            .push(self.sort.column())
            .push(self.direction())
            .push(self.nulls());
        for column in TIE_BREAK {
            sql.push(", ").push(column).push(self.direction());
        }
    }

    fn direction(&self) -> &'static str {
        if self.descending { " DESC" } else { " ASC" }
    }

    fn nulls(&self) -> &'static str {
        if self.descending {
            " NULLS LAST"
        } else {
            " NULLS FIRST"
        }
    }
}
