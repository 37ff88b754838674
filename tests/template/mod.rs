//! The deployment's safety rules, read from `template.yaml`: what cfn-lint and `sam validate`
//! cannot know is wrong for Afterglow. Each test names the failure it prevents: good data
//! dead-lettered unrun, alarms that never reach anyone, an unbounded bill, a history that dies
//! with its stack, a token in an access log, one flooding address refusing every cluster.

mod access;
mod alarms;
mod build;
mod catalog;
mod compaction;
mod firewall;
mod limits;
mod log_queue;

use std::path::Path;

use anyhow::{Context as _, bail};
use serde_yaml_ng::Value;

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

/// The properties of `function`'s SQS event `event`, once its maximum concurrency is checked:
/// Lambda's poller hands a function more batches than its reserved concurrency runs unless the
/// source caps them, and each throttled batch counts as a receive (good messages would reach the
/// dead-letter queue without ever running); two at least, so one slow batch stalls nothing.
fn sqs_source_within_reserved<'a>(
    template: &'a Value,
    function: &str,
    event: &str,
) -> anyhow::Result<&'a Value> {
    let properties = at(template, &["Resources", function, "Properties"])?;
    let reserved = number(template, at(properties, &["ReservedConcurrentExecutions"])?)?;
    let source = at(properties, &["Events", event, "Properties"])?;
    let maximum = number(
        template,
        at(source, &["ScalingConfig", "MaximumConcurrency"])?,
    )?;
    anyhow::ensure!(
        (2..=reserved).contains(&maximum),
        "{function}'s SQS source may run {maximum} batches at once against a reserved \
         concurrency of {reserved}"
    );
    Ok(source)
}

/// The map, the parameter keying it and the attribute of a `!FindInMap [MAP, !Ref PARAMETER,
/// ATTRIBUTE]`, if `value` is one.
fn find_in_map(value: &Value) -> Option<(&str, &str, &str)> {
    let Value::Tagged(tagged) = value else {
        return None;
    };
    if tagged.tag != "FindInMap" {
        return None;
    }
    match tagged.value.as_sequence()?.as_slice() {
        [map, key, attribute] => Some((map.as_str()?, ref_name(key)?, attribute.as_str()?)),
        _ => None,
    }
}

/// A number, the default of the parameter a `!Ref` names, or what a `!FindInMap` keyed by a
/// parameter gives at the parameter's default.
fn number(template: &Value, value: &Value) -> anyhow::Result<i64> {
    if let Some(name) = ref_name(value) {
        let default = at(template, &["Parameters", name, "Default"])?;
        return default
            .as_i64()
            .with_context(|| format!("parameter {name} has no numeric default"));
    }
    if let Some((map, parameter, attribute)) = find_in_map(value) {
        let key = number(
            template,
            at(template, &["Parameters", parameter, "Default"])?,
        )?;
        return number(
            template,
            at(template, &["Mappings", map, &key.to_string(), attribute])?,
        );
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

/// How long the queue `queue` keeps a message (seconds).
fn message_retention(template: &Value, queue: &str) -> anyhow::Result<i64> {
    number(
        template,
        at(
            template,
            &["Resources", queue, "Properties", "MessageRetentionPeriod"],
        )?,
    )
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

/// The resources a function's inline policy statements allow one `action` on (statements
/// naming that action, alone or in a list).
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
        .filter(move |statement| match statement.get("Action") {
            Some(Value::String(one)) => one == action,
            Some(Value::Sequence(many)) => many.iter().any(|one| one.as_str() == Some(action)),
            _ => false,
        })
        .filter_map(|statement| statement.get("Resource")))
}

/// The logical id a `!Ref` or `!GetAtt ID.Attr` names.
fn ref_or_getatt(value: &Value) -> Option<&str> {
    match value {
        Value::Tagged(tagged) if tagged.tag == "GetAtt" => tagged.value.as_str()?.split('.').next(),
        other => ref_name(other),
    }
}

/// The environment variable `name` a function's properties (or `Globals.Function`) set.
fn variable<'a>(function: &'a Value, name: &str) -> Option<&'a Value> {
    function.get("Environment")?.get("Variables")?.get(name)
}
