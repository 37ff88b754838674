//! The log queue between log ingest and the log store function: requests reach it, batches are
//! a window long and bounded like compaction's, and nothing in it expires or is dead-lettered
//! unseen.

use anyhow::{Context as _, ensure};
use shared::config::LambdaFunction;

use super::*;

/// The log ingest function queues on the queue the log store function reads, the store runs
/// batches of a window (a node's requests in one write) no more at once than it is reserved,
/// and a message outlives every retry and has an alarm once dead-lettered.
#[test]
fn log_requests_are_queued_and_stored_a_batch_at_a_time() -> anyhow::Result<()> {
    let template = template()?;
    let ingest = at(&template, &["Resources", "LogIngestFunction", "Properties"])?;
    ensure!(
        variable(ingest, "AFTERGLOW_LOG_QUEUE_URL").and_then(ref_name) == Some("LogQueue"),
        "log ingest is not given the log queue"
    );
    let sends: Vec<_> = allowed(ingest, "sqs:SendMessage")?.collect();
    ensure!(
        sends
            .iter()
            .any(|resource| ref_or_getatt(resource) == Some("LogQueue")),
        "log ingest may not send to the log queue: {sends:?}"
    );

    let store = at(&template, &["Resources", "LogStoreFunction", "Properties"])?;
    let handler = at(store, &["Handler"])?.as_str().context("Handler")?;
    ensure!(
        LambdaFunction::ALL.contains(&handler),
        "the binary serves no handler {handler:?}"
    );
    let source = sqs_source_within_reserved(&template, "LogStoreFunction", "LogRequests")?;
    ensure!(
        ref_or_getatt(at(source, &["Queue"])?) == Some("LogQueue"),
        "the log store reads another queue"
    );
    let window = number(&template, at(source, &["MaximumBatchingWindowInSeconds"])?)?;
    ensure!(
        (30..=300).contains(&window),
        "a {window} s window batches few requests of a node (or is more than Lambda allows)"
    );
    let failures = serde_yaml_ng::to_string(at(source, &["FunctionResponseTypes"])?)?;
    ensure!(
        failures.contains("ReportBatchItemFailures"),
        "one node's failure would redeliver every node's requests"
    );
    let puts = serde_yaml_ng::to_string(&allowed(store, "s3:PutObject")?.collect::<Vec<_>>())?;
    ensure!(
        puts.contains("/logs/*") && !puts.contains("/raw/") && !puts.contains("/tables/"),
        "the log store writes outside logs/: {puts}"
    );

    let queue = at(&template, &["Resources", "LogQueue", "Properties"])?;
    let timeout = number(&template, at(store, &["Timeout"])?)?;
    let visibility = number(&template, at(queue, &["VisibilityTimeout"])?)?;
    ensure!(
        visibility >= 6 * timeout,
        "visibility {visibility} s under six times the log store's {timeout} s timeout"
    );
    let receives = number(&template, at(queue, &["RedrivePolicy", "maxReceiveCount"])?)?;
    ensure!(
        receives >= 10,
        "maxReceiveCount {receives}: an outage dead-letters logs"
    );
    ensure!(
        ref_or_getatt(at(queue, &["RedrivePolicy", "deadLetterTargetArn"])?)
            == Some("LogDeadLetterQueue"),
        "the log queue dead-letters elsewhere"
    );
    for queue in ["LogQueue", "LogDeadLetterQueue"] {
        let retention = message_retention(&template, queue)?;
        ensure!(
            retention == 14 * DAY_S,
            "{queue} keeps messages {retention} s, not 14 days: they are the only copy"
        );
    }
    let watched = resources(&template, "AWS::CloudWatch::Alarm")?
        .into_iter()
        .any(|(_, alarm)| {
            dimension(alarm, "QueueName").and_then(ref_or_getatt) == Some("LogDeadLetterQueue")
        });
    ensure!(watched, "no alarm watches the log dead-letter queue");
    Ok(())
}
