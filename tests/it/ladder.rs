//! The retry ladder end to end against the broker.

use std::time::Duration;

use retry_kafka::Listener;
use rskafka::record::Record;

use crate::support::{committed, eventually, header, produce, read_partition, Ladder, Scripted, Step, SETTLE};

/// Waits until `topic`/0 holds `n` records and returns them.
async fn wait_for_records(topic: &str, n: usize) -> Vec<Record> {
    eventually(&format!("{n} records in {topic}"), SETTLE, || async {
        let records = read_partition(topic, 0).await;
        (records.len() >= n).then(|| records.into_iter().map(|r| r.record).collect())
    })
    .await
}

/// Waits until the ladder's groups (source first, then each rung) committed
/// these offsets on partition 0; `None` skips a group.
async fn wait_committed(ladder: &Ladder, offsets: &[Option<i64>]) {
    for ((topic, group), offset) in ladder.consumed().iter().zip(offsets) {
        let Some(offset) = offset else { continue };
        eventually(&format!("{group} to commit {offset}"), SETTLE, || async {
            (committed(&ladder.connection, group, topic, 1).await[&0] == Some(*offset)).then_some(())
        })
        .await;
    }
}

#[tokio::test]
async fn transient_failures_climb_the_ladder_and_then_succeed() {
    let ladder = Ladder::create("climb", "200ms,400ms", 1).await;
    let handler = Scripted::new(&[("a", &[Step::Transient, Step::Transient, Step::Succeed])]);
    let listener = Listener::start(ladder.config(), handler.clone()).await.unwrap();
    produce(ladder.source(), 0, "a", r#"{"n":1}"#, &[("traceparent", b"00-1")]).await;

    eventually("three attempts", SETTLE, || async { (handler.attempts("a").len() == 3).then_some(()) }).await;
    let expected = [(ladder.source(), 1), (ladder.retry(0), 2), (ladder.retry(1), 3)];
    assert_eq!(handler.journey("a"), expected.map(|(t, a)| (t.to_owned(), a)));
    wait_committed(&ladder, &[Some(1), Some(1), Some(1)]).await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    assert_eq!((stats.succeeded, stats.retried, stats.dead_lettered), (1, 2, 0));

    assert!(read_partition(ladder.dlq(), 0).await.is_empty(), "nothing dead-lettered");
    let first = wait_for_records(ladder.retry(0), 1).await;
    let r = &first[0];
    assert_eq!(r.key.as_deref(), Some(&b"a"[..]));
    assert_eq!(r.value.as_deref(), Some(&br#"{"n":1}"#[..]));
    assert_eq!(header(r, "traceparent"), "00-1");
    assert_eq!(header(r, "x-retry-attempt"), "1");
    assert_eq!(header(r, "x-original-topic"), ladder.source());
    assert_eq!(header(r, "x-original-partition"), "0");
    assert_eq!(header(r, "x-original-offset"), "0");
    assert_eq!(header(r, "x-error-kind"), "transient");
    assert_eq!(header(r, "x-error"), "scripted transient failure of a");
    let due: i64 = header(r, "x-retry-due-at").parse().unwrap();
    let first_failure: i64 = header(r, "x-first-failure-at").parse().unwrap();
    assert_eq!(due - first_failure, 200);
    let second = wait_for_records(ladder.retry(1), 1).await;
    assert_eq!(header(&second[0], "x-retry-attempt"), "2");
    assert_eq!(header(&second[0], "x-first-failure-at"), first_failure.to_string());
}

#[tokio::test]
async fn permanent_failures_go_straight_to_the_dead_letter_topic() {
    let ladder = Ladder::create("permanent", "200ms,400ms", 1).await;
    let handler = Scripted::new(&[("p", &[Step::Permanent])]);
    let listener = Listener::start(ladder.config(), handler.clone()).await.unwrap();
    produce(ladder.source(), 0, "p", "payload", &[("traceparent", b"00-2")]).await;

    let dead = wait_for_records(ladder.dlq(), 1).await;
    wait_committed(&ladder, &[Some(1)]).await;
    listener.shutdown().await;
    assert_eq!(handler.attempts("p"), [1]);
    let r = &dead[0];
    assert_eq!(r.value.as_deref(), Some(&b"payload"[..]));
    assert_eq!(header(r, "traceparent"), "00-2");
    assert_eq!(header(r, "x-dead-letter-reason"), "permanent-failure");
    assert_eq!(header(r, "x-error-kind"), "permanent");
    assert_eq!(header(r, "x-error"), "scripted permanent failure of p");
    assert_eq!(header(r, "x-retry-attempt"), "1");
    assert_eq!(header(r, "x-retry-due-at"), "<absent>");
    assert!(read_partition(ladder.retry(0), 0).await.is_empty());
}

#[tokio::test]
async fn exhausted_attempts_end_in_the_dead_letter_topic_with_every_header() {
    let ladder = Ladder::create("exhausted", "100ms,200ms", 1).await;
    let handler = Scripted::new(&[("x", &[Step::Transient, Step::Transient, Step::Transient, Step::Succeed])]);
    let listener = Listener::start(ladder.config(), handler.clone()).await.unwrap();
    let offset = produce(ladder.source(), 0, "x", "v", &[]).await;

    let dead = wait_for_records(ladder.dlq(), 1).await;
    wait_committed(&ladder, &[Some(1), Some(1), Some(1)]).await;
    listener.shutdown().await;
    assert_eq!(handler.attempts("x"), [1, 2, 3], "attempts stop at the schedule's end");
    let r = &dead[0];
    let expected = [
        ("x-dead-letter-reason", "retries-exhausted".to_owned()),
        ("x-retry-attempt", "3".to_owned()),
        ("x-original-topic", ladder.source().to_owned()),
        ("x-original-partition", "0".to_owned()),
        ("x-original-offset", offset.to_string()),
        ("x-error-kind", "transient".to_owned()),
        ("x-error", "scripted transient failure of x".to_owned()),
        ("x-replay-count", "0".to_owned()),
    ];
    for (name, value) in expected {
        assert_eq!(header(r, name), value, "{name}");
    }
    for name in ["x-original-timestamp", "x-first-failure-at"] {
        assert!(header(r, name).parse::<i64>().is_ok(), "{name} = {}", header(r, name));
    }
}

#[tokio::test]
async fn corrupt_retry_headers_are_dead_lettered_not_looped() {
    let ladder = Ladder::create("corrupt", "100ms,200ms", 1).await;
    let handler = Scripted::new(&[("c", &[Step::Transient])]);
    let listener = Listener::start(ladder.config(), handler.clone()).await.unwrap();
    // Someone wrote into a retry topic by hand, with garbage for our headers.
    produce(ladder.retry(0), 0, "c", "v", &[("x-retry-attempt", b"lots"), ("x-retry-due-at", b"\xff\xfe")]).await;

    let dead = wait_for_records(ladder.dlq(), 1).await;
    wait_committed(&ladder, &[None, Some(1)]).await;
    listener.shutdown().await;
    assert_eq!(handler.attempts("c"), [2]);
    assert_eq!(header(&dead[0], "x-dead-letter-reason"), "corrupt-retry-headers");
    assert!(
        header(&dead[0], "x-error").starts_with("retry header x-retry-attempt is not a number"),
        "{}",
        header(&dead[0], "x-error")
    );
}

#[tokio::test]
async fn a_handler_panic_is_a_permanent_failure() {
    let ladder = Ladder::create("panic", "100ms", 1).await;
    let handler = Scripted::new(&[("boom", &[Step::Panic])]);
    let listener = Listener::start(ladder.config(), handler.clone()).await.unwrap();
    produce(ladder.source(), 0, "boom", "v", &[]).await;
    produce(ladder.source(), 0, "fine", "v", &[]).await;

    let dead = wait_for_records(ladder.dlq(), 1).await;
    eventually("the next record handled", SETTLE, || async { (handler.attempts("fine") == [1]).then_some(()) }).await;
    wait_committed(&ladder, &[Some(2)]).await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    assert_eq!(stats.handler_panics, 1);
    assert_eq!(header(&dead[0], "x-dead-letter-reason"), "permanent-failure");
    assert_eq!(header(&dead[0], "x-error"), "handler panicked: scripted panic for boom");
}

/// A partition's worker that ends while its partition is assigned (here a
/// panic injected on one record, as a bug of ours would) does not leave the
/// partition unconsumed in silence: it is counted, the listener says it is
/// not ready, and the member rejoins, so the partition starts again from
/// what was done; every record is handled once.
#[tokio::test]
async fn a_worker_that_ends_early_is_counted_and_its_partition_consumed_again() {
    let ladder = Ladder::create("worker-panic", "100ms", 1).await;
    let handler = Scripted::new(&[]);
    let listener = Listener::start(ladder.config(), handler.clone()).await.unwrap();
    let readiness = listener.readiness();
    eventually("ready", SETTLE, || async { readiness.is_ready().then_some(()) }).await;
    produce(ladder.source(), 0, "before", "v", &[]).await;
    // Done and committed first: a call in flight when the worker ends is
    // redelivered, as after any crash.
    wait_committed(&ladder, &[Some(1)]).await;
    produce(ladder.source(), 0, "poison", "v", &[("x-fault-injection", b"panic-worker-once")]).await;
    produce(ladder.source(), 0, "after", "v", &[]).await;
    eventually("not ready after the worker ended", SETTLE, || async { (!readiness.is_ready()).then_some(()) }).await;
    eventually("every record handled", SETTLE, || async {
        ["before", "poison", "after"].iter().all(|k| handler.attempts(k) == [1]).then_some(())
    })
    .await;
    assert_eq!(listener.stats().snapshot().worker_failures, 1);
    wait_committed(&ladder, &[Some(3)]).await;
    eventually("ready again", SETTLE, || async { readiness.is_ready().then_some(()) }).await;
    listener.shutdown().await;
    for key in ["before", "poison", "after"] {
        assert_eq!(handler.attempts(key), [1], "{key} handled once");
    }
}

#[tokio::test]
async fn a_slow_handler_times_out_as_a_transient_failure() {
    let ladder = Ladder::create("slow", "100ms", 1).await;
    let handler = Scripted::new(&[("slow", &[Step::Sleep(Duration::from_secs(30))])]);
    let mut config = ladder.config();
    config.handler_timeout = Duration::from_millis(300);
    let listener = Listener::start(config, handler.clone()).await.unwrap();
    produce(ladder.source(), 0, "slow", "v", &[]).await;

    eventually("the retry", SETTLE, || async { (handler.attempts("slow") == [1, 2]).then_some(()) }).await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    assert_eq!(stats.handler_timeouts, 1);
    let retried = wait_for_records(ladder.retry(0), 1).await;
    assert_eq!(header(&retried[0], "x-error"), "handler timed out after 300ms");
}

/// With calls in tasks of their own, a handler call that blocks its thread
/// ignores its timeout's cancellation: the partition does not wait for it
/// (the record goes on to its retry after the timeout and a bounded wait
/// for the call to end), the call runs on detached, counted, and the
/// listener says it is not ready until the call ends.
// Two runtime threads: the blocked call takes one, as it would one of a
// service's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_handler_call_that_ignores_its_cancellation_is_detached_and_reported() {
    let ladder = Ladder::create("deaf", "100ms", 1).await;
    let blocked_for = Duration::from_secs(12);
    let handler = Scripted::new(&[("deaf", &[Step::Block(blocked_for)])]);
    let mut config = ladder.config();
    config.handler_timeout = Duration::from_millis(500);
    config.handler_calls = retry_kafka::HandlerCalls::Spawned;
    let listener = crate::support::start_joined_with(config, handler.clone()).await;
    produce(ladder.source(), 0, "deaf", "v", &[]).await;
    // The timeout and the bounded wait for the call's end, then the retry:
    // well before the blocked call ends.
    eventually("the retry", SETTLE, || async { (handler.attempts("deaf") == [1, 2]).then_some(()) }).await;
    assert_eq!(handler.blocked_ended(), 0, "the partition waited for the blocked call");
    let stats = listener.stats().snapshot();
    assert_eq!((stats.handler_timeouts, stats.detached_calls), (1, 1));
    assert!(!listener.is_ready(), "ready while a detached call runs");
    eventually("the blocked call to end", blocked_for + SETTLE, || async {
        (handler.blocked_ended() == 1).then_some(())
    })
    .await;
    eventually("ready again", SETTLE, || async { listener.is_ready().then_some(()) }).await;
    listener.shutdown().await;
    let retried = wait_for_records(ladder.retry(0), 1).await;
    assert_eq!(header(&retried[0], "x-error"), "handler timed out after 500ms");
}

/// A polled handler call (the default) that blocks its thread past its
/// timeout holds its partition, since nothing can cancel it between two
/// polls: its outcome counts (no retry of a call that succeeded), it is
/// counted and logged, and the partition goes on behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polled_handler_call_that_blocks_its_thread_holds_its_partition_and_counts() {
    let ladder = Ladder::create("blocking", "100ms", 1).await;
    let handler = Scripted::new(&[("blocking", &[Step::Block(Duration::from_secs(2))])]);
    let mut config = ladder.config();
    config.handler_timeout = Duration::from_millis(500);
    let listener = crate::support::start_joined_with(config, handler.clone()).await;
    produce(ladder.source(), 0, "blocking", "v", &[]).await;
    produce(ladder.source(), 0, "after", "v", &[]).await;
    wait_committed(&ladder, &[Some(2)]).await;
    assert_eq!(handler.attempts("blocking"), [1], "a call that succeeded was retried");
    assert_eq!(handler.attempts("after"), [1]);
    assert_eq!(handler.blocked_ended(), 1);
    let stats = listener.stats().snapshot();
    assert_eq!((stats.blocking_calls, stats.handler_timeouts, stats.retried), (1, 0, 0));
    listener.shutdown().await;
}

/// A shutdown whose grace runs out while a polled handler call blocks its
/// thread does not wait for the call: the partition's worker is detached
/// after a bounded wait, counted, and ends when the call does, reporting
/// nothing (the record is not committed: the next owner handles it again).
///
/// The runtime must go on meanwhile: a call that blocks the thread that
/// last drove tokio's timers and sockets, while every other worker thread
/// sleeps with nothing to do, stalls the whole runtime until it returns
/// (no thread wakes to drive them). A service has other work that keeps
/// its threads awake; here a thread outside the runtime hands it a task
/// every 20 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_detaches_a_worker_held_by_a_blocking_polled_call() {
    let _awake = KeepAwake::start();
    let ladder = Ladder::create("held", "100ms", 1).await;
    let blocked_for = Duration::from_secs(15);
    let handler = Scripted::new(&[("held", &[Step::Block(blocked_for), Step::Succeed])]);
    let mut config = ladder.config();
    config.handler_timeout = Duration::from_millis(500);
    config.shutdown_grace = Duration::from_millis(500);
    let listener = crate::support::start_joined_with(config, handler.clone()).await;
    produce(ladder.source(), 0, "held", "v", &[]).await;
    eventually("the call", SETTLE, || async { (handler.attempts("held") == [1]).then_some(()) }).await;
    let stats = listener.stats().clone();
    let started = std::time::Instant::now();
    listener.shutdown().await;
    assert!(started.elapsed() < blocked_for, "the shutdown waited for the blocked call");
    assert_eq!(handler.blocked_ended(), 0, "the shutdown waited for the blocked call");
    assert_eq!(stats.snapshot().detached_calls, 1);
    eventually("the blocked call to end", blocked_for + SETTLE, || async {
        (handler.blocked_ended() == 1).then_some(())
    })
    .await;
    // Given up, it reported nothing: the next owner handles the record again.
    let listener = crate::support::start_joined_with(ladder.config(), handler.clone()).await;
    wait_committed(&ladder, &[Some(1)]).await;
    assert_eq!(handler.attempts("held"), [1, 1]);
    listener.shutdown().await;
}

/// Hands the current runtime an empty task every 20 ms from a thread of
/// its own, so a worker thread wakes up (and drives timers and sockets)
/// however the others are occupied; stops when dropped.
struct KeepAwake(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl KeepAwake {
    fn start() -> KeepAwake {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (handle, stopped) = (tokio::runtime::Handle::current(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                handle.spawn(async {});
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        KeepAwake(stop)
    }
}

impl Drop for KeepAwake {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[tokio::test]
async fn compressed_batches_from_a_foreign_producer_are_handled() {
    use integration::{broker_addr, kafka_client};
    let ladder = Ladder::create("compressed", "100ms", 1).await;
    let brokers = broker_addr();
    // Not snappy: tansu 0.6.0 accepts snappy batches but fails every fetch of
    // them (UnexpectedType("Snappy")), whoever the client; Kafka's and the
    // mock's snappy batches are read in the billing bench and the unit tests.
    let codecs = ["none", "gzip", "lz4", "zstd", "lz4", "zstd", "gzip", "lz4"];
    for codec in codecs {
        let args = ["produce", "--brokers", &brokers, "--topic", ladder.source(), "--partition", "0"];
        let value = format!("{{\"compressed\":\"{codec}\",\"padding\":\"{}\"}}", "x".repeat(200));
        kafka_client(&[&args[..], &["--key", codec, "--value", &value, "--compression", codec][..]].concat()).await;
    }
    let handler = Scripted::new(&[]);
    let listener = Listener::start(ladder.config(), handler.clone()).await.unwrap();
    eventually("every record", SETTLE, || async { (handler.calls().len() == codecs.len()).then_some(()) }).await;
    wait_committed(&ladder, &[Some(codecs.len() as i64)]).await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    // Records of different keys are handled at once, so in any order.
    let mut keys: Vec<String> = handler.calls().into_iter().map(|c| c.key).collect();
    keys.sort();
    let mut expected = codecs.map(str::to_owned).to_vec();
    expected.sort();
    assert_eq!(keys, expected);
    assert_eq!((stats.undecodable_records, stats.fetch_failures), (0, 0), "{stats:?}");
}

/// A handler call that outlives the shutdown grace period is cancelled, and
/// `shutdown` returns only once it has ended: nothing of the listener keeps
/// running behind the caller's back.
#[tokio::test]
async fn shutdown_cancels_a_handler_call_that_outlives_the_grace_period() {
    let ladder = Ladder::create("hang", "100ms", 1).await;
    let handler = Scripted::new(&[("h", &[Step::Hang])]);
    let listener = crate::support::start_joined(&ladder, handler.clone()).await;
    produce(ladder.source(), 0, "h", "{}", &[]).await;
    eventually("the call to start", SETTLE, || async { (handler.hangs().0 == 1).then_some(()) }).await;
    listener.shutdown().await;
    assert_eq!(handler.hangs(), (1, 1), "the hanging call still runs after shutdown returned");
}
