//! SQL text from fixed pieces, with every client value bound as a parameter.
//!
//! Only three things are ever spliced into SQL text, each by its own method, so that client text
//! cannot reach it by type: `&'static str` pieces (keywords and identifiers written in this
//! program), numbers, and [`Relation`]s over files this process chose.

use duckdb::types::Value;

use super::params::{Created, TaskFilter};
use super::snapshot::Pins;
use crate::tables::{report_times, rollup};

/// A SQL fragment and the values its `?` placeholders bind, in order.
#[derive(Clone, Debug, Default)]
pub struct Sql {
    /// The text.
    pub text: String,
    /// Values for its placeholders.
    pub params: Vec<Value>,
}

/// A table expression over local files this process chose (`read_parquet([...])`, the
/// newest-rows view of a table): the only text not written in this program a query splices.
/// It holds its files in the cache ([`Pins`]) as long as it lives.
#[derive(Clone, Debug)]
pub struct Relation {
    text: String,
    parts: Option<SupersededRead>,
    _pins: Option<Pins>,
}

/// Most superseded rows for which [`Relation::first_rows`] pays: beyond it, sorting that many
/// extra rows costs more than the join it saves.
const MOST_SUPERSEDED_FOR_FIRST_ROWS: u64 = 1_000_000;

impl Relation {
    /// Wraps text built by [`read_parquet`] or [`newest_rows`] from paths this process chose,
    /// keeping `pins` (the cached files it names) until it is dropped.
    pub fn over_files(text: String, pins: Option<Pins>) -> Self {
        Self {
            text,
            parts: None,
            _pins: pins,
        }
    }

    /// The newest rows of a table read by deletion vectors, keeping its parts for
    /// [`Self::first_rows`].
    pub fn over_superseded_read(read: SupersededRead, pins: Option<Pins>) -> Self {
        Self {
            text: read.rows(),
            parts: Some(read),
            _pins: pins,
        }
    }

    /// Rollup rows for the time range `created`: the dated rows of `stored` (the rollups of the
    /// sessions created wholly inside it, as [`read_parquet`] reads them), and the rows the
    /// rollups of `attempts` (the newest attempts of the other sessions) would hold for the
    /// grouping sets `only` if they counted only the attempts created in it.
    pub fn rollups_within(
        stored: String,
        attempts: Option<&Relation>,
        created: Created,
        only: &[&str],
        pins: Option<Pins>,
    ) -> Self {
        let mut parts = vec![format!("(SELECT * FROM {stored} WHERE dated)")];
        if let Some(attempts) = attempts {
            let mut range = vec!["creation_time_ms IS NOT NULL".to_owned()];
            if let Some(since) = created.since_ms {
                range.push(format!("creation_time_ms >= {since}"));
            }
            if let Some(until) = created.until_ms {
                range.push(format!("creation_time_ms < {until}"));
            }
            parts.push(format!(
                "(WITH source AS (SELECT {source}, 1 AS sign FROM {rows} WHERE {range}) {cells})",
                source = rollup::SOURCE,
                rows = attempts.text,
                range = range.join(" AND "),
                cells = rollup::newest_cells("source", only),
            ));
        }
        Self {
            text: format!("({})", parts.join(" UNION ALL BY NAME ")),
            parts: None,
            _pins: pins,
        }
    }

    /// For a query that wants the first `limit` rows in some order, the way to skip the join:
    /// take the first `take` rows of `stored` (every stored row, with its position as
    /// `file_number` and `file_row_number`) and then drop those `superseded` names
    /// (`file_index`, `file_row_number`). `None` when this is not a read by deletion vectors.
    pub fn first_rows(&self, limit: u64) -> Option<FirstRows> {
        let parts = self.parts.as_ref()?;
        (parts.count() <= MOST_SUPERSEDED_FOR_FIRST_ROWS).then(|| FirstRows {
            stored: Self::over_files(parts.rows_with_positions(), self._pins.clone()),
            newest_files_first: Self::over_files(
                parts.rows_newest_files_first(),
                self._pins.clone(),
            ),
            superseded: Self::over_files(parts.superseded(), self._pins.clone()),
            limit,
            take: limit + parts.count(),
        })
    }

    /// Only each task's latest attempt of this relation of attempts. The latest is chosen
    /// before any filter applies, so "latest attempt and FAILED" means the task's outcome
    /// failed, not that some failed attempt exists.
    pub fn latest_attempts(self) -> Self {
        self.latest_where("TRUE")
    }

    /// Of the tasks that were retried, only the latest attempt: [`Self::latest_attempts`]
    /// without the attempts of tasks that never were (read by far fewer rows' window).
    pub fn latest_retries(self) -> Self {
        self.latest_where("attempt_number >= 1")
    }

    fn latest_where(self, condition: &'static str) -> Self {
        Self {
            parts: None,
            text: format!(
                "(SELECT * FROM {} WHERE {condition} QUALIFY attempt_number = \
                 max(attempt_number) OVER (PARTITION BY cluster, session_name, task_id))",
                self.text
            ),
            _pins: self._pins,
        }
    }
}

/// See [`Relation::first_rows`].
#[derive(Debug)]
pub struct FirstRows {
    /// Every stored row, superseded or not, with its position.
    pub stored: Relation,
    /// Every stored row, superseded or not, without positions, its files in the reverse
    /// order (each session's newest delta first, the bases last): where a top-N by creation,
    /// newest first, finds its bound fastest.
    pub newest_files_first: Relation,
    /// The superseded positions.
    pub superseded: Relation,
    /// How many newest rows are wanted.
    pub limit: u64,
    /// How many of the first stored rows always hold the first `limit` newest ones: `limit`
    /// and every superseded row.
    pub take: u64,
}

impl FirstRows {
    /// How many first stored rows to take, in turn, until `limit` newest ones are among them:
    /// twice `limit` first (few of the first rows are usually superseded, and a top-N of many
    /// more wide rows than the page needs is costly), then eight times more each time, ending
    /// at [`Self::take`], which always holds them.
    pub fn tries(&self) -> Vec<u64> {
        let mut tries = Vec::new();
        let mut take = self.limit.saturating_mul(2).max(1);
        while take < self.take {
            tries.push(take);
            take = take.saturating_mul(8);
        }
        tries.push(self.take);
        tries
    }
}

impl Sql {
    /// Appends text written in this program: keywords, identifiers, operators.
    pub fn push(&mut self, text: &'static str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// Appends identifiers written in this program, separated by `, `.
    pub fn columns(&mut self, columns: &[&'static str]) -> &mut Self {
        for (index, column) in columns.iter().enumerate() {
            if index > 0 {
                self.text.push_str(", ");
            }
            self.text.push_str(column);
        }
        self
    }

    /// Appends a number this process computed (a `LIMIT`).
    pub fn number(&mut self, number: impl itoa::Integer) -> &mut Self {
        self.text.push_str(itoa::Buffer::new().format(number));
        self
    }

    /// Appends a relation over files this process chose.
    pub fn relation(&mut self, relation: &Relation) -> &mut Self {
        self.text.push_str(&relation.text);
        self
    }

    /// Appends `(?, ?, …)`, one placeholder bound to each of `values`.
    pub fn bind_list(&mut self, values: &[String]) -> &mut Self {
        self.push("(");
        for (index, value) in values.iter().enumerate() {
            if index > 0 {
                self.push(", ");
            }
            self.bind(value.clone());
        }
        self.push(")")
    }

    /// Appends a placeholder bound to `value`.
    pub fn bind(&mut self, value: impl Into<Value>) -> &mut Self {
        self.text.push('?');
        self.params.push(value.into());
        self
    }

    /// Appends another fragment with its parameters.
    pub fn append(&mut self, other: Sql) -> &mut Self {
        self.text.push_str(&other.text);
        self.params.extend(other.params);
        self
    }
}

pub use crate::tables::newest::{
    SupersededRead, TableFiles, newest_rows, path_literal, read_parquet,
};

/// Columns `q` searches as stored: ids, already lowercase hex.
const SEARCHED_IDS: [&str; 6] = [
    "task_id",
    "job_id",
    "actor_id",
    "node_id",
    "worker_id",
    "parent_task_id",
];

/// Columns `q` searches lower-cased: names and the error with its stack trace. One `contains`
/// per column, not one over their concatenation: that would build a string per row, while
/// most of these are dictionary-encoded or null (the error text exists only on failed rows).
const SEARCHED_TEXT: [&str; 4] = ["name", "func_or_class_name", "error_type", "error_message"];

pub use crate::tables::rollup::{ERROR_FINGERPRINT, WAIT_MS};

/// The conditions of `filter` on what rollups keep apart too (see `read::rollups`), each
/// starting with ` AND `: job, states, type, drivers, and whether the definition was exported
/// (`exported`, the expression that says so where they are read).
pub fn kind_conditions(filter: &TaskFilter, exported: &'static str) -> Sql {
    let mut sql = Sql::default();
    if let Some(job) = &filter.job_id {
        sql.push(" AND job_id = ").bind(job.clone());
    }
    if !filter.states.is_empty() {
        sql.push(" AND state IN ").bind_list(&filter.states);
    }
    if let Some(task_type) = &filter.task_type {
        sql.push(" AND type = ").bind(task_type.clone());
    }
    if !filter.include_drivers {
        sql.push(" AND type IS DISTINCT FROM 'DRIVER_TASK'");
    }
    if !filter.include_incomplete {
        sql.push(" AND ").push(exported);
    }
    sql
}

/// `WHERE` conditions (joined by `AND`, starting with `TRUE`) for `filter` over `task_attempts`.
pub fn task_conditions(filter: &TaskFilter) -> Sql {
    let mut sql = Sql::default();
    sql.push("TRUE");
    let exact: [(&str, &Option<String>); 9] = [
        (
            "cluster",
            &filter.scope.cluster.as_ref().map(|c| c.to_string()),
        ),
        ("session_name", &filter.scope.session),
        ("name", &filter.name),
        ("func_or_class_name", &filter.func_or_class_name),
        ("error_type", &filter.error_type),
        ("node_id", &filter.node_id),
        ("worker_id", &filter.worker_id),
        ("actor_id", &filter.actor_id),
        ("parent_task_id", &filter.parent_task_id),
    ];
    for (column, value) in exact {
        if let Some(value) = value {
            sql.push(" AND ")
                .push(column)
                .push(" = ")
                .bind(value.clone());
        }
    }
    sql.append(kind_conditions(filter, report_times::DEFINED));
    if let Some(since) = filter.scope.created.since_ms {
        sql.push(" AND creation_time_ms >= ").bind(since);
    }
    if let Some(until) = filter.scope.created.until_ms {
        sql.push(" AND creation_time_ms < ").bind(until);
    }
    if let Some(fingerprint) = &filter.error_fingerprint {
        sql.push(" AND state = 'FAILED' AND ")
            .push(ERROR_FINGERPRINT)
            .push(" = ")
            .bind(fingerprint.clone());
    }
    if let Some(attempt) = filter.min_attempt {
        sql.push(" AND attempt_number >= ").bind(attempt);
    }
    if let Some(duration) = filter.min_duration_ms {
        sql.push(" AND duration_ms >= ").bind(duration);
    }
    if let Some(wait) = filter.min_wait_ms {
        sql.push(" AND ").push(WAIT_MS).push(" >= ").bind(wait);
    }
    if let Some(search) = &filter.search {
        let needle = search.to_lowercase();
        sql.push(" AND (FALSE");
        for column in SEARCHED_IDS {
            sql.push(" OR contains(")
                .push(column)
                .push(", ")
                .bind(needle.clone())
                .push(")");
        }
        for column in SEARCHED_TEXT {
            sql.push(" OR contains(lower(")
                .push(column)
                .push("), ")
                .bind(needle.clone())
                .push(")");
        }
        sql.push(")");
    }
    sql
}

/// Strict lexicographic comparison with a keyset position: the rows after it in an order
/// given as `(column, value at the position, descending)`.
pub fn keyset_after(position: &[(&'static str, Value, bool)]) -> Sql {
    let mut sql = Sql::default();
    sql.push("(FALSE");
    for (index, (column, value, descending)) in position.iter().enumerate() {
        sql.push(" OR (");
        for (prior_column, prior_value, _) in &position[..index] {
            sql.push(prior_column)
                .push(" = ")
                .bind(prior_value.clone())
                .push(" AND ");
        }
        let operator = if *descending { " < " } else { " > " };
        sql.push(column)
            .push(operator)
            .bind(value.clone())
            .push(")");
    }
    sql.push(")");
    sql
}
