use std::fmt;

/// The result type of this crate.
///
/// ```
/// use std::time::Duration;
/// use retry_core::{backoff::BackoffConfig, Result};
///
/// /// The pauses of a service whose longest one is a setting.
/// fn backoff(max_secs: u64) -> Result<BackoffConfig> {
///     BackoffConfig::new(Duration::from_secs(1), Duration::from_secs(max_secs))
/// }
/// assert!(backoff(30).is_ok());
/// assert!(backoff(0).is_err());
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `retry-core`: invalid configuration
/// (schedules, topic names) and headers that cannot be decoded.
///
/// Messages are meant for operators: they name the offending input and,
/// where there is one, the fix.
///
/// ```
/// use retry_core::{Error, RetrySchedule};
///
/// let error = "5s,5000ms".parse::<RetrySchedule>().unwrap_err();
/// assert!(matches!(error, Error::InvalidSchedule { .. }));
/// assert_eq!(error.to_string(), r#"invalid retry schedule "5s,5000ms": delay 2 (5s) repeats delay 1"#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A retry schedule string or list of delays was rejected.
    #[error("invalid retry schedule {input:?}: {reason}")]
    InvalidSchedule {
        /// The schedule as given.
        input: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A duration (`5s`, `1500ms`, `2h`) was rejected.
    #[error("invalid duration {input:?}: {reason}")]
    InvalidDuration {
        /// The duration as given.
        input: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A topic name, given or derived, breaks Kafka's naming rules.
    #[error("invalid topic name {name:?}: {reason}")]
    InvalidTopicName {
        /// The offending name (possibly truncated for display by the caller).
        name: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A consumer group id cannot derive the ladder's groups.
    #[error("invalid group id {group_id:?}: {reason}")]
    InvalidGroupId {
        /// The offending id (at most its first 64 characters).
        group_id: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// An in-flight window was misconfigured or misused.
    #[error("in-flight window: {0}")]
    InvalidWindow(String),
    /// An outage brake setting was rejected.
    #[error("invalid brake: {0}")]
    InvalidBrake(String),
    /// A backoff schedule was rejected.
    #[error("invalid backoff: {0}")]
    InvalidBackoff(String),
    /// One of our retry headers is missing or malformed.
    #[error("retry header {header} {problem}")]
    CorruptHeader {
        /// The header's name, e.g. `x-retry-attempt`.
        header: &'static str,
        /// What is wrong with it.
        problem: HeaderProblem,
    },
}

/// What is wrong with a retry header; part of [`Error::CorruptHeader`].
///
/// ```
/// use retry_core::{Error, HeaderProblem, Headers, RetryHeaders};
///
/// let mut headers = Headers::new();
/// headers.insert("x-retry-attempt", "two");
/// let error = RetryHeaders::decode(&headers).unwrap_err();
/// let problem = HeaderProblem::NotANumber("two".to_owned());
/// assert_eq!(error, Error::CorruptHeader { header: "x-retry-attempt", problem });
/// assert_eq!(error.to_string(), r#"retry header x-retry-attempt is not a number in range: "two""#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderProblem {
    /// The header is absent but required at this stage.
    Missing,
    /// The value is not valid UTF-8.
    NotUtf8,
    /// The value is not a decimal integer in range.
    NotANumber(String),
    /// The value is a negative number where only non-negative ones make sense.
    Negative(String),
    /// The value is not one of the known words (e.g. an unknown error kind).
    UnknownValue(String),
    /// A binary value (as Spring Kafka writes some) of the wrong length.
    Length {
        /// How many bytes it takes (at most, for a variable length).
        expected: usize,
        /// How many it has.
        found: usize,
    },
    /// The value contradicts the topic the record was read from.
    Mismatch {
        /// The value the topic implies.
        expected: String,
        /// The value found in the header.
        found: String,
    },
}

impl fmt::Display for HeaderProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderProblem::Missing => f.write_str("is missing"),
            HeaderProblem::NotUtf8 => f.write_str("is not valid UTF-8"),
            HeaderProblem::NotANumber(v) => write!(f, "is not a number in range: {v:?}"),
            HeaderProblem::Negative(v) => write!(f, "is negative: {v:?}"),
            HeaderProblem::UnknownValue(v) => write!(f, "has an unknown value: {v:?}"),
            HeaderProblem::Length { expected, found } => {
                write!(f, "is {found} bytes long where {expected} are expected")
            }
            HeaderProblem::Mismatch { expected, found } => {
                write!(f, "is {found:?} but the topic implies {expected:?}")
            }
        }
    }
}
