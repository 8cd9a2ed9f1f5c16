//! The test brokers: Apache Kafka itself (a KRaft cluster from Maven
//! Central, the reference: see [`crate::kafka`]); tansu (a Kafka-compatible
//! broker in Rust) on loopback, optionally requiring SASL and behind a TLS
//! terminator (stunnel); librdkafka's mock cluster (several brokers with
//! fault injection, from the interop venv's confluent-kafka wheel); or Apache
//! Kafka under Docker where a Docker engine exists.

use std::{
    fmt::Write as _,
    fs,
    net::TcpStream,
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};

use crate::{
    env::{
        BROKERS_ENV, KAFKA_CLUSTER_ENV, MOCK_CONTROL_ENV, REAUTH_BROKERS_ENV, SASL_MECHANISM_ENV, SASL_PASSWORD_ENV,
        SASL_USER, SASL_USERNAME_ENV, SECURITY_PROTOCOL_ENV, SSL_CA_ENV, SSL_CERTIFICATE_ENV, SSL_KEY_ENV,
        TLS_PROXY_CONFIG_ENV,
    },
    kafka,
    paths::{state_dir, workspace_root},
    probe::{free_port, probe_api_versions, probe_metadata, resolve},
    process,
    tls::{ClientAuth, TlsFiles},
};

/// The tansu release we test against; its cache entry is keyed by it.
pub(crate) const TANSU_VERSION: &str = "0.6.0";

/// How long a starting broker may take to answer a Metadata request.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// What `cargo xtask broker` does.
#[derive(clap::Subcommand)]
pub(crate) enum Action {
    /// Start the broker (installing tansu on first use) and wait until it answers.
    Up {
        /// Run Apache Kafka (resolved through Maven on first use, run with
        /// the machine's Java) instead of tansu: a KRaft cluster of
        /// `--nodes` brokers and `--controllers` controllers.
        #[arg(long, conflicts_with_all = ["docker", "mock"])]
        kafka: bool,
        /// How many brokers the Kafka cluster has.
        #[arg(long, default_value_t = 3, requires = "kafka", value_parser = clap::value_parser!(u8).range(1..=9))]
        nodes: u8,
        /// How many controllers (KRaft voters) the Kafka cluster has.
        #[arg(long, default_value_t = 1, requires = "kafka", value_parser = clap::value_parser!(u8).range(1..=5))]
        controllers: u8,
        /// Run Apache Kafka with `docker compose` (needs a Docker engine) instead of tansu.
        #[arg(long, conflicts_with = "mock")]
        docker: bool,
        /// Run librdkafka's mock cluster (several brokers, fault injection, no
        /// CreateTopics) instead of tansu; it also prints its control address.
        #[arg(long)]
        mock: bool,
        /// How many brokers the mock cluster has.
        #[arg(long, default_value_t = 3, requires = "mock")]
        brokers: u8,
        /// Require SASL (SCRAM-SHA-512) authentication; it also prints the
        /// user and password.
        #[arg(long, conflicts_with_all = ["docker", "mock"])]
        sasl: bool,
        /// Require TLS (certificates made at start for `localhost`; Kafka's
        /// own listeners, stunnel in front of tansu); it also prints the CA
        /// file. With `--sasl`: SASL_SSL.
        #[arg(long, conflicts_with_all = ["docker", "mock"])]
        tls: bool,
        /// Like `--tls`, and require client certificates (mutual TLS); it
        /// also prints the client certificate and key.
        #[arg(long, conflicts_with_all = ["docker", "mock", "sasl"])]
        mtls: bool,
        /// Port for tansu's clients (default: a free ephemeral port).
        #[arg(long, conflicts_with_all = ["docker", "mock", "kafka"])]
        port: Option<u16>,
    },
    /// Stop the broker that `up` started and delete its data.
    Down,
    /// Say whether the broker is running and answering, and where.
    Status,
}

pub(crate) fn run(action: Action) -> anyhow::Result<()> {
    match action {
        Action::Up { kafka, nodes, controllers, docker, mock, brokers, sasl, tls, mtls, port } => {
            let implementation = match (kafka, docker, mock) {
                (true, ..) => Implementation::Kafka,
                (_, true, _) => Implementation::Docker,
                (_, _, true) => Implementation::Mock,
                _ => Implementation::Tansu,
            };
            let tls = match (tls, mtls) {
                (_, true) => Some(ClientAuth::Required),
                (true, false) => Some(ClientAuth::None),
                (false, false) => None,
            };
            let wanted = Kind::plain(implementation).secured(sasl, tls);
            if let Some(broker) = Broker::load()? {
                if broker.answers() && broker.kind != wanted {
                    bail!(
                        "a {} broker is running at {} ({}): stop it with `cargo xtask broker down` first",
                        broker.kind.name(),
                        broker.addr,
                        broker.describe()
                    );
                }
                if broker.answers() {
                    println!("broker already running at {} ({})", broker.addr, broker.describe());
                    broker.print_env();
                    return Ok(());
                }
                eprintln!("a stale broker record was found; cleaning it up");
                broker.stop()?;
            }
            let broker = match wanted.implementation {
                Implementation::Docker => Broker::start_docker()?,
                Implementation::Mock => Broker::start_mock(brokers)?,
                Implementation::Kafka => Broker::start_kafka(wanted, nodes, controllers, kafka::JvmProfile::Tests)?,
                Implementation::Tansu => Broker::start_tansu_kind(wanted, port)?,
            };
            broker.save()?;
            println!("broker running at {} ({})", broker.addr, broker.describe());
            broker.print_env();
            Ok(())
        }
        Action::Down => match Broker::load()? {
            Some(broker) => {
                broker.stop()?;
                println!("broker at {} stopped", broker.addr);
                Ok(())
            }
            None => {
                println!("no broker is running (nothing recorded in {})", state_file().display());
                Ok(())
            }
        },
        Action::Status => match Broker::load()? {
            Some(broker) if broker.answers() => {
                println!("running at {} ({})", broker.addr, broker.describe());
                Ok(())
            }
            Some(broker) => {
                bail!(
                    "broker recorded at {} ({}) does not answer: run `cargo xtask broker down`",
                    broker.addr,
                    broker.describe()
                )
            }
            None => bail!("no broker is running: start one with `cargo xtask broker up`"),
        },
    }
}

/// Which implementation of Kafka a broker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Implementation {
    /// tansu, one broker (behind stunnel for TLS).
    Tansu,
    /// Apache Kafka, a KRaft cluster of JVMs from Maven Central.
    Kafka,
    /// librdkafka's mock cluster: several brokers, fault injection.
    Mock,
    /// Apache Kafka under docker compose.
    Docker,
}

impl Implementation {
    fn name(self) -> &'static str {
        match self {
            Implementation::Tansu => "tansu",
            Implementation::Kafka => "kafka",
            Implementation::Mock => "mock",
            Implementation::Docker => "docker",
        }
    }
}

/// A broker: which implementation, and how clients must connect to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kind {
    pub(crate) implementation: Implementation,
    /// Whether clients must authenticate with SASL (SCRAM-SHA-512).
    sasl: bool,
    /// Whether clients connect through TLS, and whether they need a certificate.
    tls: Option<ClientAuth>,
}

impl Kind {
    /// A plaintext broker of `implementation`.
    pub(crate) const fn plain(implementation: Implementation) -> Kind {
        Kind { implementation, sasl: false, tls: None }
    }

    /// tansu, plaintext.
    pub(crate) const TANSU: Kind = Kind::plain(Implementation::Tansu);
    /// The mock cluster.
    pub(crate) const MOCK: Kind = Kind::plain(Implementation::Mock);

    /// This implementation, secured as asked.
    pub(crate) const fn secured(self, sasl: bool, tls: Option<ClientAuth>) -> Kind {
        Kind { implementation: self.implementation, sasl, tls }
    }

    /// Its name: the implementation's, then `-sasl`, then `-tls` or `-mtls`.
    pub(crate) fn name(self) -> String {
        let mut name = self.implementation.name().to_owned();
        if self.sasl {
            name.push_str("-sasl");
        }
        match self.tls {
            Some(ClientAuth::None) => name.push_str("-tls"),
            Some(ClientAuth::Required) => name.push_str("-mtls"),
            None => {}
        }
        name
    }

    /// The kind a [`name`](Self::name) names.
    pub(crate) fn parse(name: &str) -> Option<Kind> {
        let implementations =
            [Implementation::Tansu, Implementation::Kafka, Implementation::Mock, Implementation::Docker];
        let securities = [
            (false, None),
            (true, None),
            (false, Some(ClientAuth::None)),
            (true, Some(ClientAuth::None)),
            (false, Some(ClientAuth::Required)),
        ];
        implementations
            .into_iter()
            .flat_map(|i| securities.map(|(sasl, tls)| Kind::plain(i).secured(sasl, tls)))
            .find(|k| k.name() == name)
    }

    /// Whether clients must authenticate with SASL.
    pub(crate) fn sasl(self) -> bool {
        self.sasl
    }

    /// Whether clients connect through TLS, and whether they need a certificate.
    pub(crate) fn tls(self) -> Option<ClientAuth> {
        self.tls
    }

    /// Kafka's `security.protocol` for clients of this broker.
    pub(crate) fn security_protocol(self) -> &'static str {
        match (self.sasl(), self.tls().is_some()) {
            (false, false) => "PLAINTEXT",
            (false, true) => "SSL",
            (true, false) => "SASL_PLAINTEXT",
            (true, true) => "SASL_SSL",
        }
    }
}

/// A broker that `up` started, as recorded in the state file.
#[derive(Debug, Clone)]
pub(crate) struct Broker {
    pub(crate) kind: Kind,
    /// `host:port[,host:port...]` for clients.
    pub(crate) addr: String,
    /// The mock cluster's control channel (`host:port`), for fault injection.
    pub(crate) control: Option<String>,
    /// The broker process' pid, which also leads its process group.
    pid: Option<u32>,
    /// Behind TLS: tansu's own plaintext address, which only the TLS
    /// terminator uses (brokers advertise the TLS address).
    backend: Option<String>,
    /// Behind TLS: the terminator's (stunnel's) pid, leading its process group.
    proxy_pid: Option<u32>,
    /// Its temporary storage and log.
    data_dir: Option<PathBuf>,
}

fn state_file() -> PathBuf {
    state_dir().join("broker.state")
}

fn compose_file() -> PathBuf {
    workspace_root().join("docker").join("compose.yaml")
}

impl Broker {
    /// The broker recorded by an earlier `up`, if any.
    pub(crate) fn load() -> anyhow::Result<Option<Broker>> {
        let path = state_file();
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let field = |name: &str| {
            text.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix('='))).map(str::to_owned)
        };
        let kind = field("kind");
        let Some(kind) = kind.as_deref().and_then(Kind::parse) else {
            bail!("{} is corrupt (kind {kind:?}): delete it", path.display())
        };
        let addr = field("addr").with_context(|| format!("{} has no addr: delete it", path.display()))?;
        let pid = field("pid").map(|p| p.parse()).transpose().context("corrupt pid in the broker state")?;
        let proxy_pid =
            field("proxy_pid").map(|p| p.parse()).transpose().context("corrupt proxy pid in the broker state")?;
        Ok(Some(Broker {
            kind,
            addr,
            control: field("control"),
            pid,
            data_dir: field("data_dir").map(PathBuf::from),
            backend: field("backend"),
            proxy_pid,
        }))
    }

    /// Records this broker for later `status`, `down` and test runs.
    pub(crate) fn save(&self) -> anyhow::Result<()> {
        let mut text = String::new();
        writeln!(text, "kind={}\naddr={}", self.kind.name(), self.addr)?;
        if let Some(control) = &self.control {
            writeln!(text, "control={control}")?;
        }
        if let Some(pid) = self.pid {
            writeln!(text, "pid={pid}")?;
        }
        if let Some(dir) = &self.data_dir {
            writeln!(text, "data_dir={}", dir.display())?;
        }
        if let Some(backend) = &self.backend {
            writeln!(text, "backend={backend}")?;
        }
        if let Some(pid) = self.proxy_pid {
            writeln!(text, "proxy_pid={pid}")?;
        }
        fs::create_dir_all(state_dir())?;
        fs::write(state_file(), text).context("cannot record the broker")
    }

    pub(crate) fn describe(&self) -> String {
        let security = || {
            let sasl = if self.kind.sasl() { " requiring SASL SCRAM-SHA-512" } else { "" };
            let tls = match self.kind.tls() {
                None => "",
                Some(ClientAuth::None) => " over TLS",
                Some(ClientAuth::Required) => " over TLS requiring client certificates",
            };
            format!("{sasl}{tls}")
        };
        match (self.kind.implementation, self.pid) {
            (Implementation::Kafka, _) => {
                let cluster = self.kafka_cluster().ok();
                let count = |role| cluster.as_ref().map_or(0, |c| c.nodes.iter().filter(|n| n.role == role).count());
                format!(
                    "Apache Kafka {}, {} brokers and {} controller(s){} in {}",
                    kafka::KAFKA_VERSION,
                    count(kafka::Role::Broker),
                    count(kafka::Role::Controller),
                    security(),
                    self.data_dir.as_deref().map(|d| d.display().to_string()).unwrap_or_default()
                )
            }
            (Implementation::Tansu, pid) if self.kind.security_protocol() == "PLAINTEXT" => {
                format!("tansu {TANSU_VERSION}{}", pid.map(|p| format!(", pid {p}")).unwrap_or_default())
            }
            (Implementation::Tansu, pid) => {
                let pid = pid.map(|p| format!(", pid {p}")).unwrap_or_default();
                let sasl = if self.kind.sasl() { " requiring SASL SCRAM-SHA-512" } else { "" };
                let tls = match self.kind.tls() {
                    None => String::new(),
                    Some(auth) => {
                        let proxy = self.proxy_pid.map(|p| format!(", pid {p}")).unwrap_or_default();
                        let mutual = if auth == ClientAuth::Required { " requiring client certificates" } else { "" };
                        format!(" behind TLS{mutual} (stunnel{proxy}; tansu itself on {})", self.backend_or_none())
                    }
                };
                format!("tansu {TANSU_VERSION}{sasl}{tls}{pid}")
            }
            (Implementation::Mock, pid) => {
                let brokers = self.addr.split(',').count();
                let pid = pid.map(|p| format!(", pid {p}")).unwrap_or_default();
                format!("librdkafka mock cluster, {brokers} brokers{pid}, control at {}", self.control_or_none())
            }
            (Implementation::Docker, _) => "Apache Kafka under docker compose".to_owned(),
        }
    }

    /// An Apache Kafka broker's cluster, as its directory records it.
    pub(crate) fn kafka_cluster(&self) -> anyhow::Result<kafka::Cluster> {
        let dir = self.data_dir.as_deref().context("a Kafka broker without a directory")?;
        kafka::Cluster::load(dir)
    }

    fn control_or_none(&self) -> &str {
        self.control.as_deref().unwrap_or("<none>")
    }

    fn backend_or_none(&self) -> &str {
        self.backend.as_deref().unwrap_or("<none>")
    }

    /// The environment a client of this broker needs, one `NAME=value` a
    /// line: the test suite's, then billing-bin's.
    fn print_env(&self) {
        println!("{BROKERS_ENV}={}", self.addr);
        if let Some(control) = &self.control {
            println!("{MOCK_CONTROL_ENV}={control}");
        }
        let security = self.security_env();
        for (name, value) in &security {
            println!("{name}={value}");
        }
        println!("KAFKA_BROKERS={}", self.addr);
        for (name, value) in &security {
            let setting = name
                .strip_prefix("KAFKA_RETRY_")
                .filter(|s| ["SECURITY", "SASL", "SSL"].iter().any(|p| s.starts_with(p)));
            if let Some(setting) = setting {
                println!("KAFKA_{setting}={value}");
            }
        }
    }

    /// The settings a client of this broker needs besides its address, as
    /// the test suite's environment (`KAFKA_RETRY_*`): security (none for a
    /// plaintext broker) and, for Apache Kafka, its cluster's directory.
    pub(crate) fn security_env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if self.kind.implementation == Implementation::Kafka {
            if let Some(dir) = &self.data_dir {
                env.push((KAFKA_CLUSTER_ENV, dir.display().to_string()));
            }
            if let Some(reauth) = self.kafka_cluster().ok().and_then(|c| c.reauth_bootstrap()) {
                env.push((REAUTH_BROKERS_ENV, reauth));
            }
        }
        if self.kind.security_protocol() == "PLAINTEXT" {
            return env;
        }
        env.push((SECURITY_PROTOCOL_ENV, self.kind.security_protocol().to_owned()));
        if self.kind.sasl() {
            let (user, password) = SASL_USER;
            env.push((SASL_MECHANISM_ENV, "SCRAM-SHA-512".to_owned()));
            env.push((SASL_USERNAME_ENV, user.to_owned()));
            env.push((SASL_PASSWORD_ENV, password.to_owned()));
            if self.kind.implementation == Implementation::Kafka {
                let (user, password) = crate::env::SASL_UNAUTHORIZED_USER;
                env.push((crate::env::SASL_UNAUTHORIZED_USERNAME_ENV, user.to_owned()));
                env.push((crate::env::SASL_UNAUTHORIZED_PASSWORD_ENV, password.to_owned()));
            }
        }
        if let (Some(auth), Some(files), Some(dir)) = (self.kind.tls(), self.tls_files(), &self.data_dir) {
            if self.kind.implementation == Implementation::Tansu {
                env.push((TLS_PROXY_CONFIG_ENV, crate::tls::stunnel_config(dir).display().to_string()));
            }
            env.push((SSL_CA_ENV, files.ca().display().to_string()));
            if auth == ClientAuth::Required {
                env.push((SSL_CERTIFICATE_ENV, files.client_certificate().display().to_string()));
                env.push((SSL_KEY_ENV, files.client_key().display().to_string()));
            }
        }
        env
    }

    /// The certificates of a TLS broker.
    fn tls_files(&self) -> Option<TlsFiles> {
        self.data_dir.as_ref().map(|d| TlsFiles::at(&d.join("tls")))
    }

    /// Whether the broker answers now: a Metadata request, or where
    /// authentication is required, an ApiVersions request (allowed before
    /// it). Behind TLS, tansu itself answers and the terminator accepts
    /// connections.
    fn probe(&self) -> anyhow::Result<()> {
        if self.kind.implementation == Implementation::Kafka {
            return self.kafka_cluster()?.probe();
        }
        if self.kind.tls().is_some() {
            let backend = self.backend.as_deref().context("a TLS broker without a backend address")?;
            probe_api_versions(backend)?;
            let socket = resolve(&self.addr)?;
            TcpStream::connect_timeout(&socket, Duration::from_secs(2))
                .with_context(|| format!("the TLS terminator does not accept connections on {}", self.addr))?;
            return Ok(());
        }
        let mut last = Err(anyhow::anyhow!("no address"));
        for addr in self.addr.split(',') {
            last = if self.kind.sasl() { probe_api_versions(addr) } else { probe_metadata(addr).map(|_| ()) };
            if last.is_ok() {
                return last;
            }
        }
        last
    }

    /// Whether the broker answers a Metadata request now (the mock cluster:
    /// its first broker, which fault injection may take down, so any of them).
    pub(crate) fn answers(&self) -> bool {
        self.probe().is_ok()
    }

    /// Starts tansu of `kind` (plain, SASL, TLS) and waits until it answers.
    pub(crate) fn start_tansu_kind(kind: Kind, port: Option<u16>) -> anyhow::Result<Broker> {
        match (kind.implementation, kind.sasl(), kind.tls()) {
            (Implementation::Tansu, false, None) => Broker::start_tansu(port),
            (Implementation::Tansu, true, None) => Broker::start_tansu_sasl(port),
            (Implementation::Tansu, _, Some(_)) => Broker::start_tansu_tls(kind, port),
            _ => bail!("{} is not a tansu broker", kind.name()),
        }
    }

    /// Starts an Apache Kafka cluster of `kind`'s security with `nodes`
    /// brokers and `controllers` controllers, its JVMs as `jvm` says, and
    /// waits until it is up.
    pub(crate) fn start_kafka(
        kind: Kind,
        nodes: u8,
        controllers: u8,
        jvm: kafka::JvmProfile,
    ) -> anyhow::Result<Broker> {
        let spec = kafka::ClusterSpec { brokers: nodes, controllers, sasl: kind.sasl(), tls: kind.tls(), jvm };
        let cluster = kafka::start(spec)?;
        Ok(Broker {
            kind,
            addr: cluster.bootstrap(),
            control: None,
            pid: None,
            data_dir: Some(cluster.dir),
            backend: None,
            proxy_pid: None,
        })
    }

    /// A broker record for a tansu process.
    fn tansu(kind: Kind, addr: String, pid: u32, data_dir: PathBuf) -> Broker {
        Broker { kind, addr, control: None, pid: Some(pid), data_dir: Some(data_dir), backend: None, proxy_pid: None }
    }

    /// Starts tansu on loopback with fresh storage and waits until it answers.
    pub(crate) fn start_tansu(port: Option<u16>) -> anyhow::Result<Broker> {
        let (addr, data_dir) = tansu_place(port)?;
        let child = spawn_tansu(&addr, &addr, &data_dir, false)?;
        Broker::tansu(Kind::TANSU, addr, child.id(), data_dir).wait_until_up(child)
    }

    /// Starts tansu with SASL authentication required, on fresh storage
    /// with the user [`SASL_USER`].
    pub(crate) fn start_tansu_sasl(port: Option<u16>) -> anyhow::Result<Broker> {
        let (addr, data_dir) = tansu_place(port)?;
        create_sasl_user(&addr, &data_dir)?;
        let child = spawn_tansu(&addr, &addr, &data_dir, true)?;
        Broker::tansu(Kind::TANSU.secured(true, None), addr, child.id(), data_dir).wait_until_up(child)
    }

    /// Starts tansu (with SASL if `kind` says so) on a loopback port of its
    /// own, and stunnel in front of it on `port`, with fresh certificates;
    /// tansu advertises the TLS address under the certificate's host name.
    fn start_tansu_tls(kind: Kind, port: Option<u16>) -> anyhow::Result<Broker> {
        let client_auth = kind.tls().context("not a TLS kind")?;
        let tls_port = match port {
            Some(port) => port,
            None => free_port()?,
        };
        let (backend, data_dir) = tansu_place(None)?;
        let files = TlsFiles::generate(&data_dir.join("tls"))?;
        if kind.sasl() {
            create_sasl_user(&backend, &data_dir)?;
        }
        let addr = format!("{}:{tls_port}", crate::tls::SERVER_NAME);
        let child = spawn_tansu(&backend, &addr, &data_dir, kind.sasl())?;
        let mut broker = Broker::tansu(kind, addr, child.id(), data_dir.clone());
        broker.backend = Some(backend.clone());
        let proxy =
            crate::tls::spawn_stunnel(&files, &format!("127.0.0.1:{tls_port}"), &backend, client_auth, &data_dir);
        match proxy {
            Ok(proxy) => broker.proxy_pid = Some(proxy.id()),
            Err(e) => {
                let _ = broker.stop();
                return Err(e);
            }
        }
        broker.wait_until_up(child)
    }

    /// Waits until the broker `child` runs answers; stops it and fails when
    /// it exits or takes longer than [`START_TIMEOUT`].
    fn wait_until_up(self, mut child: std::process::Child) -> anyhow::Result<Broker> {
        let log_path = self.data_dir.as_ref().map(|d| d.join("broker.log")).unwrap_or_default();
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                let tail = process::tail(&log_path, 30);
                let _ = self.stop();
                bail!("tansu exited ({status}) before answering on {}; its log ends with:\n{tail}", self.addr);
            }
            if let Some(proxy) = self.proxy_pid.filter(|p| !process::is_alive(*p)) {
                let log = self.data_dir.as_ref().map(|d| d.join("stunnel.log")).unwrap_or_default();
                let tail = process::tail(&log, 30);
                let _ = self.stop();
                bail!("stunnel (pid {proxy}) exited before accepting on {}; its log ends with:\n{tail}", self.addr);
            }
            match self.probe() {
                Ok(()) => return Ok(self),
                Err(e) if started.elapsed() > START_TIMEOUT => {
                    let tail = process::tail(&log_path, 30);
                    let _ = self.stop();
                    bail!(
                        "tansu did not answer on {} within {START_TIMEOUT:?} ({e:#}); its log ends with:\n{tail}",
                        self.addr
                    );
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// Starts librdkafka's mock cluster with `brokers` brokers
    /// (`tests/interop/mock_cluster.py`, with the interop venv's python) and
    /// waits until it answers.
    pub(crate) fn start_mock(brokers: u8) -> anyhow::Result<Broker> {
        let python = crate::python::interop_python()?;
        let script = workspace_root().join("tests").join("interop").join("mock_cluster.py");
        let data_dir = std::env::temp_dir().join(format!("kafka-retry-mock-{}-{}", std::process::id(), free_port()?));
        fs::create_dir_all(&data_dir).with_context(|| format!("cannot create {}", data_dir.display()))?;
        let out_path = data_dir.join("mock.out");
        let log_path = data_dir.join("mock.log");
        let mut cmd = Command::new(&python);
        cmd.arg(&script)
            .args(["--brokers", &brokers.to_string()])
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out_path)?)
            .stderr(fs::File::create(&log_path)?)
            .process_group(0);
        let mut child = cmd.spawn().with_context(|| format!("cannot start {}", process::show(&cmd)))?;
        let mut broker = Broker {
            kind: Kind::MOCK,
            addr: String::new(),
            control: None,
            pid: Some(child.id()),
            data_dir: Some(data_dir),
            backend: None,
            proxy_pid: None,
        };
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                let tail = process::tail(&log_path, 30);
                let _ = broker.stop();
                bail!("the mock cluster exited ({status}) before it was ready; its log ends with:\n{tail}");
            }
            let out = fs::read_to_string(&out_path).unwrap_or_default();
            let value = |name: &str| {
                out.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix('='))).map(str::to_owned)
            };
            if let (Some(addr), Some(control)) = (value(BROKERS_ENV), value(MOCK_CONTROL_ENV)) {
                broker.addr = addr;
                broker.control = Some(control);
                if broker.answers() {
                    return Ok(broker);
                }
            }
            if started.elapsed() > START_TIMEOUT {
                let tail = process::tail(&log_path, 30);
                let _ = broker.stop();
                bail!("the mock cluster was not ready within {START_TIMEOUT:?}; its log ends with:\n{tail}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts Apache Kafka from `docker/compose.yaml` and waits until it answers.
    fn start_docker() -> anyhow::Result<Broker> {
        let engine = Command::new("docker").arg("info").stdout(Stdio::null()).stderr(Stdio::null()).status();
        if !engine.is_ok_and(|s| s.success()) {
            bail!(
                "no Docker engine is reachable (`docker info` failed): `--docker` needs one; \
                 run `cargo xtask broker up` for the local tansu broker instead"
            );
        }
        process::run(
            Command::new("docker").arg("compose").arg("-f").arg(compose_file()).args(["up", "-d", "--wait", "kafka"]),
        )?;
        let broker = Broker {
            kind: Kind::plain(Implementation::Docker),
            addr: "127.0.0.1:9092".to_owned(),
            control: None,
            pid: None,
            data_dir: None,
            backend: None,
            proxy_pid: None,
        };
        if !process::wait_until(START_TIMEOUT, || broker.answers()) {
            bail!("Kafka did not answer on {} within {START_TIMEOUT:?}: see `docker compose logs kafka`", broker.addr);
        }
        Ok(broker)
    }

    /// Stops the broker, deletes its data and forgets it.
    pub(crate) fn stop(&self) -> anyhow::Result<()> {
        match self.kind.implementation {
            Implementation::Kafka => {
                self.kafka_cluster()?.stop()?;
                if let Some(dir) = &self.data_dir {
                    let _ = fs::remove_dir_all(dir);
                }
            }
            Implementation::Tansu | Implementation::Mock => {
                // The one started, and the one a test may have started in its
                // place (its pid file says which).
                let restarted = self.data_dir.as_deref().and_then(crate::tls::stunnel_pid);
                for pid in self.proxy_pid.into_iter().chain(restarted) {
                    if process::is_alive(pid) && process::cmdline(pid).is_some_and(|c| c.contains("stunnel")) {
                        process::stop_group(pid, Duration::from_secs(10));
                    }
                }
                let program = if self.kind.implementation == Implementation::Mock { "mock_cluster" } else { "tansu" };
                if let Some(pid) = self.pid {
                    // Only signal the pid if it is still ours, not a recycled pid.
                    if process::is_alive(pid) && process::cmdline(pid).is_some_and(|c| c.contains(program)) {
                        process::stop_group(pid, Duration::from_secs(10));
                    }
                    if process::is_alive(pid) {
                        bail!("{program} (pid {pid}) is still running after SIGKILL");
                    }
                }
                if let Some(dir) = &self.data_dir {
                    let _ = fs::remove_dir_all(dir);
                }
            }
            Implementation::Docker => {
                process::run(Command::new("docker").arg("compose").arg("-f").arg(compose_file()).args(["down", "-v"]))?;
            }
        }
        // Forget it only if it is the recorded one: an ephemeral broker of a
        // test run must not erase the record of one `up` started.
        let recorded = Broker::load().ok().flatten().is_some_and(|b| b.addr == self.addr);
        if !recorded {
            return Ok(());
        }
        match fs::remove_file(state_file()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).context("cannot forget the broker"),
            _ => Ok(()),
        }
    }
}

/// A free loopback address and a fresh data directory for tansu.
fn tansu_place(port: Option<u16>) -> anyhow::Result<(String, PathBuf)> {
    let port = match port {
        Some(port) => port,
        None => free_port()?,
    };
    let data_dir = std::env::temp_dir().join(format!("kafka-retry-broker-{port}-{}", std::process::id()));
    fs::create_dir_all(&data_dir).with_context(|| format!("cannot create {}", data_dir.display()))?;
    Ok((format!("127.0.0.1:{port}"), data_dir))
}

/// Adds the SCRAM-SHA-512 user [`SASL_USER`] to tansu's storage in
/// `data_dir`: `tansu user create` works only while the broker runs without
/// `--authentication`, so an open broker runs on `addr` meanwhile.
fn create_sasl_user(addr: &str, data_dir: &std::path::Path) -> anyhow::Result<()> {
    let child = spawn_tansu(addr, addr, data_dir, false)?;
    let open = Broker::tansu(Kind::TANSU, addr.to_owned(), child.id(), data_dir.to_owned()).wait_until_up(child)?;
    let (user, password) = SASL_USER;
    let created = process::run(Command::new(install_tansu(crate::paths::Priority::Normal)?).args([
        "user",
        "create",
        "--broker",
        &format!("tcp://{addr}"),
        "--mechanism",
        "scram512",
        user,
        password,
    ]));
    if let Some(pid) = open.pid {
        process::stop_group(pid, Duration::from_secs(10));
    }
    if let Err(e) = created {
        let _ = open.stop();
        return Err(e.context("cannot create the SASL user in tansu"));
    }
    Ok(())
}

/// Spawns tansu listening on `listen` and advertising `advertised`, with
/// its storage in `data_dir`, requiring client authentication when
/// `authentication` is set; its output is appended to `data_dir/broker.log`.
fn spawn_tansu(
    listen: &str,
    advertised: &str,
    data_dir: &std::path::Path,
    authentication: bool,
) -> anyhow::Result<std::process::Child> {
    let tansu = install_tansu(crate::paths::Priority::Normal)?;
    let log = fs::OpenOptions::new().create(true).append(true).open(data_dir.join("broker.log"))?;
    let mut cmd = Command::new(&tansu);
    cmd.arg("broker")
        .args([
            "--listener-url",
            &format!("tcp://{listen}"),
            "--advertised-listener-url",
            &format!("tcp://{advertised}"),
        ])
        // tansu resolves the database path against its working directory.
        .args(["--storage-engine", "sqlite://tansu.db"])
        .args(["--cluster-id", "kafka-retry-test"])
        // tansu reads these as defaults; keep a caller's settings out of the test broker.
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("SCHEMA_REGISTRY")
        .current_dir(data_dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: `down` stops exactly it, and a Ctrl-C
        // aimed at `cargo xtask broker up` does not reach it.
        .process_group(0);
    if authentication {
        cmd.arg("--authentication");
    }
    cmd.spawn().with_context(|| format!("cannot start {}", process::show(&cmd)))
}

/// The broker a local stack or a demo runs when not told which: Apache
/// Kafka, the reference, where this machine can run it (Java 17 or later,
/// and Maven to resolve its jars once, in about a minute), else tansu
/// (built once with cargo, in about 11 minutes). Says which and why.
pub(crate) fn local_choice() -> Implementation {
    match kafka::runnable() {
        Ok(()) => {
            eprintln!(
                "broker: Apache Kafka {} (Java 17+ and Maven are here; `--tansu` runs tansu {TANSU_VERSION} instead)",
                kafka::KAFKA_VERSION
            );
            Implementation::Kafka
        }
        Err(why) => {
            eprintln!(
                "broker: tansu {TANSU_VERSION}, as Apache Kafka cannot run here ({why}); its first build takes about \
                 11 minutes on 2 cores"
            );
            Implementation::Tansu
        }
    }
}

/// The tansu binary, installed into the cache on first use.
pub(crate) fn install_tansu(priority: crate::paths::Priority) -> anyhow::Result<PathBuf> {
    crate::paths::cargo_install_cached(
        "tansu",
        TANSU_VERSION,
        // Optimised a little, not fully: a quarter less to compile (20 minutes
        // of CPU instead of 28), and a broker for tests and demos is fast enough.
        &["--no-default-features", "--features", "libsql", "--config", "profile.release.opt-level=1"],
        "about 11 minutes on 2 cores",
        priority,
    )
}
