//! `cargo xtask demo`: the billing service end to end. Builds billing-bin and
//! the demo (`tests/demo/main.rs`), then runs the demo against a broker, which
//! runs billing-bin against a fake provider with faults and prints where
//! every event ended up. Fails when the demo finds an event charged twice or
//! lost.

use std::process::Command;

use crate::{
    ci::{with_broker, BROKERS_ENV},
    paths::{cargo, workspace_root},
    process::run,
};

/// Where the demo finds the billing-bin binary.
const BILLING_BIN_ENV: &str = "BILLING_BIN";

/// How big the run is.
#[derive(clap::Args)]
pub(crate) struct DemoArgs {
    /// How many OrderConfirmed events to produce.
    #[arg(long, default_value_t = 300)]
    events: u32,
    /// Replays a run: the same events and the same provider faults.
    #[arg(long)]
    seed: Option<u64>,
    /// More flags for the demo (`--latency 50ms`, `--transient-pct 10`,
    /// `--permanent-pct 0`, `--slow-pct 0`, `--max-in-flight 1`, `--timeout 600s`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    extra: Vec<String>,
}

pub(crate) fn demo(args: &DemoArgs) -> anyhow::Result<()> {
    let build = |package: &[&str]| run(Command::new(cargo()).current_dir(workspace_root()).arg("build").args(package));
    build(&["--package", "billing-bin", "--bin", "billing-bin"])?;
    build(&["--package", "integration", "--features", "broker", "--bin", "demo"])?;
    let target = workspace_root().join("target/debug");
    with_broker(|addr| {
        let mut demo = Command::new(target.join("demo"));
        demo.args(["--events", &args.events.to_string()]);
        if let Some(seed) = args.seed {
            demo.args(["--seed", &seed.to_string()]);
        }
        demo.args(&args.extra);
        run(demo.env(BROKERS_ENV, addr).env(BILLING_BIN_ENV, target.join("billing-bin")))
    })
}
