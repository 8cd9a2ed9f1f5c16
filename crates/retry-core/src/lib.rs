//! `retry-core` decides what happens to a Kafka record whose handler failed,
//! for the retry-topic pattern: `orders` -> `orders.retry-5s` -> `orders.retry-30s`
//! -> ... -> `orders.dlq`. It is also all that a service's domain code needs:
//! the handler contract ([`RecordHandler`], [`ConsumedRecord`],
//! [`HandlerError`]) lives here, so a domain crate builds and tests without
//! any Kafka client.
//!
//! Its dependencies say what it is: `bytes` (record keys and values, shared
//! without a copy) and `thiserror` (its error enum). No runtime: the handler
//! trait returns a `Send` future from `std`, which any executor can drive.
//!
//! It is sans-IO: it never reads a clock, opens a socket or spawns a task. The
//! caller passes the record's metadata, the handler's outcome and `now`, and
//! gets back a [`Decision`]: commit, republish to a retry topic at a due time,
//! or dead-letter with a reason. The transport (for example `retry-kafka`)
//! executes decisions; everything about attempts, delays, topic names and
//! headers is decided, and tested, here.
//!
//! What a service author needs is at the root:
//! - [`RecordHandler`], [`ConsumedRecord`], [`HandlerError`], [`FailureKind`],
//!   [`classify_http_status`]: what a service implements, receives and
//!   returns, and what is worth retrying.
//! - [`RetrySchedule`]: the ladder's delays, parsed from `"5s,30s,5m"`.
//! - [`RetryTopology`]: the topic names derived from a source topic and a schedule.
//! - [`RetryPolicy`], [`PolicyConfig`], [`Decision`], [`Stage`]: the
//!   decision function and the due time of a retry record.
//! - [`Headers`], [`RetryHeaders`], [`header_names`]: the headers carried
//!   along the ladder, and [`DeadLetterReason`].
//!
//! The machinery a transport runs lives in modules named for what it is:
//! - [`window`]: which records of a partition may be handled concurrently
//!   (per-key order) and how far the partition may be committed.
//! - [`brake`]: the outage brake, which stops feeding the ladder while most
//!   calls fail transiently, and holds exhausted records back from the
//!   dead-letter topic meanwhile.
//! - [`replay`]: replays from the dead-letter topic, their targets and guards.
//! - [`operators`]: where operators stand on a dead-letter partition, and
//!   which records a replay selects.
//! - [`groups`]: the consumer groups of a ladder.
//! - [`backoff`]: the pauses between attempts retried in place
//!   (reconnecting, publishing again, rejoining), with injected jitter.
//! - [`spring`]: Spring Kafka's retry and dead-letter headers, read where
//!   ours are absent.
//! - [`trace`]: W3C trace context (`traceparent`, `tracestate`) carried
//!   along the ladder.
//!
//! ```
//! use retry_core::{
//!     Decision, HandlerError, Headers, RecordMeta, RetryPolicy, RetrySchedule, RetryTopology,
//!     Stage, Timestamp,
//! };
//!
//! let schedule: RetrySchedule = "5s,30s,5m".parse().unwrap();
//! let topology = RetryTopology::new("orders.confirmed", &schedule).unwrap();
//! let policy = RetryPolicy::new(topology, Default::default());
//!
//! let headers = Headers::default();
//! let record = RecordMeta {
//!     topic: "orders.confirmed",
//!     partition: 0,
//!     offset: 42,
//!     timestamp: Some(Timestamp::from_millis(1_000)),
//!     headers: &headers,
//! };
//! let now = Timestamp::from_millis(2_000);
//! let outcome = Err(HandlerError::transient("billing provider answered 503"));
//! match policy.decide(Stage::SOURCE, &record, &outcome, now) {
//!     Decision::Retry { topic, due_at, .. } => {
//!         assert_eq!(topic.as_str(), "orders.confirmed.retry-5s");
//!         assert_eq!(due_at, Timestamp::from_millis(7_000));
//!     }
//!     other => panic!("unexpected {other:?}"),
//! }
//! ```

pub mod backoff;
pub mod brake;
mod decision;
mod error;
mod failure;
pub mod groups;
mod handler;
mod headers;
pub mod history;
pub mod operators;
pub mod pause;
pub mod replay;
mod schedule;
pub mod spring;
mod time;
mod topic;
pub mod trace;
pub mod window;

pub use decision::{Decision, PolicyConfig, RecordMeta, RetryPolicy, Stage};
pub use error::{Error, HeaderProblem, Result};
pub use failure::{classify_http_status, FailureKind};
pub use handler::{ConsumedRecord, HandlerError, RecordHandler};
pub use headers::{header_names, DeadLetterReason, HeaderStyle, Headers, RetryHeaders, MAX_ERROR_BYTES};
pub use schedule::{parse_duration, RetrySchedule, Rung, MAX_DELAY, MAX_RUNGS};
pub use time::Timestamp;
pub use topic::{RetryTopology, TopicName, MAX_TOPIC_NAME_BYTES};
