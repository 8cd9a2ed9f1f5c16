//! The contract between a service and the transport that runs it: what a
//! handler receives and what it promises.

use std::future::Future;

use bytes::Bytes;

use crate::{HandlerError, Headers, Timestamp};

/// A record as the handler sees it.
///
/// ```
/// use bytes::Bytes;
/// use retry_core::{ConsumedRecord, Headers, Stage};
///
/// let record = ConsumedRecord {
///     topic: "orders.confirmed.retry-5s".to_owned(),
///     partition: 0,
///     offset: 7,
///     key: Some(Bytes::from_static(b"order-1")),
///     value: Some(Bytes::from_static(br#"{"order_id":"order-1"}"#)),
///     headers: Headers::default(),
///     timestamp: None,
///     attempt: Stage::SOURCE.attempt(),
/// };
/// assert_eq!(record.value_str(), Some(r#"{"order_id":"order-1"}"#));
/// ```
#[derive(Debug, Clone)]
pub struct ConsumedRecord {
    /// The topic it was read from (the source or a retry topic).
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its key.
    pub key: Option<Bytes>,
    /// Its value.
    pub value: Option<Bytes>,
    /// Its headers, the producer's and the ladder's.
    pub headers: Headers,
    /// Its timestamp, if it has one.
    pub timestamp: Option<Timestamp>,
    /// Which attempt this is: [`Stage::attempt`](crate::Stage::attempt) of the topic it was read
    /// from (1 on the source topic, 2 on the first rung...).
    pub attempt: u32,
}

impl ConsumedRecord {
    /// The value as UTF-8 text, if there is one and it is text.
    pub fn value_str(&self) -> Option<&str> {
        self.value.as_deref().and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// What the transport runs for each record.
///
/// Return `Ok(())` when the record is done, [`HandlerError::transient`] when
/// a later attempt may succeed, [`HandlerError::permanent`] when none can.
/// A handler that panics is treated as a permanent failure; one that takes
/// longer than the configured timeout as a transient one.
///
/// Calls run concurrently: records of different partitions, and records of
/// one partition with different keys, up to the in-flight window
/// ([`WindowConfig`](crate::WindowConfig)). Records with the same key are
/// handled one after another, in offset order.
///
/// Retried and replayed records are delivered again: handlers must be idempotent.
///
/// A call can be cancelled: when it outlives the handler timeout, and when
/// its partition is taken away (a rebalance, a shutdown) and the call
/// outlives the grace period. The future is then dropped at its next await
/// point, never resumed, and the record is treated as not handled (retried,
/// or redelivered to the partition's next owner). Side effects must
/// therefore be safe to repeat, as they already must be for redeliveries.
///
/// ```
/// use retry_core::{ConsumedRecord, HandlerError, RecordHandler};
///
/// /// Accepts records whose value is text, dead-letters the others.
/// struct TextOnly;
///
/// impl RecordHandler for TextOnly {
///     async fn handle(&self, record: ConsumedRecord) -> Result<(), HandlerError> {
///         match record.value_str() {
///             Some(_) => Ok(()),
///             None => Err(HandlerError::permanent("the value is not UTF-8 text")),
///         }
///     }
/// }
/// # fn is_handler<H: RecordHandler>(_: H) {}
/// # is_handler(TextOnly);
/// ```
pub trait RecordHandler: Send + Sync + 'static {
    /// Handles one record.
    fn handle(&self, record: ConsumedRecord) -> impl Future<Output = Result<(), HandlerError>> + Send;
}
