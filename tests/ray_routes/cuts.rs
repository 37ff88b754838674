//! A list larger than the response limit is cut and says so; gzip carries more of it.

use super::*;

/// Ray's task list as `served` answers it to a client that takes gzip or not: the rows, how
/// many the filter kept, the warnings, and the bytes sent.
async fn cut_list(
    served: &Served,
    gzip: bool,
) -> anyhow::Result<(Vec<Json>, u64, Vec<Json>, usize)> {
    let url = format!(
        "{}/ray/basic-workload/latest/api/v0/tasks?limit=10000&detail=True",
        served.server.url
    );
    let answer = fetch_encoded(&url, gzip.then_some("gzip")).await?;
    ensure!(
        answer.status == 200,
        "{}: {}",
        answer.status,
        String::from_utf8_lossy(&answer.body)
    );
    ensure!(
        answer.encoding.as_deref() == gzip.then_some("gzip"),
        "gzip {gzip}: {:?}",
        answer.encoding
    );
    let body: Json = serde_json::from_slice(&answer.body)?;
    let result = list_result(&body)?;
    Ok((
        result["result"].as_array().context("result")?.clone(),
        result["num_filtered"].as_u64().context("num_filtered")?,
        // Ray writes `null` for no warnings.
        result["warnings"].as_array().cloned().unwrap_or_default(),
        answer.sent.len(),
    ))
}

#[tokio::test]
async fn a_list_larger_than_the_response_limit_is_cut_and_says_so() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs(std::slice::from_ref(&run), Some(20_000)).await?;
    let (rows, filtered, warnings, _) = cut_list(&served, false).await?;
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

/// A client that takes gzip gets up to six times more rows, compressed into the same limit, so
/// that on Lambda (a 6 MB answer) the stock dashboard's job page is whole.
/// When even the compressed answer would not fit, it is the plain answer, compressed.
#[tokio::test]
async fn gzip_carries_lists_six_times_the_response_limit() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let whole = serve_runs(std::slice::from_ref(&run), None).await?;
    let (all, filtered, warnings, plain_bytes) = cut_list(&whole, false).await?;
    ensure!(all.len() as u64 == filtered && warnings.is_empty());
    whole.server.stop().await?;

    // A limit the whole list passes four times over, and its gzip fits in.
    let limit = plain_bytes / 4;
    let served = serve_runs(std::slice::from_ref(&run), Some(limit)).await?;
    let (cut, _, cut_warnings, _) = cut_list(&served, false).await?;
    ensure!(
        cut.len() < all.len() && cut_warnings.len() == 1,
        "without gzip: {} of {} rows",
        cut.len(),
        all.len()
    );
    let (rows, _, warnings, sent) = cut_list(&served, true).await?;
    ensure!(
        rows == all && warnings.is_empty() && sent <= limit,
        "with gzip: {} of {} rows, {sent} bytes sent against a limit of {limit}, {warnings:?}",
        rows.len(),
        all.len()
    );
    served.server.stop().await?;

    // A limit below one row compressed: the larger answer does not fit, so the plain one is
    // sent (its warning names the plain limit), gzipped.
    let served = serve_runs(std::slice::from_ref(&run), Some(300)).await?;
    let (plain, _, plain_warnings, _) = cut_list(&served, false).await?;
    let (rows, _, warnings, _) = cut_list(&served, true).await?;
    ensure!(rows == plain && warnings == plain_warnings, "{warnings:?}");
    ensure!(
        warnings
            .first()
            .and_then(Json::as_str)
            .is_some_and(|warning| warning.contains("limit of 300 bytes")),
        "{warnings:?}"
    );
    served.server.stop().await
}
