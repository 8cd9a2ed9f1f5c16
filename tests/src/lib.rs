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
    io::{BufRead, Read},
    path::PathBuf,
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use rand::Rng;

/// Where the broker is: `$KAFKA_RETRY_BROKERS` (`host:port[,host:port...]`,
/// as `cargo xtask integration` sets it).
pub fn broker_addr() -> String {
    match std::env::var("KAFKA_RETRY_BROKERS") {
        Ok(addr) if !addr.is_empty() => addr,
        _ => panic!(
            "KAFKA_RETRY_BROKERS is not set: run the integration tests with `cargo xtask integration`, \
             or set it to the address of a running broker (`cargo xtask broker up` prints one)"
        ),
    }
}

/// The bootstrap brokers, as a list.
pub fn bootstrap() -> Vec<String> {
    broker_addr().split(',').map(str::to_owned).collect()
}

/// The suite's security settings, as `cargo xtask integration` sets them
/// for a broker that requires SASL or TLS: `$KAFKA_RETRY_SECURITY_PROTOCOL`
/// (PLAINTEXT by default, SASL_PLAINTEXT when only SASL is given),
/// `$KAFKA_RETRY_SASL_MECHANISM`, `_USERNAME`, `_PASSWORD`, and
/// `$KAFKA_RETRY_SSL_CA_LOCATION`, `_CERTIFICATE_LOCATION`, `_KEY_LOCATION`.
pub fn security() -> retry_kafka::Security {
    use retry_kafka::{SaslCredentials, Secret, Security, SecurityProtocol};
    let sasl = env("KAFKA_RETRY_SASL_MECHANISM").map(|mechanism| SaslCredentials {
        mechanism: mechanism.parse().expect("KAFKA_RETRY_SASL_MECHANISM names a mechanism"),
        username: env("KAFKA_RETRY_SASL_USERNAME").expect("KAFKA_RETRY_SASL_USERNAME is set"),
        password: Secret::new(env("KAFKA_RETRY_SASL_PASSWORD").expect("KAFKA_RETRY_SASL_PASSWORD is set")),
    });
    let protocol = match env("KAFKA_RETRY_SECURITY_PROTOCOL") {
        Some(p) => p.parse().expect("KAFKA_RETRY_SECURITY_PROTOCOL names a protocol"),
        None if sasl.is_some() => SecurityProtocol::SaslPlaintext,
        None => SecurityProtocol::Plaintext,
    };
    Security::new(protocol, sasl, tls_settings()).expect("valid security settings")
}

/// The suite's TLS files (none without TLS).
pub fn tls_settings() -> retry_kafka::TlsSettings {
    retry_kafka::TlsSettings {
        ca_location: env("KAFKA_RETRY_SSL_CA_LOCATION").map(PathBuf::from),
        certificate_location: env("KAFKA_RETRY_SSL_CERTIFICATE_LOCATION").map(PathBuf::from),
        key_location: env("KAFKA_RETRY_SSL_KEY_LOCATION").map(PathBuf::from),
        verify_hostname: true,
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A connection config for the test broker, secured as [`security`] says.
pub fn connection(client_id: &str) -> retry_kafka::ConnectionConfig {
    retry_kafka::ConnectionConfig::new(&broker_addr(), client_id)
        .expect("a valid broker address")
        .with_security(security())
}

/// Every setting of `billing-bin` about security, so a test can clear them.
pub const BILLING_SECURITY_SETTINGS: &[&str] = &[
    "KAFKA_SECURITY_PROTOCOL",
    "KAFKA_SASL_MECHANISM",
    "KAFKA_SASL_USERNAME",
    "KAFKA_SASL_PASSWORD",
    "KAFKA_SASL_PASSWORD_FILE",
    "KAFKA_SSL_CA_LOCATION",
    "KAFKA_SSL_CERTIFICATE_LOCATION",
    "KAFKA_SSL_KEY_LOCATION",
    "KAFKA_SSL_ENDPOINT_IDENTIFICATION",
];

/// The settings `billing-bin` needs to connect as the tests do, as
/// environment (only the protocol against a plain broker).
pub fn billing_security_env() -> Vec<(&'static str, String)> {
    let security = security();
    let mut vars = vec![("KAFKA_SECURITY_PROTOCOL", security.protocol().name().to_owned())];
    if let Some(c) = security.sasl() {
        vars.push(("KAFKA_SASL_MECHANISM", c.mechanism.name().to_owned()));
        vars.push(("KAFKA_SASL_USERNAME", c.username.clone()));
        vars.push(("KAFKA_SASL_PASSWORD", env("KAFKA_RETRY_SASL_PASSWORD").unwrap_or_default()));
    }
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
    let tls = tls_settings();
    for (name, value) in [
        ("KAFKA_SSL_CA_LOCATION", path(&tls.ca_location)),
        ("KAFKA_SSL_CERTIFICATE_LOCATION", path(&tls.certificate_location)),
        ("KAFKA_SSL_KEY_LOCATION", path(&tls.key_location)),
    ] {
        if let Some(value) = value {
            vars.push((name, value));
        }
    }
    vars
}

/// The TLS terminator (stunnel) in front of the test broker, named by
/// `$KAFKA_RETRY_TLS_PROXY_CONFIG` when `cargo xtask integration` runs
/// against a broker behind TLS.
#[derive(Debug, Clone)]
pub struct TlsProxy {
    config: PathBuf,
    pid_file: PathBuf,
    accept: String,
}

impl TlsProxy {
    /// The terminator, for tests that only make sense behind one (their
    /// names contain `tls_only`); panics without one.
    pub fn get() -> TlsProxy {
        let config = PathBuf::from(
            env("KAFKA_RETRY_TLS_PROXY_CONFIG")
                .expect("KAFKA_RETRY_TLS_PROXY_CONFIG is set by cargo xtask integration for TLS brokers"),
        );
        let text = std::fs::read_to_string(&config).expect("the TLS proxy's configuration is readable");
        let setting = |name: &str| {
            text.lines()
                .filter_map(|l| l.split_once('='))
                .find(|(k, _)| k.trim() == name)
                .map(|(_, v)| v.trim().to_owned())
                .unwrap_or_else(|| panic!("the TLS proxy's configuration has no {name}"))
        };
        TlsProxy { pid_file: PathBuf::from(setting("pid")), accept: setting("accept"), config }
    }

    /// Cuts every connection through it, as a broker closing them would
    /// (an expired session, a restart): stops it, and starts it again on the
    /// same port once it is gone. Clients see their connections closed, and
    /// refused until it accepts again.
    pub async fn cut_every_connection(&self) {
        let pid = std::fs::read_to_string(&self.pid_file).expect("the TLS proxy's pid file").trim().to_owned();
        let killed = Command::new("kill").args(["-TERM", &pid]).status().expect("kill runs");
        assert!(killed.success(), "cannot stop the TLS proxy (pid {pid})");
        // Gone, or a zombie its parent (xtask, or this test) has not reaped.
        let gone = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|stat| stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) == Some("Z"))
                .unwrap_or(true)
        };
        within("the TLS proxy stopping", async {
            while !gone() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let program = ["stunnel4", "stunnel"]
            .into_iter()
            .find(|p| Command::new(p).arg("-version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok())
            .expect("stunnel is installed");
        // Its own process group, as `cargo xtask broker` starts it, which
        // stops it through the pid file.
        std::os::unix::process::CommandExt::process_group(
            Command::new(program).arg(&self.config).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()),
            0,
        )
        .spawn()
        .map(|mut child| {
            // Reaped when `cargo xtask` stops it, should this test still run.
            std::thread::spawn(move || child.wait());
        })
        .expect("the TLS proxy starts again");
        within("the TLS proxy accepting again", async {
            while tokio::net::TcpStream::connect(&self.accept).await.is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
}

/// Which implementation of Kafka the suite runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    /// tansu, one broker, with CreateTopics.
    Tansu,
    /// librdkafka's mock cluster: several brokers, fault injection, topics
    /// created through its control channel.
    Mock,
    /// Anything else (Apache Kafka under Docker, a broker given by hand).
    Other,
}

/// The broker kind: the mock when `$KAFKA_RETRY_MOCK_CONTROL` is set, else
/// what `$KAFKA_RETRY_BROKER_KIND` says.
pub fn broker_kind() -> BrokerKind {
    if MockCluster::from_env().is_some() {
        return BrokerKind::Mock;
    }
    match std::env::var("KAFKA_RETRY_BROKER_KIND").as_deref() {
        Ok("tansu") => BrokerKind::Tansu,
        _ => BrokerKind::Other,
    }
}

/// The control channel of librdkafka's mock cluster
/// (`interop/mock_cluster.py`), for creating topics and injecting faults.
#[derive(Debug, Clone)]
pub struct MockCluster {
    control: String,
}

impl MockCluster {
    /// The mock cluster of `$KAFKA_RETRY_MOCK_CONTROL`, if the suite runs on one.
    pub fn from_env() -> Option<MockCluster> {
        std::env::var("KAFKA_RETRY_MOCK_CONTROL").ok().filter(|c| !c.is_empty()).map(|control| MockCluster { control })
    }

    /// The mock cluster, for tests that only make sense on it (their names
    /// start with `mock_only`, and `cargo xtask integration` runs them on the
    /// mock alone).
    pub fn get() -> MockCluster {
        MockCluster::from_env().unwrap_or_else(|| {
            panic!(
                "KAFKA_RETRY_MOCK_CONTROL is not set: this test needs librdkafka's mock cluster \
                 (`cargo xtask integration --broker mock`)"
            )
        })
    }

    /// Sends one control request; fails the test when the mock refuses it.
    pub async fn call(&self, request: serde_json::Value) -> serde_json::Value {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(&self.control).await?;
            let mut line = request.to_string();
            line.push('\n');
            stream.write_all(line.as_bytes()).await?;
            let mut answer = String::new();
            BufReader::new(stream).read_line(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        };
        let answer = match within("a mock cluster control request", exchange).await {
            Ok(answer) => answer,
            Err(e) => panic!("the mock cluster's control channel at {} failed: {e}", self.control),
        };
        let answer: serde_json::Value =
            serde_json::from_str(&answer).unwrap_or_else(|e| panic!("bad control answer {answer:?}: {e}"));
        if answer["ok"] != true {
            panic!("the mock cluster refused {request}: {}", answer["error"]);
        }
        answer
    }

    /// How many brokers the cluster has (ids 1..=n).
    pub fn brokers(&self) -> i32 {
        bootstrap().len() as i32
    }

    /// Creates `topic` with a replica on every broker (up to three).
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        let replication = self.brokers().min(3);
        self.call(serde_json::json!({"op": "create_topic", "topic": topic, "partitions": partitions, "replication": replication}))
            .await;
    }

    /// Deletes `topic`.
    pub async fn delete_topic(&self, topic: &str) {
        self.call(serde_json::json!({"op": "delete_topic", "topic": topic})).await;
    }

    /// Makes `broker` the leader of `topic`/`partition`.
    pub async fn set_leader(&self, topic: &str, partition: i32, broker: i32) {
        self.call(serde_json::json!({"op": "set_leader", "topic": topic, "partition": partition, "broker": broker}))
            .await;
    }

    /// Makes the followers of `topic`/`partition` report these watermarks
    /// (-1: follow the leader's), as a lagging replica does.
    pub async fn set_follower_wmarks(&self, topic: &str, partition: i32, lo: i64, hi: i64) {
        self.call(serde_json::json!({"op": "set_follower_wmarks", "topic": topic, "partition": partition, "lo": lo, "hi": hi}))
            .await;
    }

    /// Takes `broker` down: its connections close and it accepts none.
    pub async fn broker_down(&self, broker: i32) {
        self.call(serde_json::json!({"op": "broker_down", "broker": broker})).await;
    }

    /// Brings `broker` back up, on the same port.
    pub async fn broker_up(&self, broker: i32) {
        self.call(serde_json::json!({"op": "broker_up", "broker": broker})).await;
    }

    /// Delays every answer of `broker` by `rtt`.
    pub async fn set_rtt(&self, broker: i32, rtt: Duration) {
        self.call(serde_json::json!({"op": "set_rtt", "broker": broker, "rtt_ms": rtt.as_millis() as i64})).await;
    }

    /// Makes `broker` the coordinator of consumer group `group`.
    pub async fn set_group_coordinator(&self, group: &str, broker: i32) {
        self.call(serde_json::json!({"op": "set_coordinator", "key_type": "group", "key": group, "broker": broker}))
            .await;
    }

    /// Answers the next requests of `api_key` (on any broker) with `errors`,
    /// one each.
    pub async fn push_request_errors(&self, api_key: i16, errors: &[i16]) {
        self.call(serde_json::json!({"op": "push_request_errors", "api_key": api_key, "errors": errors})).await;
    }

    /// Answers the next requests of `api_key` on `broker` with `errors`,
    /// each after its delay.
    pub async fn push_broker_errors(&self, broker: i32, api_key: i16, errors: &[(i16, Duration)]) {
        let errors: Vec<(i16, i64)> = errors.iter().map(|(code, rtt)| (*code, rtt.as_millis() as i64)).collect();
        self.call(
            serde_json::json!({"op": "push_broker_errors", "broker": broker, "api_key": api_key, "errors": errors}),
        )
        .await;
    }

    /// Answers the next requests of `api_key` about `topic`/`partition` with
    /// `errors`, one each.
    pub async fn push_partition_errors(&self, topic: &str, partition: i32, api_key: i16, errors: &[i16]) {
        self.call(serde_json::json!({"op": "push_partition_errors", "topic": topic, "partition": partition, "api_key": api_key, "errors": errors}))
            .await;
    }

    /// Makes the next Metadata answer name `leader` as the leader of
    /// `topic`/`partition`, whoever leads it: a client's stale view.
    pub async fn push_leader_response(&self, topic: &str, partition: i32, leader: i32) {
        self.call(serde_json::json!({"op": "push_leader_response", "topic": topic, "partition": partition, "leader": leader, "epoch": 0}))
            .await;
    }

    /// Makes `broker` a follower of `topic`/`partition` that serves fetches.
    pub async fn set_follower(&self, topic: &str, partition: i32, broker: i32) {
        self.call(serde_json::json!({"op": "set_follower", "topic": topic, "partition": partition, "broker": broker}))
            .await;
    }

    /// Drops the errors still queued for `api_key`.
    pub async fn clear_request_errors(&self, api_key: i16) {
        self.call(serde_json::json!({"op": "clear_request_errors", "api_key": api_key})).await;
    }
}

/// Creates `topic` with `partitions` partitions: through CreateTopics, or on
/// the mock cluster (which lacks it) through its control channel.
pub async fn create_topic(topic: &str, partitions: i32) {
    match MockCluster::from_env() {
        Some(mock) => mock.create_topic(topic, partitions).await,
        None => {
            let client = rskafka_client().await;
            let controller = client.controller_client().expect("a controller client");
            within("create_topic", controller.create_topic(topic, partitions, 1, 10_000))
                .await
                .unwrap_or_else(|e| panic!("cannot create {topic}: {e}"));
        }
    }
}

/// Creates every topic of `plan` (the source too): [`retry_kafka::TopicPlan::create`],
/// or on the mock cluster, its control channel.
pub async fn create_plan(plan: &retry_kafka::TopicPlan, connection: &retry_kafka::ConnectionConfig) {
    match MockCluster::from_env() {
        Some(mock) => {
            for spec in plan.specs() {
                mock.create_topic(&spec.name, spec.partitions).await;
            }
        }
        None => {
            within("create topics", plan.create(connection, true)).await.expect("create the plan's topics");
        }
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
    // Short retries inside rskafka: callers that face injected faults retry
    // themselves, refreshing metadata in between.
    let backoff = rskafka::BackoffConfig {
        init_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(500),
        base: 2.0,
        deadline: Some(Duration::from_secs(5)),
    };
    let builder = rskafka::client::ClientBuilder::new(bootstrap()).client_id("kafka-retry-it").backoff_config(backoff);
    let build = security().configure_rskafka(builder).build();
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
    KafkaClientRun::start(args).finish().await
}

/// The interop client while it runs: its output lines arrive as it prints
/// them, so a test can wait for one of its events (an assignment) instead
/// of guessing how long it takes.
pub struct KafkaClientRun {
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    done: tokio::task::JoinHandle<String>,
}

impl KafkaClientRun {
    /// Starts `interop/kafka_client.py` with `args`.
    pub fn start(args: &[&str]) -> KafkaClientRun {
        let args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
        let (sender, lines) = tokio::sync::mpsc::unbounded_channel();
        // Blocking reads and waits, off the test's runtime thread so rskafka's
        // connection tasks keep running.
        let done = tokio::task::spawn_blocking(move || run_kafka_client(&args, sender));
        KafkaClientRun { lines, done }
    }

    /// Waits for the first line (from now on) that `wanted` accepts; fails
    /// the test when the client ends first.
    pub async fn wait_for_line(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        loop {
            match within(what, self.lines.recv()).await {
                Some(line) if wanted(&line) => return line,
                Some(_) => {}
                None => panic!("the interop client ended before {what}"),
            }
        }
    }

    /// Waits for the client's end and returns all it printed (failing the
    /// test as [`kafka_client`] says).
    pub async fn finish(self) -> String {
        match self.done.await {
            Ok(stdout) => stdout,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("the interop client's task was cancelled: {e}"),
        }
    }
}

fn run_kafka_client(args: &[String], lines: tokio::sync::mpsc::UnboundedSender<String>) -> String {
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
    let stdout = {
        let pipe = child.stdout.take().expect("stdout is piped");
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut all = String::new();
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = lines.send(line.clone());
                all.push_str(&line);
                all.push('\n');
            }
            let _ = sender.send(all);
        });
        receiver
    };
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
