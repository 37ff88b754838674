//! The AWS SDK's configuration, as every AWS client of Afterglow loads it: the standard chain
//! (environment, profile, SSO, IMDS, the Lambda role) over one HTTPS client, rustls on ring
//! ([`http_client`]). The SDK brings no client of its own here: its default would build aws-lc,
//! a second cryptography library, from C.

use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_s3::config::SharedHttpClient;
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};

/// The HTTPS client of every AWS call: rustls with ring, the system's trust store.
pub fn http_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// The configuration from the standard chain, with [`http_client`].
pub async fn sdk_config() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(http_client())
        .load()
        .await
}
