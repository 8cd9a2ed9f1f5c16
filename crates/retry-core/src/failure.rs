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
        assert_eq!(crate::HandlerError::transient("503").to_string(), "transient failure: 503");
    }
}
