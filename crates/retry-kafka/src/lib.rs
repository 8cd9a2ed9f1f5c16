//! `retry-kafka` runs a record handler on Kafka with non-blocking retry
//! topics: it consumes the source topic and every retry rung in consumer
//! groups, hands each record to the handler, executes `retry-core`'s
//! decision (commit, republish to the next rung, or dead-letter) and commits
//! a record's offset only after the broker acknowledged its republication.
//!
//! It is a thin shell: every decision about attempts, delays, names and
//! headers comes from [`retry_core`]. It never auto-creates topics: create
//! them with [`TopicPlan::create`] and check them with [`TopicPlan::verify`].
//!
//! Pure Rust: produce and fetch go through `rskafka`; consumer groups and
//! offset commits, which rskafka lacks, through `kafka-protocol`.
//!
//! ```no_run
//! use std::sync::Arc;
//! use retry_core::{ConsumedRecord, HandlerError, RecordHandler, RetryPolicy, RetryTopology};
//! use retry_kafka::{ConnectionConfig, Listener, ListenerConfig, TopicPlan};
//!
//! struct Charge;
//!
//! impl RecordHandler for Charge {
//!     async fn handle(&self, record: ConsumedRecord) -> Result<(), HandlerError> {
//!         // Call the fragile thing; classify what went wrong.
//!         Err(HandlerError::transient("billing provider answered 503"))
//!     }
//! }
//!
//! # async fn run() -> retry_kafka::Result<()> {
//! let connection = ConnectionConfig::new("127.0.0.1:9092", "billing")?;
//! let topology = RetryTopology::new("orders.confirmed", &"5s,30s,5m".parse()?)?;
//! // Once, explicitly (an admin command): topics are never auto-created.
//! TopicPlan::new(topology.clone(), 3).create(&connection, true).await?;
//!
//! let policy = RetryPolicy::new(topology, Default::default());
//! let config = ListenerConfig::new(connection, "billing", policy)?;
//! let listener = Listener::start(config, Arc::new(Charge)).await?; // verifies the topics
//! // ... until SIGTERM:
//! listener.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod admin;
mod backoff;
mod cluster;
mod consumer;
mod error;
mod metrics;
mod protocol;
mod publisher;
mod security;
mod stats;

use std::time::Duration;

pub use admin::{
    dead_letters::{
        Acknowledgement, BrowsePage, DeadLetter, DeadLetterAdmin, DeadLetterStatus, PartitionReplay, PartitionStatus,
        ReplayReport, ReplayRequest, SkippedRecord, MAX_SKIPPED_SHOWN,
    },
    offsets::GroupOffsets,
    topics::{Created, TopicPlan, TopicProblem, TopicProblems, TopicRole, TopicSpec},
};
pub use consumer::listener::{Listener, ListenerConfig, OffsetReset, Readiness};
pub use error::{Error, Result};
pub use protocol::{group::TopicPartition, ResponseError};
/// The handler contract, defined in [`retry_core`] so that a service's
/// domain code needs no transport.
#[doc(no_inline)]
pub use retry_core::{ConsumedRecord, RecordHandler};
pub use security::{SaslCredentials, SaslMechanism, Secret, Security, SecurityProtocol, TlsFile, TlsSettings};
pub use stats::{ListenerStats, StatsSnapshot};

/// How to reach the cluster.
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// `host:port` of one or more brokers (never empty).
    pub bootstrap: Vec<String>,
    /// The client id brokers see in their logs and quotas.
    pub client_id: String,
    /// How long any single request may take before the connection is
    /// considered broken (JoinGroup and SyncGroup also get the rebalance timeout).
    pub request_timeout: Duration,
    /// How every connection authenticates (PLAINTEXT by default).
    pub security: Security,
}

impl ConnectionConfig {
    /// A config for `bootstrap` (comma-separated `host:port` list) with a
    /// 30 s request timeout; fails when the list is empty.
    pub fn new(bootstrap: &str, client_id: &str) -> Result<Self> {
        let bootstrap: Vec<String> =
            bootstrap.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect();
        if bootstrap.is_empty() {
            return Err(Error::Config("no bootstrap broker given (expected host:port[,host:port...])".into()));
        }
        Ok(ConnectionConfig {
            bootstrap,
            client_id: client_id.to_owned(),
            request_timeout: Duration::from_secs(30),
            security: Security::default(),
        })
    }
}
