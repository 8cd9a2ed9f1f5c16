//! `cargo xtask integration` and `cargo xtask ci`.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context};

use crate::{
    broker::{Broker, Kind},
    paths::{cargo, workspace_root},
    process::run,
};

/// The environment variable that tells integration tests where the broker is.
/// Tests built with the `broker` feature fail when it is missing.
pub(crate) const BROKERS_ENV: &str = "KAFKA_RETRY_BROKERS";

/// The environment variable that tells integration tests where the mock
/// cluster's control channel is; set only when the broker is the mock.
pub(crate) const MOCK_CONTROL_ENV: &str = "KAFKA_RETRY_MOCK_CONTROL";

/// The environment variable that tells integration tests which
/// implementation they run against (`tansu`, `mock`, `docker` or `external`).
pub(crate) const BROKER_KIND_ENV: &str = "KAFKA_RETRY_BROKER_KIND";

/// The environment variables that give integration tests SASL credentials
/// (set only against a broker that requires them).
pub(crate) const SASL_MECHANISM_ENV: &str = "KAFKA_RETRY_SASL_MECHANISM";
/// See [`SASL_MECHANISM_ENV`].
pub(crate) const SASL_USERNAME_ENV: &str = "KAFKA_RETRY_SASL_USERNAME";
/// See [`SASL_MECHANISM_ENV`].
pub(crate) const SASL_PASSWORD_ENV: &str = "KAFKA_RETRY_SASL_PASSWORD";
/// The security protocol of the suite's clients (PLAINTEXT when unset).
pub(crate) const SECURITY_PROTOCOL_ENV: &str = "KAFKA_RETRY_SECURITY_PROTOCOL";
/// The CA file that signed a TLS broker's certificate.
pub(crate) const SSL_CA_ENV: &str = "KAFKA_RETRY_SSL_CA_LOCATION";
/// The client certificate for a broker that requires mutual TLS.
pub(crate) const SSL_CERTIFICATE_ENV: &str = "KAFKA_RETRY_SSL_CERTIFICATE_LOCATION";
/// Its private key.
pub(crate) const SSL_KEY_ENV: &str = "KAFKA_RETRY_SSL_KEY_LOCATION";

/// The TLS terminator's (stunnel's) configuration, for tests that restart
/// it to cut every connection, as a broker closing them would.
pub(crate) const TLS_PROXY_CONFIG_ENV: &str = "KAFKA_RETRY_TLS_PROXY_CONFIG";

/// Every security setting of the suite, so none leaks from the caller's
/// environment into a pass against another broker.
const SECURITY_ENVS: [&str; 8] = [
    SECURITY_PROTOCOL_ENV,
    SASL_MECHANISM_ENV,
    SASL_USERNAME_ENV,
    SASL_PASSWORD_ENV,
    SSL_CA_ENV,
    SSL_CERTIFICATE_ENV,
    SSL_KEY_ENV,
    TLS_PROXY_CONFIG_ENV,
];

/// Which brokers `cargo xtask integration` runs the suite against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BrokerChoice {
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
    /// What CI runs: tansu, the mock cluster, SASL_SSL and mutual TLS, one
    /// after the other.
    All,
}

/// How many brokers the mock cluster of the integration suite has.
const MOCK_BROKERS: u8 = 3;

/// Tests whose name contains one of these need what the mock cluster lacks;
/// on the mock they are left out by name, and the run says why.
const NOT_ON_MOCK: &[(&str, &str)] = &[
    ("needs_create_topics", "it has no CreateTopics (it creates topics through its own call)"),
    (
        "needs_commits_during_rebalances",
        "it refuses commits while a rebalance is prepared, which Kafka accepts from the ending generation",
    ),
];

/// Tests whose name contains one of these need what tansu lacks; on tansu
/// they are left out by name, and the run says why.
const NOT_ON_TANSU: &[(&str, &str)] = &[
    (
        "needs_commit_metadata",
        "tansu 0.6.0 answers every committed offset's metadata empty, where replays record records handled out of \
         order (there, such records are refused with a reason: see *drops_commit_metadata*)",
    ),
    (
        "needs_leader_reelection",
        "tansu 0.6.0 keeps naming a group's departed leader once the group emptied during a rebalance, so no member \
         can complete a join there again",
    ),
];

/// Tests whose name contains this check what happens on a broker that
/// drops offset-commit metadata: tansu's passes only.
const DROPS_COMMIT_METADATA: &str = "drops_commit_metadata";

/// The suite's slowest test, left out of the secured passes to keep CI short.
const SLOWEST: &str = "billing::a_kill_mid_stream_charges_every_event_exactly_once";

/// The provider outage (a minute long), left out of the secured passes too.
const OUTAGE: &str = "billing::an_outage_of_the_provider";

/// Tests whose name contains this need a broker that requires SASL.
const SASL_ONLY: &str = "sasl_only";

/// Tests whose name contains this need a broker behind TLS (and its
/// terminator named in [`TLS_PROXY_CONFIG_ENV`]).
const TLS_ONLY: &str = "tls_only";

/// Tests whose name contains this need a broker that requires client
/// certificates (mutual TLS).
const CLIENT_CERT_ONLY: &str = "client_cert_only";

/// The modules of the fault tests, which run after the rest, one at a time.
const FAULTS: &str = "faults::";

/// Tests whose name starts with this inject faults through the mock
/// cluster's control channel, or check what only the mock lacks; on other
/// brokers they are left out by name, and the run says so.
const MOCK_ONLY: &str = "mock_only";

/// Runs the integration tests against `choice`: `$KAFKA_RETRY_BROKERS` if
/// set (with `$KAFKA_RETRY_MOCK_CONTROL` for a mock cluster), else a broker
/// of that kind that `broker up` left running, else a fresh one that is
/// stopped afterwards, whatever the tests' outcome.
pub(crate) fn integration(choice: BrokerChoice, test_args: &[String]) -> anyhow::Result<()> {
    let kinds: &[Kind] = match choice {
        BrokerChoice::Tansu => &[Kind::Tansu],
        BrokerChoice::Mock => &[Kind::Mock],
        BrokerChoice::TansuSasl => &[Kind::TansuSasl],
        BrokerChoice::TansuSaslTls => &[Kind::TansuSaslTls],
        BrokerChoice::TansuMtls => &[Kind::TansuMtls],
        BrokerChoice::All => &[Kind::Tansu, Kind::Mock, Kind::TansuSaslTls, Kind::TansuMtls],
    };
    for &kind in kinds {
        eprintln!("integration: the suite against {}", kind.name());
        with_broker_of(kind, |target| run_integration_tests(target, test_args))
            .with_context(|| format!("the integration suite against {}", kind.name()))?;
    }
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
    /// Security settings (SASL, TLS) as environment, where the broker requires them.
    pub(crate) security: Vec<(&'static str, String)>,
}

/// Runs `work` with a broker's address: `$KAFKA_RETRY_BROKERS`, else the
/// broker `broker up` left running, else a fresh tansu that is stopped
/// afterwards, whatever `work`'s outcome.
pub(crate) fn with_broker(work: impl FnOnce(&str) -> anyhow::Result<()>) -> anyhow::Result<()> {
    with_broker_of(Kind::Tansu, |target| work(target.addr))
}

/// Like [`with_broker`], for a broker of `kind`; a running broker of
/// another kind is left alone and a fresh one of `kind` started beside it.
pub(crate) fn with_broker_of(kind: Kind, work: impl FnOnce(&Target<'_>) -> anyhow::Result<()>) -> anyhow::Result<()> {
    if let Ok(addr) = std::env::var(BROKERS_ENV) {
        let control = std::env::var(MOCK_CONTROL_ENV).ok();
        eprintln!("using the broker at {addr} from {BROKERS_ENV}");
        let kind = if control.is_some() { Kind::Mock } else { kind };
        let security =
            SECURITY_ENVS.into_iter().filter_map(|name| std::env::var(name).ok().map(|v| (name, v))).collect();
        return work(&Target { kind, addr: &addr, control: control.as_deref(), security });
    }
    if let Some(broker) = Broker::load()? {
        let usable = broker.kind == kind || (kind == Kind::Tansu && broker.kind == Kind::Docker);
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
    let broker = match kind {
        Kind::Mock => Broker::start_mock(MOCK_BROKERS)?,
        Kind::Docker => Broker::start_tansu(None)?,
        tansu => Broker::start_tansu_kind(tansu, None)?,
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

fn run_integration_tests(target: &Target<'_>, test_args: &[String]) -> anyhow::Result<()> {
    // The arguments already go after cargo's `--`; another one would turn
    // the skips added below into filters.
    let test_args: Vec<String> = test_args.iter().filter(|a| *a != "--").cloned().collect();
    let test_args = test_args.as_slice();
    let python = crate::python::interop_python()?;
    let billing_bin = build_billing_bin()?;
    run(Command::new(cargo()).current_dir(workspace_root()).args([
        "build",
        "--package",
        "stock",
        "--example",
        "stock-service",
    ]))?;
    let stock_service = workspace_root().join("target").join("debug").join("examples").join("stock-service");
    let mut envs: Vec<(String, String)> = vec![
        (BROKERS_ENV.to_owned(), target.addr.to_owned()),
        (BROKER_KIND_ENV.to_owned(), target.kind.name().to_owned()),
        (BILLING_BIN_ENV.to_owned(), billing_bin.display().to_string()),
        (STOCK_SERVICE_BIN_ENV.to_owned(), stock_service.display().to_string()),
        (crate::python::PYTHON_ENV.to_owned(), python.display().to_string()),
    ];
    envs.extend(target.security.iter().map(|(k, v)| (k.to_string(), v.clone())));
    if let Some(control) = target.control {
        envs.push((MOCK_CONTROL_ENV.to_owned(), control.to_owned()));
    }

    // Tests for what the broker lacks are left out by name, and the run says why.
    let mut skips: Vec<&str> = Vec::new();
    let lacks = [
        (MOCK_ONLY, target.control.is_none(), "they need the mock cluster's fault injection (they run on the mock)"),
        (SASL_ONLY, !target.kind.sasl(), "the broker does not require SASL"),
        (TLS_ONLY, target.kind.tls().is_none(), "the broker is not behind TLS"),
        (
            CLIENT_CERT_ONLY,
            target.kind.tls() != Some(crate::tls::ClientAuth::Required),
            "the broker does not require client certificates",
        ),
    ];
    for (marker, lacking, why) in lacks {
        if lacking {
            eprintln!("integration: on {}, tests named *{marker}* are left out: {why}", target.kind.name());
            skips.push(marker);
        }
    }
    if target.control.is_none() {
        for (marker, why) in NOT_ON_TANSU {
            eprintln!("integration: on tansu, tests named *{marker}* are left out (they run on the mock): {why}");
            skips.push(marker);
        }
    }
    if target.control.is_some() {
        eprintln!(
            "integration: on the mock cluster, tests named *{DROPS_COMMIT_METADATA}* are left out: it keeps \
             offset-commit metadata"
        );
        skips.push(DROPS_COMMIT_METADATA);
        for (marker, why) in NOT_ON_MOCK {
            eprintln!(
                "integration: on the mock cluster, tests named *{marker}* are left out (they run on tansu): {why}"
            );
            skips.push(marker);
        }
    }
    if !target.security.is_empty() {
        // Every client of the suite uses these (ours, rskafka, billing-bin,
        // the interop client).
        eprintln!(
            "integration: the suite through {} ({}); {SLOWEST} and {OUTAGE}* are left out (crash recovery and a \
             provider outage, the suite's slowest, have nothing to do with security and run on the other brokers)",
            target.kind.security_protocol(),
            target.kind.name()
        );
        skips.push(SLOWEST);
        skips.push(OUTAGE);
    }

    // Faults (injected by the mock, or connections cut by the TLS
    // terminator) reach every client of the broker: the fault tests run
    // after the rest, one at a time, so no other test sees their faults.
    let filters: Vec<&String> = test_args.iter().filter(|a| !a.starts_with('-')).collect();
    let main_pass = filters.is_empty() || filters.iter().any(|f| !f.contains(FAULTS));
    let fault_pass = filters.is_empty() || filters.iter().any(|f| f.contains(FAULTS));
    let pass = |extra: &[&str]| {
        let mut cmd = Command::new(cargo());
        cmd.current_dir(workspace_root())
            .args(["test", "--package", "integration", "--features", "broker", "--test", "it", "--"])
            .args(test_args)
            .args(skips.iter().flat_map(|marker| ["--skip", marker]))
            .args(extra);
        for name in SECURITY_ENVS.iter().chain([&MOCK_CONTROL_ENV]) {
            cmd.env_remove(name);
        }
        cmd.envs(envs.iter().map(|(k, v)| (k, v)));
        cmd
    };
    if main_pass {
        run(&mut pass(&["--skip", FAULTS]))?;
    }
    if fault_pass {
        eprintln!("integration: the fault tests, one at a time");
        let only_faults: &[&str] = if filters.is_empty() { &[FAULTS] } else { &[] };
        run(&mut pass(&[only_faults, &["--test-threads=1"]].concat()))?;
    }
    Ok(())
}

/// Builds the service binary (debug) and returns its path.
pub(crate) fn build_billing_bin() -> anyhow::Result<std::path::PathBuf> {
    run(Command::new(cargo()).current_dir(workspace_root()).args(["build", "--package", "billing-bin"]))?;
    Ok(workspace_root().join("target").join("debug").join("billing-bin"))
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
    let deny = crate::paths::cargo_install_cached(
        "cargo-deny",
        CARGO_DENY_VERSION,
        &["--no-default-features"],
        "about 8 minutes on 2 cores",
    )?;
    // Advisories need the advisory database from the network: not checked here.
    run(Command::new(deny).current_dir(&root).args(["check", "bans", "licenses", "sources"]))?;
    run(cargo_in_root().args(["doc", "--workspace", "--no-deps"]).env("RUSTDOCFLAGS", "-D warnings"))?;
    alert_rules()?;
    run(cargo_in_root().args(["test", "--workspace"]))?;
    integration(BrokerChoice::All, &[])?;
    eprintln!("ci: all checks passed");
    Ok(())
}

/// The rules between crates: pure Rust, the layers, names.
pub(crate) fn tidy() -> anyhow::Result<()> {
    tidy_dependencies()?;
    tidy_ladder_names()?;
    tidy_transport_free()?;
    tidy_layers()?;
    tidy_core_examples()
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
    let mut files = Vec::new();
    let mut stack = roots.to_vec();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                if !skip.contains(&path) && !path.ends_with("target") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
                files.push((path, text));
            }
        }
    }
    Ok(files)
}

/// The cargo-deny release CI uses; its cache entry is keyed by it.
const CARGO_DENY_VERSION: &str = "0.20.2";

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
