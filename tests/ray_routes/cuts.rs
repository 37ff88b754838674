//! A list larger than the response limit is cut and says so; gzip carries more of it.

use super::*;

/// A Ray list (`path` under `/ray/`) as `served` answers it to a client that takes gzip or not:
/// the rows, how many the filter kept, the warnings, and the bytes sent.
async fn cut_list(
    served: &Served,
    path: &str,
    gzip: bool,
) -> anyhow::Result<(Vec<Json>, u64, Vec<Json>, usize)> {
    let url = format!("{}/ray/{path}", served.server.url);
    let answer = fetch_encoded(&url, gzip.then_some("gzip")).await?;
    ensure!(
        answer.status == 200,
        "{path}: {}: {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    ensure!(
        answer.encoding.as_deref() == gzip.then_some("gzip"),
        "{path}, gzip {gzip}: {:?}",
        answer.encoding
    );
    let body: Json = serde_json::from_slice(&answer.body).context(path.to_owned())?;
    let result = list_result(&body)?;
    Ok((
        result["result"].as_array().context("result")?.clone(),
        result["num_filtered"].as_u64().context("num_filtered")?,
        // Ray writes `null` for no warnings.
        result["warnings"].as_array().cloned().unwrap_or_default(),
        answer.sent.len(),
    ))
}

/// Every attempt of `basic-workload` with every detail field.
const BASIC_TASKS: &str = "basic-workload/latest/api/v0/tasks?limit=10000&detail=True";

#[tokio::test]
async fn a_list_larger_than_the_response_limit_is_cut_and_says_so() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs(std::slice::from_ref(&run), Some(20_000)).await?;
    let (rows, filtered, warnings, _) = cut_list(&served, BASIC_TASKS, false).await?;
    let kept = rows.len();
    ensure!(
        kept > 0 && (kept as u64) < filtered,
        "{kept} of {filtered} rows"
    );
    let warning = warnings
        .first()
        .and_then(Json::as_str)
        .context("a warning")?;
    ensure!(
        warning.contains(&format!("first {kept} of {filtered} tasks"))
            && warning.contains("limit of 20000 bytes"),
        "{warning}"
    );
    Ok(())
}

/// A client that takes gzip gets as many rows as fit the response limit compressed: here the
/// whole list, which passes the limit four times over as JSON, so that on Lambda (a 6 MB
/// answer) the stock dashboard's job page is whole. Below one row, the first row is still sent.
#[tokio::test]
async fn gzip_carries_a_list_whose_compressed_answer_fits() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let whole = serve_runs(std::slice::from_ref(&run), None).await?;
    let (all, filtered, warnings, plain_bytes) = cut_list(&whole, BASIC_TASKS, false).await?;
    ensure!(all.len() as u64 == filtered && warnings.is_empty());
    whole.server.stop().await?;

    // A limit the whole list passes four times over, and its gzip fits in.
    let limit = plain_bytes / 4;
    let served = serve_runs(std::slice::from_ref(&run), Some(limit)).await?;
    let (cut, _, cut_warnings, _) = cut_list(&served, BASIC_TASKS, false).await?;
    ensure!(
        cut.len() < all.len() && cut_warnings.len() == 1,
        "without gzip: {} of {} rows",
        cut.len(),
        all.len()
    );
    let (rows, _, warnings, sent) = cut_list(&served, BASIC_TASKS, true).await?;
    ensure!(
        rows == all && warnings.is_empty() && sent <= limit,
        "with gzip: {} of {} rows, {sent} bytes sent against a limit of {limit}, {warnings:?}",
        rows.len(),
        all.len()
    );
    served.server.stop().await?;

    // A limit below one row compressed: the first row is sent all the same, and the warning
    // says the limit counts gzipped bytes.
    let served = serve_runs(std::slice::from_ref(&run), Some(300)).await?;
    let (plain, _, plain_warnings, _) = cut_list(&served, BASIC_TASKS, false).await?;
    let (rows, _, warnings, _) = cut_list(&served, BASIC_TASKS, true).await?;
    ensure!(
        rows.len() == 1 && rows == plain,
        "{} rows gzipped, {} plain",
        rows.len(),
        plain.len()
    );
    let warning = |warnings: &[Json]| warnings.first().and_then(Json::as_str).map(str::to_owned);
    ensure!(
        warning(warnings.as_slice())
            .is_some_and(|text| text.contains("limit of 300 bytes (gzipped)"))
            && warning(plain_warnings.as_slice())
                .is_some_and(|text| text.contains("limit of 300 bytes (of JSON)")),
        "{warnings:?} {plain_warnings:?}"
    );
    served.server.stop().await
}

/// Synthetic traffic of `attempts` attempts whose task names compress about three times over
/// at gzip's fastest level: 20 pieces of 16 pseudo-random hex digits (the same on every run),
/// each followed by the same word.
fn bodies_with_names_that_compress_three_times(attempts: u64) -> anyhow::Result<Vec<Vec<u8>>> {
    use synth::{Generator, SynthSettings};

    // splitmix64: deterministic, and as hard to compress as random digits.
    let mut state = 7_u64;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut generator = Generator::new(SynthSettings {
        attempts,
        jobs: 1,
        nodes: 2,
        workers_per_node: 4,
        failure_rate: 0.0,
        actor_share: 0.0,
        nested_share: 0.0,
        duplicate_rate: 0.0,
        ..SynthSettings::default()
    });
    let mut renamed = 0_u64;
    let mut bodies = Vec::new();
    for body in generator.by_ref() {
        let mut events: Vec<Json> = serde_json::from_slice(&body?.json)?;
        for event in &mut events {
            if let Some(name) = event.pointer_mut("/taskDefinitionEvent/taskName") {
                *name = Json::String(
                    (0..20)
                        .map(|_| format!("{:016x}-repeated-", next()))
                        .collect(),
                );
                renamed += 1;
            }
        }
        bodies.push(serde_json::to_vec(&events)?);
    }
    ensure!(
        renamed >= attempts && generator.truth().attempts == attempts,
        "{renamed} names for {:?}",
        generator.truth()
    );
    Ok(bodies)
}

/// The response limit of a gzipped answer counts compressed bytes: a list whose rows compress
/// about three times over holds clearly more rows than the plain answer (several times as many
/// fit; half as many again is asserted), in a gzipped answer within the limit. Every gzipped
/// answer fits and reads back as JSON.
#[tokio::test]
async fn gzip_counts_the_response_limit_in_compressed_bytes() -> anyhow::Result<()> {
    const LIMIT: usize = 16_000;
    const ATTEMPTS: u64 = 300;
    let served = serve_runs(&[], Some(LIMIT)).await?;
    post_all(
        &format!("{}/v1/events/hex", served.server.url),
        &bodies_with_names_that_compress_three_times(ATTEMPTS)?,
    )
    .await?;
    served.queue.idle().await;

    let tasks = "hex/latest/api/v0/tasks?limit=10000";
    let (plain, filtered, plain_warnings, plain_bytes) = cut_list(&served, tasks, false).await?;
    ensure!(
        !plain.is_empty() && (plain.len() as u64) * 4 < filtered && plain_warnings.len() == 1,
        "without gzip: {} of {filtered} rows in {plain_bytes} bytes",
        plain.len()
    );
    let (rows, _, warnings, sent) = cut_list(&served, tasks, true).await?;
    ensure!(
        2 * rows.len() >= 3 * plain.len()
            && (rows.len() as u64) < filtered
            && rows.starts_with(&plain),
        "with gzip: {} of {filtered} rows, {} without",
        rows.len(),
        plain.len()
    );
    ensure!(
        sent <= LIMIT,
        "{sent} bytes sent against a limit of {LIMIT}"
    );
    let warning = warnings
        .first()
        .and_then(Json::as_str)
        .context("a warning")?;
    ensure!(
        warning.contains(&format!("first {} of {filtered} tasks", rows.len()))
            && warning.contains(&format!("limit of {LIMIT} bytes (gzipped)")),
        "{warning}"
    );

    // Detailed rows, a short list, one task and another kind of list.
    let task_id = plain
        .first()
        .and_then(|row| row["task_id"].as_str())
        .context("a task id")?;
    for path in [
        format!("{tasks}&detail=True"),
        "hex/latest/api/v0/tasks?limit=5".to_owned(),
        format!("{tasks}&filter_keys=task_id&filter_predicates=%3D&filter_values={task_id}"),
        "hex/latest/api/v0/actors?limit=10000&detail=True".to_owned(),
    ] {
        let (plain, ..) = cut_list(&served, &path, false).await?;
        let (rows, _, _, sent) = cut_list(&served, &path, true).await?;
        ensure!(
            sent <= LIMIT && rows.len() >= plain.len() && rows.starts_with(&plain),
            "{path}: {} rows gzipped in {sent} bytes, {} plain",
            rows.len(),
            plain.len()
        );
    }
    served.server.stop().await
}
