//! `cargo xtask integration`: the integration suite against brokers, each
//! test where what it needs is (`tests/it/needs.rs`), pass after pass.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context};

use crate::{
    broker::{Broker, Implementation, Kind},
    env::{BROKERS_ENV, BROKER_KIND_ENV, BROKER_SETTINGS, KAFKA_CLUSTER_ENV, MOCK_CONTROL_ENV},
    paths::{cargo, workspace_root},
    tls::ClientAuth,
};

/// Which brokers `cargo xtask integration` runs the suite against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BrokerChoice {
    /// Apache Kafka, the reference: what `cargo xtask ci --full` runs on it
    /// (a cluster of three brokers through SASL_SSL for the whole suite and
    /// the fault tests, the consumer group protocol's pass in plaintext,
    /// then one requiring client certificates for the TLS tests).
    Kafka,
    /// Apache Kafka, three brokers, plaintext: the whole suite.
    KafkaPlaintext,
    /// Apache Kafka, three brokers, SASL_SSL: the whole suite.
    KafkaSaslTls,
    /// Apache Kafka, three brokers, mutual TLS: the whole suite.
    KafkaMtls,
    /// Apache Kafka, three brokers, plaintext, every listener on the
    /// consumer group protocol (KIP-848): the whole suite but the tests
    /// that start no listener or choose their protocol themselves.
    KafkaConsumerProtocol,
    /// tansu, one broker.
    Tansu,
    /// librdkafka's mock cluster with three brokers.
    Mock,
    /// tansu requiring SASL SCRAM-SHA-512 (SASL_PLAINTEXT).
    TansuSasl,
    /// tansu requiring SASL SCRAM-SHA-512 behind TLS (SASL_SSL).
    TansuSaslTls,
    /// tansu behind TLS requiring client certificates (SSL, mutual TLS).
    TansuMtls,
    /// What `cargo xtask ci` (the gate) runs, one pass after the other.
    Gate,
    /// What `cargo xtask ci --full` runs, one pass after the other: every
    /// test on every broker that can run it.
    All,
}

/// What a run of CI covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// `cargo xtask ci`, the gate: Apache Kafka's classic pass in
    /// plaintext, the consumer group protocol's, and the tests about SASL
    /// and TLS through each; the mock cluster; tansu.
    Gate,
    /// `cargo xtask ci --full`: the gate's passes but the classic pass on
    /// Apache Kafka through SASL_SSL, so that the whole suite goes through
    /// it too.
    Full,
}

/// The lanes of an integration run: each runs its steps one after the
/// other, beside the other lanes (their brokers are separate processes;
/// Apache Kafka's three-broker passes keep the cores busy, the mock's tests
/// mostly wait on timeouts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Lane {
    /// Apache Kafka's three-broker passes: the whole suite under each group
    /// protocol.
    Kafka,
    /// The mock cluster's pass, the quick start, then the tests about
    /// Apache Kafka's SASL and TLS.
    Mock,
    /// tansu's passes.
    Tansu,
}

/// What a lane runs, one after the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LaneStep {
    /// A pass of the suite.
    Pass(Pass),
    /// The README's quick start, rehearsed.
    QuickStart,
}

impl Lane {
    pub(crate) const ALL: [Lane; 3] = [Lane::Kafka, Lane::Mock, Lane::Tansu];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Lane::Kafka => "kafka",
            Lane::Mock => "mock",
            Lane::Tansu => "tansu",
        }
    }

    /// What this lane runs in `plan`, in order.
    pub(crate) fn steps(self, plan: Plan) -> Vec<LaneStep> {
        let kafka = Kind::plain(Implementation::Kafka);
        let sasl_tls = kafka.secured(true, Some(ClientAuth::None));
        let mtls = kafka.secured(false, Some(ClientAuth::Required));
        let pass = LaneStep::Pass;
        match (self, plan) {
            (Lane::Kafka, Plan::Gate) => vec![pass(Pass::whole(kafka)), pass(Pass::consumer(kafka))],
            (Lane::Kafka, Plan::Full) => vec![pass(Pass::whole(sasl_tls)), pass(Pass::consumer(kafka))],
            (Lane::Mock, Plan::Gate) => vec![
                pass(Pass::whole(Kind::MOCK)),
                LaneStep::QuickStart,
                pass(Pass::security(sasl_tls)),
                pass(Pass::security(mtls)),
            ],
            (Lane::Mock, Plan::Full) => {
                vec![pass(Pass::whole(Kind::MOCK)), LaneStep::QuickStart, pass(Pass::security(mtls))]
            }
            (Lane::Tansu, _) => {
                vec![pass(Pass::whole(Kind::TANSU)), pass(Pass::security(Kind::TANSU.secured(true, None)))]
            }
        }
    }

    /// The passes of this lane in `plan`, in order.
    pub(crate) fn passes(self, plan: Plan) -> Vec<Pass> {
        self.steps(plan)
            .into_iter()
            .filter_map(|step| match step {
                LaneStep::Pass(pass) => Some(pass),
                LaneStep::QuickStart => None,
            })
            .collect()
    }
}

/// One run of the suite against one broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pass {
    kind: Kind,
    /// Which tests: all of them, or those a secured pass adds.
    scope: Scope,
    /// The group protocol the suite's listeners speak.
    protocol: GroupProtocol,
}

/// The group protocol of a pass's listeners (`$KAFKA_RETRY_GROUP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupProtocol {
    Classic,
    /// KIP-848's, on Apache Kafka only.
    Consumer,
}

impl GroupProtocol {
    fn name(self) -> &'static str {
        match self {
            GroupProtocol::Classic => "classic",
            GroupProtocol::Consumer => "consumer",
        }
    }
}

/// Tells the tests which group protocol to speak.
const GROUP_PROTOCOL_ENV: &str = "KAFKA_RETRY_GROUP_PROTOCOL";

impl Pass {
    pub(crate) fn name(self) -> String {
        match self.protocol {
            GroupProtocol::Classic => self.kind.name(),
            GroupProtocol::Consumer => format!("{} (consumer group protocol)", self.kind.name()),
        }
    }
}

/// Which tests a pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Every test the broker can run.
    Whole,
    /// Only the tests about the broker's security (those that need SASL,
    /// TLS, client certificates or the TLS terminator) and the service end to end through
    /// it: the rest ran through another pass already.
    Security,
}

impl Pass {
    /// How many brokers a fresh Apache Kafka cluster for this pass has:
    /// [`KAFKA_BROKERS`] for the whole suite (replication, leaders killed),
    /// one for the tests about security (a handshake needs no replica).
    fn kafka_brokers(self) -> u8 {
        match self.scope {
            Scope::Whole => KAFKA_BROKERS,
            Scope::Security => 1,
        }
    }

    /// Every test `kind` can run, on the classic group protocol.
    fn whole(kind: Kind) -> Pass {
        Pass { kind, scope: Scope::Whole, protocol: GroupProtocol::Classic }
    }

    /// The tests about `kind`'s security, and the service end to end.
    fn security(kind: Kind) -> Pass {
        Pass { kind, scope: Scope::Security, protocol: GroupProtocol::Classic }
    }

    /// Every test `kind` can run whose listeners speak the pass's group
    /// protocol, on the consumer group protocol.
    fn consumer(kind: Kind) -> Pass {
        Pass { kind, scope: Scope::Whole, protocol: GroupProtocol::Consumer }
    }
}

impl BrokerChoice {
    fn passes(self) -> Vec<Pass> {
        let kafka = Kind::plain(Implementation::Kafka);
        let tansu = Kind::TANSU;
        let every = |plan| Lane::ALL.into_iter().flat_map(|lane| lane.passes(plan)).collect();
        match self {
            BrokerChoice::Kafka => Lane::Kafka.passes(Plan::Full),
            BrokerChoice::KafkaConsumerProtocol => vec![Pass::consumer(kafka)],
            BrokerChoice::KafkaPlaintext => vec![Pass::whole(kafka)],
            BrokerChoice::KafkaSaslTls => vec![Pass::whole(kafka.secured(true, Some(ClientAuth::None)))],
            BrokerChoice::KafkaMtls => vec![Pass::whole(kafka.secured(false, Some(ClientAuth::Required)))],
            BrokerChoice::Tansu => vec![Pass::whole(tansu)],
            BrokerChoice::Mock => vec![Pass::whole(Kind::MOCK)],
            BrokerChoice::TansuSasl => vec![Pass::whole(tansu.secured(true, None))],
            BrokerChoice::TansuSaslTls => vec![Pass::whole(tansu.secured(true, Some(ClientAuth::None)))],
            BrokerChoice::TansuMtls => vec![Pass::whole(tansu.secured(false, Some(ClientAuth::Required)))],
            BrokerChoice::Gate => every(Plan::Gate),
            BrokerChoice::All => every(Plan::Full),
        }
    }
}

/// How many brokers the mock cluster of the integration suite has.
const MOCK_BROKERS: u8 = 3;

/// How many brokers the Apache Kafka cluster of the integration suite has.
pub(crate) const KAFKA_BROKERS: u8 = 3;

/// Where each test runs is declared beside the tests (`tests/it/needs.rs`),
/// by what it needs; this is that file.
#[path = "../../tests/it/needs.rs"]
mod needs;

use needs::{Need, NEEDS};

/// The modules of the fault tests, which run after the rest, one at a time.
const FAULTS: &str = "faults::";

/// The end-to-end tests of the service, which a security pass runs too.
const BILLING: &str = "billing::";

/// Why `pass` cannot give what `need` asks, or `None` when it can.
fn lacks(pass: Pass, need: Need) -> Option<&'static str> {
    let kind = pass.kind;
    let implementation = kind.implementation;
    let tansu = matches!(implementation, Implementation::Tansu | Implementation::Docker);
    let mock = implementation == Implementation::Mock;
    let kafka = implementation == Implementation::Kafka;
    let lacking = |lacks: bool, why: &'static str| lacks.then_some(why);
    match need {
        Need::ApacheKafka => lacking(!kafka, "it needs Apache Kafka (it runs on it)"),
        Need::OwnProtocol => lacking(
            pass.protocol == GroupProtocol::Consumer,
            "it chooses its group protocol itself, and ran in the classic pass",
        ),
        Need::NoListener => lacking(
            pass.protocol == GroupProtocol::Consumer,
            "it starts no listener, so the group protocol changes nothing for it, and it ran in the classic pass",
        ),
        Need::ClassicProtocol => lacking(
            pass.protocol == GroupProtocol::Consumer,
            "it is about the classic protocol's JoinGroup rounds, which the consumer group protocol has none of",
        ),
        Need::NoConsumerProtocol => lacking(
            !tansu,
            "Apache Kafka 4 speaks the consumer group protocol, and the mock cluster advertises it (it runs on tansu)",
        ),
        Need::ConsumerProtocol => lacking(
            !kafka,
            "tansu 0.6.0 lacks the consumer group protocol (KIP-848), and the mock cluster aborts on a heartbeat that \
             subscribes by name without a regex, as Kafka's own clients do: it runs on Apache Kafka",
        ),
        Need::MockFaults => lacking(!mock, "it needs the mock cluster's fault injection (it runs on the mock)"),
        Need::Sasl => lacking(!kind.sasl(), "the broker does not require SASL"),
        Need::Tls => lacking(kind.tls().is_none(), "the broker is not behind TLS"),
        Need::TlsProxy => lacking(
            kind.tls().is_none() || implementation != Implementation::Tansu,
            "the broker has no TLS terminator in front (run it with --broker tansu-sasl-tls or tansu-mtls)",
        ),
        Need::ClientCert => {
            lacking(kind.tls() != Some(ClientAuth::Required), "the broker does not require client certificates")
        }
        Need::CreateTopics => lacking(mock, "the mock cluster has no CreateTopics (it creates topics through its own call)"),
        Need::DeleteRecords => {
            lacking(mock || tansu, "neither the mock cluster nor tansu 0.6.0 answers DeleteRecords (it runs on Apache Kafka)")
        }
        Need::OffsetsByTime => lacking(
            mock,
            "the mock cluster's ListOffsets answers -1 for any time, where Kafka finds the first record at or after it \
             (the listener then starts at the earliest offset)",
        ),
        Need::CommitsDuringRebalances => lacking(
            mock,
            "the mock cluster refuses commits while a rebalance is prepared, which Kafka accepts from the ending generation",
        ),
        Need::Transactions => lacking(tansu, "tansu 0.6.0 has no EndTxn: a transactional producer cannot commit there"),
        Need::MessageLimits => {
            lacking(tansu, "tansu 0.6.0 takes records of any size, whatever a topic's max.message.bytes")
        }
        Need::BatchesKept => lacking(
            tansu,
            "tansu 0.6.0 (sqlite) stores records, not the batches producers wrote: it decompresses them, and serves \
             none larger than a fetch's size limit",
        ),
        Need::CommitMetadata => lacking(
            tansu,
            "tansu 0.6.0 answers every committed offset's metadata empty (there, records handled out of order are \
             refused with a reason: a test of its own checks it)",
        ),
        Need::LeaderReelection => lacking(
            tansu,
            "tansu 0.6.0 keeps naming a group's departed leader once the group emptied during a rebalance, so no \
             member can complete a join there again",
        ),
        Need::CommitMetadataDropped => lacking(!tansu, "this broker keeps offset-commit metadata (it runs on tansu)"),
        Need::LongRun => lacking(
            pass.scope == Scope::Security || (tansu && kind.security_protocol() != "PLAINTEXT"),
            "crash recovery has nothing to do with security, and runs through another pass",
        ),
        Need::Authorizer => lacking(
            !kafka || !kind.sasl(),
            "only Apache Kafka through SASL runs an authorizer here, with a user no ACL names",
        ),
        Need::OwnBroker => lacking(
            implementation != Implementation::Tansu || kind.security_protocol() != "PLAINTEXT",
            "it brings a plaintext broker of its own, the same on every pass: it runs on tansu's plaintext pass",
        ),
        Need::OncePerRun => lacking(
            pass.scope == Scope::Security || !kafka,
            "a provider outage is the same on every broker: it runs once, on Apache Kafka's whole pass",
        ),
    }
}

/// The tests of `table` that `pass` leaves out, each with why.
fn left_out(pass: Pass, table: &[(&'static str, &[Need])]) -> Vec<(&'static str, &'static str)> {
    table
        .iter()
        .filter_map(|(test, needs)| needs.iter().find_map(|need| lacks(pass, *need)).map(|why| (*test, why)))
        .collect()
}

/// The tests `table` names that are not among `listed`: renamed or removed
/// without their line in `tests/it/needs.rs`.
fn undeclared<'a>(listed: &[String], table: &[(&'a str, &[Need])]) -> Vec<&'a str> {
    table.iter().map(|(test, _)| *test).filter(|test| !listed.iter().any(|l| l == test)).collect()
}

/// Runs the integration tests against `choice`: `$KAFKA_RETRY_BROKERS` if
/// set (with `$KAFKA_RETRY_MOCK_CONTROL` for a mock cluster), else a broker
/// of that kind that `broker up` left running, else a fresh one that is
/// stopped afterwards, whatever the tests' outcome.
pub(crate) fn integration(choice: BrokerChoice, test_args: &[String]) -> anyhow::Result<()> {
    let built = build_for_integration()?;
    let mut took = Vec::new();
    for pass in choice.passes() {
        let started = std::time::Instant::now();
        run_pass(pass, &built, test_args)?;
        took.push(format!("{}: {:.0} s", pass.name(), started.elapsed().as_secs_f64()));
    }
    eprintln!("integration: passed ({})", took.join(", "));
    Ok(())
}

/// Runs the tests `pass` runs against a broker of its kind (see
/// [`integration`] for which broker).
pub(crate) fn run_pass(pass: Pass, built: &Built, test_args: &[String]) -> anyhow::Result<()> {
    let name = pass.name();
    eprintln!("integration: the suite against {name}");
    with_broker_of(pass.kind, pass.kafka_brokers(), |target| run_integration_tests(target, built, pass, test_args))
        .with_context(|| format!("the integration suite against {name}"))
}

/// Installs what the passes' tests use besides a broker (the interop
/// tests' Python, the console test's browser driver, Apache Kafka's jars
/// and its Spring peer), once, before lanes that would each install them at
/// the same time.
pub(crate) fn install_tools() -> anyhow::Result<()> {
    crate::python::interop_python()?;
    crate::browser::console_tools()?;
    crate::kafka::install()?;
    crate::spring::peer_jar()?;
    Ok(())
}

/// A broker to run against.
pub(crate) struct Target<'a> {
    /// Which implementation it is.
    pub(crate) kind: Kind,
    /// Its bootstrap list.
    pub(crate) addr: &'a str,
    /// The mock cluster's control channel.
    pub(crate) control: Option<&'a str>,
    /// Settings besides the address (security, the Kafka cluster's
    /// directory) as environment.
    pub(crate) security: Vec<(&'static str, String)>,
}

/// Runs `work` with a broker's address: `$KAFKA_RETRY_BROKERS`, else the
/// broker `broker up` left running, else a fresh one of the implementation
/// `choose` gives (Apache Kafka: a single node) that is stopped afterwards,
/// whatever `work`'s outcome.
pub(crate) fn with_broker(
    choose: impl FnOnce() -> Implementation,
    work: impl FnOnce(&str) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let implementation = if std::env::var_os(BROKERS_ENV).is_some() { Implementation::Tansu } else { choose() };
    with_broker_of(Kind::plain(implementation), 1, |target| work(target.addr))
}

/// Like [`with_broker`], for a broker of `kind` (Apache Kafka: a cluster
/// of `kafka_brokers`); a running broker of another kind is left alone and
/// a fresh one of `kind` started beside it.
fn with_broker_of(
    kind: Kind,
    kafka_brokers: u8,
    work: impl FnOnce(&Target<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if let Ok(addr) = std::env::var(BROKERS_ENV) {
        let control = std::env::var(MOCK_CONTROL_ENV).ok();
        eprintln!("using the broker at {addr} from {BROKERS_ENV}");
        let kind = if control.is_some() {
            Kind::MOCK
        } else if std::env::var_os(KAFKA_CLUSTER_ENV).is_some() {
            Kind::plain(Implementation::Kafka).secured(kind.sasl(), kind.tls())
        } else {
            kind
        };
        let security = BROKER_SETTINGS
            .into_iter()
            .filter(|name| *name != MOCK_CONTROL_ENV)
            .filter_map(|name| std::env::var(name).ok().map(|v| (name, v)))
            .collect();
        return work(&Target { kind, addr: &addr, control: control.as_deref(), security });
    }
    if let Some(broker) = Broker::load()? {
        let usable =
            broker.kind == kind || (kind == Kind::TANSU && broker.kind.implementation == Implementation::Docker);
        if usable && broker.answers() {
            eprintln!("using the running broker at {} ({}; left running)", broker.addr, broker.describe());
            return work(&Target {
                kind: broker.kind,
                addr: &broker.addr,
                control: broker.control.as_deref(),
                security: broker.security_env(),
            });
        }
        if usable {
            broker.stop()?;
        }
    }
    let broker = match kind.implementation {
        Implementation::Mock => Broker::start_mock(MOCK_BROKERS)?,
        Implementation::Docker => Broker::start_tansu(None)?,
        Implementation::Kafka => Broker::start_kafka(kind, kafka_brokers, 1, crate::kafka::JvmProfile::Tests)?,
        Implementation::Tansu => Broker::start_tansu_kind(kind, None)?,
    };
    eprintln!("started {} at {}", broker.describe(), broker.addr);
    crate::interrupt::started(&broker);
    let result = work(&Target {
        kind: broker.kind,
        addr: &broker.addr,
        control: broker.control.as_deref(),
        security: broker.security_env(),
    });
    let stopped = broker.stop();
    crate::interrupt::stopped(&broker);
    result?;
    stopped.context("the work succeeded, but the broker did not stop")
}

/// The environment variable that tells the integration tests where the
/// service binary they run end to end is.
pub(crate) const BILLING_BIN_ENV: &str = "BILLING_BIN";

/// The same for the second service, `stock`'s example.
const STOCK_SERVICE_BIN_ENV: &str = "STOCK_SERVICE_BIN";

/// The environment variable that tells the integration tests where Apache
/// Kafka's jars are (for its Java client), on Kafka's passes.
const KAFKA_LIBS_ENV: &str = "KAFKA_RETRY_KAFKA_LIBS";

/// The environment variable that tells the integration tests where
/// tansu's binary is, on tansu's passes (a test starts a broker of its own).
const TANSU_ENV: &str = "KAFKA_RETRY_TANSU";

/// What the integration passes run, built once.
pub(crate) struct Built {
    /// The integration tests' binary.
    tests: PathBuf,
    billing_bin: PathBuf,
    stock_service: PathBuf,
}

/// Builds the integration tests, the service and the stock example in one
/// cargo invocation: one feature resolution for all three, so no pass
/// builds again what another pass built with other features.
pub(crate) fn build_for_integration() -> anyhow::Result<Built> {
    let mut cmd = Command::new(cargo());
    cmd.current_dir(workspace_root())
        .args(["build", "--package", "integration", "--package", "billing-bin", "--package", "stock"])
        .args([
            "--features",
            "integration/broker",
            "--test",
            "it",
            "--bin",
            "billing-bin",
            "--example",
            "stock-service",
        ])
        .args(["--message-format", "json-render-diagnostics"])
        .stdout(std::process::Stdio::piped());
    eprintln!("$ {}", crate::process::show(&cmd));
    let out = cmd.output().context("cannot run cargo build")?;
    if !out.status.success() {
        bail!("building the integration tests failed ({})", out.status);
    }
    let executable = |kind: &str, name: &str| -> anyhow::Result<PathBuf> {
        // One JSON message a line; the artifacts' carry their target and executable.
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(r#""reason":"compiler-artifact""#))
            .find(|l| l.contains(&format!(r#""kind":["{kind}"]"#)) && l.contains(&format!(r#""name":"{name}""#)))
            .and_then(|l| {
                let start = l.find(r#""executable":""#)? + r#""executable":""#.len();
                let end = start + l[start..].find('"')?;
                Some(PathBuf::from(&l[start..end]))
            })
            .with_context(|| format!("cargo built no {kind} {name}"))
    };
    Ok(Built {
        tests: executable("test", "it")?,
        billing_bin: executable("bin", "billing-bin")?,
        stock_service: executable("example", "stock-service")?,
    })
}

fn run_integration_tests(target: &Target<'_>, built: &Built, pass: Pass, test_args: &[String]) -> anyhow::Result<()> {
    let scope = pass.scope;
    // The arguments already go after cargo's `--`; another one would turn
    // the skips added below into filters.
    let test_args: Vec<String> = test_args.iter().filter(|a| *a != "--").cloned().collect();
    let test_args = test_args.as_slice();
    let python = crate::python::interop_python()?;
    let (chromium, node_modules) = crate::browser::console_tools()?;
    let mut envs: Vec<(String, String)> = vec![
        (crate::browser::CHROMIUM_ENV.to_owned(), chromium.display().to_string()),
        (crate::browser::NODE_MODULES_ENV.to_owned(), node_modules.display().to_string()),
        (BROKERS_ENV.to_owned(), target.addr.to_owned()),
        (BROKER_KIND_ENV.to_owned(), target.kind.name()),
        (BILLING_BIN_ENV.to_owned(), built.billing_bin.display().to_string()),
        (STOCK_SERVICE_BIN_ENV.to_owned(), built.stock_service.display().to_string()),
        (crate::python::PYTHON_ENV.to_owned(), python.display().to_string()),
        (GROUP_PROTOCOL_ENV.to_owned(), pass.protocol.name().to_owned()),
    ];
    if target.kind.implementation == Implementation::Kafka {
        envs.push((KAFKA_LIBS_ENV.to_owned(), crate::kafka::install()?.display().to_string()));
        envs.push((crate::spring::SPRING_PEER_ENV.to_owned(), crate::spring::peer_jar()?.display().to_string()));
    }
    if target.kind.implementation == Implementation::Tansu {
        envs.push((
            TANSU_ENV.to_owned(),
            crate::broker::install_tansu(crate::paths::Priority::Normal)?.display().to_string(),
        ));
    }
    envs.extend(target.security.iter().map(|(k, v)| (k.to_string(), v.clone())));
    if let Some(control) = target.control {
        envs.push((MOCK_CONTROL_ENV.to_owned(), control.to_owned()));
    }

    // Tests that need what the pass lacks are left out, and the run says why.
    let pass = Pass { kind: target.kind, ..pass };
    let listed = list_tests(&built.tests)?;
    let missing = undeclared(&listed, NEEDS);
    if !missing.is_empty() {
        bail!(
            "tests/it/needs.rs names tests that do not exist (renamed? give their lines the new names): {}",
            missing.join(", ")
        );
    }
    let skips = left_out(pass, NEEDS);
    if scope == Scope::Whole {
        for (test, why) in &skips {
            eprintln!("integration: on {}, {test} is left out: {why}", pass.name());
        }
    }
    if scope == Scope::Security {
        eprintln!(
            "integration: through {} ({}), only the tests about its security and the service end to end",
            target.kind.security_protocol(),
            target.kind.name()
        );
    }
    let filters: Vec<&String> = test_args.iter().filter(|a| !a.starts_with('-')).collect();
    let options: Vec<&String> = test_args.iter().filter(|a| a.starts_with('-')).collect();
    let chosen = choose(&listed, scope, &skips, NEEDS, &filters);

    let cargo_test = |names: &[&str], extra: &[&str]| {
        let mut cmd = Command::new(&built.tests);
        // Where `cargo test` runs it: the package's directory.
        cmd.current_dir(workspace_root().join("tests")).arg("--exact").args(names).args(&options).args(extra);
        for name in BROKER_SETTINGS {
            cmd.env_remove(name);
        }
        cmd.envs(envs.iter().map(|(k, v)| (k, v)));
        cmd
    };
    if !chosen.main.is_empty() {
        eprintln!("integration: {} tests", chosen.main.len());
        // As many at once as there are cores (the test harness' default):
        // more made the timing-sensitive tests (the brake's windows, late
        // answers) flaky on two cores, for a fifth less time.
        run_quietly(&mut cargo_test(&chosen.main, &[]))?;
    }
    // Faults (injected by the mock, nodes of Kafka killed, connections cut
    // by the TLS terminator) reach every client of the broker: the fault
    // tests run after the rest, one at a time, so no other test sees them.
    if !chosen.faults.is_empty() {
        eprintln!("integration: {} fault tests, one at a time", chosen.faults.len());
        // Their output too: what each fault cost (redeliveries, retries).
        let nocapture: &[&str] = if options.iter().any(|o| *o == "--nocapture") { &[] } else { &["--nocapture"] };
        run_quietly(&mut cargo_test(&chosen.faults, &[&["--test-threads=1"], nocapture].concat()))?;
    }
    if chosen.main.is_empty() && chosen.faults.is_empty() {
        bail!("no test matches {filters:?} on {}", target.kind.name());
    }
    Ok(())
}

/// Runs the tests' binary `cmd` like [`crate::process::run`], showing its program only:
/// the list of test names it carries is long.
fn run_quietly(cmd: &mut Command) -> anyhow::Result<()> {
    let extra: Vec<String> =
        cmd.get_args().map(|a| a.to_string_lossy().into_owned()).filter(|a| a.starts_with("--")).collect();
    eprintln!("$ {} {} <test names>", cmd.get_program().to_string_lossy(), extra.join(" "));
    let status = cmd.status().context("cannot start the integration tests")?;
    if !status.success() {
        bail!("the integration tests failed ({status})");
    }
    Ok(())
}

/// The names of every test of the integration binary.
fn list_tests(tests: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new(tests)
        .current_dir(workspace_root().join("tests"))
        .arg("--list")
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot list the integration tests")?;
    if !out.status.success() {
        bail!("listing the integration tests failed ({})", out.status);
    }
    Ok(String::from_utf8(out.stdout)?.lines().filter_map(|l| l.strip_suffix(": test")).map(str::to_owned).collect())
}

/// The tests a pass runs: those outside the fault modules together, then
/// the fault tests one at a time.
#[derive(Debug, PartialEq, Eq)]
struct Chosen<'a> {
    main: Vec<&'a str>,
    faults: Vec<&'a str>,
}

/// Which of `listed` a pass of `scope` runs: none that `skips` names, only
/// those about security (what `table` says needs SASL, TLS, client
/// certificates or the TLS terminator) and the service end to end in a
/// security pass, and when the caller gave `filters`, only those that match
/// one of them.
fn choose<'a>(
    listed: &'a [String],
    scope: Scope,
    skips: &[(&str, &str)],
    table: &[(&str, &[Need])],
    filters: &[&String],
) -> Chosen<'a> {
    let needs = |name: &str| table.iter().find(|(test, _)| *test == name).map_or(&[][..], |(_, needs)| *needs);
    let wanted = |name: &str| {
        let skipped = skips.iter().any(|(test, _)| *test == name);
        let in_scope = match scope {
            Scope::Whole => true,
            Scope::Security => {
                needs(name).iter().any(|n| matches!(n, Need::Sasl | Need::Tls | Need::TlsProxy | Need::ClientCert))
                    || (name.starts_with(BILLING) && !name.contains(FAULTS))
            }
        };
        let filtered = filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
        !skipped && in_scope && filtered
    };
    let (faults, main) = listed.iter().map(String::as_str).filter(|n| wanted(n)).partition(|n| n.contains(FAULTS));
    Chosen { main, faults }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(listed: &[&str]) -> Vec<String> {
        listed.iter().map(|n| (*n).to_owned()).collect()
    }

    const LISTED: &[&str] = &[
        "ladder::transient_failures_climb_the_ladder_and_then_succeed",
        "group::a_static_member_restarts_without_a_rebalance",
        "faults::a_broker_down_for_ten_seconds_loses_nothing",
        "billing::transient_provider_failures_recover_and_charge_exactly_once",
        "billing::the_password_never_reaches_logs_or_metrics",
        "billing::a_kill_mid_stream_charges_every_event_exactly_once",
        "billing::an_outage_of_the_provider_fills_no_dead_letter_topic_with_the_brake",
        "billing::faults::a_killed_coordinator",
        "billing::faults::every_order_is_charged_once_through_connections_cut_by_the_broker",
        "tls::a_client_without_a_certificate_is_refused",
        "dead_letters::a_record_above_the_position_is_refused_with_the_reason",
        "dead_letters::targeted_replays_are_recorded_and_never_repeated",
        "topics::creation_is_explicit_and_idempotent",
    ];

    /// Where the tests of [`LISTED`] run: what each needs (names do not say).
    const TABLE: &[(&str, &[Need])] = &[
        ("group::a_static_member_restarts_without_a_rebalance", &[Need::ApacheKafka]),
        ("faults::a_broker_down_for_ten_seconds_loses_nothing", &[Need::MockFaults]),
        ("billing::the_password_never_reaches_logs_or_metrics", &[Need::Sasl]),
        ("billing::a_kill_mid_stream_charges_every_event_exactly_once", &[Need::LongRun]),
        ("billing::an_outage_of_the_provider_fills_no_dead_letter_topic_with_the_brake", &[Need::OncePerRun]),
        ("billing::faults::a_killed_coordinator", &[Need::ApacheKafka]),
        ("billing::faults::every_order_is_charged_once_through_connections_cut_by_the_broker", &[Need::TlsProxy]),
        ("tls::a_client_without_a_certificate_is_refused", &[Need::ClientCert]),
        ("dead_letters::a_record_above_the_position_is_refused_with_the_reason", &[Need::CommitMetadataDropped]),
        ("dead_letters::targeted_replays_are_recorded_and_never_repeated", &[Need::CommitMetadata]),
        ("topics::creation_is_explicit_and_idempotent", &[Need::NoListener]),
    ];

    #[track_caller]
    fn check(pass: Pass, filters: &[&str], main: &[&str], faults: &[&str]) {
        let listed = names(LISTED);
        let filters: Vec<String> = names(filters);
        let filters: Vec<&String> = filters.iter().collect();
        let chosen = choose(&listed, pass.scope, &left_out(pass, TABLE), TABLE, &filters);
        let short = |v: &[&str]| v.iter().map(|n| n.rsplit("::").next().unwrap().to_owned()).collect::<Vec<_>>();
        assert_eq!((short(&chosen.main), short(&chosen.faults)), (short(main), short(faults)), "{pass:?}");
    }

    #[test]
    fn each_pass_runs_what_its_broker_can() {
        let kafka = Kind::plain(Implementation::Kafka);
        let (whole, security) = (Pass::whole, Pass::security);
        // The reference through SASL_SSL: all but what needs the mock, tansu's
        // terminator or client certificates, and what only tansu shows.
        check(
            whole(kafka.secured(true, Some(ClientAuth::None))),
            &[],
            &[
                "transient_failures_climb_the_ladder_and_then_succeed",
                "a_static_member_restarts_without_a_rebalance",
                "transient_provider_failures_recover_and_charge_exactly_once",
                "the_password_never_reaches_logs_or_metrics",
                "a_kill_mid_stream_charges_every_event_exactly_once",
                "an_outage_of_the_provider_fills_no_dead_letter_topic_with_the_brake",
                "targeted_replays_are_recorded_and_never_repeated",
                "creation_is_explicit_and_idempotent",
            ],
            &["a_killed_coordinator"],
        );
        // The consumer group protocol's pass: what starts a listener.
        check(
            Pass::consumer(kafka),
            &[],
            &[
                "transient_failures_climb_the_ladder_and_then_succeed",
                "a_static_member_restarts_without_a_rebalance",
                "transient_provider_failures_recover_and_charge_exactly_once",
                "a_kill_mid_stream_charges_every_event_exactly_once",
                "an_outage_of_the_provider_fills_no_dead_letter_topic_with_the_brake",
                "targeted_replays_are_recorded_and_never_repeated",
            ],
            &["a_killed_coordinator"],
        );
        // Kafka with client certificates: its security, and the service end to end.
        check(
            security(kafka.secured(false, Some(ClientAuth::Required))),
            &[],
            &[
                "transient_provider_failures_recover_and_charge_exactly_once",
                "a_client_without_a_certificate_is_refused",
            ],
            &[],
        );
        // tansu: no Kafka-only test, and what tansu drops.
        check(
            whole(Kind::TANSU),
            &[],
            &[
                "transient_failures_climb_the_ladder_and_then_succeed",
                "transient_provider_failures_recover_and_charge_exactly_once",
                "a_kill_mid_stream_charges_every_event_exactly_once",
                "a_record_above_the_position_is_refused_with_the_reason",
                "creation_is_explicit_and_idempotent",
            ],
            &[],
        );
        // The mock: its fault injection, what tansu lacks.
        check(
            whole(Kind::MOCK),
            &[],
            &[
                "transient_failures_climb_the_ladder_and_then_succeed",
                "transient_provider_failures_recover_and_charge_exactly_once",
                "a_kill_mid_stream_charges_every_event_exactly_once",
                "targeted_replays_are_recorded_and_never_repeated",
                "creation_is_explicit_and_idempotent",
            ],
            &["a_broker_down_for_ten_seconds_loses_nothing"],
        );
        // tansu through its terminator with client certificates.
        check(
            security(Kind::TANSU.secured(false, Some(ClientAuth::Required))),
            &[],
            &[
                "transient_provider_failures_recover_and_charge_exactly_once",
                "a_client_without_a_certificate_is_refused",
            ],
            &["every_order_is_charged_once_through_connections_cut_by_the_broker"],
        );
        // A caller's filter narrows a pass, never widens it.
        check(whole(Kind::TANSU), &["static_member"], &[], &[]);
        check(
            whole(kafka),
            &["static_member", "killed"],
            &["a_static_member_restarts_without_a_rebalance"],
            &["a_killed_coordinator"],
        );
    }

    #[test]
    fn the_gate_keeps_both_group_protocols_and_every_broker_and_the_full_run_every_test() {
        let steps = |lane: Lane, plan| {
            lane.steps(plan)
                .into_iter()
                .map(|step| match step {
                    LaneStep::Pass(p) => format!("{} {:?} on {}", p.name(), p.scope, p.kafka_brokers()),
                    LaneStep::QuickStart => "quick start".to_owned(),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(steps(Lane::Kafka, Plan::Gate), ["kafka Whole on 3", "kafka (consumer group protocol) Whole on 3"]);
        assert_eq!(
            steps(Lane::Mock, Plan::Gate),
            ["mock Whole on 3", "quick start", "kafka-sasl-tls Security on 1", "kafka-mtls Security on 1"]
        );
        assert_eq!(
            steps(Lane::Kafka, Plan::Full),
            ["kafka-sasl-tls Whole on 3", "kafka (consumer group protocol) Whole on 3"]
        );
        assert_eq!(steps(Lane::Mock, Plan::Full), ["mock Whole on 3", "quick start", "kafka-mtls Security on 1"]);
        for plan in [Plan::Gate, Plan::Full] {
            assert_eq!(steps(Lane::Tansu, plan), ["tansu Whole on 3", "tansu-sasl Security on 1"]);
        }
    }

    #[test]
    fn a_renamed_test_fails_the_run_instead_of_moving() {
        let mut listed = names(LISTED);
        assert!(undeclared(&listed, TABLE).is_empty());
        listed[1] = "group::a_static_member_comes_back".to_owned();
        assert_eq!(undeclared(&listed, TABLE), ["group::a_static_member_restarts_without_a_rebalance"]);
        // And its new name alone says nothing of where it runs: it is not in
        // the table, so it would run everywhere, which is why the run fails.
        assert!(left_out(Pass::whole(Kind::TANSU), TABLE)
            .iter()
            .all(|(test, _)| *test != "group::a_static_member_comes_back"));
    }

    #[test]
    fn the_declared_table_names_real_modules_and_every_need_is_judged() {
        // Every entry is module::test, and no test is declared twice.
        let mut seen = std::collections::BTreeSet::new();
        for (test, needs) in NEEDS {
            assert!(test.contains("::") && !needs.is_empty(), "{test}");
            assert!(seen.insert(*test), "{test} is declared twice");
        }
    }

    #[test]
    fn kinds_are_named_and_parsed_back() {
        for implementation in
            [Implementation::Tansu, Implementation::Kafka, Implementation::Mock, Implementation::Docker]
        {
            for (sasl, tls) in [(false, None), (true, Some(ClientAuth::None)), (false, Some(ClientAuth::Required))] {
                let kind = Kind::plain(implementation).secured(sasl, tls);
                assert_eq!(Kind::parse(&kind.name()), Some(kind), "{}", kind.name());
            }
        }
        assert_eq!(Kind::plain(Implementation::Kafka).secured(true, Some(ClientAuth::None)).name(), "kafka-sasl-tls");
        assert_eq!(Kind::parse("kafka-sasl-mtls"), None);
    }
}
