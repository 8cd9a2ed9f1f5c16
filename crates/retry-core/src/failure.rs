use std::fmt;

/// Whether a failure is worth retrying.
///
/// ```
/// use retry_core::{FailureKind, HandlerError};
///
/// assert_eq!(HandlerError::transient("connection refused").kind(), FailureKind::Transient);
/// assert_eq!(HandlerError::permanent("no customer id").kind(), FailureKind::Permanent);
/// // The word written to `x-error-kind`.
/// assert_eq!(FailureKind::Permanent.as_str(), "permanent");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The same input may succeed later: timeouts, refused connections,
    /// HTTP 5xx/408/425/429, an overloaded or deadlocked database.
    Transient,
    /// Retrying cannot help: HTTP 4xx, validation errors, undecodable
    /// payloads, bugs and panics. Goes straight to the dead-letter topic.
    Permanent,
}

impl FailureKind {
    /// The header value: `transient` or `permanent`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Transient => "transient",
            FailureKind::Permanent => "permanent",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "transient" => Some(FailureKind::Transient),
            "permanent" => Some(FailureKind::Permanent),
            _ => None,
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a record handler returns when it fails: a kind and a message for
/// operators (stored, truncated, in the `x-error` header).
///
/// The handler classifies its own failures; [`classify_http_status`] helps
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

/// Classifies an HTTP response status: `None` when it is not a failure
/// (below 400), [`FailureKind::Transient`] for 408 (request timeout), 425 (too
/// early), 429 (too many requests) and every 5xx, [`FailureKind::Permanent`]
/// for the other 4xx and for codes outside 100..=599, which no retry repairs.
///
/// ```
/// use retry_core::{classify_http_status, FailureKind, HandlerError};
///
/// assert_eq!(classify_http_status(204), None);
/// assert_eq!(classify_http_status(503), Some(FailureKind::Transient));
/// assert_eq!(classify_http_status(429), Some(FailureKind::Transient));
/// assert_eq!(classify_http_status(422), Some(FailureKind::Permanent));
/// // In a handler, a failed call becomes an error of the right kind.
/// let status = 503;
/// let message = format!("the provider answered {status}");
/// let error = classify_http_status(status).map(|kind| HandlerError::new(kind, message));
/// assert_eq!(error, Some(HandlerError::transient("the provider answered 503")));
/// ```
pub fn classify_http_status(status: u16) -> Option<FailureKind> {
    match status {
        100..=399 => None,
        408 | 425 | 429 | 500..=599 => Some(FailureKind::Transient),
        _ => Some(FailureKind::Permanent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use FailureKind::*;

    #[test]
    fn http_statuses() {
        let table: &[(u16, Option<FailureKind>)] = &[
            (100, None),
            (200, None),
            (201, None),
            (204, None),
            (304, None),
            (399, None),
            (400, Some(Permanent)),
            (401, Some(Permanent)),
            (403, Some(Permanent)),
            (404, Some(Permanent)),
            (408, Some(Transient)),
            (409, Some(Permanent)),
            (422, Some(Permanent)),
            (425, Some(Transient)),
            (429, Some(Transient)),
            (499, Some(Permanent)),
            (500, Some(Transient)),
            (502, Some(Transient)),
            (503, Some(Transient)),
            (504, Some(Transient)),
            (599, Some(Transient)),
            (0, Some(Permanent)),
            (99, Some(Permanent)),
            (600, Some(Permanent)),
            (u16::MAX, Some(Permanent)),
        ];
        for &(status, expected) in table {
            assert_eq!(classify_http_status(status), expected, "status {status}");
        }
    }

    #[test]
    fn kinds_round_trip_through_their_header_words() {
        for kind in [Transient, Permanent] {
            assert_eq!(FailureKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(FailureKind::parse("Transient"), None);
        assert_eq!(HandlerError::transient("503").to_string(), "transient failure: 503");
    }
}
