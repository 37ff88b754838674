//! The ingest secret read from Secrets Manager at run time (moto's server on 127.0.0.1 stands in
//! for it): a rotation reaches a running process without a restart, URLs of the previous
//! version keep working until the rotation after, and an unreachable Secrets Manager does not
//! lock every cluster out.

use std::time::Duration;

use afterglow_tests::cluster_token;
use afterglow_tests::moto::Moto;
use anyhow::ensure;
use shared::auth::ingest::{IngestKeys, RefreshPolicy};
use shared::keys::ClusterName;

const V1: &str = "first-secret-0123456789";
const V2: &str = "second-secret-0123456789";
const V3: &str = "third-secret-0123456789";

/// Checks a cluster's tokens the way ingest does.
async fn admits(keys: &IngestKeys, cluster: &str, token: &str) -> anyhow::Result<bool> {
    Ok(keys.admits(&ClusterName::new(cluster)?, token).await)
}

/// Reads again on a token matching neither version, every time.
const EAGER: RefreshPolicy = RefreshPolicy {
    max_age: Duration::from_secs(3600),
    min_interval: Duration::ZERO,
};

#[tokio::test]
async fn a_rotation_is_picked_up_and_the_previous_version_still_admits() -> anyhow::Result<()> {
    let Some(moto) = Moto::start("a rotation test").await? else {
        return Ok(());
    };
    let arn = moto.create_secret("afterglow/ingest", V1).await?;
    let keys = IngestKeys::from_secrets_manager(moto.client(), arn.clone(), EAGER).await?;
    ensure!(admits(&keys, "a", &cluster_token(V1, "a")).await?);
    ensure!(!admits(&keys, "a", &cluster_token(V1, "b")).await?);
    ensure!(
        !admits(&keys, "a", V1).await?,
        "the secret itself is no token"
    );

    moto.put_secret_value(&arn, V2).await?;
    // The new URL works at once (the mismatch reads the secret again); the old one still does.
    ensure!(admits(&keys, "a", &cluster_token(V2, "a")).await?);
    ensure!(admits(&keys, "a", &cluster_token(V1, "a")).await?);
    let cluster = ClusterName::new("a")?;
    ensure!(keys.token_for(&cluster).await == cluster_token(V2, "a"));

    moto.put_secret_value(&arn, V3).await?;
    ensure!(admits(&keys, "a", &cluster_token(V3, "a")).await?);
    ensure!(admits(&keys, "a", &cluster_token(V2, "a")).await?);
    ensure!(
        !admits(&keys, "a", &cluster_token(V1, "a")).await?,
        "two rotations later the first version must be refused"
    );
    Ok(())
}

#[tokio::test]
async fn wrong_tokens_read_the_secret_at_most_once_per_interval() -> anyhow::Result<()> {
    let Some(moto) = Moto::start("a refresh interval test").await? else {
        return Ok(());
    };
    let arn = moto.create_secret("afterglow/interval", V1).await?;
    let keys =
        IngestKeys::from_secrets_manager(moto.client(), arn.clone(), RefreshPolicy::default())
            .await?;
    moto.put_secret_value(&arn, V2).await?;
    // Read less than 30 s ago: a token of the new version is not looked up yet, so a flood of
    // wrong tokens cannot become a flood of Secrets Manager calls.
    ensure!(!admits(&keys, "a", &cluster_token(V2, "a")).await?);
    ensure!(admits(&keys, "a", &cluster_token(V1, "a")).await?);
    Ok(())
}

#[tokio::test]
async fn an_unreachable_secrets_manager_keeps_the_version_read_earlier() -> anyhow::Result<()> {
    let Some(mut moto) = Moto::start("an outage test").await? else {
        return Ok(());
    };
    let arn = moto.create_secret("afterglow/outage", V1).await?;
    // Every check reads the secret again, so each one below meets the outage.
    let always = RefreshPolicy {
        max_age: Duration::ZERO,
        min_interval: Duration::ZERO,
    };
    let keys = IngestKeys::from_secrets_manager(moto.client(), arn, always).await?;
    moto.stop();
    ensure!(admits(&keys, "a", &cluster_token(V1, "a")).await?);
    ensure!(!admits(&keys, "a", &cluster_token(V2, "a")).await?);
    Ok(())
}

#[tokio::test]
async fn a_missing_secret_fails_at_start_naming_it() -> anyhow::Result<()> {
    let Some(moto) = Moto::start("a missing secret test").await? else {
        return Ok(());
    };
    let err = IngestKeys::from_secrets_manager(
        moto.client(),
        "afterglow/never-created".to_owned(),
        RefreshPolicy::default(),
    )
    .await
    .err()
    .map(|err| err.to_string())
    .unwrap_or_default();
    ensure!(
        err.contains("afterglow/never-created") && err.contains("AWSCURRENT"),
        "{err}"
    );
    Ok(())
}
