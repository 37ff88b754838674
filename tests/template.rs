//! The deployment's safety rules, read from `template.yaml`: what cfn-lint and `sam validate`
//! cannot know is wrong for Afterglow. Each test names the failure it prevents: good data
//! dead-lettered unrun, alarms that never reach anyone, an unbounded bill, a history that dies
//! with its stack, a token in an access log, one flooding address refusing every cluster.

use std::path::Path;

use anyhow::{Context as _, bail, ensure};
use serde_yaml_ng::Value;
use shared::compact::schedule::batch::BatchLimits;

/// The template, parsed (CloudFormation's short-form tags kept as YAML tags).
fn template() -> anyhow::Result<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../template.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path:?}"))?;
    serde_yaml_ng::from_str(&text).with_context(|| format!("parsing {path:?}"))
}

/// The value at a path of mapping keys.
fn at<'a>(value: &'a Value, path: &[&str]) -> anyhow::Result<&'a Value> {
    let mut here = value;
    for (depth, key) in path.iter().enumerate() {
        here = here
            .get(*key)
            .with_context(|| format!("template has no {}", path[..=depth].join(".")))?;
    }
    Ok(here)
}

/// The name a `!Ref NAME` refers to, if `value` is one.
fn ref_name(value: &Value) -> Option<&str> {
    match value {
        Value::Tagged(tagged) if tagged.tag == "Ref" => tagged.value.as_str(),
        _ => None,
    }
}

/// The condition and both branches of an `!If [CONDITION, THEN, ELSE]`, if `value` is one.
fn if_branches(value: &Value) -> Option<(&str, &Value, &Value)> {
    let Value::Tagged(tagged) = value else {
        return None;
    };
    if tagged.tag != "If" {
        return None;
    }
    match tagged.value.as_sequence()?.as_slice() {
        [condition, then, otherwise] => Some((condition.as_str()?, then, otherwise)),
        _ => None,
    }
}

/// A number, or the default of the parameter a `!Ref` names.
fn number(template: &Value, value: &Value) -> anyhow::Result<i64> {
    if let Some(name) = ref_name(value) {
        let default = at(template, &["Parameters", name, "Default"])?;
        return default
            .as_i64()
            .with_context(|| format!("parameter {name} has no numeric default"));
    }
    value
        .as_i64()
        .or_else(|| value.as_str().and_then(|text| text.parse().ok()))
        .with_context(|| format!("{value:?} is not a number"))
}

/// Resources of one type, by logical id.
fn resources<'a>(template: &'a Value, kind: &str) -> anyhow::Result<Vec<(&'a str, &'a Value)>> {
    let Some(all) = at(template, &["Resources"])?.as_mapping() else {
        bail!("Resources is not a mapping");
    };
    Ok(all
        .iter()
        .filter(|(_, resource)| resource.get("Type").and_then(Value::as_str) == Some(kind))
        .filter_map(|(id, resource)| Some((id.as_str()?, resource)))
        .collect())
}

const DAY_S: i64 = 86_400;

/// Lambda's SQS poller hands a function more batches than its reserved concurrency runs unless
/// the source's maximum concurrency caps it; each throttled batch counts as a receive, so good
/// objects would reach the dead-letter queue without ever running. Messages and raw objects must
/// also outlive every retry path.
#[test]
fn compaction_is_never_dead_lettered_by_throttling_or_expiry() -> anyhow::Result<()> {
    let template = template()?;
    let compact = at(&template, &["Resources", "CompactFunction", "Properties"])?;
    let reserved = number(&template, at(compact, &["ReservedConcurrentExecutions"])?)?;
    let source = at(compact, &["Events", "RawObjects", "Properties"])?;
    let maximum = number(
        &template,
        at(source, &["ScalingConfig", "MaximumConcurrency"])?,
    )?;
    ensure!(
        (2..=reserved).contains(&maximum),
        "the SQS source may run {maximum} batches at once against a reserved concurrency of {reserved}"
    );
    let queue = at(&template, &["Resources", "RawObjectQueue", "Properties"])?;
    let receives = number(&template, at(queue, &["RedrivePolicy", "maxReceiveCount"])?)?;
    ensure!(
        receives >= 10,
        "maxReceiveCount {receives}: a short outage dead-letters good objects"
    );
    let mut longest_queue = 0;
    for queue in ["RawObjectQueue", "RawObjectDeadLetterQueue"] {
        let retention = number(
            &template,
            at(
                &template,
                &["Resources", queue, "Properties", "MessageRetentionPeriod"],
            )?,
        )?;
        ensure!(
            retention == 14 * DAY_S,
            "{queue} keeps messages {retention} s, not 14 days"
        );
        longest_queue = longest_queue.max(retention);
    }
    let raw_days = number(
        &template,
        at(&template, &["Parameters", "RawRetentionDays", "MinValue"])?,
    )?;
    ensure!(
        raw_days * DAY_S >= longest_queue,
        "raw objects may expire after {raw_days} days while their notifications wait longer"
    );
    Ok(())
}

/// The compact function's SQS batch is the run compaction is tuned and benchmarked at
/// (`RUN_OBJECTS`: fewer, larger runs cost less CPU), and the byte cap for its memory must take
/// that many of the bench's bodies: messages past the cap are sent back to the queue, a run of
/// their own each time. Lambda takes a batch above 10 only with a batching window.
#[test]
fn the_compact_batch_is_the_run_compaction_is_measured_at() -> anyhow::Result<()> {
    let template = template()?;
    let compact = at(&template, &["Resources", "CompactFunction", "Properties"])?;
    let source = at(compact, &["Events", "RawObjects", "Properties"])?;
    let batch = number(&template, at(source, &["BatchSize"])?)?;
    ensure!(
        usize::try_from(batch)? == shared::compact::RUN_OBJECTS,
        "BatchSize {batch}, but compaction runs {} objects (shared::compact::RUN_OBJECTS)",
        shared::compact::RUN_OBJECTS
    );
    let window = number(&template, at(source, &["MaximumBatchingWindowInSeconds"])?)?;
    ensure!(window >= 1, "a batch of {batch} needs a batching window");
    // The average size of the bench's raw bodies (1 000 events each).
    const BENCH_BODY_BYTES: u64 = 116_411;
    let memory = number(&template, at(compact, &["MemorySize"])?)?;
    let cap = BatchLimits::max_bytes_for_memory(u64::try_from(memory)?);
    let full = u64::try_from(batch)? * BENCH_BODY_BYTES;
    ensure!(
        cap >= full,
        "a full batch of the bench's bodies is {full} bytes, past the {cap}-byte cap of {memory} MB"
    );
    Ok(())
}

/// CloudWatch cannot use the AWS-managed SNS key, so alarms on an `alias/aws/sns` topic would
/// never be delivered; and without a topic (no e-mail address given) alarms would have no
/// action.
#[test]
fn every_alarm_notifies_a_topic_cloudwatch_can_publish_to() -> anyhow::Result<()> {
    let template = template()?;
    let topic = at(&template, &["Resources", "AlarmTopic"])?;
    ensure!(
        topic.get("Condition").is_none(),
        "the alarm topic exists only conditionally"
    );
    if let Some(key) = topic
        .get("Properties")
        .and_then(|p| p.get("KmsMasterKeyId"))
    {
        ensure!(
            key.as_str() != Some("alias/aws/sns"),
            "the alarm topic uses alias/aws/sns, which CloudWatch cannot publish to"
        );
    }
    ensure!(
        ref_name(at(&template, &["Outputs", "AlarmTopicArn", "Value"])?) == Some("AlarmTopic"),
        "the stack does not output the alarm topic"
    );
    let alarms = resources(&template, "AWS::CloudWatch::Alarm")?;
    for (id, alarm) in &alarms {
        let actions = at(alarm, &["Properties", "AlarmActions"])?
            .as_sequence()
            .with_context(|| format!("{id}'s AlarmActions is conditional"))?;
        ensure!(
            actions
                .iter()
                .any(|action| ref_name(action) == Some("AlarmTopic")),
            "{id} does not notify the alarm topic"
        );
    }
    // The failures that cost data or money each have an alarm.
    let watched: Vec<String> = alarms
        .iter()
        .map(|(_, alarm)| serde_yaml_ng::to_string(alarm).unwrap_or_default())
        .collect();
    for (what, needle) in [
        ("bucket size", "BucketSizeBytes"),
        ("invocations", "Invocations"),
        ("dead letters", "RawObjectDeadLetterQueue"),
    ] {
        ensure!(
            watched.iter().any(|alarm| alarm.contains(needle)),
            "no alarm on {what}"
        );
    }
    let ingest_throttles = alarms.iter().any(|(_, alarm)| {
        let text = serde_yaml_ng::to_string(alarm).unwrap_or_default();
        text.contains("Throttles") && text.contains("IngestFunction")
    });
    ensure!(ingest_throttles, "no alarm on ingest throttles");
    Ok(())
}

/// API Gateway's throttle is shared by every caller and answers 429 before any function runs,
/// so a flood without a token makes it refuse Ray's clusters too while no function metric
/// moves. The access log is where a 429 shows: a metric filter must count them into a metric
/// an alarm watches, and the API's share of 4xx answers must be watched as well.
#[test]
fn a_flood_on_the_api_raises_an_alarm() -> anyhow::Result<()> {
    let template = template()?;
    let filters = resources(&template, "AWS::Logs::MetricFilter")?;
    let throttled: Vec<(String, String)> = filters
        .iter()
        .filter(|(_, filter)| {
            at(filter, &["Properties", "LogGroupName"])
                .map(|group| ref_name(group) == Some("ApiAccessLogs"))
                .unwrap_or(false)
        })
        .filter(|(_, filter)| {
            at(filter, &["Properties", "FilterPattern"])
                .ok()
                .and_then(Value::as_str)
                .is_some_and(|pattern| pattern.replace(' ', "").contains("$.status=\"429\""))
        })
        .filter_map(|(_, filter)| {
            let metric = at(filter, &["Properties", "MetricTransformations"])
                .ok()?
                .as_sequence()?
                .first()?;
            Some((
                serde_yaml_ng::to_string(metric.get("MetricNamespace")?).ok()?,
                metric.get("MetricName")?.as_str()?.to_owned(),
            ))
        })
        .collect();
    ensure!(
        !throttled.is_empty(),
        "no metric filter counts the access log's 429 answers"
    );
    let alarms = resources(&template, "AWS::CloudWatch::Alarm")?;
    let watches_throttled = alarms.iter().any(|(_, alarm)| {
        let Some(properties) = alarm.get("Properties") else {
            return false;
        };
        throttled.iter().any(|(namespace, name)| {
            properties.get("MetricName").and_then(Value::as_str) == Some(name.as_str())
                && properties
                    .get("Namespace")
                    .and_then(|value| serde_yaml_ng::to_string(value).ok())
                    .as_deref()
                    == Some(namespace.as_str())
        })
    });
    ensure!(watches_throttled, "no alarm watches the API's 429 count");
    let watches_client_errors = alarms.iter().any(|(_, alarm)| {
        let text = serde_yaml_ng::to_string(alarm).unwrap_or_default();
        text.contains("AWS/ApiGateway")
            && text.contains("MetricName: 4xx")
            && text.contains("HttpApi")
    });
    ensure!(
        watches_client_errors,
        "no alarm watches the API's 4xx answers"
    );
    Ok(())
}

/// The ingest firewall (a WAF web ACL and the REST API it guards, since WAF cannot guard an
/// HTTP API) is billed by the month whether or not anything arrives: left at its default, the
/// template creates none of it, and nothing else names it unconditionally.
#[test]
fn the_ingest_firewall_costs_nothing_until_enabled() -> anyhow::Result<()> {
    let template = template()?;
    ensure!(
        at(&template, &["Parameters", "IngestFirewall", "Default"])?.as_str() == Some("Disabled"),
        "the ingest firewall is on by default"
    );
    let Value::Tagged(on) = at(&template, &["Conditions", "IngestFirewallOn"])? else {
        bail!("IngestFirewallOn is not an !Equals");
    };
    let operands = on
        .value
        .as_sequence()
        .map(Vec::as_slice)
        .unwrap_or_default();
    ensure!(
        on.tag == "Equals"
            && matches!(operands, [name, value]
                if ref_name(name) == Some("IngestFirewall") && value.as_str() == Some("Enabled")),
        "IngestFirewallOn is not IngestFirewall=Enabled: {operands:?}"
    );
    let all = at(&template, &["Resources"])?
        .as_mapping()
        .context("Resources is not a mapping")?;
    let mut guarded = Vec::new();
    for (id, resource) in all {
        let id = id.as_str().unwrap_or_default();
        let kind = resource
            .get("Type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let text = serde_yaml_ng::to_string(resource)?;
        let firewall = kind.starts_with("AWS::WAFv2::")
            || kind.starts_with("AWS::ApiGateway::")
            || kind == "AWS::Serverless::Api"
            || ["IngestRestApi", "IngestFirewallAcl"]
                .iter()
                .any(|name| text.contains(name));
        if firewall {
            ensure!(
                resource.get("Condition").and_then(Value::as_str) == Some("IngestFirewallOn"),
                "{id} exists whether or not IngestFirewall=Enabled"
            );
            guarded.push(id);
        }
    }
    for wanted in [
        "IngestRestApi",
        "IngestRestApiInvokePermission",
        "IngestFirewallAcl",
        "IngestFirewallAssociation",
    ] {
        ensure!(
            guarded.contains(&wanted),
            "no {wanted} among the firewall's resources: {guarded:?}"
        );
    }
    Ok(())
}

/// The throttle API Gateway applies before any token is checked is shared by every caller, so
/// the firewall limits each source address on its own, over every request (no scope-down), and
/// by default well below that throttle: one address cannot take it all.
#[test]
fn the_ingest_firewall_blocks_each_address_past_its_rate() -> anyhow::Result<()> {
    let template = template()?;
    let acl = at(&template, &["Resources", "IngestFirewallAcl", "Properties"])?;
    ensure!(
        at(acl, &["Scope"])?.as_str() == Some("REGIONAL"),
        "API Gateway takes only a REGIONAL web ACL"
    );
    ensure!(
        at(acl, &["DefaultAction"])?.get("Allow").is_some(),
        "the firewall blocks what no rule matches"
    );
    let rule = at(acl, &["Rules"])?
        .as_sequence()
        .context("the firewall's rules are not a list")?
        .iter()
        .find(|rule| {
            rule.get("Statement")
                .and_then(|statement| statement.get("RateBasedStatement"))
                .is_some()
        })
        .context("the firewall has no rate-based rule")?;
    ensure!(
        at(rule, &["Action"])?.get("Block").is_some(),
        "the rate rule does not block"
    );
    let statement = at(rule, &["Statement", "RateBasedStatement"])?;
    ensure!(
        at(statement, &["AggregateKeyType"])?.as_str() == Some("IP"),
        "the rate rule does not count each source address apart"
    );
    ensure!(
        statement.get("ScopeDownStatement").is_none(),
        "the rate rule counts only some requests"
    );
    let limit = at(statement, &["Limit"])?;
    ensure!(
        ref_name(limit) == Some("IngestFirewallRateLimit"),
        "the rate limit is not the IngestFirewallRateLimit parameter"
    );
    let limit = number(&template, limit)?;
    let window = number(&template, at(statement, &["EvaluationWindowSec"])?)?;
    let throttle = number(
        &template,
        at(&template, &["Parameters", "IngestRateLimit", "Default"])?,
    )?;
    ensure!(
        limit < throttle * window,
        "by default one address may send {limit} requests in {window} s, the whole ingest throttle"
    );
    let association = at(
        &template,
        &["Resources", "IngestFirewallAssociation", "Properties"],
    )?;
    ensure!(
        ref_or_getatt(at(association, &["WebACLArn"])?) == Some("IngestFirewallAcl"),
        "the association attaches another web ACL"
    );
    let target = serde_yaml_ng::to_string(at(association, &["ResourceArn"])?)?;
    ensure!(
        target.contains("/restapis/${IngestRestApi}/stages/${IngestRestApi.Stage}"),
        "the firewall guards {target}, not the firewalled API's stage"
    );
    Ok(())
}

/// The firewalled API carries exactly the ingest function's routes (nothing reaches the query
/// routes around their authorizer), byte bodies arrive as bytes, API Gateway may invoke the
/// function for it, and the function sees the paths its router knows, not the stage before them.
#[test]
fn the_firewalled_api_routes_ingest_to_the_ingest_function() -> anyhow::Result<()> {
    let template = template()?;
    let api = at(&template, &["Resources", "IngestRestApi", "Properties"])?;
    let paths = at(api, &["DefinitionBody", "paths"])?;
    let ingest = at(&template, &["Resources", "IngestFunction", "Properties"])?;
    let events = at(ingest, &["Events"])?
        .as_mapping()
        .context("the ingest function's events are not a mapping")?;
    let mut routes = 0;
    for event in events.values() {
        if event.get("Type").and_then(Value::as_str) != Some("HttpApi") {
            continue;
        }
        let path = at(event, &["Properties", "Path"])?
            .as_str()
            .context("an ingest route's path is not text")?;
        let method = at(event, &["Properties", "Method"])?
            .as_str()
            .context("an ingest route's method is not text")?
            .to_ascii_lowercase();
        let integration = at(
            paths,
            &[path, method.as_str(), "x-amazon-apigateway-integration"],
        )
        .with_context(|| format!("the firewalled API does not route {method} {path}"))?;
        ensure!(
            at(integration, &["type"])?.as_str() == Some("aws_proxy"),
            "{method} {path} is not a Lambda proxy integration"
        );
        let uri = serde_yaml_ng::to_string(at(integration, &["uri"])?)?;
        ensure!(
            uri.contains("${IngestFunction.Arn}"),
            "the firewalled API sends {method} {path} to {uri}"
        );
        routes += 1;
    }
    let declared = paths.as_mapping().map_or(0, |paths| paths.len());
    ensure!(
        routes == 2 && declared == routes,
        "the firewalled API has {declared} paths for the ingest function's {routes} routes"
    );
    let binary = at(api, &["BinaryMediaTypes"])?
        .as_sequence()
        .context("BinaryMediaTypes is not a list")?;
    ensure!(
        binary
            .iter()
            .any(|kind| kind.as_str() == Some("application~1octet-stream")),
        "log pieces (application/octet-stream) would reach the function as text"
    );
    let permitted =
        resources(&template, "AWS::Lambda::Permission")?
            .iter()
            .any(|(_, permission)| {
                let Some(properties) = permission.get("Properties") else {
                    return false;
                };
                properties.get("FunctionName").and_then(ref_name) == Some("IngestFunction")
                    && properties
                        .get("SourceArn")
                        .and_then(|arn| serde_yaml_ng::to_string(arn).ok())
                        .is_some_and(|arn| arn.contains(":${IngestRestApi}/"))
            });
    ensure!(
        permitted,
        "API Gateway may not invoke the ingest function for the firewalled API"
    );
    let stage = at(api, &["StageName"])?
        .as_str()
        .context("the firewalled API's stage name is not text")?;
    ensure!(
        variable(ingest, "AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH").is_some(),
        "lambda_http puts /{stage} before every path the firewalled API sends, which the router \
         does not know"
    );
    Ok(())
}

/// Clusters export to `IngestBaseUrl`: with the firewall on it must name the firewalled API
/// (its stage included), or every cluster keeps going around the firewall; and no output
/// names a firewall resource that may not exist.
#[test]
fn clusters_are_given_the_firewalled_endpoint() -> anyhow::Result<()> {
    let template = template()?;
    let value = at(&template, &["Outputs", "IngestBaseUrl", "Value"])?;
    let (condition, on, off) =
        if_branches(value).context("IngestBaseUrl does not depend on the firewall")?;
    ensure!(
        condition == "IngestFirewallOn",
        "IngestBaseUrl depends on {condition}"
    );
    let on = serde_yaml_ng::to_string(on)?;
    ensure!(
        on.contains("${IngestRestApi}") && on.contains("/${IngestRestApi.Stage}"),
        "with the firewall on, IngestBaseUrl is {on}"
    );
    let off = serde_yaml_ng::to_string(off)?;
    ensure!(
        off.contains("${HttpApi}"),
        "with the firewall off, IngestBaseUrl is {off}"
    );
    for (name, output) in at(&template, &["Outputs"])?
        .as_mapping()
        .context("Outputs is not a mapping")?
    {
        let name = name.as_str().unwrap_or_default();
        let text = serde_yaml_ng::to_string(output)?;
        if name != "IngestBaseUrl"
            && (text.contains("IngestRestApi") || text.contains("IngestFirewallAcl"))
        {
            ensure!(
                output.get("Condition").and_then(Value::as_str) == Some("IngestFirewallOn"),
                "output {name} names a firewall resource whether or not it exists"
            );
        }
    }
    Ok(())
}

/// A blocked address is either a flood or clusters behind one NAT address that outgrew the
/// limit (whose batches are refused too): both need someone to look. The firewalled API's own
/// 4xx and 5xx are watched as the HTTP API's are, since its metrics go by its name, not the
/// HTTP API's id.
#[test]
fn a_flood_on_the_firewalled_api_raises_an_alarm() -> anyhow::Result<()> {
    let template = template()?;
    let acl = at(&template, &["Resources", "IngestFirewallAcl", "Properties"])?;
    let acl_metric = at(acl, &["VisibilityConfig", "MetricName"])?;
    let rate_rules: Vec<&Value> = at(acl, &["Rules"])?
        .as_sequence()
        .context("the firewall's rules are not a list")?
        .iter()
        .filter(|rule| {
            rule.get("Statement")
                .and_then(|statement| statement.get("RateBasedStatement"))
                .is_some()
        })
        .collect();
    for visibility in rate_rules
        .iter()
        .filter_map(|rule| rule.get("VisibilityConfig"))
        .chain([at(acl, &["VisibilityConfig"])?])
    {
        ensure!(
            visibility
                .get("CloudWatchMetricsEnabled")
                .and_then(Value::as_bool)
                == Some(true),
            "the firewall sends no metrics for {visibility:?}"
        );
    }
    let rate_metrics: Vec<&Value> = rate_rules
        .iter()
        .filter_map(|rule| rule.get("VisibilityConfig")?.get("MetricName"))
        .collect();
    let alarms = resources(&template, "AWS::CloudWatch::Alarm")?;
    let blocked = alarms.iter().any(|(_, alarm)| {
        let Some(properties) = alarm.get("Properties") else {
            return false;
        };
        properties.get("Namespace").and_then(Value::as_str) == Some("AWS/WAFV2")
            && properties.get("MetricName").and_then(Value::as_str) == Some("BlockedRequests")
            && dimension(alarm, "WebACL") == Some(acl_metric)
            && dimension(alarm, "Rule").is_some_and(|rule| rate_metrics.contains(&rule))
            && dimension(alarm, "Region").is_some()
    });
    ensure!(
        blocked,
        "no alarm watches the requests the firewall's rate rule blocks"
    );
    // `!Sub` untagged: the text the alarms' dimensions repeat.
    let api_name = at(
        &template,
        &["Resources", "IngestRestApi", "Properties", "Name"],
    )?
    .as_str()
    .context("the firewalled API's name is not text")?;
    for metric in ["4XXError", "5XXError"] {
        ensure!(
            alarms.iter().any(|(_, alarm)| {
                let text = serde_yaml_ng::to_string(alarm).unwrap_or_default();
                text.contains("AWS/ApiGateway")
                    && text.contains(&format!("MetricName: {metric}"))
                    && text.contains("ApiName")
                    && text.contains(api_name)
            }),
            "no alarm watches the firewalled API's {metric}"
        );
    }
    for (id, alarm) in alarms.iter().filter(|(_, alarm)| {
        let text = serde_yaml_ng::to_string(alarm).unwrap_or_default();
        text.contains("AWS/WAFV2") || text.contains(api_name)
    }) {
        ensure!(
            alarm.get("Condition").and_then(Value::as_str) == Some("IngestFirewallOn"),
            "{id} watches the firewall whether or not it exists"
        );
    }
    Ok(())
}

/// The value of an alarm's dimension `name`.
fn dimension<'a>(alarm: &'a Value, name: &str) -> Option<&'a Value> {
    alarm
        .get("Properties")?
        .get("Dimensions")?
        .as_sequence()?
        .iter()
        .find(|pair| pair.get("Name").and_then(Value::as_str) == Some(name))?
        .get("Value")
}

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
            ref_name(reserved).is_some(),
            "{id}'s reserved concurrency is not a parameter"
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

/// The resources a function's inline policy statements allow one `action` on (statements
/// naming that action alone).
fn allowed<'a>(
    function: &'a Value,
    action: &'a str,
) -> anyhow::Result<impl Iterator<Item = &'a Value>> {
    Ok(at(function, &["Policies"])?
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|policy| policy.get("Statement")?.as_sequence())
        .flatten()
        .filter(move |statement| statement.get("Action").and_then(Value::as_str) == Some(action))
        .filter_map(|statement| statement.get("Resource")))
}

/// The logical id a `!Ref` or `!GetAtt ID.Attr` names.
fn ref_or_getatt(value: &Value) -> Option<&str> {
    match value {
        Value::Tagged(tagged) if tagged.tag == "GetAtt" => tagged.value.as_str()?.split('.').next(),
        other => ref_name(other),
    }
}

/// The history outlives its stack and survives a bad write: deleting the stack keeps the
/// bucket, and an overwritten or deleted object stays recoverable for a while.
#[test]
fn the_history_bucket_survives_the_stack_and_bad_writes() -> anyhow::Result<()> {
    let template = template()?;
    let bucket = at(&template, &["Resources", "HistoryBucket"])?;
    for policy in ["DeletionPolicy", "UpdateReplacePolicy"] {
        ensure!(
            bucket.get(policy).and_then(Value::as_str) == Some("Retain"),
            "the bucket's {policy} is not Retain"
        );
    }
    ensure!(
        at(bucket, &["Properties", "VersioningConfiguration", "Status"])?.as_str()
            == Some("Enabled"),
        "the bucket is not versioned"
    );
    let rules = at(bucket, &["Properties", "LifecycleConfiguration", "Rules"])?
        .as_sequence()
        .context("lifecycle rules are not a list")?;
    ensure!(
        rules
            .iter()
            .any(|rule| rule.get("NoncurrentVersionExpiration").is_some()),
        "old versions are never expired"
    );
    // Table files are removed by compaction, a session at a time; an age rule would delete
    // them by write time under a live manifest.
    for rule in rules {
        let text = serde_yaml_ng::to_string(rule)?;
        ensure!(
            !text.contains("tables/") && !text.contains("TablesRetentionDays"),
            "a lifecycle rule expires table files under live manifests: {text}"
        );
    }
    let compact_env = at(
        &template,
        &[
            "Resources",
            "CompactFunction",
            "Properties",
            "Environment",
            "Variables",
        ],
    )?;
    ensure!(
        ref_name(at(compact_env, &["AFTERGLOW_TABLES_RETENTION_DAYS"])?)
            == Some("TablesRetentionDays"),
        "compaction is not told the table retention"
    );
    Ok(())
}

/// A query route added without the authorizer would open the whole history to the world; Ray's
/// routes under `/ray/` carry the same data as `/api/`.
#[test]
fn every_query_route_is_behind_the_query_authorizer() -> anyhow::Result<()> {
    let template = template()?;
    let routes = resources(&template, "AWS::ApiGatewayV2::Route")?;
    let keys: Vec<&str> = routes
        .iter()
        .filter_map(|(_, route)| route.get("Properties")?.get("RouteKey")?.as_str())
        .collect();
    for wanted in [
        "GET /api/{proxy+}",
        "ANY /ray/{proxy+}",
        "GET /",
        "GET /assets/{proxy+}",
    ] {
        ensure!(keys.contains(&wanted), "no route {wanted}: {keys:?}");
    }
    for (id, route) in routes {
        let authorization = at(route, &["Properties", "AuthorizationType"])?;
        let Value::Tagged(tagged) = authorization else {
            bail!(
                "{id}: AuthorizationType is {authorization:?}, not !If [BearerQueries, NONE, AWS_IAM]"
            );
        };
        let choices: Vec<&str> = tagged
            .value
            .as_sequence()
            .map(|items| items.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        ensure!(
            tagged.tag == "If" && choices == ["BearerQueries", "NONE", "AWS_IAM"],
            "{id}: AuthorizationType {authorization:?}"
        );
    }
    Ok(())
}

/// The ingest secret is read at run time, never resolved into the function's configuration
/// (where a rotation would need a redeploy and anyone allowed `lambda:GetFunction` could read
/// it), and the stack creates one when none is given, kept when the stack goes.
#[test]
fn the_ingest_secret_is_read_at_run_time_and_outlives_the_stack() -> anyhow::Result<()> {
    let template = template()?;
    let variables = at(
        &template,
        &[
            "Resources",
            "IngestFunction",
            "Properties",
            "Environment",
            "Variables",
        ],
    )?;
    let Some(variables) = variables.as_mapping() else {
        bail!("the ingest function's variables are not a mapping");
    };
    let names: Vec<&str> = variables.keys().filter_map(Value::as_str).collect();
    ensure!(
        names
            == [
                "AFTERGLOW_INGEST_SECRET_ARN",
                "AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH"
            ],
        "the ingest function gets {names:?}, not only the secret's ARN and lambda_http's setting"
    );
    let text = serde_yaml_ng::to_string(&template)?;
    ensure!(
        !text.contains("resolve:secretsmanager"),
        "a secret is resolved at deploy time"
    );
    for (name, parameter) in at(&template, &["Parameters"])?
        .as_mapping()
        .context("Parameters")?
    {
        let name = name.as_str().unwrap_or_default();
        ensure!(
            !(name.starts_with("Ingest") && parameter.get("NoEcho").is_some()),
            "parameter {name} takes the ingest secret itself"
        );
    }
    let secret = at(&template, &["Resources", "IngestSecret"])?;
    ensure!(secret.get("DeletionPolicy").and_then(Value::as_str) == Some("Retain"));
    ensure!(secret.get("UpdateReplacePolicy").and_then(Value::as_str) == Some("Retain"));

    let ingest = at(&template, &["Resources", "IngestFunction", "Properties"])?;
    let readable = allowed(ingest, "secretsmanager:GetSecretValue")?
        .any(|resource| Some(resource) == variables.get("AFTERGLOW_INGEST_SECRET_ARN"));
    ensure!(
        readable,
        "the ingest role cannot read the secret its variable names"
    );
    Ok(())
}

/// The compact function queues each session's quiet check on the queue it reads (a delayed
/// message; see `shared::compact::schedule::quiet`): without the variable the function does not
/// start, without the permission every check is refused and no quiet session is ever folded.
#[test]
fn the_compact_function_may_queue_quiet_checks_on_its_own_queue() -> anyhow::Result<()> {
    let template = template()?;
    let compact = at(&template, &["Resources", "CompactFunction", "Properties"])?;
    let read = at(compact, &["Events", "RawObjects", "Properties", "Queue"])?;
    let read = ref_or_getatt(read).context("the event source names no queue")?;
    let queued = at(
        compact,
        &["Environment", "Variables", "AFTERGLOW_COMPACT_QUEUE_URL"],
    )?;
    ensure!(
        ref_name(queued) == Some(read),
        "quiet checks go to {queued:?}, not to the queue the function reads ({read})"
    );
    let quiet = number(
        &template,
        at(
            compact,
            &["Environment", "Variables", "AFTERGLOW_FOLD_QUIET_SECONDS"],
        )?,
    )?;
    ensure!(
        (1..=900).contains(&quiet),
        "SQS cannot delay a message {quiet} s"
    );
    let may_send =
        allowed(compact, "sqs:SendMessage")?.any(|resource| ref_or_getatt(resource) == Some(read));
    ensure!(may_send, "the compact role may not send to {read}");
    Ok(())
}

/// jemalloc keeps freed pages longer for compaction only: a run reuses its pages phase after
/// phase instead of faulting them back in, while the query function, whose peak memory the same
/// settings would raise, stays with the binary's own settings.
#[test]
fn only_the_compact_function_keeps_freed_pages_longer() -> anyhow::Result<()> {
    let template = template()?;
    let compact = variable(
        at(&template, &["Resources", "CompactFunction", "Properties"])?,
        "MALLOC_CONF",
    )
    .context("the compact function sets no MALLOC_CONF")?
    .as_str()
    .context("MALLOC_CONF is not text")?;
    ensure!(
        compact.contains("dirty_decay_ms:") && compact.contains("muzzy_decay_ms:"),
        "the compact function's MALLOC_CONF ({compact}) sets no decay"
    );
    let globals = template
        .get("Globals")
        .and_then(|globals| globals.get("Function"));
    ensure!(
        globals
            .and_then(|function| variable(function, "MALLOC_CONF"))
            .is_none(),
        "MALLOC_CONF is set for every function"
    );
    for (id, function) in resources(&template, "AWS::Serverless::Function")? {
        let set = function
            .get("Properties")
            .and_then(|properties| variable(properties, "MALLOC_CONF"));
        ensure!(
            id == "CompactFunction" || set.is_none(),
            "{id} sets MALLOC_CONF"
        );
    }
    Ok(())
}

/// The environment variable `name` a function's properties (or `Globals.Function`) set.
fn variable<'a>(function: &'a Value, name: &str) -> Option<&'a Value> {
    function.get("Environment")?.get("Variables")?.get(name)
}
