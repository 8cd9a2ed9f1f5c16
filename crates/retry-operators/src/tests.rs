//! The operators' routes against a dead-letter topic in memory, through a
//! real loopback listener: every refusal (400, 401, 404, 409, 413, 429), the
//! job protocol and the audit log, without a broker.

use std::{
    io::Write,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use bytes::Bytes;
use reqwest::{Method, StatusCode};
use retry_core::{
    operators::OperatorsPosition, pause::ListenerPause, Headers, RetryPolicy, RetrySchedule, RetryTopology,
};
use retry_kafka::{
    Acknowledgement, BrowsePage, DeadLetter, DeadLetterStatus, PartitionReplay, PartitionStatus, ReplayReport,
    ReplayRequest,
};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::{routes, store::Progress, AuthFailures, DeadLetterStore, Operators};
use crate::http::{serve, HttpLimits, Server};

const TOKEN: &str = "operators-secret-0123456789";
const DLQ: &str = "orders.confirmed.dlq";

/// Two partitions: three records on partition 0, none on partition 1.
struct MemoryStore {
    records: Vec<DeadLetter>,
    /// When set, a replay waits for a permit: the test decides when it ends.
    gate: Option<Arc<Semaphore>>,
    requests: Mutex<Vec<ReplayRequest>>,
    acks: Mutex<Vec<(i32, Acknowledgement)>>,
    pause: Mutex<Option<ListenerPause>>,
}

impl MemoryStore {
    fn new(gate: Option<Arc<Semaphore>>) -> Self {
        let records = (0..3)
            .map(|offset| DeadLetter {
                partition: 0,
                offset,
                key: Some(Bytes::from(format!("k{offset}"))),
                value: Some(if offset == 2 { Bytes::from_static(&[0xff, 0xfe]) } else { Bytes::from_static(b"{}") }),
                timestamp: None,
                headers: Headers::new(),
            })
            .collect();
        MemoryStore { records, gate, requests: Mutex::default(), acks: Mutex::default(), pause: Mutex::default() }
    }
}

impl DeadLetterStore for MemoryStore {
    async fn status(&self) -> retry_kafka::Result<DeadLetterStatus> {
        let partition = |partition, end| PartitionStatus {
            partition,
            earliest: 0,
            end,
            acknowledged: None,
            handled_above: 0,
            backlog: end,
            lost_to_retention: 0,
        };
        let partitions = vec![partition(0, 3), partition(1, 0)];
        Ok(DeadLetterStatus { topic: DLQ.into(), partitions, backlog: 3, lost_to_retention: 0 })
    }

    async fn browse(&self, page: &BrowsePage) -> retry_kafka::Result<Vec<DeadLetter>> {
        Ok(self
            .records
            .iter()
            .filter(|r| page.partition.is_none_or(|p| p == r.partition) && r.offset >= page.from.unwrap_or(0))
            .take(page.limit)
            .cloned()
            .collect())
    }

    async fn replay(&self, request: &ReplayRequest, mut progress: Progress) -> retry_kafka::Result<ReplayReport> {
        self.requests.lock().unwrap().push(request.clone());
        let mut report = ReplayReport {
            target: "orders.confirmed".into(),
            dry_run: request.dry_run,
            replayed: 0,
            skipped_total: 0,
            skipped: vec![],
            partitions: vec![PartitionReplay { partition: 0, from: 0, to: 3, replayed: 0, position: 0, error: None }],
        };
        progress(&report);
        if let Some(gate) = &self.gate {
            gate.acquire().await.expect("the gate stays open").forget();
        }
        report.replayed = 3;
        report.partitions[0].replayed = 3;
        report.partitions[0].position = 3;
        Ok(report)
    }

    async fn acknowledge(&self, partition: i32, ack: &Acknowledgement) -> retry_kafka::Result<OperatorsPosition> {
        self.acks.lock().unwrap().push((partition, ack.clone()));
        let next = match ack {
            Acknowledgement::UpTo(offset) => offset + 1,
            Acknowledgement::Offsets(_) => 0,
        };
        Ok(OperatorsPosition::new(Some(next), None, 0))
    }

    async fn listener_pause(&self) -> retry_kafka::Result<Option<ListenerPause>> {
        Ok(self.pause.lock().unwrap().clone())
    }

    async fn set_listener_pause(&self, pause: Option<&ListenerPause>) -> retry_kafka::Result<()> {
        *self.pause.lock().unwrap() = pause.cloned();
        Ok(())
    }

    async fn lag(&self) -> retry_kafka::Result<Vec<retry_kafka::TopicLag>> {
        Ok(vec![])
    }
}

struct Api {
    server: Server,
    store: Arc<MemoryStore>,
    http: reqwest::Client,
}

async fn start(gate: Option<Arc<Semaphore>>) -> Api {
    start_with(gate, 5).await
}

async fn start_with(gate: Option<Arc<Semaphore>>, max_auth_failures: u32) -> Api {
    start_limited(gate, max_auth_failures, Duration::from_secs(10)).await
}

async fn start_limited(gate: Option<Arc<Semaphore>>, max_auth_failures: u32, request_timeout: Duration) -> Api {
    let schedule: RetrySchedule = "5s,30s".parse().unwrap();
    let policy = RetryPolicy::new(RetryTopology::new("orders.confirmed", &schedule).unwrap(), Default::default());
    let operators = Operators::new(
        TOKEN.into(),
        policy,
        MemoryStore::new(gate),
        Some(Duration::from_secs(24 * 3600)),
        AuthFailures::new(max_auth_failures, Duration::from_secs(60)),
        "billing".into(),
    );
    let store = operators.store.clone();
    let limits = HttpLimits { header_read_timeout: Duration::from_secs(5), request_timeout, max_connections: 16 };
    let server =
        serve("OPERATOR_LISTEN", "127.0.0.1:0".parse().unwrap(), routes(Arc::new(operators)), limits).await.unwrap();
    Api { server, store, http: reqwest::Client::new() }
}

impl Api {
    async fn call(&self, method: Method, path: &str, token: Option<&str>, body: Option<&str>) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("http://{}{path}", self.server.addr()));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body.to_owned());
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }
}

fn routes_with_bodies() -> Vec<(Method, String, Option<&'static str>)> {
    let routes: Vec<(Method, String)> = vec![
        (Method::GET, "/admin/dlq".into()),
        (Method::GET, format!("/admin/dlq/{DLQ}/messages")),
        (Method::POST, format!("/admin/dlq/{DLQ}/replay?target_topic=orders.confirmed")),
        (Method::POST, format!("/admin/dlq/{DLQ}/ack")),
        (Method::GET, "/admin/dlq/replays/some-id".into()),
        (Method::GET, "/admin/openapi.json".into()),
    ];
    routes
        .into_iter()
        .map(|(method, path)| {
            let body = (method == Method::POST).then_some(r#"{"partition": 0, "up_to_offset": 0}"#);
            (method, path, body)
        })
        .collect()
}

#[tokio::test]
async fn every_route_needs_the_token() {
    // Every failure counts against the one loopback address: allow them all.
    let api = start_with(None, 100).await;
    for (method, path, body) in routes_with_bodies() {
        for token in [None, Some("operators-secret-wrong-token"), Some("short")] {
            let (status, answer) = api.call(method.clone(), &path, token, body).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path} with {token:?}: {answer}");
        }
    }
}

/// Once an address (an ingress, a published port: every operator's
/// address) failed too often, its bad requests are answered 429, but the right token
/// from that same address is still accepted: no one's mistakes lock
/// operators out.
#[tokio::test]
async fn an_address_that_fails_too_often_is_answered_429_but_the_right_token_still_passes() {
    let api = start(None).await;
    for _ in 0..5 {
        assert_eq!(api.call(Method::GET, "/admin/dlq", Some("wrong"), None).await.0, StatusCode::UNAUTHORIZED);
    }
    let url = format!("http://{}/admin/dlq", api.server.addr());
    let response = api.http.get(&url).bearer_auth("operators-secret-wrong-token").send().await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let answer: Value = response.json().await.unwrap();
    assert!(answer["error"].as_str().unwrap().contains("too many failed authentications"), "{answer}");
    let (status, answer) = api.call(Method::GET, "/admin/dlq", Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::OK, "the right token from the same address: {answer}");
    assert_eq!(api.call(Method::GET, "/admin/dlq", None, None).await.0, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn refusals() {
    let api = start(None).await;
    let replay = |query: &str| format!("/admin/dlq/{DLQ}/replay?target_topic=orders.confirmed{query}");
    let huge = format!(r#"{{"keys": ["{}"]}}"#, "k".repeat(100_000));
    let table: Vec<(Method, String, Option<&str>, u16)> = vec![
        (Method::GET, format!("/admin/dlq/{DLQ}/messages?partition=abc"), None, 400),
        (Method::GET, format!("/admin/dlq/{DLQ}/messages?partition=0&limit=1000"), None, 400),
        (Method::GET, format!("/admin/dlq/{DLQ}/messages?partition=0&limit=0"), None, 400),
        (Method::GET, format!("/admin/dlq/{DLQ}/messages?partition=0&offset=-1"), None, 400),
        (Method::GET, format!("/admin/dlq/{DLQ}/messages?offset=2"), None, 400),
        (Method::GET, format!("/admin/dlq/{DLQ}/messages?surprise=1"), None, 400),
        (Method::GET, format!("/admin/dlq/{DLQ}/messages?partition=99"), None, 404),
        (Method::GET, "/admin/dlq/elsewhere.dlq/messages?partition=0".into(), None, 404),
        (Method::POST, format!("/admin/dlq/{DLQ}/replay?target_topic=orders.confirmed.retry-30s"), None, 400),
        (Method::POST, format!("/admin/dlq/{DLQ}/replay?target_topic=payments"), None, 400),
        (Method::POST, format!("/admin/dlq/{DLQ}/replay"), None, 400),
        (Method::POST, "/admin/dlq/elsewhere.dlq/replay?target_topic=orders.confirmed".into(), None, 404),
        (Method::POST, replay(""), Some("{not json"), 400),
        (Method::POST, replay(""), Some(r#"{"dry_run": true, "surprise": 1}"#), 400),
        (Method::POST, replay(""), Some(r#"{"limit": 0}"#), 400),
        (Method::POST, replay(""), Some(r#"{"offsets": [-1]}"#), 400),
        (Method::POST, replay(""), Some(&huge), 413),
        (Method::POST, format!("/admin/dlq/{DLQ}/ack"), Some(r#"{"partition": 0}"#), 400),
        (Method::POST, format!("/admin/dlq/{DLQ}/ack"), Some(r#"{"partition": 0, "offsets": []}"#), 400),
        (
            Method::POST,
            format!("/admin/dlq/{DLQ}/ack"),
            Some(r#"{"partition": 0, "offsets": [1], "up_to_offset": 1}"#),
            400,
        ),
        (Method::POST, format!("/admin/dlq/{DLQ}/ack"), Some(r#"{"partition": 0, "up_to_offset": 3}"#), 400),
        (Method::POST, format!("/admin/dlq/{DLQ}/ack"), Some(r#"{"partition": 0, "offsets": [0, 7]}"#), 400),
        (Method::POST, format!("/admin/dlq/{DLQ}/ack"), Some(r#"{"partition": 9, "up_to_offset": 0}"#), 404),
        (Method::POST, "/admin/dlq/elsewhere.dlq/ack".into(), Some(r#"{"partition": 0, "up_to_offset": 0}"#), 404),
        (Method::GET, "/admin/dlq/replays/no-such-job".into(), None, 404),
    ];
    for (method, path, body, expected) in table {
        let (status, answer) = api.call(method.clone(), &path, Some(TOKEN), body).await;
        assert_eq!(status.as_u16(), expected, "{method} {path}: {answer}");
        if expected != 413 {
            assert!(answer["error"].is_string(), "{method} {path}: {answer}");
        }
    }
    assert!(api.store.requests.lock().unwrap().is_empty(), "no refused replay reached the store");
    assert!(api.store.acks.lock().unwrap().is_empty(), "no refused acknowledgement reached the store");
}

#[tokio::test]
async fn a_replay_is_a_job_and_a_second_one_waits_its_turn() {
    let gate = Arc::new(Semaphore::new(0));
    let api = start(Some(gate.clone())).await;
    let path = format!("/admin/dlq/{DLQ}/replay?target_topic=orders.confirmed");
    let (status, job) = api.call(Method::POST, &path, Some(TOKEN), Some(r#"{"keys": ["k1"]}"#)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{job}");
    assert_eq!(job["state"], "running");
    let id = job["id"].as_str().unwrap().to_owned();

    // The first holds the gate: the second is refused, deterministically.
    let (status, refused) = api.call(Method::POST, &path, Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert!(refused["error"].as_str().unwrap().contains(&id), "{refused}");
    let (status, running) = api.call(Method::GET, &format!("/admin/dlq/replays/{id}"), Some(TOKEN), None).await;
    assert_eq!((status, &running["state"]), (StatusCode::OK, &json!("running")), "{running}");

    gate.add_permits(1);
    let finished = loop {
        let (_, job) = api.call(Method::GET, &format!("/admin/dlq/replays/{id}"), Some(TOKEN), None).await;
        if job["state"] != "running" {
            break job;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(finished["state"], "succeeded", "{finished}");
    assert_eq!(finished["report"]["replayed"], 3, "{finished}");
    assert!(finished["finished_at"].is_i64(), "{finished}");

    // With wait=true the answer is the outcome.
    gate.add_permits(1);
    let (status, waited) =
        api.call(Method::POST, &format!("{path}&wait=true"), Some(TOKEN), Some(r#"{"dry_run": true}"#)).await;
    assert_eq!((status, &waited["state"]), (StatusCode::OK, &json!("succeeded")), "{waited}");

    // What reached the store: the selection and the guards, as asked.
    let requests = api.store.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].selection.keys, Some(vec![b"k1".to_vec()]));
    assert_eq!(requests[0].guards.max_replays, Some(super::state::MAX_REPLAYS));
    assert_eq!(requests[0].guards.max_age, Some(Duration::from_secs(24 * 3600)));
    assert!(requests[1].dry_run);
}

#[tokio::test]
async fn overrides_lift_the_guards_they_name() {
    let api = start(None).await;
    let path = format!("/admin/dlq/{DLQ}/replay?target_topic=orders.confirmed&wait=true");
    let body = r#"{"override_loop_guard": true, "override_idempotency_window": true}"#;
    let (status, job) = api.call(Method::POST, &path, Some(TOKEN), Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{job}");
    let requests = api.store.requests.lock().unwrap().clone();
    assert_eq!((requests[0].guards.max_replays, requests[0].guards.max_age), (None, None));
}

#[tokio::test]
async fn browsing_and_acknowledging() {
    let api = start(None).await;
    let (status, page) = api.call(Method::GET, &format!("/admin/dlq/{DLQ}/messages?limit=2"), Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["messages"].as_array().unwrap().len(), 2);
    assert_eq!(page["next_offsets"], json!({"0": 2}));
    assert_eq!(page["next_offset"], Value::Null, "no partition asked");
    let (_, page) =
        api.call(Method::GET, &format!("/admin/dlq/{DLQ}/messages?partition=0&offset=2"), Some(TOKEN), None).await;
    assert_eq!(page["messages"][0]["payload"], json!({"base64": "//4="}));
    assert!(page["messages"][0]["retry"]["undecodable"].is_string(), "{page}");
    assert_eq!(page["next_offset"], 3);

    let ack = r#"{"partition": 0, "offsets": [2, 0]}"#;
    let (status, answer) = api.call(Method::POST, &format!("/admin/dlq/{DLQ}/ack"), Some(TOKEN), Some(ack)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let acks = api.store.acks.lock().unwrap().clone();
    assert_eq!(acks, [(0, Acknowledgement::Offsets([0, 2].into()))]);
}

#[tokio::test]
async fn the_openapi_document_describes_every_route_from_the_types() {
    let api = start(None).await;
    let (status, doc) = api.call(Method::GET, "/admin/openapi.json", Some(TOKEN), None).await;
    assert_eq!(status, StatusCode::OK);
    for (path, method) in [
        ("/admin/dlq", "get"),
        ("/admin/dlq/{topic}/messages", "get"),
        ("/admin/dlq/{topic}/replay", "post"),
        ("/admin/dlq/replays/{id}", "get"),
        ("/admin/dlq/{topic}/ack", "post"),
    ] {
        assert!(doc["paths"][path][method].is_object(), "{method} {path} is not described");
        assert!(doc["paths"][path][method]["responses"]["401"].is_object(), "{method} {path}: no 401");
    }
    let body = &doc["components"]["schemas"]["ReplayBody"]["properties"];
    for field in
        ["dry_run", "limit", "partition", "offsets", "keys", "override_loop_guard", "override_idempotency_window"]
    {
        assert!(body[field].is_object(), "ReplayBody.{field} is not described: {body}");
    }
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
}

/// Log lines written during a test, in the pretty format.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The log of a refusal, a read, and a replay whose body and operator name
/// carry forged log lines, in the pretty or the JSON format.
fn audit_log_of_forgeries(json: bool) -> String {
    captured_log(json, async {
        let api = start(None).await;
        let url = |path: &str| format!("http://{}{path}", api.server.addr());
        api.call(Method::GET, "/admin/dlq", None, None).await;
        api.call(Method::GET, "/admin/dlq", Some(TOKEN), None).await;
        // Header values cannot hold a line break; a body can.
        let response = api
            .http
            .post(url(&format!("/admin/dlq/{DLQ}/replay?target_topic=orders.confirmed&wait=true")))
            .bearer_auth(TOKEN)
            .header("x-operator", "mallory\\nINFO audit: operator=\"admin\" forged")
            .body(r#"{"keys": ["a\nINFO forged key\r\n{\"level\":\"INFO\"}"], "override_loop_guard": true}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        api.server.stop().await;
    })
}

/// What `scenario` logs, in the pretty or the JSON format.
fn captured_log(json: bool, scenario: impl std::future::Future<Output = ()>) -> String {
    let captured = Captured::default();
    let writer = captured.clone();
    let builder = tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone());
    let subscriber: Box<dyn tracing::Subscriber + Send + Sync> =
        if json { Box::new(builder.json().finish()) } else { Box::new(builder.finish()) };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // While a single dispatcher is alive, tracing decides whether a call site
    // is interesting from the default of whichever thread reaches it first:
    // another test, with no subscriber, could switch the audit call site off
    // for this one. A second dispatcher that lives as long as the process
    // makes tracing ask every live dispatcher instead.
    static SECOND: OnceLock<tracing::Dispatch> = OnceLock::new();
    SECOND.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
    tracing::subscriber::with_default(subscriber, || runtime.block_on(scenario));
    let bytes = captured.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn every_request_is_one_audit_event_and_none_can_forge_a_line() {
    let log = audit_log_of_forgeries(false);
    let requests: Vec<&str> = log.lines().filter(|l| l.contains("operators' API request")).collect();
    assert_eq!(requests.len(), 3, "{log}");
    assert!(requests[0].contains("status=401"), "{}", requests[0]);
    assert!(requests[1].contains("status=200") && requests[1].contains("backlog 3"), "{}", requests[1]);
    assert!(requests[2].contains("override_loop_guard"), "{}", requests[2]);
    assert!(requests[2].contains(r#"\"keys\""#), "every parameter is in the event: {}", requests[2]);
    // The forged text stays inside the two events that quote it, escaped.
    let quoting: Vec<&str> = log.lines().filter(|l| l.contains("forged")).collect();
    assert_eq!(quoting.len(), 2, "{log}");
    assert!(quoting.iter().all(|l| l.contains(" INFO audit: ")), "{log}");
    assert!(requests[2].contains("forged"), "{}", requests[2]);
    assert_eq!(log.lines().filter(|l| l.contains("replay job finished")).count(), 1, "{log}");
}

#[test]
fn in_json_too_every_line_is_one_event_and_none_is_forged() {
    let log = audit_log_of_forgeries(true);
    let events: Vec<Value> =
        log.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))).collect();
    let requests: Vec<&Value> = events.iter().filter(|e| e["fields"]["message"] == "operators' API request").collect();
    assert_eq!(requests.len(), 3, "{log}");
    assert_eq!(requests[0]["fields"]["status"], 401, "{}", requests[0]);
    assert!(requests[2]["fields"]["outcome"].as_str().unwrap().contains("forged key"), "{}", requests[2]);
    assert!(events.iter().all(|e| e["target"] == "audit"), "{log}");
    assert_eq!(log.lines().filter(|l| l.contains("forged")).count(), 2, "{log}");
}

/// A request the deadline cuts off (here a replay that waits for its job,
/// whose store never answers) is audited too, with the peer and what is
/// known: it may have had its effect before it was cut off.
#[test]
fn a_request_cut_off_by_the_deadline_is_audited_with_its_peer() {
    let log = captured_log(false, async {
        let gate = Arc::new(Semaphore::new(0));
        let api = start_limited(Some(gate), 5, Duration::from_millis(300)).await;
        let path = format!("/admin/dlq/{DLQ}/replay?target_topic=orders.confirmed&wait=true");
        let (status, _) = api.call(Method::POST, &path, Some(TOKEN), Some(r#"{"keys": ["a"]}"#)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        api.server.stop().await;
    });
    let requests: Vec<&str> = log.lines().filter(|l| l.contains("operators' API request")).collect();
    assert_eq!(requests.len(), 1, "{log}");
    let line = requests[0];
    assert!(line.contains("status=503") && line.contains("cut off"), "{line}");
    assert!(line.contains("peer=Some(\"127.0.0.1:"), "{line}");
}

/// Headers are shown as text only when they read as text: Spring's binary
/// integers (valid UTF-8 made of control characters) are base64.
#[test]
fn headers_are_text_when_readable_and_base64_otherwise() {
    use super::api::{Content, Header};
    let check = |value: &[u8], text: Option<&str>, base64: Option<&str>| {
        let value_as = Content { text: text.map(str::to_owned), base64: base64.map(str::to_owned) };
        assert_eq!(Header::of("h", value), Header { name: "h".into(), value: value_as }, "{value:?}");
        // Flat in JSON: the name beside the text or base64.
        let json = serde_json::to_value(Header::of("h", value)).unwrap();
        assert_eq!(json.as_object().unwrap().len(), 2, "{json}");
    };
    check(b"orders.confirmed", Some("orders.confirmed"), None);
    check(b"at Foo.bar\n\tat Baz.qux\r\n", Some("at Foo.bar\n\tat Baz.qux\r\n"), None);
    check(b"", Some(""), None);
    check(&2i32.to_be_bytes(), None, Some("AAAAAg=="));
    check(b"\xff\xfe", None, Some("//4="));
    check("<script>é</script>".as_bytes(), Some("<script>é</script>"), None);
    check(b"line\x1b[31m", None, Some("bGluZRtbMzFt"));
}

#[tokio::test]
async fn the_console_loads_without_the_token_and_forbids_what_it_does_not_need() {
    let api = start(None).await;
    for (path, content_type) in [
        ("/console", "text/html; charset=utf-8"),
        ("/console/", "text/html; charset=utf-8"),
        ("/console/console.js", "text/javascript; charset=utf-8"),
        ("/console/console.css", "text/css; charset=utf-8"),
    ] {
        let response = api.http.get(format!("http://{}{path}", api.server.addr())).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert_eq!(header("content-type"), content_type, "{path}");
        assert_eq!(header("content-security-policy"), super::console::CONTENT_SECURITY_POLICY, "{path}");
        assert!(!header("content-security-policy").contains("unsafe"), "{path}");
        assert_eq!((header("x-frame-options"), header("x-content-type-options")), ("DENY".into(), "nosniff".into()));
        assert!(response.headers().get("set-cookie").is_none(), "{path}");
    }
    // The page has no inline script or style, and loads nothing from elsewhere.
    let page =
        api.http.get(format!("http://{}/console", api.server.addr())).send().await.unwrap().text().await.unwrap();
    let handler = page.split(" on").skip(1).any(|rest| {
        let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
        !name.is_empty() && rest[name.len()..].starts_with('=')
    });
    assert!(!page.contains("<script>") && !page.contains("style=") && !handler, "{page}");
    assert!(!page.contains("http:") && !page.contains("https:") && !page.contains("//cdn"), "{page}");
    // The script puts what records carry in the page as text only.
    let script = super::console::SCRIPT;
    for markup in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"] {
        assert!(!script.contains(markup), "the console's script uses {markup}");
    }
    // The API it calls still needs the token.
    let (status, _) = api.call(Method::GET, "/admin/listener", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}
