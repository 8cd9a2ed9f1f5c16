//! `cargo xtask demo`: the billing service end to end. Builds billing-bin and
//! the demo (`tests/demo/main.rs`), then runs the demo against a broker, which
//! runs billing-bin against a fake provider with faults and prints where
//! every event ended up. Fails when the demo finds an event charged twice or
//! lost.

use std::process::Command;

use crate::{env::BROKERS_ENV, integration::with_broker, process::run};

/// Where the demo finds the billing-bin binary.
const BILLING_BIN_ENV: &str = "BILLING_BIN";

/// The demo's own flags, passed through: `--events N`, `--seed S`,
/// `--latency 50ms`, `--transient-pct`, `--permanent-pct`, `--slow-pct`,
/// `--max-in-flight`, `--timeout` (`cargo run -p integration --features
/// broker --bin demo -- --help` lists them).
#[derive(clap::Args)]
pub(crate) struct DemoArgs {
    /// Which broker to start, unless `KAFKA_RETRY_BROKERS` names one.
    #[command(flatten)]
    broker: crate::stack::BrokerArgs,
    /// Flags for the demo.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

pub(crate) fn demo(args: &DemoArgs) -> anyhow::Result<()> {
    let target = crate::stack::build_binaries()?;
    with_broker(
        || args.broker.implementation(),
        |addr| {
            let mut demo = Command::new(target.join("demo"));
            demo.args(&args.args);
            run(demo.env(BROKERS_ENV, addr).env(BILLING_BIN_ENV, target.join("billing-bin")))
        },
    )
}
