//! `afterglow sql`: DuckDB over the history's published tables (docs/tables.md), from a local
//! store or the deployment's bucket, printed as a table, CSV or JSON.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use shared::config::Config;
use shared::keys::ClusterName;
use shared::query::read::params::Scope;
use shared::query::{AnswerColumn, AnswerSink, QueryEngine, QuerySettings};

use crate::maintenance::StoreArgs;
use crate::setup::open_storage;

/// Flags of `afterglow sql`.
#[derive(Debug, clap::Args)]
pub struct SqlArgs {
    /// One SQL query (DuckDB's dialect) over the tables `task_attempts`, `jobs`, `actors`,
    /// `nodes`, `workers` and `placement_groups`, such as
    /// "SELECT state, count(*) FROM task_attempts GROUP BY state".
    #[arg(value_name = "QUERY")]
    pub query: String,
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Only this cluster's sessions.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Only sessions of this name.
    #[arg(long)]
    pub session: Option<String>,
    /// How the answer is printed.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Most rows printed as a table; CSV and JSON print every row.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub max_rows: usize,
}

/// How an answer is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns with a header, NULL written out, and the row count.
    Table,
    /// RFC 4180 CSV with a header; NULL is an empty field.
    Csv,
    /// A JSON array of objects by column name: numbers and booleans as JSON's, everything
    /// else as DuckDB's text of it.
    Json,
}

/// Longest a query may run: it is the user's own, on their own machine.
const TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Runs `afterglow sql`.
pub async fn run(args: SqlArgs, config: Config) -> anyhow::Result<()> {
    let storage = open_storage(&config, args.store.data_dir.clone()).await?;
    let scratch = tempfile::tempdir().context("cannot create a scratch directory")?;
    let settings = QuerySettings {
        timeout: TIMEOUT,
        // A query of the whole history over a bucket copies the whole history: asked for.
        copy_budget_bytes: u64::MAX,
        ..QuerySettings::under(scratch.path())
    };
    let engine = QueryEngine::open(Arc::clone(&storage), settings)?;
    let scope = Scope {
        cluster: args
            .cluster
            .as_deref()
            .map(ClusterName::new)
            .transpose()
            .context("--cluster")?,
        session: args.session.clone(),
        ..Scope::default()
    };
    let out = std::io::BufWriter::new(std::io::stdout());
    let mut out = print(
        &engine,
        &scope,
        &args.query,
        args.format,
        args.max_rows,
        out,
    )
    .await?;
    out.flush().or_else(ignore_closed_reader)?;
    Ok(())
}

/// Runs `query` over the published tables of `scope` and prints its answer to `out` as
/// `format` says (a table of at most `max_rows` rows).
pub async fn print<W: Write + Send + 'static>(
    engine: &QueryEngine,
    scope: &Scope,
    query: &str,
    format: Format,
    max_rows: usize,
    out: W,
) -> anyhow::Result<W> {
    let printer = Printer {
        out,
        format,
        max_rows,
        columns: Vec::new(),
        held: Vec::new(),
        rows: 0,
        closed: false,
    };
    let mut printer = engine.ad_hoc(scope, query, printer).await?;
    printer.finish().or_else(ignore_closed_reader)?;
    Ok(printer.out)
}

/// A reader that went away (`| head`) is not an error of ours.
fn ignore_closed_reader(err: std::io::Error) -> std::io::Result<()> {
    match err.kind() {
        std::io::ErrorKind::BrokenPipe => Ok(()),
        _ => Err(err),
    }
}

/// Prints an answer as it comes (CSV, JSON) or once it is all here (a table, to align it).
struct Printer<W> {
    out: W,
    format: Format,
    max_rows: usize,
    columns: Vec<AnswerColumn>,
    /// A table's rows, up to `max_rows`.
    held: Vec<Vec<Option<String>>>,
    /// Rows answered.
    rows: u64,
    /// The reader went away: nothing more is written.
    closed: bool,
}

impl<W: Write + Send + 'static> AnswerSink for Printer<W> {
    fn columns(&mut self, columns: &[AnswerColumn]) -> std::io::Result<()> {
        self.columns = columns.to_vec();
        match self.format {
            Format::Table => Ok(()),
            Format::Csv => {
                let header: Vec<Option<String>> = columns
                    .iter()
                    .map(|column| Some(column.name.clone()))
                    .collect();
                self.write_line(&csv_line(&header))
            }
            Format::Json => self.write_line("["),
        }
    }

    fn row(&mut self, values: &[Option<String>]) -> std::io::Result<bool> {
        self.rows += 1;
        match self.format {
            Format::Table => {
                if self.held.len() < self.max_rows {
                    self.held.push(values.to_vec());
                }
            }
            Format::Csv => self.write_line(&csv_line(values))?,
            Format::Json => {
                let object = json_object(&self.columns, values);
                let separator = if self.rows > 1 { "," } else { "" };
                self.write_line(&format!("{separator}{object}"))?;
            }
        }
        Ok(!self.closed)
    }
}

impl<W: Write> Printer<W> {
    /// Writes `line` and a newline; a reader that went away ends the answer.
    fn write_line(&mut self, line: &str) -> std::io::Result<()> {
        if self.closed {
            return Ok(());
        }
        match writeln!(self.out, "{line}") {
            Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            written => written,
        }
    }

    /// What comes after the last row: a table itself, JSON's closing bracket.
    fn finish(&mut self) -> std::io::Result<()> {
        match self.format {
            Format::Table => {
                let lines = table_lines(&self.columns, &self.held);
                for line in lines {
                    self.write_line(&line)?;
                }
                let shown = self.held.len() as u64;
                let count = if shown < self.rows {
                    format!(
                        "({} rows, {shown} shown; --max-rows shows more, --format csv all)",
                        self.rows
                    )
                } else if self.rows == 1 {
                    "(1 row)".to_owned()
                } else {
                    format!("({} rows)", self.rows)
                };
                self.write_line(&count)
            }
            Format::Csv => Ok(()),
            Format::Json => self.write_line("]"),
        }
    }
}

/// One CSV record (RFC 4180): a field with a comma, quote or line break is quoted, its quotes
/// doubled; NULL is an empty field.
fn csv_line(values: &[Option<String>]) -> String {
    let fields: Vec<String> = values
        .iter()
        .map(|value| match value.as_deref() {
            None => String::new(),
            Some(text) if text.contains([',', '"', '\n', '\r']) => {
                format!("\"{}\"", text.replace('"', "\"\""))
            }
            Some(text) => text.to_owned(),
        })
        .collect();
    fields.join(",")
}

/// True for DuckDB's numeric types, whose text is a JSON number (but for `inf` and `nan`).
fn numeric(sql_type: &str) -> bool {
    const NUMERIC: [&str; 12] = [
        "TINYINT",
        "SMALLINT",
        "INTEGER",
        "BIGINT",
        "HUGEINT",
        "UTINYINT",
        "USMALLINT",
        "UINTEGER",
        "UBIGINT",
        "UHUGEINT",
        "FLOAT",
        "DOUBLE",
    ];
    NUMERIC.contains(&sql_type) || sql_type.starts_with("DECIMAL")
}

/// One row as a JSON object by column name.
fn json_object(columns: &[AnswerColumn], values: &[Option<String>]) -> serde_json::Value {
    let object: serde_json::Map<String, serde_json::Value> = columns
        .iter()
        .zip(values)
        .map(|(column, value)| {
            let json = match value.as_deref() {
                None => serde_json::Value::Null,
                Some(text) if column.sql_type == "BOOLEAN" => {
                    serde_json::Value::Bool(text == "true")
                }
                Some(text) if numeric(&column.sql_type) => {
                    serde_json::from_str::<serde_json::Number>(text)
                        .map_or_else(|_| text.into(), serde_json::Value::Number)
                }
                Some(text) => text.into(),
            };
            (column.name.clone(), json)
        })
        .collect();
    serde_json::Value::Object(object)
}

/// A table's lines: the header, a rule, then the rows, each column as wide as its widest
/// value, numbers to the right; NULL written out, line breaks as `\n`.
fn table_lines(columns: &[AnswerColumn], rows: &[Vec<Option<String>>]) -> Vec<String> {
    let cell = |value: &Option<String>| match value {
        None => "NULL".to_owned(),
        Some(text) => text.replace('\r', "\\r").replace('\n', "\\n"),
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(cell).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(index, column)| {
            cells
                .iter()
                .filter_map(|row| row.get(index))
                .map(|text| text.chars().count())
                .chain([column.name.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |values: &[String], right: &dyn Fn(usize) -> bool| {
        let padded: Vec<String> = values
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(index, (text, width))| {
                if right(index) {
                    format!(" {text:>width$} ")
                } else {
                    format!(" {text:<width$} ")
                }
            })
            .collect();
        padded.join("|").trim_end().to_owned()
    };
    let names: Vec<String> = columns.iter().map(|column| column.name.clone()).collect();
    let mut lines = vec![line(&names, &|_| false)];
    let rule: Vec<String> = widths.iter().map(|width| "-".repeat(width + 2)).collect();
    lines.push(rule.join("+"));
    let right = |index: usize| {
        columns
            .get(index)
            .is_some_and(|column| numeric(&column.sql_type))
    };
    lines.extend(cells.iter().map(|row| line(row.as_slice(), &right)));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(name: &str, sql_type: &str) -> AnswerColumn {
        AnswerColumn {
            name: name.into(),
            sql_type: sql_type.into(),
        }
    }

    #[test]
    fn csv_quotes_only_what_needs_it_and_leaves_null_empty() {
        let values = [
            Some("plain".to_owned()),
            Some("a,b".to_owned()),
            Some("say \"hi\"".to_owned()),
            Some("two\nlines".to_owned()),
            None,
            Some(String::new()),
        ];
        assert_eq!(
            csv_line(&values),
            "plain,\"a,b\",\"say \"\"hi\"\"\",\"two\nlines\",,"
        );
    }

    #[test]
    fn json_keeps_numbers_and_flags_typed_and_the_rest_as_text() {
        let columns = [
            column("n", "BIGINT"),
            column("x", "DOUBLE"),
            column("d", "DECIMAL(5,2)"),
            column("ok", "BOOLEAN"),
            column("s", "VARCHAR"),
            column("l", "INTEGER[]"),
            column("inf", "DOUBLE"),
            column("none", "BIGINT"),
        ];
        let values = [
            Some("12".to_owned()),
            Some("1.5".to_owned()),
            Some("3.25".to_owned()),
            Some("false".to_owned()),
            Some("12".to_owned()),
            Some("[1, 2]".to_owned()),
            Some("inf".to_owned()),
            None,
        ];
        assert_eq!(
            json_object(&columns, &values),
            serde_json::json!({"n": 12, "x": 1.5, "d": 3.25, "ok": false, "s": "12",
                "l": "[1, 2]", "inf": "inf", "none": null})
        );
    }

    #[test]
    fn a_table_aligns_its_columns_and_numbers_to_the_right() {
        let columns = [column("state", "VARCHAR"), column("n", "BIGINT")];
        let rows = [
            vec![Some("FINISHED".to_owned()), Some("1082".to_owned())],
            vec![None, Some("7".to_owned())],
        ];
        assert_eq!(
            table_lines(&columns, &rows),
            [
                " state    | n",
                "----------+------",
                " FINISHED | 1082",
                " NULL     |    7",
            ]
        );
    }
}
