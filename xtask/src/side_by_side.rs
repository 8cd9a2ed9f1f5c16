//! `cargo xtask bench --peer spring`: billing-bin and the Spring Kafka peer
//! (`tests/peers/spring/`, `@RetryableTopic`) side by side, in one run, on
//! one Apache Kafka broker, each against a fake provider of its own with
//! the same faults: the same orders, the same ladder (1 s, 2 s, 4 s; four
//! attempts), concurrency equal to the partitions for Spring, billing-bin's
//! defaults for billing-bin.
//!
//! For each provider latency and share of transient failures, each service
//! drains a backlog of orders; reported: records/s (from the first charge
//! to the last), the 99th percentile of how late retries came against
//! their due time, and the service's peak RSS.

use std::{
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};

use crate::{
    broker::{Broker, Implementation, Kind},
    env::BROKERS_ENV,
    paths::{cargo, workspace_root},
    process::{run, tail},
};

/// The ladder both services use: its first rung's delay is what a retry
/// of an order that failed once waits.
const SCHEDULE: &str = "1s,2s,4s";
const FIRST_DELAY: Duration = Duration::from_secs(1);
/// How long one scenario may take: Spring drains about 20 orders/s per
/// partition at 50 ms.
const SCENARIO_LIMIT: Duration = Duration::from_secs(1800);

/// One service's figures in one scenario.
struct Run {
    records_per_s: f64,
    /// The 99th percentile of retries' lateness, in ms (`None` without retries).
    p99_late_ms: Option<f64>,
    peak_rss_mib: f64,
}

/// Which service runs.
#[derive(Clone, Copy)]
enum Service {
    BillingBin,
    Spring,
}

pub(crate) fn spring(bench: &Path, orders: usize, partitions: i32) -> anyhow::Result<()> {
    run(Command::new(cargo()).current_dir(workspace_root()).args([
        "build",
        "--release",
        "--package",
        "billing-bin",
        "--package",
        "integration",
        "--features",
        "integration/broker",
        "--bin",
        "billing-bin",
        "--bin",
        "fake-provider",
    ]))?;
    let jar = crate::spring::peer_jar()?;
    eprintln!("starting one Apache Kafka broker for the side by side...");
    let broker = Broker::start_kafka(Kind::plain(Implementation::Kafka), 1, 1, crate::kafka::JvmProfile::Throughput)?;
    crate::interrupt::started(&broker);
    let result = (|| -> anyhow::Result<()> {
        let mut rows = Vec::new();
        for (latency_ms, transient_pct) in [(0, 0), (0, 10), (50, 0), (50, 10)] {
            let mut pair = Vec::new();
            for service in [Service::BillingBin, Service::Spring] {
                let scenario = Scenario { broker: &broker.addr, bench, jar: &jar, orders, partitions, latency_ms };
                pair.push(scenario.run(service, transient_pct)?);
            }
            rows.push((latency_ms, transient_pct, pair));
        }
        print_table(&rows, orders, partitions);
        Ok(())
    })();
    broker.stop()?;
    crate::interrupt::stopped(&broker);
    result
}

struct Scenario<'a> {
    broker: &'a str,
    bench: &'a Path,
    jar: &'a Path,
    orders: usize,
    partitions: i32,
    latency_ms: u64,
}

impl Scenario<'_> {
    fn run(&self, service: Service, transient_pct: u8) -> anyhow::Result<Run> {
        let name = match service {
            Service::BillingBin => "billing-bin",
            Service::Spring => "spring",
        };
        let topic = format!("side-{}-{name}-{}-{transient_pct}", std::process::id(), self.latency_ms);
        eprintln!(
            "{name}: {} orders over {} partitions, provider latency {} ms, {transient_pct}% transient failures...",
            self.orders, self.partitions, self.latency_ms
        );
        let provider = Provider::start(self.latency_ms, transient_pct)?;
        let partitions = self.partitions.to_string();
        if let Service::BillingBin = service {
            // Spring creates its ladder itself; billing-bin's is created explicitly.
            let status = Command::new(release("billing-bin"))
                .args(["topics", "create", "--partitions", &partitions])
                .env("KAFKA_BROKERS", self.broker)
                .env("BILLING_TOPIC", &topic)
                .env("RETRY_SCHEDULE", SCHEDULE)
                .stdout(Stdio::null())
                .status()?;
            if !status.success() {
                bail!("billing-bin topics create failed for {topic}");
            }
        }
        let out = Command::new(self.bench)
            .args(["orders", &topic, &partitions, &self.orders.to_string()])
            .env(BROKERS_ENV, self.broker)
            .output()?;
        if !out.status.success() {
            bail!("bench orders failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let log = std::env::temp_dir().join(format!("{topic}.log"));
        let mut child = self.start(service, &topic, &provider.url, &log)?;
        let measured = provider.drain(self.orders, &mut child, &log);
        let peak_rss_kib = peak_rss_kib(child.id());
        stop(&mut child);
        let (first, last) = measured?;
        let records_per_s = (self.orders - 1) as f64 / (last - first).as_secs_f64().max(0.001);
        // A retry is due its rung's delay after the failure was answered.
        let due_after = FIRST_DELAY.as_millis() as i64 + self.latency_ms as i64;
        let mut late: Vec<i64> = provider.arrivals()?.iter().map(|a| (a[1] - a[0] - due_after).max(0)).collect();
        late.sort_unstable();
        let p99_late_ms = (!late.is_empty()).then(|| late[(late.len() * 99).div_ceil(100) - 1] as f64);
        eprintln!("{name}: {records_per_s:.0} records/s, p99 lateness {p99_late_ms:?} ms, peak RSS {peak_rss_kib} KiB");
        Ok(Run { records_per_s, p99_late_ms, peak_rss_mib: peak_rss_kib as f64 / 1024.0 })
    }

    /// Starts `service` on `topic`, logging to `log`.
    fn start(&self, service: Service, topic: &str, provider: &str, log: &Path) -> anyhow::Result<Child> {
        let group = format!("{topic}-group");
        let mut cmd = match service {
            Service::BillingBin => {
                let mut cmd = Command::new(release("billing-bin"));
                cmd.arg("run")
                    .env("KAFKA_BROKERS", self.broker)
                    .env("BILLING_TOPIC", topic)
                    .env("BILLING_GROUP_ID", &group)
                    .env("RETRY_SCHEDULE", SCHEDULE)
                    .env("BILLING_PROVIDER_URL", provider)
                    .env("ADMIN_LISTEN", "127.0.0.1:0")
                    .env("RUST_LOG", "warn");
                cmd
            }
            Service::Spring => {
                let mut cmd = Command::new("java");
                // A container's usual heap limit; the JVM's other defaults.
                cmd.args(["-Xmx512m", "-jar"])
                    .arg(self.jar)
                    .env("KAFKA_BROKERS", self.broker)
                    .env("PEER_TOPIC", topic)
                    .env("PEER_GROUP", &group)
                    .env("PEER_PROVIDER_URL", provider)
                    .env("PEER_ATTEMPTS", "4")
                    .env("PEER_DELAY_MS", FIRST_DELAY.as_millis().to_string())
                    .env("PEER_MULTIPLIER", "2.0")
                    .env("PEER_PARTITIONS", self.partitions.to_string())
                    .env("PEER_CONCURRENCY", self.partitions.to_string())
                    // Its per-charge log lines are what the tests wait for;
                    // here they would only cost it time.
                    .env("LOGGING_LEVEL_BILLING_PEER", "WARN");
                cmd
            }
        };
        let file = std::fs::File::create(log)?;
        cmd.stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file);
        cmd.spawn().with_context(|| format!("cannot start {}", crate::process::show(&cmd)))
    }
}

/// A fake provider process.
struct Provider {
    child: Child,
    url: String,
}

impl Provider {
    fn start(latency_ms: u64, transient_pct: u8) -> anyhow::Result<Provider> {
        let mut child = Command::new(release("fake-provider"))
            .args(["--latency", &format!("{latency_ms}ms"), "--transient-pct", &transient_pct.to_string()])
            .args(["--transient-max-failures", "1", "--seed", "7"])
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start the fake provider")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("stdout is piped")?).read_line(&mut line)?;
        let url = line.trim().strip_prefix("listening on ").context("the fake provider says where it listens")?;
        Ok(Provider { url: url.to_owned(), child })
    }

    /// Waits until `orders` orders are charged: (when the first was, when the last was).
    fn drain(&self, orders: usize, service: &mut Child, log: &Path) -> anyhow::Result<(Instant, Instant)> {
        let started = Instant::now();
        let mut first = None;
        loop {
            let charged = self.get("/requests")?.get("201").and_then(serde_json::Value::as_u64).unwrap_or(0);
            let now = Instant::now();
            if charged > 0 && first.is_none() {
                first = Some(now);
            }
            if charged as usize >= orders {
                return Ok((first.unwrap_or(now), now));
            }
            if let Some(status) = service.try_wait()? {
                bail!("the service ended ({status}) with {charged} orders charged; its log:\n{}", tail(log, 40));
            }
            if started.elapsed() > SCENARIO_LIMIT {
                bail!("{charged} of {orders} orders charged after {SCENARIO_LIMIT:?}; its log:\n{}", tail(log, 40));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The arrivals of every order asked more than once, in ms.
    fn arrivals(&self) -> anyhow::Result<Vec<Vec<i64>>> {
        let all = self.get("/arrivals")?;
        let orders = all.as_object().context("arrivals are an object")?;
        Ok(orders
            .values()
            .filter_map(|a| a.as_array()?.iter().map(serde_json::Value::as_i64).collect::<Option<Vec<i64>>>())
            .collect())
    }

    /// `GET path` as JSON, over HTTP/1.0 (one connection per request).
    fn get(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        let addr = self.url.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(addr)?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
        serde_json::from_str(body).with_context(|| format!("GET {path}: {answer}"))
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn release(binary: &str) -> PathBuf {
    crate::paths::target_dir().join("release").join(binary)
}

/// SIGTERM, then SIGKILL after 30 s.
fn stop(child: &mut Child) {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let ended = crate::process::wait_until(Duration::from_secs(30), || matches!(child.try_wait(), Ok(Some(_))));
    if !ended {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// The peak resident memory of process `pid` so far (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn print_table(rows: &[(u64, u8, Vec<Run>)], orders: usize, partitions: i32) {
    println!();
    println!(
        "billing-bin and Spring Kafka's @RetryableTopic side by side: {orders} orders over {partitions} partitions, \
         one Apache Kafka broker, ladder {SCHEDULE}"
    );
    println!(
        "{:<22} {:>12} {:>12} {:>8} {:>14} {:>14} {:>11} {:>11}",
        "provider", "billing-bin/s", "Spring/s", "ratio", "p99 late ours", "p99 late Spr.", "RSS ours", "RSS Spring"
    );
    let late = |ms: Option<f64>| ms.map_or("-".to_owned(), |ms| format!("{ms:.0} ms"));
    for (latency_ms, transient_pct, pair) in rows {
        let (ours, spring) = (&pair[0], &pair[1]);
        println!(
            "{:<22} {:>12.0} {:>12.0} {:>7.1}x {:>14} {:>14} {:>7.0} MiB {:>7.0} MiB",
            format!("{latency_ms} ms, {transient_pct}% transient"),
            ours.records_per_s,
            spring.records_per_s,
            ours.records_per_s / spring.records_per_s,
            late(ours.p99_late_ms),
            late(spring.p99_late_ms),
            ours.peak_rss_mib,
            spring.peak_rss_mib,
        );
    }
    println!();
    println!("records/s: from the first charge to the last (retried orders included), the provider's count;");
    println!("late: how long after its due time (failure answered + 1 s) a retried order's next request came;");
    println!("RSS: the service's peak resident memory (Spring: java -Xmx512m, the JVM's other defaults).");
}
