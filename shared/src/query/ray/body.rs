//! What Ray's routes answer with: the body ([`RayBody`]: its bytes, media type and encoding),
//! the state API's envelopes around a list or a summary, and a list cut to the response's size.

use serde_json::{Value as Json, json};

use crate::gzip::{Deflating, GZIP_FRAME, deflated_at_most, gzip_around};
use crate::query::QueryError;

/// The most bytes an answer may have, and whether they are counted gzipped.
#[derive(Clone, Copy, Debug)]
pub(super) struct ResponseLimit {
    /// The most bytes.
    pub(super) bytes: usize,
    /// Whether the answer is gzipped, so that `bytes` counts compressed bytes.
    pub(super) gzipped: bool,
}

/// A Ray list's leading rows that fit the response, taken one at a time, so that rows past the
/// limit are never built: the first row always, then each while the answer stays within the
/// limit. The rows become the list's answer ([`Self::into_list`]).
///
/// A plain answer counts its rows' JSON bytes. A gzipped one compresses each row as it is
/// taken ([`Deflating`]) and counts what the compressed answer may then be: the compressed
/// rows, a bound on what the compressor still holds, and the most the envelope around them
/// can take; when that bound would pass the limit, the compressor is flushed and the row
/// measured again. The answer is the rows as they were compressed, so it is built once and
/// never passes the limit (unless its first row alone does).
#[derive(Debug)]
pub(super) struct RowBudget {
    limit: ResponseLimit,
    /// What the list holds, plural (`tasks`, `actors`), for its warning.
    what: &'static str,
    taken: Taken,
}

/// The rows a [`RowBudget`] took.
#[derive(Debug)]
enum Taken {
    /// For a plain answer: the rows, and their JSON bytes with 2 for each separator.
    Json { rows: Vec<Json>, bytes: usize },
    /// For a gzipped answer: the rows already compressed.
    Gzipped(Box<GzippedRows>),
}

/// Rows written, comma-separated, into the middle of a gzipped list.
#[derive(Debug)]
struct GzippedRows {
    deflating: Deflating,
    rows: usize,
    /// The most the gzip frame and the compressed envelope around the rows can take.
    reserve: usize,
    /// Why compressing failed, when it did: the list stops there and its answer is this error.
    failure: Option<String>,
}

impl GzippedRows {
    /// Compresses `row` when the answer with it stays within `limit` bytes (or it is the first).
    fn admit(&mut self, row: &Json, limit: usize) -> bool {
        if self.failure.is_some() {
            return false;
        }
        let mut text = if self.rows == 0 {
            Vec::new()
        } else {
            vec![b',']
        };
        if let Err(err) = serde_json::to_writer(&mut text, row) {
            self.failure = Some(err.to_string());
            return false;
        }
        let (reserve, len) = (self.reserve, text.len());
        let fits = |deflating: &Deflating| reserve.saturating_add(deflating.at_most(len)) <= limit;
        if self.rows > 0 && !fits(&self.deflating) {
            // The bound counts what the compressor holds as if it could not shrink: written
            // out, it is known.
            if let Err(err) = self.deflating.flush() {
                self.failure = Some(err.to_string());
                return false;
            }
            if !fits(&self.deflating) {
                return false;
            }
        }
        if let Err(err) = self.deflating.write(&text) {
            self.failure = Some(err.to_string());
            return false;
        }
        self.rows += 1;
        true
    }
}

impl RowBudget {
    /// An empty list of `what` (plural, as its warning names the rows) within `limit`.
    pub(super) fn new(limit: ResponseLimit, what: &'static str) -> Self {
        let taken = if limit.gzipped {
            // The longest envelope this list can have: every count at its largest, and the
            // warning about a cut with the longest numbers.
            let longest = list_envelope_around(
                u64::MAX,
                u64::MAX,
                vec![cut_warning(usize::MAX, usize::MAX, what, limit)],
            )
            .to_string();
            let marker = Json::from(SPLICE_HERE).to_string();
            let (before, after) = longest
                .split_once(&marker)
                .unwrap_or((longest.as_str(), ""));
            // `[` and `]` go with the text before and after the rows.
            let reserve = GZIP_FRAME
                .saturating_add(deflated_at_most(before.len() + 1))
                .saturating_add(deflated_at_most(after.len() + 1));
            Taken::Gzipped(Box::new(GzippedRows {
                deflating: Deflating::default(),
                rows: 0,
                reserve,
                failure: None,
            }))
        } else {
            Taken::Json {
                rows: Vec::new(),
                bytes: 0,
            }
        };
        Self { limit, what, taken }
    }

    /// Keeps `row` when it fits; `false` once one does not, where the list is cut.
    pub(super) fn admit(&mut self, row: Json) -> bool {
        match &mut self.taken {
            Taken::Json { rows, bytes } => {
                let size = serde_json::to_vec(&row).map_or(0, |text| text.len()) + 2;
                if !rows.is_empty() && *bytes + size > self.limit.bytes {
                    return false;
                }
                *bytes += size;
                rows.push(row);
                true
            }
            Taken::Gzipped(gzipped) => gzipped.admit(&row, self.limit.bytes),
        }
    }

    /// Keeps the leading `rows` that fit.
    pub(super) fn admit_leading(&mut self, rows: impl IntoIterator<Item = Json>) {
        for row in rows {
            if !self.admit(row) {
                break;
            }
        }
    }

    /// The list's answer: Ray's list envelope with the rows kept, `total` rows in all and
    /// `filtered` matching the filters, and a warning when fewer than the `listed` rows the
    /// list had were kept; gzipped when the limit counts gzipped bytes.
    pub(super) fn into_list(
        self,
        total: u64,
        filtered: u64,
        listed: usize,
    ) -> Result<RayBody, QueryError> {
        let keep = match &self.taken {
            Taken::Json { rows, .. } => rows.len(),
            Taken::Gzipped(gzipped) => gzipped.rows,
        };
        let mut warnings = Vec::new();
        if keep < listed {
            let (bytes, gzipped) = (self.limit.bytes, self.limit.gzipped);
            tracing::info!(
                rows = keep,
                bytes,
                gzipped,
                "Ray list cut short by its size"
            );
            warnings.push(cut_warning(keep, listed, self.what, self.limit));
        }
        match self.taken {
            Taken::Json { rows, .. } => {
                RayBody::from_json(&list_envelope(total, filtered, rows, warnings))
            }
            Taken::Gzipped(gzipped) => {
                let GzippedRows {
                    deflating, failure, ..
                } = *gzipped;
                if let Some(failure) = failure {
                    return Err(QueryError::Internal(format!(
                        "compressing a Ray answer: {failure}"
                    )));
                }
                let (before, after) =
                    around_splice(&list_envelope_around(total, filtered, warnings))?;
                let head = format!("{before}[");
                let tail = format!("]{after}");
                let bytes =
                    gzip_around(head.as_bytes(), deflating, tail.as_bytes()).map_err(|err| {
                        QueryError::Internal(format!("compressing a Ray answer: {err}"))
                    })?;
                Ok(RayBody {
                    bytes,
                    content_type: "application/json",
                    gzipped: true,
                    attachment: None,
                    failed: false,
                })
            }
        }
    }
}

/// Ray's `warnings` entry for a list cut to the response's size after `keep` of its `listed`
/// rows.
fn cut_warning(keep: usize, listed: usize, what: &str, limit: ResponseLimit) -> String {
    let bytes = limit.bytes;
    let counted = if limit.gzipped { "gzipped" } else { "of JSON" };
    format!(
        "Afterglow returned the first {keep} of {listed} {what}: more would exceed this \
         deployment's response size limit of {bytes} bytes ({counted}). Narrow the list with filters \
         (--filter) or a lower limit."
    )
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
    attachment: Option<String>,
    failed: bool,
}

impl RayBody {
    /// The media type (`application/json`, or `text/plain` for log files).
    pub fn content_type(&self) -> &'static str {
        self.content_type
    }

    /// `gzip` when the body is gzipped
    /// ([`QueryEngine::answer_ray_gzipped`](crate::query::QueryEngine::answer_ray_gzipped)),
    /// to be sent as its `Content-Encoding`.
    pub fn content_encoding(&self) -> Option<&'static str> {
        self.gzipped.then_some("gzip")
    }

    /// `attachment; filename="…"` when Ray's answer is a download (a log file, a timeline asked
    /// for with `download=1`), to be sent as its `Content-Disposition`: the browser then saves
    /// the file instead of opening it.
    pub fn content_disposition(&self) -> Option<String> {
        self.attachment
            .as_ref()
            .map(|name| format!("attachment; filename=\"{name}\""))
    }

    /// The same body, to be saved as `name`. Characters that cannot stand in a quoted header
    /// parameter (controls, quotes, backslashes: the name comes from the query string) become
    /// `_`.
    pub(super) fn attached_as(self, name: &str) -> Self {
        let name = name
            .chars()
            .map(|c| {
                if c.is_control() || c == '"' || c == '\\' {
                    '_'
                } else {
                    c
                }
            })
            .collect();
        Self {
            attachment: Some(name),
            ..self
        }
    }

    /// Whether Ray answers this with 500 (with Ray's envelope saying why): what a live cluster
    /// answers when it cannot reach a part it is asked about, such as Prometheus.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// The same body, answered as a failure ([`Self::failed`]).
    pub(super) fn into_failure(self) -> Self {
        Self {
            failed: true,
            ..self
        }
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
                attachment: None,
                failed: false,
            })
            .map_err(|err| QueryError::Internal(format!("writing a Ray answer: {err}")))
    }

    /// `bytes` as an HTML page.
    pub(super) fn html(bytes: Vec<u8>) -> Self {
        Self {
            content_type: "text/html; charset=utf-8",
            ..Self::text(bytes)
        }
    }

    /// `bytes` as a plain-text body.
    pub(super) fn text(bytes: Vec<u8>) -> Self {
        Self {
            bytes,
            content_type: "text/plain; charset=utf-8",
            gzipped: false,
            attachment: None,
            failed: false,
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
        let (before, after) = around_splice(envelope)?;
        let mut bytes = Vec::with_capacity(before.len() + inner.len() + after.len());
        bytes.extend_from_slice(before.as_bytes());
        bytes.extend_from_slice(inner.as_bytes());
        bytes.extend_from_slice(after.as_bytes());
        Ok(Self {
            bytes,
            content_type: "application/json",
            gzipped: false,
            attachment: None,
            failed: false,
        })
    }
}

/// The JSON text of `envelope` before and after the string [`SPLICE_HERE`] (which must occur
/// once).
fn around_splice(envelope: &Json) -> Result<(String, String), QueryError> {
    let outer = serde_json::to_string(envelope)
        .map_err(|err| QueryError::Internal(format!("writing a Ray answer: {err}")))?;
    let marker = Json::from(SPLICE_HERE).to_string();
    let Some((before, after)) = outer.split_once(&marker) else {
        return Err(QueryError::Internal("a Ray envelope lost its place".into()));
    };
    Ok((before.to_owned(), after.to_owned()))
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

/// [`list_envelope`] with [`SPLICE_HERE`] in place of its rows, which are written as text.
fn list_envelope_around(total: u64, filtered: u64, warnings: Vec<String>) -> Json {
    state_envelope(total, total, filtered, Json::from(SPLICE_HERE), warnings)
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
