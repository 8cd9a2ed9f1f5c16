//! Consumer-group behaviour of the listener: positions survive restarts and
//! crashes, instances share partitions, heartbeats outlive slow work, and a
//! foreign client (confluent-kafka) shares the group and its offsets.

use std::{collections::BTreeMap, time::Duration};

use integration::{broker_addr, kafka_client, KafkaClientRun};
use retry_kafka::Listener;
use serde_json::Value;

use crate::support::{committed, eventually, produce, read_partition, start_joined, Ladder, Scripted, Step, SETTLE};

#[tokio::test]
async fn a_restart_resumes_from_the_committed_offset() {
    let ladder = Ladder::create("restart", "100ms", 1).await;
    let first = Scripted::new(&[]);
    let listener = Listener::start(ladder.config(), first.clone()).await.unwrap();
    for key in ["a", "b", "c"] {
        produce(ladder.source(), 0, key, "v", &[]).await;
    }
    eventually("three records", SETTLE, || async { (first.calls().len() == 3).then_some(()) }).await;
    listener.shutdown().await;
    assert_eq!(committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0], Some(3));

    // A sentinel after the new records: once it is handled, every record
    // before it was fetched and dispatched, a wrong redelivery included, and
    // the shutdown waits for every call dispatched.
    for key in ["d", "e", "sentinel"] {
        produce(ladder.source(), 0, key, "v", &[]).await;
    }
    let second = Scripted::new(&[]);
    let listener = Listener::start(ladder.config(), second.clone()).await.unwrap();
    eventually("the sentinel", SETTLE, || async { second.succeeded("sentinel").then_some(()) }).await;
    listener.shutdown().await;
    // Different keys, handled at once: in any order.
    let mut keys: Vec<String> = second.calls().into_iter().map(|c| c.key).collect();
    keys.sort();
    assert_eq!(keys, ["d", "e", "sentinel"]);
}

/// A listener crashes between republishing a record and committing its
/// offset; another starts `restart_after` later with the same groups. The
/// record comes again from the source, and its offset is then committed.
async fn crash_then_restart(name: &str, restart_after: Duration) {
    let ladder = Ladder::create(name, "100ms", 1).await;
    let mut config = ladder.config();
    // Commits would happen only after a minute: the crash comes first.
    config.commit_interval = Duration::from_secs(60);
    config.commit_batch = 1_000;
    let first = Scripted::new(&[("k", &[Step::Transient])]);
    let listener = Listener::start(config, first.clone()).await.unwrap();
    produce(ladder.source(), 0, "k", "v", &[]).await;
    eventually("the republication", SETTLE, || async {
        (!read_partition(ladder.retry(0), 0).await.is_empty()).then_some(())
    })
    .await;
    listener.abort();
    assert_eq!(committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0], None);

    tokio::time::sleep(restart_after).await;
    let second = Scripted::new(&[]);
    let listener = Listener::start(ladder.config(), second.clone()).await.unwrap();
    eventually("the source record again", SETTLE, || async {
        second.journey("k").contains(&(ladder.source().to_owned(), 1)).then_some(())
    })
    .await;
    eventually("the source offset committed", SETTLE, || async {
        (committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0] == Some(1)).then_some(())
    })
    .await;
    listener.shutdown().await;
}

#[tokio::test]
async fn a_crash_between_publish_and_commit_redelivers_never_loses() {
    crash_then_restart("crash", Duration::ZERO).await;
}

/// The new member joins while the coordinator still counts the dead one
/// in (its session has 2.5 s to go), so it first follows a dead leader.
#[tokio::test]
async fn a_restart_before_the_crashed_member_expired_redelivers_too() {
    crash_then_restart("early-restart", Duration::from_millis(3500)).await;
}

#[tokio::test]
async fn two_instances_share_partitions_and_one_takes_over_when_the_other_leaves() {
    let ladder = Ladder::create("share", "100ms", 4).await;
    let (a, b) = (Scripted::new(&[]), Scripted::new(&[]));
    let listener_a = start_joined(&ladder, a.clone()).await;
    let listener_b = start_joined(&ladder, b.clone()).await;

    for p in 0..4 {
        produce(ladder.source(), p, &format!("p{p}"), "v", &[]).await;
    }
    eventually("four records", SETTLE, || async { (a.calls().len() + b.calls().len() == 4).then_some(()) }).await;
    let partitions = |h: &Scripted| {
        let mut ps: Vec<i32> = h.calls().into_iter().map(|c| c.partition).collect();
        ps.sort_unstable();
        ps
    };
    let (pa, pb) = (partitions(&a), partitions(&b));
    assert_eq!(pa.len(), 2, "a handled {pa:?}, b handled {pb:?}");
    assert_eq!(pb.len(), 2, "a handled {pa:?}, b handled {pb:?}");

    listener_b.shutdown().await;
    for p in 0..4 {
        produce(ladder.source(), p, &format!("q{p}"), "v", &[]).await;
    }
    eventually("a to take over every partition", SETTLE, || async {
        (a.calls().iter().filter(|c| c.key.starts_with('q')).count() == 4).then_some(())
    })
    .await;
    listener_a.shutdown().await;
    assert_eq!(b.calls().len(), 2, "b handled nothing after leaving");
}

#[tokio::test]
async fn a_crashed_instances_partitions_move_to_the_survivor() {
    let ladder = Ladder::create("survive", "100ms", 2).await;
    let (a, b) = (Scripted::new(&[]), Scripted::new(&[]));
    let listener_a = start_joined(&ladder, a.clone()).await;
    let listener_b = start_joined(&ladder, b.clone()).await;
    for p in 0..2 {
        produce(ladder.source(), p, &format!("p{p}"), "v", &[]).await;
    }
    eventually("two records", SETTLE, || async { (a.calls().len() + b.calls().len() == 2).then_some(()) }).await;
    assert_eq!((a.calls().len(), b.calls().len()), (1, 1), "a: {:?}, b: {:?}", a.calls(), b.calls());

    // a, the first to join, leads the group; it dies without leaving. b
    // learns of it only from the coordinator, once a's session timed out,
    // and must end up with both partitions.
    listener_a.abort();
    for p in 0..2 {
        produce(ladder.source(), p, &format!("q{p}"), "v", &[]).await;
    }
    eventually("b to take over every partition", SETTLE, || async {
        (b.calls().iter().filter(|c| c.key.starts_with('q')).count() == 2).then_some(())
    })
    .await;
    listener_b.shutdown().await;
}

#[tokio::test]
async fn a_retry_delay_longer_than_the_session_timeout_causes_no_rebalance() {
    let ladder = Ladder::create("long-delay", "8s", 1).await;
    let handler = Scripted::new(&[("slowpoke", &[Step::Transient])]);
    let config = ladder.config();
    assert!(config.session_timeout < Duration::from_secs(8));
    let listener = Listener::start(config, handler.clone()).await.unwrap();
    produce(ladder.source(), 0, "slowpoke", "v", &[]).await;
    eventually("the retry after 8 s", Duration::from_secs(40), || async {
        (handler.attempts("slowpoke") == [1, 2]).then_some(())
    })
    .await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    assert_eq!(stats.rebalances, 2, "one join per group, no rebalance while the rung waited");
}

#[tokio::test]
async fn a_foreign_client_shares_the_group_and_its_offsets() {
    let ladder = Ladder::create("foreign", "100ms", 2).await;
    let ours = Scripted::new(&[]);
    let listener = Listener::start(ladder.config(), ours.clone()).await.unwrap();
    eventually("our member to join", SETTLE, || async { (listener.stats().snapshot().rebalances >= 2).then_some(()) })
        .await;
    let before = listener.stats().snapshot().rebalances;

    // confluent-kafka joins our source group; it takes one partition,
    // commits the record it reads there, and leaves.
    let (brokers, group, topic) = (broker_addr(), ladder.group_id.clone(), ladder.source().to_owned());
    let args = ["consume", "--brokers", &brokers, "--group", &group, "--topic", &topic];
    let mut theirs =
        KafkaClientRun::start(&[&args[..], &["--max-records", "1", "--idle-timeout-s", "20", "--commit"]].concat());
    eventually("our member to rejoin with the foreign one", SETTLE, || async {
        (listener.stats().snapshot().rebalances > before).then_some(())
    })
    .await;
    // Their assignment: from now on, each of us reads one partition.
    theirs.wait_for_line("the foreign member's assignment", |line| line.contains(r#""assigned""#)).await;
    produce(ladder.source(), 0, "r0", "v", &[]).await;
    produce(ladder.source(), 1, "r1", "v", &[]).await;

    let output = theirs.finish().await;
    let events: Vec<Value> = output.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let assigned: Vec<&Value> = events.iter().filter(|e| e["event"] == "assigned").collect();
    let read: Vec<&Value> = events.iter().filter(|e| e["event"] == "record").collect();
    assert_eq!(read.len(), 1, "{output}");
    let their_partition = read[0]["partition"].as_i64().unwrap() as i32;
    assert_eq!(assigned.last().unwrap()["partitions"], serde_json::json!([their_partition]), "{output}");

    // We handled the other partition's record. Once they left, we take
    // their partition back from their commit: we read what follows their
    // record, never the record itself. (Waiting for our rebalance count to
    // grow instead would race with it: we may rejoin before they exit.)
    let our_partition = 1 - their_partition;
    eventually("our record", SETTLE, || async {
        ours.calls().iter().any(|c| c.partition == our_partition).then_some(())
    })
    .await;
    produce(ladder.source(), their_partition, "after", "v", &[]).await;
    eventually("us to take their partition back", SETTLE, || async {
        ours.calls().iter().any(|c| c.key == "after").then_some(())
    })
    .await;
    let mut handled: Vec<(i32, String)> = ours.calls().into_iter().map(|c| (c.partition, c.key)).collect();
    handled.sort_unstable();
    let mut expected = vec![(our_partition, format!("r{our_partition}")), (their_partition, "after".to_owned())];
    expected.sort_unstable();
    assert_eq!(handled, expected);

    // Our commits read the same through librdkafka.
    let offsets = BTreeMap::from([(our_partition, Some(1)), (their_partition, Some(2))]);
    eventually("both offsets committed", SETTLE, || async {
        (committed(&ladder.connection, &ladder.group_id, ladder.source(), 2).await == offsets).then_some(())
    })
    .await;
    listener.shutdown().await;
    let args = ["committed", "--brokers", &broker_addr(), "--group", &ladder.group_id, "--topic", ladder.source()];
    let theirs: Value =
        serde_json::from_str(&kafka_client(&[&args[..], &["--partitions", "2"]].concat()).await).unwrap();
    let expected: BTreeMap<String, i64> =
        [(our_partition.to_string(), 1), (their_partition.to_string(), 2)].into_iter().collect();
    assert_eq!(theirs, serde_json::to_value(expected).unwrap());
}

/// A rebalance while a record takes longer than the session timeout: the
/// member keeps heartbeating while it drains, so its session survives and
/// its final commit lands; the slow record is not handled a second time.
///
/// Not on the mock cluster: it refuses every commit while a rebalance is
/// prepared, where Kafka accepts those of the ending generation, so a drain
/// can never commit there.
#[tokio::test]
async fn a_drain_longer_than_the_session_keeps_the_member_and_its_commit() {
    let ladder = Ladder::create("long-drain", "100ms", 1).await;
    let handler = Scripted::new(&[("slow", &[Step::Sleep(Duration::from_secs(9))])]);
    let config = || {
        let mut c = ladder.config();
        c.rebalance_timeout = Duration::from_secs(30);
        c.shutdown_grace = Duration::from_secs(15);
        c.handler_timeout = Duration::from_secs(20);
        c
    };
    assert!(Duration::from_secs(9) > config().session_timeout);
    let first = retry_kafka::Listener::start(config(), handler.clone()).await.unwrap();
    produce(ladder.source(), 0, "slow", "v", &[]).await;
    eventually("the slow record to start", SETTLE, || async { (!handler.attempts("slow").is_empty()).then_some(()) })
        .await;
    // A second member joins: the first drains the slow record, heartbeating.
    let second = retry_kafka::Listener::start(config(), handler.clone()).await.unwrap();
    eventually("the slow record's offset committed", SETTLE, || async {
        (committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0] == Some(1)).then_some(())
    })
    .await;
    // A fence: once committed past it, any redelivery of "slow" was handled.
    crate::support::fence(&ladder, 0, 1).await;
    first.shutdown().await;
    second.shutdown().await;
    assert_eq!(handler.attempts("slow"), [1], "the slow record was handled again");
}

/// A static member (`group_instance_id`, KIP-345) that restarts within its
/// session gets its partitions back with no rebalance: the other member
/// never hears of one and keeps its partition, the restarted member takes
/// up exactly its old partition from its own commits, and nothing is
/// handled twice.
#[tokio::test]
async fn a_static_member_restarts_within_its_session_without_a_rebalance() {
    let ladder = Ladder::create("static", "100ms", 2).await;
    let config = |instance: &str| {
        let mut c = ladder.config();
        c.group_instance_id = Some(format!("{}-{instance}", ladder.group_id));
        c.session_timeout = Duration::from_secs(30);
        c.heartbeat_interval = Duration::from_secs(1);
        c.rebalance_timeout = Duration::from_secs(40);
        c
    };
    let groups = ladder.consumed().len() as u64;
    let (ours, theirs) = (Scripted::new(&[]), Scripted::new(&[]));
    let first = crate::support::start_joined_with(config("a"), ours.clone()).await;
    let other = crate::support::start_joined_with(config("b"), theirs.clone()).await;
    // The first member took part in the rebalance the second one caused.
    eventually("both members settled", SETTLE, || async {
        (first.stats().snapshot().rebalances >= 2 * groups).then_some(())
    })
    .await;
    for partition in 0..2 {
        produce(ladder.source(), partition, &format!("before-{partition}"), "v", &[]).await;
        crate::support::fence(&ladder, partition, 2).await;
    }
    let partition_of = |handler: &Scripted| {
        let mut partitions: Vec<i32> =
            handler.calls().iter().filter(|c| c.topic == ladder.source()).map(|c| c.partition).collect();
        partitions.sort_unstable();
        partitions.dedup();
        partitions
    };
    let (mine, its) = (partition_of(&ours), partition_of(&theirs));
    assert_eq!((mine.len(), its.len()), (1, 1), "one partition each: {mine:?} and {its:?}");
    let rebalances_before = other.stats().snapshot().rebalances;

    // A restart: a static member leaves no group on shutdown, and comes
    // back well within its session.
    first.shutdown().await;
    let restarted = Scripted::new(&[]);
    let second = crate::support::start_joined_with(config("a"), restarted.clone()).await;
    for partition in 0..2 {
        produce(ladder.source(), partition, &format!("after-{partition}"), "v", &[]).await;
        crate::support::fence(&ladder, partition, 2).await;
    }
    let other_stats = other.stats().snapshot();
    second.shutdown().await;
    other.shutdown().await;

    assert_eq!(other_stats.rebalances, rebalances_before, "the other member went through a rebalance");
    assert_eq!(partition_of(&restarted), mine, "the restarted member took another partition");
    assert_eq!(partition_of(&theirs), its, "the other member's partition moved");
    // Each record once, the fences aside: the restart resumed from its commit.
    let mut keys: Vec<String> = [ours.calls(), restarted.calls(), theirs.calls()]
        .concat()
        .into_iter()
        .filter(|c| c.key != "fence")
        .map(|c| c.key)
        .collect();
    keys.sort();
    assert_eq!(keys, ["after-0", "after-1", "before-0", "before-1"]);
}

/// Apache Kafka's own Java client shares a group with our listener: it
/// takes its partition from where our commit left it (reading nothing we
/// handled), its commit reads the same to us, our commits read the same to
/// it, and it reads our dead letters with every header byte for byte as we
/// wrote it, a producer's own headers among them.
#[tokio::test]
async fn a_java_consumer_shares_the_group_and_reads_the_dead_letters_as_written() {
    let ladder = Ladder::create("java", "100ms", 2).await;
    let ours = Scripted::new(&[("declined", &[Step::Permanent])]);
    let listener = start_joined(&ladder, ours.clone()).await;
    produce(ladder.source(), 0, "declined", r#"{"n":0}"#, &[("traceparent", b"00-4bf92f3577b34da6-00")]).await;
    for partition in 0..2 {
        produce(ladder.source(), partition, &format!("ours-{partition}"), "v", &[]).await;
        crate::support::fence(&ladder, partition, 2).await;
    }
    let before = listener.stats().snapshot().rebalances;

    // The Java client joins our source group and takes one partition.
    let brokers = broker_addr();
    let (group, source) = (ladder.group_id.clone(), ladder.source().to_owned());
    let consume = ["consume", "--brokers", &brokers, "--group", &group, "--topic", &source];
    let mut theirs = KafkaClientRun::start_java(
        &[&consume[..], &["--max-records", "1", "--idle-timeout-s", "30", "--commit"]].concat(),
    );
    eventually("our member to rejoin with the Java one", SETTLE, || async {
        (listener.stats().snapshot().rebalances > before).then_some(())
    })
    .await;
    // Under the consumer group protocol its first assignment may be empty
    // (the partition is still ours, being released): wait for the one
    // that gives it a partition.
    theirs
        .wait_for_line("the Java member's assignment", |line| {
            line.contains(r#""assigned""#) && !line.contains(r#""partitions":[]"#)
        })
        .await;
    for partition in 0..2 {
        produce(ladder.source(), partition, &format!("after-{partition}"), "v", &[]).await;
    }
    let output = theirs.finish().await;
    let events: Vec<Value> = output.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let read: Vec<&Value> = events.iter().filter(|e| e["event"] == "record").collect();
    assert_eq!(read.len(), 1, "{output}");
    let their_partition = read[0]["partition"].as_i64().unwrap() as i32;
    // Nothing we handled: the first record after our commit.
    assert_eq!(read[0]["key"], format!("after-{their_partition}"), "{output}");

    // Once it left, we take its partition back from its commit.
    let our_partition = 1 - their_partition;
    produce(ladder.source(), their_partition, "back", "v", &[]).await;
    eventually("us to take its partition back", SETTLE, || async { ours.succeeded("back").then_some(()) }).await;
    for partition in 0..2 {
        crate::support::fence(&ladder, partition, 2).await;
    }
    assert!(ours.succeeded(&format!("after-{our_partition}")));
    assert!(!ours.calls().iter().any(|c| c.key == format!("after-{their_partition}")), "we handled its record too");
    listener.shutdown().await;

    // Our commits read the same through the Java client.
    let committed_here = committed(&ladder.connection, &ladder.group_id, ladder.source(), 2).await;
    let args = ["committed", "--brokers", &brokers, "--group", &ladder.group_id, "--topic", ladder.source()];
    let committed_there: Value =
        serde_json::from_str(&integration::java_client(&[&args[..], &["--partitions", "2"]].concat()).await).unwrap();
    for (partition, offset) in &committed_here {
        assert_eq!(committed_there[partition.to_string()].as_i64(), *offset, "{committed_there}");
    }

    // Our dead letter, through the Java client: every header as we wrote it.
    let dead = read_partition(ladder.dlq(), 0).await;
    assert_eq!(dead.len(), 1);
    let reader = integration::unique_topic("java-dlq-reader");
    let dlq = ["consume", "--brokers", &brokers, "--group", &reader, "--topic", ladder.dlq()];
    let output =
        integration::java_client(&[&dlq[..], &["--max-records", "1", "--idle-timeout-s", "30"]].concat()).await;
    let record = output.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).find(|e| e["event"] == "record");
    let record = record.unwrap_or_else(|| panic!("no dead letter read:\n{output}"));
    assert_eq!(record["key"], "declined");
    let headers: BTreeMap<String, Vec<u8>> = record["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            let hex = h["hex"].as_str().unwrap();
            let bytes = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
            (h["name"].as_str().unwrap().to_owned(), bytes)
        })
        .collect();
    assert_eq!(headers, dead[0].record.headers, "{output}");
    assert_eq!(headers["traceparent"], b"00-4bf92f3577b34da6-00");
    assert_eq!(headers["x-dead-letter-reason"], b"permanent-failure");
}

/// A member stopped while its join waits (the coordinator holds JoinGroup
/// until every member rejoined, and one drains a slow record) leaves the
/// group on its way out: the generation that follows has only the members
/// that remain, where a join abandoned without a leave made the group wait
/// a session for a member that never comes back.
#[tokio::test]
async fn a_member_stopped_while_it_joins_leaves_the_group() {
    let ladder = Ladder::create("stop-joining", "100ms", 2).await;
    let config = || {
        let mut c = ladder.config();
        c.handler_timeout = Duration::from_secs(40);
        c.rebalance_timeout = Duration::from_secs(50);
        c
    };
    // Long enough for a few looks at the group through the Java client.
    let handler = Scripted::new(&[("slow", &[Step::Sleep(Duration::from_secs(30))])]);
    let first = crate::support::start_joined_with(config(), handler.clone()).await;
    let source_rebalances = || crate::support::rebalances_of(&first, &ladder.group_id);
    assert_eq!(source_rebalances(), 1);
    produce(ladder.source(), 0, "slow", "v", &[]).await;
    eventually("the slow record to start", SETTLE, || async { (!handler.attempts("slow").is_empty()).then_some(()) })
        .await;
    // A second member joins; the first drains the slow record meanwhile,
    // so the coordinator holds the second one's join.
    let second = retry_kafka::Listener::start(config(), Scripted::new(&[])).await.unwrap();
    let describe = || async {
        let output =
            integration::java_client(&["describe", "--brokers", &broker_addr(), "--group", &ladder.group_id]).await;
        serde_json::from_str::<Value>(&output).unwrap_or_else(|e| panic!("{e}: {output}"))
    };
    eventually("the second member's join to wait for the first one's", SETTLE, || async {
        let group = describe().await;
        let rebalancing = group["state"].as_str().is_some_and(|s| s.eq_ignore_ascii_case("PreparingRebalance"));
        (rebalancing && group["members"].as_array().unwrap().len() == 2).then_some(())
    })
    .await;
    second.shutdown().await;
    // The first member rejoins once drained: the group settles with it
    // alone, in the generation that followed at once. (Without the leave,
    // the coordinator completed a generation with the departed member,
    // which never synced, and settled only after its session, one
    // generation later.)
    let group = eventually("the group to settle", SETTLE, || async {
        let group = describe().await;
        (group["state"].as_str().is_some_and(|s| s.eq_ignore_ascii_case("stable"))).then_some(group)
    })
    .await;
    let members = group["members"].as_array().unwrap();
    assert_eq!(members.len(), 1, "{group}");
    assert_eq!(members[0]["partitions"], serde_json::json!([0, 1]), "{group}");
    assert_eq!(source_rebalances(), 2, "the source group went through a generation with the departed member");
    crate::support::fence(&ladder, 1, 2).await;
    first.shutdown().await;
    assert!(handler.succeeded("slow"));
}

/// A rebalance lets a call in flight run up to its handler timeout, even
/// past the shutdown grace: with a one-second grace, a four-second call is
/// finished and committed by the member that started it, not abandoned and
/// handled again by the next owner.
///
/// Not on the mock cluster, which refuses the commits of a generation that
/// is being rebalanced (there, the record would be redelivered anyway).
#[tokio::test]
async fn a_rebalance_lets_a_call_run_past_the_shutdown_grace() {
    let ladder = Ladder::create("long-call", "100ms", 1).await;
    let handler = Scripted::new(&[("slow", &[Step::Sleep(Duration::from_secs(4))])]);
    let config = || {
        let mut c = ladder.config();
        c.shutdown_grace = Duration::from_secs(1);
        c.handler_timeout = Duration::from_secs(8);
        c.rebalance_timeout = Duration::from_secs(20);
        c
    };
    let first = crate::support::start_joined_with(config(), handler.clone()).await;
    produce(ladder.source(), 0, "slow", "v", &[]).await;
    eventually("the slow call to start", SETTLE, || async { (!handler.attempts("slow").is_empty()).then_some(()) })
        .await;
    // A second member: the first one is revoked while the call runs.
    let second = Listener::start(config(), handler.clone()).await.unwrap();
    crate::support::fence(&ladder, 0, 1).await;
    first.shutdown().await;
    second.shutdown().await;
    assert_eq!(handler.attempts("slow"), [1], "the call was abandoned at the grace and handled again");
    assert!(handler.succeeded("slow"));
}

/// How a test's listeners rebalance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rebalancing {
    /// The classic protocol, range: every rebalance stops every partition.
    Eager,
    /// The classic protocol, cooperative-sticky (KIP-429).
    Cooperative,
    /// The consumer group protocol (KIP-848).
    ConsumerProtocol,
}

impl Rebalancing {
    fn configure(self, c: &mut retry_kafka::ListenerConfig) {
        use retry_kafka::{AssignmentStrategy, GroupProtocol};
        (c.group_protocol, c.assignment_strategy) = match self {
            Rebalancing::Eager => (GroupProtocol::Classic, AssignmentStrategy::Range),
            Rebalancing::Cooperative => (GroupProtocol::Classic, AssignmentStrategy::CooperativeSticky),
            Rebalancing::ConsumerProtocol => (GroupProtocol::Consumer, AssignmentStrategy::Range),
        };
    }
}

#[tokio::test]
async fn a_member_joining_and_leaving_mid_traffic_stops_every_partition_when_eager() {
    joining_and_leaving_mid_traffic(Rebalancing::Eager).await;
}

#[tokio::test]
async fn a_member_joining_and_leaving_mid_traffic_moves_only_what_it_must_when_cooperative() {
    joining_and_leaving_mid_traffic(Rebalancing::Cooperative).await;
}

#[tokio::test]
async fn a_member_joining_and_leaving_mid_traffic_moves_only_what_it_must_under_the_consumer_protocol() {
    joining_and_leaving_mid_traffic(Rebalancing::ConsumerProtocol).await;
}

/// A member that joins, then leaves, while records flow: incrementally
/// (cooperative, consumer protocol) the member already there gives up only
/// the partitions the newcomer takes (they drain and commit first) and
/// takes back only those when it leaves; its other partitions never stop.
/// Eagerly, each rebalance stops all of them. Either way, every record is
/// handled once: nothing a member gave up is handled again by the next.
async fn joining_and_leaving_mid_traffic(rebalancing: Rebalancing) {
    const PARTITIONS: i32 = 6;
    let ladder = Ladder::create("incremental", "100ms", PARTITIONS).await;
    let groups = ladder.consumed().len() as u64;
    let all = PARTITIONS as u64 * groups;
    let config = || {
        let mut c = ladder.config();
        rebalancing.configure(&mut c);
        c
    };
    let (a, b) = (Scripted::new(&[]), Scripted::new(&[]));
    let first = crate::support::start_joined_with(config(), a.clone()).await;
    let owned = |l: &Listener| {
        let s = l.stats().snapshot();
        s.partitions_started - s.partitions_stopped
    };
    eventually("the first member to own every partition", SETTLE, || async { (owned(&first) == all).then_some(()) })
        .await;

    let stop_traffic = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = {
        let (source, stop) = (ladder.source().to_owned(), stop_traffic.clone());
        tokio::spawn(async move {
            let mut sent = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                produce(&source, sent % PARTITIONS, &format!("t-{sent}"), "v", &[]).await;
                sent += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            sent
        })
    };
    let second = crate::support::start_joined_with(config(), b.clone()).await;
    eventually("the members to share the partitions", SETTLE, || async {
        (owned(&first) + owned(&second) == all && owned(&second) > 0).then_some(())
    })
    .await;
    let after_join = first.stats().snapshot();
    let moved = owned(&second);
    second.shutdown().await;
    eventually("the first member to own every partition again", SETTLE, || async {
        (owned(&first) == all).then_some(())
    })
    .await;
    stop_traffic.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = traffic.await.unwrap();
    for p in 0..PARTITIONS {
        crate::support::fence(&ladder, p, PARTITIONS).await;
    }
    let after_leave = first.stats().snapshot();
    first.shutdown().await;

    if rebalancing == Rebalancing::Eager {
        assert!(
            after_join.partitions_stopped >= all,
            "an eager rebalance stopped only some partitions: {after_join:?}"
        );
    } else {
        assert_eq!(after_join.partitions_stopped, moved, "the first member stopped more than the newcomer took");
        assert_eq!(after_leave.partitions_stopped, moved, "the first member stopped partitions when the other left");
        assert_eq!(after_leave.partitions_started, all + moved, "it started only what came back");
    }
    let mut keys: Vec<String> =
        [a.calls(), b.calls()].concat().into_iter().filter(|c| c.key != "fence").map(|c| c.key).collect();
    let handled = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), sent as usize, "every record was handled");
    assert_eq!(handled, keys.len(), "{} records were handled twice", handled - keys.len());
}
