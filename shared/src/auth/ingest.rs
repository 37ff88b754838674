//! Ingest credentials: one secret, a token per cluster derived from it.
//!
//! Ray cannot send headers, so the token travels in the export URL, which ends up in shell
//! histories, Helm values and `ps` output. Each cluster's URL therefore carries its own token,
//! `hex(HMAC-SHA256(secret, "afterglow-ingest:" + cluster))`: a leaked URL writes only the
//! history of the cluster it names, and the secret itself never leaves the deployment.
//!
//! The secret comes from the environment or, on AWS, from Secrets Manager at run time, where
//! both the current and the previous version are accepted: rotating the secret needs no
//! redeploy, and clusters still exporting with the previous version's URLs keep working until
//! the rotation after next.

use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use tokio::sync::Mutex;

use crate::keys::ClusterName;

/// The secret every cluster's ingest token is derived from.
#[derive(Clone)]
pub struct IngestSecret(Box<str>);

/// A secret too short to resist guessing.
#[derive(Debug, thiserror::Error)]
#[error("must be at least {min} characters long (got {len})", min = IngestSecret::MIN_LEN)]
pub struct WeakSecret {
    len: usize,
}

impl IngestSecret {
    /// Shortest accepted secret.
    pub const MIN_LEN: usize = 16;

    /// Checks and wraps a secret. Any characters are fine: it never goes into a URL.
    pub fn new(secret: &str) -> Result<Self, WeakSecret> {
        if secret.len() < Self::MIN_LEN {
            return Err(WeakSecret { len: secret.len() });
        }
        Ok(Self(secret.into()))
    }

    /// The token `cluster`'s export URL carries (`?token=…`): 64 lower-case hex digits.
    pub fn token_for(&self, cluster: &ClusterName) -> String {
        hex::encode(self.mac(cluster))
    }

    /// True if `presented` is `cluster`'s token. The comparison time does not depend on where
    /// the two differ.
    fn admits(&self, cluster: &ClusterName, presented: &str) -> bool {
        let mut expected = [0_u8; 64];
        // Encoding 32 bytes into 64 always fits.
        if hex::encode_to_slice(self.mac(cluster), &mut expected).is_err() {
            return false;
        }
        expected.ct_eq(presented.as_bytes()).into()
    }

    fn mac(&self, cluster: &ClusterName) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.0.as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(b"afterglow-ingest:");
        mac.update(cluster.as_str().as_bytes());
        mac.finalize().into_bytes().into()
    }
}

impl std::fmt::Debug for IngestSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IngestSecret(<redacted>)")
    }
}

/// Where the ingest secret is read from.
#[derive(Clone, Debug)]
pub enum SecretSource {
    /// A value given directly (`AFTERGLOW_INGEST_SECRET`).
    Value(IngestSecret),
    /// A Secrets Manager secret's id or ARN (`AFTERGLOW_INGEST_SECRET_ARN`), read at run time.
    SecretsManager(String),
}

/// Why the secret could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Secrets Manager refused or failed the call.
    #[error("cannot read {stage} of the ingest secret {secret_id} from Secrets Manager: {message}")]
    Fetch {
        /// The secret's id or ARN.
        secret_id: String,
        /// `AWSCURRENT` or `AWSPREVIOUS`.
        stage: &'static str,
        /// The SDK's error, with its causes.
        message: String,
    },
    /// The secret has no string value, or one too short.
    #[error("the ingest secret {secret_id} ({stage}) is unusable: {reason}")]
    Unusable {
        /// The secret's id or ARN.
        secret_id: String,
        /// `AWSCURRENT` or `AWSPREVIOUS`.
        stage: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// How often a secret read from Secrets Manager is read again.
#[derive(Clone, Copy, Debug)]
pub struct RefreshPolicy {
    /// Read again before checking a token once the values are this old, so a rotation reaches
    /// every warm sandbox within this time.
    pub max_age: Duration,
    /// A token that matches neither value makes a read at most this often, so a cluster given
    /// its new URL right after a rotation is admitted at once, while a flood of wrong tokens
    /// cannot turn into a flood of Secrets Manager calls.
    pub min_interval: Duration,
}

impl Default for RefreshPolicy {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(300),
            min_interval: Duration::from_secs(30),
        }
    }
}

/// The secrets a token is checked against: the current one and, after a rotation, the previous.
#[derive(Debug)]
pub struct IngestKeys {
    fetcher: Option<Fetcher>,
    policy: RefreshPolicy,
    held: Mutex<Held>,
}

#[derive(Debug)]
struct Held {
    current: IngestSecret,
    previous: Option<IngestSecret>,
    read_at: Instant,
}

impl Held {
    fn admits(&self, cluster: &ClusterName, presented: &str) -> bool {
        // Both are always checked, so the time taken does not say which one matched.
        let current = self.current.admits(cluster, presented);
        let previous = self
            .previous
            .as_ref()
            .is_some_and(|previous| previous.admits(cluster, presented));
        current | previous
    }
}

impl IngestKeys {
    /// Keys from `source`; a Secrets Manager secret is read now, so a missing secret or
    /// permission fails at start rather than at the first request.
    pub async fn load(source: SecretSource, policy: RefreshPolicy) -> Result<Self, SecretError> {
        match source {
            SecretSource::Value(secret) => Ok(Self::fixed(secret)),
            SecretSource::SecretsManager(secret_id) => {
                let sdk = crate::aws::sdk_config().await;
                let client = aws_sdk_secretsmanager::Client::new(&sdk);
                Self::from_secrets_manager(client, secret_id, policy).await
            }
        }
    }

    /// Keys read through `client` from the secret `secret_id` (an id or ARN), now and again
    /// as `policy` says.
    pub async fn from_secrets_manager(
        client: aws_sdk_secretsmanager::Client,
        secret_id: String,
        policy: RefreshPolicy,
    ) -> Result<Self, SecretError> {
        let fetcher = Fetcher { client, secret_id };
        let held = fetcher.fetch().await?;
        Ok(Self {
            fetcher: Some(fetcher),
            policy,
            held: Mutex::new(held),
        })
    }

    /// Keys that never change.
    pub fn fixed(secret: IngestSecret) -> Self {
        Self {
            fetcher: None,
            policy: RefreshPolicy::default(),
            held: Mutex::new(Held {
                current: secret,
                previous: None,
                read_at: Instant::now(),
            }),
        }
    }

    /// The token `cluster`'s export URL should carry now (derived from the current secret).
    pub async fn token_for(&self, cluster: &ClusterName) -> String {
        let mut held = self.held.lock().await;
        self.refresh_if(&mut held, self.policy.max_age).await;
        held.current.token_for(cluster)
    }

    /// True if `presented` is `cluster`'s token under the current or the previous secret.
    pub async fn admits(&self, cluster: &ClusterName, presented: &str) -> bool {
        let mut held = self.held.lock().await;
        self.refresh_if(&mut held, self.policy.max_age).await;
        if held.admits(cluster, presented) {
            return true;
        }
        // Perhaps the secret was rotated since it was read and this is a new URL.
        self.refresh_if(&mut held, self.policy.min_interval).await
            && held.admits(cluster, presented)
    }

    /// Reads the secret again if what is held is older than `age`; true if it was read. A
    /// failed read keeps the values held (and is retried after `min_interval`): Secrets
    /// Manager being briefly unreachable must not refuse every cluster.
    async fn refresh_if(&self, held: &mut Held, age: Duration) -> bool {
        let Some(fetcher) = &self.fetcher else {
            return false;
        };
        if held.read_at.elapsed() < age {
            return false;
        }
        match fetcher.fetch().await {
            Ok(fresh) => {
                *held = fresh;
                true
            }
            Err(err) => {
                tracing::warn!(error = %err, "keeping the ingest secret read earlier");
                held.read_at = Instant::now()
                    .checked_sub(self.policy.max_age.saturating_sub(self.policy.min_interval))
                    .unwrap_or_else(Instant::now);
                false
            }
        }
    }
}

#[derive(Debug)]
struct Fetcher {
    client: aws_sdk_secretsmanager::Client,
    secret_id: String,
}

impl Fetcher {
    async fn fetch(&self) -> Result<Held, SecretError> {
        let current = self
            .stage("AWSCURRENT")
            .await?
            .ok_or_else(|| SecretError::Unusable {
                secret_id: self.secret_id.clone(),
                stage: "AWSCURRENT",
                reason: "the secret has no current version".to_owned(),
            })?;
        let previous = self.stage("AWSPREVIOUS").await?;
        Ok(Held {
            current,
            previous,
            read_at: Instant::now(),
        })
    }

    /// One version of the secret; `None` when no version has that stage (a secret never
    /// rotated has no `AWSPREVIOUS`).
    #[tracing::instrument(name = "secretsmanager.get_secret_value", skip(self))]
    async fn stage(&self, stage: &'static str) -> Result<Option<IngestSecret>, SecretError> {
        let answer = self
            .client
            .get_secret_value()
            .secret_id(&self.secret_id)
            .version_stage(stage)
            .send()
            .await;
        let output = match answer {
            Ok(output) => output,
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|err| err.is_resource_not_found_exception())
                    && stage != "AWSCURRENT" =>
            {
                return Ok(None);
            }
            Err(err) => {
                return Err(SecretError::Fetch {
                    secret_id: self.secret_id.clone(),
                    stage,
                    message: aws_sdk_secretsmanager::error::DisplayErrorContext(err).to_string(),
                });
            }
        };
        let unusable = |reason: String| SecretError::Unusable {
            secret_id: self.secret_id.clone(),
            stage,
            reason,
        };
        let text = output
            .secret_string()
            .ok_or_else(|| unusable("it has no SecretString (a binary secret)".to_owned()))?;
        IngestSecret::new(text.trim())
            .map(Some)
            .map_err(|err| unusable(err.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str) -> ClusterName {
        ClusterName::new(name).unwrap_or_else(|err| panic!("{name}: {err}"))
    }

    // Expected tokens computed independently, with Python's standard library:
    // hmac.new(b"ingest-secret-7f3a9c1e5b", b"afterglow-ingest:" + name, hashlib.sha256).hexdigest()
    const PROD: &str = "4df31bbbc83503dd2f7b724227c770b1c641910b4d700869d865a4b67108e332";
    const PROD2: &str = "341903482e10eb37b9a1c98ca336c9045d384b35a424b81e390cbd54dfe68c85";

    #[test]
    fn a_clusters_token_is_the_hmac_of_its_name() -> Result<(), WeakSecret> {
        let secret = IngestSecret::new("ingest-secret-7f3a9c1e5b")?;
        assert_eq!(secret.token_for(&cluster("prod-cluster")), PROD);
        assert_eq!(secret.token_for(&cluster("prod-cluster2")), PROD2);
        Ok(())
    }

    #[tokio::test]
    async fn a_token_admits_only_its_own_cluster() -> Result<(), WeakSecret> {
        let keys = IngestKeys::fixed(IngestSecret::new("ingest-secret-7f3a9c1e5b")?);
        assert!(keys.admits(&cluster("prod-cluster"), PROD).await);
        assert!(!keys.admits(&cluster("prod-cluster2"), PROD).await);
        assert!(keys.admits(&cluster("prod-cluster2"), PROD2).await);
        // Neither the secret itself, nor a prefix, nor upper case.
        assert!(
            !keys
                .admits(&cluster("prod-cluster"), "ingest-secret-7f3a9c1e5b")
                .await
        );
        assert!(!keys.admits(&cluster("prod-cluster"), &PROD[..63]).await);
        assert!(
            !keys
                .admits(&cluster("prod-cluster"), &PROD.to_uppercase())
                .await
        );
        assert!(!keys.admits(&cluster("prod-cluster"), "").await);
        Ok(())
    }

    #[test]
    fn short_secrets_are_refused_and_never_shown() -> Result<(), WeakSecret> {
        assert!(IngestSecret::new("short").is_err());
        let secret = IngestSecret::new("s3cret with spaces & more")?;
        assert!(!format!("{secret:?}").contains("s3cret"));
        Ok(())
    }
}
