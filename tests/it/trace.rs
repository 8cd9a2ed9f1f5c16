//! One order, one trace: billing-bin exporting spans over OTLP/HTTP to a
//! receiver in the test, for an order that fails transiently on every
//! attempt, is dead-lettered, replayed by an operator and charged.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use axum::{body::Bytes, extract::State, routing::post, Router};
use integration::fake_provider::{FakeProvider, Faults, Script};
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest,
    common::v1::{any_value::Value, AnyValue},
};
use prost::Message;

use crate::{
    billing::{call, event, free_addr, wait_drained, Setup, TOKEN},
    support::{eventually, header, produce, read_partition, SETTLE},
};

/// A span as the receiver got it: ids in hex, attributes as text.
#[derive(Debug, Clone)]
struct SeenSpan {
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    start: u64,
    attributes: BTreeMap<String, String>,
    service: String,
}

impl SeenSpan {
    fn attr(&self, name: &str) -> &str {
        self.attributes.get(name).map_or("", String::as_str)
    }
}

/// An OTLP/HTTP receiver (`POST /v1/traces`, protobuf) that keeps every span.
struct OtlpReceiver {
    url: String,
    spans: Arc<Mutex<Vec<SeenSpan>>>,
}

fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl OtlpReceiver {
    async fn start() -> OtlpReceiver {
        let spans: Arc<Mutex<Vec<SeenSpan>>> = Arc::default();
        async fn traces(State(spans): State<Arc<Mutex<Vec<SeenSpan>>>>, body: Bytes) -> &'static str {
            let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export request");
            let mut seen = spans.lock().unwrap();
            for resource in request.resource_spans {
                let service = resource
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .find(|a| a.key == "service.name")
                    .map(|a| text(&a.value))
                    .unwrap_or_default();
                for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                    seen.push(SeenSpan {
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent: hex(&span.parent_span_id),
                        name: span.name,
                        start: span.start_time_unix_nano,
                        attributes: span.attributes.iter().map(|a| (a.key.clone(), text(&a.value))).collect(),
                        service: service.clone(),
                    });
                }
            }
            ""
        }
        let app = Router::new().route("/v1/traces", post(traces)).with_state(spans.clone());
        let addr = free_addr();
        let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        OtlpReceiver { url: format!("http://{addr}"), spans }
    }

    /// The spans of trace `trace_id` so far, in the order they started.
    fn trace(&self, trace_id: &str) -> Vec<SeenSpan> {
        let mut spans: Vec<SeenSpan> =
            self.spans.lock().unwrap().iter().filter(|s| s.trace_id == trace_id).cloned().collect();
        spans.sort_by_key(|s| s.start);
        spans
    }

    /// Every span whose name is `name`.
    fn named(&self, name: &str) -> Vec<SeenSpan> {
        self.spans.lock().unwrap().iter().filter(|s| s.name == name).cloned().collect()
    }
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER: &str = "00f067aa0ba902b7";

#[tokio::test]
async fn one_order_is_one_trace_through_its_retries_its_dead_letter_and_its_replay() {
    use reqwest::Method;
    let receiver = OtlpReceiver::start().await;
    let setup = Setup::new("trace");
    setup.create_topics().await;
    let provider = FakeProvider::start(Faults::default()).await;
    // Three attempts (the source and two rungs), three 503s: dead-lettered.
    // The fourth request, the replay's, is charged.
    let (order, json) = event(r#""12.00""#);
    provider.script(&order.to_string(), Script::FailTimes { times: 3 });
    let (garbled, garbled_json) = event(r#""5.00""#);
    let env = [
        ("ADMIN_TOKEN", TOKEN),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("OTEL_SERVICE_NAME", "billing-it"),
    ];
    let service = setup.start_with(&provider, &env).await;
    let traceparent = format!("00-{TRACE}-{PRODUCER}-01");
    produce(&setup.topic, 0, &order.to_string(), &json, &[("traceparent", traceparent.as_bytes())]).await;
    produce(&setup.topic, 1, &garbled.to_string(), &garbled_json, &[("traceparent", b"00-not-a-context-01")]).await;

    let dlq = setup.dlq();
    let dead = eventually("the dead letter", SETTLE, || async {
        let dead = read_partition(&dlq, 0).await;
        (!dead.is_empty()).then_some(dead)
    })
    .await;
    assert_eq!(dead.len(), 1);
    let dead_parent = header(&dead[0].record, "traceparent");
    assert!(dead_parent.starts_with(&format!("00-{TRACE}-")), "the dead letter keeps the trace: {dead_parent}");

    // The operators see which trace it belongs to, in the API and from a terminal.
    let (status, page) =
        call(&service, Method::GET, &format!("/admin/dlq/{dlq}/messages?limit=10"), Some(TOKEN), None).await;
    assert_eq!((status, page["messages"][0]["trace_id"].as_str()), (200, Some(TRACE)), "{page}");
    let (code, stdout, stderr) = setup.dlq_cli(&service, &["show"]).await;
    assert_eq!(code, 0, "{stderr}");
    let shown: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(shown["messages"][0]["trace_id"].as_str(), Some(TRACE), "{shown}");

    let replay = format!("/admin/dlq/{dlq}/replay?target_topic={}&wait=true", setup.topic);
    let (status, done) = call(&service, Method::POST, &replay, Some(TOKEN), None).await;
    assert_eq!((status, done["report"]["replayed"].as_u64()), (200, Some(1)), "{done}");
    eventually("the order charged", SETTLE, || async {
        (provider.charges_for(&order.to_string()).len() == 1).then_some(())
    })
    .await;
    eventually("the garbled order charged", SETTLE, || async {
        (provider.charges_for(&garbled.to_string()).len() == 1).then_some(())
    })
    .await;
    wait_drained(&setup).await;
    let malformed = format!(r#"kafka_retry_malformed_trace_context_total{{topic="{}"}}"#, setup.topic);
    assert_eq!(service.metric(&malformed).await, Some(1.0), "the garbled traceparent is counted");
    // Stopping exports what is left.
    service.stop().await;

    let spans = receiver.trace(TRACE);
    let attempts: Vec<&SeenSpan> = spans.iter().filter(|s| s.name.starts_with("process ")).collect();
    let replays: Vec<&SeenSpan> = spans.iter().filter(|s| s.name.starts_with("replay ")).collect();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!((attempts.len(), replays.len()), (4, 1), "{names:?}");
    let expected = [
        (format!("process {}", setup.topic), "1", "retry"),
        (format!("process {}", setup.retry_topic(0)), "2", "retry"),
        (format!("process {}", setup.retry_topic(1)), "3", "dead_letter"),
        (format!("process {}", setup.topic), "1", "commit"),
    ];
    for (span, (name, attempt, decision)) in attempts.iter().zip(&expected) {
        assert_eq!(
            (span.name.as_str(), span.attr("kafka_retry.attempt"), span.attr("kafka_retry.decision")),
            (name.as_str(), *attempt, *decision),
            "{span:?}"
        );
        assert_eq!(span.attr("messaging.system"), "kafka");
        assert_eq!(span.attr("messaging.operation.type"), "process");
        assert_eq!(span.attr("messaging.destination.partition.id"), "0");
        assert_eq!(span.attr("messaging.kafka.message.key"), order.to_string());
        assert_eq!(span.service, "billing-it");
    }
    assert_eq!(attempts[0].attr("messaging.consumer.group.name"), setup.group);
    assert_eq!(attempts[0].attr("messaging.destination.name"), setup.topic);
    assert_eq!(attempts[2].attr("kafka_retry.dead_letter.reason"), "retries-exhausted");
    assert_eq!(replays[0].name, format!("replay {}", setup.topic));

    // Each step the child of the one before: the producer's span, the
    // attempts, the replay of the dead letter, the attempt it caused.
    let chain = [attempts[0], attempts[1], attempts[2], replays[0], attempts[3]];
    assert_eq!(chain[0].parent, PRODUCER);
    for pair in chain.windows(2) {
        assert_eq!(pair[1].parent, pair[0].span_id, "{} follows {}", pair[1].name, pair[0].name);
        assert!(pair[1].start >= pair[0].start);
    }
    assert_eq!(dead_parent, format!("00-{TRACE}-{}-01", attempts[2].span_id));

    // Each call to the provider is a child of the attempt that made it.
    let calls = provider.traceparents(&order.to_string());
    let made_by: Vec<String> = attempts.iter().map(|a| format!("00-{TRACE}-{}-01", a.span_id)).collect();
    assert_eq!(calls, made_by);

    // The garbled context is ignored: its order's attempt starts a trace of its own.
    let garbled_attempts: Vec<SeenSpan> = receiver
        .named(&format!("process {}", setup.topic))
        .into_iter()
        .filter(|s| s.attr("messaging.kafka.message.key") == garbled.to_string())
        .collect();
    assert_eq!(garbled_attempts.len(), 1);
    assert!(
        garbled_attempts[0].trace_id != TRACE && garbled_attempts[0].parent.is_empty(),
        "{:?}",
        garbled_attempts[0]
    );
    let garbled_calls = provider.traceparents(&garbled.to_string());
    assert_eq!(garbled_calls, [format!("00-{}-{}-01", garbled_attempts[0].trace_id, garbled_attempts[0].span_id)]);
}

/// A record whose `traceparent` a foreign producer wrote (librdkafka,
/// through confluent-kafka): its attempt continues that trace, and the
/// provider's call with it.
#[tokio::test]
async fn a_foreign_producers_trace_is_continued() {
    let receiver = OtlpReceiver::start().await;
    let setup = Setup::new("trace-foreign");
    setup.create_topics().await;
    let provider = FakeProvider::start(Faults::default()).await;
    let env = [("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "100")];
    let service = setup.start_with(&provider, &env).await;
    let (order, json) = event(r#""7.00""#);
    const FOREIGN_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
    const FOREIGN_SPAN: &str = "b7ad6b7169203331";
    let traceparent = format!("traceparent=00-{FOREIGN_TRACE}-{FOREIGN_SPAN}-01");
    let brokers = integration::broker_addr();
    let order_key = order.to_string();
    let args = ["produce", "--brokers", &brokers, "--topic", &setup.topic, "--partition", "1", "--key", &order_key];
    integration::kafka_client(
        &[&args[..], &["--value", &json, "--header", &traceparent, "--header", "tracestate=rojo=00f067aa0ba902b7"]]
            .concat(),
    )
    .await;
    eventually("the order charged", SETTLE, || async {
        (provider.charges_for(&order.to_string()).len() == 1).then_some(())
    })
    .await;
    wait_drained(&setup).await;
    service.stop().await;

    let spans = receiver.trace(FOREIGN_TRACE);
    assert_eq!(spans.len(), 1, "{spans:?}");
    let attempt = &spans[0];
    assert_eq!(
        (attempt.name.as_str(), attempt.parent.as_str()),
        (format!("process {}", setup.topic).as_str(), FOREIGN_SPAN)
    );
    assert_eq!(
        (attempt.attr("kafka_retry.decision"), attempt.attr("messaging.destination.partition.id")),
        ("commit", "1")
    );
    assert_eq!(provider.traceparents(&order.to_string()), [format!("00-{FOREIGN_TRACE}-{}-01", attempt.span_id)]);
    assert_eq!(attempt.service, "billing-bin", "the service's name without OTEL_SERVICE_NAME");
}
