//! moto's server on 127.0.0.1, standing in for AWS Secrets Manager, SQS and the Glue Data
//! Catalog.
//!
//! Runs when `moto_server` is on PATH (`scripts/test` installs `moto[server]` and sets
//! `AFTERGLOW_TEST_MOTO=1`, which turns a missing server into a failure instead of a skip).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use aws_sdk_secretsmanager::config::{BehaviorVersion, Credentials, Region};

/// A running `moto_server`, stopped when dropped.
pub struct Moto {
    child: Option<Child>,
    endpoint: String,
}

impl Moto {
    /// Starts a server on a free port; `None` (after saying so) when moto is not installed and
    /// not required.
    pub async fn start(test: &str) -> anyhow::Result<Option<Self>> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let spawned = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(err) if std::env::var("AFTERGLOW_TEST_MOTO").is_ok_and(|value| value == "1") => {
                return Err(err).context("AFTERGLOW_TEST_MOTO=1 but moto_server cannot start");
            }
            Err(_) => {
                eprintln!(
                    "skipping {test}: moto_server is not installed (pip install 'moto[server]'; \
                     scripts/test does)"
                );
                return Ok(None);
            }
        };
        let moto = Self {
            child: Some(child),
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            anyhow::ensure!(Instant::now() < deadline, "moto_server did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Some(moto))
    }

    /// A Secrets Manager client of this server.
    pub fn client(&self) -> aws_sdk_secretsmanager::Client {
        let config = aws_sdk_secretsmanager::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(&self.endpoint)
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("moto", "moto", None, None, "moto"))
            .http_client(shared::aws::http_client())
            .build();
        aws_sdk_secretsmanager::Client::from_conf(config)
    }

    /// An SQS client of this server.
    pub fn sqs(&self) -> aws_sdk_sqs::Client {
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .endpoint_url(&self.endpoint)
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_sqs::config::Credentials::new(
                "moto", "moto", None, None, "moto",
            ))
            .http_client(shared::aws::http_client())
            .build();
        aws_sdk_sqs::Client::from_conf(config)
    }

    /// The server's URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// A Glue client of this server, over `http` (the SDK's usual client, or one that injects
    /// faults).
    pub fn glue_over(&self, http: aws_sdk_glue::config::SharedHttpClient) -> aws_sdk_glue::Client {
        let config = aws_sdk_glue::Config::builder()
            .behavior_version(aws_sdk_glue::config::BehaviorVersion::latest())
            .endpoint_url(&self.endpoint)
            .region(aws_sdk_glue::config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_glue::config::Credentials::new(
                "moto", "moto", None, None, "moto",
            ))
            .http_client(http)
            .build();
        aws_sdk_glue::Client::from_conf(config)
    }

    /// A Glue client of this server.
    pub fn glue(&self) -> aws_sdk_glue::Client {
        self.glue_over(shared::aws::http_client())
    }

    /// Creates a Glue database.
    pub async fn create_glue_database(&self, name: &str) -> anyhow::Result<()> {
        let input = aws_sdk_glue::types::DatabaseInput::builder()
            .name(name)
            .build()
            .context("DatabaseInput")?;
        self.glue()
            .create_database()
            .database_input(input)
            .send()
            .await
            .context("CreateDatabase")?;
        Ok(())
    }

    /// Creates a FIFO queue (`name` ends in `.fifo`); returns its URL.
    pub async fn create_fifo_queue(&self, name: &str) -> anyhow::Result<String> {
        self.create_queue_of(name, true).await
    }

    /// Creates a queue; returns its URL.
    pub async fn create_queue(&self, name: &str) -> anyhow::Result<String> {
        self.create_queue_of(name, false).await
    }

    async fn create_queue_of(&self, name: &str, fifo: bool) -> anyhow::Result<String> {
        let mut create = self.sqs().create_queue().queue_name(name);
        if fifo {
            create = create.attributes(aws_sdk_sqs::types::QueueAttributeName::FifoQueue, "true");
        }
        let created = create.send().await.context("CreateQueue")?;
        created
            .queue_url()
            .map(str::to_owned)
            .context("no queue URL")
    }

    /// Receives (and deletes) messages of `queue_url` until `count` have arrived or `within`
    /// has passed; the bodies.
    pub async fn receive(
        &self,
        queue_url: &str,
        count: usize,
        within: Duration,
    ) -> anyhow::Result<Vec<String>> {
        let deadline = tokio::time::Instant::now() + within;
        let mut bodies = Vec::new();
        loop {
            let answer = self
                .sqs()
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages(10)
                .send()
                .await
                .context("ReceiveMessage")?;
            for message in answer.messages() {
                bodies.extend(message.body().map(str::to_owned));
                if let Some(handle) = message.receipt_handle() {
                    self.sqs()
                        .delete_message()
                        .queue_url(queue_url)
                        .receipt_handle(handle)
                        .send()
                        .await
                        .context("DeleteMessage")?;
                }
            }
            if bodies.len() >= count || tokio::time::Instant::now() >= deadline {
                return Ok(bodies);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates a secret holding `value`; returns its ARN.
    pub async fn create_secret(&self, name: &str, value: &str) -> anyhow::Result<String> {
        let created = self
            .client()
            .create_secret()
            .name(name)
            .secret_string(value)
            .send()
            .await
            .context("CreateSecret")?;
        created.arn().map(str::to_owned).context("no ARN")
    }

    /// A rotation: `value` becomes AWSCURRENT, the version before it AWSPREVIOUS.
    pub async fn put_secret_value(&self, id: &str, value: &str) -> anyhow::Result<()> {
        self.client()
            .put_secret_value()
            .secret_id(id)
            .secret_string(value)
            .send()
            .await
            .context("PutSecretValue")?;
        Ok(())
    }

    /// Stops the server now (an outage).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.stop();
    }
}
