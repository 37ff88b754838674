//! Ad-hoc SQL (`afterglow sql`): a query of the user's over the published tables
//! ([`crate::tables::published`]) of the sessions in a scope, each a view of its newest rows,
//! answered row by row with every value as DuckDB writes it as text.
//!
//! Only the tables the query names are fetched: a query of `jobs` over a bucket copies the
//! sessions' small entity files, never their attempts. A table it does not name is still
//! there, empty, so that `SHOW TABLES` lists every one.

use super::read::attempts::attempts_relation;
use super::read::params::Scope;
use super::read::snapshot::Needs;
use super::read::sql::{Relation, Sql, read_parquet};
use super::{QueryEngine, QueryError};
use crate::tables::published::{PublishedTable, Source, published_tables};

/// One column of an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnswerColumn {
    /// Its name (DuckDB's: a name the query repeats gets a suffix, `a_1`).
    pub name: String,
    /// Its DuckDB type, such as `BIGINT` or `VARCHAR[]`.
    pub sql_type: String,
}

/// Where an answer goes: its columns first, then its rows.
pub trait AnswerSink: Send + 'static {
    /// The answer's columns, before any row.
    fn columns(&mut self, columns: &[AnswerColumn]) -> std::io::Result<()>;
    /// One row: each value as DuckDB's text of it, `None` for NULL. Answers `false` to stop
    /// (a reader that is gone, a row limit reached).
    fn row(&mut self, values: &[Option<String>]) -> std::io::Result<bool>;
}

impl QueryEngine {
    /// Runs `query`, one SQL query (`SELECT`, `WITH`, `FROM …`, `VALUES`, `DESCRIBE`, `SHOW`,
    /// `SUMMARIZE`; a trailing `;` is allowed), over the published tables of the sessions in
    /// `scope`, handing its answer to `sink`, which it gives back.
    #[tracing::instrument(name = "ad_hoc_sql", skip_all)]
    pub async fn ad_hoc<S: AnswerSink>(
        &self,
        scope: &Scope,
        query: &str,
        mut sink: S,
    ) -> Result<S, QueryError> {
        let query = query
            .trim()
            .trim_end_matches(|c: char| c == ';' || c.is_whitespace())
            .to_owned();
        if query.is_empty() {
            return Err(QueryError::BadRequest("the query is empty".into()));
        }
        let mut views = Vec::new();
        // Held until the query has run: they keep the fetched files in the cache.
        let mut held: Vec<Relation> = Vec::new();
        for table in published_tables() {
            let rows = if names(&query, table.name) {
                self.stored_rows(&table, scope, &mut held).await?
            } else {
                None
            };
            let select = match rows {
                Some(rows) => format!("SELECT {} FROM {rows}", table.select_list()),
                None => table.empty(),
            };
            views.push(format!(
                "CREATE OR REPLACE TEMP VIEW {} AS {select};",
                table.name
            ));
        }
        let answered = self
            .run(move |connection| {
                connection.execute_batch(&views.concat())?;
                // The newline ends a trailing `--` comment before the parenthesis.
                let columns = describe(connection, &query)?;
                sink.columns(&columns).map_err(written)?;
                let text = format!("SELECT COLUMNS(*)::VARCHAR FROM ({query}\n)");
                let mut statement = connection.prepare(&text)?;
                let mut rows = statement.query([])?;
                let mut values = Vec::with_capacity(columns.len());
                while let Some(row) = rows.next()? {
                    values.clear();
                    for index in 0..columns.len() {
                        values.push(row.get::<_, Option<String>>(index)?);
                    }
                    if !sink.row(&values).map_err(written)? {
                        break;
                    }
                }
                Ok(sink)
            })
            .await;
        drop(held);
        answered
    }

    /// The stored rows of `table` in `scope` as SQL to select from, or `None` when no session
    /// in scope has any; what they read is pushed to `held`.
    async fn stored_rows(
        &self,
        table: &PublishedTable,
        scope: &Scope,
        held: &mut Vec<Relation>,
    ) -> Result<Option<String>, QueryError> {
        let relation = match table.source {
            Source::Attempts => attempts_relation(self, scope).await?,
            Source::Entities(kind) => {
                let snapshot = self
                    .snapshot(
                        scope,
                        Needs {
                            entity: Some(kind),
                            ..Needs::default()
                        },
                    )
                    .await?;
                let paths: Vec<&std::path::Path> = snapshot
                    .entities
                    .get(&kind)
                    .map(|paths| paths.iter().map(std::path::PathBuf::as_path).collect())
                    .unwrap_or_default();
                (!paths.is_empty())
                    .then(|| Relation::over_files(read_parquet(&paths, ""), snapshot.pins.clone()))
            }
        };
        Ok(relation.map(|relation| {
            let mut sql = Sql::default();
            sql.relation(&relation);
            held.push(relation);
            sql.text
        }))
    }
}

/// True when `query` names `table`: as a word, in any case (a name inside a string or a comment
/// counts too, which only fetches a table the query does not read).
fn names(query: &str, table: &str) -> bool {
    query
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|word| word.eq_ignore_ascii_case(table))
}

/// The columns of `query`'s answer, as DuckDB describes them.
fn describe(connection: &duckdb::Connection, query: &str) -> Result<Vec<AnswerColumn>, QueryError> {
    let mut statement = connection.prepare(&format!("DESCRIBE SELECT * FROM ({query}\n)"))?;
    let columns = statement.query_map([], |row| {
        Ok(AnswerColumn {
            name: row.get(0)?,
            sql_type: row.get(1)?,
        })
    })?;
    Ok(columns.collect::<Result<_, _>>()?)
}

/// An answer that could not be written.
fn written(err: std::io::Error) -> QueryError {
    QueryError::Internal(format!("writing the answer: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_named_as_a_word_in_any_case() {
        assert!(names("SELECT * FROM task_attempts", "task_attempts"));
        assert!(names("select count(*) from \"JOBS\";", "jobs"));
        assert!(names("FROM nodes", "nodes"));
        assert!(!names("SELECT * FROM task_attempts_old", "task_attempts"));
        assert!(!names("SELECT jobs_done FROM x", "jobs"));
    }
}
