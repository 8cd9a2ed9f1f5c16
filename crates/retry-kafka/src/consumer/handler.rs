use std::future::Future;

use bytes::Bytes;
use retry_core::{HandlerError, Headers, Timestamp};

/// A record as the handler sees it.
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
    /// Which attempt this is: 1 on the source topic, 2 on the first rung...
    pub attempt: u32,
}

/// What the listener runs for each record.
///
/// Return `Ok(())` when the record is done, [`HandlerError::transient`] when
/// a later attempt may succeed, [`HandlerError::permanent`] when none can.
/// A handler that panics is treated as a permanent failure; one that takes
/// longer than the configured timeout as a transient one. Records of one
/// partition are handled one at a time, in order; partitions concurrently.
///
/// Retried and replayed records are delivered again: handlers must be idempotent.
///
/// A call can be cancelled: when it outlives the handler timeout, and when
/// its partition is taken away (a rebalance, a shutdown) and the call
/// outlives the grace period. The future is then dropped at its next await
/// point, never resumed, and the record is treated as not handled (retried,
/// or redelivered to the partition's next owner). A listener's
/// [`shutdown`](crate::Listener::shutdown) returns only once every call has
/// ended. Side effects must therefore be safe to repeat, as they already
/// must be for redeliveries.
pub trait RecordHandler: Send + Sync + 'static {
    /// Handles one record.
    fn handle(&self, record: ConsumedRecord) -> impl Future<Output = Result<(), HandlerError>> + Send;
}
