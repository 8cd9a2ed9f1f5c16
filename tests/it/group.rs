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
async fn a_drain_longer_than_the_session_keeps_the_member_and_its_commit_needs_commits_during_rebalances() {
    let ladder = Ladder::create("long-drain", "100ms", 1).await;
    let handler = Scripted::new(&[("slow", &[Step::Sleep(Duration::from_secs(9))])]);
    let config = || {
        let mut c = ladder.config();
        c.rebalance_timeout = Duration::from_secs(25);
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
