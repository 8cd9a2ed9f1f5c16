use std::time::Duration;

use reqwest::{StatusCode, Url};
use retry_core::{
    classify_http_status,
    trace::{self, TraceContext},
    ConsumedRecord, FailureKind, HandlerError, RecordHandler,
};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use uuid::Uuid;
use validator::Validate;

use crate::{excerpt, ChargeRules, Currency, Error, InvalidEvent, Money, OrderConfirmedEvent, Result};

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

/// The header in which a record carries the idempotency key its first
/// attempt charged under, from its first failure on: every later attempt
/// and replay charges under the same key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "billing-idempotency-key";

/// The header in which a record carries the currency its first attempt
/// charged in (an event that names none takes the service's default): a
/// change of `BILLING_CURRENCIES` meanwhile cannot move it to another.
pub const CURRENCY_HEADER: &str = "billing-currency";

/// What the provider answered to [`ChargeHandler::probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderAnswer {
    /// The HTTP status: 404 as the contract has it for an unknown charge.
    pub status: u16,
    /// How long the answer took.
    pub took: Duration,
}

/// What a confirmed charge turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChargeOutcome {
    /// The provider charged the order now (a 2xx answer).
    Charged,
    /// The provider answered 409 and, asked about the idempotency key,
    /// confirmed a completed charge of this order, amount and currency: a
    /// redelivered or replayed event.
    AlreadyCharged,
}

/// Charges confirmed orders through the billing provider: the
/// [`RecordHandler`] for the `orders.confirmed` topic and its retry ladder.
///
/// The provider's contract (`docs/operations/billing.md`, "The billing provider contract"):
///
/// - `POST <base_url>/charges` with the JSON body `{"order_id",
///   "customer_id", "amount": "120.50", "currency": "EUR"}` and the header
///   `Idempotency-Key: <order_id>`. A 2xx answer, and only that, means
///   charged. One order, one charge: the key is the order id, so a second
///   `OrderConfirmed` of the same order (a new event id, a producer's
///   retry) is answered 409 and charges nothing more.
/// - A 409 means the key is known: already charged, still being processed,
///   or used for another charge. The handler then asks
///   `GET <base_url>/charges/<order_id>`, whose 200 answer is
///   `{"order_id", "customer_id", "amount", "currency", "status"}` with
///   `status` one of `succeeded`, `pending` or `failed`:
///   - `succeeded` for the same order, customer, amount and currency is
///     [`ChargeOutcome::AlreadyCharged`];
///   - `pending` and `failed` are transient: a retry finds the charge
///     settled, or charges anew once the failed attempt is over;
///   - another order, customer, amount or currency under the key is
///     permanent ([`Error::KeyReused`]): the order was confirmed again
///     with other terms, which needs a person, not a second charge;
///   - a 404 (the key is unknown although the charge was refused as a
///     conflict) is transient.
///
/// A record that failed carries its key and currency on
/// ([`IDEMPOTENCY_KEY_HEADER`], [`CURRENCY_HEADER`]), and later attempts
/// charge the same; a carried key that is neither the order id nor the
/// event id (the key of an earlier version) is refused. A record on our
/// ladder without one (written by a version that keyed charges on the event
/// id) is charged under the order id once the provider said that nothing
/// under its event id succeeded. A source record's own `billing-*` headers
/// are ignored: only the ladder writes them.
///
/// Before anything is sent, the event must pass the [`ChargeRules`]
/// (currency accepted, decimals, maximum amount); breaking one is
/// permanent. Other failures are classified for the retry ladder: invalid
/// events and 4xx answers are permanent; timeouts, connection failures and
/// 408, 425, 429 and 5xx answers are transient, and so are 401, 403, 404,
/// 405 and 407, which a wrong provider URL or credentials give to every
/// order: an outage (the brake pauses on it), not the order's fault.
#[derive(Debug, Clone)]
pub struct ChargeHandler {
    client: reqwest::Client,
    charges_url: Url,
    timeout: Duration,
    rules: ChargeRules,
}

/// The provider's charge request.
#[derive(Debug, Serialize)]
struct ChargeRequest<'a> {
    order_id: Uuid,
    customer_id: Uuid,
    amount: &'a str,
    currency: Currency,
}

/// The provider's answer to `GET /charges/<key>`.
#[derive(Debug, Deserialize)]
struct ChargeStatus {
    order_id: String,
    customer_id: String,
    amount: String,
    currency: String,
    status: String,
}

impl ChargeHandler {
    /// A handler for the provider at `config.base_url` that charges what
    /// `rules` allow; fails when the URL is not a usable http or https base
    /// URL or the timeout is zero.
    pub fn new(config: ProviderConfig, rules: ChargeRules) -> Result<Self> {
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
        Ok(ChargeHandler { client, charges_url, timeout: config.timeout, rules })
    }

    /// How long one call of the handler may take: a charge answered 409
    /// makes a second call (its confirmation), each within the provider's
    /// timeout, and a margin. The listener's handler timeout is at least
    /// this, or a slow provider's conflicts time out on every retry.
    pub fn time_needed(&self) -> Duration {
        self.timeout * 2 + self.timeout / 4
    }

    /// Where charges go: `<base_url>/charges`.
    pub fn charges_url(&self) -> &str {
        self.charges_url.as_str()
    }

    /// The business rules it charges under.
    pub fn rules(&self) -> &ChargeRules {
        &self.rules
    }

    /// Asks the provider about a charge that cannot exist (`GET
    /// <base_url>/charges/<a fresh uuid>`): a request that charges nothing,
    /// for preflight checks. The contract answers it 404; the answer's
    /// status comes back whatever it is, and only a request without an
    /// answer (unreachable, timed out) is an error.
    pub async fn probe(&self) -> Result<ProviderAnswer> {
        let mut url = self.charges_url.clone();
        url.path_segments_mut().expect("the charges URL is a base URL").push(&Uuid::new_v4().to_string());
        let started = std::time::Instant::now();
        match self.client.get(url.clone()).send().await {
            Ok(response) => Ok(ProviderAnswer { status: response.status().as_u16(), took: started.elapsed() }),
            Err(error) => Err(self.request_error(error, "GET", &url)),
        }
    }

    /// Charges `event.total_amount` for `event.order_id`, once per order
    /// (the idempotency key is the order id); checks the event's rules first.
    pub async fn charge(&self, event: &OrderConfirmedEvent) -> Result<ChargeOutcome> {
        let money = self.money(event, None)?;
        self.send(event, &money, &event.order_id.to_string(), None).await
    }

    /// What `event` is charged: its amount in its currency, or in
    /// `resolved` (what its first attempt charged in) when it names none,
    /// or else the default; checked against the rules.
    fn money(&self, event: &OrderConfirmedEvent, resolved: Option<Currency>) -> Result<Money> {
        event.validate().map_err(|errors| Error::InvalidEvent(InvalidEvent::from_validation_errors(errors)))?;
        let (order_id, event_id) = (event.order_id, event.event_id);
        Ok(self.rules.check(event.total_amount, event.currency.or(resolved)).inspect_err(|broken| {
            tracing::error!(%order_id, %event_id, error = %broken, "charge refused by the business rules");
        })?)
    }

    /// Sends the charge of `money` for `event` under idempotency key `key`;
    /// the request carries `trace` (the attempt's trace context) so that
    /// the provider's spans join the order's trace.
    async fn send(
        &self,
        event: &OrderConfirmedEvent,
        money: &Money,
        key: &str,
        trace: Option<&TraceContext>,
    ) -> Result<ChargeOutcome> {
        let (order_id, event_id) = (event.order_id, event.event_id);
        let request = ChargeRequest {
            order_id: event.order_id,
            customer_id: event.customer_id,
            amount: &money.amount,
            currency: money.currency,
        };
        let mut post = self.client.post(self.charges_url.clone()).header("Idempotency-Key", key);
        if let Some(trace) = trace {
            post = post.header(trace::header_names::TRACEPARENT, trace.traceparent());
            if let Some(state) = trace.state() {
                post = post.header(trace::header_names::TRACESTATE, state);
            }
        }
        let sent = post.json(&request).send().await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => {
                let error = self.request_error(error, "POST", &self.charges_url);
                tracing::warn!(%order_id, %event_id, error = error.with_causes(), "charge failed without an answer");
                return Err(error);
            }
        };

        let status = response.status();
        if status.is_success() {
            tracing::info!(%order_id, %event_id, status = status.as_u16(), amount = %money.amount,
                           currency = %money.currency, "charged");
            return Ok(ChargeOutcome::Charged);
        }
        if status == StatusCode::CONFLICT {
            let outcome = self.confirm(event, money, key).await;
            match &outcome {
                Ok(_) => tracing::info!(%order_id, %event_id, "already charged under this idempotency key"),
                Err(error) => log_failure(error, order_id, event_id),
            }
            return outcome;
        }
        // Other 1xx and 3xx (redirects are not followed) confirm nothing, and
        // a retry would get the same answer.
        let kind = provider_status_kind(status.as_u16());
        let error = Error::ProviderAnswered { status: status.as_u16(), kind, body: body_excerpt(response).await };
        log_failure(&error, order_id, event_id);
        Err(error)
    }

    /// After a 409: asks the provider what its charge under idempotency key
    /// `key` is, and whether it is this event's.
    async fn confirm(&self, event: &OrderConfirmedEvent, money: &Money, key: &str) -> Result<ChargeOutcome> {
        let key = key.to_owned();
        let mut url = self.charges_url.clone();
        url.path_segments_mut().expect("the charges URL is a base URL").push(&key);
        let response = match self.client.get(url.clone()).send().await {
            Ok(response) => response,
            Err(error) => return Err(self.request_error(error, "GET", &url)),
        };
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Err(Error::UnknownKey { key });
        }
        if !status.is_success() {
            let kind = provider_status_kind(status.as_u16());
            return Err(Error::ConfirmationAnswered {
                key,
                status: status.as_u16(),
                kind,
                body: body_excerpt(response).await,
            });
        }
        let unreadable = |reason: String| Error::UnreadableConfirmation { key: key.clone(), reason };
        let body = response.bytes().await.map_err(|e| unreadable(format!("cannot read it: {e}")))?;
        let theirs: ChargeStatus = serde_json::from_slice(&body).map_err(|e| {
            unreadable(format!("{e}: {}", excerpt(&String::from_utf8_lossy(&body), MAX_ERROR_BODY_BYTES)))
        })?;
        let same_order = theirs.order_id.parse::<Uuid>().is_ok_and(|id| id == event.order_id);
        let same_customer = theirs.customer_id.parse::<Uuid>().is_ok_and(|id| id == event.customer_id);
        let same_amount = theirs.amount.parse::<Decimal>().is_ok_and(|amount| amount == event.total_amount);
        if !(same_order && same_customer && same_amount && theirs.currency == money.currency.code()) {
            let quote = |text: &str| excerpt(text, 64);
            return Err(Error::KeyReused {
                key,
                theirs: format!(
                    "order {} of customer {} for {} {}",
                    quote(&theirs.order_id),
                    quote(&theirs.customer_id),
                    quote(&theirs.amount),
                    quote(&theirs.currency)
                ),
                ours: format!(
                    "order {} of customer {} for {} {}",
                    event.order_id, event.customer_id, money.amount, money.currency
                ),
            });
        }
        match theirs.status.as_str() {
            "succeeded" => Ok(ChargeOutcome::AlreadyCharged),
            "pending" => Err(Error::ChargePending { key }),
            "failed" => Err(Error::EarlierChargeFailed { key }),
            other => Err(unreadable(format!("status {:?} is none of succeeded, pending, failed", excerpt(other, 64)))),
        }
    }

    /// Whether a version that keyed charges by event id charged `event`
    /// already: asks the provider about the event id as a key. Unknown, or
    /// a charge that failed, is no; a succeeded charge of this order,
    /// customer and amount is yes; pending, a charge of other terms or no
    /// answer is the error [`confirm`](Self::confirm) gives.
    async fn charged_under_event_id(&self, event: &OrderConfirmedEvent, money: &Money) -> Result<bool> {
        let (order_id, event_id) = (event.order_id, event.event_id);
        match self.confirm(event, money, &event.event_id.to_string()).await {
            Ok(_) => {
                tracing::info!(%order_id, %event_id, "already charged under its event id (a key of an earlier version)");
                Ok(true)
            }
            Err(Error::UnknownKey { .. } | Error::EarlierChargeFailed { .. }) => Ok(false),
            Err(error) => {
                log_failure(&error, order_id, event_id);
                Err(error)
            }
        }
    }

    fn request_error(&self, error: reqwest::Error, method: &'static str, url: &Url) -> Error {
        let url = url.to_string();
        if error.is_timeout() {
            Error::Timeout { method, url, timeout: self.timeout }
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
        let terms = terms_of(&event, &record)?;
        let money = self.money(&event, terms.currency)?;
        let key = terms.key;
        // From its first failure on, the record carries what this attempt
        // charged under and in: later attempts charge the same.
        let carry = |error: Error| {
            HandlerError::from(error)
                .with_header(IDEMPOTENCY_KEY_HEADER, key.as_bytes())
                .with_header(CURRENCY_HEADER, money.currency.code())
        };
        if terms.ask_under_event_id && self.charged_under_event_id(&event, &money).await.map_err(carry)? {
            return Ok(());
        }
        self.send(&event, &money, &key, record.trace.as_ref()).await.map_err(carry)?;
        Ok(())
    }
}

/// What a record's charge is made under.
#[derive(Debug, PartialEq)]
struct Terms {
    /// The idempotency key: the order id, or the event id an earlier
    /// attempt of a version that keyed charges so carried.
    key: String,
    /// The currency an earlier attempt charged in, when carried with its key.
    currency: Option<Currency>,
    /// The record failed before on our ladder without carrying a key: a
    /// version that keyed charges by event id may have charged it under
    /// that id, which the provider is asked about before charging.
    ask_under_event_id: bool,
}

/// The terms of a record's charge. The key is the order id on every path:
/// one order, one charge, whatever event, attempt or replay carries it.
///
/// - A record on the source that never met the ladder (no retry header of
///   ours or Spring's, attempt 1) is charged under its order id in its
///   event's currency (or the default): its producer's `billing-*` headers
///   are ignored, as only the ladder writes them.
/// - A record from the ladder (a rung, a replay) charges under the key and
///   currency its first attempt carried on: the order id, or the event id
///   a version that keyed charges so carried. Any other carried key, or
///   one that cannot be read, is a permanent failure: a key that is not
///   this order's could charge it twice.
/// - A record from our ladder without a carried key (a dead letter written
///   before keys were carried, replayed) is charged under the order id once
///   the provider said that no charge under its event id succeeded.
fn terms_of(event: &OrderConfirmedEvent, record: &ConsumedRecord) -> Result<Terms> {
    let ours = record.headers.iter().any(|(name, _)| retry_core::header_names::is_retry_header(name));
    let springs = record.headers.iter().any(|(name, _)| retry_core::spring::header_names::is_spring_header(name));
    let order_key = event.order_id.to_string();
    if record.attempt <= 1 && !ours && !springs {
        return Ok(Terms { key: order_key, currency: None, ask_under_event_id: false });
    }
    let text = |name: &'static str| {
        record
            .headers
            .get(name)
            .map(|v| {
                std::str::from_utf8(v).ok().filter(|t| !t.trim().is_empty() && t.len() <= 128).ok_or_else(|| {
                    Error::BadCarriedHeader { header: name, value: excerpt(&String::from_utf8_lossy(v), 64) }
                })
            })
            .transpose()
    };
    let Some(carried) = text(IDEMPOTENCY_KEY_HEADER)? else {
        // No carried key, no carried currency either (it rides with its key).
        return Ok(Terms { key: order_key, currency: None, ask_under_event_id: ours });
    };
    let event_key = event.event_id.to_string();
    let key = match carried.parse::<Uuid>() {
        Ok(id) if id == event.order_id => order_key,
        Ok(id) if id == event.event_id => event_key,
        _ => {
            return Err(Error::BadCarriedHeader { header: IDEMPOTENCY_KEY_HEADER, value: excerpt(carried, 64) });
        }
    };
    let currency = text(CURRENCY_HEADER)?
        .map(|code| {
            code.parse::<Currency>()
                .map_err(|_| Error::BadCarriedHeader { header: CURRENCY_HEADER, value: excerpt(code, 64) })
        })
        .transpose()?;
    Ok(Terms { key, currency, ask_under_event_id: false })
}

/// What an answer of the provider that is not a success means for a
/// retry: [`classify_http_status`], except for the answers a wrong
/// configuration gives to every order (401, 403, 404 on the charges
/// endpoint, 405, 407: the provider's URL or credentials), which are
/// transient: an outage of ours, which the outage brake pauses on, not a
/// verdict on the order that would dead-letter every one of them.
fn provider_status_kind(status: u16) -> FailureKind {
    match status {
        401 | 403 | 404 | 405 | 407 => FailureKind::Transient,
        _ => classify_http_status(status).unwrap_or(FailureKind::Permanent),
    }
}

fn log_failure(error: &Error, order_id: Uuid, event_id: Uuid) {
    match error.failure_kind() {
        FailureKind::Transient => tracing::warn!(%order_id, %event_id, error = %error, "charge failed, retryable"),
        FailureKind::Permanent => tracing::error!(%order_id, %event_id, error = %error, "charge refused"),
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
