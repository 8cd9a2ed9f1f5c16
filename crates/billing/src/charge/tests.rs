use std::future::Future;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use retry_core::{ConsumedRecord, FailureKind, HandlerError, Headers, RecordHandler};
use serde_json::json;
use tokio::sync::mpsc;

use super::{ChargeHandler, ChargeOutcome, ProviderConfig};
use crate::{ChargeRules, Currency};
use crate::{Error, OrderConfirmedEvent};

const EVENT_ID: &str = "0b9f6c1e-8a52-4c0e-9a0b-6d2f3b1c4e5a";
const ORDER_ID: &str = "5c1e2d3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f";
const CUSTOMER_ID: &str = "d2a4b6c8-e0f2-4a4c-8e6a-8c0e2a4c6e8a";

/// Generous, but a hung test still ends.
const TEST_TIMEOUT: Duration = Duration::from_secs(30);

fn event_json(total_amount: &str) -> String {
    json!({
        "event_id": EVENT_ID,
        "order_id": ORDER_ID,
        "customer_id": CUSTOMER_ID,
        "total_amount": total_amount,
    })
    .to_string()
}

fn record(value: Option<&[u8]>) -> ConsumedRecord {
    ConsumedRecord {
        topic: "orders.confirmed".to_owned(),
        partition: 0,
        offset: 42,
        key: Some(Bytes::from_static(ORDER_ID.as_bytes())),
        value: value.map(Bytes::copy_from_slice),
        headers: Headers::default(),
        timestamp: None,
        attempt: 1,
        trace: None,
    }
}

/// How the fake provider answers every request.
#[derive(Debug, Clone)]
enum Answer {
    Status(u16, String),
    /// Answers after a while.
    Late(Duration, u16, String),
    /// Never answers.
    Hang,
}

fn answer(status: u16, body: &str) -> Answer {
    Answer::Status(status, body.to_owned())
}

/// A request as the fake provider saw it.
#[derive(Debug)]
struct SeenRequest {
    method: Method,
    path: String,
    idempotency_key: Option<String>,
    content_type: Option<String>,
    traceparent: Option<String>,
    tracestate: Option<String>,
    body: serde_json::Value,
}

/// A billing provider on 127.0.0.1 that reports every request it gets.
struct FakeProvider {
    base_url: String,
    requests: mpsc::UnboundedReceiver<SeenRequest>,
}

impl FakeProvider {
    /// Answers every request with `answer`.
    async fn start(answer: Answer) -> Self {
        FakeProvider::start_with(answer.clone(), answer).await
    }

    /// Answers charges (`POST`) with `post` and questions about a key
    /// (`GET`) with `get`.
    async fn start_with(post: Answer, get: Answer) -> Self {
        let (seen, requests) = mpsc::unbounded_channel();
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let answer = if method == Method::GET { get.clone() } else { post.clone() };
            let seen = seen.clone();
            async move {
                let header = |name: &str| headers.get(name).map(|value| value.to_str().unwrap().to_owned());
                let _ = seen.send(SeenRequest {
                    method,
                    path: uri.path().to_owned(),
                    idempotency_key: header("idempotency-key"),
                    content_type: header("content-type"),
                    traceparent: header("traceparent"),
                    tracestate: header("tracestate"),
                    body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
                });
                match answer {
                    Answer::Status(status, body) => (StatusCode::from_u16(status).unwrap(), body),
                    Answer::Late(delay, status, body) => {
                        tokio::time::sleep(delay).await;
                        (StatusCode::from_u16(status).unwrap(), body)
                    }
                    Answer::Hang => std::future::pending().await,
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeProvider { base_url: format!("http://{address}"), requests }
    }

    fn handler(&self, base_path: &str, timeout: Duration) -> ChargeHandler {
        ChargeHandler::new(
            ProviderConfig { base_url: format!("{}{base_path}", self.base_url), timeout, idle_connections: 8 },
            rules(),
        )
        .unwrap()
    }

    /// The one request the provider got, which it reported before answering.
    fn only_request(&mut self) -> SeenRequest {
        let request = self.requests.try_recv().expect("the provider got no request");
        assert!(self.requests.try_recv().is_err(), "the provider got more than one request");
        request
    }
}

/// Euros (the default) and yen, at most 10,000 EUR or 1,500,000 JPY.
fn rules() -> ChargeRules {
    ChargeRules::new(vec![Currency::EUR, "JPY".parse().unwrap()], "EUR=10000,JPY=1500000".parse().unwrap()).unwrap()
}

async fn bounded<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, future).await.expect("the test took too long")
}

#[tokio::test]
async fn charges_post_the_amount_with_cents_under_the_order_id_as_idempotency_key() {
    let mut provider = FakeProvider::start(answer(201, r#"{"id":"ch_1"}"#)).await;
    let handler = provider.handler("/v1", Duration::from_secs(10));

    let outcome = bounded(handler.handle(record(Some(event_json("120.5").as_bytes())))).await;

    assert_eq!(outcome, Ok(()));
    let request = provider.only_request();
    assert_eq!(request.method, Method::POST);
    assert_eq!(request.path, "/v1/charges");
    assert_eq!(request.idempotency_key.as_deref(), Some(ORDER_ID));
    assert_eq!(request.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        request.body,
        json!({"order_id": ORDER_ID, "customer_id": CUSTOMER_ID, "amount": "120.50", "currency": "EUR"})
    );
    // A record without a trace context sends none.
    assert_eq!((request.traceparent, request.tracestate), (None, None));
}

#[tokio::test]
async fn the_charge_carries_the_attempts_trace_context_to_the_provider() {
    let mut provider = FakeProvider::start(answer(201, r#"{"id":"ch_1"}"#)).await;
    let handler = provider.handler("/v1", Duration::from_secs(10));
    let mut headers = Headers::new();
    headers.insert("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    headers.insert("tracestate", "congo=t61rcWkgMzE");
    let attempt = retry_core::trace::TraceContext::read(&headers).context().unwrap().clone();
    let mut r = record(Some(event_json("120.5").as_bytes()));
    r.trace = Some(attempt);

    assert_eq!(bounded(handler.handle(r)).await, Ok(()));
    let request = provider.only_request();
    assert_eq!(request.traceparent.as_deref(), Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
    assert_eq!(request.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
}

#[tokio::test]
async fn provider_answers() {
    let permanent = |message: &str| Err(HandlerError::permanent(message));
    let transient = |message: &str| Err(HandlerError::transient(message));
    let long_body = "é".repeat(600);
    let table: Vec<(Answer, Result<(), HandlerError>)> = vec![
        (answer(201, r#"{"id":"ch_1"}"#), Ok(())),
        (answer(200, ""), Ok(())),
        (answer(204, ""), Ok(())),
        (
            answer(503, r#"{"error":"overloaded"}"#),
            transient(r#"billing provider answered 503 Service Unavailable: {"error":"overloaded"}"#),
        ),
        (answer(500, "boom\n"), transient("billing provider answered 500 Internal Server Error: boom")),
        // A line break in an answer cannot forge a log line.
        (
            answer(400, "no\nERROR billing: forged"),
            permanent("billing provider answered 400 Bad Request: no\\nERROR billing: forged"),
        ),
        (answer(502, ""), transient("billing provider answered 502 Bad Gateway")),
        (answer(408, ""), transient("billing provider answered 408 Request Timeout")),
        (answer(425, ""), transient("billing provider answered 425 Too Early")),
        (answer(429, "slow down"), transient("billing provider answered 429 Too Many Requests: slow down")),
        (
            answer(400, r#"{"error":"invalid amount"}"#),
            permanent(r#"billing provider answered 400 Bad Request: {"error":"invalid amount"}"#),
        ),
        // What a wrong URL or key answers for every order: an outage, not the order's fault.
        (answer(401, ""), transient("billing provider answered 401 Unauthorized")),
        (answer(403, ""), transient("billing provider answered 403 Forbidden")),
        (answer(404, "no such route"), transient("billing provider answered 404 Not Found: no such route")),
        (answer(405, ""), transient("billing provider answered 405 Method Not Allowed")),
        (answer(402, "card declined"), permanent("billing provider answered 402 Payment Required: card declined")),
        (
            answer(422, "unknown customer"),
            permanent("billing provider answered 422 Unprocessable Entity: unknown customer"),
        ),
        // Redirects are not followed, and confirm nothing.
        (answer(302, ""), permanent("billing provider answered 302 Found")),
        // Long answers are cut on a char boundary (é is 2 bytes).
        (
            answer(503, &long_body),
            transient(&format!("billing provider answered 503 Service Unavailable: {}…", "é".repeat(256))),
        ),
    ];
    for (answer, expected) in table {
        let mut provider = FakeProvider::start(answer.clone()).await;
        let handler = provider.handler("", Duration::from_secs(10));
        let outcome = bounded(handler.handle(record(Some(event_json("120.50").as_bytes())))).await;
        assert_eq!(plain(&outcome), expected, "{answer:?}");
        assert_eq!(provider.only_request().idempotency_key.as_deref(), Some(ORDER_ID), "{answer:?}");
    }
}

/// The provider's answer to `GET /charges/<key>`.
fn status_body(order_id: &str, amount: &str, currency: &str, status: &str) -> String {
    status_of(order_id, CUSTOMER_ID, amount, currency, status)
}

fn status_of(order_id: &str, customer_id: &str, amount: &str, currency: &str, status: &str) -> String {
    json!({"order_id": order_id, "customer_id": customer_id, "amount": amount, "currency": currency, "status": status})
        .to_string()
}

/// The outcome without the headers a failure attaches (tested on their own).
fn plain(outcome: &Result<(), HandlerError>) -> Result<(), HandlerError> {
    outcome.clone().map_err(|e| HandlerError::new(e.kind(), e.message()))
}

/// A 409 is never taken as a charge on its own: the handler asks the
/// provider about the key, and only a completed charge of this very order,
/// amount and currency counts as charged.
#[tokio::test]
async fn conflicts_are_confirmed_with_the_provider() {
    let other_order = "7d1e2d3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f";
    let reused = |theirs: &str| {
        Err(HandlerError::permanent(format!(
            "idempotency key {ORDER_ID} is already charged at the billing provider for other terms ({theirs}) \
             than this event's (order {ORDER_ID} of customer {CUSTOMER_ID} for 120.50 EUR): not charged again"
        )))
    };
    let unreadable = |reason: &str| {
        Err(HandlerError::permanent(format!(
            "billing provider's answer about idempotency key {ORDER_ID} is not a charge status: {reason}"
        )))
    };
    let table: Vec<(Answer, Result<(), HandlerError>)> = vec![
        (answer(200, &status_body(ORDER_ID, "120.50", "EUR", "succeeded")), Ok(())),
        // The same amount written otherwise is the same amount.
        (answer(200, &status_body(ORDER_ID, "120.5", "EUR", "succeeded")), Ok(())),
        (
            answer(200, &status_body(ORDER_ID, "120.50", "EUR", "pending")),
            Err(HandlerError::transient(format!(
                "billing provider is still processing an earlier charge under idempotency key {ORDER_ID}: retry later"
            ))),
        ),
        (
            answer(200, &status_body(ORDER_ID, "120.50", "EUR", "failed")),
            Err(HandlerError::transient(format!(
                "an earlier charge under idempotency key {ORDER_ID} failed at the billing provider: retry to charge again"
            ))),
        ),
        (
            answer(200, &status_body(other_order, "120.50", "EUR", "succeeded")),
            reused(&format!("order {other_order} of customer {CUSTOMER_ID} for 120.50 EUR")),
        ),
        (
            answer(200, &status_of(ORDER_ID, "c0ffee00-0000-4000-8000-000000000000", "120.50", "EUR", "succeeded")),
            Err(HandlerError::permanent(format!(
                "idempotency key {ORDER_ID} is already charged at the billing provider for other terms (order \
                 {ORDER_ID} of customer c0ffee00-0000-4000-8000-000000000000 for 120.50 EUR) than this event's \
                 (order {ORDER_ID} of customer {CUSTOMER_ID} for 120.50 EUR): not charged again"
            ))),
        ),
        (answer(200, &status_body(ORDER_ID, "99.00", "EUR", "succeeded")), reused(&format!("order {ORDER_ID} of customer {CUSTOMER_ID} for 99.00 EUR"))),
        (answer(200, &status_body(ORDER_ID, "120.50", "JPY", "pending")), reused(&format!("order {ORDER_ID} of customer {CUSTOMER_ID} for 120.50 JPY"))),
        (
            answer(404, ""),
            Err(HandlerError::transient(format!(
                "billing provider refused the charge as a conflict but does not know idempotency key {ORDER_ID}: retry later"
            ))),
        ),
        (
            answer(503, "busy"),
            Err(HandlerError::transient(format!(
                "billing provider answered 503 Service Unavailable when asked about idempotency key {ORDER_ID} after a 409: busy"
            ))),
        ),
        (
            answer(403, ""),
            Err(HandlerError::transient(format!(
                "billing provider answered 403 Forbidden when asked about idempotency key {ORDER_ID} after a 409"
            ))),
        ),
        (
            answer(410, ""),
            Err(HandlerError::permanent(format!(
                "billing provider answered 410 Gone when asked about idempotency key {ORDER_ID} after a 409"
            ))),
        ),
        (answer(200, &status_body(ORDER_ID, "120.50", "EUR", "done")), unreadable(r#"status "done" is none of succeeded, pending, failed"#)),
        (answer(200, r#"{"status":"succeeded"}"#), unreadable(r#"missing field `order_id` at line 1 column 22: {"status":"succeeded"}"#)),
        (answer(200, "charged"), unreadable("expected value at line 1 column 1: charged")),
    ];
    for (get, expected) in table {
        let mut provider = FakeProvider::start_with(answer(409, r#"{"error":"key in use"}"#), get.clone()).await;
        let handler = provider.handler("/v1", Duration::from_secs(10));
        let outcome = bounded(handler.handle(record(Some(event_json("120.50").as_bytes())))).await;
        assert_eq!(plain(&outcome), expected, "{get:?}");
        let post = provider.requests.try_recv().expect("the charge");
        let confirm = provider.requests.try_recv().expect("the question about the key");
        assert_eq!((post.method, confirm.method), (Method::POST, Method::GET));
        assert_eq!(confirm.path, format!("/v1/charges/{ORDER_ID}"));
    }
}

#[tokio::test]
async fn charge_tells_new_charges_from_redeliveries() {
    let event = OrderConfirmedEvent::from_json(event_json("120.50").as_bytes()).unwrap();
    let succeeded = answer(200, &status_body(ORDER_ID, "120.50", "EUR", "succeeded"));
    for (status, expected) in [(201, ChargeOutcome::Charged), (409, ChargeOutcome::AlreadyCharged)] {
        let provider = FakeProvider::start_with(answer(status, ""), succeeded.clone()).await;
        let handler = provider.handler("/", Duration::from_secs(10));
        assert_eq!(bounded(handler.charge(&event)).await.unwrap(), expected, "{status}");
    }
}

#[tokio::test]
async fn a_provider_slower_than_the_timeout_is_a_transient_failure() {
    let mut provider = FakeProvider::start(Answer::Hang).await;
    let handler = provider.handler("", Duration::from_millis(200));

    let error = bounded(handler.handle(record(Some(event_json("120.50").as_bytes())))).await.unwrap_err();

    assert_eq!(error.kind(), FailureKind::Transient);
    assert_eq!(error.message(), format!("billing provider timed out after 200ms (POST {}/charges)", provider.base_url));
    provider.only_request();
}

#[tokio::test]
async fn an_unreachable_provider_is_a_transient_failure() {
    // A port that was just free; nothing listens on it any more.
    let address = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let handler = ChargeHandler::new(
        ProviderConfig { base_url: format!("http://{address}"), timeout: Duration::from_secs(10), idle_connections: 8 },
        rules(),
    )
    .unwrap();

    let error = bounded(handler.handle(record(Some(event_json("120.50").as_bytes())))).await.unwrap_err();

    assert_eq!(error.kind(), FailureKind::Transient);
    let expected = format!("cannot reach the billing provider at http://{address}/charges: ");
    assert!(error.message().starts_with(&expected), "{}", error.message());
    assert!(error.message().contains("onnection refused"), "{}", error.message());
}

#[tokio::test]
async fn invalid_events_are_permanent_failures_and_charge_nothing() {
    let (negative, too_precise) = (event_json("-5.00"), event_json("1.005"));
    let in_dollars = event_json("5").replace('{', r#"{"currency":"USD","#);
    let (too_much, yen_cents) = (event_json("1E+9"), event_json("1200.50").replace('{', r#"{"currency":"JPY","#));
    let table: &[(Option<&[u8]>, &str)] = &[
        (None, "record has no value: expected an OrderConfirmedEvent JSON object"),
        (Some(b""), "payload is empty: expected an OrderConfirmedEvent JSON object"),
        (Some(b"{}"), "missing field event_id"),
        (Some(b"not json"), "invalid JSON at line 1 column 2: expected ident"),
        (Some(negative.as_bytes()), "total_amount must be positive, got -5.00"),
    ];
    let broken: &[(&[u8], &str)] = &[
        (too_precise.as_bytes(), "total_amount 1.005 has more decimal places than EUR has (2)"),
        (yen_cents.as_bytes(), "total_amount 1200.50 has more decimal places than JPY has (0)"),
        (too_much.as_bytes(), "total_amount 1000000000.00 EUR is above the maximum charge of 10000 EUR: not charged"),
        (in_dollars.as_bytes(), "currency USD is not accepted (accepted: EUR, JPY)"),
    ];
    let mut provider = FakeProvider::start(answer(201, "")).await;
    let handler = provider.handler("", Duration::from_secs(10));
    for &(value, message) in table {
        let outcome = bounded(handler.handle(record(value))).await;
        let expected = HandlerError::permanent(format!("invalid order-confirmed event: {message}"));
        assert_eq!(plain(&outcome), Err(expected), "{value:?}");
    }
    for &(value, message) in broken {
        let outcome = bounded(handler.handle(record(Some(value)))).await;
        assert_eq!(plain(&outcome), Err(HandlerError::permanent(message)), "{}", String::from_utf8_lossy(value));
    }
    // Events built in code are checked too.
    let mut event = OrderConfirmedEvent::from_json(event_json("1.00").as_bytes()).unwrap();
    event.total_amount = "-0.01".parse().unwrap();
    let error = bounded(handler.charge(&event)).await.unwrap_err();
    assert!(matches!(error, Error::InvalidEvent(_)), "{error:?}");

    assert!(provider.requests.try_recv().is_err(), "an invalid event reached the provider");
}

#[test]
fn provider_configs() {
    let timeout = Duration::from_secs(1);
    let table: &[(&str, Result<&str, &str>)] = &[
        ("http://127.0.0.1:8080", Ok("http://127.0.0.1:8080/charges")),
        ("http://127.0.0.1:8080/", Ok("http://127.0.0.1:8080/charges")),
        ("https://billing.example.com/v1", Ok("https://billing.example.com/v1/charges")),
        ("https://billing.example.com/v1/", Ok("https://billing.example.com/v1/charges")),
        ("https://billing.example.com/a%20b/", Ok("https://billing.example.com/a%20b/charges")),
        (" https://billing.example.com\n", Ok("https://billing.example.com/charges")),
        (
            "billing.example.com",
            Err(
                r#"invalid billing provider URL "billing.example.com" (relative URL without a base): expected an http or https base URL such as https://billing.example.com/v1"#,
            ),
        ),
        (
            "ftp://billing.example.com",
            Err(
                r#"invalid billing provider URL "ftp://billing.example.com" (its scheme must be http or https): expected an http or https base URL such as https://billing.example.com/v1"#,
            ),
        ),
        (
            "https://billing.example.com/v1?key=1",
            Err(
                r#"invalid billing provider URL "https://billing.example.com/v1?key=1" (it must not have a query or fragment): expected an http or https base URL such as https://billing.example.com/v1"#,
            ),
        ),
        (
            "https://billing.example.com/v1#charges",
            Err(
                r#"invalid billing provider URL "https://billing.example.com/v1#charges" (it must not have a query or fragment): expected an http or https base URL such as https://billing.example.com/v1"#,
            ),
        ),
        (
            "https://billing.example.com//v1",
            Err(
                r#"invalid billing provider URL "https://billing.example.com//v1" (its path must not contain empty segments (`//`)): expected an http or https base URL such as https://billing.example.com/v1"#,
            ),
        ),
        (
            "https://billing:s3cret@billing.example.com:99999/v1",
            Err(
                r#"invalid billing provider URL "(not shown, it contains `@`)" (invalid port number): expected an http or https base URL such as https://billing.example.com/v1"#,
            ),
        ),
        (
            "https://billing:s3cret@billing.example.com/v1",
            Err(
                r#"invalid billing provider URL "https://billing.example.com/v1" (it must not contain credentials, they would end up in logs and Kafka headers): expected an http or https base URL such as https://billing.example.com/v1"#,
            ),
        ),
    ];
    for &(base_url, expected) in table {
        let actual =
            ChargeHandler::new(ProviderConfig { base_url: base_url.to_owned(), timeout, idle_connections: 8 }, rules());
        match (actual, expected) {
            (Ok(handler), Ok(url)) => assert_eq!(handler.charges_url(), url, "{base_url}"),
            (Err(error), Err(message)) => assert_eq!(error.to_string(), message, "{base_url}"),
            (actual, expected) => panic!("{base_url}: expected {expected:?}, got {actual:?}"),
        }
    }

    let zero = ChargeHandler::new(
        ProviderConfig { base_url: "http://127.0.0.1".to_owned(), timeout: Duration::ZERO, idle_connections: 8 },
        rules(),
    );
    assert!(matches!(zero, Err(Error::ZeroTimeout)), "{zero:?}");
}

/// A 409 makes two calls (the charge, then its confirmation), each within
/// the provider's timeout: the time a call of the handler needs covers
/// both, so a slow provider that answers each in time confirms the charge
/// instead of timing the handler out, again on every retry.
#[tokio::test]
async fn a_conflict_confirmed_slowly_fits_in_the_time_a_call_needs() {
    let timeout = Duration::from_millis(400);
    let slow = Duration::from_millis(300);
    let succeeded = status_body(ORDER_ID, "120.50", "EUR", "succeeded");
    let provider =
        FakeProvider::start_with(Answer::Late(slow, 409, String::new()), Answer::Late(slow, 200, succeeded)).await;
    let handler = provider.handler("", timeout);
    assert!(handler.time_needed() >= timeout * 2, "{:?}", handler.time_needed());
    let call = handler.handle(record(Some(event_json("120.50").as_bytes())));
    let outcome = tokio::time::timeout(handler.time_needed(), call).await;
    assert_eq!(outcome, Ok(Ok(())), "within {:?}", handler.time_needed());
}

/// A dead letter of the version that keyed charges by event id, replayed
/// without a carried key: what the provider says of the event id decides.
/// A succeeded charge of this order is the charge (nothing is sent); a
/// pending one is waited for; a failed or unknown one is charged under the
/// order id; one of another order needs a person.
#[tokio::test]
async fn a_keyless_dead_letter_of_an_earlier_version_is_not_charged_twice() {
    let legacy = || {
        let mut r = record(Some(event_json("120.50").as_bytes()));
        r.attempt = 2;
        r.headers.insert("x-retry-attempt", "1");
        r.headers.insert("x-replay-count", "1");
        r
    };
    let under_event = |status: &str| answer(200, &status_body(ORDER_ID, "120.50", "EUR", status));
    let other_order = "7a7a7a7a-7a7a-4a7a-8a7a-7a7a7a7a7a7a";
    type Case<'a> = (&'a str, Answer, Option<FailureKind>, bool);
    let table: Vec<Case<'_>> = vec![
        ("charged under its event id", under_event("succeeded"), None, false),
        ("still pending under its event id", under_event("pending"), Some(FailureKind::Transient), false),
        ("failed under its event id", under_event("failed"), None, true),
        ("unknown under its event id", answer(404, ""), None, true),
        ("the provider cannot say", answer(503, ""), Some(FailureKind::Transient), false),
        (
            "another order under its event id",
            answer(200, &status_body(other_order, "120.50", "EUR", "succeeded")),
            Some(FailureKind::Permanent),
            false,
        ),
    ];
    for (case, get, failure, posted) in table {
        let mut provider = FakeProvider::start_with(answer(201, ""), get).await;
        let handler = provider.handler("", Duration::from_secs(10));
        let outcome = bounded(handler.handle(legacy())).await;
        assert_eq!(outcome.as_ref().err().map(HandlerError::kind), failure, "{case}: {outcome:?}");
        let question = provider.requests.try_recv().expect("a question about the event id");
        assert_eq!((question.method, question.path), (Method::GET, format!("/charges/{EVENT_ID}")), "{case}");
        let charge = provider.requests.try_recv().ok();
        assert_eq!(charge.as_ref().map(|c| c.idempotency_key.as_deref()), posted.then_some(Some(ORDER_ID)), "{case}");
        assert!(provider.requests.try_recv().is_err(), "{case}: nothing more");
    }
}

/// One order, one charge: the key is the order id, so a second event for
/// the same order is a conflict the provider confirms, not a new charge. A
/// failure carries the key and currency its attempt used; later attempts
/// use them, whatever the defaults are by then (a carried event id is the
/// key of an earlier version); a record on our ladder without them (an
/// earlier version's dead letter, replayed) is charged under the order id
/// after the provider said that its event id is unknown, one on Spring's
/// under the order id Spring charged under; a source record's own
/// `billing-*` headers are ignored; carried headers that cannot be read,
/// or a key that is not the order's, charge nothing.
#[tokio::test]
async fn later_attempts_charge_under_the_first_attempt_s_key_and_currency() {
    const OTHER_EVENT: &str = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f";
    let second_event = event_json("120.50").replace(EVENT_ID, OTHER_EVENT);
    let with = |value: &str, attempt: u32, headers: &[(&str, &str)]| {
        let mut r = record(Some(value.as_bytes()));
        r.attempt = attempt;
        for (k, v) in headers {
            r.headers.insert(*k, *v);
        }
        r
    };
    let first = event_json("120.50");
    // (case, record, the key charged under, its currency, whether the
    // provider was asked about the event id first)
    type Case<'a> = (&'a str, ConsumedRecord, &'a str, &'a str, bool);
    let table: Vec<Case<'_>> = vec![
        ("first attempt", with(&first, 1, &[]), ORDER_ID, "EUR", false),
        ("another event of the same order", with(&second_event, 1, &[]), ORDER_ID, "EUR", false),
        (
            "a rung, as carried",
            with(&first, 2, &[("billing-idempotency-key", ORDER_ID), ("billing-currency", "USD")]),
            ORDER_ID,
            "USD",
            false,
        ),
        (
            "a rung, with an earlier version's event-id key carried",
            with(&first, 3, &[("x-retry-attempt", "2"), ("billing-idempotency-key", EVENT_ID)]),
            EVENT_ID,
            "EUR",
            false,
        ),
        ("a rung, from before keys were carried", with(&first, 3, &[("x-retry-attempt", "2")]), ORDER_ID, "EUR", true),
        (
            "a first-rung replay of a keyless dead letter",
            with(&first, 2, &[("x-retry-attempt", "1"), ("x-replay-count", "1")]),
            ORDER_ID,
            "EUR",
            true,
        ),
        ("a rung of Spring's", with(&first, 2, &[("kafka_original-topic", "orders")]), ORDER_ID, "EUR", false),
        ("a replay without a carried key", with(&first, 1, &[("x-replay-count", "1")]), ORDER_ID, "EUR", true),
        (
            "a replay, as carried",
            with(&first, 1, &[("x-replay-count", "1"), ("billing-idempotency-key", ORDER_ID)]),
            ORDER_ID,
            "EUR",
            false,
        ),
        (
            "a producer's key and currency on the source",
            with(&first, 1, &[("billing-idempotency-key", "f00"), ("billing-currency", "USD")]),
            ORDER_ID,
            "EUR",
            false,
        ),
        (
            "a currency carried without its key",
            with(&first, 2, &[("x-retry-attempt", "1"), ("billing-currency", "USD")]),
            ORDER_ID,
            "EUR",
            true,
        ),
    ];
    for (case, record, key, currency, asked) in table {
        let mut provider = FakeProvider::start_with(answer(503, ""), answer(404, "")).await;
        let rules = ChargeRules::new(
            vec!["EUR".parse().unwrap(), "USD".parse().unwrap()],
            crate::MaxAmount::Every(10_000.into()),
        )
        .unwrap();
        let handler = ChargeHandler::new(
            ProviderConfig {
                base_url: provider.base_url.clone(),
                timeout: Duration::from_secs(10),
                idle_connections: 1,
            },
            rules,
        )
        .unwrap();
        let error = bounded(handler.handle(record)).await.unwrap_err();
        if asked {
            let question = provider.requests.try_recv().expect("a question about the event id");
            assert_eq!((question.method, question.path), (Method::GET, format!("/charges/{EVENT_ID}")), "{case}");
        }
        let seen = provider.only_request();
        assert_eq!(seen.method, Method::POST, "{case}");
        assert_eq!(
            (seen.idempotency_key.as_deref(), seen.body["currency"].as_str()),
            (Some(key), Some(currency)),
            "{case}"
        );
        // The failure carries what it used.
        let carried = error.attached_headers();
        assert_eq!(carried.get("billing-idempotency-key"), Some(key.as_bytes()), "{case}");
        assert_eq!(carried.get("billing-currency"), Some(currency.as_bytes()), "{case}");
    }
    // Carried headers that cannot be read, a key that is not this order's:
    // nothing is sent.
    let other_key = format!("billing-idempotency-key={OTHER_EVENT}");
    for headers in ["billing-idempotency-key=f00", &other_key, "billing-currency=euros", "billing-idempotency-key= "] {
        let (name, value) = headers.split_once('=').unwrap();
        let headers = [("billing-idempotency-key", ORDER_ID), (name, value)];
        let mut provider = FakeProvider::start(answer(201, "")).await;
        let handler = provider.handler("", Duration::from_secs(10));
        let error = bounded(handler.handle(with(&first, 2, &headers))).await.unwrap_err();
        assert_eq!(error.kind(), FailureKind::Permanent, "{headers:?}");
        assert!(error.message().contains("cannot be used"), "{}", error.message());
        assert!(provider.requests.try_recv().is_err(), "{headers:?}: nothing sent");
    }
}
