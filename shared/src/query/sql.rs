//! SQL text from fixed pieces, with every client value bound as a parameter.
//!
//! Only three things are ever spliced into SQL text: identifiers from this module's allow-lists,
//! numbers this process computed, and paths of files this process chose (quoted as literals).

use std::path::Path;

use duckdb::types::Value;

use super::params::TaskFilter;

/// A SQL fragment and the values its `?` placeholders bind, in order.
#[derive(Clone, Debug, Default)]
pub struct Sql {
    /// The text.
    pub text: String,
    /// Values for its placeholders.
    pub params: Vec<Value>,
}

impl Sql {
    /// Appends text.
    pub fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
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

/// A SQL string literal of a path this process chose.
pub fn path_literal(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "''"))
}

/// `read_parquet([...])` over `paths`. Hive partitioning stays off: the key layout's
/// `cluster=…/session=…` folders would otherwise add columns the files already have.
pub fn read_parquet(paths: &[&Path], extra: &str) -> String {
    let list: Vec<String> = paths.iter().map(|path| path_literal(path)).collect();
    format!(
        "read_parquet([{}], hive_partitioning = false{extra})",
        list.join(", ")
    )
}

/// The files of one table as a reader sees them.
#[derive(Clone, Debug, Default)]
pub struct TableFiles<'a> {
    /// Merged base files: no key repeats among them.
    pub base: Vec<&'a Path>,
    /// Delta files, oldest first (across sessions, whose keys never collide).
    pub deltas: Vec<&'a Path>,
}

/// The key of a row of `task_attempts` (and of its profile spans).
const ATTEMPT_KEY: [&str; 4] = ["cluster", "session_name", "task_id", "attempt_number"];

/// A relation with the newest version of every row of a keyed table: base rows that no delta
/// replaced, plus each key's row from the newest delta that has it. Compaction writes full
/// merged rows, so the newest version is the merge of all of them — the same rule compaction
/// applies. `None` when the table has no files.
pub fn newest_rows(files: &TableFiles<'_>) -> Option<String> {
    if files.base.is_empty() && files.deltas.is_empty() {
        return None;
    }
    if files.deltas.is_empty() {
        return Some(format!("(SELECT * FROM {})", read_parquet(&files.base, "")));
    }
    let ranks: Vec<String> = files
        .deltas
        .iter()
        .enumerate()
        .map(|(rank, path)| format!("({}, {rank})", path_literal(path)))
        .collect();
    let key = ATTEMPT_KEY.join(", ");
    let newest_delta = format!(
        "SELECT * EXCLUDE (filename, file_rank) FROM (
           SELECT d.*, r.file_rank FROM {deltas} d
           JOIN (VALUES {ranks}) r(filename, file_rank) ON d.filename = r.filename)
         QUALIFY row_number() OVER (PARTITION BY {key} ORDER BY file_rank DESC) = 1",
        deltas = read_parquet(&files.deltas, ", filename = true"),
        ranks = ranks.join(", "),
    );
    if files.base.is_empty() {
        return Some(format!("({newest_delta})"));
    }
    let on: Vec<String> = ATTEMPT_KEY
        .iter()
        .map(|column| format!("b.{column} = n.{column}"))
        .collect();
    Some(format!(
        "(SELECT b.* FROM {base} b ANTI JOIN ({newest_delta}) n ON {on}
          UNION ALL BY NAME
          {newest_delta})",
        base = read_parquet(&files.base, ""),
        on = on.join(" AND "),
    ))
}

/// Text searched by `q`: ids, names and the error with its stack trace, lower-cased.
const SEARCHED: &str = "lower(concat_ws(' ', task_id, job_id, actor_id, node_id, worker_id, \
                        parent_task_id, name, func_or_class_name, error_type, error_message))";

/// `WHERE` conditions (joined by `AND`, starting with `TRUE`) for `filter` over `task_attempts`.
pub fn task_conditions(filter: &TaskFilter) -> Sql {
    let mut sql = Sql::default();
    sql.push("TRUE");
    let exact: [(&str, &Option<String>); 11] = [
        (
            "cluster",
            &filter.scope.cluster.as_ref().map(|c| c.to_string()),
        ),
        ("session_name", &filter.scope.session),
        ("job_id", &filter.job_id),
        ("name", &filter.name),
        ("func_or_class_name", &filter.func_or_class_name),
        ("type", &filter.task_type),
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
    if !filter.states.is_empty() {
        sql.push(" AND state IN (");
        for (index, state) in filter.states.iter().enumerate() {
            if index > 0 {
                sql.push(", ");
            }
            sql.bind(state.clone());
        }
        sql.push(")");
    }
    if let Some(since) = filter.since_ms {
        sql.push(" AND creation_time_ms >= ").bind(since);
    }
    if let Some(until) = filter.until_ms {
        sql.push(" AND creation_time_ms < ").bind(until);
    }
    if !filter.include_drivers {
        sql.push(" AND type IS DISTINCT FROM 'DRIVER_TASK'");
    }
    if !filter.include_incomplete {
        sql.push(" AND definition_at IS NOT NULL");
    }
    if let Some(search) = &filter.search {
        sql.push(" AND contains(")
            .push(SEARCHED)
            .push(", ")
            .bind(search.to_lowercase())
            .push(")");
    }
    sql
}

/// Strict lexicographic comparison with a keyset position: the rows after it in an order
/// given as `(column, value at the position, descending)`.
pub fn keyset_after(position: &[(&str, Value, bool)]) -> Sql {
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
