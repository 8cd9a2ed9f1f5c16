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
//! Pure Rust: records are fetched and produced with our own record-batch
//! codec (every codec, headers as written, transactions, an idempotent
//! producer) over `kafka-protocol`, as are consumer groups and offset
//! commits; `rskafka` lists topics and reads partition offsets.
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

/// The decoders that read bytes other programs wrote, for fuzz targets
/// (feature `fuzzing`, tests only; not part of the API).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::protocol::batch::fuzzing::{checksummed_batch, record_batches, Decoded};

    /// A group member's subscription (its topics), as other members wrote it.
    pub fn group_subscription(bytes: &[u8]) -> Result<Vec<String>, String> {
        crate::protocol::assignor::decode_subscription(bytes).map(|s| s.topics)
    }

    /// The assignment a group's leader wrote (topic and partitions).
    pub fn group_assignment(bytes: &[u8]) -> Result<Vec<(String, Vec<i32>)>, String> {
        crate::protocol::assignor::decode_assignment(bytes).map(|a| a.into_iter().collect())
    }
}

mod admin;
mod backoff;
mod connection;
mod consumer;
mod error;
mod metrics;
mod preflight;
mod protocol;
mod publisher;
mod session;
mod stats;
mod telemetry;

pub use admin::{
    dead_letters::{
        Acknowledgement, BrowsePage, DeadLetter, DeadLetterAdmin, DeadLetterStatus, PartitionReplay, PartitionStatus,
        ReplayReport, ReplayRequest, SkippedRecord, MAX_SKIPPED_SHOWN,
    },
    lag::{PartitionLag, TopicLag},
    offsets::{GroupOffsets, GroupState},
    records::{read_partition, WrittenRecord},
    topics::{Created, CreatedTopic, TopicPlan, TopicRole, TopicSpec},
};
pub use connection::security::{
    ConnectionSettings, SaslCredentials, SaslMechanism, Secret, Security, SecurityProtocol, TlsSettings,
};
pub use connection::ConnectionConfig;
pub use consumer::{
    brake::{BrakeStatus, Engagement},
    config::{AssignmentStrategy, GroupProtocol, HandlerCalls, ListenerConfig, OffsetReset},
    listener::{BrakeView, Listener, Readiness},
};
pub use error::{BrokerError, ClientError, Error, Result, TlsFile, TopicProblem, TopicProblems};
pub use metrics::MetricsExposition;
pub use preflight::{contact_brokers, BrokerContact, Found, RequestSupport};
/// The handler contract, defined in [`retry_core`] so that a service's
/// domain code needs no transport.
#[doc(no_inline)]
pub use retry_core::{ConsumedRecord, RecordHandler};
pub use stats::{ListenerStats, StatsSnapshot};
pub use telemetry::Tracing;

/// A partition of a topic.
///
/// ```
/// use retry_kafka::TopicPartition;
///
/// let tp = TopicPartition::new("orders.confirmed", 2);
/// assert_eq!(tp.to_string(), "orders.confirmed[2]");
/// assert!(tp < TopicPartition::new("orders.confirmed", 10));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    /// The topic's name.
    pub topic: String,
    /// The partition's index.
    pub partition: i32,
}

impl TopicPartition {
    /// Partition `partition` of `topic`.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        TopicPartition { topic: topic.into(), partition }
    }
}

impl std::fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.topic, self.partition)
    }
}

/// Which records of transactional producers a listener reads (Kafka's
/// `isolation.level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsolationLevel {
    /// Only records of committed transactions (and of producers without
    /// transactions); records of aborted transactions never reach the
    /// handler, and a partition is read up to its last stable offset.
    #[default]
    ReadCommitted,
    /// Every record, committed, aborted or still open.
    ReadUncommitted,
}

impl std::str::FromStr for IsolationLevel {
    type Err = Error;

    /// `read_committed` or `read_uncommitted`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "read_committed" => Ok(IsolationLevel::ReadCommitted),
            "read_uncommitted" => Ok(IsolationLevel::ReadUncommitted),
            other => Err(Error::setting(
                "ListenerConfig::isolation_level",
                format!("{other:?} is neither read_committed nor read_uncommitted"),
            )),
        }
    }
}

/// How records republished to retry and dead-letter topics are compressed.
///
/// ```
/// use retry_kafka::Compression;
///
/// assert_eq!("zstd".parse::<Compression>().unwrap(), Compression::Zstd);
/// assert_eq!("as-source".parse::<Compression>().unwrap(), Compression::AsSource);
/// assert!("brotli".parse::<Compression>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// As the batch the record was read in; lz4 when it was not compressed.
    #[default]
    AsSource,
    /// Not compressed.
    None,
    /// gzip.
    Gzip,
    /// snappy.
    Snappy,
    /// lz4.
    Lz4,
    /// zstd.
    Zstd,
}

impl Compression {
    /// The codec of a republication of a record read in a batch of `source`.
    pub(crate) fn codec_for(self, source: protocol::batch::Codec) -> protocol::batch::Codec {
        use protocol::batch::Codec;
        match self {
            Compression::AsSource if source == Codec::None => Codec::Lz4,
            Compression::AsSource => source,
            Compression::None => Codec::None,
            Compression::Gzip => Codec::Gzip,
            Compression::Snappy => Codec::Snappy,
            Compression::Lz4 => Codec::Lz4,
            Compression::Zstd => Codec::Zstd,
        }
    }
}

impl std::str::FromStr for Compression {
    type Err = Error;

    /// `as-source`, `none`, `gzip`, `snappy`, `lz4` or `zstd`.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "as-source" => Compression::AsSource,
            "none" => Compression::None,
            "gzip" => Compression::Gzip,
            "snappy" => Compression::Snappy,
            "lz4" => Compression::Lz4,
            "zstd" => Compression::Zstd,
            other => {
                return Err(Error::setting(
                    "ListenerConfig::publish_compression",
                    format!("{other:?} is none of as-source, none, gzip, snappy, lz4, zstd"),
                ))
            }
        })
    }
}
