use std::time::Duration;

use reqwest::{StatusCode, Url};
use retry_core::{classify_http_status, FailureKind, HandlerError};
use retry_kafka::{ConsumedRecord, RecordHandler};
use serde::Serialize;
use uuid::Uuid;
use validator::Validate;

use crate::{excerpt, Error, InvalidEvent, OrderConfirmedEvent, Result};

/// How much of the provider's answer to a failed charge goes into the
/// failure's message (and so into logs and the `x-error` header).
pub const MAX_ERROR_BODY_BYTES: usize = 512;

/// Where and how to reach the billing provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// The provider's base URL (`BILLING_PROVIDER_URL`), http or https, with
    /// or without a path; charges go to `<base_url>/charges` whether or not
    /// it ends with `/`. Without credentials, query or fragment.
    pub base_url: String,
    /// How long one charge may take, from connecting to reading the answer;
    /// a charge that takes longer is a transient failure.
    pub timeout: Duration,
    /// How many idle connections to the provider are kept for reuse: as
    /// many as charges run at once (the listener's in-flight records), so a
    /// busy service does not open a connection per charge.
    pub idle_connections: usize,
}

/// What a confirmed charge turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChargeOutcome {
    /// The provider charged the order now (a 2xx answer).
    Charged,
    /// The provider had already charged under this event's idempotency key
    /// (a 409 answer): a redelivered or replayed event.
    AlreadyCharged,
}

/// Charges confirmed orders through the billing provider: the
/// [`RecordHandler`] for the `orders.confirmed` topic and its retry ladder.
///
/// Each charge is a `POST <base_url>/charges` with the JSON body
/// `{"order_id", "customer_id", "amount": "120.50"}` and the header
/// `Idempotency-Key: <event_id>`, so redeliveries never charge twice.
/// Failures are classified for the retry ladder: invalid events and 4xx
/// answers are permanent; timeouts, connection failures and 408, 425, 429
/// and 5xx answers are transient.
#[derive(Debug, Clone)]
pub struct ChargeHandler {
    client: reqwest::Client,
    charges_url: Url,
    timeout: Duration,
}

/// The provider's charge request.
#[derive(Debug, Serialize)]
struct ChargeRequest {
    order_id: Uuid,
    customer_id: Uuid,
    amount: String,
}

impl ChargeHandler {
    /// A handler for the provider at `config.base_url`; fails when the URL is
    /// not a usable http or https base URL or the timeout is zero.
    pub fn new(config: ProviderConfig) -> Result<Self> {
        let charges_url = charges_url(&config.base_url)?;
        if config.timeout.is_zero() {
            return Err(Error::ZeroTimeout);
        }
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .pool_max_idle_per_host(config.idle_connections)
            // A redirected charge would go somewhere nobody configured.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("billing/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(Error::HttpClient)?;
        Ok(ChargeHandler { client, charges_url, timeout: config.timeout })
    }

    /// Where charges go: `<base_url>/charges`.
    pub fn charges_url(&self) -> &str {
        self.charges_url.as_str()
    }

    /// Charges `event.total_amount` for `event.order_id`, once per
    /// `event.event_id`; checks the event's rules first.
    pub async fn charge(&self, event: &OrderConfirmedEvent) -> Result<ChargeOutcome> {
        event.validate().map_err(|errors| Error::InvalidEvent(InvalidEvent::from_validation_errors(errors)))?;
        let (order_id, event_id) = (event.order_id, event.event_id);
        let request = ChargeRequest {
            order_id: event.order_id,
            customer_id: event.customer_id,
            amount: event.amount_with_cents(),
        };
        let sent = self
            .client
            .post(self.charges_url.clone())
            .header("Idempotency-Key", event.event_id.to_string())
            .json(&request)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => {
                let error = self.request_error(error);
                tracing::warn!(%order_id, %event_id, error = error.with_causes(), "charge failed without an answer");
                return Err(error);
            }
        };

        let status = response.status();
        if status.is_success() {
            tracing::info!(%order_id, %event_id, status = status.as_u16(), amount = %request.amount, "charged");
            return Ok(ChargeOutcome::Charged);
        }
        if status == StatusCode::CONFLICT {
            tracing::info!(%order_id, %event_id, status = status.as_u16(), "already charged under this idempotency key");
            return Ok(ChargeOutcome::AlreadyCharged);
        }
        // Other 1xx and 3xx (redirects are not followed) confirm nothing, and
        // a retry would get the same answer.
        let kind = classify_http_status(status.as_u16()).unwrap_or(FailureKind::Permanent);
        let error = Error::ProviderAnswered { status: status.as_u16(), kind, body: body_excerpt(response).await };
        match kind {
            FailureKind::Transient => {
                tracing::warn!(%order_id, %event_id, status = status.as_u16(), error = %error, "charge failed, retryable")
            }
            FailureKind::Permanent => {
                tracing::error!(%order_id, %event_id, status = status.as_u16(), error = %error, "charge refused")
            }
        }
        Err(error)
    }

    fn request_error(&self, error: reqwest::Error) -> Error {
        let url = self.charges_url.to_string();
        if error.is_timeout() {
            Error::Timeout { url, timeout: self.timeout }
        } else if error.is_connect() {
            // The URL is in our message already.
            Error::Unreachable { url, source: error.without_url() }
        } else {
            Error::Request { url, source: error.without_url() }
        }
    }
}

impl RecordHandler for ChargeHandler {
    async fn handle(&self, record: ConsumedRecord) -> std::result::Result<(), HandlerError> {
        let decoded = match &record.value {
            Some(value) => OrderConfirmedEvent::from_json(value),
            None => Err(InvalidEvent::new("record has no value: expected an OrderConfirmedEvent JSON object")),
        };
        let event = decoded.map_err(|invalid| {
            tracing::error!(
                topic = %record.topic,
                partition = record.partition,
                offset = record.offset,
                error = %invalid,
                "invalid order-confirmed event"
            );
            Error::InvalidEvent(invalid)
        })?;
        self.charge(&event).await?;
        Ok(())
    }
}

/// `<base_url>/charges`, checking that `base_url` is an http or https URL
/// whose path can take one more segment.
fn charges_url(base_url: &str) -> Result<Url> {
    let invalid =
        |url: &str, reason: &str| Error::InvalidProviderUrl { url: url.to_owned(), reason: reason.to_owned() };
    let mut url = Url::parse(base_url).map_err(|error| {
        // It may hold credentials that `Url` could not separate.
        let shown = if base_url.contains('@') { "(not shown, it contains `@`)" } else { base_url };
        invalid(shown, &error.to_string())
    })?;
    if !url.username().is_empty() || url.password().is_some() {
        // Never repeat them, not even in this error.
        let _ = url.set_username("");
        let _ = url.set_password(None);
        return Err(invalid(
            url.as_str(),
            "it must not contain credentials, they would end up in logs and Kafka headers",
        ));
    }
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(base_url, "its scheme must be http or https"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid(base_url, "it must not have a query or fragment"));
    }
    let segments: Vec<&str> = url.path_segments().into_iter().flatten().collect();
    let before_trailing_slash = match segments.split_last() {
        Some((&"", rest)) => rest,
        _ => &segments[..],
    };
    if before_trailing_slash.iter().any(|segment| segment.is_empty()) {
        return Err(invalid(base_url, "its path must not contain empty segments (`//`)"));
    }
    url.path_segments_mut().map_err(|()| invalid(base_url, "it cannot be a base URL"))?.pop_if_empty().push("charges");
    Ok(url)
}

/// The start of a failed answer's body, read no further than needed.
async fn body_excerpt(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    let problem = loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() > MAX_ERROR_BODY_BYTES {
                    break None;
                }
            }
            Ok(None) => break None,
            Err(error) => break Some(error),
        }
    };
    let text = excerpt(&String::from_utf8_lossy(&body), MAX_ERROR_BODY_BYTES);
    match problem {
        Some(error) if text.is_empty() => format!("(body unreadable: {error})"),
        _ => text,
    }
}

#[cfg(test)]
mod tests;
