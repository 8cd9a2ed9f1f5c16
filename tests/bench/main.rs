//! The pipeline benchmark, run by `cargo xtask bench` (release build, one
//! process per scenario so each reports its own peak memory):
//!
//! - `raw <topic> <partitions> <records>`: the ceiling: rskafka produce and
//!   fetch of the same records, no pipeline;
//! - `raw-headers <topic> <partitions> <records>`: the same with the 11
//!   headers a retried record carries;
//! - `probe <topic> <partition> <max-bytes>`: one fetch, timed;
//! - `fill-and-drain <topic> <partitions> <records> ...`: `raw`, then
//!   `pipeline` with the same arguments (one broker per scenario);
//! - `pipeline <topic> <partitions> <records> <failure-percent> [latency]
//!   [max-in-flight] [polled|spawned]`: a listener drains the source topic
//!   with a handler that takes `latency` (`0`, `50ms`, or a mix like
//!   `10-200ms`) and fails transiently for the given share of records (on
//!   the source topic only), `max-in-flight` records per partition at once
//!   (default 64; 1 is the sequential consumer), its calls polled by the
//!   partition's worker (the default) or each in a task of its own. Its
//!   rate is timed from the first handled record (the group joins before it
//!   are reported apart, as `join_ms`).
//!
//! - `orders <topic> <partitions> <records>`: `OrderConfirmed` events,
//!   keyed by order id, into the source topic (created when missing), for
//!   the billing services of `cargo xtask bench --peer spring`;
//! - `create <topic> <partitions> 0`: the ladder's topics, for a foreign
//!   producer to fill;
//! - `fetch <topic> <partitions> <records>`: rskafka's fetch of what is
//!   there, timed;
//! - `rebalance <topic> <partitions> <records> <eager|cooperative|consumer>
//!   [static]`: a rolling restart of three instances (see `rebalance.rs`).
//!
//! Each prints one line of `key=value` figures for xtask to tabulate.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    time::{Duration, Instant},
};

use chrono::{TimeZone, Utc};
use integration::{broker_addr, rskafka_client};
use retry_core::{HandlerError, PolicyConfig, RetryPolicy, RetrySchedule, RetryTopology};
use retry_kafka::{
    ConnectionConfig, ConsumedRecord, GroupOffsets, HandlerCalls, Listener, ListenerConfig, RecordHandler,
    TopicPartition, TopicPlan,
};
use rskafka::{
    client::partition::{Compression, UnknownTopicHandling},
    record::Record,
};

mod rebalance;

const VALUE_BYTES: usize = 256;
const PRODUCE_BATCH: usize = 500;

#[tokio::main]
async fn main() {
    // Quiet unless asked (RUST_LOG=warn shows why a scenario slowed); on
    // stderr, beside the figures xtask reads from stdout.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG") {
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| {
        args.get(i)
            .unwrap_or_else(|| panic!("usage: bench raw|pipeline <topic> <partitions> <records> [failure-percent]"))
    };
    let topic = arg(1).clone();
    let partitions: i32 = arg(2).parse().expect("partitions");
    let records: usize = arg(3).parse().expect("records");
    let line = match arg(0).as_str() {
        "raw" => raw(&topic, partitions, records, 0, Traced::No).await,
        // Records carrying as many headers as a retried record: what the
        // broker can take for republication.
        "raw-headers" => raw(&topic, partitions, records, retry_core::header_names::ALL.len(), Traced::No).await,
        // One process per broker: fill the topics, then drain them.
        "fill-and-drain" | "fill-traced-and-drain" => {
            let traced = if arg(0) == "fill-traced-and-drain" { Traced::Yes } else { Traced::No };
            raw(&topic, partitions, records, 0, traced).await;
            let latency = Latency::parse(args.get(5).map_or("0", String::as_str));
            let max_in_flight = args.get(6).map_or(64, |m| m.parse().expect("max in flight"));
            let failure_percent = arg(4).parse().expect("failure percent");
            pipeline(&topic, partitions, records, failure_percent, latency, max_in_flight, HandlerCalls::Polled).await
        }
        "pipeline" => {
            let latency = Latency::parse(args.get(5).map_or("0", String::as_str));
            let max_in_flight = args.get(6).map_or(64, |m| m.parse().expect("max in flight"));
            let failure_percent = arg(4).parse().expect("failure percent");
            let calls = match args.get(7).map(String::as_str) {
                None | Some("polled") => HandlerCalls::Polled,
                Some("spawned") => HandlerCalls::Spawned,
                Some(other) => panic!("calls are polled or spawned, not {other}"),
            };
            pipeline(&topic, partitions, records, failure_percent, latency, max_in_flight, calls).await
        }
        "probe" => probe(&topic, partitions, records as i32).await,
        "rebalance" => {
            let fixed = args.get(5).is_some_and(|s| s == "static");
            rebalance::rebalance(&topic, partitions, records, arg(4), fixed).await
        }
        "orders" => orders(&topic, partitions, records).await,
        // The ladder's topics, for a foreign producer to fill.
        "create" => {
            TopicPlan::new(topology(&topic), partitions).create(&connection(), true).await.expect("create topics");
            "created=1".to_owned()
        }
        // Only rskafka's fetch of what is there: the raw ceiling.
        "fetch" => {
            let per_partition = records / partitions as usize;
            let fetch = fetch_all(&topic, partitions, per_partition).await;
            format!("fetch_per_s={:.0}", rate(per_partition * partitions as usize, fetch))
        }
        other => panic!("unknown scenario {other}"),
    };
    println!("{line} peak_rss_kib={}", peak_rss_kib());
}

fn topology(topic: &str) -> RetryTopology {
    // One long rung: the benchmark measures the source topic's drain, and
    // retried records are not due during it.
    let schedule: RetrySchedule = "10m".parse().unwrap();
    RetryTopology::new(topic, &schedule).unwrap()
}

fn connection() -> ConnectionConfig {
    ConnectionConfig::new(&broker_addr(), "kafka-retry-bench").unwrap()
}

/// Creates the ladder's topics and fills the source: `records` records
/// spread evenly over the partitions. Returns produce throughput.
/// Whether each record carries a `traceparent` (a trace of its own), as
/// an instrumented producer writes it.
#[derive(Clone, Copy)]
enum Traced {
    No,
    Yes,
}

impl Traced {
    fn traceparent(self, partition: i32, i: usize) -> Option<(String, Vec<u8>)> {
        match self {
            Traced::No => None,
            Traced::Yes => {
                let value = format!("00-{:016x}{:016x}-{:016x}-01", partition + 1, i + 1, i + 1);
                Some(("traceparent".to_owned(), value.into_bytes()))
            }
        }
    }
}

async fn raw(topic: &str, partitions: i32, records: usize, header_count: usize, traced: Traced) -> String {
    TopicPlan::new(topology(topic), partitions).create(&connection(), true).await.expect("create topics");
    let client = rskafka_client().await;
    let value = vec![b'x'; VALUE_BYTES];
    let started = Instant::now();
    let per_partition = records / partitions as usize;
    let stamp = record_time();
    let mut tasks = Vec::new();
    for p in 0..partitions {
        let pc = client.partition_client(topic, p, UnknownTopicHandling::Retry).await.unwrap();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut sent = 0;
            while sent < per_partition {
                let n = PRODUCE_BATCH.min(per_partition - sent);
                let batch: Vec<Record> = (sent..sent + n)
                    .map(|i| Record {
                        key: Some(format!("key-{p}-{i}").into_bytes()),
                        value: Some(value.clone()),
                        headers: (0..header_count)
                            .map(|h| (format!("x-header-{h}"), b"1700000000000".to_vec()))
                            .chain(traced.traceparent(p, i))
                            .collect(),
                        // Now: a record older than the topic's retention
                        // would be deleted under the scenario by the
                        // broker's next retention check.
                        timestamp: Utc.timestamp_millis_opt(stamp).unwrap(),
                    })
                    .collect();
                pc.produce(batch, Compression::NoCompression).await.unwrap();
                sent += n;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let produce = started.elapsed();
    let fetch = fetch_all(topic, partitions, per_partition).await;
    let total = per_partition * partitions as usize;
    format!("produce_per_s={:.0} fetch_per_s={:.0}", rate(total, produce), rate(total, fetch))
}

/// Fills `topic` (created when missing) with `records` `OrderConfirmed`
/// events spread evenly over its partitions, each keyed by its order id and
/// stamped now (inside any idempotency window). Returns produce throughput.
async fn orders(topic: &str, partitions: i32, records: usize) -> String {
    let client = rskafka_client().await;
    let controller = client.controller_client().expect("a controller client");
    match controller.create_topic(topic, partitions, 1, 10_000).await {
        Ok(())
        | Err(rskafka::client::error::Error::ServerError {
            protocol_error: rskafka::client::error::ProtocolError::TopicAlreadyExists,
            ..
        }) => {}
        Err(e) => panic!("cannot create {topic}: {e}"),
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..partitions {
        let pc = client.partition_client(topic, p, UnknownTopicHandling::Retry).await.unwrap();
        // Exactly `records`: the first partitions take the remainder.
        let share = records / partitions as usize + usize::from((p as usize) < records % partitions as usize);
        tasks.push(tokio::spawn(async move {
            let mut sent = 0;
            while sent < share {
                let n = PRODUCE_BATCH.min(share - sent);
                let batch: Vec<Record> = (0..n)
                    .map(|_| {
                        let order = uuid::Uuid::new_v4();
                        let event = format!(
                            r#"{{"event_id":"{}","order_id":"{order}","customer_id":"{}","total_amount":"120.50"}}"#,
                            uuid::Uuid::new_v4(),
                            uuid::Uuid::new_v4()
                        );
                        Record {
                            key: Some(order.to_string().into_bytes()),
                            value: Some(event.into_bytes()),
                            headers: Default::default(),
                            timestamp: Utc.timestamp_millis_opt(now_ms()).unwrap(),
                        }
                    })
                    .collect();
                pc.produce(batch, Compression::NoCompression).await.unwrap();
                sent += n;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    format!("produce_per_s={:.0}", rate(records, started.elapsed()))
}

/// When the records the scenarios fill their topics with say they were
/// written: now, unless `$BENCH_RECORD_TIME` (ms since the epoch) says
/// otherwise, as it does to show what retention makes of old records.
fn record_time() -> i64 {
    std::env::var("BENCH_RECORD_TIME").ok().and_then(|t| t.parse().ok()).unwrap_or_else(now_ms)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// How long rskafka takes to fetch `per_partition` records of each partition.
async fn fetch_all(topic: &str, partitions: i32, per_partition: usize) -> Duration {
    let client = rskafka_client().await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..partitions {
        let pc = client.partition_client(topic, p, UnknownTopicHandling::Retry).await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut offset = 0;
            let mut n = 0usize;
            while n < per_partition {
                let (records, _) = pc.fetch_records(offset, 1..1 << 20, 500).await.unwrap();
                let from = offset;
                for r in records.into_iter().filter(|r| r.offset >= from) {
                    offset = r.offset + 1;
                    n += 1;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    started.elapsed()
}

/// How long the benchmark's handler takes per record.
#[derive(Debug, Clone, Copy)]
enum Latency {
    /// Always this long.
    Fixed(Duration),
    /// Spread evenly (by a fixed sequence) between the two, in ms.
    Mix(u64, u64),
}

impl Latency {
    fn parse(s: &str) -> Latency {
        if s == "0" {
            return Latency::Fixed(Duration::ZERO);
        }
        match s.strip_suffix("ms").and_then(|r| r.split_once('-')) {
            Some((low, high)) => Latency::Mix(low.parse().expect("latency low"), high.parse().expect("latency high")),
            None => Latency::Fixed(retry_core::parse_duration(s).expect("a latency like 50ms")),
        }
    }

    fn of(self, n: u64) -> Duration {
        match self {
            Latency::Fixed(d) => d,
            Latency::Mix(low, high) => Duration::from_millis(low + (n * 7919) % (high - low + 1)),
        }
    }
}

/// Takes its latency, then succeeds, except for `failure_percent` of the
/// source topic's records, which fail transiently (and go to the retry rung).
struct Bench {
    failure_percent: u64,
    latency: Latency,
    handled: AtomicU64,
    first_handled: std::sync::OnceLock<Instant>,
    /// How many source records the scenario has.
    records: u64,
    /// Calls for source records (first attempts) that ended.
    source_ended: AtomicU64,
    /// When the last source record's call ended.
    all_handled: std::sync::OnceLock<Instant>,
    /// First calls that failed: their records go to the rung.
    failed: AtomicU64,
    /// Per partition and offset of the source, whether a first call of
    /// that record ended: the group must commit no offset above one that
    /// has not.
    ended: Vec<Vec<std::sync::atomic::AtomicBool>>,
}

impl RecordHandler for Bench {
    async fn handle(&self, record: ConsumedRecord) -> Result<(), HandlerError> {
        self.first_handled.get_or_init(Instant::now);
        let n = self.handled.fetch_add(1, Relaxed);
        let latency = self.latency.of(n);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let source = record.attempt == 1;
        if source {
            let ended = usize::try_from(record.partition)
                .ok()
                .and_then(|p| self.ended.get(p))
                .and_then(|p| usize::try_from(record.offset).ok().and_then(|o| p.get(o)));
            // Before the call returns: its commit can only come after.
            if let Some(ended) = ended {
                ended.store(true, std::sync::atomic::Ordering::Release);
            }
            if self.source_ended.fetch_add(1, Relaxed) + 1 == self.records {
                self.all_handled.get_or_init(Instant::now);
            }
        }
        if source && (n * 7919) % 100 < self.failure_percent {
            self.failed.fetch_add(1, Relaxed);
            return Err(HandlerError::transient("benchmark failure"));
        }
        Ok(())
    }
}

impl Bench {
    /// The offsets of `partition` from `from` to below `to` whose first
    /// call has not ended, as ranges.
    fn unended(&self, partition: usize, from: i64, to: i64) -> Vec<(i64, i64)> {
        let mut ranges: Vec<(i64, i64)> = Vec::new();
        for offset in from.max(0)..to {
            let ended = self.ended[partition]
                .get(offset as usize)
                .is_some_and(|e| e.load(std::sync::atomic::Ordering::Acquire));
            if ended {
                continue;
            }
            match ranges.last_mut() {
                Some((_, end)) if *end == offset => *end = offset + 1,
                _ => ranges.push((offset, offset + 1)),
            }
        }
        ranges
    }
}

/// The listener's counters that tell why a scenario went wrong.
fn counters(stats: &retry_kafka::StatsSnapshot) -> String {
    format!(
        "offset_resets={} positions_kept={} handler_timeouts={} rebalances={} fetch_failures={} \
         publish_failures={} commit_failures={} worker_failures={}",
        stats.offset_resets,
        stats.positions_kept,
        stats.handler_timeouts,
        stats.rebalances,
        stats.fetch_failures,
        stats.publish_failures,
        stats.commit_failures,
        stats.worker_failures
    )
}

/// A listener drains `topic` (see the module's `pipeline`), its calls run
/// as `calls` says, in a group of its own for each, so one topic can be
/// drained both ways. Every reading of the group's committed offsets is
/// checked: no offset is committed above a record whose first call had not
/// ended (the scenario fails, with the listener's counters, if one is).
async fn pipeline(
    topic: &str,
    partitions: i32,
    records: usize,
    failure_percent: u64,
    latency: Latency,
    max_in_flight: usize,
    calls: HandlerCalls,
) -> String {
    let connection = connection();
    let group = format!("{topic}-bench-{failure_percent}-{calls:?}").to_lowercase();
    let policy = RetryPolicy::new(topology(topic), PolicyConfig::default());
    let mut config = ListenerConfig::new(connection.clone(), &group, policy).expect("a valid group id");
    config.window =
        retry_core::window::WindowConfig::new(max_in_flight, retry_core::window::NullKeys::Ordered).expect("window");
    config.handler_calls = calls;
    let per_partition = records / partitions as usize;
    let handler = Arc::new(Bench {
        failure_percent,
        latency,
        handled: AtomicU64::new(0),
        first_handled: std::sync::OnceLock::new(),
        records: (per_partition * partitions as usize) as u64,
        source_ended: AtomicU64::new(0),
        all_handled: std::sync::OnceLock::new(),
        failed: AtomicU64::new(0),
        ended: (0..partitions)
            .map(|_| (0..per_partition).map(|_| std::sync::atomic::AtomicBool::new(false)).collect())
            .collect(),
    });
    let started = Instant::now();
    let listener = Listener::start(config, handler.clone()).await.expect("listener");
    // Settled: every source record's first call ended, and the broker
    // acknowledged the republication of every one that failed.
    let settled = tokio::spawn({
        let (handler, stats) = (handler.clone(), listener.stats().clone());
        async move {
            loop {
                let snapshot = stats.snapshot();
                let republished = snapshot.retried + snapshot.dead_lettered;
                if handler.all_handled.get().is_some() && republished >= handler.failed.load(Relaxed) {
                    return Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    // Drained: the source group committed every record.
    let tps: Vec<TopicPartition> = (0..partitions).map(|p| TopicPartition::new(topic, p)).collect();
    let mut offsets = GroupOffsets::new(connection, &group);
    let per_partition = per_partition as i64;
    // Per partition, the offset below which every committed record was checked.
    let mut checked = vec![0i64; partitions as usize];
    loop {
        match offsets.committed(&tps).await {
            Ok(committed) => {
                for (tp, offset) in &committed {
                    let (p, Some(offset)) = (tp.partition as usize, *offset) else { continue };
                    let unended = handler.unended(p, checked[p], offset);
                    if !unended.is_empty() {
                        let stats = listener.stats().snapshot();
                        panic!(
                            "the group committed {topic}/{p} at {offset}, above records whose first call had not \
                             ended: {unended:?} ({} of {} first calls ended; {})",
                            handler.source_ended.load(Relaxed),
                            handler.records,
                            counters(&stats)
                        );
                    }
                    checked[p] = checked[p].max(offset);
                }
                if committed.values().all(|o| *o == Some(per_partition)) {
                    break;
                }
            }
            // A busy broker may answer late; the drain goes on meanwhile.
            Err(e) => eprintln!("reading committed offsets: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = *handler.first_handled.get().expect("records were handled");
    let elapsed = first.elapsed();
    let stats = listener.stats().snapshot();
    let Some(&all_handled) = handler.all_handled.get() else {
        panic!(
            "the group committed every record, yet only {} of {} first calls ended ({} calls in all; {})",
            handler.source_ended.load(Relaxed),
            handler.records,
            handler.handled.load(Relaxed),
            counters(&stats)
        )
    };
    let join = first.duration_since(started);
    let settled = settled.await.expect("the settled watch does not panic");
    listener.shutdown().await;
    let total = per_partition as usize * partitions as usize;
    format!(
        "drain_per_s={:.0} handled_per_s={:.0} settled_per_s={:.0} commit_tail_ms={} join_ms={} handled={} \
         retried={} {}",
        rate(total, elapsed),
        rate(total, all_handled.duration_since(first)),
        rate(total, settled.duration_since(first)),
        (elapsed - all_handled.duration_since(first)).as_millis(),
        join.as_millis(),
        handler.handled.load(Relaxed),
        stats.retried,
        counters(&stats)
    )
}

/// One fetch of partition `partition` from offset 0 with `max_bytes`: how
/// many records come back and how long it takes.
async fn probe(topic: &str, partition: i32, max_bytes: i32) -> String {
    let client = rskafka_client().await;
    let pc = client.partition_client(topic, partition, UnknownTopicHandling::Retry).await.unwrap();
    let started = Instant::now();
    let (records, high_watermark) = pc.fetch_records(0, 1..max_bytes, 500).await.unwrap();
    let first = started.elapsed();
    let started = Instant::now();
    let (empty, _) = pc.fetch_records(high_watermark, 1..max_bytes, 500).await.unwrap();
    format!(
        "records={} high_watermark={high_watermark} fetch_ms={} empty_fetch_ms={} empty={}",
        records.len(),
        first.as_millis(),
        started.elapsed().as_millis(),
        empty.len()
    )
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// The process's peak resident set (VmHWM), in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
