//! The operators' pause of a listener across instances, through the API
//! and `billing-bin dlq`.

use std::time::Duration;

use integration::fake_provider::{FakeProvider, Faults};
use reqwest::Method;

use crate::{
    billing::{call, event, Service, Setup, TOKEN},
    support::{eventually, produce},
};

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
    assert_eq!(
        lagged,
        [setup.topic.clone(), format!("{}.retry-200ms", setup.topic), format!("{}.retry-400ms", setup.topic)]
    );

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
}
