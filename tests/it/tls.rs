//! TLS: against tansu behind stunnel, which `cargo xtask integration` starts
//! for the SASL_SSL pass (server-only TLS) and the mutual-TLS pass. Tests
//! that need TLS (`needs.rs`) run in both, those that need client
//! certificates in the second; the whole suite runs through both as well.

use std::{path::PathBuf, time::Duration};

use integration::{broker_addr, connection, tls_settings, unique_topic, within};
use retry_kafka::{ConnectionConfig, Error, GroupOffsets, Security, TlsSettings, TopicPartition};

use crate::support::billing_bin_topics_verify;

/// The suite's connection with other TLS settings, on `bootstrap`.
fn with_tls(bootstrap: &str, change: impl FnOnce(&mut TlsSettings)) -> ConnectionConfig {
    let suite = connection("kafka-retry-it");
    let mut tls = tls_settings();
    change(&mut tls);
    let security = Security::new(suite.security().protocol(), suite.security().sasl().cloned(), tls);
    ConnectionConfig::new(bootstrap, suite.client_id())
        .unwrap()
        .with_security(security.expect("valid TLS settings"))
        .with_request_timeout(Duration::from_secs(10))
        .unwrap()
}

/// Asks the cluster for committed offsets, the smallest round trip.
async fn round_trip(config: ConnectionConfig) -> retry_kafka::Result<()> {
    let mut offsets = GroupOffsets::new(config, &unique_topic("group"));
    within("committed offsets", offsets.committed(&[TopicPartition::new("t", 0)])).await.map(drop)
}

/// A CA nobody trusts, written to a fresh file.
fn untrusted_ca() -> PathBuf {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, "an untrusted CA");
    let certificate = params.self_signed(&rcgen::KeyPair::generate().unwrap()).unwrap();
    let path = std::env::temp_dir().join(format!("{}.pem", unique_topic("untrusted-ca")));
    std::fs::write(&path, certificate.pem()).unwrap();
    path
}

/// The first bootstrap broker by its IP address, which the test
/// certificate does not hold (it names `localhost`).
fn by_address() -> String {
    let first = broker_addr().split(',').next().unwrap().to_owned();
    let (host, port) = first.rsplit_once(':').unwrap();
    assert_eq!(host, "localhost", "the TLS broker is reached by the name in its certificate");
    format!("127.0.0.1:{port}")
}

#[track_caller]
fn assert_tls_error(result: retry_kafka::Result<()>, addr: &str, expected: &str) {
    let error = result.expect_err("the TLS handshake must fail");
    assert!(matches!(error, Error::Tls { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains(addr) && message.contains(expected), "{message}");
}

#[tokio::test]
async fn a_broker_signed_by_an_untrusted_ca_is_refused() {
    let addr = broker_addr().split(',').next().unwrap().to_owned();
    let ca = untrusted_ca();
    let config = with_tls(&addr, |t| t.ca_location = Some(ca.clone()));
    assert_tls_error(round_trip(config).await, &addr, "not signed by a CA this client trusts");
}

#[tokio::test]
async fn a_host_name_the_certificate_lacks_is_refused_unless_verification_is_off() {
    let addr = by_address();
    assert_tls_error(round_trip(with_tls(&addr, |_| {})).await, &addr, "not valid for 127.0.0.1 (it names localhost)");
    // Off, the chain is still checked...
    let ca = untrusted_ca();
    let untrusted = with_tls(&addr, |t| {
        t.verify_hostname = false;
        t.ca_location = Some(ca.clone());
    });
    assert_tls_error(round_trip(untrusted).await, &addr, "not signed by a CA");
    // ...and a trusted certificate for another name is accepted.
    round_trip(with_tls(&addr, |t| t.verify_hostname = false)).await.expect("verification off accepts the name");
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let addr = broker_addr().split(',').next().unwrap().to_owned();
    let config = with_tls(&addr, |t| {
        t.certificate_location = None;
        t.key_location = None;
    });
    assert_tls_error(round_trip(config).await, &addr, "set ssl.certificate.location and ssl.key.location");
}

#[tokio::test]
async fn billing_bin_names_each_tls_failure_and_exits_1() {
    let ca = untrusted_ca();
    let ca = ca.to_str().unwrap();
    let addr = by_address();
    let cases: [(&[(&str, &str)], &str); 2] = [
        (&[("KAFKA_SSL_CA_LOCATION", ca)], "not signed by a CA this client trusts"),
        (&[("KAFKA_BROKERS", &addr)], "not valid for 127.0.0.1"),
    ];
    for (env, expected) in cases {
        let run = billing_bin_topics_verify(env, &[]).await;
        let (code, stderr, took) = (run.code, run.stderr, run.took);
        assert_eq!(code, Some(1), "{env:?}: {stderr}");
        assert!(stderr.contains("TLS with") && stderr.contains(expected), "{env:?}: {stderr}");
        assert!(took < Duration::from_secs(15), "{env:?} took {took:?}");
    }
    // Verification off: a warning at start, then the service reaches the
    // broker (and finds the topic missing, as it should).
    let run =
        billing_bin_topics_verify(&[("KAFKA_BROKERS", &addr), ("KAFKA_SSL_ENDPOINT_IDENTIFICATION", "none")], &[])
            .await;
    let (code, stderr) = (run.code, run.stderr);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("WARN") && stderr.contains("KAFKA_SSL_ENDPOINT_IDENTIFICATION=none"), "{stderr}");
    assert!(stderr.contains("is missing"), "{stderr}");
}

#[tokio::test]
async fn billing_bin_without_a_certificate_exits_1() {
    let run = billing_bin_topics_verify(&[], &["KAFKA_SSL_CERTIFICATE_LOCATION", "KAFKA_SSL_KEY_LOCATION"]).await;
    let (code, stderr, took) = (run.code, run.stderr, run.took);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("refused this client's certificate"), "{stderr}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
}
