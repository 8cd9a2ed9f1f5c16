//! The rskafka client of a listener (or of the dead-letter admin), with
//! what rskafka lacks: a deadline on every call, and a replacement for a
//! connection that stopped answering.
//!
//! rskafka's requests have no deadline of their own: a broker that accepts
//! a request and never answers (a half-open connection, a hung broker)
//! holds the caller forever. Every call made through here is bounded by the
//! connection's request timeout. A partition's connection belongs to its
//! `PartitionClient`, so callers replace that client after a timeout; the
//! connection rskafka keeps for metadata is shared, so a metadata call that
//! times out replaces the whole client: later calls start on fresh
//! connections while the hung one is dropped with the last user of the old
//! client.

use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use rskafka::{
    client::{
        error::Error as RskafkaError,
        partition::{PartitionClient, UnknownTopicHandling},
        Client,
    },
    topic::Topic,
};

use super::connect;
use crate::{ClientError, ConnectionConfig, Error, Result};

/// A replaceable rskafka client with deadlines.
pub(crate) struct Cluster {
    config: ConnectionConfig,
    client: Mutex<Arc<Client>>,
    renewing: tokio::sync::Mutex<()>,
}

impl Cluster {
    /// Connects to the bootstrap brokers (within the request timeout).
    pub(crate) async fn connect(config: &ConnectionConfig) -> Result<Cluster> {
        crate::protocol::wire::check_security(config).await?;
        let client = connect(config).await?;
        Ok(Cluster { config: config.clone(), client: Mutex::new(Arc::new(client)), renewing: Default::default() })
    }

    /// The client now.
    pub(crate) fn client(&self) -> Arc<Client> {
        self.client.lock().expect("not poisoned").clone()
    }

    /// The settings it connects with.
    pub(crate) fn config(&self) -> &ConnectionConfig {
        &self.config
    }

    /// How long one call may take.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.config.request_timeout
    }

    /// Every topic and its partitions (a listing that never auto-creates).
    pub(crate) async fn list_topics(&self) -> Result<Vec<Topic>> {
        let client = self.client();
        match tokio::time::timeout(self.request_timeout(), client.list_topics()).await {
            Ok(result) => result
                .map_err(|source| Error::Client { what: "listing topics".into(), source: ClientError::new(source) }),
            Err(_) => {
                self.renew(&client).await;
                Err(Error::Deadline { what: "listing topics".into(), timeout: self.request_timeout() })
            }
        }
    }

    /// A client of `topic`/`partition`, on a connection of its own to the
    /// partition's leader.
    pub(crate) async fn partition_client(
        &self,
        topic: &str,
        partition: i32,
        unknown: UnknownTopicHandling,
    ) -> Result<PartitionClient> {
        let client = self.client();
        let what = || format!("connecting to {topic}/{partition}");
        deadline(self.request_timeout(), what, client.partition_client(topic, partition, unknown)).await
    }

    /// Refreshes rskafka's cached metadata with a listing of all topics.
    ///
    /// rskafka finds a partition's leader in its metadata cache, and when the
    /// broker it names says another leads, it errs without dropping the
    /// stale entry; until something refreshes the cache, every new attempt
    /// goes to the same wrong broker. After a leader change, a refresh ends that.
    pub(crate) async fn refresh_metadata(&self) {
        if let Err(e) = self.list_topics().await {
            tracing::debug!(error = %e, "refreshing metadata failed");
        }
    }

    /// Replaces `stale` with a new client, unless someone already did.
    async fn renew(&self, stale: &Arc<Client>) {
        let _one_at_a_time = self.renewing.lock().await;
        if !Arc::ptr_eq(&self.client(), stale) {
            return;
        }
        tracing::warn!(timeout = ?self.request_timeout(), "a metadata request got no answer; replacing the client's connections");
        match connect(&self.config).await {
            Ok(client) => *self.client.lock().expect("not poisoned") = Arc::new(client),
            Err(e) => tracing::warn!(error = %e, "cannot connect a new client yet; keeping the old one"),
        }
    }
}

/// Awaits an rskafka call within `timeout`; `what` names it in errors.
pub(crate) async fn deadline<T>(
    timeout: Duration,
    what: impl FnOnce() -> String,
    call: impl Future<Output = std::result::Result<T, RskafkaError>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(Error::Client { what: what(), source: ClientError::new(source) }),
        Err(_) => Err(Error::Deadline { what: what(), timeout }),
    }
}
