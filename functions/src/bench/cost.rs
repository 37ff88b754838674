//! The AWS cost of a million task attempts, computed from what the benchmark measured
//! (requests, bytes, CPU time) and public prices. Every assumption is printed with the result.

use serde::Serialize;

use super::report::{CompactionReport, IngestReport, QueryReport, StorageReport};

/// Public on-demand prices, us-east-1, x86_64 (USD).
mod price {
    pub(super) const LAMBDA_GB_SECOND: f64 = 0.000_016_666_7;
    pub(super) const LAMBDA_REQUEST: f64 = 0.20 / 1e6;
    pub(super) const HTTP_API_REQUEST: f64 = 1.00 / 1e6;
    pub(super) const S3_PUT: f64 = 0.005 / 1000.0;
    pub(super) const S3_GET: f64 = 0.0004 / 1000.0;
    pub(super) const S3_GB_MONTH: f64 = 0.023;
    pub(super) const SQS_REQUEST: f64 = 0.40 / 1e6;
}

/// The template's function memory sizes (MB) and Lambda's CPU share per MB.
const INGEST_MB: f64 = 256.0;
const COMPACT_MB: f64 = 3008.0;
const QUERY_MB: f64 = 2048.0;
const MB_PER_VCPU: f64 = 1769.0;
/// Time an ingest call waits on its S3 PUT (not measured here: local disk stands in for S3).
const S3_PUT_MS: f64 = 30.0;
/// Days raw objects are kept (the template's `RawRetentionDays` default).
const RAW_RETENTION_DAYS: f64 = 30.0;
/// SQS requests per raw object: the notification, and a share of batched receives and deletes.
const SQS_REQUESTS_PER_OBJECT: f64 = 1.2;

/// Seconds of Lambda time for `cpu_seconds` of work at `memory_mb` (CPU share grows with
/// memory; a function never gets more than the work can use).
fn lambda_seconds(cpu_seconds: f64, memory_mb: f64, threads: f64) -> f64 {
    cpu_seconds / (memory_mb / MB_PER_VCPU).min(threads)
}

/// What ingest costs per million attempts.
#[derive(Debug, Serialize)]
pub(super) struct IngestCost {
    /// POSTs through API Gateway, each one Lambda invocation.
    pub(super) requests: f64,
    /// Raw objects PUT.
    pub(super) s3_puts: f64,
    /// Lambda compute.
    pub(super) gb_seconds: f64,
    /// Billed duration of one request.
    pub(super) billed_ms_per_request: f64,
    /// All of it, in dollars.
    pub(super) usd: f64,
}

/// What compaction costs per million attempts.
#[derive(Debug, Serialize)]
pub(super) struct CompactCost {
    /// Lambda invocations, one per run.
    pub(super) invocations: f64,
    /// Lambda compute.
    pub(super) gb_seconds: f64,
    /// Table files and manifests PUT.
    pub(super) s3_puts: f64,
    /// GETs and LISTs.
    pub(super) s3_gets_and_lists: f64,
    /// SQS requests: notifications, receives, deletes.
    pub(super) sqs_requests: f64,
    /// All of it, in dollars.
    pub(super) usd: f64,
}

/// What keeping a million attempts costs.
#[derive(Debug, Serialize)]
pub(super) struct StorageCost {
    /// The tables (kept).
    pub(super) tables_gb: f64,
    /// The raw objects (expired after [`RAW_RETENTION_DAYS`]).
    pub(super) raw_gb: f64,
    /// The tables, per month.
    pub(super) usd_per_month_tables: f64,
    /// The raw objects, until they expire.
    pub(super) usd_raw_until_expiry: f64,
}

/// The function sizes the model assumes (MB).
#[derive(Debug, Serialize)]
pub(super) struct MemorySizes {
    /// The ingest function's.
    pub(super) ingest: f64,
    /// The compact function's.
    pub(super) compact: f64,
    /// The query function's.
    pub(super) query: f64,
}

/// What the model assumes, printed with its result.
#[derive(Debug, Serialize)]
pub(super) struct Assumptions {
    /// The prices used.
    pub(super) prices: &'static str,
    /// How CPU time becomes Lambda time.
    pub(super) lambda_cpu: &'static str,
    /// The functions' memory sizes.
    pub(super) memory_mb: MemorySizes,
    /// Time an ingest call waits on its S3 PUT.
    pub(super) s3_put_wait_ms_per_ingest: f64,
    /// Days raw objects are kept.
    pub(super) raw_retention_days: f64,
    /// Where the query function reads table files from.
    pub(super) query_files: &'static str,
}

/// Dollars and quantities per million attempts.
#[derive(Debug, Serialize)]
pub(super) struct Cost {
    /// Ingesting them.
    pub(super) ingest: IngestCost,
    /// Compacting them.
    pub(super) compact: CompactCost,
    /// Keeping them.
    pub(super) storage: StorageCost,
    /// Ingest and compaction together, paid once.
    pub(super) usd_once: f64,
    /// A thousand dashboard requests at the routes' mean warm latency.
    pub(super) query_usd_per_1000_requests: f64,
    /// What the numbers assume.
    pub(super) assumptions: Assumptions,
}

/// Dollars and quantities per million attempts, from what the phases measured for `attempts`.
pub(super) fn per_million_attempts(
    attempts: u64,
    ingest: &IngestReport,
    compaction: &CompactionReport,
    storage: &StorageReport,
    query: &QueryReport,
) -> Cost {
    let attempts = (attempts as f64).max(1.0);
    let scale = 1e6 / attempts;

    let bodies = ingest.bodies as f64 * scale;
    let raw_puts = ingest.storage_requests.puts as f64 * scale;
    let ingest_ms = ingest.per_body_ms.p50_ms / (INGEST_MB / MB_PER_VCPU) + S3_PUT_MS;
    let ingest_gb_s = bodies * ingest_ms / 1000.0 * INGEST_MB / 1024.0;

    let runs = compaction.runs as f64 * scale;
    // No CPU time where /proc cannot be read: the compute is then left out, not guessed.
    let cpu_s = compaction.cpu_s.unwrap_or(0.0);
    let compact_s = lambda_seconds(cpu_s, COMPACT_MB, 2.0) * scale;
    let compact_gb_s = compact_s * COMPACT_MB / 1024.0;
    let requests = &compaction.storage_requests;
    let compact_puts = requests.puts as f64 * scale;
    let compact_gets = (requests.gets as f64 + requests.lists as f64) * scale;
    let sqs = raw_puts * SQS_REQUESTS_PER_OBJECT;

    let gb = |bytes: f64| bytes * scale / 1e9;
    let tables_gb = gb(storage.task_attempt_bytes as f64 + storage.entity_bytes as f64);
    let raw_gb = gb(ingest.storage_requests.put_bytes as f64);

    let dollars_ingest = bodies * (price::HTTP_API_REQUEST + price::LAMBDA_REQUEST)
        + ingest_gb_s * price::LAMBDA_GB_SECOND
        + raw_puts * price::S3_PUT;
    let dollars_compact = runs * price::LAMBDA_REQUEST
        + compact_gb_s * price::LAMBDA_GB_SECOND
        + compact_puts * price::S3_PUT
        + compact_gets * price::S3_GET
        + sqs * price::SQS_REQUEST;

    // A dashboard request costs its warm latency at the query function's memory.
    let routes: Vec<f64> = query
        .routes
        .values()
        .map(|route| route.warm.p50_ms)
        .collect();
    let mean_query_ms = routes.iter().sum::<f64>() / routes.len().max(1) as f64;
    let query_s = lambda_seconds(mean_query_ms / 1000.0, QUERY_MB, 2.0);
    let dollars_per_1000_queries = 1000.0
        * (price::HTTP_API_REQUEST
            + price::LAMBDA_REQUEST
            + query_s * QUERY_MB / 1024.0 * price::LAMBDA_GB_SECOND);

    Cost {
        ingest: IngestCost {
            requests: bodies,
            s3_puts: raw_puts,
            gb_seconds: ingest_gb_s,
            billed_ms_per_request: ingest_ms,
            usd: dollars_ingest,
        },
        compact: CompactCost {
            invocations: runs,
            gb_seconds: compact_gb_s,
            s3_puts: compact_puts,
            s3_gets_and_lists: compact_gets,
            sqs_requests: sqs,
            usd: dollars_compact,
        },
        storage: StorageCost {
            tables_gb,
            raw_gb,
            usd_per_month_tables: tables_gb * price::S3_GB_MONTH,
            usd_raw_until_expiry: raw_gb * price::S3_GB_MONTH * RAW_RETENTION_DAYS / 30.0,
        },
        usd_once: dollars_ingest + dollars_compact,
        query_usd_per_1000_requests: dollars_per_1000_queries,
        assumptions: Assumptions {
            prices: "us-east-1 on-demand, x86_64: Lambda $0.0000166667/GB-s + $0.20/M requests, HTTP API $1.00/M, S3 PUT $0.005/1000, GET $0.0004/1000, Standard $0.023/GB-month, SQS $0.40/M",
            lambda_cpu: "a function gets memory/1769 MB of a vCPU; measured CPU time is divided by that share",
            memory_mb: MemorySizes {
                ingest: INGEST_MB,
                compact: COMPACT_MB,
                query: QUERY_MB,
            },
            s3_put_wait_ms_per_ingest: S3_PUT_MS,
            raw_retention_days: RAW_RETENTION_DAYS,
            query_files: "read from the function's /tmp cache; the first request after a new file fetches it",
        },
    }
}

/// The log ingest function's memory size (MB), as the template sets it.
const LOG_INGEST_MB: f64 = 256.0;
/// The log store function's memory size (MB), as the template sets it.
const LOG_STORE_MB: f64 = 512.0;
/// Time a log request waits on one S3 or SQS request (not measured here: local disk and memory
/// stand in).
const AWS_REQUEST_MS: f64 = 20.0;
/// Hours in a month, as AWS bills them.
const HOURS_PER_MONTH: f64 = 730.0;

/// What one node's log shipping measured, per node-hour.
#[derive(Debug, Serialize)]
pub(super) struct LogRates {
    /// Requests (each one invocation of the log ingest function).
    pub(super) requests: f64,
    /// S3 PUTs of the log ingest function (requests stored at once).
    pub(super) ingest_puts: f64,
    /// S3 GETs of the log ingest function, whole and ranged.
    pub(super) ingest_gets: f64,
    /// Requests queued.
    pub(super) queue_sends: f64,
    /// The node's share of the log store function's batches (each one invocation).
    pub(super) store_batches: f64,
    /// S3 PUTs of the log store function.
    pub(super) store_puts: f64,
    /// S3 GETs of the log store function.
    pub(super) store_gets: f64,
    /// SQS requests: sends, and receives and deletes of ten messages each.
    pub(super) sqs_requests: f64,
    /// Bytes the node's files grew by, all shipped.
    pub(super) bytes_shipped: f64,
    /// Bytes kept in storage for them.
    pub(super) bytes_stored: f64,
    /// Median time ingest spent on one request, on local disk (ms).
    pub(super) ingest_ms_per_request: f64,
    /// Median time the log store spent on one batch, on local disk (ms).
    pub(super) store_ms_per_batch: f64,
}

/// What an always-busy node's logs cost per month, and per GB shipped.
#[derive(Debug, Serialize)]
pub(super) struct LogCost {
    /// Requests per node-month.
    pub(super) requests_per_node_month: f64,
    /// Billed time of one request: ingest's time at its CPU share, and the S3 and SQS requests
    /// it waits on.
    pub(super) billed_ms_per_request: f64,
    /// Billed time of one batch of the log store function, likewise (its S3 requests counted as
    /// if waited on one after another).
    pub(super) billed_ms_per_batch: f64,
    /// API Gateway and Lambda invocations.
    pub(super) usd_requests: f64,
    /// Lambda compute.
    pub(super) usd_compute: f64,
    /// S3 PUTs and GETs.
    pub(super) usd_s3_requests: f64,
    /// SQS requests.
    pub(super) usd_sqs_requests: f64,
    /// Keeping one month's logs for a month.
    pub(super) usd_storage: f64,
    /// All of it, per node-month.
    pub(super) usd_per_node_month: f64,
    /// All of it, per GB shipped.
    pub(super) usd_per_gb_shipped: f64,
    /// What one more GB shipped adds when the requests are as many (bytes, not requests: the
    /// cost of chattier files).
    pub(super) usd_per_additional_gb: f64,
    /// What the numbers assume.
    pub(super) assumptions: &'static str,
}

/// The cost of a node shipping at `rates` all month.
pub(super) fn logs_per_node_month(rates: &LogRates) -> LogCost {
    let month = |per_hour: f64| per_hour * HOURS_PER_MONTH;
    let per = |count: f64, of: f64| count / of.max(f64::MIN_POSITIVE);
    let requests = month(rates.requests);
    let batches = month(rates.store_batches);
    let ingest_waits = per(
        rates.ingest_puts + rates.ingest_gets + rates.queue_sends,
        rates.requests,
    );
    let billed_ms = rates.ingest_ms_per_request / (LOG_INGEST_MB / MB_PER_VCPU).min(1.0)
        + AWS_REQUEST_MS * ingest_waits;
    let batch_waits = per(rates.store_puts + rates.store_gets, rates.store_batches);
    let billed_ms_per_batch = rates.store_ms_per_batch / (LOG_STORE_MB / MB_PER_VCPU).min(1.0)
        + AWS_REQUEST_MS * batch_waits;
    let usd_requests = requests * (price::HTTP_API_REQUEST + price::LAMBDA_REQUEST)
        + batches * price::LAMBDA_REQUEST;
    let gb_seconds = |ms: f64, mb: f64| ms / 1000.0 * mb / 1024.0 * price::LAMBDA_GB_SECOND;
    let usd_compute = requests * gb_seconds(billed_ms, LOG_INGEST_MB)
        + batches * gb_seconds(billed_ms_per_batch, LOG_STORE_MB);
    let usd_s3_requests = month(rates.ingest_puts + rates.store_puts) * price::S3_PUT
        + month(rates.ingest_gets + rates.store_gets) * price::S3_GET;
    let usd_sqs_requests = month(rates.sqs_requests) * price::SQS_REQUEST;
    let usd_storage = month(rates.bytes_stored) / 1e9 * price::S3_GB_MONTH;
    let total = usd_requests + usd_compute + usd_s3_requests + usd_sqs_requests + usd_storage;
    let gb_shipped = month(rates.bytes_shipped) / 1e9;
    // A byte more costs its storage, and SQS's 64 KB units: a request's send, receive and
    // delete each count one more unit per 64 KB, which ~0.4 of a byte stored per byte shipped
    // and compression keep far apart; charged as if uncompressed.
    let stored_per_shipped = per(rates.bytes_stored, rates.bytes_shipped);
    let usd_per_additional_gb =
        stored_per_shipped * price::S3_GB_MONTH + 3.0 * 1e9 / 65_536.0 * price::SQS_REQUEST;
    LogCost {
        requests_per_node_month: requests,
        billed_ms_per_request: billed_ms,
        billed_ms_per_batch,
        usd_requests,
        usd_compute,
        usd_s3_requests,
        usd_sqs_requests,
        usd_storage,
        usd_per_node_month: total,
        usd_per_gb_shipped: per(total, gb_shipped),
        usd_per_additional_gb,
        assumptions: "us-east-1 on-demand, x86_64: HTTP API $1.00/M, Lambda $0.20/M + $0.0000166667/GB-s at 256 MB (log ingest) and 512 MB (log store; memory/1769 MB of a vCPU), 20 ms waited per S3 or SQS request, S3 PUT $0.005/1000, GET $0.0004/1000, Standard $0.023/GB-month for a month, SQS $0.40/M per 64 KB; 730 hours a month",
    }
}
