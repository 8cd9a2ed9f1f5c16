//! `demo`: the billing service end to end, run by `cargo xtask demo`, which
//! sets `$KAFKA_RETRY_BROKERS` (a broker) and `$BILLING_BIN` (the billing-bin
//! binary). Flags: `--events N`, `--seed S` (replays a run), `--timeout 180s`.
//!
//! It starts the fake billing provider with a mix of faults (transient
//! outages, declined cards, answers slower than the service's provider
//! timeout), creates a fresh ladder of topics with `billing-bin topics create`,
//! produces a few hundred OrderConfirmed events (amounts as JSON strings and
//! numbers, and a few invalid ones), and runs `billing-bin run` on them while
//! it prints progress every second. Once every event is accounted for, it
//! stops the service with SIGTERM and prints where each event ended up.
//!
//! It fails (exit status 1) when an event was charged twice, charged and
//! dead-lettered, charged wrongly (amount, customer, idempotency key) or not
//! at all accounted for within the timeout, or when the service does not
//! stop cleanly. Outcomes that differ from what the fault plan predicts
//! (e.g. a transient outage dead-lettered) are reported, not failed: they
//! depend on the service's classification, which its own tests pin down.

use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, ExitStatus, Stdio},
    str::FromStr,
    time::{Duration, Instant},
};

use chrono::{TimeZone, Utc};
use clap::Parser;
use integration::{
    broker_addr,
    fake_provider::{Charge, FakeProvider, Faults, OrderFault},
    rskafka_client, within,
};
use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};
use retry_core::{groups::LadderGroups, header_names, RetrySchedule, RetryTopology};
use retry_kafka::{ConnectionConfig, GroupOffsets, TopicPartition};
use rskafka::{
    client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling},
    record::Record,
};
use rust_decimal::Decimal;

#[derive(Parser)]
#[command(name = "demo", about = "The billing service end to end against a faulty fake provider")]
struct Args {
    /// How many events to produce.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(10..=100_000))]
    events: u32,
    /// Seeds the events and the provider's faults (default: random, printed so a run can be replayed).
    #[arg(long)]
    seed: Option<u64>,
    /// How long the events may take to be accounted for before the demo fails.
    #[arg(long, default_value = "180s", value_parser = retry_core::parse_duration)]
    timeout: Duration,
    /// How long every provider answer takes at least (e.g. 50ms).
    #[arg(long, default_value = "0s", value_parser = retry_core::parse_duration)]
    latency: Duration,
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
    /// How long the provider is down (every call answered 503) in the
    /// middle of the run, for the outage brake to engage and release; 0s
    /// for no outage.
    #[arg(long, default_value = "20s", value_parser = retry_core::parse_duration)]
    outage: Duration,
    /// When the outage begins, from the service's start.
    #[arg(long, default_value = "2s", value_parser = retry_core::parse_duration)]
    outage_at: Duration,
    /// billing-bin's BILLING_BRAKE: `on` (its default) or `off`, to see the
    /// outage fill the dead-letter topic instead.
    #[arg(long, default_value = "on")]
    brake: String,
    /// Keep billing-bin running once the demo is done, with its operators'
    /// console open (its address and token are printed), until Ctrl-C.
    #[arg(long)]
    console: bool,
}

/// Partitions of every topic of the ladder.
const PARTITIONS: i32 = 3;
/// Short delays, so that a run takes seconds.
const RETRY_SCHEDULE: &str = "1s,2s,4s";
/// The service's provider timeout; slow answers take longer.
const PROVIDER_TIMEOUT: &str = "2s";
/// How late the provider answers a slow order's first request: past [`PROVIDER_TIMEOUT`].
const SLOW_ANSWER: Duration = Duration::from_secs(3);
/// How long a one-shot command (`topics create`) may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the service may take to stop after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(15);
/// How many problems (or deviations from the plan) to list one by one.
const MAX_LISTED: usize = 30;
/// How long to wait, once every event is accounted for, for the consumer
/// groups to commit everything (retries that will only meet a 409).
const SETTLE_GRACE: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| rand::thread_rng().gen());
    let billing_bin = match std::env::var_os("BILLING_BIN") {
        Some(bin) if !bin.is_empty() => PathBuf::from(bin),
        _ => {
            eprintln!("error: BILLING_BIN is not set: run the demo with `cargo xtask demo`, which builds billing-bin");
            return ExitCode::FAILURE;
        }
    };
    let brokers = broker_addr();
    let run_id: u32 = rand::thread_rng().gen();
    let source = format!("demo-{run_id:08x}.orders.confirmed");
    let group = format!("demo-{run_id:08x}.billing");
    let schedule: RetrySchedule = RETRY_SCHEDULE.parse().expect("the demo's schedule is valid");
    let topology = RetryTopology::new(&source, &schedule).expect("the demo's topic names are valid");

    let faults = Faults {
        transient_pct: args.transient_pct,
        // Up to as many failures as the ladder has attempts: some exhaust it.
        transient_max_failures: schedule.max_attempts(),
        permanent_pct: args.permanent_pct,
        slow_pct: args.slow_pct,
        slow: SLOW_ANSWER,
        seed,
        latency: args.latency,
        key_ttl: None,
    };
    if let Err(e) = faults.validate() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let provider = FakeProvider::start(faults.clone()).await;
    println!("seed {seed} (replay with `cargo xtask demo --seed {seed}`)");
    println!("fake billing provider at {}: {faults:?}", provider.url());

    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "127.0.0.1:18080".into());
    let operators = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "127.0.0.1:18081".into());
    // A token for this run only, printed for the person watching.
    let token = format!("demo-{}", uuid::Uuid::new_v4().simple());
    println!("operators' console: http://{operators}/console (token {token}, for this run only)");
    let env: Vec<(&str, String)> = vec![
        ("ADMIN_TOKEN", token.clone()),
        ("OPERATOR_LISTEN", operators.clone()),
        ("KAFKA_BROKERS", brokers.clone()),
        ("BILLING_TOPIC", source.clone()),
        ("BILLING_GROUP_ID", group.clone()),
        ("RETRY_SCHEDULE", RETRY_SCHEDULE.into()),
        ("BILLING_PROVIDER_URL", provider.url()),
        ("BILLING_PROVIDER_TIMEOUT", PROVIDER_TIMEOUT.into()),
        ("ADMIN_LISTEN", admin.clone()),
        ("BILLING_BRAKE", args.brake.clone()),
        // A demo's worth of calls: the brake engages on fewer of them,
        // sooner, and probes more often than the defaults do.
        ("BILLING_BRAKE_WINDOW", "10s".into()),
        ("BILLING_BRAKE_MIN_CALLS", "10".into()),
        ("BILLING_BRAKE_PROBE_PAUSE", "1s".into()),
        ("BILLING_BRAKE_PROBE_PAUSE_MAX", "4s".into()),
        // Events left after the outage are mostly those the provider fails
        // on purpose: one good probe is enough here.
        ("BILLING_BRAKE_RESUME_AFTER", "1".into()),
    ];
    let mut env = env;
    if let Some(max_in_flight) = args.max_in_flight {
        env.push(("BILLING_MAX_IN_FLIGHT", max_in_flight.to_string()));
    }
    let mut create = Command::new(&billing_bin);
    create.args(["topics", "create", "--partitions", &PARTITIONS.to_string()]).envs(env.iter().cloned());
    if let Err(e) = run_to_completion(&mut create, COMMAND_TIMEOUT) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }

    let events = Event::generate(args.events as usize, &mut StdRng::seed_from_u64(seed));
    let client = rskafka_client().await;
    // With an outage, half the events come while the provider is down: the
    // brake judges the provider by first attempts, and needs fresh ones.
    let first = if args.outage > Duration::ZERO { events.len() / 2 } else { events.len() };
    produce(&client, &source, &events[..first]).await;
    let invalid = events.iter().filter(|e| !e.case.is_valid()).count();
    println!("produced {first} of {} events to {source} ({invalid} invalid in all)", events.len());

    let log = std::env::temp_dir().join(format!("{group}.billing-bin.log"));
    let mut service = Service::spawn(&billing_bin, &env, &log);
    println!("billing-bin run (pid {}) logs to {}", service.child.id(), log.display());

    let mut ladder = Ladder::open(&client, &brokers, &group, topology).await;
    let mut problems = Vec::new();
    let started = Instant::now();
    let mut accounted_since = None;
    let mut first_charge: Option<Instant> = None;
    let mut all_accounted: Option<Instant> = None;
    let outage = (args.outage > Duration::ZERO).then(|| (args.outage_at, args.outage_at + args.outage));
    let mut down = false;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Some((begins, ends)) = outage {
            let now = started.elapsed();
            if !down && now >= begins && now < ends {
                down = true;
                provider.set_down(true);
                produce(&client, &source, &events[first..]).await;
                println!(
                    "provider outage: every call answered 503 for {:?}; produced the other {} events",
                    args.outage,
                    events.len() - first
                );
            } else if down && now >= ends {
                down = false;
                provider.set_down(false);
                println!("provider back");
            }
        }
        let brake = brake_state(&admin, &source).await;
        let progress = ladder.progress().await;
        let ledger = provider.ledger();
        let accounted = events.iter().filter(|e| e.accounted(&ledger, &ladder.dead_letters)).count();
        if !ledger.is_empty() {
            first_charge.get_or_insert_with(Instant::now);
        }
        if accounted == events.len() {
            all_accounted.get_or_insert_with(Instant::now);
        }
        println!(
            "[{:>4}s] accounted {accounted}/{} | charged {} | {} | brake {brake} | provider {}{}",
            started.elapsed().as_secs(),
            events.len(),
            ledger.len(),
            progress.describe(),
            if down { "DOWN " } else { "" },
            statuses(&provider.requests()),
        );
        if let Some(status) = service.exited() {
            problems.push(format!("billing-bin exited by itself ({status}); its log ends with:\n{}", tail(&log, 20)));
            break;
        }
        if accounted == events.len() {
            let since = *accounted_since.get_or_insert_with(Instant::now);
            if progress.settled() {
                break;
            }
            if since.elapsed() > SETTLE_GRACE {
                println!("every event is accounted for, but the consumer groups still lag after {SETTLE_GRACE:?}");
                break;
            }
        }
        if started.elapsed() > args.timeout {
            problems.push(format!(
                "after {:?}, {} events are not accounted for",
                args.timeout,
                events.len() - accounted
            ));
            break;
        }
    }

    if let (Some(first), Some(last)) = (first_charge, all_accounted) {
        // Polled every second: a rough figure, for runs of some length.
        let took = last.duration_since(first).max(Duration::from_secs(1));
        println!(
            "throughput: {} events accounted for in about {:.0} s from the first charge: about {:.0} events/s \
             (provider latency {:?}, max in flight {})",
            events.len(),
            took.as_secs_f64(),
            events.len() as f64 / took.as_secs_f64(),
            args.latency,
            args.max_in_flight.map_or("billing-bin's default".to_owned(), |m| m.to_string())
        );
    }
    if args.console {
        println!(
            "\nthe demo is done; billing-bin keeps running with its dead letters for the console:\n  \
             http://{operators}/console (token {token})\npress Ctrl-C to stop it"
        );
        let _ = tokio::signal::ctrl_c().await;
    }
    match service.stop().await {
        Ok(status) if status.success() => println!("billing-bin stopped on SIGTERM ({status})"),
        Ok(status) => problems.push(format!("billing-bin did not exit cleanly on SIGTERM ({status})")),
        Err(e) => problems.push(e),
    }
    ladder.read_dead_letters().await;

    let report = Report::new(&events, &provider.ledger(), &ladder.dead_letters, &faults, schedule.max_attempts());
    report.print(&provider.requests());
    problems.extend(report.problems);
    if problems.is_empty() {
        println!("\ndemo passed: every event was charged exactly once or dead-lettered");
        ExitCode::SUCCESS
    } else {
        println!("\ndemo FAILED ({} problems):", problems.len());
        for problem in problems.iter().take(MAX_LISTED) {
            println!("  - {problem}");
        }
        if problems.len() > MAX_LISTED {
            println!("  - ... and {} more", problems.len() - MAX_LISTED);
        }
        println!("billing-bin's log: {}", log.display());
        ExitCode::FAILURE
    }
}

/// What kind of event the demo produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Case {
    AmountString,
    AmountNumber,
    NegativeAmount,
    MalformedJson,
    WrongType,
}

impl Case {
    const INVALID: [Case; 3] = [Case::NegativeAmount, Case::MalformedJson, Case::WrongType];

    fn is_valid(self) -> bool {
        matches!(self, Case::AmountString | Case::AmountNumber)
    }

    fn label(self) -> &'static str {
        match self {
            Case::AmountString => "valid, amount as string",
            Case::AmountNumber => "valid, amount as number",
            Case::NegativeAmount => "invalid: negative amount",
            Case::MalformedJson => "invalid: malformed JSON",
            Case::WrongType => "invalid: customer_id a number",
        }
    }
}

/// One OrderConfirmed event, keyed by its order id.
struct Event {
    case: Case,
    order_id: String,
    customer_id: String,
    amount: Decimal,
    /// The record's value, as produced.
    value: String,
}

impl Event {
    /// `n` events, a thirtieth of them (at least 3) invalid, in random order.
    fn generate(n: usize, rng: &mut StdRng) -> Vec<Event> {
        let invalid = (n / 30).max(Case::INVALID.len());
        let mut events: Vec<Event> = (0..n)
            .map(|i| {
                let case = match i {
                    i if i < invalid => Case::INVALID[i % Case::INVALID.len()],
                    i if i % 2 == 0 => Case::AmountString,
                    _ => Case::AmountNumber,
                };
                Event::new(case, rng)
            })
            .collect();
        events.shuffle(rng);
        events
    }

    fn new(case: Case, rng: &mut StdRng) -> Event {
        let mut uuid = || uuid::Builder::from_random_bytes(rng.gen()).into_uuid().to_string();
        let (event_id, order_id, customer_id) = (uuid(), uuid(), uuid());
        let amount = Decimal::new(rng.gen_range(100..=99_999), 2);
        let fields = |customer: &str, amount: &str| {
            format!(
                r#"{{"event_id":"{event_id}","order_id":"{order_id}","customer_id":{customer},"total_amount":{amount}"#
            )
        };
        let customer = format!("\"{customer_id}\"");
        let value = match case {
            Case::AmountString => fields(&customer, &format!("\"{amount}\"")) + "}",
            // The amount's text as a JSON number, e.g. 120.50.
            Case::AmountNumber => fields(&customer, &amount.to_string()) + "}",
            Case::NegativeAmount => fields(&customer, &format!("\"-{amount}\"")) + "}",
            // Cut short: the closing brace is missing.
            Case::MalformedJson => fields(&customer, &format!("\"{amount}\"")),
            Case::WrongType => fields("4242", &format!("\"{amount}\"")) + "}",
        };
        Event { case, order_id, customer_id, amount, value }
    }

    /// Charged (under any key) or dead-lettered.
    fn accounted(&self, ledger: &[Charge], dead_letters: &[DeadLetter]) -> bool {
        ledger.iter().any(|c| c.order_id == self.order_id) || dead_letters.iter().any(|d| d.key == self.order_id)
    }

    /// What should become of this event, given the provider's faults and
    /// the ladder's `attempts`.
    fn expected(&self, faults: &Faults, attempts: u32) -> &'static str {
        if !self.case.is_valid() {
            return "dead-lettered: permanent-failure";
        }
        match faults.plan(&self.order_id) {
            OrderFault::Permanent => "dead-lettered: permanent-failure",
            OrderFault::Transient { failures, .. } if failures >= attempts => "dead-lettered: retries-exhausted",
            OrderFault::Transient { .. } | OrderFault::Slow | OrderFault::Healthy => "charged once",
        }
    }

    /// The provider's fault for this event, as a table cell.
    fn fault_label(&self, faults: &Faults) -> String {
        if !self.case.is_valid() {
            return "-".into();
        }
        match faults.plan(&self.order_id) {
            OrderFault::Healthy => "none".into(),
            OrderFault::Transient { failures, .. } => format!("fails {failures}x, then charges"),
            OrderFault::Permanent => "declines (400)".into(),
            OrderFault::Slow => format!("answers late ({SLOW_ANSWER:?}) once"),
        }
    }
}

/// Produces `events` to `topic`, spread over its partitions.
async fn produce(client: &rskafka::client::Client, topic: &str, events: &[Event]) {
    // chrono is built without its clock; the system's is the same.
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis();
    let timestamp = Utc.timestamp_millis_opt(now_ms as i64).single().expect("a valid timestamp");
    for partition in 0..PARTITIONS {
        let pc = within("partition client", client.partition_client(topic, partition, UnknownTopicHandling::Retry))
            .await
            .unwrap_or_else(|e| panic!("cannot reach {topic}/{partition}: {e}"));
        let records: Vec<Record> = events
            .iter()
            .skip(partition as usize)
            .step_by(PARTITIONS as usize)
            .map(|e| Record {
                key: Some(e.order_id.clone().into_bytes()),
                value: Some(e.value.clone().into_bytes()),
                headers: BTreeMap::new(),
                timestamp,
            })
            .collect();
        for batch in records.chunks(100) {
            within("produce", pc.produce(batch.to_vec(), Compression::NoCompression))
                .await
                .unwrap_or_else(|e| panic!("cannot produce to {topic}/{partition}: {e}"));
        }
    }
}

/// One record of the dead-letter topic.
struct DeadLetter {
    partition: i32,
    offset: i64,
    key: String,
    reason: String,
    attempt: String,
    error: String,
}

/// The ladder's topics as the demo watches them: records, consumer lag,
/// and the dead letters read so far.
struct Ladder {
    /// Each topic the service consumes (source, then rungs), with its group.
    consumed: Vec<Watched>,
    dead_letter_topic: Vec<PartitionClient>,
    /// Where reading the dead-letter topic goes on, per partition.
    dead_letter_next: Vec<i64>,
    dead_letters: Vec<DeadLetter>,
}

struct Watched {
    topic: String,
    label: String,
    partitions: Vec<PartitionClient>,
    group: GroupOffsets,
}

/// One look at the ladder: per consumed topic, records and lag (`None`
/// when the group's offsets could not be read), and dead letters.
struct Progress {
    consumed: Vec<(String, i64, Option<i64>)>,
    dead_letters: usize,
}

impl Progress {
    fn describe(&self) -> String {
        let mut cells: Vec<String> = self
            .consumed
            .iter()
            .map(|(label, records, lag)| {
                let lag = lag.map_or("?".into(), |l| l.to_string());
                format!("{label} {records} (lag {lag})")
            })
            .collect();
        cells.push(format!("dlq {}", self.dead_letters));
        cells.join(" | ")
    }

    /// Every group committed everything there is to read.
    fn settled(&self) -> bool {
        self.consumed.iter().all(|(_, _, lag)| *lag == Some(0))
    }
}

impl Ladder {
    async fn open(client: &rskafka::client::Client, brokers: &str, group: &str, topology: RetryTopology) -> Ladder {
        let connection = ConnectionConfig::new(brokers, "kafka-retry-demo").expect("the broker address is valid");
        // The groups the service's listener joins.
        let groups = LadderGroups::new(group, &topology).expect("the demo's group id is valid");
        let mut consumed = Vec::new();
        for retry_core::groups::ConsumedTopic { stage, topic, group } in groups.consumed(&topology) {
            let label = match stage.rung() {
                None => "source".to_owned(),
                Some(rung) => format!("rung {}", rung + 1),
            };
            let partitions = partition_clients(client, topic).await;
            let group = GroupOffsets::new(connection.clone(), group);
            consumed.push(Watched { topic: topic.to_owned(), label, partitions, group });
        }
        let dead_letter_topic = partition_clients(client, topology.dead_letter_topic().as_str()).await;
        Ladder {
            consumed,
            dead_letter_next: vec![0; dead_letter_topic.len()],
            dead_letter_topic,
            dead_letters: Vec::new(),
        }
    }

    async fn progress(&mut self) -> Progress {
        let mut consumed = Vec::new();
        for watched in &mut self.consumed {
            let ends = end_offsets(&watched.partitions).await;
            let tps: Vec<TopicPartition> =
                (0..ends.len() as i32).map(|p| TopicPartition::new(watched.topic.clone(), p)).collect();
            let lag = match tokio::time::timeout(Duration::from_secs(5), watched.group.committed(&tps)).await {
                Ok(Ok(committed)) => Some(
                    tps.iter()
                        .zip(&ends)
                        .map(|(tp, end)| end - committed.get(tp).copied().flatten().unwrap_or(0))
                        .sum(),
                ),
                // A busy broker may answer late; the next look will tell.
                Ok(Err(_)) | Err(_) => None,
            };
            consumed.push((watched.label.clone(), ends.iter().sum(), lag));
        }
        self.read_dead_letters().await;
        Progress { consumed, dead_letters: self.dead_letters.len() }
    }

    /// Reads the dead letters produced since the last call.
    async fn read_dead_letters(&mut self) {
        let ends = end_offsets(&self.dead_letter_topic).await;
        for (partition, pc) in self.dead_letter_topic.iter().enumerate() {
            let next = &mut self.dead_letter_next[partition];
            while *next < ends[partition] {
                let connection = integration::connection("kafka-retry-demo-read");
                let read = retry_kafka::read_partition(&connection, pc.topic(), partition as i32, *next);
                let records = within("read dead letters", read)
                    .await
                    .unwrap_or_else(|e| panic!("cannot read the dead-letter topic: {e}"));
                let before = *next;
                for r in records.into_iter().filter(|r| r.offset >= before) {
                    *next = r.offset + 1;
                    let header = |name: &str| {
                        r.header(name).flatten().map_or("<absent>".into(), |v| String::from_utf8_lossy(v).into_owned())
                    };
                    self.dead_letters.push(DeadLetter {
                        partition: partition as i32,
                        offset: r.offset,
                        key: r.key.as_deref().map_or("<no key>".into(), |k| String::from_utf8_lossy(k).into_owned()),
                        reason: header(header_names::DEAD_LETTER_REASON),
                        attempt: header(header_names::ATTEMPT),
                        error: header(header_names::ERROR),
                    });
                }
                if *next == before {
                    // Nothing readable yet at this offset; the next look tries again.
                    break;
                }
            }
        }
    }
}

async fn partition_clients(client: &rskafka::client::Client, topic: &str) -> Vec<PartitionClient> {
    let mut clients = Vec::new();
    for partition in 0..PARTITIONS {
        let pc = within("partition client", client.partition_client(topic, partition, UnknownTopicHandling::Retry))
            .await
            .unwrap_or_else(|e| panic!("cannot reach {topic}/{partition}: {e}"));
        clients.push(pc);
    }
    clients
}

async fn end_offsets(partitions: &[PartitionClient]) -> Vec<i64> {
    let mut ends = Vec::new();
    for pc in partitions {
        let end = within("end offset", pc.get_offset(OffsetAt::Latest))
            .await
            .unwrap_or_else(|e| panic!("cannot read the end offset of {}/{}: {e}", pc.topic(), pc.partition()));
        ends.push(end);
    }
    ends
}

/// Where every event ended up, grouped, and what is wrong.
struct Report<'a> {
    /// (case, provider fault, outcome) -> events.
    rows: BTreeMap<(&'static str, String, String), usize>,
    dead_lettered: Vec<(&'a Event, &'a DeadLetter)>,
    /// Outcomes other than the fault plan predicts: reported, not failed.
    deviations: Vec<String>,
    problems: Vec<String>,
    totals: BTreeMap<&'static str, usize>,
}

impl<'a> Report<'a> {
    fn new(
        events: &'a [Event],
        ledger: &[Charge],
        dead_letters: &'a [DeadLetter],
        faults: &Faults,
        attempts: u32,
    ) -> Self {
        let mut report = Report {
            rows: BTreeMap::new(),
            dead_lettered: Vec::new(),
            deviations: Vec::new(),
            problems: Vec::new(),
            totals: BTreeMap::new(),
        };
        let mut charges: HashMap<&str, Vec<&Charge>> = HashMap::new();
        for charge in ledger {
            charges.entry(charge.order_id.as_str()).or_default().push(charge);
        }
        let mut letters: HashMap<&str, Vec<&DeadLetter>> = HashMap::new();
        for letter in dead_letters {
            letters.entry(letter.key.as_str()).or_default().push(letter);
        }

        for event in events {
            let charged = charges.remove(event.order_id.as_str()).unwrap_or_default();
            let lettered = letters.remove(event.order_id.as_str()).unwrap_or_default();
            let order = &event.order_id;
            // (the total it counts towards, the outcome as a table cell, what is wrong with it)
            let (total, outcome, problem) = match (charged.as_slice(), lettered.as_slice()) {
                ([charge], []) => {
                    report.check_charge(event, charge);
                    ("charged once", "charged once".to_owned(), None)
                }
                ([], [letter, more @ ..]) => {
                    if !more.is_empty() {
                        report.deviations.push(format!("order {order} was dead-lettered {} times", more.len() + 1));
                    }
                    report.dead_lettered.push((event, letter));
                    ("dead-lettered", format!("dead-lettered: {}", letter.reason), None)
                }
                ([], []) => (
                    "MISSING",
                    "MISSING".to_owned(),
                    Some(format!("order {order} ({}) was neither charged nor dead-lettered", event.case.label())),
                ),
                ([_], [letter, ..]) => (
                    "CHARGED AND DEAD-LETTERED",
                    "CHARGED AND DEAD-LETTERED".to_owned(),
                    Some(format!(
                        "order {order} was charged and also dead-lettered ({}: {})",
                        letter.reason, letter.error
                    )),
                ),
                (many, _) => (
                    "CHARGED TWICE OR MORE",
                    format!("CHARGED {} TIMES", many.len()),
                    Some(format!("order {order} was charged {} times", many.len())),
                ),
            };
            *report.totals.entry(total).or_default() += 1;
            let expected = event.expected(faults, attempts);
            match problem {
                Some(problem) => report.problems.push(problem),
                None if outcome != expected => report.deviations.push(format!(
                    "order {order} ({}, provider: {}): {outcome}, the plan says {expected}",
                    event.case.label(),
                    event.fault_label(faults)
                )),
                None => {}
            }
            *report.rows.entry((event.case.label(), event.fault_label(faults), outcome)).or_default() += 1;
        }
        for (order, stray) in charges {
            report.problems.push(format!("{} charges for order {order}, which the demo never produced", stray.len()));
        }
        for (key, stray) in letters {
            for letter in stray {
                report.problems.push(format!(
                    "dead letter {}/{} has key {key:?}, which no produced event has",
                    letter.partition, letter.offset
                ));
            }
        }
        report
    }

    /// A charge must be for a valid event, under its order id (one order,
    /// one charge), of its amount and customer.
    fn check_charge(&mut self, event: &Event, charge: &Charge) {
        let order = &event.order_id;
        if !event.case.is_valid() {
            self.problems.push(format!("order {order} was charged although invalid ({})", event.case.label()));
        }
        if charge.idempotency_key != event.order_id {
            self.problems.push(format!(
                "order {order} was charged under idempotency key {:?}, not its order id",
                charge.idempotency_key
            ));
        }
        if Decimal::from_str(&charge.amount).ok() != Some(event.amount) {
            self.problems.push(format!("order {order} was charged {:?}, not {}", charge.amount, event.amount));
        }
        if charge.customer_id != event.customer_id {
            self.problems.push(format!(
                "order {order} was charged to customer {:?}, not {}",
                charge.customer_id, event.customer_id
            ));
        }
    }

    fn print(&self, statuses_seen: &BTreeMap<u16, u64>) {
        let events: usize = self.rows.values().sum();
        println!("\nwhere each of the {events} events ended up:\n");
        println!("{:<30} {:<28} {:<40} {:>6}", "event", "provider fault", "outcome", "events");
        for ((case, fault, outcome), n) in &self.rows {
            println!("{case:<30} {fault:<28} {outcome:<40} {n:>6}");
        }
        let totals: Vec<String> = self.totals.iter().map(|(outcome, n)| format!("{outcome} {n}")).collect();
        println!("{:<30} {:<28} {:<40} {events:>6}", "total", "", totals.join(", "));

        if !self.dead_lettered.is_empty() {
            println!("\ndead-lettered events ({}):\n", self.dead_lettered.len());
            println!(
                "{:<36} {:<30} {:<22} {:>7}  x-error",
                "order (record key)", "event", "x-dead-letter-reason", "attempt"
            );
            let mut rows = self.dead_lettered.clone();
            rows.sort_by(|a, b| (&a.1.reason, a.0.case, &a.0.order_id).cmp(&(&b.1.reason, b.0.case, &b.0.order_id)));
            for (event, letter) in rows {
                println!(
                    "{:<36} {:<30} {:<22} {:>7}  {}",
                    event.order_id,
                    event.case.label(),
                    letter.reason,
                    letter.attempt,
                    shorten(&letter.error, 100)
                );
            }
        }
        println!("\nthe provider answered: {}", statuses(statuses_seen));
        if !self.deviations.is_empty() {
            println!(
                "\noutcomes other than the fault plan predicts ({}), not counted as failures:",
                self.deviations.len()
            );
            for deviation in self.deviations.iter().take(MAX_LISTED) {
                println!("  - {deviation}");
            }
            if self.deviations.len() > MAX_LISTED {
                println!("  - ... and {} more", self.deviations.len() - MAX_LISTED);
            }
        }
    }
}

/// `201 x270, 409 x12, ...`
fn statuses(seen: &BTreeMap<u16, u64>) -> String {
    if seen.is_empty() {
        return "nothing yet".into();
    }
    seen.iter().map(|(status, n)| format!("{status} x{n}")).collect::<Vec<_>>().join(", ")
}

fn shorten(text: &str, max_chars: usize) -> String {
    let one_line = text.replace('\n', " ");
    match one_line.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}...", &one_line[..cut]),
        None => one_line,
    }
}

/// Runs `cmd` with inherited output; fails unless it succeeds within `limit`.
fn run_to_completion(cmd: &mut Command, limit: Duration) -> Result<(), String> {
    let shown = format!("{} {}", cmd.get_program().to_string_lossy(), join_args(cmd));
    println!("$ {shown}");
    let mut child = cmd.stdin(Stdio::null()).spawn().map_err(|e| format!("cannot start `{shown}`: {e}"))?;
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait().map_err(|e| format!("cannot wait for `{shown}`: {e}"))? {
            Some(status) if status.success() => return Ok(()),
            Some(status) => return Err(format!("`{shown}` failed ({status})")),
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("`{shown}` took longer than {limit:?} and was killed"));
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn join_args(cmd: &Command) -> String {
    cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
}

/// `billing-bin run`, killed if the demo ends without stopping it.
struct Service {
    child: Child,
}

/// The outage brake's state, from the service's `/metrics` on `admin`.
async fn brake_state(admin: &str, topic: &str) -> &'static str {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let read = async {
        let mut stream = tokio::net::TcpStream::connect(admin).await.ok()?;
        stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: demo\r\n\r\n").await.ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        let sample = format!(r#"kafka_retry_brake_state{{topic="{topic}"}} "#);
        text.lines().find_map(|l| l.strip_prefix(&sample)?.trim().parse::<i64>().ok())
    };
    match tokio::time::timeout(Duration::from_secs(1), read).await {
        Ok(Some(0)) => "running",
        Ok(Some(1)) => "probing",
        Ok(Some(2)) => "PAUSED",
        Ok(Some(_)) => "?",
        Ok(None) | Err(_) => "off",
    }
}

impl Service {
    fn spawn(bin: &Path, env: &[(&str, String)], log: &Path) -> Service {
        let out = File::create(log).unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        let err = out.try_clone().unwrap_or_else(|e| panic!("cannot reopen {}: {e}", log.display()));
        let child = Command::new(bin)
            .arg("run")
            .envs(env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{} run`: {e}", bin.display()));
        Service { child }
    }

    /// Its exit status, if it has exited.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM, then SIGKILL after [`STOP_GRACE`]. Its exit status, or what went wrong.
    async fn stop(&mut self) -> Result<ExitStatus, String> {
        if let Some(status) = self.exited() {
            return Ok(status);
        }
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        if !matches!(sent, Ok(s) if s.success()) {
            return Err(format!("cannot send SIGTERM to billing-bin (pid {pid}): {sent:?}"));
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return Ok(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Err(format!("billing-bin did not stop within {STOP_GRACE:?} of SIGTERM and was killed"))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // Only reached with the service still running when the demo panicked.
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The last `lines` lines of the file at `path`.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
