//! `afterglow generate`: synthetic Ray traffic, written as POST bodies or sent to an ingest URL.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use synth::Generator;

use crate::cli::GenerateArgs;
use crate::progress;

/// Generates the bodies and delivers them where the flags say.
pub async fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let settings = args.synth.settings();
    let expected = settings.attempts;
    let mut generator = Generator::new(settings);
    let bar = progress::bar(expected, "generate");
    let client = reqwest::Client::new();
    for (sent, body) in (0u64..).zip(generator.by_ref()) {
        let body = body?;
        match (&args.out, &args.post) {
            (Some(dir), _) => write_body(dir, sent, &body.json)?,
            (None, Some(url)) => post(&client, url, body.json).await?,
            (None, None) => anyhow::bail!("give --out DIR or --post URL"),
        }
        bar.inc((body.events as u64 / 4).min(expected.saturating_sub(bar.position())));
    }
    bar.finish_and_clear();
    let truth = generator.truth();
    if let Some(dir) = &args.out {
        let path = dir.join("truth.json");
        std::fs::write(&path, serde_json::to_vec_pretty(truth)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    eprintln!(
        "generated {} attempts as {} events in {} bodies ({} re-sent) for {}",
        truth.attempts, truth.events, truth.bodies, truth.redeliveries, truth.session_name
    );
    Ok(())
}

fn write_body(dir: &Path, index: u64, json: &[u8]) -> anyhow::Result<()> {
    let bodies = dir.join("bodies");
    std::fs::create_dir_all(&bodies)
        .with_context(|| format!("cannot create {}", bodies.display()))?;
    let path = bodies.join(format!("{:07}.json", index + 1));
    let mut file = std::fs::File::create(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(json)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// POSTs one body the way Ray's publisher does: retry on any failure until it is accepted.
async fn post(client: &reqwest::Client, url: &str, json: Vec<u8>) -> anyhow::Result<()> {
    let mut delay = std::time::Duration::from_millis(100);
    for _ in 0..20 {
        let sent = client
            .post(url)
            .header("content-type", "application/json")
            .body(json.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => return Ok(()),
            Ok(response) if response.status().is_client_error() => {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                anyhow::bail!("{url} refused a body: {status} {text}");
            }
            _ => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(5));
            }
        }
    }
    anyhow::bail!("{url} did not accept a body after 20 tries")
}
