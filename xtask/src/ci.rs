//! `cargo xtask integration` and `cargo xtask ci`.

use std::process::Command;

use anyhow::{bail, Context};

use crate::{
    broker::Broker,
    paths::{cargo, workspace_root},
    process::run,
};

/// The environment variable that tells integration tests where the broker is.
/// Tests built with the `broker` feature fail when it is missing.
pub(crate) const BROKERS_ENV: &str = "KAFKA_RETRY_BROKERS";

/// Runs the integration tests against a broker: the one in
/// `$KAFKA_RETRY_BROKERS`, else one `broker up` left running, else a fresh
/// tansu that is stopped afterwards, whatever the tests' outcome.
pub(crate) fn integration(test_args: &[String]) -> anyhow::Result<()> {
    with_broker(|addr| run_integration_tests(addr, test_args))
}

/// Runs `work` with a broker's address: `$KAFKA_RETRY_BROKERS`, else the
/// broker `broker up` left running, else a fresh tansu that is stopped
/// afterwards, whatever `work`'s outcome.
pub(crate) fn with_broker(work: impl FnOnce(&str) -> anyhow::Result<()>) -> anyhow::Result<()> {
    if let Ok(addr) = std::env::var(BROKERS_ENV) {
        eprintln!("using the broker at {addr} from {BROKERS_ENV}");
        return work(&addr);
    }
    if let Some(broker) = Broker::load()? {
        if broker.answers() {
            eprintln!("using the running broker at {} (left running)", broker.addr);
            return work(&broker.addr);
        }
        broker.stop()?;
    }
    let broker = Broker::start_tansu(None)?;
    eprintln!("started tansu at {}", broker.addr);
    let result = work(&broker.addr);
    let stopped = broker.stop();
    result?;
    stopped.context("the work succeeded, but the broker did not stop")
}

/// The environment variable that tells the integration tests where the
/// service binary they run end to end is.
pub(crate) const BILLING_BIN_ENV: &str = "BILLING_BIN";

fn run_integration_tests(addr: &str, test_args: &[String]) -> anyhow::Result<()> {
    let python = crate::python::interop_python()?;
    let billing_bin = build_billing_bin()?;
    run(Command::new(cargo())
        .current_dir(workspace_root())
        .args(["test", "--package", "integration", "--features", "broker", "--test", "it", "--"])
        .args(test_args)
        .env(BROKERS_ENV, addr)
        .env(BILLING_BIN_ENV, billing_bin)
        .env(crate::python::PYTHON_ENV, python))
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
    tidy_dependencies()?;
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
    integration(&[])?;
    eprintln!("ci: all checks passed");
    Ok(())
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
        let out = Command::new(cargo())
            .current_dir(workspace_root())
            .args(["tree", "--edges", "normal,build", "--prefix", "none", "--format", "{p}", "--package", krate])
            .output()
            .context("cannot run cargo tree")?;
        if !out.status.success() {
            bail!("cargo tree -p {krate} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        for line in String::from_utf8(out.stdout)?.lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            let banned = (name.ends_with("-sys") && !PURE_SYS_CRATES.contains(&name))
                || name.contains("rdkafka")
                || name.contains("openssl");
            if banned {
                offenders.push(format!("{krate} depends on {line}"));
            }
        }
    }
    if !offenders.is_empty() {
        offenders.sort();
        offenders.dedup();
        bail!("dependencies that are not pure Rust:\n  {}", offenders.join("\n  "));
    }
    eprintln!("tidy: {} stay pure Rust", PURE_RUST_CRATES.join(", "));
    Ok(())
}
