//! The optional ingest firewall: nothing until enabled, then a REST API for ingest behind a WAF
//! rate rule per address, given to clusters as their endpoint, with its own alarms.

use anyhow::{Context as _, bail, ensure};
use serde_yaml_ng::Value;

use super::*;

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

/// The firewalled API carries exactly the ingest functions' routes (nothing reaches the query
/// routes around their authorizer), each to its own function (events and logs), byte bodies
/// arrive as bytes, API Gateway may invoke each function for it, and each function sees the
/// paths its router knows, not the stage before them.
#[test]
fn the_firewalled_api_routes_ingest_to_the_ingest_functions() -> anyhow::Result<()> {
    let template = template()?;
    let api = at(&template, &["Resources", "IngestRestApi", "Properties"])?;
    let paths = at(api, &["DefinitionBody", "paths"])?;
    let stage = at(api, &["StageName"])?
        .as_str()
        .context("the firewalled API's stage name is not text")?;
    let mut routes = 0;
    for function in ["IngestFunction", "LogIngestFunction"] {
        let ingest = at(&template, &["Resources", function, "Properties"])?;
        let events = at(ingest, &["Events"])?
            .as_mapping()
            .with_context(|| format!("{function}'s events are not a mapping"))?;
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
                uri.contains(&format!("${{{function}.Arn}}")),
                "the firewalled API sends {method} {path} to {uri}, not {function}"
            );
            routes += 1;
        }
        let permitted =
            resources(&template, "AWS::Lambda::Permission")?
                .iter()
                .any(|(_, permission)| {
                    let Some(properties) = permission.get("Properties") else {
                        return false;
                    };
                    properties.get("FunctionName").and_then(ref_name) == Some(function)
                        && properties
                            .get("SourceArn")
                            .and_then(|arn| serde_yaml_ng::to_string(arn).ok())
                            .is_some_and(|arn| arn.contains(":${IngestRestApi}/"))
                });
        ensure!(
            permitted,
            "API Gateway may not invoke {function} for the firewalled API"
        );
        ensure!(
            variable(ingest, "AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH").is_some(),
            "lambda_http puts /{stage} before every path the firewalled API sends {function}, \
             which the router does not know"
        );
    }
    let declared = paths.as_mapping().map_or(0, |paths| paths.len());
    ensure!(
        routes == 2 && declared == routes,
        "the firewalled API has {declared} paths for the ingest functions' {routes} routes"
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
