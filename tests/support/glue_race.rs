//! A lost `UpdateTable` race, for a Glue catalog whose server does not check `VersionId`
//! (moto's): an HTTP client that holds back the first `UpdateTable` it is given, lets another
//! writer commit meanwhile (a test's `rival`), and then answers it as Glue answers an update
//! made against a table version that is no longer current. Every other request goes through.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use aws_sdk_glue::config::SharedHttpClient;
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;

/// Another writer's commit, run while the held-back update waits.
pub type Rival = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// The HTTP client that loses the first `UpdateTable` race (see the module).
#[derive(Clone)]
pub struct LosesFirstUpdate {
    inner: SharedHttpClient,
    rival: Arc<Mutex<Option<Rival>>>,
    refused: Arc<AtomicUsize>,
    updates: Arc<AtomicUsize>,
}

impl fmt::Debug for LosesFirstUpdate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LosesFirstUpdate")
            .field("refused", &self.refused)
            .field("updates", &self.updates)
            .finish_non_exhaustive()
    }
}

impl LosesFirstUpdate {
    /// Over `inner`, with `rival` committing during the first update.
    pub fn new(inner: SharedHttpClient, rival: Rival) -> Self {
        Self {
            inner,
            rival: Arc::new(Mutex::new(Some(rival))),
            refused: Arc::new(AtomicUsize::new(0)),
            updates: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Updates answered as lost races.
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    /// `UpdateTable` requests seen, refused ones included.
    pub fn updates(&self) -> usize {
        self.updates.load(Ordering::SeqCst)
    }

    /// As the SDK's configuration takes it.
    pub fn shared(&self) -> SharedHttpClient {
        SharedHttpClient::new(self.clone())
    }
}

impl HttpClient for LosesFirstUpdate {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(Connector {
            inner: self.inner.http_connector(settings, components),
            client: self.clone(),
        })
    }
}

#[derive(Debug)]
struct Connector {
    inner: SharedHttpConnector,
    client: LosesFirstUpdate,
}

impl HttpConnector for Connector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let is_update = request.headers().get("x-amz-target") == Some("AWSGlue.UpdateTable");
        if !is_update {
            return self.inner.call(request);
        }
        self.client.updates.fetch_add(1, Ordering::SeqCst);
        let rival = self
            .client
            .rival
            .lock()
            .map(|mut rival| rival.take())
            .unwrap_or_default();
        let Some(rival) = rival else {
            return self.inner.call(request);
        };
        let refused = Arc::clone(&self.client.refused);
        HttpConnectorFuture::new(async move {
            rival().await;
            refused.fetch_add(1, Ordering::SeqCst);
            let body = serde_json::json!({
                "__type": "ConcurrentModificationException",
                "Message": "Update table failed due to concurrent modifications.",
            });
            let mut response = HttpResponse::new(
                StatusCode::try_from(400_u16).map_err(|err| {
                    aws_smithy_runtime_api::client::result::ConnectorError::other(err.into(), None)
                })?,
                SdkBody::from(body.to_string()),
            );
            response
                .headers_mut()
                .insert("content-type", "application/x-amz-json-1.1");
            Ok(response)
        })
    }
}
