//! With the Iceberg catalog on, the compact function keeps the files a fold replaced until no
//! kept Iceberg snapshot names them (snapshots are kept `SNAPSHOT_RETENTION_MS`, and the one
//! that drops them is committed at most an hourly sweep later) and a query that started on one
//! of those snapshots has finished; without it, only as long as our own queries need.

use afterglow::lambda::compact_settings;
use anyhow::ensure;
use shared::compact::CompactSettings;
use shared::config::Config;
use shared::iceberg::SNAPSHOT_RETENTION_MS;

fn config(variables: &[(&str, &str)]) -> anyhow::Result<Config> {
    Ok(Config::from_lookup(|name| {
        variables
            .iter()
            .find(|(variable, _)| *variable == name)
            .map(|(_, value)| (*value).to_owned())
    })?)
}

#[test]
fn with_the_catalog_on_retired_files_outlive_every_snapshot_that_names_them() -> anyhow::Result<()>
{
    const HOUR_MS: u128 = 60 * 60 * 1000;
    let bucket = ("AFTERGLOW_BUCKET", "history");
    let queue = (
        "AFTERGLOW_CATALOG_QUEUE_URL",
        "https://sqs.us-east-1.amazonaws.com/123456789012/afterglow-catalog.fifo",
    );
    let published = compact_settings(&config(&[bucket, queue])?);
    let kept = SNAPSHOT_RETENTION_MS.unsigned_abs() as u128;
    ensure!(
        published.retire_grace.as_millis() >= kept + 2 * HOUR_MS,
        "retired files go after {:?}, while snapshots naming them are kept {kept} ms, one \
         sweep later, and read by queries up to an hour",
        published.retire_grace
    );
    let unpublished = compact_settings(&config(&[bucket])?);
    ensure!(
        unpublished.retire_grace == CompactSettings::default().retire_grace,
        "without the catalog, retired files are kept {:?}",
        unpublished.retire_grace
    );
    Ok(())
}
