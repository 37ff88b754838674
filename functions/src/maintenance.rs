//! `afterglow compact` and `afterglow rebuild`: compaction from the command line.

use anyhow::Context as _;
use shared::compact::{CompactReport, Compactor};
use shared::config::Config;
use shared::storage::ObjectKey;

use crate::cli::{CompactArgs, RebuildArgs, StoreArgs};
use crate::setup::{compactor_with_scratch, open_storage};

async fn compactor(
    store: &StoreArgs,
    config: &Config,
) -> anyhow::Result<(Compactor, tempfile::TempDir)> {
    let storage = open_storage(config, store.data_dir.clone()).await?;
    compactor_with_scratch(storage, config)
}

fn print(report: &CompactReport) {
    println!(
        "compacted {} raw objects: {} events ({} duplicates dropped, {} quarantined) in {} sessions; {} rows written",
        report.raw_objects,
        report.events,
        report.duplicates,
        report.quarantined,
        report.sessions,
        report.rows_written
    );
}

/// Compacts the given raw keys, or every raw object.
pub async fn compact(args: CompactArgs, config: Config) -> anyhow::Result<()> {
    let (compactor, _scratch) = compactor(&args.store, &config).await?;
    if args.fold {
        let folded = compactor.fold().await?;
        println!("folded the deltas of {folded} sessions into their base");
        return Ok(());
    }
    let keys = if args.keys.is_empty() {
        compactor.raw_keys().await?
    } else {
        args.keys
            .iter()
            .map(|key| ObjectKey::new(key.clone()))
            .collect::<Result<_, _>>()?
    };
    print(&compactor.compact(&keys).await?);
    Ok(())
}

/// Deletes every table and compacts every raw object again; first checks that the raw objects
/// still hold everything the tables do (`--force` skips the check).
pub async fn rebuild(args: RebuildArgs, config: Config) -> anyhow::Result<()> {
    let (compactor, _scratch) = compactor(&args.store, &config).await?;
    if !args.force {
        compactor
            .ensure_rebuildable()
            .await
            .context("refusing to rebuild (--force rebuilds anyway)")?;
    }
    let deleted = compactor.drop_tables().await?;
    println!("deleted {deleted} table objects");
    let keys = compactor.raw_keys().await?;
    print(&compactor.compact(&keys).await?);
    Ok(())
}
