//! Apache Kafka itself, the reference broker: a pinned release resolved
//! through Maven Central into the cache (the distribution's `libs/` are
//! exactly `kafka_2.13`'s runtime dependencies), run as a KRaft cluster of
//! JVMs on loopback: a controller quorum and brokers, each a process of its
//! own that the fault tests can kill and start again.
//!
//! Every broker has three kinds of listener: `CLIENT`, secured as asked
//! (PLAINTEXT, SASL SCRAM-SHA-512, TLS, mutual TLS: Kafka's own TLS with PEM
//! stores from the test certificates, no terminator in front); `INTERNAL`,
//! plaintext, between brokers and for xtask's readiness probe; and with SASL,
//! `REAUTH`, like `CLIENT` but granting SASL sessions of a few seconds
//! (`connections.max.reauth.ms`), for the re-authentication tests.
//!
//! The cluster's directory holds a `cluster` file listing its nodes, and per
//! node its `server.properties`, the `command` that starts it (one argument
//! a line), its `pid` and its `node.log`: `down` stops exactly those
//! processes, and tests restart a node with its command.

use std::{
    fmt::Write as _,
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};

use crate::{
    paths::cache_dir,
    process,
    tls::{ClientAuth, TlsFiles},
};

/// The Apache Kafka release we test against; its cache entry is keyed by it.
pub(crate) const KAFKA_VERSION: &str = "4.4.0";

/// The slf4j binding that gives the brokers a log: Kafka's jars log through
/// slf4j 1.7 and ship no binding of their own (the distribution adds one).
const SLF4J_SIMPLE_VERSION: &str = "1.7.36";

/// How long a starting cluster may take until every broker is registered.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// How long the re-authentication listener's SASL sessions last (the
/// integration tests' `REAUTH_SESSION` says the same).
pub(crate) const REAUTH_SESSION: Duration = Duration::from_secs(10);

/// Node ids of controllers start here, so they never meet a broker's.
const FIRST_CONTROLLER_ID: u32 = 100;

/// The shape of a cluster to start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClusterSpec {
    /// How many brokers.
    pub(crate) brokers: u8,
    /// How many controllers (the KRaft quorum's voters).
    pub(crate) controllers: u8,
    /// Whether clients authenticate with SASL SCRAM-SHA-512.
    pub(crate) sasl: bool,
    /// Whether clients connect through TLS, and whether they need a certificate.
    pub(crate) tls: Option<ClientAuth>,
    /// How its JVMs compile and collect.
    pub(crate) jvm: JvmProfile,
}

/// How a cluster's JVMs compile code and collect garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JvmProfile {
    /// The client compiler alone and the serial collector: a cluster that
    /// lives minutes beside the tests spends about 40% less CPU compiling
    /// and collecting (159 s of CPU for the classic suite's main tests on
    /// 2026-12-07, 97 s so), which the tests then have.
    Tests,
    /// As Kafka ships it (both compilers, G1): for measuring throughput.
    Throughput,
}

/// One JVM of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    pub(crate) id: u32,
    pub(crate) role: Role,
    /// Its directory: configuration, command, pid, log and data.
    pub(crate) dir: PathBuf,
    /// Brokers: the address clients use. Controllers: the quorum's.
    pub(crate) addr: String,
    /// Brokers: the plaintext inter-broker address xtask probes.
    pub(crate) internal: Option<String>,
    /// Brokers with SASL: the short-session address.
    pub(crate) reauth: Option<String>,
}

/// What a node does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Broker,
    Controller,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Broker => "broker",
            Role::Controller => "controller",
        }
    }
}

/// A cluster as its directory describes it.
#[derive(Debug, Clone)]
pub(crate) struct Cluster {
    pub(crate) dir: PathBuf,
    pub(crate) nodes: Vec<Node>,
}

impl Cluster {
    /// The brokers' client addresses, the bootstrap list.
    pub(crate) fn bootstrap(&self) -> String {
        self.brokers().map(|n| n.addr.as_str()).collect::<Vec<_>>().join(",")
    }

    /// The brokers' re-authentication addresses, when the cluster has them.
    pub(crate) fn reauth_bootstrap(&self) -> Option<String> {
        let all: Option<Vec<&str>> = self.brokers().map(|n| n.reauth.as_deref()).collect();
        all.map(|a| a.join(","))
    }

    fn brokers(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.role == Role::Broker)
    }

    /// The cluster recorded in `dir`.
    pub(crate) fn load(dir: &Path) -> anyhow::Result<Cluster> {
        let path = dir.join("cluster");
        let text = fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let mut nodes = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [role, id, addr, internal, reauth] = fields[..] else {
                bail!("{} has a malformed line {line:?}: delete the directory", path.display());
            };
            let role = match role {
                "broker" => Role::Broker,
                "controller" => Role::Controller,
                other => bail!("{} names an unknown role {other:?}", path.display()),
            };
            let optional = |s: &str| (s != "-").then(|| s.to_owned());
            let id: u32 = id.parse().with_context(|| format!("{} has a bad node id {id:?}", path.display()))?;
            nodes.push(Node {
                id,
                role,
                dir: dir.join(format!("node-{id}")),
                addr: addr.to_owned(),
                internal: optional(internal),
                reauth: optional(reauth),
            });
        }
        Ok(Cluster { dir: dir.to_owned(), nodes })
    }

    fn save(&self) -> anyhow::Result<()> {
        let mut text = String::new();
        for n in &self.nodes {
            let shown = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".to_owned());
            writeln!(text, "{} {} {} {} {}", n.role.name(), n.id, n.addr, shown(&n.internal), shown(&n.reauth))?;
        }
        fs::write(self.dir.join("cluster"), text).context("cannot record the cluster's nodes")
    }

    /// Checks that every broker answers a Metadata request on its internal
    /// listener that lists every broker: a broker appears there only once
    /// the controller quorum's leader accepted its registration, so this
    /// also says the quorum has a leader.
    pub(crate) fn probe(&self) -> anyhow::Result<()> {
        let expected = self.brokers().count();
        for node in self.brokers() {
            let addr = node.internal.as_deref().context("a broker without an internal listener")?;
            let listed = crate::probe::probe_metadata(addr).with_context(|| format!("broker {}", node.id))?;
            if listed < expected {
                bail!("broker {} lists {listed} of {expected} brokers", node.id);
            }
        }
        Ok(())
    }

    /// Stops every node (TERM, then KILL after a grace period) whose pid
    /// file names a process that is still that node's JVM.
    pub(crate) fn stop(&self) -> anyhow::Result<()> {
        let running: Vec<(u32, &Node)> = self.nodes.iter().filter_map(|n| node_pid(n).map(|p| (p, n))).collect();
        for (pid, _) in &running {
            process::signal_group(*pid, "TERM");
        }
        let all_gone = || running.iter().all(|(pid, _)| !process::is_alive(*pid));
        if !process::wait_until(Duration::from_secs(15), all_gone) {
            for (pid, _) in running.iter().filter(|(pid, _)| process::is_alive(*pid)) {
                process::signal_group(*pid, "KILL");
            }
            process::wait_until(Duration::from_secs(5), all_gone);
        }
        if let Some((pid, node)) = running.iter().find(|(pid, _)| process::is_alive(*pid)) {
            bail!("Kafka node {} (pid {pid}) is still running after SIGKILL", node.id);
        }
        Ok(())
    }
}

/// The pid of `node`'s JVM, if its pid file names a live process that is
/// that node's (not a recycled pid).
fn node_pid(node: &Node) -> Option<u32> {
    let pid: u32 = fs::read_to_string(node.dir.join("pid")).ok()?.trim().parse().ok()?;
    let config = node.dir.join("server.properties").display().to_string();
    (process::is_alive(pid) && process::cmdline(pid).is_some_and(|c| c.contains(&config))).then_some(pid)
}

/// The jars of Apache Kafka [`KAFKA_VERSION`], resolved through Maven into
/// `<cache>/apache-kafka-<version>/libs/` on first use.
pub(crate) fn install() -> anyhow::Result<PathBuf> {
    let cache = cache_dir();
    let dir = cache.join(format!("apache-kafka-{KAFKA_VERSION}"));
    let libs = dir.join("libs");
    if libs.join(format!("kafka_2.13-{KAFKA_VERSION}.jar")).is_file() {
        return Ok(libs);
    }
    require_tool(
        "mvn",
        "-v",
        "Maven resolves Apache Kafka's jars from Maven Central: install Maven (Debian: apt-get install maven)",
    )?;
    fs::create_dir_all(&cache).with_context(|| format!("cannot create the cache {}", cache.display()))?;
    let partial = cache.join(format!("apache-kafka-{KAFKA_VERSION}.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial)?;
    let pom = format!(
        r#"<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kafka-retry.local</groupId>
  <artifactId>apache-kafka-distribution</artifactId>
  <version>{KAFKA_VERSION}</version>
  <packaging>pom</packaging>
  <description>The runtime jars of Apache Kafka {KAFKA_VERSION}, as its distribution's libs/ has them, and a log binding.</description>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>{SLF4J_SIMPLE_VERSION}</version></dependency>
  </dependencies>
</project>
"#
    );
    fs::write(partial.join("pom.xml"), pom)?;
    eprintln!("resolving Apache Kafka {KAFKA_VERSION} through Maven into {} (once per machine)", dir.display());
    let resolved = process::run(
        Command::new("mvn")
            .current_dir(&partial)
            .args(["--batch-mode", "--quiet", "--file", "pom.xml"])
            .arg("org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies")
            .args(["-DincludeScope=runtime", "-DoutputDirectory=libs"]),
    );
    if let Err(e) = resolved {
        let _ = fs::remove_dir_all(&partial);
        return Err(e.context(format!("cannot resolve org.apache.kafka:kafka_2.13:{KAFKA_VERSION} through Maven")));
    }
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&partial, &dir).with_context(|| format!("cannot move {} to {}", partial.display(), dir.display()))?;
    Ok(libs)
}

/// Fails with `advice` unless `program` runs.
fn require_tool(program: &str, version_flag: &str, advice: &str) -> anyhow::Result<String> {
    match Command::new(program).arg(version_flag).output() {
        Ok(out) if out.status.success() => {
            Ok(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
        }
        Ok(out) => bail!("`{program} {version_flag}` failed ({}): {advice}", out.status),
        Err(e) => bail!("`{program}` cannot run ({e}): {advice}"),
    }
}

/// Whether Apache Kafka can run here: Java 17 or later, and its jars
/// cached or Maven to resolve them; why not, when it cannot.
pub(crate) fn runnable() -> Result<(), String> {
    require_java().map_err(|e| format!("{e:#}"))?;
    let jars = cache_dir().join(format!("apache-kafka-{KAFKA_VERSION}")).join("libs");
    if !jars.join(format!("kafka_2.13-{KAFKA_VERSION}.jar")).is_file() {
        let advice = "Maven resolves Apache Kafka's jars: install Maven (Debian: apt-get install maven)";
        require_tool("mvn", "-v", advice).map_err(|e| format!("{e:#}"))?;
    }
    Ok(())
}

/// Checks that `java` is Java 17 or later, which Apache Kafka 4 needs.
fn require_java() -> anyhow::Result<()> {
    let advice =
        "Apache Kafka 4 runs on Java 17 or later: install a JDK (Debian: apt-get install openjdk-17-jre-headless)";
    let shown = require_tool("java", "-version", advice)?;
    // `openjdk version "17.0.15" ...` or `java version "1.8.0_..."`.
    let major = shown
        .split('"')
        .nth(1)
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok())
        .with_context(|| format!("cannot read the Java version from `java -version`: {shown}"))?;
    if major < 17 {
        bail!("`java` is Java {major}: {advice}");
    }
    Ok(())
}

/// Starts a cluster of `spec` in a fresh directory, with certificates and
/// SCRAM credentials as it asks, and waits until every broker is
/// registered. On failure, stops what it started and says which node
/// failed, with the tail of its log.
pub(crate) fn start(spec: ClusterSpec) -> anyhow::Result<Cluster> {
    if spec.brokers == 0 || spec.controllers == 0 {
        bail!("a Kafka cluster needs at least one broker and one controller");
    }
    let libs = install()?;
    require_java()?;
    let started = Instant::now();
    let base_port = crate::probe::free_port()?;
    let dir = std::env::temp_dir().join(format!("kafka-retry-kafka-{base_port}-{}", std::process::id()));
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let cluster = plan(&dir, spec)?;
    cluster.save()?;
    let tls = match spec.tls {
        Some(_) => Some(server_stores(&dir)?),
        None => None,
    };
    let voters = cluster
        .nodes
        .iter()
        .filter(|n| n.role == Role::Controller)
        .map(|n| format!("{}@{}", n.id, n.addr))
        .collect::<Vec<_>>()
        .join(",");
    for node in &cluster.nodes {
        fs::create_dir_all(node.dir.join("data"))?;
        let properties = server_properties(node, spec, &voters, tls.as_ref());
        fs::write(node.dir.join("server.properties"), properties)?;
        let command = node_command(&libs, node, spec.jvm);
        let lines: Vec<String> = std::iter::once(command.get_program())
            .chain(command.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        fs::write(node.dir.join("command"), lines.join("\n") + "\n")?;
    }
    if let Err(e) = format_storage(&libs, &cluster, spec) {
        let _ = fs::remove_dir_all(&dir);
        return Err(e);
    }
    let mut children = Vec::new();
    for node in &cluster.nodes {
        match spawn_node(node) {
            Ok(child) => children.push(child),
            Err(e) => {
                let _ = cluster.stop();
                return Err(e);
            }
        }
    }
    loop {
        // The children themselves, not their pid files: a process just
        // forked shows xtask's command line until it has exec'd the JVM.
        let exited = children.iter_mut().position(|c| !matches!(c.try_wait(), Ok(None)));
        if let Some(node) = exited.map(|n| &cluster.nodes[n]) {
            let tail = process::tail(&node.dir.join("node.log"), 40);
            let _ = cluster.stop();
            bail!(
                "Kafka {} {} exited before the cluster was up; its log ends with:\n{tail}",
                node.role.name(),
                node.id
            );
        }
        match cluster.probe() {
            Ok(()) => break,
            Err(e) if started.elapsed() > START_TIMEOUT => {
                let tails: Vec<String> = cluster
                    .nodes
                    .iter()
                    .map(|n| format!("{} {}:\n{}", n.role.name(), n.id, process::tail(&n.dir.join("node.log"), 15)))
                    .collect();
                let _ = cluster.stop();
                bail!(
                    "the Kafka cluster was not up within {START_TIMEOUT:?} ({e:#}); its logs end with:\n{}",
                    tails.join("\n")
                );
            }
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
    for child in children {
        // Reaped by whoever outlives it; xtask stops it through its pid file.
        std::thread::spawn(move || {
            let mut child = child;
            child.wait()
        });
    }
    eprintln!(
        "Apache Kafka {KAFKA_VERSION}: {} broker(s) and {} controller(s) up in {:.1} s",
        spec.brokers,
        spec.controllers,
        started.elapsed().as_secs_f64()
    );
    Ok(cluster)
}

/// Every node's id, directory and addresses, on free loopback ports.
fn plan(dir: &Path, spec: ClusterSpec) -> anyhow::Result<Cluster> {
    // Brokers advertise the certificate's host name behind TLS.
    let host = if spec.tls.is_some() { crate::tls::SERVER_NAME } else { "127.0.0.1" };
    let mut nodes = Vec::new();
    for i in 0..u32::from(spec.controllers) {
        let id = FIRST_CONTROLLER_ID + i;
        let addr = format!("127.0.0.1:{}", crate::probe::free_port()?);
        nodes.push(Node {
            id,
            role: Role::Controller,
            dir: dir.join(format!("node-{id}")),
            addr,
            internal: None,
            reauth: None,
        });
    }
    for id in 1..=u32::from(spec.brokers) {
        let addr = format!("{host}:{}", crate::probe::free_port()?);
        let internal = Some(format!("127.0.0.1:{}", crate::probe::free_port()?));
        let reauth = if spec.sasl { Some(format!("{host}:{}", crate::probe::free_port()?)) } else { None };
        nodes.push(Node { id, role: Role::Broker, dir: dir.join(format!("node-{id}")), addr, internal, reauth });
    }
    Ok(Cluster { dir: dir.to_owned(), nodes })
}

/// The brokers' TLS stores: the server key and certificate in one PEM key
/// store (Kafka reads unencrypted PKCS#8 keys), and the CA as trust store.
struct ServerStores {
    keystore: PathBuf,
    truststore: PathBuf,
}

fn server_stores(dir: &Path) -> anyhow::Result<ServerStores> {
    let files = TlsFiles::generate(&dir.join("tls"))?;
    let key = fs::read_to_string(files.server_key())?;
    let certificate = fs::read_to_string(files.server_certificate())?;
    let keystore = dir.join("tls").join("server-keystore.pem");
    fs::write(&keystore, format!("{key}{certificate}"))?;
    Ok(ServerStores { keystore, truststore: files.ca() })
}

/// The SCRAM users of a SASL cluster, as `--add-scram` takes them at
/// format time: the suite's (a super user) and one that no ACL names.
fn scram_credentials() -> [String; 2] {
    [crate::env::SASL_USER, crate::env::SASL_UNAUTHORIZED_USER]
        .map(|(user, password)| format!("SCRAM-SHA-512=[name={user},password={password}]"))
}

fn server_properties(node: &Node, spec: ClusterSpec, voters: &str, tls: Option<&ServerStores>) -> String {
    let brokers = u32::from(spec.brokers);
    let replication = brokers.min(3);
    let min_insync = replication.min(2);
    let data = node.dir.join("data");
    let mut p = String::new();
    let mut set = |name: &str, value: &str| {
        let _ = writeln!(p, "{name}={value}");
    };
    set("node.id", &node.id.to_string());
    set("controller.quorum.voters", voters);
    set("controller.listener.names", "CONTROLLER");
    set("log.dirs", &data.display().to_string());
    // Topic defaults: read by the controller when it creates topics, by
    // brokers for their logs. Nothing is created implicitly.
    set("num.partitions", "1");
    set("default.replication.factor", &replication.to_string());
    set("min.insync.replicas", &min_insync.to_string());
    set("auto.create.topics.enable", "false");
    // A killed broker is fenced (and leaves every ISR) after this long.
    set("broker.session.timeout.ms", "6000");
    set("broker.heartbeat.interval.ms", "1000");
    if spec.sasl {
        // ACLs as managed clusters have them: the suite's user (and the
        // nodes' own plaintext listeners) may do anything, the other SCRAM
        // user nothing, so a refusal can be provoked.
        set("authorizer.class.name", "org.apache.kafka.metadata.authorizer.StandardAuthorizer");
        set("super.users", &format!("User:ANONYMOUS;User:{}", crate::env::SASL_USER.0));
    }
    match node.role {
        Role::Controller => {
            set("process.roles", "controller");
            set("listeners", &format!("CONTROLLER://{}", node.addr));
            set("listener.security.protocol.map", "CONTROLLER:PLAINTEXT");
        }
        Role::Broker => {
            let bind = |addr: &str| addr.replace(crate::tls::SERVER_NAME, "127.0.0.1");
            let internal = node.internal.as_deref().unwrap_or_default();
            let client_protocol = match (spec.sasl, spec.tls.is_some()) {
                (false, false) => "PLAINTEXT",
                (false, true) => "SSL",
                (true, false) => "SASL_PLAINTEXT",
                (true, true) => "SASL_SSL",
            };
            let mut listeners = vec![format!("CLIENT://{}", bind(&node.addr)), format!("INTERNAL://{internal}")];
            let mut advertised = vec![format!("CLIENT://{}", node.addr), format!("INTERNAL://{internal}")];
            let mut protocols = vec![format!("CLIENT:{client_protocol}"), "INTERNAL:PLAINTEXT".to_owned()];
            let mut secured = vec!["client"];
            if let Some(reauth) = &node.reauth {
                listeners.push(format!("REAUTH://{}", bind(reauth)));
                advertised.push(format!("REAUTH://{reauth}"));
                protocols.push(format!("REAUTH:{client_protocol}"));
                secured.push("reauth");
            }
            protocols.push("CONTROLLER:PLAINTEXT".to_owned());
            set("process.roles", "broker");
            set("listeners", &listeners.join(","));
            set("advertised.listeners", &advertised.join(","));
            set("listener.security.protocol.map", &protocols.join(","));
            set("inter.broker.listener.name", "INTERNAL");
            set("offsets.topic.replication.factor", &replication.to_string());
            set("offsets.topic.num.partitions", "12");
            set("transaction.state.log.replication.factor", &replication.to_string());
            set("transaction.state.log.min.isr", &min_insync.to_string());
            set("transaction.state.log.num.partitions", "6");
            // A new group's first rebalance starts at once (Kafka's own
            // development settings do the same): the suite makes many groups.
            set("group.initial.rebalance.delay.ms", "0");
            // The consumer group protocol's session and heartbeats are the
            // broker's: as short as the suite's classic members' (6 s), so a
            // killed member's partitions move as soon under either protocol.
            set("group.consumer.session.timeout.ms", "6000");
            set("group.consumer.min.session.timeout.ms", "1000");
            set("group.consumer.heartbeat.interval.ms", "500");
            set("group.consumer.min.heartbeat.interval.ms", "100");
            // Two cores run the whole cluster and the suite.
            set("num.network.threads", "2");
            set("num.io.threads", "4");
            set("background.threads", "4");
            if spec.sasl {
                set("sasl.enabled.mechanisms", "SCRAM-SHA-512");
                for listener in &secured {
                    set(
                        &format!("listener.name.{listener}.scram-sha-512.sasl.jaas.config"),
                        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                    );
                }
                set(
                    "listener.name.reauth.scram-sha-512.connections.max.reauth.ms",
                    &REAUTH_SESSION.as_millis().to_string(),
                );
            }
            if let (Some(stores), Some(auth)) = (tls, spec.tls) {
                for listener in &secured {
                    set(&format!("listener.name.{listener}.ssl.keystore.type"), "PEM");
                    set(
                        &format!("listener.name.{listener}.ssl.keystore.location"),
                        &stores.keystore.display().to_string(),
                    );
                    set(&format!("listener.name.{listener}.ssl.truststore.type"), "PEM");
                    set(
                        &format!("listener.name.{listener}.ssl.truststore.location"),
                        &stores.truststore.display().to_string(),
                    );
                    if auth == ClientAuth::Required {
                        set(&format!("listener.name.{listener}.ssl.client.auth"), "required");
                    }
                }
            }
        }
    }
    p
}

/// The JVM options of every node: small heaps (a cluster and the suite
/// share two cores and a few GiB), the compilers and collector of
/// `profile`, and a log with times.
fn jvm_options(role: Role, profile: JvmProfile) -> Vec<String> {
    let heap = match role {
        Role::Broker => "-Xmx512m",
        Role::Controller => "-Xmx256m",
    };
    let compile_and_collect: &[&str] = match profile {
        JvmProfile::Tests => &["-XX:TieredStopAtLevel=1", "-XX:CICompilerCount=1", "-XX:+UseSerialGC"],
        JvmProfile::Throughput => &["-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20"],
    };
    ["-Xms64m", heap]
        .iter()
        .chain(compile_and_collect)
        .chain(&[
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
        ])
        .map(|s| (*s).to_owned())
        .collect()
}

/// The command that runs `node`.
fn node_command(libs: &Path, node: &Node, jvm: JvmProfile) -> Command {
    let mut cmd = Command::new("java");
    cmd.args(jvm_options(node.role, jvm))
        .arg("-cp")
        .arg(libs.join("*"))
        .arg("kafka.Kafka")
        .arg(node.dir.join("server.properties"));
    cmd
}

/// Formats every node's storage for one cluster id, the SCRAM user included
/// when the cluster requires SASL; the nodes format in parallel.
fn format_storage(libs: &Path, cluster: &Cluster, spec: ClusterSpec) -> anyhow::Result<()> {
    let cluster_id = new_cluster_id()?;
    let mut formatting: Vec<(&Node, Child)> = Vec::new();
    for node in &cluster.nodes {
        let log = fs::File::create(node.dir.join("format.log"))?;
        let mut cmd = Command::new("java");
        cmd.args(["-Xmx256m", "-cp"])
            .arg(libs.join("*"))
            .args(["kafka.tools.StorageTool", "format", "--cluster-id", &cluster_id, "--config"])
            .arg(node.dir.join("server.properties"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if spec.sasl {
            for credential in scram_credentials() {
                cmd.args(["--add-scram", &credential]);
            }
        }
        let child = cmd.spawn().with_context(|| format!("cannot start {}", process::show(&cmd)))?;
        formatting.push((node, child));
    }
    let mut failed = Vec::new();
    for (node, mut child) in formatting {
        let status = child.wait()?;
        if !status.success() {
            let tail = process::tail(&node.dir.join("format.log"), 20);
            failed.push(format!("{} {} ({status}):\n{tail}", node.role.name(), node.id));
        }
    }
    if !failed.is_empty() {
        bail!("formatting the Kafka nodes' storage failed:\n{}", failed.join("\n"));
    }
    Ok(())
}

/// A KRaft cluster id: sixteen random bytes, base64url without padding,
/// never starting with `-` (as Kafka's own `Uuid.randomUuid` makes them:
/// one that did would read as an option to `kafka-storage format`, one run
/// in 64).
fn new_cluster_id() -> anyhow::Result<String> {
    loop {
        let id = random_base64url_id()?;
        if !id.starts_with('-') {
            return Ok(id);
        }
    }
}

/// Sixteen random bytes, base64url without padding.
fn random_base64url_id() -> anyhow::Result<String> {
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(&mut fs::File::open("/dev/urandom")?, &mut bytes)?;
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut id = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            id.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    Ok(id)
}

/// Starts `node` with its recorded command, in a process group of its own
/// (so a Ctrl-C aimed at xtask does not reach it, and `down` stops exactly
/// it), its output appended to its log, its pid recorded.
fn spawn_node(node: &Node) -> anyhow::Result<Child> {
    let text = fs::read_to_string(node.dir.join("command"))?;
    let mut args = text.lines();
    let program = args.next().context("an empty node command")?;
    let log = fs::OpenOptions::new().create(true).append(true).open(node.dir.join("node.log"))?;
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(&node.dir).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).process_group(0);
    let child = cmd.spawn().with_context(|| format!("cannot start Kafka node {}", node.id))?;
    fs::write(node.dir.join("pid"), child.id().to_string())?;
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ids_are_22_base64url_characters() {
        let id = new_cluster_id().unwrap();
        assert_eq!(id.len(), 22, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{id}");
        assert_ne!(id, new_cluster_id().unwrap());
        // One in 64 random ids starts with a dash, which a command line
        // would take for an option: never one of ours.
        assert!((0..1_000).all(|_| !new_cluster_id().unwrap().starts_with('-')));
    }
}
