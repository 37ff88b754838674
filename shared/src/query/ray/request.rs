//! The query string of Ray's routes, read the way Ray 2.60's dashboard reads it
//! (`dashboard/state_api_utils.py`): `limit`, `detail`, `exclude_driver`, and filters as
//! repeated `filter_keys` / `filter_predicates` / `filter_values`. Parameters Ray ignores
//! (`timeout`, `server_timeout_multiplier`) are ignored here too.
//!
//! A filter is checked against the resource's filterable columns and typed by the column: ids
//! compare lower-cased, enum names upper-cased, other text case-insensitively (as Ray does for
//! every string), integers and booleans after conversion. The same typed filter becomes SQL for
//! the task table and a row predicate for the small entity tables.

use serde_json::Value as Json;

use crate::query::QueryError;
use crate::query::read::sql::Sql;

/// Ray's default page size.
pub const DEFAULT_LIMIT: usize = 100;

/// The most rows one list may ask for. Ray's own server refuses more than 10 000
/// (`RAY_MAX_LIMIT_FROM_API_SERVER`); a history outgrows that, and Ray's CLI lifts its side of
/// the cap with that variable, so the cap here is higher, but there is one: a list reads and
/// sorts up to `limit` rows before the response's size cuts it.
pub const MAX_LIMIT: usize = 1_000_000;

/// The most filters one request may carry: each is a condition on every row read, and no
/// page of Ray's sends more than a handful.
pub const MAX_FILTERS: usize = 32;

/// `limit` as Ray reads it (`int(…)`), refused past [`MAX_LIMIT`] in Ray's words.
fn parse_limit(text: &str) -> Result<usize, QueryError> {
    // Digits too many for any integer type are still a number Ray would call too large.
    let too_large = || {
        QueryError::BadRequest(format!(
            "Given limit {text} exceeds the supported limit {MAX_LIMIT}. Use a lower limit."
        ))
    };
    if !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit()) {
        let limit = text.parse::<usize>().map_err(|_| too_large())?;
        return if limit > MAX_LIMIT {
            Err(too_large())
        } else {
            Ok(limit)
        };
    }
    Err(QueryError::BadRequest(format!(
        "invalid literal for int() with base 10: '{text}' (limit must be a whole number of \
         rows, 0 or more)"
    )))
}

/// How a filterable column compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnKind {
    /// A hex id, stored lower-case.
    Id,
    /// An enum name, stored upper-case.
    Enum,
    /// Free text, compared case-insensitively.
    Text,
    /// An integer.
    Integer,
    /// A boolean.
    Boolean,
}

/// A filterable column of a resource.
pub type Column = (&'static str, ColumnKind);

/// A filter's operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Predicate {
    /// `=`.
    Equal,
    /// `!=`.
    NotEqual,
}

/// A filter's value, converted for its column.
#[derive(Clone, Debug, PartialEq)]
pub enum FilterValue {
    /// Text in the column's stored case (ids lower, enums upper), or any case for free text.
    Text(String),
    /// An integer.
    Integer(i64),
    /// A boolean.
    Boolean(bool),
}

/// One checked filter.
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    /// The column (one of the resource's filterable columns).
    pub column: &'static str,
    /// How it compares.
    pub kind: ColumnKind,
    /// `=` or `!=`.
    pub predicate: Predicate,
    /// The value.
    pub value: FilterValue,
}

/// The options of a Ray list or summary request.
#[derive(Clone, Debug, PartialEq)]
pub struct RayQuery {
    /// Rows wanted (`limit`, default 100, at most [`MAX_LIMIT`]); the response's size may cut
    /// the list shorter.
    pub limit: usize,
    /// All columns (`detail`), not only the default ones.
    pub detail: bool,
    /// Hide driver tasks (`exclude_driver`, default true).
    pub exclude_driver: bool,
    /// The filters, all of which must hold.
    pub filters: Vec<Filter>,
}

impl RayQuery {
    /// Reads `pairs` for a resource whose filterable columns are `columns`.
    pub fn parse(pairs: &[(String, String)], columns: &[Column]) -> Result<Self, QueryError> {
        let values = |name: &str| -> Vec<&str> {
            pairs
                .iter()
                .filter(|(key, _)| key == name)
                .map(|(_, value)| value.as_str())
                .collect()
        };
        let first = |name: &str| values(name).first().copied();
        let limit = match first("limit") {
            None => DEFAULT_LIMIT,
            Some(text) => parse_limit(text)?,
        };
        let detail = first("detail").map(boolean).transpose()?.unwrap_or(false);
        let exclude_driver = first("exclude_driver")
            .map(boolean)
            .transpose()?
            .unwrap_or(true);
        let keys = values("filter_keys");
        let predicates = values("filter_predicates");
        let filter_values = values("filter_values");
        if keys.len() > MAX_FILTERS {
            return Err(QueryError::BadRequest(format!(
                "{} filters were given; at most {MAX_FILTERS} are supported",
                keys.len()
            )));
        }
        if keys.len() != filter_values.len() || keys.len() != predicates.len() {
            return Err(QueryError::BadRequest(format!(
                "{} filter_keys, {} filter_predicates and {} filter_values were given; each \
                 filter needs one of each",
                keys.len(),
                predicates.len(),
                filter_values.len()
            )));
        }
        let filters = keys
            .iter()
            .zip(&predicates)
            .zip(&filter_values)
            .map(|((key, predicate), value)| Filter::parse(key, predicate, value, columns))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            limit,
            detail,
            exclude_driver,
            filters,
        })
    }

    /// The filters as SQL conditions, each starting with ` AND `.
    pub fn conditions(&self) -> Sql {
        let mut sql = Sql::default();
        for filter in &self.filters {
            sql.push(" AND ").append(filter.condition());
        }
        sql
    }

    /// True when `row` (a Ray-shaped row) passes every filter.
    pub fn matches(&self, row: &serde_json::Map<String, Json>) -> bool {
        self.filters.iter().all(|filter| filter.matches(row))
    }
}

/// Ray's string-to-bool conversion (`util/state/util.py`): exactly these spellings.
pub fn boolean(text: &str) -> Result<bool, QueryError> {
    match text {
        "True" | "true" | "1" => Ok(true),
        "False" | "false" | "0" => Ok(false),
        other => Err(QueryError::BadRequest(format!(
            "Failed to convert a value {other} of type <class 'str'> to <class 'bool'>"
        ))),
    }
}

impl Filter {
    fn parse(
        key: &str,
        predicate: &str,
        value: &str,
        columns: &[Column],
    ) -> Result<Self, QueryError> {
        let predicate = match predicate {
            "=" => Predicate::Equal,
            "!=" => Predicate::NotEqual,
            other => {
                return Err(QueryError::BadRequest(format!(
                    "Unsupported filter predicate {other} is given. Available predicates: =, !=."
                )));
            }
        };
        let wanted = key.to_lowercase();
        let Some(&(column, kind)) = columns.iter().find(|(name, _)| *name == wanted) else {
            let supported: Vec<&str> = columns.iter().map(|(name, _)| *name).collect();
            return Err(QueryError::BadRequest(format!(
                "The given filter column {wanted} is not supported. Enter filters with \
                 --filter key=value or --filter key!=value Supported filter columns: {}",
                supported.join(", ")
            )));
        };
        let value = match kind {
            ColumnKind::Id => FilterValue::Text(value.to_lowercase()),
            ColumnKind::Enum => FilterValue::Text(value.to_uppercase()),
            ColumnKind::Text => FilterValue::Text(value.to_owned()),
            ColumnKind::Integer => FilterValue::Integer(value.trim().parse().map_err(|_| {
                QueryError::BadRequest(format!(
                    "Invalid filter `--filter {column} {value}` for a int type column. Please \
                     provide an integer filter `--filter {column} [int]`"
                ))
            })?),
            ColumnKind::Boolean => FilterValue::Boolean(boolean(value).map_err(|_| {
                QueryError::BadRequest(format!(
                    "Invalid filter `--filter {column} {value}` for a boolean type column. \
                     Please provide `--filter {column} [True|true|1]` for True or `--filter \
                     {column} [False|false|0]` for False."
                ))
            })?),
        };
        Ok(Self {
            column,
            kind,
            predicate,
            value,
        })
    }

    /// The condition in SQL. A null column matches neither `=` nor `!=`, as in Ray, where a
    /// missing field matches no filter.
    fn condition(&self) -> Sql {
        let mut sql = Sql::default();
        let operator = match self.predicate {
            Predicate::Equal => " = ",
            Predicate::NotEqual => " <> ",
        };
        match &self.value {
            FilterValue::Text(text) if self.kind == ColumnKind::Text => {
                sql.push("lower(")
                    .push(self.column)
                    .push(")")
                    .push(operator)
                    .bind(text.to_lowercase());
            }
            FilterValue::Text(text) => {
                sql.push(self.column).push(operator).bind(text.clone());
            }
            FilterValue::Integer(number) => {
                sql.push(self.column).push(operator).bind(*number);
            }
            FilterValue::Boolean(flag) => {
                sql.push(self.column).push(operator).bind(*flag);
            }
        }
        sql
    }

    /// True when `row`'s column passes; a missing or null field never does.
    fn matches(&self, row: &serde_json::Map<String, Json>) -> bool {
        let equal = match (row.get(self.column), &self.value) {
            (None | Some(Json::Null), _) => return false,
            (Some(Json::String(found)), FilterValue::Text(wanted)) => {
                found.to_lowercase() == wanted.to_lowercase()
            }
            (Some(Json::Number(found)), FilterValue::Integer(wanted)) => {
                found.as_i64() == Some(*wanted)
            }
            // Actors' restart counts and the like are strings of digits in Ray's rows.
            (Some(Json::String(found)), FilterValue::Integer(wanted)) => {
                found.parse::<i64>().ok() == Some(*wanted)
            }
            (Some(Json::Bool(found)), FilterValue::Boolean(wanted)) => found == wanted,
            (Some(_), _) => false,
        };
        match self.predicate {
            Predicate::Equal => equal,
            Predicate::NotEqual => !equal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COLUMNS: &[Column] = &[
        ("task_id", ColumnKind::Id),
        ("state", ColumnKind::Enum),
        ("name", ColumnKind::Text),
        ("attempt_number", ColumnKind::Integer),
        ("is_debugger_paused", ColumnKind::Boolean),
    ];

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn the_cli_request_reads_as_ray_reads_it() -> Result<(), QueryError> {
        let query = RayQuery::parse(
            &pairs(&[
                ("limit", "10000"),
                ("timeout", "24"),
                ("detail", "True"),
                ("exclude_driver", "True"),
                ("server_timeout_multiplier", "0.8"),
                ("filter_keys", "STATE"),
                ("filter_predicates", "="),
                ("filter_values", "failed"),
                ("filter_keys", "attempt_number"),
                ("filter_predicates", "!="),
                ("filter_values", "0"),
            ]),
            COLUMNS,
        )?;
        assert_eq!(query.limit, 10_000);
        assert!(query.detail && query.exclude_driver);
        assert_eq!(
            query.filters,
            [
                Filter {
                    column: "state",
                    kind: ColumnKind::Enum,
                    predicate: Predicate::Equal,
                    value: FilterValue::Text("FAILED".into()),
                },
                Filter {
                    column: "attempt_number",
                    kind: ColumnKind::Integer,
                    predicate: Predicate::NotEqual,
                    value: FilterValue::Integer(0),
                },
            ]
        );
        Ok(())
    }

    #[test]
    fn defaults_are_rays() -> Result<(), QueryError> {
        let query = RayQuery::parse(&[], COLUMNS)?;
        assert_eq!(query.limit, DEFAULT_LIMIT);
        assert!(!query.detail);
        assert!(query.exclude_driver);
        assert!(query.filters.is_empty());
        Ok(())
    }

    #[test]
    fn bad_filters_get_rays_messages() {
        let message = |list: &[(&str, &str)]| match RayQuery::parse(&pairs(list), COLUMNS) {
            Err(QueryError::BadRequest(message)) => message,
            other => format!("not a bad request: {other:?}"),
        };
        assert!(
            message(&[
                ("filter_keys", "bogus"),
                ("filter_predicates", "="),
                ("filter_values", "x")
            ])
            .starts_with("The given filter column bogus is not supported.")
        );
        assert!(
            message(&[
                ("filter_keys", "state"),
                ("filter_predicates", "~"),
                ("filter_values", "x")
            ])
            .starts_with("Unsupported filter predicate ~ is given.")
        );
        assert!(
            message(&[
                ("filter_keys", "attempt_number"),
                ("filter_predicates", "="),
                ("filter_values", "x")
            ])
            .contains("for a int type column")
        );
        assert!(message(&[("detail", "yes")]).starts_with("Failed to convert a value yes"));
        assert!(message(&[("limit", "-1")]).contains("limit must be"));
        for huge in ["1000001", "18446744073709551615", "99999999999999999999999"] {
            assert!(
                message(&[("limit", huge)]).starts_with(&format!(
                    "Given limit {huge} exceeds the supported limit {MAX_LIMIT}."
                )),
                "{huge}: {}",
                message(&[("limit", huge)])
            );
        }
        let many: Vec<(&str, &str)> = (0..=MAX_FILTERS)
            .flat_map(|_| {
                [
                    ("filter_keys", "state"),
                    ("filter_predicates", "="),
                    ("filter_values", "FAILED"),
                ]
            })
            .collect();
        assert!(message(&many).contains(&format!("at most {MAX_FILTERS} are supported")));
        assert!(message(&[("filter_keys", "state")]).contains("each filter needs one of each"));
    }

    #[test]
    fn rows_match_like_rays_do_filter() -> Result<(), QueryError> {
        let query = |key: &str, predicate: &str, value: &str| {
            RayQuery::parse(
                &pairs(&[
                    ("filter_keys", key),
                    ("filter_predicates", predicate),
                    ("filter_values", value),
                ]),
                COLUMNS,
            )
        };
        let row = serde_json::json!({"name": "Train", "state": "FAILED", "attempt_number": 1,
            "is_debugger_paused": null});
        let Json::Object(row) = row else {
            return Err(QueryError::Internal("not an object".into()));
        };
        assert!(query("name", "=", "train")?.matches(&row));
        assert!(!query("name", "!=", "TRAIN")?.matches(&row));
        assert!(query("state", "=", "failed")?.matches(&row));
        assert!(query("attempt_number", "=", "1")?.matches(&row));
        assert!(query("attempt_number", "!=", "0")?.matches(&row));
        // A null field matches neither predicate.
        assert!(!query("is_debugger_paused", "=", "false")?.matches(&row));
        assert!(!query("is_debugger_paused", "!=", "false")?.matches(&row));
        assert!(!query("task_id", "!=", "ab")?.matches(&row));
        Ok(())
    }
}
