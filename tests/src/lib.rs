//! Support for the integration tests in `it/`: where the broker is, fresh
//! topic names, connected clients. Tests run in parallel against one broker,
//! so each test works on topics of its own.
//!
//! A test that needs the broker fails, with a message saying how to start
//! one, when `$KAFKA_RETRY_BROKERS` is unset: under `cargo xtask ci` a missing
//! broker is a failure, never a silent skip.

use std::time::Duration;

use rand::Rng;

/// Where the broker is: `$KAFKA_RETRY_BROKERS` (a `host:port`, as
/// `cargo xtask integration` sets it).
pub fn broker_addr() -> String {
    match std::env::var("KAFKA_RETRY_BROKERS") {
        Ok(addr) if !addr.is_empty() => addr,
        _ => panic!(
            "KAFKA_RETRY_BROKERS is not set: run the integration tests with `cargo xtask integration`, \
             or set it to the address of a running broker (`cargo xtask broker up` prints one)"
        ),
    }
}

/// A topic name no other test (or earlier run) uses: `<prefix>-<random>`.
pub fn unique_topic(prefix: &str) -> String {
    let suffix: u64 = rand::thread_rng().gen();
    format!("it-{prefix}-{suffix:016x}")
}

/// How long a test waits for anything the broker should do promptly.
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(30);

/// An rskafka client connected to the test broker, within [`BROKER_TIMEOUT`].
pub async fn rskafka_client() -> rskafka::client::Client {
    let addr = broker_addr();
    let build = rskafka::client::ClientBuilder::new(vec![addr.clone()]).client_id("kafka-retry-it").build();
    match tokio::time::timeout(BROKER_TIMEOUT, build).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => panic!("cannot connect to the broker at {addr}: {e}"),
        Err(_) => panic!("no answer from the broker at {addr} within {BROKER_TIMEOUT:?}"),
    }
}

/// Awaits `fut`, failing the test if it takes longer than [`BROKER_TIMEOUT`].
pub async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(BROKER_TIMEOUT, fut).await {
        Ok(value) => value,
        Err(_) => panic!("{what} took longer than {BROKER_TIMEOUT:?}"),
    }
}
