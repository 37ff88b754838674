//! A page of a list route: its size budget, the cursor to the rest, and the task table's
//! cursor positions (a sort value and the attempt's key), which the task table and the
//! timeline share.

use duckdb::types::Value;
use serde_json::Value as Json;

use super::json::JsonRow;
use super::params::Cursor;
use crate::query::QueryError;

/// Most bytes of rows in one page. Lambda refuses a response over 6 MB, and it carries the body
/// as an escaped JSON string: a page of long stack traces must end early instead of failing.
pub(crate) const PAGE_BYTES: usize = 4 * 1024 * 1024;

/// Trims a page fetched with one extra row, to `limit` rows and at most [`PAGE_BYTES`] (always
/// at least one row), and returns the cursor of the page's last row when there is more.
pub(crate) fn page_cursor(
    rows: &mut Vec<JsonRow>,
    limit: usize,
    cursor_of: impl Fn(&JsonRow) -> Cursor,
) -> Option<String> {
    page_cursor_within(rows, limit, PAGE_BYTES, cursor_of)
}

/// [`page_cursor`] within `max_bytes` instead of [`PAGE_BYTES`].
fn page_cursor_within(
    rows: &mut Vec<JsonRow>,
    limit: usize,
    max_bytes: usize,
    cursor_of: impl Fn(&JsonRow) -> Cursor,
) -> Option<String> {
    let mut bytes = 0;
    let mut keep = 0;
    for row in rows.iter().take(limit) {
        bytes += serde_json::to_vec(row).map_or(0, |text| text.len()) + 1;
        if keep > 0 && bytes > max_bytes {
            tracing::info!(rows = keep, max_bytes, "page cut short by its size");
            break;
        }
        keep += 1;
    }
    if rows.len() <= keep {
        return None;
    }
    rows.truncate(keep);
    rows.last().map(|last| cursor_of(last).encode())
}

/// A task-table cursor's values, checked: `[sort value, cluster, session, task id, attempt]`.
pub(crate) fn task_position(after: &[Json]) -> Result<Vec<(&'static str, Value)>, QueryError> {
    let invalid = || QueryError::BadRequest("`cursor` is not a cursor this route returned".into());
    let [sort_value, cluster, session, task_id, attempt] = after else {
        return Err(invalid());
    };
    let number = |value: &Json| value.as_i64().map(Value::BigInt).ok_or_else(invalid);
    let text = |value: &Json| {
        value
            .as_str()
            .map(|text| Value::Text(text.to_owned()))
            .ok_or_else(invalid)
    };
    Ok(vec![
        ("sort_key", number(sort_value)?),
        ("cluster", text(cluster)?),
        ("session_name", text(session)?),
        ("task_id", text(task_id)?),
        ("attempt_number", number(attempt)?),
    ])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rows(sizes: &[usize]) -> Vec<JsonRow> {
        sizes
            .iter()
            .enumerate()
            .map(|(index, size)| {
                let mut row = JsonRow::new();
                row.insert("n".into(), json!(index));
                row.insert("text".into(), json!("x".repeat(*size)));
                row
            })
            .collect()
    }

    fn cursor_after(row: &JsonRow) -> Cursor {
        Cursor {
            kind: "test".into(),
            after: vec![row.get("n").cloned().unwrap_or(Json::Null)],
        }
    }

    fn kept(rows: &[JsonRow]) -> Vec<i64> {
        rows.iter()
            .filter_map(|row| row.get("n").and_then(Json::as_i64))
            .collect()
    }

    #[test]
    fn a_page_ends_at_its_byte_budget_with_a_cursor_to_the_rest() {
        // Each row is ~120 bytes of JSON: three fit in 400.
        let mut page = rows(&[100; 6]);
        let next = page_cursor_within(&mut page, 10, 400, cursor_after);
        assert_eq!(kept(&page), [0, 1, 2]);
        assert_eq!(next, Some(cursor_after(&page[2]).encode()));
    }

    #[test]
    fn a_row_larger_than_the_budget_is_still_served_alone() {
        let mut page = rows(&[1000, 10]);
        let next = page_cursor_within(&mut page, 10, 400, cursor_after);
        assert_eq!(kept(&page), [0]);
        assert!(next.is_some());
    }

    #[test]
    fn the_extra_row_means_more_and_a_short_page_means_the_end() {
        let mut page = rows(&[10; 4]);
        let next = page_cursor_within(&mut page, 3, PAGE_BYTES, cursor_after);
        assert_eq!(kept(&page), [0, 1, 2]);
        assert!(next.is_some());
        let mut last = rows(&[10; 2]);
        assert_eq!(
            page_cursor_within(&mut last, 3, PAGE_BYTES, cursor_after),
            None
        );
        assert_eq!(kept(&last), [0, 1]);
    }
}
