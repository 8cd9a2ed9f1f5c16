//! The test brokers: tansu (a Kafka-compatible broker in Rust) on loopback;
//! librdkafka's mock cluster (several brokers with fault injection, from the
//! interop venv's confluent-kafka wheel); or Apache Kafka under Docker where
//! a Docker engine exists.

use std::{
    fmt::Write as _,
    fs,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs},
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};

use crate::{
    paths::{state_dir, workspace_root},
    process,
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
        /// Run tansu requiring SASL (SCRAM-SHA-512) authentication; it also
        /// prints the user and password.
        #[arg(long, conflicts_with_all = ["docker", "mock"])]
        sasl: bool,
        /// Port for tansu to listen on (default: a free ephemeral port).
        #[arg(long, conflicts_with_all = ["docker", "mock"])]
        port: Option<u16>,
    },
    /// Stop the broker that `up` started and delete its data.
    Down,
    /// Say whether the broker is running and answering, and where.
    Status,
}

pub(crate) fn run(action: Action) -> anyhow::Result<()> {
    match action {
        Action::Up { docker, mock, brokers, sasl, port } => {
            let wanted = if docker {
                Kind::Docker
            } else if mock {
                Kind::Mock
            } else if sasl {
                Kind::TansuSasl
            } else {
                Kind::Tansu
            };
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
            let broker = match wanted {
                Kind::Docker => Broker::start_docker()?,
                Kind::Mock => Broker::start_mock(brokers)?,
                Kind::TansuSasl => Broker::start_tansu_sasl(port)?,
                Kind::Tansu => Broker::start_tansu(port)?,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// tansu, one broker.
    Tansu,
    /// tansu requiring SASL (SCRAM-SHA-512) authentication.
    TansuSasl,
    /// librdkafka's mock cluster: several brokers, fault injection.
    Mock,
    /// Apache Kafka under docker compose.
    Docker,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Tansu => "tansu",
            Kind::TansuSasl => "tansu-sasl",
            Kind::Mock => "mock",
            Kind::Docker => "docker",
        }
    }
}

/// A broker that `up` started, as recorded in the state file.
#[derive(Debug)]
pub(crate) struct Broker {
    pub(crate) kind: Kind,
    /// `host:port[,host:port...]` for clients.
    pub(crate) addr: String,
    /// The mock cluster's control channel (`host:port`), for fault injection.
    pub(crate) control: Option<String>,
    /// The broker process' pid, which also leads its process group.
    pid: Option<u32>,
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
        let kind = match field("kind").as_deref() {
            Some("tansu") => Kind::Tansu,
            Some("tansu-sasl") => Kind::TansuSasl,
            Some("mock") => Kind::Mock,
            Some("docker") => Kind::Docker,
            other => bail!("{} is corrupt (kind {other:?}): delete it", path.display()),
        };
        let addr = field("addr").with_context(|| format!("{} has no addr: delete it", path.display()))?;
        let pid = field("pid").map(|p| p.parse()).transpose().context("corrupt pid in the broker state")?;
        Ok(Some(Broker { kind, addr, control: field("control"), pid, data_dir: field("data_dir").map(PathBuf::from) }))
    }

    /// Records this broker for later `status`, `down` and test runs.
    fn save(&self) -> anyhow::Result<()> {
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
        fs::create_dir_all(state_dir())?;
        fs::write(state_file(), text).context("cannot record the broker")
    }

    pub(crate) fn describe(&self) -> String {
        match (self.kind, self.pid) {
            (Kind::Tansu, Some(pid)) => format!("tansu {TANSU_VERSION}, pid {pid}"),
            (Kind::Tansu, None) => format!("tansu {TANSU_VERSION}"),
            (Kind::TansuSasl, pid) => {
                let pid = pid.map(|p| format!(", pid {p}")).unwrap_or_default();
                format!("tansu {TANSU_VERSION} requiring SASL SCRAM-SHA-512{pid}")
            }
            (Kind::Mock, pid) => {
                let brokers = self.addr.split(',').count();
                let pid = pid.map(|p| format!(", pid {p}")).unwrap_or_default();
                format!("librdkafka mock cluster, {brokers} brokers{pid}, control at {}", self.control_or_none())
            }
            (Kind::Docker, _) => "Apache Kafka under docker compose".to_owned(),
        }
    }

    fn control_or_none(&self) -> &str {
        self.control.as_deref().unwrap_or("<none>")
    }

    /// The environment a client of this broker needs, one `NAME=value` a line.
    fn print_env(&self) {
        println!("{}={}", crate::ci::BROKERS_ENV, self.addr);
        if let Some(control) = &self.control {
            println!("{}={control}", crate::ci::MOCK_CONTROL_ENV);
        }
        for (name, value) in self.sasl_env() {
            println!("{name}={value}");
        }
    }

    /// The SASL settings a client of this broker needs, as environment.
    pub(crate) fn sasl_env(&self) -> Vec<(&'static str, String)> {
        if self.kind != Kind::TansuSasl {
            return Vec::new();
        }
        let (user, password) = SASL_USER;
        vec![
            (crate::ci::SASL_MECHANISM_ENV, "SCRAM-SHA-512".to_owned()),
            (crate::ci::SASL_USERNAME_ENV, user.to_owned()),
            (crate::ci::SASL_PASSWORD_ENV, password.to_owned()),
        ]
    }

    /// Whether the broker answers now: a Metadata request, or where
    /// authentication is required, an ApiVersions request (allowed before it).
    fn probe(&self) -> anyhow::Result<()> {
        let mut last = Err(anyhow::anyhow!("no address"));
        for addr in self.addr.split(',') {
            last = if self.kind == Kind::TansuSasl { probe_api_versions(addr) } else { probe_metadata(addr) };
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

    /// Starts tansu on loopback with fresh storage and waits until it answers.
    pub(crate) fn start_tansu(port: Option<u16>) -> anyhow::Result<Broker> {
        let (addr, data_dir) = tansu_place(port)?;
        let child = spawn_tansu(&addr, &data_dir, false)?;
        let broker = Broker { kind: Kind::Tansu, addr, control: None, pid: Some(child.id()), data_dir: Some(data_dir) };
        broker.wait_until_up(child)
    }

    /// Starts tansu with SASL authentication required: it first runs
    /// without, so that `tansu user create` can add the SCRAM-SHA-512 user
    /// [`SASL_USER`], then again on the same storage with `--authentication`.
    pub(crate) fn start_tansu_sasl(port: Option<u16>) -> anyhow::Result<Broker> {
        let (addr, data_dir) = tansu_place(port)?;
        let child = spawn_tansu(&addr, &data_dir, false)?;
        let open = Broker { kind: Kind::Tansu, addr, control: None, pid: Some(child.id()), data_dir: Some(data_dir) };
        let open = open.wait_until_up(child)?;
        let (user, password) = SASL_USER;
        let created = process::run(Command::new(install_tansu()?).args([
            "user",
            "create",
            "--broker",
            &format!("tcp://{}", open.addr),
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
        let data_dir = open.data_dir.clone().expect("tansu has a data directory");
        let child = spawn_tansu(&open.addr, &data_dir, true)?;
        let broker = Broker {
            kind: Kind::TansuSasl,
            addr: open.addr,
            control: None,
            pid: Some(child.id()),
            data_dir: Some(data_dir),
        };
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
            kind: Kind::Mock,
            addr: String::new(),
            control: None,
            pid: Some(child.id()),
            data_dir: Some(data_dir),
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
            if let (Some(addr), Some(control)) = (value(crate::ci::BROKERS_ENV), value(crate::ci::MOCK_CONTROL_ENV)) {
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
        let broker =
            Broker { kind: Kind::Docker, addr: "127.0.0.1:9092".to_owned(), control: None, pid: None, data_dir: None };
        if !process::wait_until(START_TIMEOUT, || broker.answers()) {
            bail!("Kafka did not answer on {} within {START_TIMEOUT:?}: see `docker compose logs kafka`", broker.addr);
        }
        Ok(broker)
    }

    /// Stops the broker, deletes its data and forgets it.
    pub(crate) fn stop(&self) -> anyhow::Result<()> {
        match self.kind {
            Kind::Tansu | Kind::TansuSasl | Kind::Mock => {
                let program = if self.kind == Kind::Mock { "mock_cluster" } else { "tansu" };
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
            Kind::Docker => {
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

/// The SCRAM-SHA-512 user of `broker up --sasl`: a throwaway credential of a
/// throwaway local broker, printed for the tests and for people.
pub(crate) const SASL_USER: (&str, &str) = ("kafka-retry", "kafka-retry-test-password");

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

/// Spawns tansu on `addr` with its storage in `data_dir`, requiring client
/// authentication when `authentication` is set; its output is appended to
/// `data_dir/broker.log`.
fn spawn_tansu(addr: &str, data_dir: &std::path::Path, authentication: bool) -> anyhow::Result<std::process::Child> {
    let tansu = install_tansu()?;
    let log = fs::OpenOptions::new().create(true).append(true).open(data_dir.join("broker.log"))?;
    let url = format!("tcp://{addr}");
    let mut cmd = Command::new(&tansu);
    cmd.arg("broker")
        .args(["--listener-url", &url, "--advertised-listener-url", &url])
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

/// The tansu binary, installed into the cache on first use.
fn install_tansu() -> anyhow::Result<PathBuf> {
    crate::paths::cargo_install_cached(
        "tansu",
        TANSU_VERSION,
        &["--no-default-features", "--features", "libsql"],
        "about 12 minutes on 2 cores",
    )
}

fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port on 127.0.0.1")?;
    Ok(listener.local_addr()?.port())
}

/// Sends an ApiVersions (v0) request and checks that an answer comes.
fn probe_api_versions(addr: &str) -> anyhow::Result<()> {
    let socket: SocketAddr =
        addr.to_socket_addrs()?.next().with_context(|| format!("{addr} does not resolve to an address"))?;
    let mut stream = TcpStream::connect_timeout(&socket, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let client_id = b"xtask";
    let mut body = Vec::new();
    body.extend_from_slice(&18i16.to_be_bytes()); // api key: ApiVersions
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&7i32.to_be_bytes());
    body.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    body.extend_from_slice(client_id);
    let mut request = (body.len() as i32).to_be_bytes().to_vec();
    request.extend_from_slice(&body);
    stream.write_all(&request)?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    if i32::from_be_bytes(len) < 8 {
        bail!("implausible ApiVersions response");
    }
    Ok(())
}

/// Sends a Metadata (v1) request and checks that the answer lists a broker.
///
/// Hand-written rather than through a Kafka client: xtask stays light, and
/// this is all a readiness check needs.
pub(crate) fn probe_metadata(addr: &str) -> anyhow::Result<()> {
    let socket: SocketAddr =
        addr.to_socket_addrs()?.next().with_context(|| format!("{addr} does not resolve to an address"))?;
    let mut stream = TcpStream::connect_timeout(&socket, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;

    const CORRELATION_ID: i32 = 0x0c0ffee;
    let client_id = b"xtask";
    let mut body = Vec::new();
    body.extend_from_slice(&3i16.to_be_bytes()); // api key: Metadata
    body.extend_from_slice(&1i16.to_be_bytes()); // api version
    body.extend_from_slice(&CORRELATION_ID.to_be_bytes());
    body.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    body.extend_from_slice(client_id);
    body.extend_from_slice(&(-1i32).to_be_bytes()); // topics: null, i.e. all
    let mut request = (body.len() as i32).to_be_bytes().to_vec();
    request.extend_from_slice(&body);
    stream.write_all(&request)?;

    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = i32::from_be_bytes(len);
    if !(8..=16 << 20).contains(&len) {
        bail!("implausible Metadata response length {len}");
    }
    let mut response = vec![0u8; len as usize];
    stream.read_exact(&mut response)?;
    let correlation = i32::from_be_bytes(response[0..4].try_into()?);
    let brokers = i32::from_be_bytes(response[4..8].try_into()?);
    if correlation != CORRELATION_ID {
        bail!("Metadata response has correlation id {correlation}, expected {CORRELATION_ID}");
    }
    if brokers < 1 {
        bail!("Metadata response lists no broker yet");
    }
    Ok(())
}
