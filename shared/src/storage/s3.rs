//! The S3 backend (aws-sdk-s3), also used against S3-compatible servers such as SeaweedFS.
//!
//! Conditional puts map to S3's `If-None-Match: *` and `If-Match`; a `412 Precondition Failed`
//! answer becomes [`StorageError::Precondition`], a `409 ConditionalRequestConflict` (another
//! conditional write to the key in flight) [`StorageError::Conflict`].

use std::ops::Range;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::{ByteStream, Length};
use aws_sdk_s3::types::{Delete, ObjectIdentifier};
use bytes::Bytes;

use super::{
    ETag, MAX_KEYS_PER_DELETE, ObjectKey, ObjectMeta, PutMode, Storage, StorageError, StoredObject,
    within,
};

/// Where and how to reach the bucket.
#[derive(Clone, Debug)]
pub struct S3Settings {
    /// Bucket name.
    pub bucket: String,
    /// Key prefix inside the bucket (no leading or trailing `/`), or empty.
    pub prefix: String,
    /// Endpoint of an S3-compatible server; `None` for AWS.
    pub endpoint_url: Option<String>,
    /// Path-style addressing (`http://host/bucket/key`), which local servers need.
    pub force_path_style: bool,
    /// Upper bound on one whole call including retries; ingest must answer Ray within 3 s.
    pub operation_timeout: Option<Duration>,
    /// Upper bound on connecting, and on waiting for a response to start: a stalled endpoint
    /// fails the attempt (and the SDK retries) instead of hanging the call, the compaction
    /// behind it, or `serve`'s queue. Bodies may take longer: big files stream for a while.
    pub stall_timeout: Duration,
}

impl S3Settings {
    /// The stall timeout used unless configured otherwise.
    pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(30);
}

/// Objects in one S3 bucket under an optional prefix.
#[derive(Clone, Debug)]
pub struct S3Storage {
    client: Client,
    bucket: String,
    prefix: String,
}

impl S3Storage {
    /// Builds a client from the standard AWS configuration chain (environment, profile, IMDS,
    /// Lambda role) plus `settings`.
    pub async fn connect(settings: S3Settings) -> Self {
        let shared = crate::aws::sdk_config().await;
        let mut builder =
            aws_sdk_s3::config::Builder::from(&shared).force_path_style(settings.force_path_style);
        if let Some(endpoint) = &settings.endpoint_url {
            builder = builder.endpoint_url(endpoint);
        }
        let mut timeouts = aws_sdk_s3::config::timeout::TimeoutConfig::builder()
            .connect_timeout(settings.stall_timeout.min(Duration::from_secs(3)))
            .read_timeout(settings.stall_timeout);
        if let Some(timeout) = settings.operation_timeout {
            timeouts = timeouts
                .operation_timeout(timeout)
                .connect_timeout(Duration::from_secs(1));
        }
        builder = builder.timeout_config(timeouts.build());
        Self {
            client: Client::from_conf(builder.build()),
            bucket: settings.bucket,
            prefix: settings.prefix.trim_matches('/').to_owned(),
        }
    }

    /// The answer to a GET of `key`, its body not yet read.
    async fn get_object(
        &self,
        key: &ObjectKey,
    ) -> Result<aws_sdk_s3::operation::get_object::GetObjectOutput, StorageError> {
        self.client
            .get_object()
            .bucket(&self.bucket)
            .key(self.full_key(key.as_str()))
            .send()
            .await
            .map_err(|err| {
                if status_of(&err) == Some(404) {
                    StorageError::NotFound { key: key.clone() }
                } else {
                    StorageError::backend(key, describe(err))
                }
            })
    }

    fn full_key(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{}/{key}", self.prefix)
        }
    }

    /// Puts `body` at `key` under `mode`; a precondition that fails is
    /// [`StorageError::Precondition`], one that met another write in flight
    /// [`StorageError::Conflict`].
    async fn put_body(
        &self,
        key: &ObjectKey,
        body: ByteStream,
        mode: PutMode,
    ) -> Result<ETag, StorageError> {
        let mut request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(self.full_key(key.as_str()))
            .body(body);
        request = match &mode {
            PutMode::Overwrite => request,
            PutMode::Create => request.if_none_match("*"),
            PutMode::Update(etag) => request.if_match(etag.as_str()),
        };
        match request.send().await {
            Ok(output) => Ok(ETag::new(output.e_tag.unwrap_or_default())),
            Err(err) if mode != PutMode::Overwrite && status_of(&err) == Some(412) => {
                Err(StorageError::Precondition { key: key.clone() })
            }
            // ConditionalRequestConflict: another conditional write to the key is in flight,
            // possibly the SDK's own earlier attempt of this request.
            Err(err) if mode != PutMode::Overwrite && status_of(&err) == Some(409) => {
                Err(StorageError::Conflict { key: key.clone() })
            }
            // S3 answers 404 to If-Match on a missing object; for Update that is a lost race.
            Err(err) if matches!(mode, PutMode::Update(_)) && status_of(&err) == Some(404) => {
                Err(StorageError::Precondition { key: key.clone() })
            }
            Err(err) => Err(StorageError::backend(key, describe(err))),
        }
    }
}

/// The HTTP status of a failed call, when the server answered at all.
fn status_of<E>(err: &SdkError<E, HttpResponse>) -> Option<u16> {
    err.raw_response()
        .map(|response| response.status().as_u16())
}

/// A readable message: the SDK's `Display` for service errors is only "service error".
fn describe<E>(err: SdkError<E, HttpResponse>) -> Box<dyn std::error::Error + Send + Sync>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match err {
        SdkError::ServiceError(service) => {
            let inner = service.into_err();
            let code = inner.code().unwrap_or("unknown");
            let message = inner.message().unwrap_or("no message");
            format!("S3 error {code}: {message}").into()
        }
        other => DisplayErrorContext(&other).to_string().into(),
    }
}

/// The whole body of an answer to a GET of `key`.
async fn collected(key: &ObjectKey, body: ByteStream) -> Result<Bytes, StorageError> {
    Ok(body
        .collect()
        .await
        .map_err(|err| StorageError::backend(key, err))?
        .into_bytes())
}

#[async_trait]
impl Storage for S3Storage {
    #[tracing::instrument(name = "s3.put", skip(self, body), fields(bucket = %self.bucket, key = %key, bytes = body.len()))]
    async fn put(&self, key: &ObjectKey, body: Bytes, mode: PutMode) -> Result<ETag, StorageError> {
        self.put_body(key, ByteStream::from(body), mode).await
    }

    /// Streamed from the file (one PUT, read again from the file on a retry): a fold's base
    /// may be hundreds of megabytes, which the default would hold in memory.
    #[tracing::instrument(name = "s3.put_file", skip(self, path), fields(bucket = %self.bucket, key = %key))]
    async fn put_file(
        &self,
        key: &ObjectKey,
        path: &std::path::Path,
        mode: PutMode,
    ) -> Result<(ETag, u64), StorageError> {
        let bytes = tokio::fs::metadata(path)
            .await
            .map_err(|err| StorageError::backend(key, err))?
            .len();
        let body = ByteStream::read_from()
            .path(path)
            .length(Length::Exact(bytes))
            .build()
            .await
            .map_err(|err| StorageError::backend(key, err))?;
        let etag = self.put_body(key, body, mode).await?;
        Ok((etag, bytes))
    }

    #[tracing::instrument(name = "s3.get", skip(self), fields(bucket = %self.bucket, key = %key))]
    async fn get(&self, key: &ObjectKey) -> Result<StoredObject, StorageError> {
        let output = self.get_object(key).await?;
        let etag = ETag::new(output.e_tag.clone().unwrap_or_default());
        let body = collected(key, output.body).await?;
        Ok(StoredObject { body, etag })
    }

    #[tracing::instrument(name = "s3.get_within", skip(self), fields(bucket = %self.bucket, key = %key))]
    async fn get_within(&self, key: &ObjectKey, limit: u64) -> Result<StoredObject, StorageError> {
        let output = self.get_object(key).await?;
        // The declared length first: a body past the limit is never read (dropping it closes
        // the connection).
        if let Some(length) = output
            .content_length()
            .and_then(|length| u64::try_from(length).ok())
        {
            within(key, length, limit)?;
        }
        let etag = ETag::new(output.e_tag.clone().unwrap_or_default());
        let body = collected(key, output.body).await?;
        within(key, body.len() as u64, limit)?;
        Ok(StoredObject { body, etag })
    }

    #[tracing::instrument(name = "s3.get_range", skip(self), fields(bucket = %self.bucket, key = %key))]
    async fn get_range(&self, key: &ObjectKey, range: Range<u64>) -> Result<Bytes, StorageError> {
        if range.start >= range.end {
            return if range.start == range.end {
                Ok(Bytes::new())
            } else {
                Err(StorageError::backend(
                    key,
                    format!("bytes {range:?} are no range"),
                ))
            };
        }
        let last = range.end - 1;
        let output = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.full_key(key.as_str()))
            .range(format!("bytes={}-{last}", range.start))
            .send()
            .await
            .map_err(|err| match status_of(&err) {
                Some(404) => StorageError::NotFound { key: key.clone() },
                // S3 answers a range that starts past the end with 416.
                Some(416) => {
                    StorageError::backend(key, format!("bytes {range:?} are past the end"))
                }
                _ => StorageError::backend(key, describe(err)),
            })?;
        let body = collected(key, output.body).await?;
        // S3 answers a range that ends past the object's end with what there is.
        if body.len() as u64 != range.end - range.start {
            return Err(StorageError::backend(
                key,
                format!(
                    "bytes {}..{} asked, {} read: the range runs past the object's end",
                    range.start,
                    range.end,
                    body.len()
                ),
            ));
        }
        Ok(body)
    }

    #[tracing::instrument(name = "s3.list", skip(self), fields(bucket = %self.bucket))]
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StorageError> {
        let full_prefix = self.full_key(prefix);
        let strip = if self.prefix.is_empty() {
            0
        } else {
            self.prefix.len() + 1
        };
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(&full_prefix)
            .into_paginator()
            .send();
        let mut found = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|err| StorageError::backend(prefix, describe(err)))?;
            for object in page.contents.unwrap_or_default() {
                let Some(relative) = object.key.as_deref().and_then(|key| key.get(strip..)) else {
                    continue;
                };
                // Objects written by something else under our prefix are not ours to list.
                if let Ok(key) = ObjectKey::new(relative) {
                    let size = object.size.and_then(|size| u64::try_from(size).ok());
                    // Without a time the object counts as new: nothing is old enough to be
                    // collected by a guess.
                    let modified = object
                        .last_modified()
                        .and_then(|time| std::time::SystemTime::try_from(*time).ok())
                        .unwrap_or_else(std::time::SystemTime::now);
                    found.push(ObjectMeta {
                        key,
                        size: size.unwrap_or(0),
                        modified,
                    });
                }
            }
        }
        found.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(found)
    }

    #[tracing::instrument(name = "s3.delete", skip(self), fields(bucket = %self.bucket, key = %key))]
    async fn delete(&self, key: &ObjectKey) -> Result<(), StorageError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.full_key(key.as_str()))
            .send()
            .await
            .map_err(|err| StorageError::backend(key, describe(err)))?;
        Ok(())
    }

    #[tracing::instrument(name = "s3.delete_all", skip_all, fields(keys = keys.len()))]
    async fn delete_all(&self, keys: &[ObjectKey]) -> Result<(), StorageError> {
        for batch in keys.chunks(MAX_KEYS_PER_DELETE) {
            let Some(first) = batch.first() else {
                continue;
            };
            let objects = batch
                .iter()
                .map(|key| {
                    ObjectIdentifier::builder()
                        .key(self.full_key(key.as_str()))
                        .build()
                        .map_err(|err| StorageError::backend(key, err))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let delete = Delete::builder()
                .set_objects(Some(objects))
                .quiet(true)
                .build()
                .map_err(|err| StorageError::backend(first, err))?;
            let answer = self
                .client
                .delete_objects()
                .bucket(&self.bucket)
                .delete(delete)
                .send()
                .await
                .map_err(|err| StorageError::backend(first, describe(err)))?;
            // S3 answers 200 with a list of the keys it could not delete (a missing key is
            // deleted, not an error).
            if let Some(failed) = answer.errors().first() {
                return Err(StorageError::backend(
                    failed.key().unwrap_or("a key of the batch"),
                    format!(
                        "S3 error {}: {} ({} of {} keys not deleted)",
                        failed.code().unwrap_or("unknown"),
                        failed.message().unwrap_or("no message"),
                        answer.errors().len(),
                        batch.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn location(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }
}
