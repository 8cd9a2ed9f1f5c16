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
    /// How long every provider answer takes at least (e.g. 50ms).
    #[arg(long, default_value = "0s")]
    latency: String,
    /// Percent of orders the provider refuses transiently at first.
    #[arg(long, default_value_t = 20)]
    transient_pct: u8,
    /// Percent of orders the provider declines.
    #[arg(long, default_value_t = 5)]
    permanent_pct: u8,
    /// Percent of orders whose first answer comes after the service gave up.
    #[arg(long, default_value_t = 5)]
    slow_pct: u8,
    /// billing-bin's BILLING_MAX_IN_FLIGHT (its default when not given).
    #[arg(long)]
    max_in_flight: Option<usize>,
    /// How long the events may take to be accounted for.
    #[arg(long, default_value = "180s")]
    timeout: String,
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
        demo.args(["--latency", &args.latency, "--timeout", &args.timeout])
            .args(["--transient-pct", &args.transient_pct.to_string()])
            .args(["--permanent-pct", &args.permanent_pct.to_string()])
            .args(["--slow-pct", &args.slow_pct.to_string()]);
        if let Some(max_in_flight) = args.max_in_flight {
            demo.args(["--max-in-flight", &max_in_flight.to_string()]);
        }
        run(demo.env(BROKERS_ENV, addr).env(BILLING_BIN_ENV, target.join("billing-bin")))
    })
}
