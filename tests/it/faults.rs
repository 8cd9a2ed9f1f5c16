//! The faults a production cluster produces every week, injected into the
//! three-broker mock cluster while records flow: leader moves, stale views
//! of a partition, a broker outage, a moved coordinator, refused requests,
//! requests that never answer. Nothing may be lost, nothing may wedge.
//!
//! Every test here needs the mock's fault injection (`Need::MockFaults` in
//! `needs.rs`).

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use integration::{KafkaCluster, MockCluster};

use crate::support::{
    committed, eventually, produce, produce_batch, read_partition, start_joined, start_joined_with, Ladder, Scripted,
    Step, SETTLE,
};

/// Kafka's error codes, as the mock injects them.
mod code {
    pub(crate) const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub(crate) const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    pub(crate) const MESSAGE_TOO_LARGE: i16 = 10;
    pub(crate) const RECORD_LIST_TOO_LARGE: i16 = 18;
    pub(crate) const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    pub(crate) const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    pub(crate) const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub(crate) const NOT_COORDINATOR: i16 = 16;
    pub(crate) const REBALANCE_IN_PROGRESS: i16 = 27;
    pub(crate) const UNKNOWN_MEMBER_ID: i16 = 25;
    pub(crate) const NONE: i16 = 0;
}

/// Kafka's API keys.
mod api {
    pub(crate) const PRODUCE: i16 = 0;
    pub(crate) const FETCH: i16 = 1;
    pub(crate) const OFFSET_COMMIT: i16 = 8;
    pub(crate) const OFFSET_FETCH: i16 = 9;
    pub(crate) const JOIN_GROUP: i16 = 11;
    pub(crate) const HEARTBEAT: i16 = 12;
}

/// `count` keys `<prefix>-<n>`.
fn keys(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|n| format!("{prefix}-{n}")).collect()
}

/// Produces each key once, spread over `partitions` partitions.
async fn produce_keys(topic: &str, partitions: i32, keys: &[String]) {
    for (n, key) in keys.iter().enumerate() {
        produce(topic, n as i32 % partitions, key, "{}", &[]).await;
    }
}

/// Waits until every key was handled to the end of its script (its last
/// call succeeded), and returns how often the source topic delivered each.
async fn wait_all_handled(ladder: &Ladder, handler: &Scripted, keys: &[String]) -> BTreeMap<String, usize> {
    eventually(&format!("all {} keys handled", keys.len()), SETTLE * 2, || async {
        keys.iter().all(|k| handler.succeeded(k)).then_some(())
    })
    .await;
    let mut deliveries = BTreeMap::new();
    for call in handler.calls().into_iter().filter(|c| c.topic == ladder.source()) {
        *deliveries.entry(call.key).or_default() += 1;
    }
    deliveries
}

/// Leaders of the source and retry partitions move between the three
/// brokers while records flow, and a broker answers OFFSET_OUT_OF_RANGE for
/// positions that are valid (as a follower or a deposed leader does before
/// it caught up): every record is handled, from the source exactly once,
/// and no position is reset.
#[tokio::test]
async fn leader_moves_and_stale_out_of_range_answers_reset_nothing() {
    let mock = MockCluster::get();
    let ladder = Ladder::create("leader-moves", "200ms", 2).await;
    let wave = |n: usize| keys(&format!("w{n}"), 30);
    // Every fifth record of each wave takes the retry rung once.
    let script: Vec<(String, Vec<Step>)> = (0..4)
        .flat_map(wave)
        .enumerate()
        .filter(|(i, _)| i % 5 == 0)
        .map(|(_, k)| (k, vec![Step::Transient]))
        .collect();
    let script: Vec<(&str, &[Step])> = script.iter().map(|(k, s)| (k.as_str(), s.as_slice())).collect();
    let handler = Scripted::new(&script);
    let listener = start_joined(&ladder, Arc::clone(&handler)).await;

    let mut all = Vec::new();
    for n in 0..4 {
        let keys = wave(n);
        produce_keys(ladder.source(), 2, &keys).await;
        all.extend(keys);
        wait_all_handled(&ladder, &handler, &all).await;
        match n {
            // Leaders move round the cluster.
            0 => {
                mock.set_leader(ladder.source(), 0, 2).await;
                mock.set_leader(ladder.source(), 1, 3).await;
                mock.set_leader(ladder.retry(0), 0, 3).await;
                mock.set_leader(ladder.retry(0), 1, 1).await;
            }
            // Valid positions answered OFFSET_OUT_OF_RANGE a few times.
            1 => {
                for partition in 0..2 {
                    let errors = [code::OFFSET_OUT_OF_RANGE; 3];
                    mock.push_partition_errors(ladder.source(), partition, api::FETCH, &errors).await;
                    mock.push_partition_errors(ladder.retry(0), partition, api::FETCH, &errors).await;
                }
            }
            // A follower whose watermarks trail is named leader in the next
            // Metadata answers, while the real leader moves on.
            2 => {
                for partition in 0..2 {
                    mock.set_follower(ladder.source(), partition, 1).await;
                    mock.set_follower_wmarks(ladder.source(), partition, 0, 1).await;
                    mock.push_leader_response(ladder.source(), partition, 1).await;
                    mock.set_leader(ladder.source(), partition, 3 - partition).await;
                }
            }
            _ => {}
        }
    }
    let deliveries = wait_all_handled(&ladder, &handler, &all).await;
    for partition in 0..2 {
        mock.set_follower_wmarks(ladder.source(), partition, -1, -1).await;
    }
    let twice: Vec<_> = deliveries.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once from the source without any crash: {twice:?}");
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    assert_eq!(stats.offset_resets, 0, "{stats:?}");
    assert!(stats.positions_kept >= 2, "the stale answers were not exercised: {stats:?}");
    let source = committed(&ladder.connection, &ladder.group_id, ladder.source(), 2).await;
    assert_eq!(source.values().map(|o| o.unwrap_or(0)).sum::<i64>(), all.len() as i64, "{source:?}");
}

/// Source deliveries beyond the first, in total.
fn redeliveries(deliveries: &BTreeMap<String, usize>) -> usize {
    deliveries.values().map(|n| n - 1).sum()
}

/// Produces `keys` one by one to `partition`, `gap` apart, in a task of
/// its own.
fn produce_slowly(topic: String, partition: i32, keys: Vec<String>, gap: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for key in &keys {
            produce(&topic, partition, key, "{}", &[]).await;
            tokio::time::sleep(gap).await;
        }
    })
}

/// The broker that coordinates every group of the listener and leads one
/// source partition goes down for ten seconds, longer than the session,
/// while records flow on the partitions the other brokers lead: the
/// listener keeps handling them, loses its session, rejoins once the
/// broker is back, and resumes after what it finished instead of handling
/// it again; every record is handled, and the redeliveries stay few.
#[tokio::test]
async fn a_broker_down_for_ten_seconds_loses_nothing() {
    let mock = MockCluster::get();
    let ladder = Ladder::create("broker-down", "200ms", 3).await;
    for (topic, group) in ladder.consumed() {
        mock.set_group_coordinator(&group, 1).await;
        for partition in 0..3 {
            mock.set_leader(&topic, partition, partition + 1).await;
        }
    }
    let all = keys("k", 120);
    let script: Vec<(&str, &[Step])> = all.iter().step_by(7).map(|k| (k.as_str(), &[Step::Transient][..])).collect();
    let handler = Scripted::new(&script);
    let listener = start_joined(&ladder, Arc::clone(&handler)).await;

    produce_keys(ladder.source(), 3, &all[..40]).await;
    wait_all_handled(&ladder, &handler, &all[..40]).await;
    // One producer per partition: the one whose leader is down waits for
    // it, the others go on.
    let producers: Vec<_> = (0..3)
        .map(|partition| {
            let keys: Vec<String> = all[40..].iter().skip(partition).step_by(3).cloned().collect();
            produce_slowly(ladder.source().to_owned(), partition as i32, keys, Duration::from_millis(100))
        })
        .collect();
    mock.broker_down(1).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    mock.broker_up(1).await;
    for producer in producers {
        producer.await.expect("the producer finishes");
    }
    let deliveries = wait_all_handled(&ladder, &handler, &all).await;

    let stats = listener.stats().snapshot();
    let redelivered = redeliveries(&deliveries);
    eprintln!("broker down for 10 s: {redelivered} redeliveries from the source of {} records; {stats:?}", all.len());
    listener.shutdown().await;
    assert_eq!(stats.offset_resets, 0, "{stats:?}");
    assert!(stats.commit_failures > 0 && stats.fetch_failures > 0, "the outage was not exercised: {stats:?}");
    assert!(redelivered <= all.len() / 5, "{redelivered} redeliveries: {deliveries:?}");
    let source = committed(&ladder.connection, &ladder.group_id, ladder.source(), 3).await;
    assert_eq!(source.values().map(|o| o.unwrap_or(0)).sum::<i64>(), all.len() as i64, "{source:?}");
}

/// The group coordinator moves to another broker twice, and the
/// coordinator answers OffsetCommit with NOT_COORDINATOR,
/// COORDINATOR_LOAD_IN_PROGRESS and REBALANCE_IN_PROGRESS, Heartbeat with
/// REBALANCE_IN_PROGRESS and JoinGroup with COORDINATOR_NOT_AVAILABLE:
/// commits land, the group settles, every record is handled.
#[tokio::test]
async fn a_moved_coordinator_and_group_errors_are_survived() {
    let mock = MockCluster::get();
    let ladder = Ladder::create("coordinator", "200ms", 2).await;
    let all = keys("c", 90);
    let handler = Scripted::new(&[]);
    let listener = start_joined(&ladder, Arc::clone(&handler)).await;
    let groups: Vec<String> = ladder.consumed().into_iter().map(|(_, g)| g).collect();

    produce_keys(ladder.source(), 2, &all[..30]).await;
    wait_all_handled(&ladder, &handler, &all[..30]).await;
    for group in &groups {
        mock.set_group_coordinator(group, 2).await;
    }
    mock.push_request_errors(api::OFFSET_COMMIT, &[code::NOT_COORDINATOR, code::COORDINATOR_LOAD_IN_PROGRESS]).await;
    produce_keys(ladder.source(), 2, &all[30..60]).await;
    wait_all_handled(&ladder, &handler, &all[..60]).await;

    for group in &groups {
        mock.set_group_coordinator(group, 3).await;
    }
    mock.push_request_errors(api::OFFSET_COMMIT, &[code::REBALANCE_IN_PROGRESS]).await;
    mock.push_request_errors(api::HEARTBEAT, &[code::REBALANCE_IN_PROGRESS]).await;
    mock.push_request_errors(api::JOIN_GROUP, &[code::COORDINATOR_NOT_AVAILABLE]).await;
    produce_keys(ladder.source(), 2, &all[60..]).await;
    let deliveries = wait_all_handled(&ladder, &handler, &all).await;
    eventually("the source group to commit every record", SETTLE, || async {
        let source = committed(&ladder.connection, &ladder.group_id, ladder.source(), 2).await;
        (source.values().map(|o| o.unwrap_or(0)).sum::<i64>() == all.len() as i64).then_some(())
    })
    .await;
    let stats = listener.stats().snapshot();
    let redelivered = redeliveries(&deliveries);
    eprintln!("moved coordinators: {redelivered} redeliveries of {} records; {stats:?}", all.len());
    listener.shutdown().await;
    assert_eq!(stats.offset_resets, 0, "{stats:?}");
    assert!(redelivered <= 10, "{redelivered} redeliveries: {deliveries:?}");
}

/// Produce requests to the retry and dead-letter topics are answered with
/// NOT_LEADER_OR_FOLLOWER (tried again), MESSAGE_TOO_LARGE and
/// RECORD_LIST_TOO_LARGE (split in two and sent again): every record lands,
/// in order, and the partition never stalls. Requests are capped in bytes
/// (4 KiB here), so a fetched batch's republications take several.
#[tokio::test]
async fn refused_produce_requests_are_retried_or_split() {
    let mock = MockCluster::get();
    let ladder = Ladder::create("refused-produce", "200ms", 1).await;
    let retried = keys("r", 24);
    let dead = keys("d", 6);
    let mut script: Vec<(&str, &[Step])> = retried.iter().map(|k| (k.as_str(), &[Step::Transient][..])).collect();
    script.extend(dead.iter().map(|k| (k.as_str(), &[Step::Permanent][..])));
    let handler = Scripted::new(&script);
    let value = "v".repeat(400);
    // One record batch, produced before the listener starts, so one fetch
    // brings them all and their republications go out together.
    let records: Vec<(String, String)> = retried.iter().chain(&dead).map(|k| (k.clone(), value.clone())).collect();
    produce_batch(ladder.source(), 0, &records).await;
    let too_large = [code::NOT_LEADER_OR_FOLLOWER, code::MESSAGE_TOO_LARGE, code::RECORD_LIST_TOO_LARGE];
    mock.push_partition_errors(ladder.retry(0), 0, api::PRODUCE, &too_large).await;
    mock.push_partition_errors(ladder.dlq(), 0, api::PRODUCE, &[code::MESSAGE_TOO_LARGE]).await;
    let mut config = ladder.config();
    config.publish_max_request_bytes = 4096;
    let listener = retry_kafka::Listener::start(config, Arc::clone(&handler)).await.unwrap();

    wait_all_handled(&ladder, &handler, &retried).await;
    let dead_letters = eventually("the dead letters", SETTLE, || async {
        let records = read_partition(ladder.dlq(), 0).await;
        (records.len() >= dead.len()).then_some(records)
    })
    .await;
    let stats = listener.stats().snapshot();
    assert!(listener.is_ready(), "stalled after errors that splitting or retrying fixes");
    listener.shutdown().await;
    let landed: Vec<String> =
        dead_letters.iter().map(|r| String::from_utf8_lossy(r.record.key.as_deref().unwrap()).into_owned()).collect();
    assert_eq!(landed, dead);
    let on_rung: Vec<String> = read_partition(ladder.retry(0), 0)
        .await
        .iter()
        .map(|r| String::from_utf8_lossy(r.record.key.as_deref().unwrap()).into_owned())
        .collect();
    assert_eq!(on_rung, retried, "in order, each once");
    assert!(stats.publish_splits >= 2, "{stats:?}");
}

/// The broker acknowledges a republication seconds late (its answer to the
/// produce request delayed): the records after the failed one, of other
/// keys, are all handled meanwhile, ten times the window's places in
/// handling, while the source stays committed below the failed record until
/// the broker answered; then everything is committed, and the failed record
/// is on the rung once.
#[tokio::test]
async fn a_slow_acknowledgement_holds_the_commit_position_not_the_records_after_it() {
    let mock = MockCluster::get();
    let ladder = Ladder::create("slow-ack", "1m", 1).await;
    let after = keys("after", 40);
    let mut script: Vec<(&str, &[Step])> = vec![("failing", &[Step::Transient])];
    script.extend(after.iter().map(|k| (k.as_str(), &[Step::Succeed][..])));
    let handler = Scripted::new(&script);
    let records: Vec<(String, String)> =
        std::iter::once("failing".to_owned()).chain(after.iter().cloned()).map(|k| (k, "{}".to_owned())).collect();
    let failing = produce_batch(ladder.source(), 0, &records).await;
    // The rung's partition on broker 1, whose next answer to a produce
    // request comes three seconds late.
    mock.set_leader(ladder.retry(0), 0, 1).await;
    mock.push_broker_errors(1, api::PRODUCE, &[(code::NONE, Duration::from_secs(3))]).await;
    let mut config = ladder.config();
    config.window = retry_core::window::WindowConfig::new(4, retry_core::window::NullKeys::Ordered).unwrap();
    let listener = retry_kafka::Listener::start(config, Arc::clone(&handler)).await.unwrap();

    eventually("the records after the failed one handled", SETTLE, || async {
        after.iter().all(|k| handler.succeeded(k)).then_some(())
    })
    .await;
    let stats = listener.stats().snapshot();
    assert_eq!(stats.retried, 0, "the records after the failed one waited for its republication: {stats:?}");
    let position = committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0];
    assert!(
        position.is_none_or(|p| p <= failing),
        "committed {position:?} past the unacknowledged record at {failing}"
    );
    eventually("every record committed", SETTLE, || async {
        (committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0] == Some(failing + 41))
            .then_some(())
    })
    .await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    let on_rung: Vec<String> = read_partition(ladder.retry(0), 0)
        .await
        .iter()
        .map(|r| String::from_utf8_lossy(r.record.key.as_deref().unwrap()).into_owned())
        .collect();
    assert_eq!(on_rung, ["failing"]);
    assert_eq!((stats.retried, handler.calls().len()), (1, 41), "{stats:?}");
}

/// A partition whose retries the broker refuses (TOPIC_AUTHORIZATION_FAILED,
/// as after a lost ACL) stops with an error, the stall gauge at 1 and the
/// listener not ready, so an alert fires; once the broker accepts again it
/// resumes by itself, and nothing was lost or skipped.
#[tokio::test]
async fn a_partition_that_cannot_publish_stalls_visibly_and_resumes() {
    let mock = MockCluster::get();
    let ladder = Ladder::create("stall", "200ms", 1).await;
    let handler = Scripted::new(&[("s", &[Step::Transient])]);
    let mut config = ladder.config();
    config.publish_backoff_max = Duration::from_millis(300);
    let listener = retry_kafka::Listener::start(config, Arc::clone(&handler)).await.unwrap();
    let metrics = listener.metrics();
    let stalled_gauge = |metrics: &retry_kafka::MetricsExposition| {
        metrics.sample("kafka_retry_partition_stalled", &format!("topic=\"{}\",partition=\"0\"", ladder.source()))
    };
    eventually("ready", SETTLE, || async { listener.is_ready().then_some(()) }).await;

    mock.push_partition_errors(ladder.retry(0), 0, api::PRODUCE, &[code::TOPIC_AUTHORIZATION_FAILED; 30]).await;
    let stalled = produce(ladder.source(), 0, "s", "{}", &[]).await;
    produce(ladder.source(), 0, "after", "{}", &[]).await;
    eventually("the stall to show", SETTLE, || async {
        (!listener.is_ready() && stalled_gauge(&metrics) == Some(1.0)).then_some(())
    })
    .await;
    // Records of other keys go on within the window, but nothing is
    // committed past the record whose retry is not published yet.
    let position = committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0];
    assert!(position.is_none_or(|p| p <= stalled), "committed {position:?} past the stalled record at {stalled}");
    // The pushed refusals run out: the cause is fixed.
    eventually("the partition to resume", SETTLE, || async {
        (listener.is_ready() && handler.succeeded("s") && handler.succeeded("after")).then_some(())
    })
    .await;
    assert_eq!(stalled_gauge(&metrics), Some(0.0));
    eventually("the source group to commit both", SETTLE, || async {
        (committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0] == Some(2)).then_some(())
    })
    .await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    assert!(stats.publish_failures >= 5, "{stats:?}");
}

/// Every broker stops answering (60 s of injected latency, far beyond the
/// 2 s request timeout) for a few seconds, then answers again at once. The
/// connections opened meanwhile hold answers queued behind a minute of
/// delay: a client that waited on them would stall for that minute. Every
/// request has a deadline and a connection that missed one is replaced, so
/// records produced afterwards are handled, retried and committed promptly.
#[tokio::test]
async fn requests_that_never_answer_are_abandoned_and_their_connections_replaced() {
    let mock = MockCluster::get();
    let mut ladder = Ladder::create("no-answer", "200ms", 1).await;
    ladder.connection = ladder.connection.clone().with_request_timeout(Duration::from_secs(2)).unwrap();
    let handler = Scripted::new(&[("after-1", &[Step::Transient])]);
    let listener = start_joined(&ladder, Arc::clone(&handler)).await;
    produce(ladder.source(), 0, "before", "{}", &[]).await;
    eventually("the first record", SETTLE, || async { handler.succeeded("before").then_some(()) }).await;

    for broker in 1..=mock.brokers() {
        mock.set_rtt(broker, Duration::from_secs(60)).await;
    }
    // Long enough for fetches, heartbeats and commits to miss their deadlines.
    tokio::time::sleep(Duration::from_secs(6)).await;
    for broker in 1..=mock.brokers() {
        mock.set_rtt(broker, Duration::ZERO).await;
    }
    let after = keys("after", 5);
    produce_keys(ladder.source(), 1, &after).await;
    // Well within the minute the old connections stay blocked.
    let started = tokio::time::Instant::now();
    eventually("the records produced afterwards", SETTLE, || async {
        after.iter().all(|k| handler.succeeded(k)).then_some(())
    })
    .await;
    eventually("the source group to commit them", SETTLE, || async {
        (committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0] == Some(6)).then_some(())
    })
    .await;
    eprintln!("recovered {:?} after the brokers answered again", started.elapsed());
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    assert_eq!(stats.offset_resets, 0, "{stats:?}");
}

/// Partitions added to the source topic are consumed without any member
/// coming or going: the group's leader notices the new count and rejoins.
/// (Neither test broker can add partitions to a topic; the mock recreates
/// the topic with more, which is the same to the group.)
#[tokio::test]
async fn partitions_added_to_the_source_are_consumed() {
    let mock = MockCluster::get();
    let ladder = Ladder::create("more-partitions", "200ms", 1).await;
    let handler = Scripted::new(&[]);
    let mut config = ladder.config();
    config.partition_check_interval = Duration::from_millis(500);
    let listener = retry_kafka::Listener::start(config, Arc::clone(&handler)).await.unwrap();
    let groups = ladder.consumed().len() as u64;
    eventually("joined", SETTLE, || async { (listener.stats().snapshot().rebalances >= groups).then_some(()) }).await;
    produce(ladder.source(), 0, "before", "{}", &[]).await;
    eventually("the first record", SETTLE, || async { handler.succeeded("before").then_some(()) }).await;

    mock.delete_topic(ladder.source()).await;
    mock.create_topic(ladder.source(), 3).await;
    produce(ladder.source(), 2, "on-a-new-partition", "{}", &[]).await;
    eventually("the record on the new partition", SETTLE, || async {
        handler.succeeded("on-a-new-partition").then_some(())
    })
    .await;
    listener.shutdown().await;
    assert!(handler.calls().iter().any(|c| c.partition == 2), "{:?}", handler.calls());
}

/// The committed offsets a generation starts from are read again, within
/// the generation, when the coordinator cannot answer yet (it still loads
/// the group, or moved): no rebalance for it, where ending the generation
/// made every member of the group rejoin.
#[tokio::test]
async fn committed_offsets_that_cannot_be_read_yet_are_read_again_within_the_generation() {
    let mock = MockCluster::get();
    let ladder = Ladder::create("offset-fetch", "100ms", 1).await;
    // The mock's errors go to whichever OffsetFetch comes first: the
    // dead-letter backlog's first reading (a tool, which asks a moved
    // coordinator three times) may take three of them, the members the rest.
    let failures = [
        code::COORDINATOR_LOAD_IN_PROGRESS,
        code::COORDINATOR_LOAD_IN_PROGRESS,
        code::NOT_COORDINATOR,
        code::COORDINATOR_LOAD_IN_PROGRESS,
        code::NOT_COORDINATOR,
        code::NOT_COORDINATOR,
    ];
    mock.push_request_errors(api::OFFSET_FETCH, &failures).await;
    let handler = Scripted::new(&[]);
    // The operators' pause, read before the members join, would take them all.
    let mut config = ladder.config();
    config.pause_poll_interval = None;
    let listener = crate::support::start_joined_with(config, handler.clone()).await;
    crate::support::fence(&ladder, 0, 1).await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    // What the members did not meet is no other test's business.
    mock.clear_request_errors(api::OFFSET_FETCH).await;
    assert!(stats.offset_fetch_failures >= 1, "the members met none of the errors: {stats:?}");
    let groups = ladder.consumed().len() as u64;
    assert_eq!(stats.rebalances, groups, "one generation per group: {stats:?}");
}

/// A heartbeat the coordinator holds past the session is given up while
/// the session lasts (each waits at most what is left of it), and the next
/// one keeps the membership: waiting the whole request timeout let the
/// session expire, and the member rejoin after working on for seconds on
/// partitions the group no longer gave it.
#[tokio::test]
async fn a_heartbeat_without_an_answer_is_given_up_within_the_session() {
    let mock = MockCluster::get();
    let ladder = Ladder::create("silent-heartbeat", "100ms", 1).await;
    for (_, group) in ladder.consumed() {
        mock.set_group_coordinator(&group, 1).await;
    }
    let handler = Scripted::new(&[]);
    let listener = start_joined(&ladder, handler.clone()).await;
    let config = ladder.config();
    mock.push_broker_errors(1, api::HEARTBEAT, &[(code::NONE, config.session_timeout * 3)]).await;
    // A session's length and more, the time the coordinator gives a silent
    // member: the held heartbeat's answer comes only after it.
    tokio::time::sleep(config.session_timeout + Duration::from_secs(2)).await;
    crate::support::fence(&ladder, 0, 1).await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    let groups = ladder.consumed().len() as u64;
    assert_eq!(stats.rebalances, groups, "the member lost its session: {stats:?}");
}

/// A member the group drops while it drains (the coordinator answers its
/// heartbeats with UNKNOWN_MEMBER_ID) abandons its records in flight at
/// once, instead of finishing work whose partitions another member owns
/// by now; it is counted, and rejoins as a new member. The record is
/// handled again by whoever owns its partition next.
#[tokio::test]
async fn a_member_dropped_while_it_drains_abandons_its_records_at_once() {
    let mock = MockCluster::get();
    let ladder = Ladder::create("evicted-drain", "100ms", 1).await;
    for (_, group) in ladder.consumed() {
        mock.set_group_coordinator(&group, 1).await;
    }
    let config = || {
        let mut c = ladder.config();
        c.handler_timeout = Duration::from_secs(20);
        c.rebalance_timeout = Duration::from_secs(30);
        c
    };
    let handler = Scripted::new(&[("slow", &[Step::Hang])]);
    let first = crate::support::start_joined_with(config(), handler.clone()).await;
    produce(ladder.source(), 0, "slow", "{}", &[]).await;
    eventually("the slow call to start", SETTLE, || async { (handler.hangs().0 == 1).then_some(()) }).await;
    // A second member: the first one drains, for up to its handler timeout.
    let second = retry_kafka::Listener::start(config(), handler.clone()).await.unwrap();
    // Enough for every member's heartbeats for a while, the drain's included.
    mock.push_request_errors(api::HEARTBEAT, &[code::UNKNOWN_MEMBER_ID; 20]).await;
    // Well before the 20 s the drain would otherwise wait.
    let abandoned = tokio::time::timeout(Duration::from_secs(10), async {
        while handler.hangs().1 == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(abandoned.is_ok(), "the dropped member kept draining: {:?}", handler.hangs());
    eventually("the slow record handled again", SETTLE * 2, || async { handler.succeeded("slow").then_some(()) }).await;
    let stats = first.stats().snapshot();
    first.shutdown().await;
    second.shutdown().await;
    mock.clear_request_errors(api::HEARTBEAT).await;
    assert!(stats.evictions >= 1, "{stats:?}");
}

/// A produce request whose answer does not come in time is sent again; the
/// broker must not write its records twice. A follower of the rung is
/// frozen (SIGSTOP), so its leader cannot acknowledge (acks=all) and every
/// try times out while the first one is already in the leader's log; once
/// the follower runs again, the next try is acknowledged. The rung then
/// holds each record once: the broker recognised the tries by their
/// producer id and sequence numbers. The frozen broker leads nothing the
/// test needs otherwise (the source, the groups' coordinators) and is left
/// out of the listener's bootstrap brokers.
#[tokio::test]
async fn a_republication_tried_again_after_a_lost_answer_is_written_once() {
    let cluster = KafkaCluster::get();
    let (ladder, follower) = 'found: {
        for _ in 0..20 {
            let ladder = Ladder::create("idempotent", "100ms", 1).await;
            let (source, rung) = (ladder.source().to_owned(), ladder.retry(0).to_owned());
            // The groups' offsets topic exists once a coordinator was asked for.
            let tp = [retry_kafka::TopicPartition::new(&source, 0)];
            eventually("a coordinator", SETTLE, || async {
                let mut offsets = retry_kafka::GroupOffsets::new(ladder.connection.clone(), &ladder.group_id);
                offsets.committed(&tp).await.ok()
            })
            .await;
            cluster.wait_fully_replicated(&[&source, &rung, "__consumer_offsets"]).await;
            let states = cluster.partitions(&[&source, &rung, "__consumer_offsets"]).await;
            let offsets = &states["__consumer_offsets"];
            let mut busy = vec![states[&source][0].leader, states[&rung][0].leader];
            for (_, group) in ladder.consumed() {
                busy.push(offsets[integration::offsets_partition(&group, offsets.len() as i32) as usize].leader);
            }
            if let Some(f) = states[&rung][0].isr.iter().find(|id| !busy.contains(id)) {
                break 'found (ladder, *f);
            }
        }
        panic!("no ladder with a follower of its rung that leads nothing else it uses, in 20 tries");
    };
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let records: Vec<(String, String)> = keys.iter().map(|k| (k.clone(), "{}".to_owned())).collect();
    produce_batch(ladder.source(), 0, &records).await;
    // Each first attempt takes 1 s, then fails: the follower is frozen by then.
    let slow = [Step::SlowTransient(Duration::from_secs(1))];
    let script: Vec<(&str, &[Step])> = keys.iter().map(|k| (k.as_str(), &slow[..])).collect();
    let handler = Scripted::new(&script);
    let others: Vec<String> = cluster.brokers().iter().filter(|b| b.id != follower).map(|b| b.addr.clone()).collect();
    let mut config = ladder.config();
    config.connection = retry_kafka::ConnectionConfig::new(&others.join(","), "kafka-retry-it-idempotent")
        .unwrap()
        .with_security(integration::security())
        .with_request_timeout(Duration::from_secs(1))
        .unwrap();
    config.publish_backoff_initial = Duration::from_millis(100);
    config.publish_backoff_max = Duration::from_millis(200);
    let listener = start_joined_with(config, handler.clone()).await;
    eventually("the first attempts to start", SETTLE, || async {
        keys.iter().all(|k| handler.attempts(k).first() == Some(&1)).then_some(())
    })
    .await;
    // Frozen until two tries went unanswered, for at most 5 s: less than
    // the broker session (6 s, counted from its last heartbeat, up to 1 s
    // before), after which the controller would fence it and the leader
    // acknowledge without it.
    let paused = cluster.broker(follower).pause();
    let thawed_by = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut failures = 0;
    while failures < 2 && tokio::time::Instant::now() < thawed_by {
        tokio::time::sleep(Duration::from_millis(50)).await;
        failures = listener.stats().snapshot().publish_failures;
    }
    drop(paused);
    eventually("every retry", SETTLE, || async { keys.iter().all(|k| handler.attempts(k) == [1, 2]).then_some(()) })
        .await;
    listener.shutdown().await;
    assert!(failures >= 2, "the produce answers did not time out: {failures} failed tries");
    let on_rung: Vec<String> = read_partition(ladder.retry(0), 0)
        .await
        .into_iter()
        .map(|r| String::from_utf8_lossy(r.record.key.as_deref().unwrap_or_default()).into_owned())
        .collect();
    assert_eq!(on_rung, keys, "each record once on the rung, in order, after {failures} failed tries");
}
