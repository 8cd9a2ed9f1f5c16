//! The contract between a service and the transport that runs it: what a
//! handler receives and what it promises.

use std::{fmt, future::Future};

use bytes::Bytes;

use crate::{trace::TraceContext, FailureKind, Headers, Timestamp};

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
///     trace: None,
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
    /// The trace context of the span handling it (or, when the transport
    /// records no spans, the producer's, from its `traceparent`): outgoing
    /// calls pass it on as `traceparent` and `tracestate` (see
    /// [`TraceContext::traceparent`]), so what they call joins the trace.
    pub trace: Option<TraceContext>,
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
/// ([`WindowConfig`](crate::window::WindowConfig)). Records with the same key are
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

/// What a record handler returns when it fails: a kind and a message for
/// operators (stored, truncated, in the `x-error` header).
///
/// The handler classifies its own failures; [`classify_http_status`](crate::classify_http_status) helps
/// for HTTP calls.
///
/// ```
/// use retry_core::{FailureKind, HandlerError};
///
/// let error = HandlerError::permanent("order 42 has no customer id");
/// assert_eq!((error.kind(), error.message()), (FailureKind::Permanent, "order 42 has no customer id"));
/// assert_eq!(error.to_string(), "permanent failure: order 42 has no customer id");
/// let error = HandlerError::new(FailureKind::Transient, "the database is overloaded");
/// assert_eq!(error, HandlerError::transient("the database is overloaded"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    kind: FailureKind,
    message: String,
    attached: crate::Headers,
}

impl HandlerError {
    /// A failure of the given kind.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        HandlerError { kind, message: message.into(), attached: crate::Headers::new() }
    }

    /// A failure worth retrying.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Transient, message)
    }

    /// A failure that goes straight to the dead-letter topic.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Permanent, message)
    }

    /// Whether the failure is worth retrying.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// The message for operators.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Attaches header `name` = `value` to the record from this failure on:
    /// its retry records and its dead letter carry it (replacing the
    /// record's own of that name), and so does a replay of the dead letter.
    /// For what an attempt resolved that later attempts must reuse rather
    /// than resolve again (a default currency, an idempotency key). The
    /// names of retry-core's own headers are ignored.
    ///
    /// ```
    /// use retry_core::{Decision, HandlerError, Headers, RecordMeta, RetryPolicy, RetryTopology, Stage, Timestamp};
    ///
    /// let policy = RetryPolicy::new(RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap(), Default::default());
    /// let failed = Err(HandlerError::transient("503").with_header("billing-currency", "EUR"));
    /// let none = Headers::new();
    /// let record = RecordMeta { topic: "orders", partition: 0, offset: 7, timestamp: None, headers: &none };
    /// let Decision::Retry { headers, .. } = policy.decide(Stage::SOURCE, &record, &failed, Timestamp::from_millis(0)) else {
    ///     panic!("retried")
    /// };
    /// assert_eq!(headers.get("billing-currency"), Some(&b"EUR"[..]));
    /// ```
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        let name = name.into();
        if !crate::header_names::is_retry_header(&name) {
            self.attached.insert(name, value);
        }
        self
    }

    /// The headers attached with [`with_header`](Self::with_header).
    pub fn attached_headers(&self) -> &crate::Headers {
        &self.attached
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failure: {}", self.kind, self.message)
    }
}

impl std::error::Error for HandlerError {}
