//! The published tables: the history as other engines and `afterglow sql` read it, by name,
//! each with its columns and their types (a public contract, listed in docs/tables.md).
//!
//! Each is a stored table less what belongs to compaction alone, read as its newest rows:
//!
//! - `task_attempts`: one row per task attempt, every stored column but
//!   `serialized_runtime_env` and the report times stored by reference. A runtime env's
//!   `env_vars` hold credentials, and an engine that reads the files in place cannot mask them
//!   as our answers do (`query::redaction`); a column left out of the published table is one no
//!   reader of it ever sees. A report time stored by reference is NULL in its own column (see
//!   [`super::report_times`]): published, it would read as never reported.
//! - `jobs`, `actors`, `nodes`, `workers`, `placement_groups`: one row per entity and
//!   session, every column but `record` (the merge state compaction reads back, runtime envs
//!   included).
//!
//! Every table starts with `cluster` and `session_name`: the history of every cluster and
//! session is one table.

use super::columns::Column;
use super::entities::EntityKind;
use super::report_times;
use super::task_attempts;

/// Stored columns no published table has, for what they hold (see the module's
/// documentation).
const WITHHELD: [&str; 2] = ["serialized_runtime_env", "record"];

/// True for a stored column no published table has: [`WITHHELD`], and the report times
/// compaction may store by reference to another column (`node_id_at`, `definition_at`, …; see
/// [`super::report_times`]), which read as NULL where they were.
pub fn withheld(column: &str) -> bool {
    WITHHELD.contains(&column)
        || report_times::stored_by_reference(column)
        || report_times::is_reference_column(column)
}

/// What a published table is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The newest rows of `task_attempts` (base files and deltas, deletion vectors applied).
    Attempts,
    /// An entity table: one file per session.
    Entities(EntityKind),
}

/// One published table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedTable {
    /// Its name.
    pub name: &'static str,
    /// What it is read from.
    pub source: Source,
    /// Its columns in order, with their field ids and DuckDB types.
    pub columns: Vec<Column>,
}

impl PublishedTable {
    /// A `SELECT` list of the published columns, each named, for a relation of the stored
    /// table's rows.
    pub fn select_list(&self) -> String {
        let names: Vec<&str> = self.columns.iter().map(|column| column.name).collect();
        names.join(", ")
    }

    /// `SELECT` of no rows with the published columns and types: the table of a scope that
    /// holds none.
    pub fn empty(&self) -> String {
        let columns: Vec<String> = self
            .columns
            .iter()
            .map(|column| format!("NULL::{} AS {}", column.sql_type, column.name))
            .collect();
        format!("SELECT {} WHERE false", columns.join(", "))
    }
}

/// Every stored column of what `source` reads, withheld ones too, with the field ids its
/// files carry.
pub fn stored_columns(source: Source) -> Vec<Column> {
    match source {
        Source::Attempts => task_attempts::STORED_COLUMNS.to_vec(),
        Source::Entities(kind) => kind.stored_columns(),
    }
}

/// Every published table: `task_attempts`, then the entity tables.
pub fn published_tables() -> Vec<PublishedTable> {
    let published = |source: Source| {
        stored_columns(source)
            .into_iter()
            .filter(|column| !withheld(column.name))
            .collect()
    };
    let mut tables = vec![PublishedTable {
        name: "task_attempts",
        source: Source::Attempts,
        columns: published(Source::Attempts),
    }];
    for kind in EntityKind::ALL {
        tables.push(PublishedTable {
            name: kind.table(),
            source: Source::Entities(kind),
            columns: published(Source::Entities(kind)),
        });
    }
    tables
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_published_table_has_a_withheld_column() {
        for table in published_tables() {
            for column in &table.columns {
                assert!(!withheld(column.name), "{}.{}", table.name, column.name);
            }
            let first: Vec<&str> = table.columns.iter().take(2).map(|c| c.name).collect();
            assert_eq!(first, ["cluster", "session_name"], "{}", table.name);
        }
    }

    /// Every stored column of a published table has a field id of its own, withheld ones too
    /// (their ids stay taken).
    #[test]
    fn field_ids_are_unique_and_positive_within_each_table() {
        for table in published_tables() {
            let columns = stored_columns(table.source);
            let table = table.name;
            let mut ids: Vec<i32> = columns.iter().map(|column| column.id).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(
                ids.len(),
                columns.len(),
                "{table}: a field id is used twice"
            );
            assert!(
                ids.iter().all(|id| *id > 0),
                "{table}: a field id is not positive"
            );
            let mut names: Vec<&str> = columns.iter().map(|column| column.name).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(
                names.len(),
                columns.len(),
                "{table}: a column is listed twice"
            );
        }
    }

    /// A column as docs/tables.md lists it: name, type and field id.
    type DocumentedColumn = (String, String, String);

    /// docs/tables.md is the contract users and other engines build on: each table's section
    /// lists its columns in order with their types and field ids, and a change to a published
    /// column fails here until the document says so too.
    #[test]
    fn docs_list_every_published_column_with_its_type_and_field_id()
    -> Result<(), Box<dyn std::error::Error>> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/tables.md");
        let text = std::fs::read_to_string(&path)?;
        let quoted = |cell: &str| {
            cell.trim()
                .strip_prefix('`')
                .and_then(|inner| inner.strip_suffix('`'))
                .map(str::to_owned)
        };
        let mut documented: Vec<(String, Vec<DocumentedColumn>)> = Vec::new();
        for line in text.lines() {
            if let Some(name) = line.strip_prefix("## ") {
                documented.push((name.trim().to_owned(), Vec::new()));
            } else if let Some((_, columns)) = documented.last_mut()
                && let [_, name, sql_type, id, ..] = line.split('|').collect::<Vec<_>>().as_slice()
                && let (Some(name), Some(sql_type)) = (quoted(name), quoted(sql_type))
            {
                columns.push((name, sql_type, id.trim().to_owned()));
            }
        }
        let published: Vec<(String, Vec<DocumentedColumn>)> = published_tables()
            .into_iter()
            .map(|table| {
                let columns = table
                    .columns
                    .iter()
                    .map(|column| {
                        (
                            column.name.to_owned(),
                            column.sql_type.to_owned(),
                            column.id.to_string(),
                        )
                    })
                    .collect();
                (table.name.to_owned(), columns)
            })
            .collect();
        assert_eq!(documented, published, "docs/tables.md");
        Ok(())
    }
}
