//! The Kafka wire protocol where rskafka does not speak it, through the
//! `kafka-protocol` crate: one framed connection with version negotiation
//! (`wire`), the classic consumer-group protocol (`group`) and its wire
//! formats and range assignor (`assignor`), topic creation with configs
//! (`create_topics`), partition leaders (`metadata`), and the data path:
//! record batches read and written by us (`batch`, pure), fetching with
//! transactions filtered (`fetch`), and idempotent produce (`produce`).
//!
//! This is the only module that names `kafka_protocol` (`cargo xtask ci`
//! checks): the rest of the crate speaks in our own types, and the broker's
//! error codes as [`ResponseError`], re-exported here.

pub(crate) mod assignor;
pub(crate) mod batch;
pub(crate) mod create_topics;
pub(crate) mod fetch;
pub(crate) mod group;
pub(crate) mod metadata;
pub(crate) mod produce;
pub(crate) mod wire;

pub(crate) use create_topics::create_topics;
pub use kafka_protocol::ResponseError;
