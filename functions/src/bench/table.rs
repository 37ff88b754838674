//! The bench's readable summary on stderr, beside the JSON report on stdout.

use super::report::Report;

/// The readable summary, with the targets (docs/performance.md, "Targets") beside the numbers.
/// A route the report lacks prints `-`.
pub(super) fn print_table(report: &Report) {
    let warm_p50 = |route: &str| {
        report
            .query
            .routes
            .get(route)
            .map(|times| times.warm.p50_ms)
    };
    let rows: Vec<(&str, Option<f64>, &str)> = vec![
        (
            "ingest p50 per 1000-event body (ms)",
            Some(report.ingest.per_body_ms.p50_ms),
            "<= 20",
        ),
        (
            "ingest p95 per body (ms)",
            Some(report.ingest.per_body_ms.p95_ms),
            "",
        ),
        (
            "compaction (events/s)",
            Some(report.compaction.events_per_s),
            ">= 200000",
        ),
        (
            "storage per attempt, no error text (B)",
            Some(report.storage.bytes_per_attempt_without_error_text),
            "<= 60",
        ),
        (
            "storage per attempt, all (B)",
            Some(report.storage.bytes_per_attempt),
            "",
        ),
        ("summary warm p50 (ms)", warm_p50("summary"), "<= 100"),
        (
            "aggregates by name warm p50 (ms)",
            warm_p50("aggregates_by_name"),
            "<= 300",
        ),
        ("insights warm p50 (ms)", warm_p50("insights"), "<= 300"),
        ("table page warm p50 (ms)", warm_p50("table_page"), "<= 100"),
        (
            "job+FAILED page warm p50 (ms)",
            warm_p50("table_page_job_failed"),
            "<= 100",
        ),
        (
            "point lookup warm p50 (ms)",
            warm_p50("point_lookup"),
            "<= 50",
        ),
        (
            "point lookup, oldest failed task, warm p50 (ms)",
            warm_p50("point_lookup_oldest"),
            "<= 50",
        ),
        ("search warm p50 (ms)", warm_p50("search"), "<= 1000"),
        (
            "Ray's job page: api/v0/tasks, limit=10000 (ms)",
            warm_p50("ray_job_tasks"),
            "<= 2000",
        ),
        ("query peak RSS (MiB)", report.query.peak_rss_mib, "<= 1024"),
        (
            "USD per million attempts, ingest + compact",
            Some(report.cost.usd_once),
            "",
        ),
        (
            "USD per month per million attempts, tables",
            Some(report.cost.storage.usd_per_month_tables),
            "",
        ),
    ];
    eprintln!("{:<42} {:>14}  target", "measure", "value");
    for (name, value, target) in rows {
        // Dollars per million attempts are cents: one decimal would print them as 0.0.
        let decimals = if name.starts_with("USD") { 3 } else { 1 };
        let value = value.map_or_else(|| "-".to_owned(), |value| format!("{value:.decimals$}"));
        eprintln!("{name:<42} {value:>14}  {target}");
    }
}
