//! `cargo xtask bench`: the pipeline's throughput beside the raw rskafka
//! ceiling, measured in the same run against the same broker. Figures are
//! printed, never asserted: timing assertions make flaky tests.

use std::process::Command;

use anyhow::{bail, Context};

use crate::{
    ci::{with_broker, BROKERS_ENV},
    paths::{cargo, workspace_root},
    process::run,
};

/// How big the run is.
#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// Records in the source topic.
    #[arg(long, default_value_t = 5_000)]
    records: usize,
    /// Partitions of every topic.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
}

pub(crate) fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    run(Command::new(cargo()).current_dir(workspace_root()).args([
        "build",
        "--release",
        "--package",
        "integration",
        "--features",
        "broker",
        "--bin",
        "bench",
    ]))?;
    let binary = workspace_root().join("target/release/bench");
    with_broker(|addr| {
        let topic = format!("bench-{}", std::process::id());
        let scenario = |extra: &[&str]| -> anyhow::Result<Figures> {
            let out = Command::new(&binary)
                .args(extra)
                .env(BROKERS_ENV, addr)
                .output()
                .with_context(|| format!("cannot run {}", binary.display()))?;
            if !out.status.success() {
                bail!("bench {} failed: {}", extra.join(" "), String::from_utf8_lossy(&out.stderr));
            }
            Ok(Figures(String::from_utf8(out.stdout)?))
        };
        let (p, n) = (args.partitions.to_string(), args.records.to_string());
        eprintln!("producing {n} records of 256 bytes over {p} partitions, then draining them...");
        let raw = scenario(&["raw", &topic, &p, &n])?;
        let noop = scenario(&["pipeline", &topic, &p, &n, "0"])?;
        let some = scenario(&["pipeline", &topic, &p, &n, "10"])?;
        let all = scenario(&["pipeline", &topic, &p, &n, "100"])?;
        // Last: records with headers slow the broker down for every later fetch.
        let headers = scenario(&["raw-headers", &format!("{topic}-headers"), &p, &n])?;

        let fetch = raw.get("fetch_per_s")?;
        let noop_rate = noop.get("drain_per_s")?;
        println!();
        println!("{:<44} {:>12} {:>16} {:>14}", "scenario", "records/s", "relative", "peak RSS (MiB)");
        let row = |name: &str, rate: f64, relative: String, f: &Figures| -> anyhow::Result<()> {
            let rss = f.get("peak_rss_kib")? / 1024.0;
            println!("{name:<44} {rate:>12.0} {relative:>16} {rss:>14.1}");
            Ok(())
        };
        row("rskafka produce, batches of 500 (ceiling)", raw.get("produce_per_s")?, String::new(), &raw)?;
        row(
            "rskafka produce with 11 retry headers",
            headers.get("produce_per_s")?,
            "republish ceiling".into(),
            &headers,
        )?;
        row("rskafka fetch (ceiling)", fetch, "100% of fetch".into(), &raw)?;
        let pct = |a: f64, b: f64| format!("{:.0}%", 100.0 * a / b);
        row("pipeline, no-op handler", noop_rate, format!("{} of fetch", pct(noop_rate, fetch)), &noop)?;
        let some_rate = some.get("drain_per_s")?;
        row("pipeline, 10% transient failures", some_rate, format!("{} of no-op", pct(some_rate, noop_rate)), &some)?;
        let all_rate = all.get("drain_per_s")?;
        row(
            "pipeline, 100% transient (source drain)",
            all_rate,
            format!("{} of no-op", pct(all_rate, noop_rate)),
            &all,
        )?;
        println!();
        println!("pipeline rates: from listener start until the source group committed every record;");
        println!("failed records are republished (acks=all) to the retry rung before their offset is committed.");
        Ok(())
    })
}

/// One scenario's `key=value` output line.
struct Figures(String);

impl Figures {
    fn get(&self, key: &str) -> anyhow::Result<f64> {
        self.0
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
            .with_context(|| format!("no {key} in the bench output {:?}", self.0))?
            .parse()
            .with_context(|| format!("{key} is not a number in {:?}", self.0))
    }
}
