//! `ray list jobs` over the history.

use super::*;

/// `ray list jobs` names a driver's node only for jobs submitted through Ray's job API (a plain
/// `ray.init()` driver has none in Ray's list, though the export names its node): so do we.
#[tokio::test]
async fn ray_list_jobs_names_the_drivers_node_where_ray_does() -> anyhow::Result<()> {
    let runs = FixtureRun::all()?;
    let served = serve_runs(&runs, None).await?;
    let mut drivers = 0;
    for run in runs.iter().filter(|run| run.name != LOSSY_RUN) {
        let path = format!("/ray/{}/latest/api/v0/jobs?limit=100&detail=True", run.name);
        let (status, body) = served.get(&path).await?;
        ensure!(status == 200, "{path}: {body}");
        let ours = list_result(&body)?["result"]
            .as_array()
            .context("rows")?
            .clone();
        for ray in run
            .ground_truth("jobs.json")?
            .as_array()
            .context("jobs.json")?
        {
            let mine = ours
                .iter()
                .find(|job| job["job_id"] == ray["job_id"])
                .with_context(|| format!("{}: no job {}", run.name, ray["job_id"]))?;
            ensure!(
                mine["driver_node_id"] == ray["driver_node_id"],
                "{}: job {} driver_node_id ours {}, Ray's {}",
                run.name,
                ray["job_id"],
                mine["driver_node_id"],
                ray["driver_node_id"]
            );
            drivers += usize::from(ray["type"] == "DRIVER");
        }
    }
    ensure!(drivers > 0, "no run has a plain driver job");
    Ok(())
}
