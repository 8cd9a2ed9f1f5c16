//! The second service end to end: `stock`'s example service as a process, a
//! real broker, and a fake inventory over real HTTP.

use std::{
    collections::{HashMap, VecDeque},
    path::PathBuf,
    process::Stdio,
    sync::{Arc, Mutex},
};

use axum::{
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    routing::put,
    Router,
};
use integration::{broker_addr, unique_topic, within, MockCluster};
use retry_core::{header_names, RetryTopology};
use tokio::process::Command;

use crate::support::{eventually, header, produce, read_partition, SETTLE};

fn stock_service() -> PathBuf {
    match std::env::var_os("STOCK_SERVICE_BIN") {
        Some(path) if !path.is_empty() => path.into(),
        _ => panic!("STOCK_SERVICE_BIN is not set: run these tests with `cargo xtask integration`, which builds it"),
    }
}

/// An inventory whose answers are scripted per order (200 once the script
/// is used up), recording every reservation request.
#[derive(Default)]
struct Inventory {
    answers: Mutex<HashMap<String, VecDeque<u16>>>,
    /// (order, idempotency key, status answered), in arrival order.
    requests: Mutex<Vec<(String, String, u16)>>,
}

impl Inventory {
    fn requests_for(&self, order: &str) -> Vec<(String, u16)> {
        let requests = self.requests.lock().unwrap();
        requests.iter().filter(|r| r.0 == order).map(|r| (r.1.clone(), r.2)).collect()
    }
}

async fn reserve(State(inventory): State<Arc<Inventory>>, Path(order): Path<String>, headers: HeaderMap) -> StatusCode {
    let status = inventory.answers.lock().unwrap().get_mut(&order).and_then(VecDeque::pop_front).unwrap_or(200);
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    inventory.requests.lock().unwrap().push((order, key, status));
    StatusCode::from_u16(status).unwrap()
}

#[tokio::test]
async fn the_stock_service_reserves_retries_short_stock_and_dead_letters_what_it_cannot_reserve() {
    let inventory = Arc::new(Inventory::default());
    inventory
        .answers
        .lock()
        .unwrap()
        .extend([("short".to_owned(), VecDeque::from([409, 409])), ("unknown-sku".to_owned(), VecDeque::from([422]))]);
    let app = Router::new().route("/reservations/{order}", put(reserve)).with_state(inventory.clone());
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let inventory_url = format!("http://{}", server.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(server, app).await });

    let topic = unique_topic("stock");
    let schedule = "200ms,400ms";
    let topology = RetryTopology::new(&topic, &schedule.parse().unwrap()).unwrap();
    let service = |args: &[&str]| {
        let mut cmd = Command::new(stock_service());
        cmd.args(args)
            .env_clear()
            .env("KAFKA_BROKERS", broker_addr())
            .envs(integration::billing_broker_env())
            .env("STOCK_TOPIC", &topic)
            .env("STOCK_GROUP", format!("{topic}-stock"))
            .env("STOCK_RETRY_SCHEDULE", schedule)
            .env("STOCK_PARTITIONS", "1")
            .env("STOCK_REPLICATION_FACTOR", integration::replication_factor().to_string())
            .env("INVENTORY_URL", &inventory_url)
            .kill_on_drop(true);
        cmd
    };
    if MockCluster::from_env().is_some() {
        // No CreateTopics on the mock cluster.
        let plan = retry_kafka::TopicPlan::new(topology.clone(), 1);
        integration::create_plan(&plan, &integration::connection("kafka-retry-it")).await;
    } else {
        let out = within("stock-service create-topics", service(&["create-topics"]).output()).await.unwrap();
        assert!(out.status.success(), "create-topics failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    // With a token, it serves the operators' API and console of its ladder.
    let operators = crate::billing::free_addr();
    let token = "stock-operators-token-0123456789";
    let mut running = service(&[])
        .env("ADMIN_TOKEN", token)
        .env("OPERATOR_LISTEN", &operators)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let order = |id: &str| format!(r#"{{"event_id":"event-{id}","order_id":"{id}"}}"#);
    for id in ["short", "unknown-sku", "plain"] {
        produce(&topic, 0, id, &order(id), &[]).await;
    }
    produce(&topic, 0, "garbage", "not json", &[]).await;

    let dlq = topology.dead_letter_topic().as_str();
    let dead = eventually("two dead letters", SETTLE, || async {
        let dead = read_partition(dlq, 0).await;
        (dead.len() >= 2).then_some(dead)
    })
    .await;
    eventually("short stock reserved on the third attempt", SETTLE, || async {
        (inventory.requests_for("short").len() == 3).then_some(())
    })
    .await;
    // The console loads, and the API it calls sees the stock ladder's dead
    // letters and listener.
    let http = reqwest::Client::new();
    let console = http.get(format!("http://{operators}/console")).send().await.unwrap();
    assert_eq!(console.status(), 200);
    assert!(console.headers()["content-security-policy"].to_str().unwrap().contains("script-src 'self'"));
    let admin = |path: &str| {
        let request = http.get(format!("http://{operators}{path}")).bearer_auth(token);
        async move { request.send().await.unwrap().json::<serde_json::Value>().await.unwrap() }
    };
    let list = admin("/admin/dlq").await;
    assert_eq!(
        (list["topics"][0]["topic"].as_str(), list["topics"][0]["backlog"].as_i64()),
        (Some(dlq), Some(2)),
        "{list}"
    );
    let listener = eventually("the stock listener's brake shown", SETTLE, || async {
        let listener = admin("/admin/listener").await;
        (listener["consumed_here"] == true).then_some(listener)
    })
    .await;
    assert_eq!(listener["group"], format!("{topic}-stock"), "{listener}");

    let pid = running.id().unwrap().to_string();
    std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let status = within("stock-service to stop", running.wait()).await.unwrap();
    assert!(status.success(), "stock-service exited with {status}");

    // Stopped: what the inventory saw is final.
    let statuses = |id: &str| inventory.requests_for(id).into_iter().map(|(_, s)| s).collect::<Vec<_>>();
    assert_eq!(statuses("short"), [409, 409, 200], "short stock is retried until it is there");
    assert_eq!(statuses("unknown-sku"), [422], "a 422 is never retried");
    assert_eq!(statuses("plain"), [200]);
    assert!(inventory.requests_for("short").iter().all(|(key, _)| key == "event-short"), "the event id is the key");
    let mut reasons: Vec<(String, String)> = dead
        .iter()
        .map(|r| {
            let key = String::from_utf8_lossy(r.record.key.as_deref().unwrap_or_default()).into_owned();
            (key, header(&r.record, header_names::DEAD_LETTER_REASON))
        })
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [("garbage".into(), "permanent-failure".into()), ("unknown-sku".into(), "permanent-failure".into())]
    );
    for rung in 0..2 {
        let retried = read_partition(topology.retry_topic(rung).unwrap().as_str(), 0).await;
        let keys: Vec<_> = retried.iter().map(|r| r.record.key.clone().unwrap_or_default()).collect();
        assert_eq!(keys, [b"short".to_vec()], "rung {rung} holds the short-stock order once");
    }
}
