//! How the crate reaches the cluster: the connection settings
//! ([`ConnectionConfig`]), how every connection authenticates (`security`),
//! and the rskafka client with deadlines every layer above shares
//! (`cluster`, made by [`connect`]). The lowest layer but `protocol/`'s
//! framing: nothing here knows about groups, listeners or administration.

pub(crate) mod cluster;
pub(crate) mod security;

use std::time::Duration;

use rskafka::client::{Client, ClientBuilder};

use crate::{ClientError, Error, Result};
use security::Security;

/// How to reach the cluster: built by [`ConnectionConfig::new`] (or
/// [`ConnectionSettings::connection`](crate::ConnectionSettings::connection)), which check what they are given.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// `host:port` of one or more brokers (never empty).
    pub(crate) bootstrap: Vec<String>,
    /// The client id brokers see in their logs and quotas.
    pub(crate) client_id: String,
    /// How long any single request may take before the connection is
    /// considered broken (JoinGroup and SyncGroup also get the rebalance timeout).
    pub(crate) request_timeout: Duration,
    /// How every connection authenticates (PLAINTEXT by default).
    pub(crate) security: Security,
}

impl ConnectionConfig {
    /// A config for `bootstrap` (comma-separated `host:port` list) with a
    /// 30 s request timeout; fails when the list is empty or an entry is
    /// not `host:port`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use retry_kafka::ConnectionConfig;
    ///
    /// let c = ConnectionConfig::new("kafka-1:9092, kafka-2:9092", "billing")
    ///     .unwrap()
    ///     .with_request_timeout(Duration::from_secs(10))
    ///     .unwrap();
    /// assert_eq!(c.bootstrap(), ["kafka-1:9092", "kafka-2:9092"]);
    /// assert!(ConnectionConfig::new(" , ", "billing").is_err());
    /// assert!(ConnectionConfig::new("kafka-1", "billing").is_err());
    /// ```
    pub fn new(bootstrap: &str, client_id: &str) -> Result<Self> {
        let bootstrap: Vec<String> =
            bootstrap.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect();
        if bootstrap.is_empty() {
            return Err(Error::setting("bootstrap brokers", "none given (expected host:port[,host:port...])"));
        }
        for broker in &bootstrap {
            let port = broker.rsplit_once(':').map(|(host, port)| (host, port.parse::<u16>()));
            if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
                return Err(Error::setting("bootstrap brokers", format!("{broker:?} is not host:port")));
            }
        }
        Ok(ConnectionConfig {
            bootstrap,
            client_id: client_id.to_owned(),
            request_timeout: Duration::from_secs(30),
            security: Security::default(),
        })
    }

    /// The same with another request timeout; fails when it is zero.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Result<Self> {
        if timeout.is_zero() {
            return Err(Error::setting("ConnectionConfig::request_timeout", "must be positive"));
        }
        self.request_timeout = timeout;
        Ok(self)
    }

    /// The same with every request bounded by `bound` (when shorter).
    pub(crate) fn bounded(mut self, bound: Duration) -> Self {
        self.request_timeout = self.request_timeout.min(bound);
        self
    }

    /// The same with other security settings (checked when they were built).
    pub fn with_security(mut self, security: Security) -> Self {
        self.security = security;
        self
    }

    /// The bootstrap brokers, `host:port` each.
    pub fn bootstrap(&self) -> &[String] {
        &self.bootstrap
    }

    /// The client id brokers see in their logs and quotas.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// How long any single request may take before the connection is
    /// considered broken (JoinGroup and SyncGroup also get the rebalance timeout).
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// How every connection authenticates.
    pub fn security(&self) -> &Security {
        &self.security
    }
}

/// How long rskafka retries one call on its own before it hands the error
/// to our loops, which back off, refresh its metadata and decide.
const RSKAFKA_RETRY_BUDGET: Duration = Duration::from_secs(5);

/// An rskafka client whose calls give up instead of retrying forever, so
/// our loops see errors and decide.
pub(crate) async fn connect(config: &ConnectionConfig) -> Result<Client> {
    let backoff = rskafka::BackoffConfig {
        init_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(1),
        base: 2.0,
        deadline: Some(config.request_timeout.min(RSKAFKA_RETRY_BUDGET)),
    };
    let builder =
        ClientBuilder::new(config.bootstrap.clone()).client_id(config.client_id.clone()).backoff_config(backoff);
    let build = config.security.configure(builder).build();
    match tokio::time::timeout(config.request_timeout, build).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(source)) => Err(Error::Client {
            what: format!("connecting to {}", config.bootstrap.join(",")),
            source: ClientError::new(source),
        }),
        Err(_) => {
            Err(Error::Timeout { addr: config.bootstrap.join(","), api: "connect", timeout: config.request_timeout })
        }
    }
}
