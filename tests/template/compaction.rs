//! The compact function's queue, batch and memory: good data is never dead-lettered unrun,
//! batches are the runs compaction is measured at, and only compaction keeps freed pages longer.

use anyhow::{Context as _, ensure};
use shared::compact::schedule::batch::BatchLimits;

use super::*;

/// Lambda's SQS poller hands a function more batches than its reserved concurrency runs unless
/// the source's maximum concurrency caps it; each throttled batch counts as a receive, so good
/// objects would reach the dead-letter queue without ever running. Messages and raw objects must
/// also outlive every retry path.
#[test]
fn compaction_is_never_dead_lettered_by_throttling_or_expiry() -> anyhow::Result<()> {
    let template = template()?;
    sqs_source_within_reserved(&template, "CompactFunction", "RawObjects")?;
    let queue = at(&template, &["Resources", "RawObjectQueue", "Properties"])?;
    let receives = number(&template, at(queue, &["RedrivePolicy", "maxReceiveCount"])?)?;
    ensure!(
        receives >= 10,
        "maxReceiveCount {receives}: a short outage dead-letters good objects"
    );
    let mut longest_queue = 0;
    for queue in ["RawObjectQueue", "RawObjectDeadLetterQueue"] {
        let retention = message_retention(&template, queue)?;
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
