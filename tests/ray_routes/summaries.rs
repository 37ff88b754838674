//! `ray summary tasks` over the history: Ray's own grouping, and lineages as deep as their job.

use super::*;

#[tokio::test]
async fn ray_summary_tasks_over_the_history_equals_rays_own() -> anyhow::Result<()> {
    let run = FixtureRun::named("basic-workload")?;
    let served = serve_runs(std::slice::from_ref(&run), None).await?;
    let api = Api::Http(served.server.url.clone());
    // What `ray summary tasks` sends.
    let answer = api
        .get("/ray/basic-workload/latest/api/v0/tasks/summarize?timeout=30")
        .await?;
    ensure!(answer.status == 200, "{}", answer.body);
    let ours = &answer.body["data"]["result"]["result"]["node_id_to_summary"]["cluster"];
    let truth = run.ground_truth("summary_tasks.json")?;
    let theirs = &truth["tasks"]["cluster"];
    for key in [
        "total_tasks",
        "total_actor_tasks",
        "total_actor_scheduled",
        "summary_by",
    ] {
        ensure!(
            ours[key] == theirs[key],
            "{key}: ours {}, Ray's {}",
            ours[key],
            theirs[key]
        );
    }
    let by_name = |summary: &Json| -> BTreeMap<String, Json> {
        summary["summary"]
            .as_object()
            .map(|groups| groups.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    };
    ensure!(
        by_name(ours) == by_name(theirs),
        "ours {:?}\nRay's {:?}",
        by_name(ours),
        by_name(theirs)
    );
    Ok(())
}

/// Ray's own `TaskSummaries` code, run by `fixtures/ray-summaries-2.60/make.py` on one input.
#[test]
fn the_summaries_group_exactly_as_rays_code_does() -> anyhow::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/ray-summaries-2.60");
    let read = |name: &str| -> anyhow::Result<Json> {
        Ok(serde_json::from_str(&std::fs::read_to_string(
            dir.join(name),
        )?)?)
    };
    let input = read("input.json")?;
    let text = |value: &Json| value.as_str().map(str::to_owned);
    let tasks: Vec<SummaryTask> = input["tasks"]
        .as_array()
        .context("tasks")?
        .iter()
        .map(|task| SummaryTask {
            task_id: text(&task["task_id"]).unwrap_or_default(),
            name: text(&task["name"]).unwrap_or_default(),
            func_or_class_name: text(&task["func_or_class_name"]).unwrap_or_default(),
            task_type: text(&task["type"]).unwrap_or_default(),
            state: text(&task["state"]).unwrap_or_default(),
            actor_id: text(&task["actor_id"]),
            parent_task_id: text(&task["parent_task_id"]),
            #[allow(clippy::cast_possible_truncation)]
            creation_time_ms: task["creation_time_ms"].as_f64().map(|ms| ms as i64),
        })
        .collect();
    let actors: Vec<SummaryActor> = input["actors"]
        .as_array()
        .context("actors")?
        .iter()
        .map(|actor| SummaryActor {
            actor_id: text(&actor["actor_id"]).unwrap_or_default(),
            repr_name: text(&actor["repr_name"]),
            class_name: text(&actor["class_name"]),
        })
        .collect();
    let func_name: Json = serde_json::from_str(&summary::by_func_name(&tasks))?;
    ensure!(func_name == read("func_name.json")?, "by func_name differs");
    let lineage: Json = serde_json::from_str(&summary::by_lineage(&tasks, &actors))?;
    ensure!(lineage == read("lineage.json")?, "by lineage differs");
    Ok(())
}

/// How deeply `text` nests arrays and objects (strings skipped).
fn nesting_depth(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0_usize, 0, false, false);
    for byte in text.bytes() {
        match (in_string, escaped, byte) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') | (false, _, b'"') => in_string = !in_string,
            (false, _, b'[' | b'{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (false, _, b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[tokio::test]
async fn a_lineage_as_deep_as_its_job_is_summarized_without_overflowing() -> anyhow::Result<()> {
    use synth::{Generator, SynthSettings};

    // One job whose every task is submitted by the one before: a chain ~30 000 levels deep,
    // past where serde_json's recursive drop (~10 000) and serialize (~20 000) overflow a
    // 2 MiB stack and abort the process.
    const ATTEMPTS: u64 = 30_000;
    const ACTOR_CREATIONS: u64 = 4;
    let served = serve_runs(&[], None).await?;
    let mut generator = Generator::new(SynthSettings {
        attempts: ATTEMPTS,
        jobs: 1,
        nodes: 2,
        workers_per_node: 4,
        failure_rate: 0.0,
        actor_share: 0.0,
        nested_share: 1.0,
        chained: true,
        duplicate_rate: 0.0,
        ..SynthSettings::default()
    });
    let bodies = generator
        .by_ref()
        .map(|body| body.map(|body| body.json))
        .collect::<Result<Vec<_>, _>>()?;
    ensure!(
        generator.truth().attempts == ATTEMPTS,
        "{:?}",
        generator.truth()
    );
    post_all(&format!("{}/v1/events/deep", served.server.url), &bodies).await?;
    served.queue.idle().await;

    let response = reqwest::get(format!(
        "{}/ray/deep/latest/api/v0/tasks/summarize?summary_by=lineage",
        served.server.url
    ))
    .await?;
    ensure!(response.status() == 200, "{}", response.status());
    let text = response.text().await?;
    let chain = ATTEMPTS - ACTOR_CREATIONS;
    for counted in [
        format!("\"total_tasks\":{chain},"),
        format!("\"total_actor_scheduled\":{ACTOR_CREATIONS},"),
        "\"summary_by\":\"lineage\"".to_owned(),
    ] {
        ensure!(
            text.contains(&counted),
            "no {counted} in {}",
            &text[text.len().saturating_sub(300)..]
        );
    }
    // Each level is an object and its `children` list.
    let depth = nesting_depth(&text);
    ensure!(
        depth as u64 >= 2 * chain,
        "nested {depth} deep for a chain of {chain}"
    );
    Ok(())
}
