//! `/api/jobs`, `/api/actors`, `/api/nodes`, `/api/workers`, `/api/placement_groups`,
//! `/api/submissions`: pages of the entity tables, in Ray's state-API field names.

use duckdb::types::Value;
use serde_json::{Value as Json, json};

use super::read::json::query_rows;
use super::read::page::page_cursor;
use super::read::params::{Cursor, Params, Scope};
use super::read::snapshot::Needs;
use super::read::sql::{Relation, Sql, keyset_after, read_parquet};
use super::{QueryEngine, QueryError};
use crate::tables::entities::EntityKind;

/// What a kind can be filtered on beyond its scope: `(parameter, column, is an id)`.
fn filters(kind: EntityKind) -> &'static [(&'static str, &'static str, bool)] {
    match kind {
        EntityKind::Jobs => &[("job_id", "job_id", true), ("state", "state", false)],
        EntityKind::Actors => &[
            ("job_id", "job_id", true),
            ("node_id", "node_id", true),
            ("state", "state", false),
            ("class_name", "class_name", false),
            ("name", "name", false),
        ],
        EntityKind::Nodes => &[("node_id", "node_id", true), ("state", "state", false)],
        EntityKind::Workers => &[
            ("job_id", "job_id", true),
            ("node_id", "node_id", true),
            ("worker_type", "worker_type", false),
        ],
        EntityKind::PlacementGroups => &[
            ("creator_job_id", "creator_job_id", true),
            ("state", "state", false),
        ],
        EntityKind::Submissions => &[("state", "state", false)],
    }
}

/// The column identifying a row of `kind` within its session.
fn id_column(kind: EntityKind) -> &'static str {
    match kind {
        EntityKind::Jobs => "job_id",
        EntityKind::Actors => "actor_id",
        EntityKind::Nodes => "node_id",
        EntityKind::Workers => "worker_id",
        EntityKind::PlacementGroups => "placement_group_id",
        EntityKind::Submissions => "submission_id",
    }
}

/// Columns stored as JSON text, returned as JSON.
const JSON_COLUMNS: [&str; 3] = ["labels", "resources_total", "bundles"];

/// `GET /api/{kind}`.
pub(super) async fn entities(
    engine: &QueryEngine,
    kind: EntityKind,
    params: &[(String, String)],
) -> Result<Json, QueryError> {
    let mut allowed = Scope::PARAMS.to_vec();
    allowed.extend(["limit", "cursor"]);
    allowed.extend(filters(kind).iter().map(|(name, _, _)| *name));
    let params = Params::parse(params, &allowed)?;
    let scope = Scope::from_params(&params)?;
    let limit = params.limit()?;
    let cursor_kind = kind.table().to_owned();
    let cursor = params.cursor(&cursor_kind)?;
    let id = id_column(kind);

    let mut sql = Sql::default();
    sql.push("SELECT * EXCLUDE (record) FROM ");
    let snapshot = engine
        .snapshot(
            &scope,
            Needs {
                entity: Some(kind),
                ..Needs::default()
            },
        )
        .await?;
    let files = snapshot.entities.get(&kind).cloned().unwrap_or_default();
    if files.is_empty() {
        return Ok(json!({ kind.table(): [], "next": null }));
    }
    let paths: Vec<&std::path::Path> = files.iter().map(std::path::PathBuf::as_path).collect();
    let relation = Relation::over_files(read_parquet(&paths, ""), snapshot.pins.clone());
    sql.relation(&relation).push(" WHERE TRUE");
    for (column, value) in [
        ("cluster", scope.cluster.as_ref().map(ToString::to_string)),
        ("session_name", scope.session.clone()),
    ] {
        if let Some(value) = value {
            sql.push(" AND ").push(column).push(" = ").bind(value);
        }
    }
    for (name, column, is_id) in filters(kind) {
        let value = if *is_id {
            params.hex(name)?
        } else {
            params.text(name)?
        };
        if let Some(value) = value {
            sql.push(" AND ").push(column).push(" = ").bind(value);
        }
    }
    if let Some(cursor) = &cursor {
        let invalid =
            || QueryError::BadRequest("`cursor` is not a cursor this route returned".into());
        let [cluster, session, last_id] = cursor.after.as_slice() else {
            return Err(invalid());
        };
        let text = |value: &Json| {
            value
                .as_str()
                .map(|text| Value::Text(text.to_owned()))
                .ok_or_else(invalid)
        };
        sql.push(" AND ").append(keyset_after(&[
            ("cluster", text(cluster)?, false),
            ("session_name", text(session)?, false),
            (id, text(last_id)?, false),
        ]));
    }
    sql.push(" ORDER BY cluster, session_name, ")
        .push(id)
        .push(" LIMIT ")
        .number(limit + 1);
    let mut rows = engine
        .run(move |connection| query_rows(connection, &sql.text, &sql.params))
        .await?;
    let next = page_cursor(&mut rows, limit, |last| Cursor {
        kind: cursor_kind.clone(),
        after: ["cluster", "session_name", id]
            .iter()
            .map(|column| last.get(*column).cloned().unwrap_or(Json::Null))
            .collect(),
    });
    for row in &mut rows {
        for column in JSON_COLUMNS {
            if let Some(Json::String(text)) = row.get(column) {
                let parsed = serde_json::from_str(text).unwrap_or(Json::Null);
                row.insert(column.to_owned(), parsed);
            }
        }
    }
    Ok(json!({ kind.table(): rows, "next": next }))
}
