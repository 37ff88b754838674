//! What the shipper stores for Ray's dashboard beside a node's logs, answered by Ray's routes as
//! the live dashboard answered: the cluster events of `logs/events/` on the overview, and the
//! head's cluster metadata on the Cluster page. The files and answers are one live Ray 2.60
//! cluster's (`fixtures/ray-2.60/events`), shipped here from the head node of a captured run.

use anyhow::{Context as _, ensure};
use shared::keys::{LogFile, SessionName};
use shared::logs::metadata::{CLUSTER_METADATA_FILE, metadata_body};

use super::{log_file, put, serving};

/// The captured cluster's files and answers.
fn captured(path: &str) -> anyhow::Result<Vec<u8>> {
    let path = afterglow_tests::fixtures_dir().join("events").join(path);
    std::fs::read(&path).with_context(|| path.display().to_string())
}

/// `serve` with a captured run posted as cluster `logs`: its session and head node.
async fn head_of_a_session() -> anyhow::Result<(afterglow_tests::Served, String, String)> {
    let run = afterglow_tests::FixtureRun::named("basic-workload")?;
    let served = serving(&afterglow_tests::bodies(&run)?).await?;
    let clusters = served.ok("/api/clusters?cluster=logs").await?;
    let session = clusters["clusters"][0]["sessions"][0]["session_name"]
        .as_str()
        .context("a session")?
        .to_owned();
    let nodes = served
        .ok(&format!("/ray/logs/{session}/api/v0/nodes"))
        .await?;
    let head = nodes["data"]["result"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|node| node["is_head_node"] == true)
        .and_then(|node| node["node_id"].as_str())
        .context("a head node")?
        .to_owned();
    Ok((served, session, head))
}

#[tokio::test]
async fn the_overview_lists_the_events_the_nodes_shipped_as_ray_did() -> anyhow::Result<()> {
    let (served, session, head) = head_of_a_session().await?;
    let events = format!("/ray/logs/{session}/events");
    ensure!(
        served.ok(&events).await?
            == serde_json::json!({"result": true, "msg": "All events fetched.",
                "data": {"events": {}}}),
        "no event shipped: none answered, as a live Ray without events answers"
    );
    let shipped = |name: &str| -> anyhow::Result<LogFile> {
        Ok(LogFile {
            session: SessionName::new(&session)?,
            node_id: shared::keys::NodeId::new(&head)?,
            ..log_file(name)?
        })
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/ray-2.60/events/logs/events");
    for entry in std::fs::read_dir(&dir)? {
        let entry = entry?;
        let bytes = std::fs::read(entry.path())?;
        // The shipper sends nothing of an empty file.
        if !bytes.is_empty() {
            let name = entry.file_name().to_string_lossy().into_owned();
            put(&*served.storage, &shipped(&name)?, 0, &bytes).await?;
        }
    }
    // A log file's JSON lines are not events.
    let line = br#"{"event_id":"x","message":"not an event","custom_fields":{}}"#;
    put(&*served.storage, &shipped("raylet.out")?, 0, line).await?;

    let rays: serde_json::Value = serde_json::from_slice(&captured("events.json")?)?;
    let ours = served.ok(&events).await?;
    ensure!(ours == rays, "ours {ours}\nRay's {rays}");
    let rays: serde_json::Value = serde_json::from_slice(&captured("events_job.json")?)?;
    let ours = served.ok(&format!("{events}?job_id=01000000")).await?;
    ensure!(ours == rays, "ours {ours}\nRay's {rays}");
    Ok(())
}

#[tokio::test]
async fn the_cluster_page_shows_the_versions_the_head_recorded() -> anyhow::Result<()> {
    let (served, session, head) = head_of_a_session().await?;
    let metadata = format!("/ray/logs/{session}/api/v0/cluster_metadata");
    let unknown = served.ok(&metadata).await?;
    ensure!(
        unknown["data"]["pythonVersion"] == "",
        "nothing recorded: no Python version, {unknown}"
    );
    // Stored as the shipper stores it, through the log route.
    let rays = captured("cluster_metadata.json")?;
    let response = reqwest::Client::new()
        .post(format!(
            "{}/v1/logs/logs?session={session}&node_id={head}",
            served.server.url
        ))
        .body(metadata_body(&rays)?)
        .send()
        .await?;
    ensure!(response.status().is_success(), "{}", response.text().await?);

    let rays: serde_json::Value = serde_json::from_slice(&rays)?;
    let ours = served.ok(&metadata).await?;
    ensure!(ours == rays, "ours {ours}\nRay's {rays}");
    let listed = served
        .ok(&format!("/ray/logs/{session}/api/v0/logs?node_id={head}"))
        .await?;
    ensure!(
        !listed.to_string().contains(CLUSTER_METADATA_FILE),
        "Ray's node lists no such file: {listed}"
    );
    Ok(())
}
