//! Shared pieces of the ladder tests: a fresh ladder of topics, a scripted
//! handler, and ways to look at what landed where.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::Duration,
};

use chrono::{TimeZone, Utc};
use integration::{create_plan, rskafka_client, unique_topic, within, BROKER_TIMEOUT};
use retry_core::{groups::LadderGroups, HandlerError, PolicyConfig, RetryPolicy, RetrySchedule, RetryTopology};
use retry_kafka::{ConnectionConfig, ConsumedRecord, ListenerConfig, RecordHandler, TopicPlan};
use rskafka::{
    client::partition::{Compression, UnknownTopicHandling},
    record::{Record, RecordAndOffset},
};

/// Logs to the test output when `RUST_LOG` is set.
pub(crate) fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A ladder on fresh topics, created with `partitions` partitions each.
pub(crate) struct Ladder {
    pub(crate) connection: ConnectionConfig,
    pub(crate) policy: RetryPolicy,
    pub(crate) group_id: String,
}

impl Ladder {
    pub(crate) async fn create(name: &str, schedule: &str, partitions: i32) -> Ladder {
        Ladder::create_with(name, schedule, partitions, |plan| plan).await
    }

    /// [`Ladder::create`], its topics created by the plan `configure` makes
    /// (topic configs; the mock cluster takes none).
    pub(crate) async fn create_with(
        name: &str,
        schedule: &str,
        partitions: i32,
        configure: impl FnOnce(TopicPlan) -> TopicPlan,
    ) -> Ladder {
        init_tracing();
        let source = unique_topic(name);
        let schedule: RetrySchedule = schedule.parse().unwrap();
        let topology = RetryTopology::new(&source, &schedule).unwrap();
        let connection = integration::connection("kafka-retry-it");
        let plan = configure(TopicPlan::new(topology.clone(), partitions));
        create_plan(&plan, &connection).await;
        Ladder {
            connection,
            policy: RetryPolicy::new(topology, PolicyConfig::default()),
            group_id: format!("{source}-group"),
        }
    }

    pub(crate) fn source(&self) -> &str {
        self.policy.topology().source_topic().as_str()
    }

    pub(crate) fn retry(&self, rung: usize) -> &str {
        self.policy.topology().retry_topic(rung).unwrap().as_str()
    }

    pub(crate) fn dlq(&self) -> &str {
        self.policy.topology().dead_letter_topic().as_str()
    }

    /// The ladder's consumer groups.
    pub(crate) fn groups(&self) -> LadderGroups {
        LadderGroups::new(&self.group_id, self.policy.topology()).unwrap()
    }

    /// Each consumed topic with its group: the source first, then each rung.
    pub(crate) fn consumed(&self) -> Vec<(String, String)> {
        let groups = self.groups();
        groups.consumed(self.policy.topology()).map(|c| (c.topic.to_owned(), c.group.to_owned())).collect()
    }

    /// A listener config tuned for tests: fast heartbeats and commits.
    pub(crate) fn config(&self) -> ListenerConfig {
        let mut c = ListenerConfig::new(self.connection.clone(), &self.group_id, self.policy.clone()).unwrap();
        c.session_timeout = Duration::from_secs(6);
        c.heartbeat_interval = Duration::from_millis(300);
        // Above what a revoked member may take: its calls' 5 s, 3 s to
        // abort what outlives them, 3 s (half the session) to commit.
        c.rebalance_timeout = Duration::from_secs(15);
        c.shutdown_grace = Duration::from_secs(2);
        c.commit_interval = Duration::from_millis(200);
        c.fetch_max_wait = Duration::from_millis(200);
        c.handler_timeout = Duration::from_secs(5);
        c.group_protocol = integration::group_protocol();
        c
    }
}

/// Produces one record and returns its offset. A failed attempt (a leader
/// that moved under fault injection) refreshes the client's metadata and
/// tries again, within [`BROKER_TIMEOUT`].
pub(crate) async fn produce(topic: &str, partition: i32, key: &str, value: &str, headers: &[(&str, &[u8])]) -> i64 {
    produce_at(topic, partition, key, value, headers, chrono_now_millis()).await
}

/// [`produce`] with the record's timestamp set to `timestamp` (ms since the
/// epoch), as a producer that creates it does.
pub(crate) async fn produce_at(
    topic: &str,
    partition: i32,
    key: &str,
    value: &str,
    headers: &[(&str, &[u8])],
    timestamp: i64,
) -> i64 {
    let client = rskafka_client().await;
    let record = Record {
        key: Some(key.as_bytes().to_vec()),
        value: Some(value.as_bytes().to_vec()),
        headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect(),
        timestamp: Utc.timestamp_millis_opt(timestamp).unwrap(),
    };
    let attempt = || async {
        let pc = client.partition_client(topic, partition, UnknownTopicHandling::Retry).await?;
        pc.produce(vec![record.clone()], Compression::NoCompression).await
    };
    within("produce", async {
        loop {
            match attempt().await {
                Ok(offsets) => return offsets[0],
                Err(e) => {
                    eprintln!("producing to {topic}/{partition} failed ({e}); refreshing metadata and retrying");
                    let _ = client.list_topics().await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
    .await
}

/// Produces `(key, value)` records in one request (one record batch, which
/// a fetch brings back whole), and returns the first offset.
pub(crate) async fn produce_batch(topic: &str, partition: i32, records: &[(String, String)]) -> i64 {
    let client = rskafka_client().await;
    let records = keyed_records(records);
    let pc = within("partition client", client.partition_client(topic, partition, UnknownTopicHandling::Retry))
        .await
        .unwrap();
    within("produce", pc.produce(records, Compression::NoCompression)).await.unwrap()[0]
}

/// [`produce_batch`], sent again after a failure (a leader down or moving,
/// too few replicas in sync) until the cluster takes it, within a few
/// minutes; returns the first offset. A failed send may have been written
/// all the same, so the batch may land twice.
pub(crate) async fn produce_batch_retrying(topic: &str, partition: i32, records: &[(String, String)]) -> i64 {
    let client = rskafka_client().await;
    let records = keyed_records(records);
    let attempt = || async {
        let pc = client.partition_client(topic, partition, UnknownTopicHandling::Retry).await?;
        pc.produce(records.clone(), Compression::NoCompression).await
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        match tokio::time::timeout(BROKER_TIMEOUT, attempt()).await {
            Ok(Ok(offsets)) => return offsets[0],
            failed => {
                assert!(tokio::time::Instant::now() < deadline, "producing to {topic}/{partition}: {failed:?}");
                eprintln!("producing to {topic}/{partition} failed ({failed:?}); refreshing metadata and retrying");
                let _ = tokio::time::timeout(BROKER_TIMEOUT, client.list_topics()).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// `(key, value)` pairs as records stamped now, without headers.
fn keyed_records(records: &[(String, String)]) -> Vec<Record> {
    records
        .iter()
        .map(|(k, v)| Record {
            key: Some(k.as_bytes().to_vec()),
            value: Some(v.as_bytes().to_vec()),
            headers: Default::default(),
            timestamp: Utc.timestamp_millis_opt(chrono_now_millis()).unwrap(),
        })
        .collect()
}

pub(crate) fn chrono_now_millis() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Every record of one partition, read as the listener reads (every
/// codec), in rskafka's shape (headers as a map: a repeated name keeps its
/// last value, a null value reads empty).
pub(crate) async fn read_partition(topic: &str, partition: i32) -> Vec<RecordAndOffset> {
    let connection = integration::connection("kafka-retry-it-read");
    let records = within("read partition", retry_kafka::read_partition(&connection, topic, partition, 0))
        .await
        .unwrap_or_else(|e| panic!("cannot read {topic}/{partition}: {e}"));
    records
        .into_iter()
        .map(|r| RecordAndOffset {
            offset: r.offset,
            record: Record {
                key: r.key.map(|k| k.to_vec()),
                value: r.value.map(|v| v.to_vec()),
                headers: r
                    .headers
                    .into_iter()
                    .map(|(n, v)| (String::from_utf8_lossy(&n).into_owned(), v.map(|v| v.to_vec()).unwrap_or_default()))
                    .collect(),
                timestamp: chrono::DateTime::from_timestamp_millis(r.timestamp.map_or(0, |t| t.as_millis()))
                    .expect("a timestamp in range"),
            },
        })
        .collect()
}

/// A header's value as text.
pub(crate) fn header(r: &Record, name: &str) -> String {
    String::from_utf8_lossy(r.headers.get(name).map(Vec::as_slice).unwrap_or(b"<absent>")).into_owned()
}

/// Polls `check` until it returns `Some`, failing the test after `timeout`.
pub(crate) async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long a test waits for the ladder to settle.
pub(crate) const SETTLE: Duration = BROKER_TIMEOUT;

/// What the scripted handler does with one delivery.
#[derive(Debug, Clone)]
pub(crate) enum Step {
    Succeed,
    Transient,
    Permanent,
    Panic,
    Sleep(Duration),
    /// Never returns: the call waits until it is cancelled.
    Hang,
    /// Blocks its thread this long, deaf to cancellation (a handler that
    /// calls blocking code on the runtime), then succeeds.
    Block(Duration),
    /// Takes this long, then fails transiently.
    SlowTransient(Duration),
}

/// One handler call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) key: String,
    pub(crate) attempt: u32,
    /// The headers it saw, in order.
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    /// Whether the script made it succeed.
    pub(crate) succeeded: bool,
}

/// A handler that follows a script per record key (default: succeed) and
/// logs each call.
#[derive(Default)]
pub(crate) struct Scripted {
    script: Mutex<HashMap<String, VecDeque<Step>>>,
    calls: Mutex<Vec<Call>>,
    /// Calls of [`Step::Hang`] started, and ended (their future dropped).
    hangs: Arc<(std::sync::atomic::AtomicUsize, std::sync::atomic::AtomicUsize)>,
    /// Calls of [`Step::Block`] that ended.
    blocked_ended: std::sync::atomic::AtomicUsize,
}

/// Counts a hanging call as ended when its future is dropped.
struct HangGuard(Arc<(std::sync::atomic::AtomicUsize, std::sync::atomic::AtomicUsize)>);

impl Drop for HangGuard {
    fn drop(&mut self) {
        self.0 .1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Scripted {
    pub(crate) fn new(script: &[(&str, &[Step])]) -> Arc<Self> {
        let script = script.iter().map(|(k, steps)| (k.to_string(), steps.iter().cloned().collect())).collect();
        Arc::new(Scripted { script: Mutex::new(script), ..Default::default() })
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Calls that hang: (started, ended).
    pub(crate) fn hangs(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::SeqCst;
        (self.hangs.0.load(SeqCst), self.hangs.1.load(SeqCst))
    }

    /// Calls of [`Step::Block`] that ended.
    pub(crate) fn blocked_ended(&self) -> usize {
        self.blocked_ended.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether a call for `key` succeeded.
    pub(crate) fn succeeded(&self, key: &str) -> bool {
        self.calls.lock().unwrap().iter().any(|c| c.key == key && c.succeeded)
    }

    /// The attempts seen for `key`, in order.
    pub(crate) fn attempts(&self, key: &str) -> Vec<u32> {
        self.calls().into_iter().filter(|c| c.key == key).map(|c| c.attempt).collect()
    }

    /// The calls for `key`, as (topic, attempt).
    pub(crate) fn journey(&self, key: &str) -> Vec<(String, u32)> {
        self.calls().into_iter().filter(|c| c.key == key).map(|c| (c.topic, c.attempt)).collect()
    }
}

impl RecordHandler for Scripted {
    async fn handle(&self, record: ConsumedRecord) -> Result<(), HandlerError> {
        let key = record.key.as_deref().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default();
        let step = self.script.lock().unwrap().get_mut(&key).and_then(VecDeque::pop_front).unwrap_or(Step::Succeed);
        self.calls.lock().unwrap().push(Call {
            topic: record.topic.clone(),
            partition: record.partition,
            key: key.clone(),
            attempt: record.attempt,
            headers: record.headers.iter().map(|(k, v)| (k.to_owned(), v.to_vec())).collect(),
            succeeded: matches!(step, Step::Succeed | Step::Sleep(_)),
        });
        match step {
            Step::Succeed => Ok(()),
            Step::Transient => Err(HandlerError::transient(format!("scripted transient failure of {key}"))),
            Step::Permanent => Err(HandlerError::permanent(format!("scripted permanent failure of {key}"))),
            Step::Panic => panic!("scripted panic for {key}"),
            Step::Sleep(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            Step::Hang => {
                self.hangs.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _guard = HangGuard(self.hangs.clone());
                std::future::pending().await
            }
            Step::SlowTransient(d) => {
                tokio::time::sleep(d).await;
                Err(HandlerError::transient(format!("scripted slow transient failure of {key}")))
            }
            Step::Block(d) => {
                std::thread::sleep(d);
                self.blocked_ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
        }
    }
}

/// The committed offsets of `group` for partitions 0..n of `topic`.
pub(crate) async fn committed(
    connection: &ConnectionConfig,
    group: &str,
    topic: &str,
    n: i32,
) -> BTreeMap<i32, Option<i64>> {
    let mut offsets = retry_kafka::GroupOffsets::new(connection.clone(), group);
    let tps: Vec<retry_kafka::TopicPartition> = (0..n).map(|p| retry_kafka::TopicPartition::new(topic, p)).collect();
    let got = within("committed offsets", offsets.committed(&tps)).await.unwrap();
    got.into_iter().map(|(tp, o)| (tp.partition, o)).collect()
}

/// What `billing-bin topics verify` did.
#[derive(Debug)]
pub(crate) struct BillingBinRun {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    pub(crate) took: Duration,
}

/// Runs `billing-bin topics verify` with the suite's broker and security
/// settings, less `remove`, then `env` on top (a fresh topic name, so it
/// fails with exit 1 on missing topics once it reached the broker).
pub(crate) async fn billing_bin_topics_verify(env: &[(&str, &str)], remove: &[&str]) -> BillingBinRun {
    billing_bin(&["topics", "verify"], env, remove).await
}

/// Runs billing-bin with `args`, the suite's broker and security, a fresh
/// source topic unless `env` names one, `env` and without `remove`.
pub(crate) async fn billing_bin(args: &[&str], env: &[(&str, &str)], remove: &[&str]) -> BillingBinRun {
    let bin = std::env::var_os("BILLING_BIN").expect("BILLING_BIN is set by cargo xtask integration");
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(args)
        .env_clear()
        .env("KAFKA_BROKERS", integration::broker_addr())
        .env("BILLING_TOPIC", unique_topic("billing"))
        .envs(integration::billing_broker_env())
        .env("RUST_LOG", "info");
    for name in remove {
        cmd.env_remove(name);
    }
    cmd.envs(env.iter().copied());
    let started = std::time::Instant::now();
    let out = within("billing-bin", cmd.output()).await.unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    BillingBinRun {
        code: out.status.code(),
        stdout: text(&out.stdout),
        stderr: text(&out.stderr),
        took: started.elapsed(),
    }
}

/// Produces a fence record to partition `partition` of the source and waits
/// until the source group committed past it: every record before it was
/// then handled to the end (the commit position never passes an
/// unfinished record), whatever their keys, which are handled concurrently.
pub(crate) async fn fence(ladder: &Ladder, partition: i32, partitions: i32) {
    let offset = produce(ladder.source(), partition, "fence", "{}", &[]).await;
    eventually("the source committed past the fence", SETTLE, || async {
        let committed = committed(&ladder.connection, &ladder.group_id, ladder.source(), partitions).await;
        (committed[&partition] > Some(offset)).then_some(())
    })
    .await;
}

/// Starts a listener on `ladder` and waits until it joined every group of
/// the ladder (one assignment each), so what a test produces next is
/// consumed under a settled membership.
pub(crate) async fn start_joined(ladder: &Ladder, handler: Arc<Scripted>) -> retry_kafka::Listener {
    start_joined_with(ladder.config(), handler).await
}

/// [`start_joined`], with `config`.
pub(crate) async fn start_joined_with(config: ListenerConfig, handler: Arc<Scripted>) -> retry_kafka::Listener {
    let group_ids: Vec<String> =
        config.groups().consumed(config.policy().topology()).map(|c| c.group.to_owned()).collect();
    let groups = group_ids.len() as u64;
    let consumer_protocol = config.group_protocol == retry_kafka::GroupProtocol::Consumer;
    let connection = config.connection.clone();
    let listener = within("start", retry_kafka::Listener::start(config, handler)).await.unwrap();
    eventually("the listener to join its groups", SETTLE, || async {
        (listener.stats().snapshot().rebalances >= groups).then_some(())
    })
    .await;
    // Under the consumer group protocol a newcomer's first assignment may
    // be empty while the others release what it is to get: settled is
    // when its coordinator says every member runs its target assignment.
    if consumer_protocol {
        for group in group_ids {
            eventually(&format!("group {group} to settle"), SETTLE, || async {
                let mut offsets = retry_kafka::GroupOffsets::new(connection.clone(), &group);
                offsets.state().await.ok().filter(|s| s.is_stable()).map(|_| ())
            })
            .await;
        }
    }
    listener
}

/// How many assignments `listener`'s member of `group` received, from its
/// Prometheus metrics.
pub(crate) fn rebalances_of(listener: &retry_kafka::Listener, group: &str) -> u64 {
    listener.metrics().sample("kafka_retry_rebalances_total", &format!("group=\"{group}\"")).map_or(0, |v| v as u64)
}
