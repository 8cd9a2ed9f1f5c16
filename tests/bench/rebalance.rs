//! `rebalance <topic> <partitions> <records> <eager|cooperative|consumer> [static]`:
//! three listeners (three instances of a service) share the topic while
//! `records` records arrive at a steady rate; once all run, each in turn
//! is shut down and started again (a rolling restart). The handler takes a
//! few milliseconds, as a call to a provider would. Reported, from when
//! each source partition's records were handled:
//!
//! - `longest_pause_ms`: the longest time any partition handled nothing
//!   while it had records waiting (every partition receives a record every
//!   few milliseconds, so any longer gap is a pause);
//! - `departure_pause_ms` and `arrival_pause_ms`: the same, for the gaps
//!   that began while an instance was shutting down, and the others (an
//!   instance that started again takes partitions over);
//! - `paused_partition_s`: the sum, over partitions, of such gaps longer
//!   than [`PAUSE`];
//! - `redeliveries`: calls for records already handled.
//!
//! With `static`, each instance has a `group_instance_id` that its restart keeps.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::{TimeZone, Utc};
use integration::rskafka_client;
use retry_core::{HandlerError, PolicyConfig, RetryPolicy};
use retry_kafka::{
    AssignmentStrategy, ConsumedRecord, GroupProtocol, Listener, ListenerConfig, RecordHandler, TopicPlan,
};
use rskafka::{
    client::partition::{Compression, UnknownTopicHandling},
    record::Record,
};

/// A gap between two handled records of a partition longer than this is
/// counted as paused: records arrive on every partition every
/// [`PRODUCE_EVERY`], and the handler takes [`CALL`].
const PAUSE: Duration = Duration::from_millis(250);
const PRODUCE_EVERY: Duration = Duration::from_millis(20);
const CALL: Duration = Duration::from_millis(2);
/// How long before a shutdown began a gap that it caused may begin: a
/// partition's last record before it was handled within a production tick.
const DEPARTURE_SLACK: Duration = Duration::from_millis(100);
/// How long every instance runs before the next restart.
const SETTLE: Duration = Duration::from_secs(4);

/// Records when each record was handled, and how often.
#[derive(Default)]
struct Timeline {
    handled: Mutex<Vec<(i32, i64, Instant)>>,
}

impl RecordHandler for Timeline {
    async fn handle(&self, record: ConsumedRecord) -> Result<(), HandlerError> {
        tokio::time::sleep(CALL).await;
        self.handled.lock().unwrap().push((record.partition, record.offset, Instant::now()));
        Ok(())
    }
}

pub(crate) async fn rebalance(topic: &str, partitions: i32, records: usize, mode: &str, fixed: bool) -> String {
    let topology = crate::topology(topic);
    TopicPlan::new(topology.clone(), partitions).create(&crate::connection(), true).await.expect("create topics");
    let group = format!("{topic}-{mode}");
    let config = |instance: usize| {
        let policy = RetryPolicy::new(topology.clone(), PolicyConfig::default());
        let mut c = ListenerConfig::new(crate::connection(), &group, policy).expect("a valid group id");
        // The same pace for both protocols: the broker's consumer groups
        // heartbeat every 500 ms in `cargo xtask bench --rebalance`.
        c.session_timeout = Duration::from_secs(6);
        c.heartbeat_interval = Duration::from_millis(500);
        c.rebalance_timeout = Duration::from_secs(20);
        c.handler_timeout = Duration::from_secs(2);
        c.shutdown_grace = Duration::from_secs(2);
        c.commit_interval = Duration::from_millis(200);
        (c.group_protocol, c.assignment_strategy) = match mode {
            "eager" => (GroupProtocol::Classic, AssignmentStrategy::Range),
            "cooperative" => (GroupProtocol::Classic, AssignmentStrategy::CooperativeSticky),
            "consumer" => (GroupProtocol::Consumer, AssignmentStrategy::Range),
            other => panic!("a mode is eager, cooperative or consumer, not {other}"),
        };
        if fixed {
            c.group_instance_id = Some(format!("{group}-{instance}"));
        }
        c
    };
    let timeline = Arc::new(Timeline::default());
    let start = |instance: usize| {
        let (config, timeline) = (config(instance), timeline.clone());
        async move {
            let listener = Listener::start(config, timeline).await.expect("listener");
            while !listener.is_ready() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            listener
        }
    };
    let mut instances = Vec::new();
    for i in 0..3 {
        instances.push((i, start(i).await));
    }

    // A steady stream over every partition, for as long as the restarts
    // take and a little more.
    let produced = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let producer = {
        let (topic, produced) = (topic.to_owned(), produced.clone());
        tokio::spawn(async move {
            let client = rskafka_client().await;
            let mut clients = Vec::new();
            for p in 0..partitions {
                clients.push(client.partition_client(&topic, p, UnknownTopicHandling::Retry).await.unwrap());
            }
            // About 35 s of records: the restarts take about 25.
            let per_tick = (records / (1750 * partitions as usize)).max(1);
            let mut tick = tokio::time::interval(PRODUCE_EVERY);
            let mut sent = 0;
            while sent < records {
                tick.tick().await;
                for (p, pc) in clients.iter().enumerate() {
                    let n = per_tick.min(records - sent);
                    if n == 0 {
                        break;
                    }
                    let batch: Vec<Record> = (0..n)
                        .map(|i| Record {
                            key: Some(format!("order-{p}-{}", sent + i).into_bytes()),
                            value: Some(b"{}".to_vec()),
                            headers: Default::default(),
                            timestamp: Utc.timestamp_millis_opt(crate::now_ms()).unwrap(),
                        })
                        .collect();
                    pc.produce(batch, Compression::NoCompression).await.unwrap();
                    sent += n;
                    produced.store(sent, std::sync::atomic::Ordering::Relaxed);
                }
            }
        })
    };
    tokio::time::sleep(SETTLE).await;
    let restarts_began = Instant::now();
    let mut departures = Vec::new();
    for _ in 0..3 {
        let (i, oldest) = instances.remove(0);
        let began = Instant::now();
        oldest.shutdown().await;
        departures.push((began, Instant::now()));
        instances.push((i, start(i).await));
        tokio::time::sleep(SETTLE).await;
    }
    let restarts_ended = Instant::now();
    producer.await.unwrap();
    let total = produced.load(std::sync::atomic::Ordering::Relaxed);
    let drained = Instant::now();
    loop {
        let unique = timeline.handled.lock().unwrap().iter().map(|(p, o, _)| (*p, *o)).collect::<HashSet<_>>().len();
        if unique >= total {
            break;
        }
        assert!(drained.elapsed() < Duration::from_secs(120), "only {unique} of {total} records handled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (_, listener) in instances {
        listener.shutdown().await;
    }

    let handled = timeline.handled.lock().unwrap().clone();
    let unique = handled.iter().map(|(p, o, _)| (*p, *o)).collect::<HashSet<_>>().len();
    let mut by_partition: BTreeMap<i32, Vec<Instant>> = BTreeMap::new();
    for (p, _, at) in &handled {
        by_partition.entry(*p).or_default().push(*at);
    }
    // A departing instance's last records were handled a moment before
    // its shutdown began.
    let departing = |at: Instant| departures.iter().any(|(began, done)| at + DEPARTURE_SLACK >= *began && at <= *done);
    let (mut longest, mut paused) = (Duration::ZERO, Duration::ZERO);
    let (mut departure, mut arrival) = (Duration::ZERO, Duration::ZERO);
    for times in by_partition.values_mut() {
        times.sort();
        for pair in times.windows(2) {
            // Gaps from the restarts on: before them nothing moved.
            if pair[1] < restarts_began {
                continue;
            }
            let gap = pair[1] - pair[0];
            longest = longest.max(gap);
            let phase = if departing(pair[0]) { &mut departure } else { &mut arrival };
            *phase = (*phase).max(gap);
            if gap > PAUSE {
                paused += gap;
            }
        }
    }
    format!(
        "longest_pause_ms={} departure_pause_ms={} arrival_pause_ms={} paused_partition_s={:.2} redeliveries={} handled={} restarts_s={:.1}",
        longest.as_millis(),
        departure.as_millis(),
        arrival.as_millis(),
        paused.as_secs_f64(),
        handled.len() - unique,
        unique,
        (restarts_ended - restarts_began).as_secs_f64()
    )
}
