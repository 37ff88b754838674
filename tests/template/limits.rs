//! Bounded bills and private logs: every function and route has a limit (events' and logs'
//! apart), and logs expire without the query string (where ingest tokens travel).

use anyhow::{Context as _, ensure};
use serde_yaml_ng::Value;

use super::*;

/// A leaked export URL or a runaway client must not run up an unbounded bill: every function
/// has reserved concurrency from a parameter, and each public route its own throttle, the
/// firewalled ingest API's included (a REST stage without one allows the account's limit).
#[test]
fn every_function_and_route_is_bounded() -> anyhow::Result<()> {
    let template = template()?;
    for (id, function) in resources(&template, "AWS::Serverless::Function")? {
        let reserved = at(function, &["Properties", "ReservedConcurrentExecutions"])
            .with_context(|| format!("{id} has no reserved concurrency"))?;
        ensure!(
            ref_name(reserved).is_some() || find_in_map(reserved).is_some(),
            "{id}'s reserved concurrency is set by no parameter"
        );
        number(&template, reserved)?;
    }
    let api = at(&template, &["Resources", "HttpApi", "Properties"])?;
    for setting in ["ThrottlingBurstLimit", "ThrottlingRateLimit"] {
        let default = at(api, &["DefaultRouteSettings", setting])?;
        ensure!(ref_name(default).is_some(), "the API's {setting} is fixed");
        for route in ["POST /v1/events/{cluster}", "POST /v1/logs/{cluster}"] {
            let ingest = at(api, &["RouteSettings", route, setting])?;
            ensure!(ref_name(ingest).is_some(), "{route}'s {setting} is fixed");
        }
    }
    let rest = at(
        &template,
        &["Resources", "IngestRestApi", "Properties", "MethodSettings"],
    )?
    .as_sequence()
    .context("the firewalled API's MethodSettings are not a list")?;
    let every_method = rest
        .iter()
        .find(|setting| {
            setting.get("ResourcePath").and_then(Value::as_str) == Some("/*")
                && setting.get("HttpMethod").and_then(Value::as_str) == Some("*")
        })
        .context("the firewalled API has no throttle for every method")?;
    for (setting, parameter) in [
        ("ThrottlingRateLimit", "IngestRateLimit"),
        ("ThrottlingBurstLimit", "IngestBurstLimit"),
    ] {
        ensure!(
            ref_name(at(every_method, &[setting])?) == Some(parameter),
            "the firewalled API's {setting} is not {parameter}"
        );
    }
    Ok(())
}

/// Events never wait behind logs: shipped logs have a function of their own (the same
/// program) with its own reserved concurrency, the log route its own throttle on both APIs,
/// each function writes only its own prefix, and each limit has an alarm.
#[test]
fn events_and_logs_are_limited_apart() -> anyhow::Result<()> {
    let template = template()?;
    let events = at(&template, &["Resources", "IngestFunction", "Properties"])?;
    let logs = at(&template, &["Resources", "LogIngestFunction", "Properties"])?;
    ensure!(
        at(events, &["Handler"])? == at(logs, &["Handler"])?,
        "the log ingest function runs another program"
    );
    for (function, concurrency, path, writes, never) in [
        (
            events,
            "IngestConcurrency",
            "/v1/events/{cluster}",
            "/raw/*",
            "/logs/",
        ),
        (
            logs,
            "LogIngestConcurrency",
            "/v1/logs/{cluster}",
            "/logs/*",
            "/raw/",
        ),
    ] {
        ensure!(
            ref_name(at(function, &["ReservedConcurrentExecutions"])?) == Some(concurrency),
            "{path}'s function is not bounded by {concurrency}"
        );
        let paths: Vec<&str> = at(function, &["Events"])?
            .as_mapping()
            .context("events are not a mapping")?
            .values()
            .filter_map(|event| event.get("Properties")?.get("Path")?.as_str())
            .collect();
        ensure!(paths == [path], "{concurrency}'s function serves {paths:?}");
        let puts =
            serde_yaml_ng::to_string(&allowed(function, "s3:PutObject")?.collect::<Vec<_>>())?;
        ensure!(
            puts.contains(writes) && !puts.contains(never),
            "{path}'s function may write {puts}"
        );
    }
    let api = at(
        &template,
        &["Resources", "HttpApi", "Properties", "RouteSettings"],
    )?;
    for (route, rate, burst) in [
        (
            "POST /v1/events/{cluster}",
            "IngestRateLimit",
            "IngestBurstLimit",
        ),
        ("POST /v1/logs/{cluster}", "LogsRateLimit", "LogsBurstLimit"),
    ] {
        ensure!(
            ref_name(at(api, &[route, "ThrottlingRateLimit"])?) == Some(rate)
                && ref_name(at(api, &[route, "ThrottlingBurstLimit"])?) == Some(burst),
            "{route} is not throttled by {rate}/{burst}"
        );
    }
    let rest = at(&template, &["Resources", "IngestRestApi", "Properties"])?;
    let log_method = at(rest, &["MethodSettings"])?
        .as_sequence()
        .context("MethodSettings are not a list")?
        .iter()
        .find(|setting| {
            setting.get("ResourcePath").and_then(Value::as_str) == Some("/~1v1~1logs~1{cluster}")
                && setting.get("HttpMethod").and_then(Value::as_str) == Some("POST")
        })
        .context("the firewalled API has no throttle of its own for logs")?;
    ensure!(
        ref_name(at(log_method, &["ThrottlingRateLimit"])?) == Some("LogsRateLimit"),
        "the firewalled log route is not throttled by LogsRateLimit"
    );
    let integration = serde_yaml_ng::to_string(at(
        rest,
        &["DefinitionBody", "paths", "/v1/logs/{cluster}", "post"],
    )?)?;
    ensure!(
        integration.contains("LogIngestFunction.Arn"),
        "the firewalled log route reaches another function: {integration}"
    );
    let alarms = resources(&template, "AWS::CloudWatch::Alarm")?;
    for function in ["IngestFunction", "LogIngestFunction"] {
        let watched = alarms.iter().any(|(_, alarm)| {
            at(alarm, &["Properties", "MetricName"])
                .ok()
                .and_then(Value::as_str)
                == Some("Throttles")
                && dimension(alarm, "FunctionName").and_then(ref_name) == Some(function)
        });
        ensure!(watched, "no alarm on {function}'s throttles");
    }
    let logs_throttled = resources(&template, "AWS::Logs::MetricFilter")?
        .into_iter()
        .filter_map(|(_, filter)| {
            let pattern = at(filter, &["Properties", "FilterPattern"])
                .ok()?
                .as_str()?;
            (pattern.contains("429") && pattern.contains("/v1/logs/"))
                .then(|| at(filter, &["Properties", "MetricTransformations"]).ok())
                .flatten()
        })
        .filter_map(|metrics| metrics.as_sequence()?.first()?.get("MetricName")?.as_str())
        .collect::<Vec<_>>();
    ensure!(
        !logs_throttled.is_empty(),
        "no metric counts the log route's 429s"
    );
    ensure!(
        alarms.iter().any(|(_, alarm)| {
            at(alarm, &["Properties", "MetricName"])
                .ok()
                .and_then(Value::as_str)
                .is_some_and(|metric| logs_throttled.contains(&metric))
        }),
        "no alarm on the log route's 429s"
    );
    Ok(())
}

/// Logs are kept for a bounded time, and the API's access log never holds the ingest token,
/// which travels in the query string (`?token=`).
#[test]
fn logs_expire_and_never_hold_the_query_string() -> anyhow::Result<()> {
    let template = template()?;
    let groups = resources(&template, "AWS::Logs::LogGroup")?;
    for function in resources(&template, "AWS::Serverless::Function")?
        .iter()
        .map(|(id, _)| *id)
    {
        let kept = groups.iter().any(|(_, group)| {
            serde_yaml_ng::to_string(group).is_ok_and(|text| {
                text.contains(&format!("/aws/lambda/${{{function}}}"))
                    && text.contains("RetentionInDays")
            })
        });
        ensure!(kept, "{function}'s log group has no retention");
    }
    let settings = at(
        &template,
        &["Resources", "HttpApi", "Properties", "AccessLogSettings"],
    )?;
    records_no_query_string(at(settings, &["Format"])?)?;
    let group = ref_or_getatt(at(settings, &["DestinationArn"])?);
    ensure!(
        groups.iter().any(|(id, group_resource)| Some(*id) == group
            && group_resource
                .get("Properties")
                .and_then(|p| p.get("RetentionInDays"))
                .is_some()),
        "the access log's group has no retention"
    );
    // The firewalled ingest API logs (when the account lets REST APIs log) to the same group,
    // where the same rules hold and the same metric filter counts its 429s.
    let rest = at(
        &template,
        &[
            "Resources",
            "IngestRestApi",
            "Properties",
            "AccessLogSetting",
        ],
    )?;
    let (_, rest, _) =
        if_branches(rest).context("the firewalled API's access log is not a choice")?;
    records_no_query_string(at(rest, &["Format"])?)?;
    ensure!(
        ref_or_getatt(at(rest, &["DestinationArn"])?) == group,
        "the firewalled API logs to another group than the HTTP API"
    );
    Ok(())
}

/// Fails when an access log `format` records a `$context` variable that may hold the query
/// string (where the ingest token travels), or records nothing.
fn records_no_query_string(format: &Value) -> anyhow::Result<()> {
    let format = format
        .as_str()
        .context("the access log format is not a string")?;
    // $context variables of HTTP and REST APIs that hold no part of the query string.
    const SAFE: &[&str] = &[
        "requestId",
        "requestTime",
        "identity.sourceIp",
        "httpMethod",
        "path",
        "routeKey",
        "status",
        "responseLatency",
        "responseLength",
        "integrationErrorMessage",
        "wafResponseCode",
    ];
    let mut variables = 0;
    for piece in format.split("$context.").skip(1) {
        let name: String = piece
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '.')
            .collect();
        ensure!(
            SAFE.contains(&name.as_str()),
            "the access log records $context.{name}, which may hold the query string"
        );
        variables += 1;
    }
    ensure!(variables > 0, "the access log records nothing");
    Ok(())
}
