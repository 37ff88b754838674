//! `afterglow generate`: synthetic Ray traffic, written as POST bodies or sent to an ingest URL.
//! Its traffic flags ([`SynthArgs`]) are `afterglow bench`'s too.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use synth::Generator;

use crate::progress;

/// The shape of synthetic traffic.
#[derive(Debug, Clone, clap::Args)]
pub struct SynthArgs {
    /// Task attempts to generate.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub tasks: u64,
    /// Jobs (drivers).
    #[arg(long, value_name = "J", default_value_t = 8)]
    pub jobs: u32,
    /// Nodes, each sending its own bodies.
    #[arg(long, value_name = "K", default_value_t = 16)]
    pub nodes: u32,
    /// Share of tasks whose first attempt fails (some are retried).
    #[arg(long, value_name = "RATE", default_value_t = 0.02)]
    pub failure_rate: f64,
    /// Share of bodies delivered twice.
    #[arg(long, value_name = "RATE", default_value_t = 0.005)]
    pub duplicate_rate: f64,
    /// Also emit TASK_PROFILE_EVENTs (Ray sends them only when asked to).
    #[arg(long)]
    pub profile: bool,
    /// Seed: the same flags and seed give the same bytes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl SynthArgs {
    /// The generator's settings.
    pub fn settings(&self) -> synth::SynthSettings {
        synth::SynthSettings {
            attempts: self.tasks,
            jobs: self.jobs,
            nodes: self.nodes,
            failure_rate: self.failure_rate,
            duplicate_rate: self.duplicate_rate,
            profile: self.profile,
            seed: self.seed,
            ..synth::SynthSettings::default()
        }
    }
}

/// Flags of `afterglow generate`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["out", "post"])))]
pub struct GenerateArgs {
    /// What to generate.
    #[command(flatten)]
    pub synth: SynthArgs,
    /// Write the bodies as files under this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// POST the bodies to this ingest URL, e.g. http://127.0.0.1:8700/v1/events/local.
    #[arg(long, value_name = "URL")]
    pub post: Option<String>,
}

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
