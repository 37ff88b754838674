//! Alarms reach someone, and a flood on the HTTP API raises one.

use anyhow::{Context as _, ensure};
use serde_yaml_ng::Value;

use super::*;

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
