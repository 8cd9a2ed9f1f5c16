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

#[cfg(doctest)]
mod book;
pub mod fake_provider;
// Where each test runs: read here to hold the tests to what it declares.
#[allow(dead_code)]
#[path = "../it/needs.rs"]
mod needs;
pub mod raw;

use std::{
    collections::BTreeMap,
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

/// How long the SASL sessions of the Kafka passes' re-authentication
/// listener last (`cargo xtask broker up --kafka --sasl` sets its
/// `connections.max.reauth.ms` to this).
pub const REAUTH_SESSION: Duration = Duration::from_secs(10);

/// The bootstrap brokers of the Kafka SASL passes' re-authentication
/// listener (`$KAFKA_RETRY_REAUTH_BROKERS`), where sessions last
/// [`REAUTH_SESSION`]; `None` elsewhere.
pub fn reauth_broker_addr() -> Option<String> {
    env("KAFKA_RETRY_REAUTH_BROKERS")
}

/// A connection config for the re-authentication listener, secured as
/// [`security`] says; `None` where there is none.
pub fn reauth_connection(client_id: &str) -> Option<retry_kafka::ConnectionConfig> {
    let addr = reauth_broker_addr()?;
    Some(
        retry_kafka::ConnectionConfig::new(&addr, client_id).expect("a valid broker address").with_security(security()),
    )
}

/// This process' established TCP connections to any of `remote_ports` on
/// loopback, as (local port, remote port), sorted.
pub fn connections_to(remote_ports: &[u16]) -> Vec<(u16, u16)> {
    // Sockets of this process, by inode.
    let inodes: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let mut ports = Vec::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = |addr: &str| addr.rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            // Field 3 is the state: 01 is ESTABLISHED; field 9 the inode.
            let (Some(local), Some(remote)) = (port(fields[1]), port(fields[2])) else { continue };
            if fields[3] == "01" && remote_ports.contains(&remote) && inodes.contains(fields[9]) {
                ports.push((local, remote));
            }
        }
    }
    ports.sort_unstable();
    // A table read while sockets come and go may list one twice (the
    // kernel resumes each read where the last one ended, by position).
    ports.dedup();
    ports
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

/// Which group protocol the suite's listeners speak: `$KAFKA_RETRY_GROUP_PROTOCOL`
/// (`classic` or `consumer`, set by `cargo xtask integration`), classic when unset.
pub fn group_protocol() -> retry_kafka::GroupProtocol {
    if let Some(test) = std::thread::current().name() {
        let declared =
            needs::NEEDS.iter().any(|(name, needs)| *name == test && needs.contains(&needs::Need::NoListener));
        assert!(
            !declared,
            "{test} is declared in tests/it/needs.rs to start no listener, yet it asks which group protocol its \
             listeners speak: the consumer protocol's pass would leave it out (remove its Need::NoListener)"
        );
    }
    match env("KAFKA_RETRY_GROUP_PROTOCOL") {
        Some(name) => name.parse().unwrap_or_else(|e| panic!("KAFKA_RETRY_GROUP_PROTOCOL: {e}")),
        None => retry_kafka::GroupProtocol::Classic,
    }
}

/// The settings `billing-bin` needs to connect as the tests do, as
/// environment: security (only the protocol against a plain broker) and
/// the group protocol.
pub fn billing_broker_env() -> Vec<(&'static str, String)> {
    let security = security();
    let mut vars = vec![("KAFKA_SECURITY_PROTOCOL", security.protocol().name().to_owned())];
    vars.push(("KAFKA_GROUP_PROTOCOL", group_protocol().name().to_owned()));
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
    /// names contain `tls_proxy_only`); panics without one.
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
    /// Apache Kafka, the reference: a cluster of brokers whose nodes the
    /// fault tests stop, kill and restart.
    Kafka,
    /// tansu, one broker, with CreateTopics.
    Tansu,
    /// librdkafka's mock cluster: several brokers, fault injection, topics
    /// created through its control channel.
    Mock,
    /// Anything else (Apache Kafka under Docker, a broker given by hand).
    Other,
}

/// The broker kind: the mock when `$KAFKA_RETRY_MOCK_CONTROL` is set, Apache
/// Kafka when `$KAFKA_RETRY_KAFKA_CLUSTER` is, else what
/// `$KAFKA_RETRY_BROKER_KIND` says.
pub fn broker_kind() -> BrokerKind {
    if MockCluster::from_env().is_some() {
        return BrokerKind::Mock;
    }
    if KafkaCluster::from_env().is_some() {
        return BrokerKind::Kafka;
    }
    match std::env::var("KAFKA_RETRY_BROKER_KIND").as_deref() {
        Ok(kind) if kind.starts_with("tansu") => BrokerKind::Tansu,
        _ => BrokerKind::Other,
    }
}

/// The replication factor of the suite's topics: three on Apache Kafka
/// (with `min.insync.replicas=2`, as production clusters run), one where
/// there is one broker to hold them.
pub fn replication_factor() -> i16 {
    match KafkaCluster::from_env() {
        Some(cluster) => cluster.brokers().len().min(3) as i16,
        None => 1,
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

    /// The mock cluster, for tests that only make sense on it (they need
    /// `MockFaults` in `tests/it/needs.rs`, and `cargo xtask integration`
    /// runs them on the mock alone).
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

/// An Apache Kafka cluster that `cargo xtask broker up --kafka` (or
/// `cargo xtask integration --broker kafka`) started, named by
/// `$KAFKA_RETRY_KAFKA_CLUSTER`: its nodes, and how to stop, kill and start
/// each again, for the fault tests that need a real broker.
#[derive(Debug, Clone)]
pub struct KafkaCluster {
    nodes: Vec<KafkaNode>,
}

/// One node of a [`KafkaCluster`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaNode {
    /// Its node id (brokers count from 1).
    pub id: i32,
    /// Whether it is a broker (else a controller).
    pub broker: bool,
    /// Its client address (brokers).
    pub addr: String,
    /// Its plaintext listener between brokers (brokers).
    pub internal: String,
    dir: PathBuf,
}

impl KafkaCluster {
    /// The cluster of `$KAFKA_RETRY_KAFKA_CLUSTER`, if the suite runs on one.
    pub fn from_env() -> Option<KafkaCluster> {
        let dir = PathBuf::from(env("KAFKA_RETRY_KAFKA_CLUSTER")?);
        let text = std::fs::read_to_string(dir.join("cluster"))
            .unwrap_or_else(|e| panic!("cannot read {}/cluster: {e}", dir.display()));
        let nodes = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let id: i32 = fields[1].parse().expect("a node id");
                KafkaNode {
                    id,
                    broker: fields[0] == "broker",
                    addr: fields[2].to_owned(),
                    internal: fields.get(3).copied().unwrap_or("-").to_owned(),
                    dir: dir.join(format!("node-{id}")),
                }
            })
            .collect();
        Some(KafkaCluster { nodes })
    }

    /// The cluster, for tests that only make sense on Apache Kafka (they
    /// need `ApacheKafka` in `tests/it/needs.rs`); panics without one.
    pub fn get() -> KafkaCluster {
        KafkaCluster::from_env().unwrap_or_else(|| {
            panic!(
                "KAFKA_RETRY_KAFKA_CLUSTER is not set: this test needs Apache Kafka \
                 (`cargo xtask integration --broker kafka`)"
            )
        })
    }

    /// Its brokers, by id.
    pub fn brokers(&self) -> Vec<&KafkaNode> {
        self.nodes.iter().filter(|n| n.broker).collect()
    }

    /// The broker with `id`.
    pub fn broker(&self, id: i32) -> &KafkaNode {
        self.nodes.iter().find(|n| n.broker && n.id == id).unwrap_or_else(|| panic!("no broker {id}"))
    }

    /// Each partition of `topics` with its leader and in-sync replicas, as
    /// Apache Kafka's own admin client reads them.
    pub async fn partitions(&self, topics: &[&str]) -> BTreeMap<String, Vec<PartitionState>> {
        let output = java_client(&["topics", "--brokers", &broker_addr(), "--topics", &topics.join(",")]).await;
        let json: serde_json::Value =
            serde_json::from_str(&output).unwrap_or_else(|e| panic!("the Java client printed no JSON ({e}): {output}"));
        topics
            .iter()
            .map(|topic| {
                let states = json[*topic]
                    .as_array()
                    .unwrap_or_else(|| panic!("no {topic} in {output}"))
                    .iter()
                    .map(|p| PartitionState {
                        partition: p["partition"].as_i64().unwrap() as i32,
                        leader: p["leader"].as_i64().unwrap() as i32,
                        isr: p["isr"].as_array().unwrap().iter().map(|n| n.as_i64().unwrap() as i32).collect(),
                    })
                    .collect();
                (topic.to_string(), states)
            })
            .collect()
    }

    /// Waits until every partition of `topics` has every broker in sync
    /// again (no partition under-replicated), as an operator waits between
    /// the restarts of a rolling restart.
    pub async fn wait_fully_replicated(&self, topics: &[&str]) {
        let brokers = self.brokers().len().min(3);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let states = self.partitions(topics).await;
            let under: Vec<String> = states
                .iter()
                .flat_map(|(t, ps)| {
                    ps.iter().filter(|p| p.isr.len() < brokers).map(move |p| format!("{t}/{}", p.partition))
                })
                .collect();
            if under.is_empty() {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "partitions under-replicated after 120 s: {under:?}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// A partition as the cluster describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    /// The partition.
    pub partition: i32,
    /// Its leader's node id (-1: none).
    pub leader: i32,
    /// Its in-sync replicas' node ids.
    pub isr: Vec<i32>,
}

/// The partition of `__consumer_offsets` (of `partitions`) that holds
/// `group`'s offsets, whose leader is the group's coordinator: Kafka's
/// rule, `abs(group.hashCode()) % partitions`, with Java's string hash.
pub fn offsets_partition(group: &str, partitions: i32) -> i32 {
    let hash = group.encode_utf16().fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
    (hash & 0x7fff_ffff) % partitions
}

impl KafkaNode {
    fn pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.dir.join("pid")).ok()?.trim().parse().ok()?;
        let config = self.dir.join("server.properties").display().to_string();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let alive = String::from_utf8_lossy(&cmdline).contains(&config) && !is_zombie(pid);
        alive.then_some(pid)
    }

    /// Whether its JVM runs.
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// Kills its JVM at once (SIGKILL), as a crash or an OOM killer would,
    /// and waits until it is gone.
    pub async fn kill(&self) {
        self.signal("KILL").await;
    }

    /// Freezes its JVM (SIGSTOP): connections stay open, nothing is
    /// answered, and as a follower it replicates nothing, until the guard
    /// is dropped (SIGCONT), a failing test included.
    pub fn pause(&self) -> Paused {
        let Some(pid) = self.pid() else { panic!("Kafka node {} is not running", self.id) };
        let sent = Command::new("kill").arg("-STOP").arg(pid.to_string()).status().expect("kill runs");
        assert!(sent.success(), "cannot pause Kafka node {}", self.id);
        Paused(pid)
    }

    /// Stops its JVM gracefully (SIGTERM: a controlled shutdown, its
    /// partitions' leadership handed over first) and waits until it is gone.
    pub async fn stop(&self) {
        self.signal("TERM").await;
    }

    async fn signal(&self, signal: &str) {
        let Some(pid) = self.pid() else { panic!("Kafka node {} is not running", self.id) };
        let sent = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().expect("kill runs");
        assert!(sent.success(), "cannot signal Kafka node {} (pid {pid})", self.id);
        let gone = async {
            while self.pid().is_some() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(60), gone).await.is_err() {
            panic!("Kafka node {} (pid {pid}) did not end within 60 s of SIG{signal}", self.id);
        }
    }

    /// Starts its JVM again with the command it was first started with (same
    /// ports, same data), and waits until it has started and registered
    /// with the controller.
    pub async fn start(&self) {
        assert!(!self.is_running(), "Kafka node {} runs already", self.id);
        let log_path = self.dir.join("node.log");
        let started_before = started_lines(&log_path);
        let text = std::fs::read_to_string(self.dir.join("command")).expect("the node's command");
        let mut args = text.lines();
        let program = args.next().expect("a program");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).unwrap();
        let mut cmd = Command::new(program);
        cmd.args(args).current_dir(&self.dir).stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
        // Its own process group, as xtask starts it, which stops it through
        // the pid file.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start Kafka node {}: {e}", self.id));
        std::fs::write(self.dir.join("pid"), child.id().to_string()).unwrap();
        // The child itself: a process just forked shows this one's command
        // line until it has exec'd the JVM, which the pid check reads.
        let up = async {
            while started_lines(&log_path) <= started_before {
                let exited = !matches!(child.try_wait(), Ok(None));
                assert!(!exited, "Kafka node {} exited while starting; see {}", self.id, log_path.display());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let started = tokio::time::timeout(Duration::from_secs(120), up).await;
        // Reaped when it ends; xtask stops it through its pid file.
        std::thread::spawn(move || child.wait());
        if started.is_err() {
            panic!("Kafka node {} did not start within 120 s; see {}", self.id, log_path.display());
        }
    }
}

/// A frozen Kafka node, running again when this is dropped.
#[must_use = "the node runs again when this is dropped"]
pub struct Paused(u32);

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-CONT").arg(self.0.to_string()).status();
    }
}

/// How often a node's log says it started.
fn started_lines(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log).map(|t| t.matches("Kafka Server started").count()).unwrap_or(0)
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) == Some("Z"))
        .unwrap_or(true)
}

/// Creates `topic` with `partitions` partitions: through CreateTopics, or on
/// the mock cluster (which lacks it) through its control channel.
pub async fn create_topic(topic: &str, partitions: i32) {
    match MockCluster::from_env() {
        Some(mock) => mock.create_topic(topic, partitions).await,
        None => {
            let client = rskafka_client().await;
            let controller = client.controller_client().expect("a controller client");
            within("create_topic", controller.create_topic(topic, partitions, replication_factor(), 10_000))
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
            let plan = plan.clone().with_replication_factor(replication_factor());
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
    let build = retry_kafka::Security::configure_rskafka(builder, &security()).build();
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

/// Which foreign client runs.
#[derive(Debug, Clone, Copy)]
enum Peer {
    /// `interop/kafka_client.py`: confluent-kafka, over librdkafka.
    Librdkafka,
    /// `peers/java/KafkaClientPeer.java`: Apache Kafka's own Java client,
    /// from the jars of the broker's release (`$KAFKA_RETRY_KAFKA_LIBS`).
    Java,
}

/// Runs `peers/java/KafkaClientPeer.java` (the same commands and output as
/// [`kafka_client`]) and returns its stdout, failing the test as
/// [`kafka_client`] does.
pub async fn java_client(args: &[&str]) -> String {
    KafkaClientRun::start_java(args).finish().await
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
        KafkaClientRun::start_peer(Peer::Librdkafka, args)
    }

    /// Starts `peers/java/KafkaClientPeer.java` with `args`.
    pub fn start_java(args: &[&str]) -> KafkaClientRun {
        KafkaClientRun::start_peer(Peer::Java, args)
    }

    fn start_peer(peer: Peer, args: &[&str]) -> KafkaClientRun {
        let args: Vec<String> = args.iter().map(|&a| a.to_owned()).collect();
        let (sender, lines) = tokio::sync::mpsc::unbounded_channel();
        // Blocking reads and waits, off the test's runtime thread so rskafka's
        // connection tasks keep running.
        let done = tokio::task::spawn_blocking(move || run_kafka_client(peer, &args, sender));
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

fn run_kafka_client(peer: Peer, args: &[String], lines: tokio::sync::mpsc::UnboundedSender<String>) -> String {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = match peer {
        Peer::Librdkafka => {
            let mut cmd = Command::new(interop_python());
            cmd.arg(here.join("interop").join("kafka_client.py"));
            cmd
        }
        Peer::Java => {
            let libs = env("KAFKA_RETRY_KAFKA_LIBS").unwrap_or_else(|| {
                panic!("KAFKA_RETRY_KAFKA_LIBS is not set: the Java client runs on Apache Kafka's passes")
            });
            let mut cmd = Command::new("java");
            // The client's own log: warnings and worse.
            cmd.args(["-Xmx256m", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp"])
                .arg(PathBuf::from(libs).join("*"))
                .arg(here.join("peers").join("java").join("KafkaClientPeer.java"));
            cmd
        }
    };
    cmd.arg("--deadline-s").arg(KAFKA_CLIENT_DEADLINE.as_secs().to_string()).args(args);
    let shown = format!(
        "{} {}",
        cmd.get_program().to_string_lossy(),
        cmd.get_args().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
    );
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

/// The Spring Kafka peer (`peers/spring`: a billing listener with
/// `@RetryableTopic`, built by `cargo xtask` into `$KAFKA_RETRY_SPRING_PEER`)
/// while it runs against the test broker, secured as the pass is; killed
/// when dropped.
pub struct SpringPeer {
    child: std::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl SpringPeer {
    /// Starts the peer with `settings` (`PEER_TOPIC`, `PEER_GROUP`,
    /// `PEER_PROVIDER_URL`, `PEER_ATTEMPTS`, `PEER_DELAY_MS`, ...: see
    /// `peers/spring/src/main/java/billing/peer/BillingPeer.java`).
    pub fn start(settings: &[(&str, &str)]) -> SpringPeer {
        let jar = env("KAFKA_RETRY_SPRING_PEER").unwrap_or_else(|| {
            panic!("KAFKA_RETRY_SPRING_PEER is not set: the Spring peer runs on Apache Kafka's passes of `cargo xtask integration`, which builds it")
        });
        let mut child = Command::new("java")
            .args(["-Xmx384m", "-XX:+UseSerialGC", "-jar", &jar])
            .env("KAFKA_BROKERS", bootstrap().join(","))
            .envs(settings.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the Spring peer ({jar}): {e}"));
        // Both streams are its log (Spring logs to stdout); stdout's lines
        // also go to the test, which waits for some of them.
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (sender, lines) = tokio::sync::mpsc::unbounded_channel();
        let keep = |pipe: Box<dyn Read + Send>, sender: Option<tokio::sync::mpsc::UnboundedSender<String>>| {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                    let mut all = log.lock().unwrap_or_else(|p| p.into_inner());
                    all.push_str(&line);
                    all.push('\n');
                    drop(all);
                    if let Some(sender) = &sender {
                        let _ = sender.send(line);
                    }
                }
            });
        };
        keep(Box::new(child.stdout.take().expect("stdout is piped")), Some(sender));
        keep(Box::new(child.stderr.take().expect("stderr is piped")), None);
        SpringPeer { child, lines, log }
    }

    /// Waits up to `limit` for the next line of its standard output that
    /// `wanted` accepts; fails the test, with what the peer logged, when it
    /// ends or the time runs out first.
    pub async fn wait_for_line(&mut self, what: &str, limit: Duration, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) if wanted(&line) => return line,
                Ok(Some(_)) => {}
                Ok(None) => panic!("the Spring peer ended before {what}; it logged:\n{}", self.log()),
                Err(_) => panic!("no {what} from the Spring peer within {limit:?}; it logged:\n{}", self.log()),
            }
        }
    }

    /// What it printed so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Stops it (as a kill would: a test of a stopped peer wants it gone).
    pub fn stop(self) {
        drop(self);
    }

    /// Stops it as an orchestrator would (SIGTERM), waiting up to 60 s for
    /// it to end; fails the test, with its log, when it does not. Returns
    /// what it printed.
    pub async fn terminate(mut self) -> String {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => return self.log(),
                Ok(None) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                _ => panic!("the Spring peer did not stop within 60 s of SIGTERM; it logged:\n{}", self.log()),
            }
        }
    }
}

impl Drop for SpringPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
