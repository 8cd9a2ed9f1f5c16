//! `billing` is the billing domain of the example service: it decodes and
//! validates the [`OrderConfirmedEvent`]s the order service publishes, and
//! [`ChargeHandler`] charges each confirmed order through the billing
//! provider's HTTP API, with the event's id as idempotency key so that a
//! redelivered or replayed event never charges twice.
//!
//! - [`OrderConfirmedEvent::from_json`] decodes and validates a payload, or
//!   says precisely what is wrong with it ([`InvalidEvent`]).
//! - [`ChargeHandler`] is the [`RecordHandler`](retry_kafka::RecordHandler):
//!   `POST <base_url>/charges` under the [`ChargeRules`] (currencies,
//!   maximum amount), a confirmation of every 409 with the provider, and a
//!   classification of every failure as transient (retry later) or
//!   permanent (dead-letter).
//!
//! It is the only crate that knows the billing provider: its URL, its
//! request format and what its answers mean (which failures are worth
//! retrying). It must never know more of Kafka than the
//! [`RecordHandler`](retry_kafka::RecordHandler) trait it implements:
//! topics, retries and dead-lettering are `retry-kafka`'s and `retry-core`'s
//! business, and wiring and configuration are `billing-bin`'s.
//!
//! ```no_run
//! use std::time::Duration;
//! use billing::{ChargeHandler, ChargeRules, ProviderConfig};
//!
//! # fn run() -> billing::Result<()> {
//! let provider = ProviderConfig {
//!     base_url: "https://billing.example.com/v1".to_owned(), // charges go to .../v1/charges
//!     timeout: Duration::from_secs(10),
//!     idle_connections: 64, // charges at once
//! };
//! let handler = ChargeHandler::new(provider, ChargeRules::default())?; // EUR, at most 10,000
//!
//! // Hand `handler` to `retry_kafka::Listener::start`.
//! # Ok(())
//! # }
//! ```

mod charge;
mod currency;
mod error;
mod event;

pub use charge::{ChargeHandler, ChargeOutcome, ProviderConfig, MAX_ERROR_BODY_BYTES};
pub use currency::{ChargeRules, Currency, MaxAmount, Money, RuleBroken};
pub use error::{Error, Result};
pub use event::{InvalidEvent, OrderConfirmedEvent};

/// `text` without surrounding whitespace, cut to at most `max_bytes` on a
/// char boundary, with `…` appended when something was cut: for quoting
/// untrusted input in messages that end up in logs and Kafka headers.
pub(crate) fn excerpt(text: &str, max_bytes: usize) -> String {
    let text = text.trim();
    if text.len() <= max_bytes {
        return text.to_owned();
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}
