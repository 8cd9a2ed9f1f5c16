//! `cargo xtask up` / `down` / `orders`: a local stack for trying the
//! billing service by hand. `up` starts a broker (Apache Kafka where Java
//! and Maven are, else tansu) unless one is running already, creates the ladder's
//! topics, starts the fake billing provider with the faults asked for, writes
//! an operators' token, and prints the environment that `cargo run -p
//! billing-bin -- run` needs (also written to `target/xtask/stack.env`).
//! `orders` produces sample OrderConfirmed events; `down` stops exactly what
//! `up` started.

use std::{
    fmt::Write as _,
    fs,
    io::Read as _,
    net::TcpListener,
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context};

use crate::{
    broker::{Broker, Implementation, Kind},
    paths::{cargo, state_dir, workspace_root},
    process::{self, run},
};

/// The port the stack's tansu takes when it is free: billing-bin's default
/// `KAFKA_BROKERS` then needs no setting.
const DEFAULT_BROKER_PORT: u16 = 9092;

/// The port the fake provider takes when it is free.
const DEFAULT_PROVIDER_PORT: u16 = 9000;

/// Where billing-bin serves its probes and metrics by default (ADMIN_LISTEN).
const DEFAULT_ADMIN_PORT: u16 = 8080;

/// Where billing-bin's operators' API listens by default (OPERATOR_LISTEN).
const DEFAULT_OPERATOR_PORT: u16 = 8081;

/// How long the fake provider may take to say where it listens.
const PROVIDER_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds what `up`, `orders` and `demo` run, into `target/debug`:
/// billing-bin as `cargo run -p billing-bin` builds it (so the quick
/// start's `cargo run` finds it built), the fake provider, the sample orders
/// and the demo.
pub(crate) fn build_binaries() -> anyhow::Result<PathBuf> {
    let build = |args: &[&str]| run(Command::new(cargo()).current_dir(workspace_root()).arg("build").args(args));
    build(&["--package", "billing-bin", "--bin", "billing-bin"])?;
    let bins = ["fake-provider", "sample-orders", "demo"].map(|bin| ["--bin", bin]);
    build(&[&["--package", "integration", "--features", "broker"][..], &bins.concat()].concat())?;
    Ok(crate::paths::target_dir().join("debug"))
}

/// What `up` starts.
#[derive(clap::Args)]
pub(crate) struct UpArgs {
    /// Which broker to start (when none runs already): by default Apache
    /// Kafka where Java 17+ and Maven are (one KRaft broker and one
    /// controller, its jars resolved through Maven on first use), else
    /// tansu (built with cargo on first use).
    #[command(flatten)]
    broker: BrokerArgs,
    /// Partitions of every topic of the ladder.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=64))]
    partitions: u16,
    /// Percent of orders the fake provider first refuses transiently
    /// (change it later with `PUT /faults`).
    #[arg(long, default_value_t = 10)]
    transient_pct: u8,
    /// Percent of orders it always declines (400).
    #[arg(long, default_value_t = 5)]
    permanent_pct: u8,
    /// How long every answer of the fake provider takes at least (e.g. 50ms).
    #[arg(long, default_value = "0s")]
    latency: String,
}

/// Which broker a local stack or the demo starts.
#[derive(clap::Args, Clone, Copy, Default)]
pub(crate) struct BrokerArgs {
    /// Apache Kafka, even if this machine seems to lack what runs it.
    #[arg(long, conflicts_with = "tansu")]
    kafka: bool,
    /// tansu, even where Apache Kafka could run.
    #[arg(long)]
    tansu: bool,
}

impl BrokerArgs {
    /// The broker asked for, or the machine's choice (said with why).
    pub(crate) fn implementation(self) -> Implementation {
        match (self.kafka, self.tansu) {
            (true, _) => Implementation::Kafka,
            (_, true) => Implementation::Tansu,
            _ => crate::broker::local_choice(),
        }
    }
}

/// What `orders` produces.
#[derive(clap::Args)]
pub(crate) struct OrdersArgs {
    /// How many OrderConfirmed events.
    #[arg(default_value_t = 10)]
    count: u32,
}

/// What `up` started, for `down` and `orders`.
struct Stack {
    /// Whether `up` started the broker (else it was running already, and
    /// `down` leaves it running).
    started_broker: bool,
    brokers: String,
    provider_pid: u32,
    provider_url: String,
    /// billing-bin's ADMIN_LISTEN and OPERATOR_LISTEN: its defaults where
    /// they are free.
    admin_listen: String,
    operator_listen: String,
}

fn stack_file() -> PathBuf {
    state_dir().join("stack.state")
}

fn env_file() -> PathBuf {
    state_dir().join("stack.env")
}

fn token_file() -> PathBuf {
    state_dir().join("admin-token")
}

fn provider_log() -> PathBuf {
    state_dir().join("provider.log")
}

impl Stack {
    fn load() -> anyhow::Result<Option<Stack>> {
        let path = stack_file();
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
                .map(str::to_owned)
                .with_context(|| format!("{} has no {name}: run `cargo xtask down`", path.display()))
        };
        Ok(Some(Stack {
            started_broker: field("started_broker")? == "true",
            brokers: field("brokers")?,
            provider_pid: field("provider_pid")?.parse().context("corrupt provider pid in the stack state")?,
            provider_url: field("provider_url")?,
            admin_listen: field("admin_listen")?,
            operator_listen: field("operator_listen")?,
        }))
    }

    fn save(&self) -> anyhow::Result<()> {
        let text = format!(
            "started_broker={}\nbrokers={}\nprovider_pid={}\nprovider_url={}\nadmin_listen={}\noperator_listen={}\n",
            self.started_broker,
            self.brokers,
            self.provider_pid,
            self.provider_url,
            self.admin_listen,
            self.operator_listen
        );
        fs::write(stack_file(), text).context("cannot record the stack")
    }

    /// The environment billing-bin runs with against this stack.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("KAFKA_BROKERS", self.brokers.clone()),
            ("BILLING_PROVIDER_URL", self.provider_url.clone()),
            ("ADMIN_TOKEN_FILE", token_file().display().to_string()),
            ("ADMIN_LISTEN", self.admin_listen.clone()),
            ("OPERATOR_LISTEN", self.operator_listen.clone()),
            // Where `billing-bin dlq` finds the operators' API.
            ("OPERATOR_URL", format!("http://{}", self.operator_listen)),
        ]
    }

    fn print(&self) {
        // From the workspace root, where cargo runs; the file's values hold no spaces.
        let env = format!("env $(cat {}) ", env_file().strip_prefix(workspace_root()).unwrap_or(&env_file()).display());
        let url = &self.provider_url;
        println!("\nthe local stack is up:");
        println!("  broker     {}", self.brokers);
        println!("  provider   {url} (the fake billing provider)");
        println!("  token      {} (the operators' token)", token_file().display());
        println!("  settings   {}:", env_file().display());
        for (name, value) in self.env() {
            println!("               {name}={value}");
        }
        println!("\nrun the service (in another terminal):");
        println!("  {env}cargo run -p billing-bin -- run");
        println!("check its settings first, if you like:");
        println!("  {env}cargo run -p billing-bin -- check");
        println!("produce orders:            cargo xtask orders 10");
        println!("what was charged:          curl -s {url}/ledger");
        println!("more faults:               curl -X PUT {url}/faults -d '{{\"transient_pct\": 50}}'");
        println!("a provider outage:         curl -X PUT {url}/outage -d on     (and -d off)");
        println!("the dead letters:          {env}cargo run -p billing-bin -- dlq list");
        println!("the operators' console:    http://{}/console (with the token above)", self.operator_listen);
        println!("the service's metrics:     curl -s http://{}/metrics", self.admin_listen);
        println!("stop it all:               cargo xtask down");
    }
}

pub(crate) fn up(args: &UpArgs) -> anyhow::Result<()> {
    if let Some(stack) = Stack::load()? {
        if process::is_alive(stack.provider_pid) {
            println!("the local stack is already up");
            stack.print();
            return Ok(());
        }
        eprintln!("a stale stack record was found; cleaning it up");
        down()?;
    }
    fs::create_dir_all(state_dir())?;
    build_binaries()?;

    let (broker, started_broker) = match Broker::load()? {
        Some(broker) if broker.answers() && !broker.kind.sasl() && broker.kind.tls().is_none() => {
            println!("using the broker already running at {} ({})", broker.addr, broker.describe());
            (broker, false)
        }
        Some(broker) if broker.answers() => bail!(
            "a {} broker is running at {}: the local stack runs without SASL and TLS; stop it with `cargo xtask \
             broker down` first",
            broker.kind.name(),
            broker.addr
        ),
        stale => {
            if let Some(broker) = stale {
                broker.stop()?;
            }
            let broker = match args.broker.implementation() {
                Implementation::Kafka => {
                    Broker::start_kafka(Kind::plain(Implementation::Kafka), 1, 1, crate::kafka::JvmProfile::Tests)?
                }
                _ => Broker::start_tansu(port_if_free(DEFAULT_BROKER_PORT))?,
            };
            broker.save()?;
            println!("broker running at {} ({})", broker.addr, broker.describe());
            (broker, true)
        }
    };
    let started = start_the_rest(args, &broker.addr, started_broker);
    if started.is_err() && started_broker {
        let _ = broker.stop();
    }
    started?.print();
    Ok(())
}

/// How long `up` waits for a group coordinator on the broker.
const COORDINATOR_TIMEOUT: Duration = Duration::from_secs(60);

/// Topics, provider, token and settings, on a broker at `brokers`.
fn start_the_rest(args: &UpArgs, brokers: &str, started_broker: bool) -> anyhow::Result<Stack> {
    let target = crate::paths::target_dir().join("debug");
    // Ready means ready for a consumer group: on a broker just started, a
    // first `billing-bin check` or `run` would otherwise meet a coordinator
    // still loading (a cluster busy with other work takes seconds).
    let mut not_yet = None;
    let ready = process::wait_until(COORDINATOR_TIMEOUT, || match crate::probe::probe_coordinator(brokers) {
        Ok(()) => true,
        Err(e) => {
            not_yet = Some(e);
            false
        }
    });
    if !ready {
        let why = not_yet.map(|e| format!("{e:#}")).unwrap_or_default();
        bail!("the broker at {brokers} has no group coordinator after {COORDINATOR_TIMEOUT:?}: {why}");
    }
    let partitions = args.partitions.to_string();
    run(Command::new(target.join("billing-bin"))
        .args(["topics", "create", "--partitions", &partitions])
        .env("KAFKA_BROKERS", brokers))?;

    let provider_port = port_if_free(DEFAULT_PROVIDER_PORT).unwrap_or(0);
    let log = fs::File::create(provider_log())?;
    let mut provider = Command::new(target.join("fake-provider"));
    provider
        .arg("--listen")
        .arg(format!("127.0.0.1:{provider_port}"))
        .args(["--transient-pct", &args.transient_pct.to_string()])
        .args(["--permanent-pct", &args.permanent_pct.to_string()])
        .args(["--latency", &args.latency])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a Ctrl-C aimed at the terminal does not
        // reach it, and `down` stops exactly it.
        .process_group(0);
    let mut child = provider.spawn().with_context(|| format!("cannot start {}", process::show(&provider)))?;
    let provider_url = wait_for_provider(&mut child)?;

    write_token()?;
    let listen = |port| -> anyhow::Result<String> {
        let port = match port_if_free(port) {
            Some(port) => port,
            None => crate::probe::free_port()?,
        };
        Ok(format!("127.0.0.1:{port}"))
    };
    let stack = Stack {
        started_broker,
        brokers: brokers.to_owned(),
        provider_pid: child.id(),
        provider_url,
        admin_listen: listen(DEFAULT_ADMIN_PORT)?,
        operator_listen: listen(DEFAULT_OPERATOR_PORT)?,
    };
    stack.save()?;
    let mut text = String::new();
    for (name, value) in stack.env() {
        writeln!(text, "{name}={value}")?;
    }
    fs::write(env_file(), text)?;
    Ok(stack)
}

/// The URL the fake provider prints once it listens.
fn wait_for_provider(child: &mut std::process::Child) -> anyhow::Result<String> {
    let mut url = None;
    let listening = process::wait_until(PROVIDER_START_TIMEOUT, || {
        let text = fs::read_to_string(provider_log()).unwrap_or_default();
        url = text.lines().find_map(|l| l.strip_prefix("listening on ")).map(str::to_owned);
        url.is_some() || matches!(child.try_wait(), Ok(Some(_)))
    });
    match url {
        Some(url) if listening => Ok(url),
        _ => {
            let _ = child.kill();
            bail!(
                "the fake provider did not start within {PROVIDER_START_TIMEOUT:?}:\n{}",
                process::tail(&provider_log(), 20)
            )
        }
    }
}

/// A fresh random operators' token, readable by its owner only.
fn write_token() -> anyhow::Result<()> {
    let mut bytes = [0u8; 24];
    fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let path = token_file();
    fs::write(&path, format!("{token}\n"))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// `port` when nothing listens on it on loopback.
fn port_if_free(port: u16) -> Option<u16> {
    TcpListener::bind(("127.0.0.1", port)).ok().map(|_| port)
}

pub(crate) fn down() -> anyhow::Result<()> {
    let Some(stack) = Stack::load()? else {
        println!("no local stack is up (nothing recorded in {})", stack_file().display());
        return Ok(());
    };
    // Only a fake provider: the pid may have been reused since.
    let ours = process::cmdline(stack.provider_pid).is_some_and(|c| c.contains("fake-provider"));
    if ours && process::is_alive(stack.provider_pid) {
        process::stop_group(stack.provider_pid, Duration::from_secs(5));
        println!("fake provider at {} stopped", stack.provider_url);
    }
    if stack.started_broker {
        if let Some(broker) = Broker::load()? {
            broker.stop()?;
            println!("broker at {} stopped", broker.addr);
        }
    } else {
        println!("the broker at {} was running before `up`: left running", stack.brokers);
    }
    for file in [stack_file(), env_file(), token_file(), provider_log()] {
        let _ = fs::remove_file(file);
    }
    Ok(())
}

pub(crate) fn orders(args: &OrdersArgs) -> anyhow::Result<()> {
    let Some(stack) = Stack::load()? else {
        bail!("no local stack is up: start one with `cargo xtask up`");
    };
    let target = crate::paths::target_dir().join("debug");
    run(Command::new(target.join("sample-orders"))
        .args(["--count", &args.count.to_string()])
        .env("KAFKA_BROKERS", &stack.brokers))?;
    println!("what was charged: curl -s {}/ledger", stack.provider_url);
    Ok(())
}

/// The quick start as a new user would take it, for `cargo xtask ci`: `up`,
/// `billing-bin check` and `run` with the printed settings, `orders`, every
/// order charged once at the provider, then `down`, which leaves nothing.
pub(crate) fn rehearse() -> anyhow::Result<()> {
    if Stack::load()?.is_some() {
        bail!("a local stack is up: the quick start's rehearsal needs its own (stop it with `cargo xtask down`)");
    }
    // The broker a new user's `up` would start here.
    let broker = BrokerArgs::default();
    let args = UpArgs { broker, partitions: 3, transient_pct: 0, permanent_pct: 0, latency: "0s".into() };
    up(&args)?;
    let rehearsed = rehearse_on_the_stack();
    let stopped = down();
    rehearsed?;
    stopped?;
    if Stack::load()?.is_some() || env_file().exists() || token_file().exists() {
        bail!("`cargo xtask down` left the stack's files behind");
    }
    println!("quick start rehearsed: up, check, run, orders charged once each, down");
    Ok(())
}

fn rehearse_on_the_stack() -> anyhow::Result<()> {
    let stack = Stack::load()?.context("`up` recorded no stack")?;
    let target = crate::paths::target_dir().join("debug");
    let billing_bin = target.join("billing-bin");
    let check = Command::new(&billing_bin).arg("check").envs(stack.env()).output()?;
    if !check.status.success() {
        bail!("`billing-bin check` failed against the local stack:\n{}", String::from_utf8_lossy(&check.stdout));
    }
    let log = state_dir().join("rehearsal-billing-bin.log");
    let mut service = Command::new(&billing_bin)
        .arg("run")
        .envs(stack.env())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log)?)
        .spawn()
        .context("cannot start billing-bin")?;
    let charged = (|| {
        let produced = Command::new(target.join("sample-orders"))
            .args(["--count", "5"])
            .env("KAFKA_BROKERS", &stack.brokers)
            .output()?;
        if !produced.status.success() {
            bail!("sample-orders failed: {}", String::from_utf8_lossy(&produced.stderr));
        }
        let stdout = String::from_utf8_lossy(&produced.stdout);
        let orders: Vec<&str> =
            stdout.lines().filter_map(|l| l.strip_prefix("order ").and_then(|r| r.split(':').next())).collect();
        if orders.len() != 5 {
            bail!("sample-orders listed {} orders, not 5:\n{stdout}", orders.len());
        }
        let mut ledger = String::new();
        let all_charged = process::wait_until(Duration::from_secs(90), || {
            ledger = http_get(&stack.provider_url, "/ledger").unwrap_or_default();
            orders.iter().all(|o| ledger.contains(o))
        });
        if !all_charged {
            bail!("not every order was charged within 90 s; the ledger: {ledger}");
        }
        for order in &orders {
            if ledger.matches(order).count() != 2 {
                // Each charge names its order twice: as order and as idempotency key.
                bail!("order {order} was not charged exactly once; the ledger: {ledger}");
            }
        }
        Ok(())
    })();
    let _ = Command::new("kill").args(["-TERM", &service.id().to_string()]).status();
    let exited = service.wait()?;
    charged.with_context(|| format!("billing-bin's log:\n{}", process::tail(&log, 30)))?;
    if !exited.success() {
        bail!("billing-bin did not stop cleanly ({exited}):\n{}", process::tail(&log, 30));
    }
    Ok(())
}

/// The body of `GET <base><path>` (plain HTTP on loopback).
fn http_get(base: &str, path: &str) -> anyhow::Result<String> {
    use std::io::Write as _;
    let addr = base.strip_prefix("http://").context("not an http URL")?;
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default())
}
