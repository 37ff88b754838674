//! The Iceberg catalog: on unless turned off, and all of it behind that one switch; only the
//! catalog function may change the catalog's tables; its requests come from the compact
//! function through a FIFO queue; and an ad-hoc Athena query cannot scan without bound.

use anyhow::{Context as _, ensure};

use super::*;

/// Every resource of the Iceberg catalog.
const CATALOG_RESOURCES: [&str; 7] = [
    "IcebergCatalogDatabase",
    "CatalogSyncQueue",
    "CatalogSyncDeadLetterQueue",
    "CatalogFunction",
    "CatalogLogs",
    "CatalogDeadLetterAlarm",
    "AthenaWorkGroup",
];

/// A policy statement, seen through an `!If [CONDITION, STATEMENT, !Ref AWS::NoValue]`.
fn statement(value: &Value) -> &Value {
    if_branches(value).map_or(value, |(_, then, _)| then)
}

/// Every `Action` a statement names.
fn actions(statement: &Value) -> Vec<&str> {
    match statement.get("Action") {
        Some(Value::String(action)) => vec![action.as_str()],
        Some(Value::Sequence(actions)) => actions.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Every inline policy statement of `function`'s properties.
fn statements(function: &Value) -> Vec<&Value> {
    function
        .get("Policies")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .filter_map(|policy| policy.get("Statement")?.as_sequence())
        .flatten()
        .map(statement)
        .collect()
}

#[test]
fn the_iceberg_catalog_is_on_by_default_behind_one_switch() -> anyhow::Result<()> {
    let template = template()?;
    let switch = at(
        &template,
        &["Parameters", "EnableIcebergCatalog", "Default"],
    )?;
    ensure!(
        switch.as_str() == Some("true"),
        "EnableIcebergCatalog defaults to {switch:?}"
    );
    for id in CATALOG_RESOURCES {
        let condition = at(&template, &["Resources", id, "Condition"])?;
        ensure!(
            condition.as_str() == Some("IcebergCatalogOn"),
            "{id} is not behind EnableIcebergCatalog"
        );
    }
    Ok(())
}

#[test]
fn only_the_catalog_function_may_change_the_catalog() -> anyhow::Result<()> {
    let template = template()?;
    for (id, function) in resources(&template, "AWS::Serverless::Function")? {
        let properties = at(function, &["Properties"])?;
        let changes = statements(properties).into_iter().any(|statement| {
            actions(statement)
                .iter()
                .any(|action| *action == "glue:UpdateTable" || *action == "glue:*")
        });
        ensure!(
            changes == (id == "CatalogFunction"),
            "{id} {} glue:UpdateTable",
            if changes { "may" } else { "may not" }
        );
    }
    let catalog = at(&template, &["Resources", "CatalogFunction", "Properties"])?;
    for statement in statements(catalog) {
        let text = format!("{statement:?}");
        ensure!(
            !text.contains("\"*\"")
                && !actions(statement)
                    .iter()
                    .any(|action| action.ends_with(":*")),
            "the catalog function's statement is not least-privilege: {text}"
        );
    }
    Ok(())
}

#[test]
fn sync_requests_reach_the_catalog_function_in_order_per_table() -> anyhow::Result<()> {
    let template = template()?;
    let queue = at(&template, &["Resources", "CatalogSyncQueue", "Properties"])?;
    ensure!(
        at(queue, &["FifoQueue"])?.as_bool() == Some(true),
        "the sync queue is not FIFO: a table's syncs could run side by side"
    );
    let catalog = at(&template, &["Resources", "CatalogFunction", "Properties"])?;
    let source = at(catalog, &["Events", "SyncRequests", "Properties"])?;
    ensure!(
        ref_or_getatt(at(source, &["Queue"])?) == Some("CatalogSyncQueue"),
        "the catalog function does not read the sync queue"
    );
    let responses = format!("{:?}", at(source, &["FunctionResponseTypes"])?);
    ensure!(
        responses.contains("ReportBatchItemFailures"),
        "one table's failure would redeliver every table's requests"
    );
    let compact = at(&template, &["Resources", "CompactFunction", "Properties"])?;
    let sent_to = variable(compact, "AFTERGLOW_CATALOG_QUEUE_URL")
        .context("the compact function sends no sync requests")?;
    let (condition, then, _) =
        if_branches(sent_to).context("the sync queue is not behind the switch")?;
    ensure!(
        condition == "IcebergCatalogOn" && ref_name(then) == Some("CatalogSyncQueue"),
        "the compact function sends its requests to {sent_to:?}"
    );
    let may_send = statements(compact).into_iter().any(|statement| {
        actions(statement).contains(&"sqs:SendMessage")
            && statement
                .get("Resource")
                .and_then(ref_or_getatt)
                .is_some_and(|queue| queue == "CatalogSyncQueue")
    });
    ensure!(may_send, "the compact role may not send to the sync queue");
    Ok(())
}

#[test]
fn an_athena_query_scans_a_bounded_number_of_bytes() -> anyhow::Result<()> {
    let template = template()?;
    let workgroup = at(
        &template,
        &[
            "Resources",
            "AthenaWorkGroup",
            "Properties",
            "WorkGroupConfiguration",
        ],
    )?;
    let cutoff = at(workgroup, &["BytesScannedCutoffPerQuery"])?;
    ensure!(
        ref_name(cutoff) == Some("AthenaBytesScannedCutoff"),
        "the cutoff is not the parameter"
    );
    let bytes = number(&template, cutoff)?;
    ensure!(
        (10_000_000..=100 << 30).contains(&bytes),
        "a default cutoff of {bytes} bytes"
    );
    ensure!(
        at(workgroup, &["EnforceWorkGroupConfiguration"])?.as_bool() == Some(true),
        "a client may override the cutoff"
    );
    Ok(())
}
