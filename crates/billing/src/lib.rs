//! `billing` is the billing domain of the example service: it decodes and
//! validates the [`OrderConfirmedEvent`]s the order service publishes, and
//! [`ChargeHandler`] charges each confirmed order through the billing
//! provider's HTTP API, with the event's id as idempotency key so that a
//! redelivered or replayed event never charges twice.
//!
//! - [`OrderConfirmedEvent::from_json`] decodes and validates a payload, or
//!   says precisely what is wrong with it ([`InvalidEvent`]).
//! - [`ChargeHandler`] is the [`RecordHandler`](retry_core::RecordHandler):
//!   `POST <base_url>/charges` under the [`ChargeRules`] (currencies,
//!   maximum amount), a confirmation of every 409 with the provider, and a
//!   classification of every failure as transient (retry later) or
//!   permanent (dead-letter).
//!
//! It is the only crate that knows the billing provider: its URL, its
//! request format and what its answers mean (which failures are worth
//! retrying). It depends on `retry-core` alone, never on the Kafka
//! transport: it knows the [`RecordHandler`](retry_core::RecordHandler)
//! contract it implements and the failure classification, while topics,
//! retries and dead-lettering are `retry-kafka`'s and `retry-core`'s
//! business, and wiring and configuration are `billing-bin`'s. `cargo xtask
//! ci` checks that its dependency graph holds no Kafka client.
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

pub use charge::{
    ChargeHandler, ChargeOutcome, ProviderAnswer, ProviderConfig, CURRENCY_HEADER, IDEMPOTENCY_KEY_HEADER,
    MAX_ERROR_BODY_BYTES,
};
pub use currency::{ChargeRules, Currency, MaxAmount, Money, RuleBroken};
pub use error::{Error, Result};
pub use event::{InvalidEvent, OrderConfirmedEvent};

/// `text` without surrounding whitespace, its control characters and line
/// separators escaped (`\n` as the two characters `\` and `n`), cut to at
/// most `max_bytes` on a char boundary, with `…` appended when something
/// was cut: for quoting untrusted input (provider answers, payloads) in
/// messages that end up in logs and Kafka headers, where a line break could
/// forge a log line.
pub(crate) fn excerpt(text: &str, max_bytes: usize) -> String {
    let text = text.trim();
    let mut escaped = String::with_capacity(text.len().min(max_bytes + 8));
    for c in text.chars() {
        if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') {
            escaped.extend(c.escape_default());
        } else {
            escaped.push(c);
        }
        if escaped.len() > max_bytes {
            break;
        }
    }
    if escaped.len() <= max_bytes {
        return escaped;
    }
    let mut end = max_bytes;
    while !escaped.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &escaped[..end])
}

#[cfg(test)]
mod tests {
    #[test]
    fn excerpts_escape_what_could_forge_a_log_line() {
        let table: &[(&str, usize, &str)] = &[
            ("  plain  ", 64, "plain"),
            ("a\nERROR forged", 64, "a\\nERROR forged"),
            ("a\r\u{1b}[31mred", 64, "a\\r\\u{1b}[31mred"),
            ("line\u{2028}sep", 64, "line\\u{2028}sep"),
            ("ééé", 3, "é…"),
            ("abcdef", 3, "abc…"),
            ("\n\n\n\n", 64, ""),
        ];
        for &(text, max, expected) in table {
            assert_eq!(super::excerpt(text, max), expected, "{text:?}");
        }
    }
}
