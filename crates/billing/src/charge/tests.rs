use std::future::Future;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use retry_core::{FailureKind, HandlerError, Headers};
use retry_kafka::{ConsumedRecord, RecordHandler};
use serde_json::json;
use tokio::sync::mpsc;

use super::{ChargeHandler, ChargeOutcome, ProviderConfig};
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
    }
}

/// How the fake provider answers every request.
#[derive(Debug, Clone)]
enum Answer {
    Status(u16, String),
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
    body: serde_json::Value,
}

/// A billing provider on 127.0.0.1 that reports every request it gets.
struct FakeProvider {
    base_url: String,
    requests: mpsc::UnboundedReceiver<SeenRequest>,
}

impl FakeProvider {
    async fn start(answer: Answer) -> Self {
        let (seen, requests) = mpsc::unbounded_channel();
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let (seen, answer) = (seen.clone(), answer.clone());
            async move {
                let header = |name: &str| headers.get(name).map(|value| value.to_str().unwrap().to_owned());
                let _ = seen.send(SeenRequest {
                    method,
                    path: uri.path().to_owned(),
                    idempotency_key: header("idempotency-key"),
                    content_type: header("content-type"),
                    body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
                });
                match answer {
                    Answer::Status(status, body) => (StatusCode::from_u16(status).unwrap(), body),
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
        ChargeHandler::new(ProviderConfig {
            base_url: format!("{}{base_path}", self.base_url),
            timeout,
            idle_connections: 8,
        })
        .unwrap()
    }

    /// The one request the provider got, which it reported before answering.
    fn only_request(&mut self) -> SeenRequest {
        let request = self.requests.try_recv().expect("the provider got no request");
        assert!(self.requests.try_recv().is_err(), "the provider got more than one request");
        request
    }
}

async fn bounded<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, future).await.expect("the test took too long")
}

#[tokio::test]
async fn charges_post_the_amount_with_cents_under_the_event_id_as_idempotency_key() {
    let mut provider = FakeProvider::start(answer(201, r#"{"id":"ch_1"}"#)).await;
    let handler = provider.handler("/v1", Duration::from_secs(10));

    let outcome = bounded(handler.handle(record(Some(event_json("120.5").as_bytes())))).await;

    assert_eq!(outcome, Ok(()));
    let request = provider.only_request();
    assert_eq!(request.method, Method::POST);
    assert_eq!(request.path, "/v1/charges");
    assert_eq!(request.idempotency_key.as_deref(), Some(EVENT_ID));
    assert_eq!(request.content_type.as_deref(), Some("application/json"));
    assert_eq!(request.body, json!({"order_id": ORDER_ID, "customer_id": CUSTOMER_ID, "amount": "120.50"}));
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
        // Already charged under this idempotency key: a redelivery.
        (answer(409, r#"{"error":"idempotency key already used"}"#), Ok(())),
        (
            answer(503, r#"{"error":"overloaded"}"#),
            transient(r#"billing provider answered 503 Service Unavailable: {"error":"overloaded"}"#),
        ),
        (answer(500, "boom\n"), transient("billing provider answered 500 Internal Server Error: boom")),
        (answer(502, ""), transient("billing provider answered 502 Bad Gateway")),
        (answer(408, ""), transient("billing provider answered 408 Request Timeout")),
        (answer(425, ""), transient("billing provider answered 425 Too Early")),
        (answer(429, "slow down"), transient("billing provider answered 429 Too Many Requests: slow down")),
        (
            answer(400, r#"{"error":"invalid amount"}"#),
            permanent(r#"billing provider answered 400 Bad Request: {"error":"invalid amount"}"#),
        ),
        (answer(401, ""), permanent("billing provider answered 401 Unauthorized")),
        (answer(404, "no such route"), permanent("billing provider answered 404 Not Found: no such route")),
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
        assert_eq!(outcome, expected, "{answer:?}");
        assert_eq!(provider.only_request().idempotency_key.as_deref(), Some(EVENT_ID), "{answer:?}");
    }
}

#[tokio::test]
async fn charge_tells_new_charges_from_redeliveries() {
    let event = OrderConfirmedEvent::from_json(event_json("120.50").as_bytes()).unwrap();
    for (status, expected) in [(201, ChargeOutcome::Charged), (409, ChargeOutcome::AlreadyCharged)] {
        let provider = FakeProvider::start(answer(status, "")).await;
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
    let handler = ChargeHandler::new(ProviderConfig {
        base_url: format!("http://{address}"),
        timeout: Duration::from_secs(10),
        idle_connections: 8,
    })
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
    let table: &[(Option<&[u8]>, &str)] = &[
        (None, "record has no value: expected an OrderConfirmedEvent JSON object"),
        (Some(b""), "payload is empty: expected an OrderConfirmedEvent JSON object"),
        (Some(b"{}"), "missing field event_id"),
        (Some(b"not json"), "invalid JSON at line 1 column 2: expected ident"),
        (Some(negative.as_bytes()), "total_amount must be positive, got -5.00"),
        (Some(too_precise.as_bytes()), "total_amount has more than 2 decimal places: 1.005"),
    ];
    let mut provider = FakeProvider::start(answer(201, "")).await;
    let handler = provider.handler("", Duration::from_secs(10));
    for &(value, message) in table {
        let outcome = bounded(handler.handle(record(value))).await;
        let expected = HandlerError::permanent(format!("invalid order-confirmed event: {message}"));
        assert_eq!(outcome, Err(expected), "{value:?}");
    }
    // Events built in code are checked too.
    let mut event = OrderConfirmedEvent::from_json(event_json("1.00").as_bytes()).unwrap();
    event.total_amount = "0.001".parse().unwrap();
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
        let actual = ChargeHandler::new(ProviderConfig { base_url: base_url.to_owned(), timeout, idle_connections: 8 });
        match (actual, expected) {
            (Ok(handler), Ok(url)) => assert_eq!(handler.charges_url(), url, "{base_url}"),
            (Err(error), Err(message)) => assert_eq!(error.to_string(), message, "{base_url}"),
            (actual, expected) => panic!("{base_url}: expected {expected:?}, got {actual:?}"),
        }
    }

    let zero = ChargeHandler::new(ProviderConfig {
        base_url: "http://127.0.0.1".to_owned(),
        timeout: Duration::ZERO,
        idle_connections: 8,
    });
    assert!(matches!(zero, Err(Error::ZeroTimeout)), "{zero:?}");
}
