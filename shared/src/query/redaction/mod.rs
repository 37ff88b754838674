//! The secrets of a runtime env, masked in every answer as Ray 2.60's dashboard masks them
//! (`ray/dashboard/runtime_env_redaction.py`): each value of `env_vars` becomes
//! [`REDACTED_PLACEHOLDER`] and its key stays, so a reader still sees which variables were set
//! but not what they held. `env_vars` is where Ray users put credentials (cloud keys, tokens),
//! and it is the only field Ray masks; everything else is served as it was sent.
//!
//! Ray masks only what it answers a browser; Afterglow masks everything it answers, its own
//! `/api/…` routes and Ray's routes whatever the client, because a history is read long after
//! the cluster by whoever may read the API, and `ray list --detail` through Afterglow is as
//! much a way in as the dashboard. What is stored (raw events, tables) keeps the runtime envs
//! as Ray sent them: masking belongs to answers, so it never needs a rewrite of the history.
//!
//! A runtime env reaches an answer in two shapes: parsed, a job's `runtime_env`
//! ([`redact_runtime_env`]), and as JSON text, a task's `runtime_env_info` or an actor's
//! `serialized_runtime_env` ([`redact_serialized_runtime_env`]). Ray parses the text and writes
//! it again with Python's `json.dumps(…, sort_keys=True)`; `python_json.rs` reads and writes as
//! Python's `json` module does, so the masked text is byte for byte the one Ray's dashboard
//! serves. Text that does not parse to a JSON object is masked whole: nothing can be said of
//! what it holds.
//!
//! This module only transforms values: no I/O, and it never fails. The routes call it on every
//! runtime env they answer (`query::tasks`, `query::ray::tasks`, `query::ray::entities`).
//!
//! # Deliberate differences from Ray
//!
//! Where Ray's parse raises something other than a decoding error (and its route answers 500),
//! this answers instead: text nested deeper than 1000 levels (Python's recursion limit stops
//! just short of that) is masked whole, and an integer of more than 4300 digits (Python's
//! conversion limit) is written out as it came.

mod python_json;
#[cfg(test)]
mod tests;

use serde_json::Value as Json;

use self::python_json::PyValue;

/// What every masked value becomes: Ray's `REDACTED_PLACEHOLDER`, so that an answer looks as
/// Ray's dashboard shows it.
pub const REDACTED_PLACEHOLDER: &str = "<redacted>";

/// The fields of a runtime env whose values are secrets (Ray's `_SECRET_RUNTIME_ENV_FIELDS`).
const SECRET_FIELDS: [&str; 1] = ["env_vars"];

/// `runtime_env` with the value of every secret field's entry replaced by
/// [`REDACTED_PLACEHOLDER`], keys kept (Ray's `redact_runtime_env`). A secret field that is not
/// an object, and a runtime env that is not one, are returned unchanged, as Ray returns them:
/// only a map of variables is known to hold secrets.
pub fn redact_runtime_env(mut runtime_env: Json) -> Json {
    if let Json::Object(fields) = &mut runtime_env {
        for field in SECRET_FIELDS {
            if let Some(Json::Object(entries)) = fields.get_mut(field) {
                for value in entries.values_mut() {
                    *value = Json::String(REDACTED_PLACEHOLDER.to_owned());
                }
            }
        }
    }
    runtime_env
}

/// A runtime env serialized as JSON text, masked as Ray's `redact_serialized_runtime_env`
/// masks it: the empty string stays empty (it holds nothing); text that parses to an object is
/// masked as [`redact_runtime_env`] masks it and written again as Python's
/// `json.dumps(…, sort_keys=True)` writes it; anything else (invalid JSON, an array, a string)
/// becomes [`REDACTED_PLACEHOLDER`] whole, because what cannot be read cannot be shown safe.
pub fn redact_serialized_runtime_env(serialized: &str) -> String {
    if serialized.is_empty() {
        return String::new();
    }
    let Some(PyValue::Dict(mut fields)) = python_json::loads(serialized) else {
        return REDACTED_PLACEHOLDER.to_owned();
    };
    for field in SECRET_FIELDS {
        if let Some(PyValue::Dict(entries)) = fields.get_mut(&python_json::code_points(field)) {
            for value in entries.values_mut() {
                *value = PyValue::Str(python_json::code_points(REDACTED_PLACEHOLDER));
            }
        }
    }
    python_json::dumps_sorted(&PyValue::Dict(fields))
}

/// A serialized runtime env as an answer holds it (a JSON string, or null when the attempt's
/// definition never arrived), masked by [`redact_serialized_runtime_env`]; a value that is not
/// a string is returned unchanged, as Ray returns it.
pub fn redact_serialized_value(value: Json) -> Json {
    match value {
        Json::String(serialized) => Json::String(redact_serialized_runtime_env(&serialized)),
        other => other,
    }
}
