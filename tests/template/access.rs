//! Who may read and what outlives the stack: the history bucket, the query authorizer and the
//! ingest secret.

use anyhow::{Context as _, bail, ensure};
use serde_yaml_ng::Value;

use super::*;

/// The history outlives its stack and survives a bad write: deleting the stack keeps the
/// bucket, and an overwritten or deleted object stays recoverable for a while.
#[test]
fn the_history_bucket_survives_the_stack_and_bad_writes() -> anyhow::Result<()> {
    let template = template()?;
    let bucket = at(&template, &["Resources", "HistoryBucket"])?;
    for policy in ["DeletionPolicy", "UpdateReplacePolicy"] {
        ensure!(
            bucket.get(policy).and_then(Value::as_str) == Some("Retain"),
            "the bucket's {policy} is not Retain"
        );
    }
    ensure!(
        at(bucket, &["Properties", "VersioningConfiguration", "Status"])?.as_str()
            == Some("Enabled"),
        "the bucket is not versioned"
    );
    let rules = at(bucket, &["Properties", "LifecycleConfiguration", "Rules"])?
        .as_sequence()
        .context("lifecycle rules are not a list")?;
    ensure!(
        rules
            .iter()
            .any(|rule| rule.get("NoncurrentVersionExpiration").is_some()),
        "old versions are never expired"
    );
    // Table files are removed by compaction, a session at a time; an age rule would delete
    // them by write time under a live manifest.
    for rule in rules {
        let text = serde_yaml_ng::to_string(rule)?;
        ensure!(
            !text.contains("tables/") && !text.contains("TablesRetentionDays"),
            "a lifecycle rule expires table files under live manifests: {text}"
        );
    }
    let compact_env = at(
        &template,
        &[
            "Resources",
            "CompactFunction",
            "Properties",
            "Environment",
            "Variables",
        ],
    )?;
    ensure!(
        ref_name(at(compact_env, &["AFTERGLOW_TABLES_RETENTION_DAYS"])?)
            == Some("TablesRetentionDays"),
        "compaction is not told the table retention"
    );
    Ok(())
}

/// A query route added without the authorizer would open the whole history to the world; Ray's
/// routes under `/ray/` carry the same data as `/api/`.
#[test]
fn every_query_route_is_behind_the_query_authorizer() -> anyhow::Result<()> {
    let template = template()?;
    let routes = resources(&template, "AWS::ApiGatewayV2::Route")?;
    let keys: Vec<&str> = routes
        .iter()
        .filter_map(|(_, route)| route.get("Properties")?.get("RouteKey")?.as_str())
        .collect();
    for wanted in [
        "GET /api/{proxy+}",
        "ANY /ray/{proxy+}",
        "GET /",
        "GET /assets/{proxy+}",
    ] {
        ensure!(keys.contains(&wanted), "no route {wanted}: {keys:?}");
    }
    for (id, route) in routes {
        let authorization = at(route, &["Properties", "AuthorizationType"])?;
        let Value::Tagged(tagged) = authorization else {
            bail!(
                "{id}: AuthorizationType is {authorization:?}, not !If [BearerQueries, NONE, AWS_IAM]"
            );
        };
        let choices: Vec<&str> = tagged
            .value
            .as_sequence()
            .map(|items| items.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        ensure!(
            tagged.tag == "If" && choices == ["BearerQueries", "NONE", "AWS_IAM"],
            "{id}: AuthorizationType {authorization:?}"
        );
    }
    Ok(())
}

/// The ingest secret is read at run time, never resolved into the function's configuration
/// (where a rotation would need a redeploy and anyone allowed `lambda:GetFunction` could read
/// it), and the stack creates one when none is given, kept when the stack goes.
#[test]
fn the_ingest_secret_is_read_at_run_time_and_outlives_the_stack() -> anyhow::Result<()> {
    let template = template()?;
    let variables = at(
        &template,
        &[
            "Resources",
            "IngestFunction",
            "Properties",
            "Environment",
            "Variables",
        ],
    )?;
    let Some(variables) = variables.as_mapping() else {
        bail!("the ingest function's variables are not a mapping");
    };
    let names: Vec<&str> = variables.keys().filter_map(Value::as_str).collect();
    ensure!(
        names
            == [
                "AFTERGLOW_INGEST_SECRET_ARN",
                "AWS_LAMBDA_HTTP_IGNORE_STAGE_IN_PATH"
            ],
        "the ingest function gets {names:?}, not only the secret's ARN and lambda_http's setting"
    );
    let text = serde_yaml_ng::to_string(&template)?;
    ensure!(
        !text.contains("resolve:secretsmanager"),
        "a secret is resolved at deploy time"
    );
    for (name, parameter) in at(&template, &["Parameters"])?
        .as_mapping()
        .context("Parameters")?
    {
        let name = name.as_str().unwrap_or_default();
        ensure!(
            !(name.starts_with("Ingest") && parameter.get("NoEcho").is_some()),
            "parameter {name} takes the ingest secret itself"
        );
    }
    let secret = at(&template, &["Resources", "IngestSecret"])?;
    ensure!(secret.get("DeletionPolicy").and_then(Value::as_str) == Some("Retain"));
    ensure!(secret.get("UpdateReplacePolicy").and_then(Value::as_str) == Some("Retain"));

    let ingest = at(&template, &["Resources", "IngestFunction", "Properties"])?;
    let readable = allowed(ingest, "secretsmanager:GetSecretValue")?
        .any(|resource| Some(resource) == variables.get("AFTERGLOW_INGEST_SECRET_ARN"));
    ensure!(
        readable,
        "the ingest role cannot read the secret its variable names"
    );
    Ok(())
}
