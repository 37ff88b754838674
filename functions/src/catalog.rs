//! The catalog-sync function on Lambda: the compact function's sync requests (SQS FIFO, one
//! message group per table) and a scheduled sweep onto the library's publishing
//! (`shared::iceberg::publish`). A request names one table; a sweep (any event that is not an
//! SQS batch) publishes every table. Reports SQS partial batch failures: the requests of a
//! table that could not be published are delivered again, and the other tables' are not.

use std::collections::BTreeMap;
use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent};
use shared::iceberg::{GlueCatalog, Reads, SyncRequest, publish};
use shared::storage::Storage;
use shared::tables::published::{PublishedTable, published_tables};
use tracing::Instrument as _;

use crate::redelivery::failure;

/// What the catalog-sync function holds between invocations.
#[derive(Debug)]
pub struct CatalogFunction {
    /// The store the tables are in.
    pub storage: Arc<dyn Storage>,
    /// The Glue database the tables are pointed at.
    pub catalog: GlueCatalog,
}

/// Milliseconds since the epoch.
fn now_ms() -> Result<i64, Error> {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    Ok(i64::try_from(since.as_millis())?)
}

/// Handles one invocation: an SQS batch of sync requests, or a sweep.
pub async fn handle(
    function: &CatalogFunction,
    event: LambdaEvent<serde_json::Value>,
) -> Result<serde_json::Value, Error> {
    let span = tracing::info_span!("invocation", request_id = %event.context.request_id, function = "catalog");
    async move {
        let payload = event.payload;
        let from_sqs = payload
            .pointer("/Records/0/eventSource")
            .and_then(serde_json::Value::as_str)
            == Some("aws:sqs");
        let every = published_tables();
        if !from_sqs {
            let outcomes = publish(
                &function.storage,
                Some(&function.catalog),
                &every,
                // The sweep reads every manifest: it makes up what a lagging catalog hid.
                Reads::Every,
                now_ms()?,
            )
            .await?;
            let failed: Vec<String> = outcomes
                .into_iter()
                .filter_map(|(table, outcome)| outcome.err().map(|err| format!("{table}: {err}")))
                .collect();
            if !failed.is_empty() {
                return Err(format!("tables not published: {}", failed.join("; ")).into());
            }
            return Ok(serde_json::Value::Null);
        }
        let sqs: SqsEvent = serde_json::from_value(payload)?;
        let mut failures = Vec::new();
        // Each table's messages: all of them are answered by one publish of it.
        let mut requested: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
        for message in &sqs.records {
            let id = message.message_id.clone().unwrap_or_default();
            let body = message.body.as_deref().unwrap_or_default();
            let table = SyncRequest::from_message(body).and_then(|request| {
                every
                    .iter()
                    .find(|table| table.name == request.table)
                    .map(|table| table.name)
                    .ok_or_else(|| format!("no published table is named {:?}", request.table))
            });
            match table {
                Ok(table) => requested.entry(table).or_default().push(id),
                Err(reason) => {
                    // Retrying cannot fix it: after maxReceiveCount it lands in the DLQ.
                    tracing::error!(message_id = %id, %reason, "unreadable message");
                    failures.push(failure(&id));
                }
            }
        }
        let tables: Vec<PublishedTable> = every
            .into_iter()
            .filter(|table| requested.contains_key(table.name))
            .collect();
        let outcomes = publish(
            &function.storage,
            Some(&function.catalog),
            &tables,
            Reads::Changed,
            now_ms()?,
        )
        .await?;
        for (table, outcome) in outcomes {
            if outcome.is_err() {
                let ids = requested.get(table).map_or(&[][..], Vec::as_slice);
                failures.extend(ids.iter().map(|id| failure(id)));
            }
        }
        let mut response = SqsBatchResponse::default();
        response.batch_item_failures = failures;
        Ok(serde_json::to_value(response)?)
    }
    .instrument(span)
    .await
}
