//! The operators' console in a real browser, and the operators' pause of a
//! listener across instances, through the API and `billing-bin dlq`.

use std::{path::PathBuf, time::Duration};

use integration::fake_provider::{FakeProvider, Faults, Script};
use reqwest::Method;

use crate::{
    billing::{call, event, Service, Setup, TOKEN},
    support::{eventually, produce},
};

/// How long the browser may take to go through the console.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(120);

/// Waits until `service` says its own records wait for a pause (`true`) or
/// run (`false`), and returns its answer.
async fn paused_here(service: &Service, paused: bool) -> serde_json::Value {
    eventually(&format!("the instance to see paused={paused}"), Duration::from_secs(30), || async {
        let (status, answer) = call(service, Method::GET, "/admin/listener", Some(TOKEN), None).await;
        assert_eq!(status, 200, "{answer}");
        (answer["paused_here"] == paused).then_some(answer)
    })
    .await
}

#[tokio::test]
async fn a_pause_holds_every_instance_until_it_ends_or_is_resumed() {
    let setup = Setup { partitions: 2, ..Setup::new("billing-pause") };
    setup.create_topics().await;
    let provider = FakeProvider::start(Faults::default()).await;
    let env = [("ADMIN_TOKEN", TOKEN)];
    let first = setup.start_with(&provider, &env).await;
    let second = setup.start_with(&provider, &env).await;

    // Before: both consume, nothing is paused, and the lag is listed for
    // the source and each rung.
    let answer = paused_here(&second, false).await;
    assert_eq!((answer["consumed_here"].as_bool(), answer["pause"].is_null()), (Some(true), true), "{answer}");
    let lagged: Vec<&str> = answer["lag"].as_array().unwrap().iter().map(|t| t["topic"].as_str().unwrap()).collect();
    let topology = setup.topology();
    let consumed: Vec<&str> = std::iter::once(topology.source_topic().as_str())
        .chain(topology.retry_topics().map(|(_, topic)| topic.as_str()))
        .collect();
    assert_eq!(lagged, consumed);

    // A pause asked of one instance holds on both; orders produced during
    // it are charged only once it ended.
    let body = r#"{"duration": "4s", "reason": "provider maintenance"}"#;
    let (status, pause) = call(&first, Method::POST, "/admin/listener/pause", Some(TOKEN), Some(body.into())).await;
    assert_eq!(status, 200, "{pause}");
    let until = pause["until_ms"].as_i64().unwrap();
    // Who paused and why ride in the commit's metadata, which tansu drops:
    // there the pause holds all the same, unattributed.
    let attributed = integration::broker_kind() != integration::BrokerKind::Tansu;
    for service in [&first, &second] {
        let answer = paused_here(service, true).await;
        assert_eq!(answer["pause"]["until_ms"].as_i64(), Some(until), "{answer}");
        let reason = if attributed { "provider maintenance" } else { "" };
        assert_eq!(answer["pause"]["reason"], reason, "{answer}");
    }
    let mut orders = Vec::new();
    for partition in [0, 1, 0, 1] {
        let (order, json) = event("12.50");
        produce(&setup.topic, partition, &order.to_string(), &json, &[]).await;
        orders.push(order.to_string());
    }
    eventually("every order charged after the pause", Duration::from_secs(60), || async {
        orders.iter().all(|o| provider.ledger().iter().any(|c| c.order_id == *o)).then_some(())
    })
    .await;
    for order in &orders {
        let arrivals = provider.arrivals(order);
        assert!(
            arrivals.iter().all(|at| *at >= until),
            "{order} was charged at {arrivals:?}, before the pause ended at {until}"
        );
    }
    paused_here(&first, false).await;

    // A long pause, through `billing-bin dlq`, ended early by a resume on
    // the other instance: the orders waiting for it are charged.
    let (code, stdout, stderr) =
        setup.dlq_cli(&first, &["pause", "--for", "1h", "--reason", "deploying the provider"]).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    paused_here(&second, true).await;
    // An instance started during the pause reads it before it joins: ready,
    // it already holds its records.
    let third = setup.start_with(&provider, &env).await;
    let (_, answer) = call(&third, Method::GET, "/admin/listener", Some(TOKEN), None).await;
    assert_eq!(answer["paused_here"], true, "{answer}");
    let (order, json) = event("7.00");
    produce(&setup.topic, 1, &order.to_string(), &json, &[]).await;
    let (code, stdout, stderr) = setup.dlq_cli(&second, &["resume"]).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains(r#""was_paused": true"#), "{stdout}");
    eventually("the order waiting for the long pause charged after the resume", Duration::from_secs(60), || async {
        provider.ledger().iter().any(|c| c.order_id == order.to_string()).then_some(())
    })
    .await;
    let (code, stdout, _) = setup.dlq_cli(&first, &["listener"]).await;
    assert_eq!(code, 0);
    assert!(stdout.contains(r#""pause": null"#), "{stdout}");

    // Refused: no duration, too long, not a duration.
    for body in [r#"{"reason": "x"}"#, r#"{"duration": "8d"}"#, r#"{"duration": "soon"}"#] {
        let (status, answer) =
            call(&first, Method::POST, "/admin/listener/pause", Some(TOKEN), Some(body.into())).await;
        assert_eq!(status, 400, "{body}: {answer}");
    }
    // Audited where asked, like every operators' call.
    let (log_first, log_second) = (first.log(), second.log());
    assert!(log_first.contains("/admin/listener/pause") && log_first.contains("provider maintenance"), "{log_first}");
    assert!(log_second.contains("/admin/listener/resume"), "{log_second}");
    assert!(log_second.contains("operators paused the listener"), "{log_second}");
    first.stop().await;
    second.stop().await;
    third.stop().await;
}

fn needed(name: &str) -> String {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => value,
        _ => panic!(
            "{name} is not set: run these tests with `cargo xtask integration`, which installs the browser's tools"
        ),
    }
}

#[tokio::test]
async fn the_console_shows_replays_and_acknowledges_dead_letters_in_a_browser() {
    let setup = Setup { partitions: 2, ..Setup::new("billing-console") };
    setup.create_topics().await;
    let provider = FakeProvider::start(Faults::default()).await;
    // Dead letters: orders that fail on every rung (they succeed when
    // replayed), and one the provider rejects.
    let mut failing = Vec::new();
    for partition in [0, 0, 1, 1] {
        let (order, json) = event("19.90");
        provider.script(&order.to_string(), Script::FailTimes { times: 3 });
        // Each in a trace of its own, whose id is the order's.
        let traceparent = format!("00-{}-00f067aa0ba902b7-01", order.simple());
        produce(&setup.topic, partition, &order.to_string(), &json, &[("traceparent", traceparent.as_bytes())]).await;
        failing.push(order.to_string());
    }
    let (rejected, json) = event("5.00");
    provider.script(&rejected.to_string(), Script::Reject);
    produce(&setup.topic, 1, &rejected.to_string(), &json, &[]).await;
    // And a hostile record, as anyone with write access could put there.
    let xss_key = r#"<script>window.__xss=1</script>"#;
    let xss_payload = r#"{"note":"\"><img src=x onerror=window.__xss=2>","x":"<script>window.__xss=3</script>"}"#;
    produce(
        setup.topology().dead_letter_topic().as_str(),
        1,
        xss_key,
        xss_payload,
        &[("x-evil", b"\"><img src=x onerror=window.__xss=4><script>window.__xss=5</script>")],
    )
    .await;

    let env = [("ADMIN_TOKEN", TOKEN), ("BILLING_BRAKE", "off")];
    let service = setup.start_with(&provider, &env).await;
    eventually("six dead letters", Duration::from_secs(60), || async {
        let (_, list) = call(&service, Method::GET, "/admin/dlq", Some(TOKEN), None).await;
        (list["topics"][0]["backlog"].as_i64() == Some(6)).then_some(())
    })
    .await;
    let charged_before = provider.ledger().len();
    // The browser replays the first dead letter of partition 0 and
    // acknowledges the second: in order, which every broker can record
    // (tansu drops the commit metadata that records out of order need).
    let dlq = setup.topology().dead_letter_topic().to_string();
    let (_, page) =
        call(&service, Method::GET, &format!("/admin/dlq/{dlq}/messages?partition=0"), Some(TOKEN), None).await;
    let key = |i: usize| page["messages"][i]["key"]["text"].as_str().unwrap().to_owned();
    let (replayed, acknowledged) = (key(0), key(1));
    // Reading from a time: the broker's offset for it, in every partition.
    let since = |ms: i64| {
        let path = format!("/admin/dlq/{dlq}/messages?since_ms={ms}");
        let service = &service;
        async move {
            let (status, page) = call(service, Method::GET, &path, Some(TOKEN), None).await;
            assert_eq!(status, 200, "{page}");
            page["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| (m["partition"].as_i64().unwrap(), m["offset"].as_i64().unwrap()))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(since(0).await.len(), 6);
    let now_ms = retry_core::Timestamp::from(std::time::SystemTime::now()).as_millis();
    assert_eq!(since(now_ms + 3_600_000).await, []);
    let second = page["messages"][1]["timestamp"].as_i64().unwrap();
    let first_at_or_after = if page["messages"][0]["timestamp"].as_i64().unwrap() >= second { 0 } else { 1 };
    assert!(
        since(second).await.contains(&(0, first_at_or_after)),
        "partition 0 is read from offset {first_at_or_after}"
    );
    assert!(!since(second).await.contains(&(0, first_at_or_after - 1)));

    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let shots = root.parent().unwrap().join("target").join("console-screenshots");
    // A browser on two cores shared with a broker, and with the other
    // lanes of `cargo xtask ci` (each runs this test on its own broker, at
    // times all at once): generous, and bounded.
    let browser = tokio::time::timeout(
        BROWSER_TIMEOUT,
        tokio::process::Command::new("node")
            .arg(root.join("console").join("console.test.cjs"))
            .env("KAFKA_RETRY_NODE_MODULES", needed("KAFKA_RETRY_NODE_MODULES"))
            .env("KAFKA_RETRY_CHROMIUM", needed("KAFKA_RETRY_CHROMIUM"))
            .env("CONSOLE_URL", format!("http://{}", service.operators))
            .env("CONSOLE_TOKEN", TOKEN)
            .env("CONSOLE_REPLAY_KEY", &replayed)
            .env("CONSOLE_REPLAY_TRACE", replayed.replace('-', ""))
            .env("CONSOLE_ACK_KEY", &acknowledged)
            .env("CONSOLE_XSS_KEY", xss_key)
            .env("CONSOLE_XSS_PAYLOAD", xss_payload)
            .env("CONSOLE_SCREENSHOTS", &shots)
            .kill_on_drop(true)
            .output(),
    );
    let output = browser
        .await
        .unwrap_or_else(|_| panic!("the console's browser test took longer than {BROWSER_TIMEOUT:?}"))
        .expect("node runs");
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    eprintln!("{said}");
    assert!(output.status.success(), "the browser test failed:\n{said}");

    // What the browser did, the service did: the replayed order is charged
    // once, and every action is in the audit log under the operator's name.
    eventually("the replayed order charged", Duration::from_secs(60), || async {
        provider.ledger().iter().any(|c| c.order_id == replayed).then_some(())
    })
    .await;
    assert_eq!(provider.ledger().len(), charged_before + 1, "only the replayed order was charged");
    let log = service.log();
    for route in ["/replay", "/ack", "/admin/listener/pause", "/admin/listener/resume"] {
        assert!(
            log.lines().any(|l| l.contains("audit") && l.contains(route) && l.contains("console-test")),
            "{route} is not audited under console-test:\n{log}"
        );
    }
    for shot in ["overview-1280.png", "explorer-1280.png", "overview-390.png", "explorer-390.png"] {
        assert!(shots.join(shot).metadata().map(|m| m.len() > 10_000).unwrap_or(false), "{shot} was not written");
    }
    service.stop().await;
}
