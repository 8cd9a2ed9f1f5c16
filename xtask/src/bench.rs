//! `cargo xtask bench`: the pipeline's throughput beside the raw rskafka
//! ceiling, measured in the same run against the same broker. Figures are
//! printed, never asserted: timing assertions make flaky tests.

use std::process::Command;

use anyhow::{bail, Context};

use crate::{
    broker::{Broker, Implementation, Kind},
    env::BROKERS_ENV,
    paths::{cargo, workspace_root},
    process::run,
};

/// How big the run is.
#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// Records in the source topic of each scenario with a handler that
    /// takes time (the 50 ms rows).
    #[arg(long, default_value_t = 15_000)]
    records: usize,
    /// Records of the drains with a handler that costs nothing (no-op,
    /// with a traceparent, 10% and 100% transient failures): on Apache
    /// Kafka they run at up to a million a second, and a shorter drain
    /// would time its set-up (the first republication's producer id and
    /// connection) more than its records.
    #[arg(long, default_value_t = 240_000)]
    drain_records: usize,
    /// Partitions of every topic.
    #[arg(long, default_value_t = 3)]
    partitions: i32,
    /// Records of the sequential baseline with a 50 ms handler (it drains
    /// 20 records/s per partition, so fewer are enough).
    #[arg(long, default_value_t = 600)]
    sequential_records: usize,
    /// Records of each codec scenario on Apache Kafka (the pipeline drains
    /// them in about a second: fewer would time commits more than reads).
    #[arg(long, default_value_t = 300_000)]
    codec_records: usize,
    /// Only the codec scenarios on Apache Kafka (and librdkafka's row).
    #[arg(long)]
    codecs_only: bool,
    /// Instead, billing-bin side by side with a peer: `spring` (Spring
    /// Kafka's @RetryableTopic, `tests/peers/spring`) on Apache Kafka.
    #[arg(long, value_enum)]
    peer: Option<Peer>,
    /// Orders of each side-by-side scenario, and of each rebalance scenario.
    #[arg(long, default_value_t = 20_000)]
    orders: usize,
    /// Instead, a rolling restart of three instances on Apache Kafka under
    /// each way of rebalancing (eager, cooperative, the consumer group
    /// protocol; with and without static membership): how long partitions
    /// stood still, and what was handled twice.
    #[arg(long)]
    rebalance: bool,
    /// Partitions of the rebalance scenarios' topics.
    #[arg(long, default_value_t = 6)]
    rebalance_partitions: i32,
}

/// The peers billing-bin is measured beside.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum Peer {
    /// Spring Kafka's @RetryableTopic.
    Spring,
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
    let binary = crate::paths::target_dir().join("release/bench");
    if let Some(Peer::Spring) = args.peer {
        return crate::side_by_side::spring(&binary, args.orders, args.partitions);
    }
    if args.rebalance {
        return rebalance(&binary, args.orders, args.rebalance_partitions);
    }
    if !args.codecs_only {
        let run_id = std::process::id();
        // One Apache Kafka broker for every pipeline scenario, each on topics
        // of its own (unless one is given by KAFKA_RETRY_BROKERS). tansu
        // 0.6.0 is no place to time a pipeline: its storage slows down as
        // it grows, and idempotent produce requests by the thousand (every
        // record republished) pin it at full CPU until requests time out.
        let given = std::env::var(BROKERS_ENV).ok();
        let started = match given {
            Some(_) => None,
            None => {
                eprintln!("starting one Apache Kafka broker for the pipeline scenarios...");
                let broker = Broker::start_kafka(
                    Kind::plain(Implementation::Kafka),
                    1,
                    1,
                    crate::kafka::JvmProfile::Throughput,
                )?;
                crate::interrupt::started(&broker);
                Some(broker)
            }
        };
        let addr = given.clone().or_else(|| started.as_ref().map(|b| b.addr.clone())).unwrap_or_default();
        let scenario = |extra: &[&str]| -> anyhow::Result<Figures> {
            let out = Command::new(&binary)
                .args(extra)
                .env(BROKERS_ENV, &addr)
                .output()
                .with_context(|| format!("cannot run {}", binary.display()))?;
            if !out.status.success() {
                bail!("bench {} failed: {}", extra.join(" "), String::from_utf8_lossy(&out.stderr));
            }
            Ok(Figures(String::from_utf8(out.stdout)?))
        };
        let result = pipeline(args, run_id, &scenario);
        if let Some(broker) = started {
            broker.stop()?;
            crate::interrupt::stopped(&broker);
        }
        result?;
    }
    codecs(&binary, args)
}

/// The pipeline rows: each scenario run by `scenario` on topics of its own.
fn pipeline(
    args: &BenchArgs,
    run_id: u32,
    scenario: &dyn Fn(&[&str]) -> anyhow::Result<Figures>,
) -> anyhow::Result<()> {
    {
        let p = args.partitions.to_string();
        // Every pipeline scenario drains topics of its own, filled just before.
        let mut topics = 0;
        let mut fill =
            |how: &str, records: usize, failure: &str, latency: &str, window: &str| -> anyhow::Result<Figures> {
                topics += 1;
                let topic = format!("bench-{run_id}-{topics}");
                let n = records.to_string();
                eprintln!(
                    "scenario {topics}: {n} records, {failure}% failing, handler {latency}, window {window} ({how})"
                );
                scenario(&[how, &topic, &p, &n, failure, latency, window])
            };
        // The ceilings at the drains' size, so the rows compare.
        let n = args.drain_records.to_string();
        eprintln!("producing {n} records of 256 bytes over {p} partitions, then draining them...");
        let raw = scenario(&["raw", &format!("bench-{run_id}-raw"), &p, &n])?;
        // The drains with a handler that costs nothing (no-op, a trace
        // context read on every record with export off, 10% and 100%
        // transient failures) take turns after a round not counted (the
        // broker's first group and fetches): the medians are shown, as the
        // differences are near one run's noise.
        fill("fill-and-drain", args.drain_records, "0", "0", "64")?;
        let (mut noops, mut traceds, mut somes, mut alls) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..RUNS {
            noops.push(fill("fill-and-drain", args.drain_records, "0", "0", "64")?);
            traceds.push(fill("fill-traced-and-drain", args.drain_records, "0", "0", "64")?);
            somes.push(fill("fill-and-drain", args.drain_records, "10", "0", "64")?);
            alls.push(fill("fill-and-drain", args.drain_records, "100", "0", "64")?);
        }
        let each = |runs: &[Figures]| -> anyhow::Result<String> {
            let rates: anyhow::Result<Vec<String>> = runs.iter().map(|f| Ok(format!("{:.0}", f.get(RATE)?))).collect();
            Ok(rates?.join(", "))
        };
        let runs = format!(
            "no-op {}; with a traceparent {}; 10% transient {}; 100% transient {}",
            each(&noops)?,
            each(&traceds)?,
            each(&somes)?,
            each(&alls)?
        );
        let noop = median_run(noops, RATE)?;
        let traced = median_run(traceds, RATE)?;
        let some = median_run(somes, RATE)?;
        let all = median_run(alls, RATE)?;
        let sequential = fill("fill-and-drain", args.sequential_records, "0", "50ms", "1")?;
        let windowed = fill("fill-and-drain", args.records, "0", "50ms", "64")?;
        let windowed_failing = fill("fill-and-drain", args.records, "10", "50ms", "64")?;
        let mix = fill("fill-and-drain", args.records, "0", "10-200ms", "64")?;
        // Last, as on brokers where records with headers slow every later fetch.
        let headers = scenario(&["raw-headers", &format!("bench-{run_id}-headers"), &p, &n])?;

        let fetch = raw.get("fetch_per_s")?;
        let noop_rate = noop.get(RATE)?;
        println!();
        println!(
            "{:<52} {:>10} {:>22} {:>14} {:>9} {:>10}",
            "scenario", "records/s", "relative", "committed (s)", "join (s)", "RSS (MiB)"
        );
        let mut counted = Vec::new();
        let mut row = |name: &str, rate: f64, relative: String, f: &Figures| -> anyhow::Result<()> {
            let rss = f.get("peak_rss_kib")? / 1024.0;
            let seconds = |key: &str| f.get(key).map(|ms| format!("{:.1}", ms / 1000.0)).unwrap_or_default();
            let (tail, join) = (seconds("commit_tail_ms"), seconds("join_ms"));
            println!("{name:<52} {rate:>10.0} {relative:>22} {tail:>14} {join:>9} {rss:>10.1}");
            // The listener's counters that tell of trouble, where a row had any.
            let trouble: Vec<String> = COUNTERS
                .iter()
                .filter_map(|key| f.get(key).ok().filter(|n| *n > 0.0).map(|n| format!("{key}={n:.0}")))
                .collect();
            if !trouble.is_empty() {
                counted.push(format!("{name}: {}", trouble.join(" ")));
            }
            Ok(())
        };
        row("rskafka produce, batches of 500 (ceiling)", raw.get("produce_per_s")?, String::new(), &raw)?;
        let republish = headers.get("produce_per_s")?;
        row("rskafka produce with 11 retry headers", republish, "republish ceiling".into(), &headers)?;
        row("rskafka fetch (ceiling)", fetch, "100% of fetch".into(), &raw)?;
        let pct = |a: f64, b: f64| format!("{:.0}%", 100.0 * a / b);
        row("pipeline, no-op handler", noop_rate, format!("{} of fetch", pct(noop_rate, fetch)), &noop)?;
        let traced_rate = traced.get(RATE)?;
        row(
            "pipeline, no-op, a traceparent on each record",
            traced_rate,
            format!("{} of no-op", pct(traced_rate, noop_rate)),
            &traced,
        )?;
        let some_rate = some.get(RATE)?;
        row("pipeline, 10% transient failures", some_rate, format!("{} of no-op", pct(some_rate, noop_rate)), &some)?;
        let all_rate = all.get(RATE)?;
        row(
            "pipeline, 100% transient (source drain)",
            all_rate,
            format!("{} of republish", pct(all_rate, republish)),
            &all,
        )?;
        let sequential_rate = sequential.get(RATE)?;
        row("50 ms handler, one record at a time (baseline)", sequential_rate, "1x".into(), &sequential)?;
        let times = |rate: f64| format!("{:.1}x the baseline", rate / sequential_rate);
        let windowed_rate = windowed.get(RATE)?;
        row("50 ms handler, 64 in flight per partition", windowed_rate, times(windowed_rate), &windowed)?;
        let failing_rate = windowed_failing.get(RATE)?;
        row("50 ms handler, 64 in flight, 10% transient", failing_rate, times(failing_rate), &windowed_failing)?;
        let mix_rate = mix.get(RATE)?;
        row("10-200 ms handler, 64 in flight", mix_rate, times(mix_rate), &mix)?;
        println!();
        println!("pipeline rates: from the first handled record until every source record's first call ended and");
        println!("the broker acknowledged every failed record's republication (acks=all) to the retry rung (the group");
        println!("joins before it are the join column); the source group had committed every record that much later");
        println!("(committed column: up to the commit interval, 1 s, for the last records). Every row checked that no");
        println!("offset was committed above a record whose first call had not ended. Every scenario on one Apache");
        println!("Kafka broker. The four 0 ms drains are medians of {RUNS} runs taking turns, after one not counted;");
        println!(
            "the ceilings and those drains move {} records, the 50 ms rows {} ({runs} records/s). The fetch",
            args.drain_records, args.records
        );
        println!("ceiling includes its first fetch, which the pipeline's rates leave out.");
        for line in counted {
            println!("counters: {line}");
        }
    }
    Ok(())
}

/// The rebalance rows: one Apache Kafka cluster of three brokers, each
/// scenario on topics of its own, one after the other.
fn rebalance(binary: &std::path::Path, orders: usize, partitions: i32) -> anyhow::Result<()> {
    eprintln!("starting Apache Kafka (three brokers) for the rebalance scenarios...");
    let broker = Broker::start_kafka(
        Kind::plain(Implementation::Kafka),
        crate::integration::KAFKA_BROKERS,
        1,
        crate::kafka::JvmProfile::Throughput,
    )?;
    crate::interrupt::started(&broker);
    let run_id = std::process::id();
    let result = (|| -> anyhow::Result<Vec<(&str, Figures)>> {
        let scenarios = [
            ("eager (classic, range)", "eager", ""),
            ("eager, static members", "eager", "static"),
            ("cooperative (classic, cooperative-sticky)", "cooperative", ""),
            ("cooperative, static members", "cooperative", "static"),
            ("consumer group protocol (KIP-848)", "consumer", ""),
            ("consumer group protocol, static members", "consumer", "static"),
        ];
        let mut rows = Vec::new();
        for (i, (name, mode, fixed)) in scenarios.into_iter().enumerate() {
            eprintln!("scenario {}: {name}, {orders} orders over {partitions} partitions, a rolling restart", i + 1);
            let topic = format!("bench-{run_id}-rebalance-{i}");
            let out = Command::new(binary)
                .args(["rebalance", &topic, &partitions.to_string(), &orders.to_string(), mode, fixed])
                .env(BROKERS_ENV, &broker.addr)
                .output()?;
            if !out.status.success() {
                bail!("bench rebalance {mode} {fixed} failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            rows.push((name, Figures(String::from_utf8(out.stdout)?)));
        }
        Ok(rows)
    })();
    let stopped = broker.stop();
    crate::interrupt::stopped(&broker);
    let rows = result?;
    stopped?;
    println!();
    println!(
        "{:<44} {:>18} {:>12} {:>10} {:>20} {:>13} {:>11}",
        "rolling restart of 3 instances",
        "longest pause (s)",
        "departures",
        "arrivals",
        "paused partition-s",
        "redeliveries",
        "RSS (MiB)"
    );
    for (name, f) in &rows {
        println!(
            "{name:<44} {:>18.2} {:>12.2} {:>10.2} {:>20.1} {:>13} {:>11.1}",
            f.get("longest_pause_ms")? / 1000.0,
            f.get("departure_pause_ms")? / 1000.0,
            f.get("arrival_pause_ms")? / 1000.0,
            f.get("paused_partition_s")?,
            f.get("redeliveries")?,
            f.get("peak_rss_kib")? / 1024.0
        );
    }
    println!();
    println!("{orders} orders arrive at a steady pace over {partitions} partitions while each instance in turn stops");
    println!("and starts again; a pause is a partition handling nothing for longer than 250 ms (records arrive on");
    println!("every partition every 20 ms). Classic members heartbeat every 500 ms, as the broker asks of consumer");
    println!("group members here (group.consumer.heartbeat.interval.ms); sessions are 6 s. Departures are the pauses");
    println!(
        "that began while an instance shut down, arrivals the others (a restarted instance takes partitions over)."
    );
    Ok(())
}

/// How many times the scenarios compared by their medians run.
const RUNS: usize = 3;

/// The rate of a pipeline row: records per second from the first handled
/// record until all were handled and every republication acknowledged.
const RATE: &str = "settled_per_s";

/// The listener's counters a pipeline row reports, which tell why a row
/// went slower than it should (all zero in a clean run).
const COUNTERS: [&str; 7] = [
    "offset_resets",
    "positions_kept",
    "handler_timeouts",
    "fetch_failures",
    "publish_failures",
    "commit_failures",
    "worker_failures",
];

fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// The run whose `key` is the median of `runs`' (its other figures with it).
fn median_run(mut runs: Vec<Figures>, key: &str) -> anyhow::Result<Figures> {
    let mut keyed = Vec::with_capacity(runs.len());
    for (i, f) in runs.iter().enumerate() {
        keyed.push((f.get(key)?, i));
    }
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(runs.swap_remove(keyed[keyed.len() / 2].1))
}

/// The codec rows: topics filled by a foreign producer (librdkafka through
/// confluent-kafka) with each codec, drained by the no-op pipeline, beside
/// librdkafka's own consumer and rskafka's raw fetch of the uncompressed
/// topic: one Apache Kafka broker, the same run.
fn codecs(binary: &std::path::Path, args: &BenchArgs) -> anyhow::Result<()> {
    let python = crate::python::interop_python()?;
    let client = workspace_root().join("tests/interop/kafka_client.py");
    eprintln!("starting one Apache Kafka broker for the codec scenarios...");
    let broker = Broker::start_kafka(Kind::plain(Implementation::Kafka), 1, 1, crate::kafka::JvmProfile::Throughput)?;
    crate::interrupt::started(&broker);
    let result = (|| -> anyhow::Result<()> {
        let addr = broker.addr.clone();
        let p = args.partitions.to_string();
        let n = args.codec_records.to_string();
        let run_id = std::process::id();
        let bench = |extra: &[&str]| -> anyhow::Result<Figures> {
            let out = Command::new(binary).args(extra).env(BROKERS_ENV, &addr).output()?;
            if !out.status.success() {
                bail!("bench {} failed: {}", extra.join(" "), String::from_utf8_lossy(&out.stderr));
            }
            Ok(Figures(String::from_utf8(out.stdout)?))
        };
        let foreign = |extra: &[&str]| -> anyhow::Result<Figures> {
            let out = Command::new(&python).arg(&client).arg("--deadline-s").arg("600").args(extra).output()?;
            if !out.status.success() {
                bail!("kafka_client {} failed: {}", extra.join(" "), String::from_utf8_lossy(&out.stderr));
            }
            // JSON like {"records": 15000, "records_per_s": 123}: the same figures as key=value.
            let text =
                String::from_utf8(out.stdout)?.replace(['{', '}', '"', ' '], "").replace(':', "=").replace(',', " ");
            Ok(Figures(text))
        };
        // Each drain RUNS times, on topics of its own: the median is shown.
        const CODECS: [&str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];
        // Per codec: the pipeline's rates, librdkafka's and rskafka's, and
        // the pipeline's with each call in a task of its own (uncompressed only).
        let mut drains: Vec<Vec<f64>> = vec![Vec::new(); CODECS.len()];
        let (mut librdkafka, mut fetches, mut spawned) = (Vec::new(), Vec::new(), Vec::new());
        // A round not counted first: a broker just started serves its
        // first fetches with cold code. Then the codecs take turns, run
        // after run, so no codec gets the broker's warm-up alone.
        for run in 0..=RUNS {
            for (i, codec) in CODECS.into_iter().enumerate() {
                let topic = format!("bench-{run_id}-codec-{codec}-{run}");
                let counted = run > 0;
                eprintln!(
                    "codec {codec}, run {run}{}: librdkafka fills {topic} with {n} records, the no-op pipeline drains it...",
                    if counted { "" } else { " (warm-up, not counted)" }
                );
                bench(&["create", &topic, &p, "0"])?;
                foreign(&[
                    "fill",
                    "--brokers",
                    &addr,
                    "--topic",
                    &topic,
                    "--partitions",
                    &p,
                    "--records",
                    &n,
                    "--compression",
                    codec,
                ])?;
                let drained = bench(&["pipeline", &topic, &p, &n, "0", "0", "64"])?.get(RATE)?;
                let (librdkafka_rate, fetch_rate, spawned_rate) = if codec == "none" {
                    let drain = ["drain", "--brokers", &addr, "--topic", &topic, "--partitions", &p, "--records", &n];
                    let spawned = ["pipeline", &topic, &p, &n, "0", "0", "64", "spawned"];
                    (
                        Some(foreign(&drain)?.get("records_per_s")?),
                        Some(bench(&["fetch", &topic, &p, &n])?.get("fetch_per_s")?),
                        Some(bench(&spawned)?.get(RATE)?),
                    )
                } else {
                    (None, None, None)
                };
                if counted {
                    drains[i].push(drained);
                    librdkafka.extend(librdkafka_rate);
                    fetches.extend(fetch_rate);
                    spawned.extend(spawned_rate);
                }
            }
        }
        let mut rows = Vec::new();
        let mut extra = Some((median(librdkafka), median(fetches)));
        for (codec, rates) in CODECS.into_iter().zip(drains) {
            rows.push((codec, median(rates), extra.take()));
        }
        let (_, none_rate, Some((librdkafka_rate, fetch_rate))) = rows[0] else {
            bail!("the uncompressed row comes first")
        };
        let spawned_rate = median(spawned);
        println!();
        println!(
            "On Apache Kafka (one broker, after a round not counted), {n} records of about 170 bytes filled by librdkafka, \
             median of {RUNS} (the codecs take turns):"
        );
        println!("{:<52} {:>10} {:>22}", "scenario", "records/s", "relative");
        let pct = |a: f64, b: f64| format!("{:.0}%", 100.0 * a / b);
        println!(
            "{:<52} {librdkafka_rate:>10.0} {:>22}",
            "librdkafka consume, uncompressed (confluent-kafka)", "100% of librdkafka"
        );
        println!(
            "{:<52} {fetch_rate:>10.0} {:>22}",
            "rskafka fetch, uncompressed (raw ceiling)",
            pct(fetch_rate, librdkafka_rate) + " of librdkafka"
        );
        println!(
            "{:<52} {none_rate:>10.0} {:>22}",
            "pipeline, no-op handler, uncompressed",
            pct(none_rate, librdkafka_rate) + " of librdkafka"
        );
        println!(
            "{:<52} {spawned_rate:>10.0} {:>22}",
            "pipeline, no-op handler, each call in a task",
            pct(spawned_rate, librdkafka_rate) + " of librdkafka"
        );
        for (codec, rate, _) in &rows[1..] {
            let rate = *rate;
            println!(
                "{:<52} {rate:>10.0} {:>22}",
                format!("pipeline, no-op handler, {codec}"),
                pct(rate, none_rate) + " of uncompressed"
            );
        }
        println!();
        println!("the pipeline reads every codec through the same path; its rate is timed from the first handled");
        println!("record until the last (the commits that follow wait for the commit interval or batch), librdkafka's");
        println!("from its first record until it has read every record (no group, no commits).");
        Ok(())
    })();
    broker.stop()?;
    crate::interrupt::stopped(&broker);
    result
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
