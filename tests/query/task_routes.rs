//! The task routes over captured runs: search by a word of the stack trace, cursor pages in
//! every order (filters and aggregate groups page too), a 400 naming each bad parameter, a
//! task's attempts with Ray's transitions, and the timeline paged by cursor.

use std::collections::{BTreeMap, BTreeSet};

use afterglow_tests::api::{Api, serve_locally};
use afterglow_tests::ray::{LOSSY_RUN, ray_transitions};
use afterglow_tests::{FixtureRun, Served};
use anyhow::{Context as _, ensure};
use serde_json::Value as Json;

/// `q` finds a task by a word of its stack trace, in any case, and lists only tasks that
/// mention it; a word that is nowhere finds nothing.
#[tokio::test]
async fn search_finds_a_task_by_a_word_of_its_stack_trace() -> anyhow::Result<()> {
    let (served, api, tasks) = basic_workload().await?;
    let failing = tasks
        .iter()
        .find(|task| {
            task["error_message"]
                .as_str()
                .is_some_and(|message| message.contains("KeyError"))
        })
        .context("a task whose stack trace names KeyError")?;
    let wanted = failing["task_id"].as_str().context("task_id")?;
    // Lower case on purpose: search ignores case.
    let found = api
        .all_pages(
            "/api/tasks",
            "q=keyerror&include_error_message=true",
            "tasks",
        )
        .await?;
    ensure!(
        found.iter().any(|task| task["task_id"] == wanted),
        "searching `keyerror` did not find {wanted}"
    );
    for task in &found {
        let text = [
            "task_id",
            "job_id",
            "actor_id",
            "node_id",
            "worker_id",
            "parent_task_id",
            "name",
            "func_or_class_name",
            "error_type",
            "error_message",
        ]
        .iter()
        .filter_map(|field| task[*field].as_str())
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase();
        ensure!(
            text.contains("keyerror"),
            "{task} does not mention keyerror"
        );
    }
    // And a word that is nowhere finds nothing.
    let none = api.ok("/api/tasks?q=no-such-word-anywhere").await?;
    ensure!(none["tasks"].as_array().is_some_and(Vec::is_empty));
    served.server.stop().await
}

/// Every order, paged by cursor in pages of 1 and 7 rows, lists every attempt once and in
/// order, nulls included (the lossy run has attempts that never ran: no duration); each page
/// first finds where its rows end by the sort column alone, so a page of 1 row has a bound
/// shared by ties and nulls.
#[tokio::test]
async fn pagination_visits_every_row_exactly_once_in_every_order() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let lossy = FixtureRun::named(LOSSY_RUN)?;
    let (served, api) = serve_locally(&[run, lossy]).await?;
    let total = api.ok("/api/summary").await?["total"]
        .as_u64()
        .context("total")?;
    let mut nulls = 0;
    let mut walked: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (sort, order, limit) in ["creation", "duration"]
        .into_iter()
        .flat_map(|sort| ["desc", "asc"].map(|order| (sort, order)))
        .flat_map(|(sort, order)| [1, 7].map(|limit| (sort, order, limit)))
    {
        {
            let rows = api
                .all_pages(
                    "/api/tasks",
                    &format!("sort={sort}&order={order}&limit={limit}"),
                    "tasks",
                )
                .await?;
            // The runs replayed the same script: task ids repeat across clusters.
            let keys: BTreeSet<(String, String, i64)> = rows
                .iter()
                .map(|row| {
                    (
                        row["cluster"].as_str().unwrap_or_default().to_owned(),
                        row["task_id"].as_str().unwrap_or_default().to_owned(),
                        row["attempt_number"].as_i64().unwrap_or(-1),
                    )
                })
                .collect();
            ensure!(
                rows.len() as u64 == total && keys.len() == rows.len(),
                "{sort} {order}: {} rows, {} distinct, {total} in the summary",
                rows.len(),
                keys.len()
            );
            let field = if sort == "creation" {
                "creation_time_ms"
            } else {
                "duration_ms"
            };
            // A page spanning sessions walks them one after the other (newest first when
            // descending), each in the order asked; nulls sort below every value.
            let mut blocks: Vec<(String, Vec<i64>)> = Vec::new();
            for row in &rows {
                let session = format!("{}/{}", row["cluster"], row["session_name"]);
                let value = row[field].as_i64().unwrap_or(i64::MIN);
                match blocks.last_mut() {
                    Some((last, values)) if *last == session => values.push(value),
                    _ => blocks.push((session, vec![value])),
                }
            }
            let order_of_blocks: Vec<&String> = blocks.iter().map(|(session, _)| session).collect();
            ensure!(
                order_of_blocks.len() == 2,
                "{sort} {order} by {limit}: sessions interleaved: {order_of_blocks:?}"
            );
            walked.insert(
                order.to_owned(),
                order_of_blocks.iter().map(|s| (*s).clone()).collect(),
            );
            nulls += blocks
                .iter()
                .flat_map(|(_, values)| values)
                .filter(|value| **value == i64::MIN)
                .count();
            let sorted = blocks.iter().all(|(_, values)| {
                values.windows(2).all(|pair| {
                    if order == "desc" {
                        pair[0] >= pair[1]
                    } else {
                        pair[0] <= pair[1]
                    }
                })
            });
            ensure!(sorted, "{sort} {order} by {limit}: rows out of order");
        }
    }
    ensure!(
        nulls > 0,
        "no attempt without a time: the null orders went untried"
    );
    let (desc, asc) = (&walked["desc"], &walked["asc"]);
    let mut started: Vec<(i64, String)> = Vec::new();
    for cluster in api.ok("/api/clusters").await?["clusters"]
        .as_array()
        .context("clusters")?
    {
        for session in cluster["sessions"].as_array().context("sessions")? {
            let first_ms = session["first_ms"].as_i64().context("first_ms")?;
            started.push((
                first_ms,
                format!("{}/{}", cluster["cluster"], session["session_name"]),
            ));
        }
    }
    started.sort();
    ensure!(
        started
            .iter()
            .rev()
            .map(|(_, session)| session)
            .eq(desc.iter()),
        "descending pages walk the newest session first: {desc:?}, started {started:?}"
    );
    ensure!(
        desc.iter().rev().eq(asc.iter()),
        "ascending pages walk the sessions in the reverse order: {desc:?}, {asc:?}"
    );
    // Filters page too: FAILED attempts only, every one of them.
    let failed = api
        .all_pages("/api/tasks", "state=FAILED&limit=3", "tasks")
        .await?;
    let summary = api.ok("/api/summary?state=FAILED").await?;
    ensure!(failed.len() as u64 == summary["total"].as_u64().unwrap_or(0));
    ensure!(failed.iter().all(|task| task["state"] == "FAILED"));
    // Aggregate groups page as well.
    let groups = api
        .all_pages("/api/aggregates", "by=name&limit=2", "groups")
        .await?;
    let whole = api.ok("/api/aggregates?by=name&limit=1000").await?;
    ensure!(Some(&Json::Array(groups)) == whole.get("groups"));
    served.server.stop().await
}

/// A bad parameter gets a 400 whose message names it; a cursor of one ordering is refused by
/// another; a task nobody has is a 404.
#[tokio::test]
async fn bad_parameters_get_a_400_that_names_them() -> anyhow::Result<()> {
    let run = FixtureRun::named("edge-cases")?;
    let (served, api) = serve_locally(std::slice::from_ref(&run)).await?;
    let cases = [
        ("/api/tasks?limit=0", "limit"),
        ("/api/tasks?limit=100000", "limit"),
        ("/api/tasks?limit=ten", "limit"),
        ("/api/tasks?state=DONE", "state"),
        ("/api/tasks?job_id=not-hex", "job_id"),
        ("/api/tasks?sort=name", "sort"),
        ("/api/tasks?order=sideways", "order"),
        ("/api/tasks?cursor=bm90LWEtY3Vyc29y", "cursor"),
        ("/api/tasks?since_ms=10&until_ms=5", "since_ms"),
        ("/api/tasks?type=LAMBDA", "type"),
        ("/api/tasks?include_drivers=maybe", "include_drivers"),
        ("/api/tasks?colour=red", "colour"),
        ("/api/tasks?name=a&name=b", "name"),
        ("/api/aggregates?by=colour", "by"),
        ("/api/summary?cluster=no%20spaces", "cluster"),
        ("/api/tasks/xyz", "task_id"),
        ("/api/actors?state=ALIVE&job_id=zz", "job_id"),
        ("/api/timeline?limit=1000000", "limit"),
    ];
    for (url, parameter) in cases {
        let answer = api.get(url).await?;
        let message = answer.body["error"].as_str().unwrap_or_default();
        ensure!(
            answer.status == 400 && message.contains(parameter),
            "{url}: {} {message:?}",
            answer.status
        );
    }
    // A cursor of one ordering is refused by another.
    let page = api.ok("/api/tasks?limit=1&sort=duration").await?;
    let cursor = page["next"].as_str().context("next")?;
    let answer = api
        .get(&format!("/api/tasks?limit=1&cursor={cursor}"))
        .await?;
    ensure!(answer.status == 400, "{}", answer.body);
    let missing = api.get("/api/tasks/00ff").await?;
    ensure!(missing.status == 404, "{}", missing.body);
    served.server.stop().await
}

/// A task's detail lists every attempt Ray lists, each with Ray's state transitions, error,
/// log file and resources.
#[tokio::test]
async fn task_detail_shows_every_attempt_with_rays_transitions() -> anyhow::Result<()> {
    let (served, api, tasks) = basic_workload().await?;
    let mut by_task: BTreeMap<&str, Vec<&Json>> = BTreeMap::new();
    for task in &tasks {
        by_task
            .entry(task["task_id"].as_str().context("task_id")?)
            .or_default()
            .push(task);
    }
    let retried = by_task
        .values()
        .filter(|attempts| attempts.len() > 1)
        .count();
    ensure!(retried > 0, "the fixture has a retried task");
    for (task_id, ray_attempts) in &by_task {
        let detail = api.ok(&format!("/api/tasks/{task_id}")).await?;
        let attempts = detail["attempts"].as_array().context("attempts")?;
        ensure!(
            attempts.len() == ray_attempts.len(),
            "{task_id}: {} attempts vs Ray's {}",
            attempts.len(),
            ray_attempts.len()
        );
        for ray in ray_attempts {
            let ours = attempts
                .iter()
                .find(|attempt| attempt["attempt_number"] == ray["attempt_number"])
                .with_context(|| format!("{task_id} attempt {}", ray["attempt_number"]))?;
            let theirs: Vec<(String, String)> = ray_transitions(ray)?
                .into_iter()
                .map(|(state, millis)| (state, millis.to_string()))
                .collect();
            let mine: Vec<(String, String)> = ours["events"]
                .as_array()
                .context("events")?
                .iter()
                .map(|event| {
                    (
                        event["state"].as_str().unwrap_or_default().to_owned(),
                        event["created_ms"].to_string(),
                    )
                })
                .collect();
            ensure!(
                mine == theirs,
                "{task_id}: events {mine:?} vs Ray's {theirs:?}"
            );
            ensure!(
                ours["error_message"] == ray["error_message"],
                "{task_id}: error {} vs {}",
                ours["error_message"],
                ray["error_message"]
            );
            ensure!(
                ours["task_log_info"]["stdout_file"] == ray["task_log_info"]["stdout_file"],
                "{task_id}: log info"
            );
            ensure!(
                ours["required_resources"] == ray["required_resources"],
                "{task_id}: resources"
            );
        }
    }
    served.server.stop().await
}

/// The timeline draws a span for every attempt that ran, with profile spans and process names;
/// paged by cursor, it draws each attempt exactly once.
#[tokio::test]
async fn timeline_draws_every_attempt_that_ran() -> anyhow::Result<()> {
    let (served, api, tasks) = basic_workload().await?;
    let ran = tasks
        .iter()
        .filter(|task| !task["start_time_ms"].is_null() && !task["end_time_ms"].is_null())
        .count();
    let trace = api.ok("/api/timeline").await?;
    let events = trace["traceEvents"].as_array().context("traceEvents")?;
    let tasks = events.iter().filter(|event| event["cat"] == "task").count();
    ensure!(tasks == ran, "{tasks} task spans, {ran} attempts that ran");
    ensure!(events.iter().any(|event| event["cat"] == "profile"));
    ensure!(events.iter().any(|event| event["name"] == "process_name"));
    let limited = api.ok("/api/timeline?limit=5").await?;
    ensure!(limited["otherData"]["truncated"] == true);
    // Page through with the cursor: every attempt that ran, each exactly once.
    let mut seen = BTreeSet::new();
    let mut path = "/api/timeline?limit=5".to_owned();
    for _ in 0..ran {
        let page = api.ok(&path).await?;
        for event in page["traceEvents"].as_array().context("traceEvents")? {
            if event["cat"] == "task" {
                let attempt = (
                    event["args"]["task_id"].to_string(),
                    event["args"]["attempt_number"].to_string(),
                );
                ensure!(seen.insert(attempt.clone()), "{attempt:?} drawn twice");
            }
        }
        match page["otherData"]["next"].as_str() {
            Some(next) => path = format!("/api/timeline?limit=5&cursor={next}"),
            None => break,
        }
    }
    ensure!(
        seen.len() == ran,
        "{} attempts over the pages, {ran} ran",
        seen.len()
    );
    served.server.stop().await
}

/// basic-workload served over a local folder: the server, a client for it, and the attempts of
/// Ray's own task list for the run.
async fn basic_workload() -> anyhow::Result<(Served, Api, Vec<Json>)> {
    let run = FixtureRun::named("basic-workload")?;
    let (served, api) = serve_locally(std::slice::from_ref(&run)).await?;
    let truth = run.ground_truth("tasks.json")?;
    let tasks = truth.as_array().context("tasks")?.clone();
    Ok((served, api, tasks))
}
