//! The log queue between log ingest and the log store function, at every number of shards:
//! requests reach each shard, each shard's batches are a window long and bounded like
//! compaction's, and nothing in them expires or is dead-lettered unseen.

use anyhow::{Context as _, bail, ensure};
use serde_yaml_ng::Value;
use shared::config::LambdaFunction;

use super::*;

/// The log ingest function queues on every shard the log store function reads, each shard's
/// source runs batches of a window (a node's requests in one write), all of them together no
/// more at once than the store is reserved, and a message outlives every retry and has an
/// alarm once late or dead-lettered.
#[test]
fn log_requests_are_queued_and_stored_a_batch_at_a_time() -> anyhow::Result<()> {
    let template = template()?;
    let ingest = at(&template, &["Resources", "LogIngestFunction", "Properties"])?;
    let store = at(&template, &["Resources", "LogStoreFunction", "Properties"])?;
    let handler = at(store, &["Handler"])?.as_str().context("Handler")?;
    ensure!(
        LambdaFunction::ALL.contains(&handler),
        "the binary serves no handler {handler:?}"
    );
    let puts = serde_yaml_ng::to_string(&allowed(store, "s3:PutObject")?.collect::<Vec<_>>())?;
    ensure!(
        puts.contains("/logs/*") && !puts.contains("/raw/") && !puts.contains("/tables/"),
        "the log store writes outside logs/: {puts}"
    );
    let counts = at(
        &template,
        &["Parameters", "LogQueueShards", "AllowedValues"],
    )?
    .as_sequence()
    .context("LogQueueShards has no AllowedValues")?;
    ensure!(counts.len() > 1, "the log queue has one shard at most");
    for count in counts {
        let count = number(&template, count)?;
        let deployed = Deployed {
            template: &template,
            shards: count,
        };
        shards_are_queued_and_stored(&deployed, ingest, store)
            .with_context(|| format!("with LogQueueShards={count}"))?;
    }

    let retention = message_retention(&template, "LogDeadLetterQueue")?;
    ensure!(
        retention == 14 * DAY_S,
        "the log dead-letter queue keeps messages {retention} s, not 14 days"
    );
    let watched = resources(&template, "AWS::CloudWatch::Alarm")?
        .into_iter()
        .any(|(_, alarm)| {
            dimension(alarm, "QueueName").and_then(ref_or_getatt) == Some("LogDeadLetterQueue")
        });
    ensure!(watched, "no alarm watches the log dead-letter queue");
    Ok(())
}

/// The checks of [`log_requests_are_queued_and_stored_a_batch_at_a_time`] for one deployment.
fn shards_are_queued_and_stored(
    deployed: &Deployed<'_>,
    ingest: &Value,
    store: &Value,
) -> anyhow::Result<()> {
    let template = deployed.template;
    let mut shards = Vec::new();
    for (id, queue) in resources(template, "AWS::SQS::Queue")? {
        let target = queue
            .get("Properties")
            .and_then(|properties| properties.get("RedrivePolicy"))
            .and_then(|policy| policy.get("deadLetterTargetArn"));
        if deployed.present(queue)? && target.and_then(ref_or_getatt) == Some("LogDeadLetterQueue")
        {
            shards.push(id.to_owned());
        }
    }
    ensure!(
        shards.len() as i64 == deployed.shards,
        "{} shard queues: {shards:?}",
        shards.len()
    );

    let urls = deployed.names(
        variable(ingest, "AFTERGLOW_LOG_QUEUE_URLS").context("log ingest has no queue URLs")?,
    )?;
    ensure!(
        urls.first().map(String::as_str) == Some("LogQueue") && same_set(&urls, &shards),
        "log ingest is given the queues {urls:?}, not each of {shards:?} once"
    );
    let sends = deployed.all_names(allowed(ingest, "sqs:SendMessage")?)?;
    ensure!(
        shards.iter().all(|shard| sends.contains(shard)),
        "log ingest may send only to {sends:?}"
    );

    let reserved = deployed.number(at(store, &["ReservedConcurrentExecutions"])?)?;
    let event = at(store, &["Events", "LogRequests"])?;
    ensure!(
        at(event, &["Type"])?.as_str() == Some("SQS"),
        "LogRequests is not an SQS event"
    );
    // (queue, the source's properties, whether SAM's event grants its polling)
    let mut sources = Vec::new();
    let properties = at(event, &["Properties"])?;
    for queue in deployed.names(at(properties, &["Queue"])?)? {
        sources.push((queue, properties, true));
    }
    for (id, mapping) in resources(template, "AWS::Lambda::EventSourceMapping")? {
        let properties = at(mapping, &["Properties"])?;
        if deployed.present(mapping)?
            && ref_name(at(properties, &["FunctionName"])?) == Some("LogStoreFunction")
        {
            let queues = deployed.names(at(properties, &["EventSourceArn"])?);
            let queues = queues.with_context(|| format!("{id} reads no queue of the template"))?;
            for queue in queues {
                sources.push((queue, properties, false));
            }
        }
    }
    let read: Vec<String> = sources.iter().map(|(queue, ..)| queue.clone()).collect();
    ensure!(
        same_set(&read, &shards),
        "the log store reads {read:?}, not each of {shards:?} once"
    );
    let polls = deployed.all_names(allowed(store, "sqs:ReceiveMessage")?)?;
    let mut at_once = 0;
    for (queue, source, granted) in &sources {
        let window = deployed.number(at(source, &["MaximumBatchingWindowInSeconds"])?)?;
        ensure!(
            (30..=300).contains(&window),
            "{queue}: a {window} s window batches few requests of a node (or is more than \
             Lambda allows)"
        );
        ensure!(
            deployed.number(at(source, &["BatchSize"])?)? == 10_000,
            "{queue}: a batch holds fewer than Lambda's 10 000 messages"
        );
        let failures = serde_yaml_ng::to_string(at(source, &["FunctionResponseTypes"])?)?;
        ensure!(
            failures.contains("ReportBatchItemFailures"),
            "{queue}: one node's failure would redeliver every node's requests"
        );
        let maximum = deployed.number(at(source, &["ScalingConfig", "MaximumConcurrency"])?)?;
        ensure!(maximum >= 2, "{queue}: a source runs two batches at least");
        at_once += maximum;
        ensure!(
            *granted || polls.contains(queue),
            "the log store may not receive from {queue}"
        );
        queue_keeps_its_messages(deployed, store, queue)?;
    }
    ensure!(
        at_once <= reserved,
        "the shards' sources may run {at_once} batches at once against a reserved concurrency \
         of {reserved}: throttled batches count as receives"
    );
    Ok(())
}

/// The shard `queue` outlives the log store's retries, dead-letters after many, keeps a
/// message 14 days (the only copy of its bytes) and outlives its shard's removal, and has an
/// alarm when its messages wait.
fn queue_keeps_its_messages(
    deployed: &Deployed<'_>,
    store: &Value,
    queue: &str,
) -> anyhow::Result<()> {
    let template = deployed.template;
    let resource = at(template, &["Resources", queue])?;
    if resource.get("Condition").is_some() {
        // A lower LogQueueShards deletes the shard: its messages must outlive that.
        for policy in ["DeletionPolicy", "UpdateReplacePolicy"] {
            ensure!(
                resource.get(policy).and_then(Value::as_str) == Some("Retain"),
                "{queue}'s {policy} is not Retain: lowering the shards deletes its requests"
            );
        }
    }
    let properties = at(resource, &["Properties"])?;
    let timeout = deployed.number(at(store, &["Timeout"])?)?;
    let visibility = deployed.number(at(properties, &["VisibilityTimeout"])?)?;
    ensure!(
        visibility >= 6 * timeout,
        "{queue}: visibility {visibility} s under six times the log store's {timeout} s timeout"
    );
    let receives = deployed.number(at(properties, &["RedrivePolicy", "maxReceiveCount"])?)?;
    ensure!(
        receives >= 10,
        "{queue}: maxReceiveCount {receives}: an outage dead-letters logs"
    );
    let retention = message_retention(template, queue)?;
    ensure!(
        retention == 14 * DAY_S,
        "{queue} keeps messages {retention} s, not 14 days: they are the only copy"
    );
    let mut lag = false;
    for (_, alarm) in resources(template, "AWS::CloudWatch::Alarm")? {
        let metric = alarm
            .get("Properties")
            .and_then(|properties| properties.get("MetricName"));
        lag |= deployed.present(alarm)?
            && metric.and_then(Value::as_str) == Some("ApproximateAgeOfOldestMessage")
            && dimension(alarm, "QueueName").and_then(ref_or_getatt) == Some(queue);
    }
    ensure!(lag, "no alarm says when {queue}'s requests wait");
    Ok(())
}

/// Whether `a` and `b` hold the same names, each once.
fn same_set(a: &[String], b: &[String]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort();
    b.sort();
    let distinct = a.windows(2).all(|pair| pair[0] != pair[1]);
    distinct && a == b
}

/// The template as CloudFormation deploys it with `LogQueueShards` = `shards` and every other
/// parameter at its default: the conditions, `!If`, `!FindInMap` and `AWS::NoValue` of what
/// this test reads, evaluated.
struct Deployed<'a> {
    template: &'a Value,
    shards: i64,
}

impl Deployed<'_> {
    /// A parameter's value, as `!Ref` gives it (a string).
    fn parameter(&self, name: &str) -> anyhow::Result<String> {
        if name == "LogQueueShards" {
            return Ok(self.shards.to_string());
        }
        let default = at(self.template, &["Parameters", name, "Default"])?;
        scalar_text(default)
    }

    /// A scalar, or the parameter a `!Ref` names.
    fn scalar(&self, value: &Value) -> anyhow::Result<String> {
        match ref_name(value) {
            Some(name) => self.parameter(name),
            None => scalar_text(value),
        }
    }

    /// Whether the condition `name` holds.
    fn holds(&self, name: &str) -> anyhow::Result<bool> {
        self.truth(at(self.template, &["Conditions", name])?)
    }

    fn truth(&self, value: &Value) -> anyhow::Result<bool> {
        let Value::Tagged(tagged) = value else {
            bail!("{value:?} is not a condition");
        };
        let operands = tagged.value.as_sequence();
        Ok(
            match (tagged.tag.to_string().trim_start_matches('!'), operands) {
                ("Equals", Some(pair)) if pair.len() == 2 => {
                    self.scalar(&pair[0])? == self.scalar(&pair[1])?
                }
                ("Not", Some(one)) if one.len() == 1 => !self.truth(&one[0])?,
                ("Or", Some(any)) => any
                    .iter()
                    .try_fold(false, |held, one| anyhow::Ok(held || self.truth(one)?))?,
                ("And", Some(all)) => all
                    .iter()
                    .try_fold(true, |held, one| anyhow::Ok(held && self.truth(one)?))?,
                ("Condition", None) => self.holds(tagged.value.as_str().context("!Condition")?)?,
                _ => bail!("cannot evaluate {value:?}"),
            },
        )
    }

    /// Whether a resource is deployed (its `Condition`, if any, holds).
    fn present(&self, resource: &Value) -> anyhow::Result<bool> {
        match resource.get("Condition").and_then(Value::as_str) {
            Some(condition) => self.holds(condition),
            None => Ok(true),
        }
    }

    /// `value` with its `!If` and `!FindInMap` evaluated; `!Ref AWS::NoValue` stays, for the
    /// caller to drop.
    fn resolve(&self, value: &Value) -> anyhow::Result<Value> {
        if let Some((condition, then, otherwise)) = if_branches(value) {
            let chosen = if self.holds(condition)? {
                then
            } else {
                otherwise
            };
            return self.resolve(chosen);
        }
        if let Some((map, parameter, attribute)) = find_in_map(value) {
            let key = self.parameter(parameter)?;
            return Ok(at(self.template, &["Mappings", map, &key, attribute])?.clone());
        }
        Ok(value.clone())
    }

    /// A number once evaluated ([`number`]).
    fn number(&self, value: &Value) -> anyhow::Result<i64> {
        number(self.template, &self.resolve(value)?)
    }

    /// The logical ids `value` names: one `!Ref` or `!GetAtt`, a list of them, or a `!Join` of
    /// them, once evaluated.
    fn names(&self, value: &Value) -> anyhow::Result<Vec<String>> {
        let value = self.resolve(value)?;
        let items = match &value {
            Value::Sequence(items) => items.clone(),
            Value::Tagged(tagged) if tagged.tag == "Join" => match tagged.value.as_sequence() {
                Some(parts) if parts.len() == 2 => {
                    parts[1].as_sequence().context("!Join of no list")?.clone()
                }
                _ => bail!("cannot read {value:?}"),
            },
            one => vec![one.clone()],
        };
        let mut names = Vec::new();
        for item in &items {
            let item = self.resolve(item)?;
            match ref_or_getatt(&item) {
                Some("AWS::NoValue") => {}
                Some(name) => names.push(name.to_owned()),
                None => bail!("{item:?} names no resource"),
            }
        }
        Ok(names)
    }

    /// The logical ids every one of `values` names.
    fn all_names<'v>(
        &self,
        values: impl Iterator<Item = &'v Value>,
    ) -> anyhow::Result<Vec<String>> {
        let mut names = Vec::new();
        for value in values {
            names.extend(self.names(value)?);
        }
        Ok(names)
    }
}

/// A scalar's text, as CloudFormation compares it.
fn scalar_text(value: &Value) -> anyhow::Result<String> {
    match value {
        Value::String(text) => Ok(text.clone()),
        Value::Number(number) => Ok(number.to_string()),
        Value::Bool(flag) => Ok(flag.to_string()),
        other => bail!("{other:?} is not a scalar"),
    }
}
