//! Ray's list routes over the history: the same rows, filters and error shapes as Ray's own.

use super::*;

#[tokio::test]
async fn ray_list_tasks_over_the_history_equals_rays_own() -> anyhow::Result<()> {
    let runs = FixtureRun::all()?;
    let served = serve_runs(&runs, None).await?;
    let api = Api::Http(served.server.url.clone());
    for run in &runs {
        // The exact request `ray list tasks --detail --limit 10000` sends.
        let path = format!(
            "/ray/{}/latest/api/v0/tasks?limit=10000&timeout=24&detail=True&exclude_driver=True\
             &server_timeout_multiplier=0.8",
            run.name
        );
        let answer = api.get(&path).await?;
        ensure!(answer.status == 200, "{path}: {}", answer.body);
        let result = list_result(&answer.body)?;
        let rows = result["result"].as_array().context("rows")?;
        let truth = run.ground_truth("tasks.json")?;
        let truth = truth.as_array().context("tasks.json")?;
        // Ray's CLI prints the detail columns in `TaskState` order: so do our rows.
        let ray_keys: Vec<&String> = truth
            .first()
            .and_then(Json::as_object)
            .context("a Ray row")?
            .keys()
            .collect();
        for row in rows {
            let keys: Vec<&String> = row.as_object().context("row")?.keys().collect();
            ensure!(keys == ray_keys, "{}: columns {keys:?}", run.name);
        }
        let ids: Vec<&str> = rows
            .iter()
            .filter_map(|row| row["task_id"].as_str())
            .collect();
        ensure!(
            ids.is_sorted(),
            "{}: rows are not in task id order",
            run.name
        );
        ensure!(
            result["num_filtered"] == json!(rows.len())
                && result["total"] == result["num_after_truncation"],
            "{}: counts {result:?}",
            run.name
        );
        if run.name == LOSSY_RUN {
            // Ray's own store kept events the export dropped: the rows are compared through
            // `/api/tasks`, which says which failures were synthesized (tests/query/).
            continue;
        }
        ensure!(
            rows.len() == truth.len(),
            "{}: {} rows, Ray {}",
            run.name,
            rows.len(),
            truth.len()
        );
        let ours: Vec<Json> = rows.iter().cloned().map(as_compared).collect();
        check(run, &our_rows(&ours)?, "Ray's route")?;
        for row in rows {
            ensure!(
                row["required_resources"].is_object(),
                "the task page needs required_resources as an object: {row}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn filters_select_what_rays_filters_select() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs(std::slice::from_ref(&run), None).await?;
    let truth = run.ground_truth("tasks.json")?;
    let truth = truth.as_array().context("tasks.json")?;
    let count = |pick: &dyn Fn(&Json) -> bool| truth.iter().filter(|task| pick(task)).count();
    let failed = truth
        .iter()
        .find(|task| task["state"] == json!("FAILED"))
        .context("a failed task")?;
    let job = failed["job_id"].as_str().context("job")?;
    let task_id = failed["task_id"].as_str().context("task")?;
    let cases: Vec<(String, usize)> = vec![
        // Ray compares strings case-insensitively.
        (
            "filter_keys=state&filter_predicates=%3D&filter_values=failed".to_owned(),
            count(&|task| task["state"] == json!("FAILED")),
        ),
        (
            "filter_keys=state&filter_predicates=%21%3D&filter_values=FINISHED".to_owned(),
            count(&|task| task["state"] != json!("FINISHED")),
        ),
        (
            "filter_keys=name&filter_predicates=%3D&filter_values=WORK".to_owned(),
            count(&|task| task["name"] == json!("work")),
        ),
        (
            "filter_keys=attempt_number&filter_predicates=%3D&filter_values=1".to_owned(),
            count(&|task| task["attempt_number"] == json!(1)),
        ),
        (
            format!(
                "filter_keys=job_id&filter_predicates=%3D&filter_values={job}\
                 &filter_keys=state&filter_predicates=%3D&filter_values=FAILED"
            ),
            count(&|task| task["job_id"] == json!(job) && task["state"] == json!("FAILED")),
        ),
        (
            format!("filter_keys=task_id&filter_predicates=%3D&filter_values={task_id}"),
            count(&|task| task["task_id"] == json!(task_id)),
        ),
        // A missing field matches neither `=` nor `!=` (error_type is null unless failed).
        (
            "filter_keys=error_type&filter_predicates=%21%3D&filter_values=NOPE".to_owned(),
            count(&|task| !task["error_type"].is_null()),
        ),
    ];
    for (filter, expected) in cases {
        let path = format!("/ray/basic-workload/latest/api/v0/tasks?limit=10000&{filter}");
        let (status, body) = served.get(&path).await?;
        ensure!(status == 200, "{path}: {body}");
        let result = list_result(&body)?;
        ensure!(
            expected > 0,
            "{filter}: the case selects nothing in Ray's list"
        );
        ensure!(
            result["num_filtered"] == json!(expected)
                && result["result"].as_array().map(Vec::len) == Some(expected),
            "{filter}: {} rows, {} filtered; Ray's list has {expected}",
            result["result"].as_array().map_or(0, Vec::len),
            result["num_filtered"]
        );
    }
    // `limit` cuts the rows, not the counts; without `detail` only Ray's default columns.
    let (_, body) = served
        .get("/ray/basic-workload/api/v0/tasks?limit=3")
        .await?;
    let result = list_result(&body)?;
    ensure!(result["result"].as_array().map(Vec::len) == Some(3));
    ensure!(result["num_filtered"] == json!(truth.len()), "{result:?}");
    let first = result["result"][0].as_object().context("row")?;
    ensure!(
        first.len() == 13 && !first.contains_key("events"),
        "{first:?}"
    );
    // A limit below the row count reads up to the task id where the first rows end (found by
    // a sort of that column alone) and gives the first rows of the whole list, in its order:
    // with retried tasks, whose attempts straddle the bound when it falls on them.
    let (_, body) = served
        .get("/ray/basic-workload/api/v0/tasks?limit=10000&detail=True")
        .await?;
    let all = list_result(&body)?["result"]
        .as_array()
        .context("rows")?
        .clone();
    let retried: Vec<usize> = (1..all.len())
        .filter(|&index| all[index]["task_id"] == all[index - 1]["task_id"])
        .collect();
    ensure!(!retried.is_empty(), "no retried task in the list");
    let mut limits = vec![1, 2, 7, all.len() - 1, all.len()];
    limits.extend(retried.iter().flat_map(|&index| [index, index + 1]));
    for limit in limits {
        let path = format!("/ray/basic-workload/api/v0/tasks?limit={limit}&detail=True");
        let (status, body) = served.get(&path).await?;
        ensure!(status == 200, "{path}: {body}");
        let result = list_result(&body)?;
        let rows = result["result"].as_array().context("rows")?;
        ensure!(
            rows.as_slice() == &all[..limit],
            "{path}: not the first {limit} rows of the whole list"
        );
        ensure!(result["num_filtered"] == json!(truth.len()), "{result:?}");
    }
    Ok(())
}

#[tokio::test]
async fn bad_requests_get_rays_error_shape_and_what_is_not_a_route_is_left_to_ray()
-> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs(std::slice::from_ref(&run), None).await?;
    let session = {
        let (_, body) = served.get("/api/clusters").await?;
        body["clusters"][0]["sessions"][0]["session_name"]
            .as_str()
            .context("session")?
            .to_owned()
    };
    let ray_error = |status: u16, body: &Json, words: &str| -> anyhow::Result<()> {
        ensure!(
            body["result"] == json!(false)
                && body["data"] == json!({"result": null})
                && body["msg"].as_str().is_some_and(|msg| msg.contains(words)),
            "{status}: {body} (wanted a message with {words:?})"
        );
        Ok(())
    };
    for (path, status, words) in [
        (
            "/ray/basic-workload/latest/api/v0/tasks?filter_keys=bogus&filter_predicates=%3D&filter_values=x".to_owned(),
            400,
            "The given filter column bogus is not supported",
        ),
        (
            "/ray/basic-workload/latest/api/v0/actors?filter_keys=state&filter_predicates=%3E&filter_values=x".to_owned(),
            400,
            "Unsupported filter predicate > is given",
        ),
        (
            "/ray/basic-workload/latest/api/v0/tasks?limit=abc".to_owned(),
            400,
            "invalid literal for int()",
        ),
        (
            "/ray/basic-workload/latest/api/v0/tasks?limit=18446744073709551615".to_owned(),
            400,
            "Given limit 18446744073709551615 exceeds the supported limit",
        ),
        (
            format!(
                "/ray/basic-workload/latest/api/v0/tasks?{}",
                "filter_keys=state&filter_predicates=%3D&filter_values=FAILED&".repeat(40)
            ),
            400,
            "40 filters were given",
        ),
        (
            "/ray/no-such-cluster/latest/api/v0/tasks".to_owned(),
            404,
            "no cluster `no-such-cluster`",
        ),
        (
            "/ray/basic-workload/session_1999-01-01_00-00-00_0_0/api/v0/tasks".to_owned(),
            404,
            "has no session `session_1999-01-01_00-00-00_0_0`",
        ),
    ] {
        let (got, body) = served.get(&path).await?;
        ensure!(got == status, "{path}: {got} {body}");
        ray_error(got, &body, words)?;
    }
    // The session by name and by `latest` (or by nothing) are the same history.
    let named = served
        .get(&format!(
            "/ray/basic-workload/{session}/api/v0/tasks?limit=5"
        ))
        .await?;
    let latest = served
        .get("/ray/basic-workload/latest/api/v0/tasks?limit=5")
        .await?;
    let bare = served
        .get("/ray/basic-workload/api/v0/tasks?limit=5")
        .await?;
    ensure!(named.0 == 200 && named == latest && latest == bare);
    // Ray's UI files and unknown paths: a bare 404, so Ray's dashboard serves its own.
    for path in [
        "/",
        "/static/js/main.84605326.js",
        "/favicon.ico",
        "/api/v0/nope",
    ] {
        let (status, body) = served
            .get(&format!("/ray/basic-workload/latest{path}"))
            .await?;
        ensure!(status == 404 && body.is_null(), "{path}: {status} {body}");
    }
    // The dashboard's page of a cluster or session that is not stored: not a 404, after which
    // Ray's proxy would show its own empty cluster, but a page that says so and names a
    // cluster that is stored.
    for (path, words) in [
        ("/ray/no-such-cluster/", "no cluster `no-such-cluster`"),
        (
            "/ray/no-such-cluster/latest/index.html",
            "no cluster `no-such-cluster`",
        ),
        (
            "/ray/basic-workload/session_1999-01-01_00-00-00_0_0/",
            "has no session `session_1999-01-01_00-00-00_0_0`",
        ),
    ] {
        let response = reqwest::get(format!("{}{path}", served.server.url)).await?;
        let status = response.status().as_u16();
        let media = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let page = response.text().await?;
        ensure!(
            status == 200 && media.starts_with("text/html"),
            "{path}: {status} {media}"
        );
        ensure!(
            page.contains(words) && page.contains("basic-workload"),
            "{path}: {page}"
        );
    }
    Ok(())
}
