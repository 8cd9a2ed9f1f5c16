//! Support for the integration tests in `it/`: where the broker is, fresh
//! topic names, connected clients. Tests run in parallel against one broker,
//! so each test works on topics of its own.
//!
//! A test that needs the broker fails, with a message saying how to start
//! one, when `$KAFKA_RETRY_BROKERS` is unset: under `cargo xtask ci` a missing
//! broker is a failure, never a silent skip.
//!
//! The interop tests also run a foreign client, `interop/kafka_client.py`
//! over confluent-kafka (librdkafka), with the python in `$KAFKA_RETRY_PYTHON`.

pub mod fake_provider;

use std::{
    io::Read,
    path::PathBuf,
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

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

/// The python that runs the interop client: `$KAFKA_RETRY_PYTHON`, a venv
/// with confluent-kafka that `cargo xtask integration` creates and names.
pub fn interop_python() -> PathBuf {
    match std::env::var_os("KAFKA_RETRY_PYTHON") {
        Some(python) if !python.is_empty() => python.into(),
        _ => panic!(
            "KAFKA_RETRY_PYTHON is not set: run the integration tests with `cargo xtask integration`, \
             which sets it to a python with confluent-kafka installed"
        ),
    }
}

/// How long the interop client may run before it stops itself (its `--deadline-s`).
pub const KAFKA_CLIENT_DEADLINE: Duration = Duration::from_secs(60);

/// How much longer than its deadline the interop client may take before it is killed.
const KAFKA_CLIENT_GRACE: Duration = Duration::from_secs(15);

/// Runs `interop/kafka_client.py` with `args` and returns its stdout. Fails
/// the test, with the client's stderr, when it exits non-zero or outlives
/// [`KAFKA_CLIENT_DEADLINE`].
pub async fn kafka_client(args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
    // Blocking reads and waits, off the test's runtime thread so rskafka's
    // connection tasks keep running.
    match tokio::task::spawn_blocking(move || run_kafka_client(&args)).await {
        Ok(stdout) => stdout,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("the interop client's task was cancelled: {e}"),
    }
}

fn run_kafka_client(args: &[String]) -> String {
    let python = interop_python();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("interop").join("kafka_client.py");
    let mut cmd = Command::new(&python);
    cmd.arg(&script).arg("--deadline-s").arg(KAFKA_CLIENT_DEADLINE.as_secs().to_string()).args(args);
    let shown = format!("{} {} {}", python.display(), script.display(), args.join(" "));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{shown}`: {e}"));

    let read_all = |mut pipe: Box<dyn Read + Send>| {
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            let _ = sender.send(String::from_utf8_lossy(&bytes).into_owned());
        });
        receiver
    };
    let stdout = read_all(Box::new(child.stdout.take().expect("stdout is piped")));
    let stderr = read_all(Box::new(child.stderr.take().expect("stderr is piped")));

    // Its stdout closes when it exits; past the deadline, kill it.
    let limit = KAFKA_CLIENT_DEADLINE + KAFKA_CLIENT_GRACE;
    let finished = stdout.recv_timeout(limit);
    if finished.is_err() {
        let _ = child.kill();
    }
    let status = child.wait().unwrap_or_else(|e| panic!("cannot wait for `{shown}`: {e}"));
    let stderr = stderr.recv().unwrap_or_default();
    match finished {
        Ok(stdout) if status.success() => stdout,
        Ok(stdout) => panic!("`{shown}` failed ({status})\nstderr:\n{stderr}\nstdout:\n{stdout}"),
        Err(_) => panic!("`{shown}` ran longer than {limit:?} and was killed\nstderr:\n{stderr}"),
    }
}
