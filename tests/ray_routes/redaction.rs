//! Runtime-env secrets (`env_vars` values) masked in every answer, as Ray's dashboard masks
//! them: the runtime envs of Ray's task, actor and job routes equal those of Ray's own answers
//! for the same runs passed through Ray's own `redact_state_rows`
//! (`ground-truth/redacted-runtime-envs.json`, written by `fixtures/ray-redaction-2.60/make.py`),
//! and no `env_vars` value the runs set is shown, there or through `/api/…`.

use super::*;

/// Ray's `REDACTED_PLACEHOLDER`.
const RAYS_PLACEHOLDER: &str = "<redacted>";

/// Every `env_vars` entry Ray listed for `run` in its unredacted answers: `(key, value)`.
fn secrets(run: &FixtureRun) -> anyhow::Result<BTreeSet<(String, String)>> {
    let parse = |text: &Json| {
        text.as_str()
            .and_then(|text| serde_json::from_str::<Json>(text).ok())
            .unwrap_or(Json::Null)
    };
    let mut envs = Vec::new();
    for task in run
        .ground_truth("tasks.json")?
        .as_array()
        .context("tasks")?
    {
        envs.push(parse(&task["runtime_env_info"]["serialized_runtime_env"]));
    }
    for actor in run
        .ground_truth("actors.json")?
        .as_array()
        .context("actors")?
    {
        envs.push(parse(&actor["serialized_runtime_env"]));
    }
    for job in run.ground_truth("jobs.json")?.as_array().context("jobs")? {
        envs.push(job["runtime_env"].clone());
    }
    let mut found = BTreeSet::new();
    for env in &envs {
        for (key, value) in env["env_vars"].as_object().into_iter().flatten() {
            let value = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned);
            found.insert((key.clone(), value));
        }
    }
    Ok(found)
}

/// Adds to `problems` what `answer` shows of `secrets`: a value next to its key in any form (in
/// an object, or in one serialized in a string), a long value anywhere, or a value other than
/// Ray's placeholder in any runtime env's `env_vars`. Returns how many `env_vars` maps it saw.
fn check_masked(
    what: &str,
    answer: &Json,
    secrets: &BTreeSet<(String, String)>,
    problems: &mut Vec<String>,
) -> usize {
    let text = answer.to_string();
    for (key, value) in secrets {
        let pairs = [
            format!("\"{key}\":\"{value}\""),
            format!("\"{key}\": \"{value}\""),
            format!("\\\"{key}\\\":\\\"{value}\\\""),
            format!("\\\"{key}\\\": \\\"{value}\\\""),
        ];
        // Long values (paths) appear nowhere else in the runs: not even alone.
        if pairs.iter().any(|pair| text.contains(pair))
            || (value.len() >= 8 && text.contains(value))
        {
            problems.push(format!("{what} shows {key}={value}"));
        }
    }
    let mut maps = 0;
    let mut pending = vec![answer];
    while let Some(node) = pending.pop() {
        match node {
            Json::Object(fields) => {
                for (field, value) in fields {
                    let env = match (field.as_str(), value) {
                        ("runtime_env", Json::Object(_)) => Some(value.clone()),
                        ("serialized_runtime_env", Json::String(text)) => {
                            serde_json::from_str::<Json>(text).ok()
                        }
                        _ => None,
                    };
                    if let Some(vars) = env.as_ref().and_then(|env| env["env_vars"].as_object()) {
                        maps += 1;
                        for (name, shown) in vars {
                            if shown != RAYS_PLACEHOLDER {
                                problems.push(format!("{what}: env_vars {name}={shown}"));
                            }
                        }
                    }
                    pending.push(value);
                }
            }
            Json::Array(items) => pending.extend(items),
            _ => {}
        }
    }
    maps
}

/// The rows of one of Ray's list routes.
async fn ray_rows(served: &Served, path: &str) -> anyhow::Result<Vec<Json>> {
    let (status, body) = served.get(path).await?;
    ensure!(status == 200, "{path}: {status} {body}");
    Ok(list_result(&body)?["result"]
        .as_array()
        .context("rows")?
        .clone())
}

/// Ray's redacted runtime envs of one `kind` (`tasks`, `actors` or `jobs`) in `truth`, `run`'s
/// `ground-truth/redacted-runtime-envs.json`: each of Ray's rows, keyed as `task_key` or
/// `row_id` key it, → its runtime env as Ray's `redact_state_rows` returned it (tasks:
/// `runtime_env_info.serialized_runtime_env`, the only part Ray's redaction changes).
fn rays_redacted<'a>(
    run: &FixtureRun,
    truth: &'a Json,
    kind: &str,
) -> anyhow::Result<&'a serde_json::Map<String, Json>> {
    truth[kind]
        .as_object()
        .with_context(|| format!("{}: {kind} in redacted-runtime-envs.json", run.name))
}

/// Compares `field` of our `rows` with Ray's redacted runtime envs of `kind`, row by row (rows
/// keyed by `key`); every row of Ray's must be among ours.
fn equal_to_rays(
    run: &FixtureRun,
    truth: &Json,
    kind: &str,
    rows: &[Json],
    key: &dyn Fn(&Json) -> String,
    field: &dyn Fn(&Json) -> Json,
    problems: &mut Vec<String>,
) -> anyhow::Result<usize> {
    let ours: BTreeMap<String, Json> = rows.iter().map(|row| (key(row), field(row))).collect();
    let mut compared = 0;
    for (id, theirs) in rays_redacted(run, truth, kind)? {
        match ours.get(id) {
            Some(mine) if mine == theirs => compared += 1,
            mine => problems.push(format!(
                "{} {kind} {id}: ours {mine:?}, Ray's redacted {theirs}",
                run.name
            )),
        }
    }
    Ok(compared)
}

/// A row's id `field` as the fixture's keys write it: the string itself (an id that is not a
/// string matches none of Ray's).
fn row_id(row: &Json, field: &str) -> String {
    row[field].as_str().unwrap_or_default().to_owned()
}

fn task_key(row: &Json) -> String {
    format!("{}#{}", row_id(row, "task_id"), row["attempt_number"])
}

fn task_env(row: &Json) -> Json {
    row["runtime_env_info"]["serialized_runtime_env"].clone()
}

#[tokio::test]
async fn runtime_env_secrets_are_masked_in_every_answer_as_rays_dashboard_masks_them()
-> anyhow::Result<()> {
    let runs = FixtureRun::all()?;
    let served = serve_runs(&runs, None).await?;
    let api = Api::Http(served.server.url.clone());
    let mut problems = Vec::new();
    let (mut with_secrets, mut with_compared) = (0, 0);
    for run in &runs {
        let secrets = secrets(run)?;
        let cluster = &run.name;
        let base = format!("/ray/{cluster}/latest");
        // Ray's routes, as `ray list … --detail` and the dashboard's pages ask them.
        let tasks = ray_rows(
            &served,
            &format!("{base}/api/v0/tasks?limit=10000&detail=True&exclude_driver=True"),
        )
        .await?;
        let actors = ray_rows(
            &served,
            &format!("{base}/api/v0/actors?limit=10000&detail=True"),
        )
        .await?;
        let jobs = ray_rows(
            &served,
            &format!("{base}/api/v0/jobs?limit=10000&detail=True"),
        )
        .await?;
        let (status, job_page) = served.get(&format!("{base}/api/jobs/")).await?;
        ensure!(status == 200, "{base}/api/jobs/: {status} {job_page}");
        let job_page = job_page.as_array().context("api/jobs/")?.clone();
        // Our routes: each task of Ray's list, one by one (the page's detail), and the lists.
        let mut ids: Vec<&str> = tasks
            .iter()
            .filter_map(|task| task["task_id"].as_str())
            .collect();
        ids.dedup();
        ids.truncate(25);
        let mut attempts = Vec::new();
        for id in ids {
            let detail = api
                .ok(&format!("/api/tasks/{id}?cluster={cluster}"))
                .await?;
            attempts.extend(
                detail["attempts"]
                    .as_array()
                    .context("attempts")?
                    .iter()
                    .cloned(),
            );
        }
        let api_lists = [
            api.all_pages(
                "/api/tasks",
                &format!("cluster={cluster}&limit=1000"),
                "tasks",
            )
            .await?,
            api.all_pages("/api/actors", &format!("cluster={cluster}"), "actors")
                .await?,
            api.all_pages("/api/jobs", &format!("cluster={cluster}"), "jobs")
                .await?,
        ];

        // Nothing shows a value, and the answers that carry runtime envs do carry them (a
        // route that dropped them would show nothing too).
        let carried = !secrets.is_empty();
        let lossy = run.name == LOSSY_RUN;
        for (what, rows, must_carry) in [
            ("api/v0/tasks", &tasks, carried),
            ("api/v0/actors", &actors, carried),
            // The lossy run lost its driver's definition: no runtime env to carry.
            ("api/v0/jobs", &jobs, carried && !lossy),
            ("api/jobs/", &job_page, carried && !lossy),
            ("/api/tasks/{id}", &attempts, carried),
            ("/api/tasks", &api_lists[0], false),
            ("/api/actors", &api_lists[1], false),
            ("/api/jobs", &api_lists[2], false),
        ] {
            let maps = check_masked(
                &format!("{cluster} {what}"),
                &Json::Array(rows.clone()),
                &secrets,
                &mut problems,
            );
            if must_carry && maps == 0 {
                problems.push(format!("{cluster} {what}: no runtime env with env_vars"));
            }
        }
        with_secrets += usize::from(carried);

        // Byte for byte Ray's own answers, redacted by Ray's own code. The lossy run's store
        // kept definitions the export lost, so its rows are not all ours to compare.
        if lossy {
            continue;
        }
        // Every row of Ray's is compared (a missing one is a problem).
        let truth = run.ground_truth("redacted-runtime-envs.json")?;
        for compared in [
            equal_to_rays(
                run,
                &truth,
                "tasks",
                &tasks,
                &task_key,
                &task_env,
                &mut problems,
            )?,
            equal_to_rays(
                run,
                &truth,
                "actors",
                &actors,
                &|row| row_id(row, "actor_id"),
                &|row| row["serialized_runtime_env"].clone(),
                &mut problems,
            )?,
        ] {
            with_compared += compared;
        }
        // Jobs as the state API lists them and as the Jobs page reads them.
        for listed in [&jobs, &job_page] {
            with_compared += equal_to_rays(
                run,
                &truth,
                "jobs",
                listed,
                &|row| row_id(row, "job_id"),
                &|row| row["runtime_env"].clone(),
                &mut problems,
            )?;
        }
        // Our own route says what Ray's says for the same attempts (it also shows attempts
        // Ray's list leaves out, such as a restarted actor's creation without a definition).
        let rays = rays_redacted(run, &truth, "tasks")?;
        let mut ours_compared = 0;
        for attempt in &attempts {
            let key = task_key(attempt);
            let Some(theirs) = rays.get(&key) else {
                continue;
            };
            ours_compared += 1;
            if task_env(attempt) != *theirs {
                problems.push(format!(
                    "{cluster} /api/tasks {key}: ours {}, Ray's redacted {theirs}",
                    task_env(attempt)
                ));
            }
        }
        ensure!(
            ours_compared > 0,
            "{cluster}: no attempt of /api/tasks/{{id}} is Ray's"
        );
    }
    ensure!(with_secrets >= 6, "only {with_secrets} runs set env_vars");
    ensure!(
        with_compared > 0,
        "nothing compared with Ray's redacted answers"
    );
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    served.server.stop().await
}
