//! Configuration from the environment: the only place Afterglow reads environment variables.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `AFTERGLOW_INGEST_SECRET` | secret each cluster's ingest token (`?token=`) is derived from (≥ 16 characters; `afterglow export-url` prints a cluster's URL) | unset: ingest is open, allowed only for `serve` on loopback |
//! | `AFTERGLOW_INGEST_SECRET_ARN` | instead: a Secrets Manager secret holding it, read at run time (current and previous version accepted) | unset |
//! | `AFTERGLOW_QUERY_TOKEN` | bearer token the query API (`/api/...`) requires (≥ 16 characters, same alphabet) | unset: no token; `serve` then only listens on loopback, and on AWS IAM guards the routes |
//! | `AFTERGLOW_BUCKET` | S3 bucket; when set, storage is S3 | unset: local directory |
//! | `AFTERGLOW_PREFIX` | key prefix inside the bucket | empty |
//! | `AWS_ENDPOINT_URL_S3` | endpoint of an S3-compatible server (SeaweedFS, MinIO, moto) | AWS |
//! | `AFTERGLOW_S3_FORCE_PATH_STYLE` | `true`/`false`: path-style S3 URLs | `true` when `AWS_ENDPOINT_URL_S3` is set |
//! | `AFTERGLOW_DATA_DIR` | local data directory when no bucket is set | `./afterglow-data` |
//! | `AFTERGLOW_MAX_BODY_BYTES` | largest ingest body | 5 MiB |
//! | `AFTERGLOW_MAX_EVENTS_PER_REQUEST` | most events in one ingest body | 10000 |
//! | `AFTERGLOW_NEW_SESSIONS_PER_MINUTE` | most sessions a cluster may start per minute on one ingest instance (a Lambda sandbox or `serve`; a body past it is answered `429`) | 30 |
//! | `AFTERGLOW_CACHE_MIB` | most MiB of table files the query and compact functions keep in their local cache (least recently used go first) | no limit |
//! | `AFTERGLOW_STORED_KEYS_MIB` | most MiB the compact function keeps between runs of where each stored attempt is (16 B a row; least recently used files go first; `0`: every run scans the stored task ids) | `512` |
//! | `AFTERGLOW_TABLES_RETENTION_DAYS` | compaction removes sessions whose newest event is older (whole: manifest, files, catalog entry) | `0`: keep forever |
//! | `AFTERGLOW_FOLD_QUIET_SECONDS` | a session no compaction has changed for this long is tidied: its deltas folded into one base, its replaced files deleted (1–900) | `300` |
//! | `AFTERGLOW_COMPACT_QUEUE_URL` | the compact function's own SQS queue, where it queues each session's quiet check (delayed by the quiet period); required by the compact function, and where `rebuild` and `compact` over the bucket queue the checks still to come of the sessions they committed | unset |
//! | `AFTERGLOW_LOG_QUEUE_URLS` | the log queue's SQS queues, one per shard, separated by commas (the template sets it for the log ingest function): a request overlapping no stored byte is queued on its node's shard for the log store function instead of stored at once | unset: each request is stored at once |
//! | `AFTERGLOW_GRAFANA_URL` | a Grafana dashboard (e.g. `https://grafana.example.com/d/rayDefaultDashboard`, Ray's default): the page links node and worker ids to it, with `var-SessionName`, `var-NodeId` or `var-WorkerId` and the attempt's time range; Ray's dashboard over the history frames its server on the Metrics and Serve pages, over the session's time range | unset: no links, and Ray's Metrics page says to set up Prometheus and Grafana |
//! | `AFTERGLOW_LOG` | log filter (`info`, `afterglow=debug`, …) | `info` (`warn` for `compact`, `rebuild`, `generate`, `bench`) |
//! | `AFTERGLOW_LOG_SPANS` | `true`: also log each span the filter lets through as it closes, with its busy and idle time (where a request or a run spends its time) | `false` |
//! | `AWS_LAMBDA_RUNTIME_API`, `_HANDLER` | set by Lambda: run as the function named by `_HANDLER` | unset: CLI |
//! | `AWS_LAMBDA_FUNCTION_MEMORY_SIZE` | set by Lambda: sizes DuckDB's memory limit and threads | unset |
//!
//! The AWS SDK itself also reads the standard AWS variables (credentials, region).

use std::path::PathBuf;
use std::time::Duration;

use crate::auth::AccessToken;
use crate::auth::ingest::{IngestSecret, SecretSource};
use crate::ingest::IngestLimits;
use crate::logs::queue::shard::QueueShards;
use crate::storage::S3Settings;

/// A variable that is set to something unusable, or missing where it is required.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Set, but not to a usable value.
    #[error("{variable}={shown} is invalid: {reason}")]
    Invalid {
        /// The variable's name.
        variable: &'static str,
        /// Its value, or `<redacted>` for secrets.
        shown: String,
        /// What was expected.
        reason: String,
    },
    /// Required in this mode but not set.
    #[error("{variable} must be set: {reason}")]
    Missing {
        /// The variable's name.
        variable: &'static str,
        /// Why it is needed.
        reason: &'static str,
    },
}

/// Which function a Lambda runtime runs, from `_HANDLER` (the template's `Handler`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LambdaFunction {
    /// `ingest`: API Gateway → raw objects.
    Ingest,
    /// `compact`: S3 notifications (via SQS) → Parquet tables.
    Compact,
    /// `query`: API Gateway → the dashboard API.
    Query,
    /// `log-store`: queued log requests (via SQS) → log segments and node indexes.
    LogStore,
    /// `catalog`: sync requests (via SQS FIFO) and a scheduled sweep → the published tables'
    /// Iceberg metadata and the Glue Data Catalog.
    Catalog,
}

impl LambdaFunction {
    /// Every `_HANDLER` value this build serves.
    pub const ALL: &'static [&'static str] =
        &["ingest", "compact", "query", "log-store", "catalog"];

    fn parse(value: &str) -> Result<Self, ConfigError> {
        match value {
            "ingest" => Ok(Self::Ingest),
            "compact" => Ok(Self::Compact),
            "query" => Ok(Self::Query),
            "log-store" => Ok(Self::LogStore),
            "catalog" => Ok(Self::Catalog),
            other => Err(ConfigError::Invalid {
                variable: "_HANDLER",
                shown: other.to_owned(),
                reason: format!("expected one of: {}", Self::ALL.join(", ")),
            }),
        }
    }
}

/// Where objects are stored.
#[derive(Clone, Debug)]
pub enum StorageConfig {
    /// A local directory (the embedded default).
    LocalDir(PathBuf),
    /// An S3 bucket.
    S3(S3Settings),
}

/// Everything Afterglow reads from its environment.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where objects are stored.
    pub storage: StorageConfig,
    /// Where the ingest secret comes from, if configured.
    pub ingest_secret: Option<SecretSource>,
    /// The query API's bearer token, if configured.
    pub query_token: Option<AccessToken>,
    /// The Lambda function's memory (MiB), when running in Lambda.
    pub lambda_memory_mib: Option<u64>,
    /// Bounds on ingest requests.
    pub ingest_limits: IngestLimits,
    /// How long compaction keeps a session after its newest event; `None`: forever.
    pub tables_retention: Option<Duration>,
    /// Most bytes of table files kept in a local cache; `None`: no limit.
    pub cache_bytes: Option<u64>,
    /// Most bytes of table files one query request may copy (see
    /// [`crate::query::QuerySettings::copy_budget_bytes`]).
    pub copy_budget_bytes: u64,
    /// Most bytes compaction keeps between runs of where stored attempts are (0: none).
    pub stored_keys_bytes: u64,
    /// The Grafana dashboard the page links node and worker ids to, if configured.
    pub grafana_url: Option<GrafanaUrl>,
    /// How long a session goes unchanged before it is tidied (see `compact::fold`).
    pub fold_quiet: Duration,
    /// The compact function's queue, for quiet checks (the compact function requires it;
    /// `rebuild` and `compact` over the bucket queue theirs there too).
    pub compact_queue_url: Option<String>,
    /// The log queue's shards: the log ingest function queues log requests there for the log
    /// store function (see `logs::queue`); unset, ingest stores each request itself.
    pub log_queues: Option<QueueShards>,
    /// The catalog-sync function's FIFO queue: the compact function asks it to publish the
    /// tables after each commit; unset, it asks nothing (the Iceberg catalog is off).
    pub catalog_queue_url: Option<String>,
    /// The Glue database the catalog-sync function (and `afterglow publish`) points the
    /// published tables at.
    pub glue_database: Option<String>,
    /// Log filter directive (`AFTERGLOW_LOG`), when set.
    pub log_filter: Option<String>,
    /// Whether spans are logged as they close, with their times (`AFTERGLOW_LOG_SPANS`).
    pub log_spans: bool,
    /// `Some` when running inside AWS Lambda.
    pub lambda: Option<LambdaFunction>,
}

/// How long a session goes unchanged before it is tidied, unless configured.
pub const DEFAULT_FOLD_QUIET: Duration = Duration::from_secs(300);

/// True inside AWS Lambda (`AWS_LAMBDA_RUNTIME_API` is set), even when the rest of the
/// configuration is invalid: the binary then reports the error instead of parsing a command line.
pub fn running_in_lambda() -> bool {
    std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some_and(|value| !value.is_empty())
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads configuration through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| lookup(name).filter(|value| !value.is_empty());

        let secret = |variable: &'static str| {
            get(variable)
                .map(|secret| {
                    AccessToken::new(&secret).map_err(|err| ConfigError::Invalid {
                        variable,
                        shown: "<redacted>".to_owned(),
                        reason: err.to_string(),
                    })
                })
                .transpose()
        };
        let ingest_secret = ingest_secret(&get)?;
        let query_token = secret("AFTERGLOW_QUERY_TOKEN")?;

        let endpoint_url = get("AWS_ENDPOINT_URL_S3");
        let storage = match get("AFTERGLOW_BUCKET") {
            Some(bucket) => StorageConfig::S3(S3Settings {
                bucket,
                prefix: get("AFTERGLOW_PREFIX").unwrap_or_default(),
                force_path_style: parse_bool(
                    "AFTERGLOW_S3_FORCE_PATH_STYLE",
                    get("AFTERGLOW_S3_FORCE_PATH_STYLE"),
                    endpoint_url.is_some(),
                )?,
                endpoint_url,
                stall_timeout: S3Settings::DEFAULT_STALL_TIMEOUT,
                operation_timeout: None,
            }),
            None => StorageConfig::LocalDir(
                get("AFTERGLOW_DATA_DIR")
                    .map_or_else(|| PathBuf::from("./afterglow-data"), PathBuf::from),
            ),
        };

        let defaults = IngestLimits::default();
        let ingest_limits = IngestLimits {
            max_body_bytes: parse_count(
                "AFTERGLOW_MAX_BODY_BYTES",
                get("AFTERGLOW_MAX_BODY_BYTES"),
                defaults.max_body_bytes,
            )?,
            max_events: parse_count(
                "AFTERGLOW_MAX_EVENTS_PER_REQUEST",
                get("AFTERGLOW_MAX_EVENTS_PER_REQUEST"),
                defaults.max_events,
            )?,
            new_sessions_per_minute: parse_count(
                "AFTERGLOW_NEW_SESSIONS_PER_MINUTE",
                get("AFTERGLOW_NEW_SESSIONS_PER_MINUTE"),
                defaults.new_sessions_per_minute,
            )?,
        };

        let lambda = match get("AWS_LAMBDA_RUNTIME_API") {
            None => None,
            Some(_) => Some(LambdaFunction::parse(&get("_HANDLER").ok_or(
                ConfigError::Missing {
                    variable: "_HANDLER",
                    reason: "Lambda sets it from the function's Handler (ingest, compact or query)",
                },
            )?)?),
        };

        let lambda_memory_mib = get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
            .map(|text| {
                parse_count("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", Some(text), 0).map(|mib| mib as u64)
            })
            .transpose()?;

        let tables_retention = match get("AFTERGLOW_TABLES_RETENTION_DAYS") {
            None => None,
            Some(text) => match text.trim().parse::<u64>() {
                Ok(0) => None,
                Ok(days) => Some(Duration::from_secs(days.saturating_mul(86_400))),
                Err(err) => {
                    return Err(ConfigError::Invalid {
                        variable: "AFTERGLOW_TABLES_RETENTION_DAYS",
                        shown: text,
                        reason: format!("expected a whole number of days (0: forever): {err}"),
                    });
                }
            },
        };

        let cache_bytes = get("AFTERGLOW_CACHE_MIB")
            .map(|text| {
                parse_count("AFTERGLOW_CACHE_MIB", Some(text), 0)
                    .map(|mib| (mib as u64).saturating_mul(1024 * 1024))
            })
            .transpose()?;

        let copy_budget_bytes = match get("AFTERGLOW_QUERY_COPY_MIB") {
            None => crate::query::COPY_BUDGET_BYTES,
            text => (parse_count("AFTERGLOW_QUERY_COPY_MIB", text, 0)? as u64)
                .saturating_mul(1024 * 1024),
        };

        let stored_keys_bytes = match get("AFTERGLOW_STORED_KEYS_MIB") {
            None => crate::tables::stored_keys::DEFAULT_BUDGET,
            Some(text) => match text.trim().parse::<u64>() {
                Ok(mib) => mib.saturating_mul(1024 * 1024),
                Err(_) => {
                    return Err(ConfigError::Invalid {
                        variable: "AFTERGLOW_STORED_KEYS_MIB",
                        shown: text,
                        reason: "expected whole MiB (0: compaction scans instead)".to_owned(),
                    });
                }
            },
        };

        let grafana_url = get("AFTERGLOW_GRAFANA_URL")
            .map(|text| {
                GrafanaUrl::new(&text).map_err(|reason| ConfigError::Invalid {
                    variable: "AFTERGLOW_GRAFANA_URL",
                    shown: text,
                    reason: reason.to_owned(),
                })
            })
            .transpose()?;

        let fold_quiet = match get("AFTERGLOW_FOLD_QUIET_SECONDS") {
            None => DEFAULT_FOLD_QUIET,
            Some(text) => match text.trim().parse::<u64>() {
                Ok(seconds @ 1..=900) => Duration::from_secs(seconds),
                _ => {
                    return Err(ConfigError::Invalid {
                        variable: "AFTERGLOW_FOLD_QUIET_SECONDS",
                        shown: text,
                        reason: "expected whole seconds from 1 to 900 (SQS delays a message \
                                 15 minutes at most)"
                            .to_owned(),
                    });
                }
            },
        };

        Ok(Self {
            storage,
            cache_bytes,
            copy_budget_bytes,
            stored_keys_bytes,
            grafana_url,
            fold_quiet,
            compact_queue_url: get("AFTERGLOW_COMPACT_QUEUE_URL"),
            log_queues: get("AFTERGLOW_LOG_QUEUE_URLS")
                .map(|urls| {
                    QueueShards::parse(&urls).map_err(|err| ConfigError::Invalid {
                        variable: "AFTERGLOW_LOG_QUEUE_URLS",
                        shown: urls.clone(),
                        reason: err.to_string(),
                    })
                })
                .transpose()?,
            catalog_queue_url: get("AFTERGLOW_CATALOG_QUEUE_URL"),
            glue_database: get("AFTERGLOW_GLUE_DATABASE"),
            ingest_secret,
            query_token,
            lambda_memory_mib,
            ingest_limits,
            tables_retention,
            log_filter: get("AFTERGLOW_LOG"),
            log_spans: parse_bool("AFTERGLOW_LOG_SPANS", get("AFTERGLOW_LOG_SPANS"), false)?,
            lambda,
        })
    }

    /// Storage for a Lambda function: S3 is required, optionally with a bound on each call
    /// (ingest must answer inside Ray's 3 s).
    pub fn lambda_s3(
        &self,
        operation_timeout: Option<Duration>,
    ) -> Result<S3Settings, ConfigError> {
        match &self.storage {
            StorageConfig::S3(settings) => Ok(S3Settings {
                operation_timeout,
                ..settings.clone()
            }),
            StorageConfig::LocalDir(_) => Err(ConfigError::Missing {
                variable: "AFTERGLOW_BUCKET",
                reason: "the Lambda functions store everything in S3",
            }),
        }
    }
}

/// An `http(s)://` URL the page may put in a link: no whitespace, quotes or angle brackets,
/// so it can be written into the page's HTML as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrafanaUrl(String);

impl GrafanaUrl {
    /// Checks `text`; the reason it is refused otherwise.
    pub fn new(text: &str) -> Result<Self, &'static str> {
        let text = text.trim();
        let rest = text
            .strip_prefix("https://")
            .or_else(|| text.strip_prefix("http://"))
            .ok_or("expected an http:// or https:// URL")?;
        if rest.is_empty() || rest.starts_with('/') {
            return Err("the URL names no host");
        }
        if text.chars().any(|c| {
            c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '<' | '>' | '`')
        }) {
            return Err("the URL holds whitespace, a quote or an angle bracket");
        }
        Ok(Self(text.to_owned()))
    }

    /// The URL.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The Grafana server: the URL before its dashboard path (`/d/…`) and query, without a
    /// trailing `/` (`https://grafana.example.com` of `https://grafana.example.com/d/uid`).
    pub fn server(&self) -> &str {
        let url = self.0.split(['?', '#']).next().unwrap_or_default();
        let server = url.find("/d/").map_or(url, |at| &url[..at]);
        server.trim_end_matches('/')
    }

    /// The dashboard the URL names (`uid` of `…/d/uid/slug?…`), if it names one.
    pub fn dashboard_uid(&self) -> Option<&str> {
        let url = self.0.split(['?', '#']).next().unwrap_or_default();
        let (_, path) = url.split_once("/d/")?;
        path.split('/').next().filter(|uid| !uid.is_empty())
    }
}

fn ingest_secret(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<SecretSource>, ConfigError> {
    if get("AFTERGLOW_INGEST_TOKEN").is_some() {
        return Err(ConfigError::Invalid {
            variable: "AFTERGLOW_INGEST_TOKEN",
            shown: "<redacted>".to_owned(),
            reason: "each cluster now has its own token, derived from one secret: set \
                     AFTERGLOW_INGEST_SECRET (or AFTERGLOW_INGEST_SECRET_ARN) instead, and give \
                     each cluster the URL `afterglow export-url --cluster NAME` prints"
                .to_owned(),
        });
    }
    match (
        get("AFTERGLOW_INGEST_SECRET"),
        get("AFTERGLOW_INGEST_SECRET_ARN"),
    ) {
        (Some(_), Some(_)) => Err(ConfigError::Invalid {
            variable: "AFTERGLOW_INGEST_SECRET_ARN",
            shown: "<set>".to_owned(),
            reason: "set AFTERGLOW_INGEST_SECRET or AFTERGLOW_INGEST_SECRET_ARN, not both"
                .to_owned(),
        }),
        (Some(value), None) => IngestSecret::new(&value)
            .map(|secret| Some(SecretSource::Value(secret)))
            .map_err(|err| ConfigError::Invalid {
                variable: "AFTERGLOW_INGEST_SECRET",
                shown: "<redacted>".to_owned(),
                reason: err.to_string(),
            }),
        (None, Some(id)) => Ok(Some(SecretSource::SecretsManager(id))),
        (None, None) => Ok(None),
    }
}

fn parse_count(
    variable: &'static str,
    value: Option<String>,
    default: usize,
) -> Result<usize, ConfigError> {
    match value {
        None => Ok(default),
        Some(text) => match text.parse::<usize>() {
            Ok(count) if count > 0 => Ok(count),
            _ => Err(ConfigError::Invalid {
                variable,
                shown: text,
                reason: "expected a positive whole number".to_owned(),
            }),
        },
    }
}

fn parse_bool(
    variable: &'static str,
    value: Option<String>,
    default: bool,
) -> Result<bool, ConfigError> {
    match value.as_deref() {
        None => Ok(default),
        Some("true" | "1" | "yes") => Ok(true),
        Some("false" | "0" | "no") => Ok(false),
        Some(other) => Err(ConfigError::Invalid {
            variable,
            shown: other.to_owned(),
            reason: "expected true or false".to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        Config::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn defaults_to_a_local_directory_and_open_cli() -> Result<(), ConfigError> {
        let config = config(&[])?;
        assert!(
            matches!(&config.storage, StorageConfig::LocalDir(dir) if dir.ends_with("afterglow-data"))
        );
        assert!(config.ingest_secret.is_none());
        assert_eq!(config.lambda, None);
        assert_eq!(config.ingest_limits, IngestLimits::default());
        Ok(())
    }

    #[test]
    fn the_quiet_period_is_whole_seconds_sqs_can_delay() -> Result<(), ConfigError> {
        assert_eq!(config(&[])?.fold_quiet, DEFAULT_FOLD_QUIET);
        let read = config(&[("AFTERGLOW_FOLD_QUIET_SECONDS", "900")])?;
        assert_eq!(read.fold_quiet, Duration::from_secs(900));
        for bad in ["0", "901", "5m", "-1"] {
            let err = config(&[("AFTERGLOW_FOLD_QUIET_SECONDS", bad)]).err();
            assert!(
                err.is_some_and(|err| err
                    .to_string()
                    .contains(&format!("AFTERGLOW_FOLD_QUIET_SECONDS={bad}"))),
                "{bad}"
            );
        }
        Ok(())
    }

    #[test]
    fn the_stored_keys_budget_is_whole_mib_and_zero_turns_it_off() -> Result<(), ConfigError> {
        assert_eq!(
            config(&[])?.stored_keys_bytes,
            crate::tables::stored_keys::DEFAULT_BUDGET
        );
        let read = config(&[("AFTERGLOW_STORED_KEYS_MIB", "1024")])?;
        assert_eq!(read.stored_keys_bytes, 1 << 30);
        assert_eq!(
            config(&[("AFTERGLOW_STORED_KEYS_MIB", "0")])?.stored_keys_bytes,
            0
        );
        for bad in ["512M", "-1", "0.5"] {
            let err = config(&[("AFTERGLOW_STORED_KEYS_MIB", bad)]).err();
            assert!(
                err.is_some_and(|err| err
                    .to_string()
                    .contains(&format!("AFTERGLOW_STORED_KEYS_MIB={bad}"))),
                "{bad}"
            );
        }
        Ok(())
    }

    #[test]
    fn the_new_session_budget_is_a_positive_count() -> Result<(), ConfigError> {
        let read = config(&[(crate::ingest::NEW_SESSIONS_VARIABLE, "5")])?;
        assert_eq!(read.ingest_limits.new_sessions_per_minute, 5);
        for bad in ["0", "-1", "lots"] {
            let err = config(&[("AFTERGLOW_NEW_SESSIONS_PER_MINUTE", bad)]).err();
            assert!(
                err.is_some_and(|err| err
                    .to_string()
                    .contains(&format!("AFTERGLOW_NEW_SESSIONS_PER_MINUTE={bad}"))),
                "{bad}"
            );
        }
        Ok(())
    }

    #[test]
    fn a_grafana_url_names_its_server_and_dashboard() -> Result<(), &'static str> {
        for (url, server, uid) in [
            (
                "https://grafana.example.com/d/rayDefaultDashboard?orgId=1",
                "https://grafana.example.com",
                Some("rayDefaultDashboard"),
            ),
            (
                "http://10.0.0.5:3000/grafana/d/abc123/ray-default/",
                "http://10.0.0.5:3000/grafana",
                Some("abc123"),
            ),
            (
                "https://grafana.example.com/",
                "https://grafana.example.com",
                None,
            ),
            ("https://g.example.com/d/", "https://g.example.com", None),
        ] {
            let grafana = GrafanaUrl::new(url)?;
            assert_eq!(grafana.server(), server, "{url}");
            assert_eq!(grafana.dashboard_uid(), uid, "{url}");
        }
        Ok(())
    }

    #[test]
    fn a_grafana_url_must_be_a_plain_http_url() -> Result<(), ConfigError> {
        let url = "https://grafana.example.com/d/rayDefaultDashboard?orgId=1";
        let read = config(&[("AFTERGLOW_GRAFANA_URL", url)])?;
        assert_eq!(read.grafana_url.as_ref().map(GrafanaUrl::as_str), Some(url));
        for bad in [
            "grafana.example.com",
            "javascript:alert(1)",
            "https://",
            "https://a/\"x",
        ] {
            let err = config(&[("AFTERGLOW_GRAFANA_URL", bad)])
                .err()
                .map(|err| err.to_string());
            assert!(
                err.as_deref()
                    .is_some_and(|err| err.contains("AFTERGLOW_GRAFANA_URL")),
                "{bad}: {err:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn a_bucket_selects_s3_with_path_style_for_local_endpoints() -> Result<(), ConfigError> {
        let config = config(&[
            ("AFTERGLOW_BUCKET", "history"),
            ("AFTERGLOW_PREFIX", "team-a"),
            ("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:8333"),
        ])?;
        let StorageConfig::S3(s3) = &config.storage else {
            panic!("expected S3 storage");
        };
        assert_eq!(s3.bucket, "history");
        assert_eq!(s3.prefix, "team-a");
        assert!(s3.force_path_style);
        Ok(())
    }

    #[test]
    fn errors_name_the_variable_and_hide_secrets() {
        let err = config(&[("AFTERGLOW_INGEST_SECRET", "tiny")]).err();
        let text = err.map(|err| err.to_string()).unwrap_or_default();
        assert!(text.contains("AFTERGLOW_INGEST_SECRET"), "{text}");
        assert!(!text.contains("tiny"), "{text}");

        // A deployment configured before tokens were per cluster is told what to set instead.
        let err = config(&[("AFTERGLOW_INGEST_TOKEN", "old-shared-token-0123456789")]).err();
        let text = err.map(|err| err.to_string()).unwrap_or_default();
        assert!(text.contains("AFTERGLOW_INGEST_SECRET"), "{text}");
        assert!(!text.contains("old-shared-token"), "{text}");

        let both = [
            ("AFTERGLOW_INGEST_SECRET", "a-long-enough-secret-0123"),
            ("AFTERGLOW_INGEST_SECRET_ARN", "arn:aws:secretsmanager:x"),
        ];
        let text = config(&both).err().map(|err| err.to_string());
        assert!(text.is_some_and(|text| text.contains("not both") && !text.contains("0123")));

        let err = config(&[("AFTERGLOW_MAX_BODY_BYTES", "lots")]).err();
        assert!(err.is_some_and(|err| err.to_string().contains("AFTERGLOW_MAX_BODY_BYTES=lots")));
    }

    #[test]
    fn lambda_handler_must_name_a_known_function() {
        let unknown = config(&[
            ("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001"),
            ("_HANDLER", "bootstrap"),
        ]);
        let text = unknown.err().map(|err| err.to_string()).unwrap_or_default();
        assert!(
            text.contains("_HANDLER=bootstrap") && text.contains("ingest"),
            "{text}"
        );
        let ingest = config(&[
            ("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001"),
            ("_HANDLER", "ingest"),
        ]);
        assert!(matches!(
            ingest.map(|c| c.lambda),
            Ok(Some(LambdaFunction::Ingest))
        ));
    }

    #[test]
    fn lambda_requires_a_bucket() -> Result<(), ConfigError> {
        let config = config(&[])?;
        let err = config.lambda_s3(Some(Duration::from_secs(2))).err();
        assert!(err.is_some_and(|err| err.to_string().contains("AFTERGLOW_BUCKET")));
        Ok(())
    }
}
