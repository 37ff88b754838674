//! `afterglow publish`: the published tables' Apache Iceberg metadata made to reflect the store,
//! for engines that read Iceberg (PyIceberg, DuckDB, Spark, Trino, Ray Data).

use anyhow::Context as _;
use shared::config::Config;

use crate::maintenance::StoreArgs;
use crate::setup::open_storage;

/// Flags of `afterglow publish`.
#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Runs `afterglow publish`: syncs every table and prints where each one's metadata is.
pub async fn run(args: PublishArgs, config: Config) -> anyhow::Result<()> {
    let storage = open_storage(&config, args.store.data_dir.clone()).await?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_millis();
    let now_ms = i64::try_from(now_ms).context("the clock is past the year 292 million")?;
    let published = shared::iceberg::sync_tables(&storage, now_ms)
        .await
        .context("cannot publish the tables as Iceberg")?;
    for table in published {
        let location = shared::iceberg::metadata_location(&*storage, table.table).await?;
        match table.version {
            Some(version) => println!(
                "{}: version {version}, {} sessions ({} written, {} removed): {location}",
                table.table, table.sessions, table.changed, table.removed
            ),
            None => println!(
                "{}: unchanged, {} sessions: {location}",
                table.table, table.sessions
            ),
        }
        for deferred in &table.deferred {
            println!("  not yet published: {deferred}");
        }
    }
    Ok(())
}
