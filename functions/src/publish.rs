//! `afterglow publish`: the published tables' Apache Iceberg metadata made to reflect the store,
//! for engines that read Iceberg (PyIceberg, DuckDB, Spark, Trino, Ray Data), and with
//! `--glue-database` each table pointed at in the AWS Glue Data Catalog (what the deployed
//! catalog function does after every commit).

use anyhow::Context as _;
use shared::config::Config;
use shared::iceberg::{GlueCatalog, Pointed, Reads, metadata_location, publish};
use shared::tables::published::published_tables;

use crate::maintenance::StoreArgs;
use crate::setup::open_storage;

/// Flags of `afterglow publish`.
#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Also point each table of this Glue database at its new metadata (created at the first
    /// publish; the store must be the bucket). Its `AWS_*` configuration is the standard one.
    #[arg(long, value_name = "DATABASE", env = "AFTERGLOW_GLUE_DATABASE")]
    pub glue_database: Option<String>,
}

/// Runs `afterglow publish`: syncs every table and prints where each one's metadata is.
pub async fn run(args: PublishArgs, config: Config) -> anyhow::Result<()> {
    let storage = open_storage(&config, args.store.data_dir.clone()).await?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_millis();
    let now_ms = i64::try_from(now_ms).context("the clock is past the year 292 million")?;
    let catalog = match args.glue_database {
        Some(database) => Some(GlueCatalog::connect(database).await),
        None => None,
    };
    let outcomes = publish(
        &storage,
        catalog.as_ref(),
        &published_tables(),
        Reads::Every,
        now_ms,
    )
    .await
    .context("cannot publish the tables as Iceberg")?;
    let mut failed = Vec::new();
    for (table, outcome) in outcomes {
        let cataloged = match outcome {
            Ok(cataloged) => cataloged,
            Err(err) => {
                println!("{table}: not published: {err}");
                failed.push(table);
                continue;
            }
        };
        let published = &cataloged.published;
        let location = metadata_location(&*storage, table).await?;
        match published.version {
            Some(version) => println!(
                "{table}: version {version}, {} sessions ({} written, {} removed): {location}",
                published.sessions, published.changed, published.removed
            ),
            None => println!(
                "{table}: unchanged, {} sessions: {location}",
                published.sessions
            ),
        }
        if let (Some(pointed), Some(catalog)) = (cataloged.pointed, &catalog) {
            let database = catalog.database();
            match pointed {
                Pointed::Created => println!("  created as {database}.{table}"),
                Pointed::Moved { .. } => println!("  {database}.{table} points at it"),
                Pointed::Current { at } => {
                    println!("  {database}.{table} already points at version {at}")
                }
            }
        }
        for deferred in &published.deferred {
            println!("  not yet published: {deferred}");
        }
    }
    anyhow::ensure!(
        failed.is_empty(),
        "not published: {} (see above)",
        failed.join(", ")
    );
    Ok(())
}
