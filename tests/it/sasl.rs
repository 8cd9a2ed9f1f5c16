//! Authentication: against tansu requiring SASL SCRAM-SHA-512, which
//! `cargo xtask integration` starts for the tests that need SASL
//! (`needs.rs`), and runs the whole suite through too.

use std::time::Duration;

use integration::{broker_addr, connection, unique_topic, within};
use retry_kafka::{Error, GroupOffsets, SaslCredentials, Secret, Security, SecurityProtocol, TopicPartition};

use crate::support::billing_bin_topics_verify;

const WRONG_PASSWORD: &str = "not-the-password-4711";

/// The test credentials with another password.
fn with_wrong_password() -> retry_kafka::ConnectionConfig {
    let c = connection("kafka-retry-it");
    let right = c.security().sasl().expect("the SASL pass sets credentials").clone();
    let wrong = SaslCredentials { password: Secret::new(WRONG_PASSWORD), ..right };
    let protocol = c.security().protocol();
    c.with_security(Security::new(protocol, Some(wrong), integration::tls_settings()).unwrap())
}

#[tokio::test]
async fn a_wrong_password_is_refused_naming_broker_user_and_mechanism() {
    let config = with_wrong_password();
    let user = config.security().sasl().unwrap().username.clone();
    let mut offsets = GroupOffsets::new(config, &unique_topic("group"));
    let result = within("committed offsets", offsets.committed(&[TopicPartition::new("t", 0)])).await;
    let error = result.expect_err("a wrong password must be refused");
    assert!(matches!(error, Error::Authentication { .. }), "{error:?}");
    let message = error.to_string();
    for expected in ["SCRAM-SHA-512", user.as_str(), "wrong user name or password"] {
        assert!(message.contains(expected), "{message}");
    }
    assert!(broker_addr().split(',').any(|a| message.contains(a)), "{message}");
    assert!(!message.contains(WRONG_PASSWORD), "{message}");
    assert!(!format!("{error:?}").contains(WRONG_PASSWORD), "{error:?}");
}

#[tokio::test]
async fn billing_bin_with_a_wrong_password_exits_1_without_showing_it() {
    let run = billing_bin_topics_verify(&[("KAFKA_SASL_PASSWORD", WRONG_PASSWORD), ("RUST_LOG", "debug")], &[]).await;
    let (stdout, stderr) = (&run.stdout, &run.stderr);
    assert_eq!(run.code, Some(1), "{stderr}");
    assert!(run.took < Duration::from_secs(15), "took {:?}", run.took);
    for expected in ["authentication to", "SCRAM-SHA-512", "wrong user name or password"] {
        assert!(stderr.contains(expected), "{stderr}");
    }
    assert!(!stderr.contains(WRONG_PASSWORD) && !stdout.contains(WRONG_PASSWORD), "{stderr}");
}

#[tokio::test]
async fn a_client_without_credentials_is_refused() {
    let config = connection("kafka-retry-it");
    // The same transport (TLS or not), without SASL.
    let protocol =
        if config.security().protocol().uses_tls() { SecurityProtocol::Ssl } else { SecurityProtocol::Plaintext };
    let config = config
        .with_security(Security::new(protocol, None, integration::tls_settings()).unwrap())
        .with_request_timeout(Duration::from_secs(5))
        .unwrap();
    let mut offsets = GroupOffsets::new(config, &unique_topic("group"));
    let result = within("committed offsets", offsets.committed(&[TopicPartition::new("t", 0)])).await;
    assert!(result.is_err(), "a broker that requires SASL answered a client without credentials");
}

/// A connection kept past 85% of the session the broker grants (tansu: 60
/// s; Kafka: `connections.max.reauth.ms`, a few seconds on the suite's
/// re-authentication listener) authenticates again before its next request
/// (KIP-368), on the same connection or, where the broker refuses that, on
/// a new one; either way the caller sees no error.
#[tokio::test]
async fn a_connection_that_outlives_its_session_authenticates_again() {
    let _alone = ON_THE_SHORT_SESSION_LISTENER.lock().await;
    let (config, session) = match integration::reauth_connection("kafka-retry-it") {
        Some(config) => (config, integration::REAUTH_SESSION),
        None => (connection("kafka-retry-it"), Duration::from_secs(60)),
    };
    let mut offsets = GroupOffsets::new(config, &unique_topic("group"));
    let partitions = [TopicPartition::new("t", 0)];
    within("committed offsets", offsets.committed(&partitions)).await.expect("the first request");
    // Time passing is what this test is about.
    tokio::time::sleep(session * 92 / 100).await;
    within("committed offsets", offsets.committed(&partitions)).await.expect("a request after the session's end");
}

/// The tests of this process that connect to the short-session listener
/// take turns: one of them counts this process' connections to it.
static ON_THE_SHORT_SESSION_LISTENER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Apache Kafka re-authenticates a live connection (KIP-368), which tansu
/// refuses: through sessions of a few seconds, our connections renew theirs
/// in place, the same TCP connection throughout, every request answered.
#[tokio::test]
async fn sessions_are_renewed_on_the_same_connection() {
    let _alone = ON_THE_SHORT_SESSION_LISTENER.lock().await;
    let config =
        integration::reauth_connection("kafka-retry-it").expect("the Kafka SASL pass has a short-session listener");
    let ports: Vec<u16> = config.bootstrap().iter().map(|b| b.rsplit_once(':').unwrap().1.parse().unwrap()).collect();
    let mut offsets = GroupOffsets::new(config, &unique_topic("group"));
    let partitions = [TopicPartition::new("t", 0)];
    within("committed offsets", offsets.committed(&partitions)).await.expect("the first request");
    let connected = integration::connections_to(&ports);
    assert!(!connected.is_empty(), "no connection to the short-session listener");
    let started = std::time::Instant::now();
    let mut requests = 1;
    // Two sessions and more, a request every half second: a renewal comes
    // before the first request past 85% of a session, on the connection
    // that request goes out on.
    while started.elapsed() < integration::REAUTH_SESSION * 2 + Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        within("committed offsets", offsets.committed(&partitions)).await.expect("a request in a renewed session");
        requests += 1;
    }
    let still = integration::connections_to(&ports);
    assert_eq!(still, connected, "connections were replaced instead of renewed ({requests} requests)");
}
