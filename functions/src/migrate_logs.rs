//! `afterglow migrate-logs`: task logs stored in the older layout, an object per shipped piece,
//! moved into the segments and index that reads use (`shared::logs::migrate`).

use anyhow::Context as _;
use shared::config::Config;
use shared::logs::migrate::{Moved, find_older_pieces, move_all};

use crate::maintenance::StoreArgs;
use crate::progress;
use crate::setup::open_storage;

/// Nodes moved at once.
const NODES_AT_ONCE: usize = 4;

/// Flags of `afterglow migrate-logs`.
#[derive(Debug, clap::Args)]
pub struct MigrateLogsArgs {
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Runs `afterglow migrate-logs`: lists the older pieces once, moves each node's, and prints
/// what it moved. Fails, naming them, when pieces were kept or nodes could not be moved: run it
/// again once the cause is fixed (what was moved is not moved twice).
pub async fn run(args: MigrateLogsArgs, config: Config) -> anyhow::Result<()> {
    let storage = open_storage(&config, args.store.data_dir.clone()).await?;
    let nodes = find_older_pieces(&*storage)
        .await
        .context("cannot list the stored logs")?;
    if nodes.is_empty() {
        println!("no logs are stored in the older layout: nothing to move");
        return Ok(());
    }
    let bar = progress::bar(nodes.len() as u64, "migrate-logs");
    let outcomes = move_all(&*storage, nodes, NODES_AT_ONCE, |_, _| bar.inc(1)).await;
    bar.finish_and_clear();
    let mut total = Moved::default();
    let mut failed = 0;
    for (node, outcome) in outcomes {
        match outcome {
            Ok(moved) => total.add(moved),
            Err(err) => {
                eprintln!("{}: not moved: {err}", node.prefix());
                failed += 1;
            }
        }
    }
    println!(
        "moved {} pieces ({} bytes) into segments and indexes",
        total.pieces, total.bytes
    );
    for (key, reason) in &total.kept {
        eprintln!("{key}: kept: {reason}");
    }
    if failed > 0 || !total.kept.is_empty() {
        anyhow::bail!(
            "{failed} nodes not moved and {} pieces kept (named above); run migrate-logs again once their cause is fixed",
            total.kept.len()
        );
    }
    Ok(())
}
