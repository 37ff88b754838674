//! What Ray's routes answer with: the body ([`RayBody`]: its bytes, media type and encoding),
//! the state API's envelopes around a list or a summary, and a list cut to the response's size.

use serde_json::{Value as Json, json};

use crate::query::{QueryEngine, QueryError};

/// The leading rows of a Ray list that fit a response of `budget` bytes (of JSON), taken one
/// at a time, so that rows past the budget are never built: the first row always, then each
/// while the total stays within the budget.
#[derive(Debug)]
pub(super) struct RowBudget {
    budget: usize,
    bytes: usize,
    rows: Vec<Json>,
}

impl RowBudget {
    /// An empty list of `budget` bytes.
    pub(super) fn new(budget: usize) -> Self {
        Self {
            budget,
            bytes: 0,
            rows: Vec::new(),
        }
    }

    /// Keeps `row` when it fits; `false` once one does not, where the list is cut.
    pub(super) fn admit(&mut self, row: Json) -> bool {
        let size = serde_json::to_vec(&row).map_or(0, |text| text.len()) + 2;
        if !self.rows.is_empty() && self.bytes + size > self.budget {
            return false;
        }
        self.bytes += size;
        self.rows.push(row);
        true
    }

    /// The rows kept, with a warning when they are fewer than the `total` the list had.
    pub(super) fn finish(self, what: &str, total: usize) -> (Vec<Json>, Vec<String>) {
        let keep = self.rows.len();
        if keep >= total {
            return (self.rows, Vec::new());
        }
        let budget = self.budget;
        tracing::info!(rows = keep, budget, "Ray list cut short by its size");
        let warning = format!(
            "Afterglow returned the first {keep} of {total} {what}: more would exceed this \
             deployment's response size limit of {budget} bytes (of JSON). Narrow the list with filters \
             (--filter) or a lower limit."
        );
        (self.rows, vec![warning])
    }
}

impl QueryEngine {
    /// Keeps the leading `rows` that fit in `budget` bytes, with a warning when some did not.
    pub(super) fn within_response(
        &self,
        rows: Vec<Json>,
        what: &str,
        budget: usize,
    ) -> (Vec<Json>, Vec<String>) {
        let total = rows.len();
        let mut kept = RowBudget::new(budget);
        for row in rows {
            if !kept.admit(row) {
                break;
            }
        }
        kept.finish(what, total)
    }
}

/// A Ray route's answer: the bytes to send, their media type and whether they are gzipped.
///
/// JSON is kept as text rather than a `serde_json::Value` because a lineage summary is as deep
/// as the task tree, and a `Value` that deep cannot be serialized or even dropped without
/// overflowing the stack ([`summary`](super::summary) writes it as text). Log routes answer plain text.
#[derive(Clone, Debug)]
pub struct RayBody {
    bytes: Vec<u8>,
    content_type: &'static str,
    gzipped: bool,
}

impl RayBody {
    /// The media type (`application/json`, or `text/plain` for log files).
    pub fn content_type(&self) -> &'static str {
        self.content_type
    }

    /// `gzip` when the body is gzipped ([`QueryEngine::answer_ray_gzipped`]), to be sent as
    /// its `Content-Encoding`.
    pub fn content_encoding(&self) -> Option<&'static str> {
        self.gzipped.then_some("gzip")
    }

    /// The body.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The body, owned.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// `value` as a JSON body.
    pub(super) fn from_json(value: &Json) -> Result<Self, QueryError> {
        serde_json::to_vec(value)
            .map(|bytes| Self {
                bytes,
                content_type: "application/json",
                gzipped: false,
            })
            .map_err(|err| QueryError::Internal(format!("writing a Ray answer: {err}")))
    }

    /// `bytes` as a plain-text body.
    pub(super) fn text(bytes: Vec<u8>) -> Self {
        Self {
            bytes,
            content_type: "text/plain; charset=utf-8",
            gzipped: false,
        }
    }

    /// The same body gzipped (once: a gzipped body is returned as it is).
    pub(super) fn gzipped(self) -> Result<Self, QueryError> {
        if self.gzipped {
            return Ok(self);
        }
        let bytes = crate::gzip::gzip(&self.bytes)
            .map_err(|err| QueryError::Internal(format!("compressing a Ray answer: {err}")))?;
        Ok(Self {
            bytes,
            gzipped: true,
            ..self
        })
    }

    /// `envelope` with the JSON text `inner` in place of the string [`SPLICE_HERE`] (which
    /// must occur once), so that one function still defines each envelope.
    pub(super) fn spliced(envelope: &Json, inner: &str) -> Result<Self, QueryError> {
        let outer = serde_json::to_string(envelope)
            .map_err(|err| QueryError::Internal(format!("writing a Ray answer: {err}")))?;
        let marker = Json::from(SPLICE_HERE).to_string();
        let Some((before, after)) = outer.split_once(&marker) else {
            return Err(QueryError::Internal("a Ray envelope lost its place".into()));
        };
        let mut bytes = Vec::with_capacity(outer.len() + inner.len());
        bytes.extend_from_slice(before.as_bytes());
        bytes.extend_from_slice(inner.as_bytes());
        bytes.extend_from_slice(after.as_bytes());
        Ok(Self {
            bytes,
            content_type: "application/json",
            gzipped: false,
        })
    }
}

/// Where [`RayBody::spliced`] puts a value written as text. The NULs keep it out of any
/// envelope's own strings, which are ours.
pub(super) const SPLICE_HERE: &str = "\u{0}afterglow: spliced here\u{0}";

/// The state API's envelope around a list: Ray's `ListApiResponse`. Nothing is truncated at a
/// source, so `num_after_truncation` is the total.
pub(super) fn list_envelope(
    total: u64,
    filtered: u64,
    rows: Vec<Json>,
    warnings: Vec<String>,
) -> Json {
    state_envelope(total, total, filtered, Json::Array(rows), warnings)
}

/// `{"result": true, "msg": "", "data": {"result": {counts…, "result": …}}}`.
pub(super) fn state_envelope(
    total: u64,
    after_truncation: u64,
    filtered: u64,
    result: Json,
    warnings: Vec<String>,
) -> Json {
    json!({
        "result": true,
        "msg": "",
        "data": {"result": {
            "total": total,
            "num_after_truncation": after_truncation,
            "num_filtered": filtered,
            "result": result,
            "partial_failure_warning": "",
            "warnings": if warnings.is_empty() { Json::Null } else { json!(warnings) },
        }},
    })
}
