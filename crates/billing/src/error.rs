use std::time::Duration;

use retry_core::{FailureKind, HandlerError};

use crate::{InvalidEvent, RuleBroken};

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in billing: a bad configuration, a bad event, or a
/// charge the provider did not confirm.
///
/// [`Error::failure_kind`] says whether retrying may help; converted into a
/// [`HandlerError`], an error carries that kind and its message with all its
/// causes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The event cannot be decoded or breaks a rule: no retry can repair it.
    #[error("invalid order-confirmed event")]
    InvalidEvent(#[from] InvalidEvent),

    /// [`ProviderConfig::base_url`](crate::ProviderConfig::base_url) is not a
    /// usable base URL.
    #[error(
        "invalid billing provider URL {url:?} ({reason}): expected an http or https base URL such as https://billing.example.com/v1"
    )]
    InvalidProviderUrl {
        /// The URL as given, without credentials.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// [`ProviderConfig::timeout`](crate::ProviderConfig::timeout) is zero.
    #[error("invalid billing provider timeout: it must be longer than zero")]
    ZeroTimeout,

    /// The HTTP client could not be built (its TLS set-up failed).
    #[error("cannot build the HTTP client for the billing provider")]
    HttpClient(#[source] reqwest::Error),

    /// The provider answered with a status that does not confirm the charge.
    #[error("billing provider answered {}{}", status_line(*status), body_suffix(body))]
    ProviderAnswered {
        /// The HTTP status code.
        status: u16,
        /// What the status means for a retry: see [`retry_core::classify_http_status`].
        kind: FailureKind,
        /// The start of the provider's answer (at most
        /// [`MAX_ERROR_BODY_BYTES`](crate::MAX_ERROR_BODY_BYTES)), for operators.
        body: String,
    },

    /// The event breaks a business rule ([`ChargeRules`](crate::ChargeRules)).
    #[error(transparent)]
    RuleBroken(#[from] RuleBroken),

    /// After a 409, the provider says its charge under the event's
    /// idempotency key is still being processed.
    #[error("billing provider is still processing an earlier charge under idempotency key {key}: retry later")]
    ChargePending {
        /// The idempotency key (the order id).
        key: String,
    },

    /// After a 409, the provider says its charge under the event's
    /// idempotency key failed: a retry charges anew.
    #[error("an earlier charge under idempotency key {key} failed at the billing provider: retry to charge again")]
    EarlierChargeFailed {
        /// The idempotency key (the order id).
        key: String,
    },

    /// After a 409, the provider's charge under the idempotency key is for
    /// another order, customer, amount or currency: the order was confirmed
    /// again with other terms (or its key reused), which a person must look at.
    #[error("idempotency key {key} is already charged at the billing provider for other terms ({theirs}) than this event's ({ours}): not charged again")]
    KeyReused {
        /// The idempotency key (the order id).
        key: String,
        /// The provider's charge under it.
        theirs: String,
        /// This event's.
        ours: String,
    },

    /// A header an earlier attempt wrote (its idempotency key, its
    /// currency) cannot be read, or names a key that is not this order's:
    /// charging under another key or currency could charge twice.
    #[error("the record's {header} header {value:?} cannot be used: not charged, since a key that is not this order's, or another key or currency than its first attempt's, could charge twice")]
    BadCarriedHeader {
        /// The header.
        header: &'static str,
        /// The start of its value.
        value: String,
    },

    /// After a 409, the provider does not know the idempotency key.
    #[error("billing provider refused the charge as a conflict but does not know idempotency key {key}: retry later")]
    UnknownKey {
        /// The idempotency key (the order id).
        key: String,
    },

    /// After a 409, asking the provider about the key failed.
    #[error("billing provider answered {} when asked about idempotency key {key} after a 409{}", status_line(*status), body_suffix(body))]
    ConfirmationAnswered {
        /// The idempotency key (the order id).
        key: String,
        /// The HTTP status code of the `GET`.
        status: u16,
        /// What the status means for a retry.
        kind: FailureKind,
        /// The start of the answer.
        body: String,
    },

    /// After a 409, the provider's answer about the key is not a charge
    /// status as the contract has it.
    #[error("billing provider's answer about idempotency key {key} is not a charge status: {reason}")]
    UnreadableConfirmation {
        /// The idempotency key (the order id).
        key: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The provider did not answer within the configured timeout.
    #[error("billing provider timed out after {timeout:?} ({method} {url})")]
    Timeout {
        /// The request's method.
        method: &'static str,
        /// Where the request was sent.
        url: String,
        /// The configured timeout.
        timeout: Duration,
    },

    /// No connection to the provider could be made.
    #[error("cannot reach the billing provider at {url}")]
    Unreachable {
        /// Where the charge was sent.
        url: String,
        /// Why the connection failed.
        #[source]
        source: reqwest::Error,
    },

    /// The request failed after the connection was made, e.g. it was reset.
    #[error("charge request to the billing provider at {url} failed")]
    Request {
        /// Where the charge was sent.
        url: String,
        /// Why it failed.
        #[source]
        source: reqwest::Error,
    },
}

impl Error {
    /// Whether a later attempt may succeed: timeouts, unreachable providers,
    /// failed requests, 408, 425, 429 and 5xx answers, and a charge the
    /// provider still processes or that failed under the key, are transient;
    /// everything else (invalid events, broken rules, 4xx answers, a key
    /// used by another charge) is permanent.
    pub fn failure_kind(&self) -> FailureKind {
        match self {
            Error::ProviderAnswered { kind, .. } | Error::ConfirmationAnswered { kind, .. } => *kind,
            Error::Timeout { .. }
            | Error::Unreachable { .. }
            | Error::ChargePending { .. }
            | Error::EarlierChargeFailed { .. }
            | Error::UnknownKey { .. } => FailureKind::Transient,
            // A request that could not even be built fails the same way next time.
            Error::Request { source, .. } if source.is_builder() => FailureKind::Permanent,
            Error::Request { .. } => FailureKind::Transient,
            Error::InvalidEvent(_)
            | Error::RuleBroken(_)
            | Error::KeyReused { .. }
            | Error::BadCarriedHeader { .. }
            | Error::UnreadableConfirmation { .. }
            | Error::InvalidProviderUrl { .. }
            | Error::ZeroTimeout
            | Error::HttpClient(_) => FailureKind::Permanent,
        }
    }

    /// The message with its chain of causes, which `Display` leaves to
    /// error reporters: the `x-error` header has no reporter.
    pub(crate) fn with_causes(&self) -> String {
        let mut message = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(error) = cause {
            message.push_str(": ");
            message.push_str(&error.to_string());
            cause = error.source();
        }
        message
    }
}

impl From<Error> for HandlerError {
    fn from(error: Error) -> Self {
        HandlerError::new(error.failure_kind(), error.with_causes())
    }
}

fn status_line(status: u16) -> String {
    let reason = reqwest::StatusCode::from_u16(status).ok().and_then(|status| status.canonical_reason());
    match reason {
        Some(reason) => format!("{status} {reason}"),
        None => status.to_string(),
    }
}

fn body_suffix(body: &str) -> String {
    if body.is_empty() {
        String::new()
    } else {
        format!(": {body}")
    }
}
