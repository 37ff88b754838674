//! A client of the dashboard API for tests: the same requests through `serve` (HTTP) or through
//! the Lambda adapter (API Gateway v2 events into the router), every answer checked against
//! `openapi.yaml`. Both take gzip, as browsers and `afterglow proxy` do.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use anyhow::{Context as _, bail, ensure};
use serde_json::Value as Json;
use tower::ServiceExt as _;

use crate::ray::{COMPARED_FIELDS, OurRow, OurRows};

/// Where requests go.
pub enum Api {
    /// A running server, by base URL.
    Http(String),
    /// The router as the Lambda function runs it.
    Lambda(axum::Router),
}

/// An answer: status and JSON body.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The body.
    pub body: Json,
}

impl Api {
    /// `GET path_and_query` (such as `/api/tasks?limit=5`), checked against the OpenAPI file.
    pub async fn get(&self, path_and_query: &str) -> anyhow::Result<Answer> {
        self.get_with(path_and_query, None).await
    }

    /// `GET` with an optional `Authorization` header.
    pub async fn get_with(
        &self,
        path_and_query: &str,
        authorization: Option<&str>,
    ) -> anyhow::Result<Answer> {
        let (status, text) = match self {
            Self::Http(base) => {
                let mut request = reqwest::Client::new().get(format!("{base}{path_and_query}"));
                if let Some(value) = authorization {
                    request = request.header("authorization", value);
                }
                let response = request.send().await?;
                let status = response.status().as_u16();
                (status, response.text().await?)
            }
            Self::Lambda(router) => {
                let event = api_gateway_get(path_and_query, authorization);
                let request = lambda_http::request::from_str(&event.to_string())?;
                let response = router.clone().oneshot(request).await?;
                let status = response.status().as_u16();
                let gzipped = response
                    .headers()
                    .get("content-encoding")
                    .is_some_and(|value| value == "gzip");
                let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
                let body = if gzipped {
                    crate::gunzip(&bytes)?
                } else {
                    bytes.to_vec()
                };
                (status, String::from_utf8(body)?)
            }
        };
        let body: Json = serde_json::from_str(&text)
            .with_context(|| format!("{path_and_query}: not JSON ({status}): {text}"))?;
        validate(path_and_query, status, &body)?;
        Ok(Answer { status, body })
    }

    /// `GET`, insisting on 200.
    pub async fn ok(&self, path_and_query: &str) -> anyhow::Result<Json> {
        let answer = self.get(path_and_query).await?;
        ensure!(
            answer.status == 200,
            "{path_and_query}: {} {}",
            answer.status,
            answer.body
        );
        Ok(answer.body)
    }

    /// Every row of a paged list (`field` holds the rows), following `next` cursors.
    pub async fn all_pages(
        &self,
        path: &str,
        query: &str,
        field: &str,
    ) -> anyhow::Result<Vec<Json>> {
        let mut rows = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..100_000 {
            let mut url = format!("{path}?{query}");
            if let Some(cursor) = &cursor {
                url.push_str(&format!("&cursor={cursor}"));
            }
            let page = self.ok(&url).await?;
            rows.extend(
                page[field]
                    .as_array()
                    .with_context(|| format!("{url}: no {field}"))?
                    .iter()
                    .cloned(),
            );
            match page["next"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return Ok(rows),
            }
        }
        bail!("{path}: paging never ended")
    }
}

/// An API Gateway HTTP API (payload v2) GET event, as Lambda delivers it.
fn api_gateway_get(path_and_query: &str, authorization: Option<&str>) -> Json {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    // As `afterglow proxy` (and every browser) asks: gzip taken.
    let mut headers = serde_json::json!({"accept": "application/json",
        "accept-encoding": "gzip", "user-agent": "dashboard-proxy"});
    if let Some(value) = authorization {
        headers["authorization"] = Json::String(value.to_owned());
    }
    let mut event = api_gateway_event("GET", "$default", path, query, headers, "lambda-query-1");
    event["isBase64Encoded"] = Json::Bool(false);
    event
}

/// An API Gateway HTTP API (payload v2) request event as Lambda delivers it, without a body:
/// `method` on `path` with the query string `query` (its parameters parsed from it), routed by
/// `route_key`, with `headers` (whose `user-agent` the request context repeats).
pub fn api_gateway_event(
    method: &str,
    route_key: &str,
    path: &str,
    query: &str,
    headers: Json,
    request_id: &str,
) -> Json {
    let mut parameters = serde_json::Map::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        parameters.insert(name.to_owned(), Json::String(value.to_owned()));
    }
    let user_agent = headers["user-agent"].clone();
    serde_json::json!({
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": path,
        "rawQueryString": query,
        "headers": headers,
        "queryStringParameters": parameters,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "afterglow",
            "domainName": "afterglow.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": "afterglow",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": user_agent
            },
            "requestId": request_id,
            "routeKey": route_key,
            "stage": "$default",
            "time": "22/Nov/2026:06:11:37 +0000",
            "timeEpoch": 1_795_327_897_845_u64
        }
    })
}

/// The OpenAPI document, parsed once.
fn openapi() -> anyhow::Result<&'static Json> {
    static DOCUMENT: OnceLock<Result<Json, String>> = OnceLock::new();
    DOCUMENT
        .get_or_init(|| {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../openapi.yaml");
            let text = std::fs::read_to_string(&path).map_err(|err| err.to_string())?;
            serde_yaml_ng::from_str::<Json>(&text).map_err(|err| err.to_string())
        })
        .as_ref()
        .map_err(|err| anyhow::anyhow!("openapi.yaml: {err}"))
}

/// The OpenAPI path template matching `path` (`/api/tasks/abc` → `/api/tasks/{task_id}`).
fn template_of<'a>(document: &'a Json, path: &str) -> Option<&'a str> {
    let segments: Vec<&str> = path.split('/').collect();
    document["paths"].as_object()?.keys().find_map(|template| {
        let parts: Vec<&str> = template.split('/').collect();
        (parts.len() == segments.len()
            && parts
                .iter()
                .zip(&segments)
                .all(|(part, segment)| part.starts_with('{') || part == segment))
        .then_some(template.as_str())
    })
}

/// RFC 3986 percent-encoding of a query-string value (and of what SigV4 signs): everything
/// but unreserved characters.
pub fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
                (byte as char).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

/// Checks `body` against the schema `openapi.yaml` gives for this route and status.
pub fn validate(path_and_query: &str, status: u16, body: &Json) -> anyhow::Result<()> {
    let document = openapi()?;
    let path = path_and_query.split('?').next().unwrap_or_default();
    let Some(template) = template_of(document, path) else {
        bail!("openapi.yaml has no path for {path}");
    };
    let responses = &document["paths"][template]["get"]["responses"];
    let response = responses
        .get(status.to_string())
        .or_else(|| responses.get("default"))
        .with_context(|| format!("openapi.yaml: {template} has no response {status}"))?;
    let response = match response["$ref"].as_str() {
        Some(reference) => {
            let name = reference.rsplit('/').next().unwrap_or_default();
            &document["components"]["responses"][name]
        }
        None => response,
    };
    let schema = &response["content"]["application/json"]["schema"];
    ensure!(!schema.is_null(), "{template} {status}: no JSON schema");
    // The schema's `$ref`s point into the document's components, so validate against a root
    // that carries them.
    let root = serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": document["components"],
        "allOf": [schema],
    });
    let validator = jsonschema::validator_for(&root)
        .map_err(|err| anyhow::anyhow!("openapi.yaml schema for {template}: {err}"))?;
    let errors: Vec<String> = validator
        .iter_errors(body)
        .take(5)
        .map(|err| format!("{} at {}", err, err.instance_path()))
        .collect();
    ensure!(
        errors.is_empty(),
        "{path_and_query} ({status}) does not match openapi.yaml:\n{}\n{}",
        errors.join("\n"),
        body.to_string().chars().take(2000).collect::<String>()
    );
    Ok(())
}

/// Our task-table rows as the comparison with Ray's list wants them.
pub fn our_rows(tasks: &[Json]) -> anyhow::Result<OurRows> {
    let mut rows = OurRows::new();
    for task in tasks {
        let mut our = OurRow::default();
        for field in COMPARED_FIELDS {
            let value = match &task[field] {
                Json::Null => None,
                Json::String(text) => Some(text.clone()),
                other => Some(other.to_string()),
            };
            our.fields.insert(field, value);
        }
        our.synthesized_failure = task["synthesized_failure"].as_bool().unwrap_or(false);
        let key = (
            task["task_id"].as_str().context("task_id")?.to_owned(),
            task["attempt_number"].as_i64().context("attempt_number")?,
        );
        ensure!(
            rows.insert(key.clone(), our).is_none(),
            "attempt {key:?} listed twice"
        );
    }
    Ok(rows)
}

/// Ray's own per-name state counts (`ray summary tasks` groups by name) from its task list.
pub fn ray_counts_by_name(truth: &Json) -> anyhow::Result<BTreeMap<String, BTreeMap<String, i64>>> {
    let mut counts: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for task in truth.as_array().context("tasks.json")? {
        let name = task["name"].as_str().context("name")?.to_owned();
        let state = task["state"].as_str().context("state")?.to_owned();
        *counts.entry(name).or_default().entry(state).or_default() += 1;
    }
    Ok(counts)
}

/// The counts of a JSON object of counts (such as a summary's `by_state`), by key.
pub fn counts_of(object: &Json) -> anyhow::Result<BTreeMap<String, i64>> {
    object
        .as_object()
        .context("by_state")?
        .iter()
        .map(|(state, count)| Ok((state.clone(), count.as_i64().context("count")?)))
        .collect()
}

/// `runs` served over a local folder, and a client for it.
pub async fn serve_locally(runs: &[crate::FixtureRun]) -> anyhow::Result<(crate::Served, Api)> {
    let served = crate::serve_runs_locally(runs, Ok).await?;
    let api = Api::Http(served.server.url.clone());
    Ok((served, api))
}
