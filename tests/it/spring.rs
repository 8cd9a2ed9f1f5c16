//! Side by side with Spring Kafka's `@RetryableTopic`: the peer in
//! `tests/peers/spring` (Spring Boot 4, Spring Kafka 4) runs against the
//! broker, and what it writes is read as it wrote it. These tests pin
//! Spring's topic names, header names and encodings from a running Spring,
//! not from its documentation.

use std::time::Duration;

use integration::{
    create_topic,
    fake_provider::{FakeProvider, Faults, Script},
    unique_topic, SpringPeer,
};
use retry_kafka::WrittenRecord;
use uuid::Uuid;

use crate::support::{committed, eventually, produce, SETTLE};

/// An `OrderConfirmed` event of `order`.
fn order_event(order: &str) -> String {
    format!(
        r#"{{"event_id":"{}","order_id":"{order}","customer_id":"{}","total_amount":"120.50"}}"#,
        Uuid::new_v4(),
        Uuid::new_v4()
    )
}

/// Every value of header `name`, in order.
fn values<'a>(record: &'a WrittenRecord, name: &str) -> Vec<&'a [u8]> {
    record.headers.iter().filter(|(n, _)| n == name.as_bytes()).filter_map(|(_, v)| v.as_deref()).collect()
}

/// The last value of header `name` as text.
fn text(record: &WrittenRecord, name: &str) -> String {
    String::from_utf8_lossy(record.header(name).flatten().unwrap_or(b"<absent>")).into_owned()
}

/// A big-endian signed integer of 1 to 8 bytes, as Java's
/// `BigInteger.toByteArray` and `ByteBuffer.putInt`/`putLong` write them.
fn big_endian(bytes: &[u8]) -> i64 {
    assert!((1..=8).contains(&bytes.len()), "{} bytes", bytes.len());
    let fill = if bytes[0] & 0x80 != 0 { 0xff } else { 0 };
    let mut all = [fill; 8];
    all[8 - bytes.len()..].copy_from_slice(bytes);
    i64::from_be_bytes(all)
}

/// Our reading of its headers (Spring's, as we read them wherever ours are absent).
fn ours_of(record: &WrittenRecord) -> retry_core::RetryHeaders {
    let headers: retry_core::Headers = record
        .headers
        .iter()
        .filter_map(|(name, value)| Some((String::from_utf8(name.to_vec()).ok()?, value.as_ref()?.to_vec())))
        .collect();
    retry_core::RetryHeaders::decode(&headers).unwrap_or_else(|e| panic!("{e}: {record:?}"))
}

/// The Spring peer on `topic` (one partition), charging through
/// `provider`: four attempts, waiting 1, 2 and 4 s between them.
fn spring_peer(topic: &str, provider: &FakeProvider) -> SpringPeer {
    spring_peer_with(topic, &format!("{topic}-spring"), provider, "1000")
}

/// The Spring peer on `topic` in consumer group `group`: four attempts,
/// waiting `first_delay_ms`, then twice and four times as long.
fn spring_peer_with(topic: &str, group: &str, provider: &FakeProvider, first_delay_ms: &str) -> SpringPeer {
    let url = provider.url();
    SpringPeer::start(&[
        ("PEER_TOPIC", topic),
        ("PEER_GROUP", group),
        ("PEER_PROVIDER_URL", url.as_str()),
        ("PEER_ATTEMPTS", "4"),
        ("PEER_DELAY_MS", first_delay_ms),
        ("PEER_MULTIPLIER", "2.0"),
        ("PEER_PARTITIONS", "1"),
        ("PEER_CONCURRENCY", "1"),
    ])
}

async fn read(topic: &str) -> Vec<WrittenRecord> {
    let connection = integration::connection("kafka-retry-it-read");
    retry_kafka::read_partition(&connection, topic, 0, 0).await.unwrap()
}

/// Spring's ladder for delays of 1, 2 and 4 s (four attempts): topics
/// named by delay (`-retry-1000`, `-retry-2000`, `-retry-4000`) and `-dlt`;
/// a transient failure goes one rung down with the original coordinates
/// written once, the attempt and due time appended at every hop; a
/// permanent one straight to `-dlt`, where the `@DltHandler` gets the
/// original topic and the exception message. The encodings asserted here
/// are what our reading of Spring's headers relies on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spring_peer_retries_and_dead_letters_as_spring_writes_it() {
    let provider = FakeProvider::start(Faults::default()).await;
    let source = unique_topic("spring-orders");
    create_topic(&source, 1).await;
    let (retried, rejected) = (Uuid::new_v4().to_string(), Uuid::new_v4().to_string());
    provider.script(&retried, Script::FailTimes { times: 2 });
    provider.script(&rejected, Script::Reject);
    let retried_at = produce(&source, 0, &retried, &order_event(&retried), &[]).await;
    produce(&source, 0, &rejected, &order_event(&rejected), &[]).await;
    produce(&source, 0, "garbage", "not json", &[]).await;

    let mut peer = spring_peer(&source, &provider);
    let mut handled = Vec::new();
    for _ in 0..2 {
        let line =
            peer.wait_for_line("a dead letter", Duration::from_secs(90), |l| l.starts_with("dead-letter ")).await;
        let line: serde_json::Value = serde_json::from_str(line.trim_start_matches("dead-letter ")).unwrap();
        handled.push(line);
    }
    eventually("the retried order's charge", SETTLE, || async {
        (!provider.charges_for(&retried).is_empty()).then_some(())
    })
    .await;
    let log = peer.log();
    peer.stop();
    assert_eq!(provider.charges_for(&retried).len(), 1, "{log}");
    assert!(provider.charges_for(&rejected).is_empty());

    // The @DltHandler's view: the original topic and the exception message.
    handled.sort_by_key(|l| l["key"].as_str().unwrap_or_default().to_owned());
    let keys: Vec<&str> = handled.iter().map(|l| l["key"].as_str().unwrap_or_default()).collect();
    let mut expected = vec![rejected.as_str(), "garbage"];
    expected.sort();
    assert_eq!(keys, expected, "{handled:?}");
    for line in &handled {
        assert_eq!(line["topic"], format!("{source}-dlt"), "{line}");
        assert_eq!(line["original_topic"], source.as_str(), "{line}");
        let message = line["message"].as_str().unwrap_or_default();
        let cause = if line["key"] == "garbage" { "not an OrderConfirmedEvent" } else { "answered 400" };
        assert!(message.contains(cause), "{line}");
    }

    // The ladder as Spring names it: one record per hop of the retried order.
    let first = read(&format!("{source}-retry-1000")).await;
    let second = read(&format!("{source}-retry-2000")).await;
    assert_eq!((first.len(), second.len()), (1, 1), "{first:?} {second:?}");
    assert!(read(&format!("{source}-retry-4000")).await.is_empty());
    for (hop, record) in [first[0].clone(), second[0].clone()].iter().enumerate() {
        assert_eq!(record.key.as_deref(), Some(retried.as_bytes()));
        // Written once, at the first hop: UTF-8, 4-byte and 8-byte big-endian.
        assert_eq!(values(record, "kafka_original-topic"), [source.as_bytes()]);
        assert_eq!(values(record, "kafka_original-partition"), [&0i32.to_be_bytes()[..]]);
        assert_eq!(values(record, "kafka_original-offset"), [&retried_at.to_be_bytes()[..]]);
        assert_eq!(values(record, "kafka_original-timestamp").len(), 1);
        assert_eq!(text(record, "kafka_original-timestamp-type"), "CreateTime");
        // Appended at every hop: the next attempt as a 4-byte big-endian
        // int, the due time and the source's timestamp as BigInteger bytes.
        let attempts: Vec<i64> = values(record, "retry_topic-attempts").into_iter().map(big_endian).collect();
        assert!(values(record, "retry_topic-attempts").iter().all(|v| v.len() == 4));
        let expected: Vec<i64> = (2..=hop as i64 + 2).collect();
        assert_eq!(attempts, expected, "hop {hop}");
        let due = big_endian(record.header("retry_topic-backoff-timestamp").flatten().expect("a due time"));
        let written = record.timestamp.expect("a timestamp").as_millis();
        let delay = 1000 << hop;
        // Due the delay after the failure, which came before the publish
        // (by how much depends on the machine's load: loosely bounded).
        assert!((delay - 10_000..=delay).contains(&(due - written)), "hop {hop}: due {due}, written {written}");
        let original = big_endian(record.header("retry_topic-original-timestamp").flatten().expect("a timestamp"));
        assert_eq!(original, big_endian(values(record, "kafka_original-timestamp")[0]));
        // Replaced at every hop: the exception, as text.
        assert_eq!(values(record, "kafka_exception-message").len(), 1);
        assert!(text(record, "kafka_exception-message").contains("503"), "{}", text(record, "kafka_exception-message"));
        assert!(text(record, "kafka_exception-fqcn").contains("ListenerExecutionFailedException"));
        assert!(text(record, "kafka_exception-cause-fqcn").ends_with("TransientFailure"));
        // And as we read it: the attempts that failed, the original
        // coordinates, Spring's due time, a transient failure.
        let read = ours_of(record);
        assert_eq!(read.attempt, hop as u32 + 1);
        assert_eq!((read.original_topic.as_str(), read.original_partition), (source.as_str(), 0));
        assert_eq!(read.original_offset, retried_at);
        assert_eq!(read.due_at.map(|t| t.as_millis()), Some(due));
        assert_eq!(read.error_kind, retry_core::FailureKind::Transient);
        assert!(read.error.contains("503") && read.error.ends_with("TransientFailure]"), "{}", read.error);
    }

    // Straight to the dead-letter topic: the same headers, with the
    // permanent failure's exception.
    let dead = read(&format!("{source}-dlt")).await;
    assert_eq!(dead.len(), 2, "{dead:?}");
    for record in &dead {
        assert_eq!(values(record, "kafka_original-topic"), [source.as_bytes()]);
        assert!(text(record, "kafka_exception-cause-fqcn").ends_with("PermanentFailure"), "{record:?}");
        // Spring records no kind: its class, in the error, says permanent.
        let read = ours_of(record);
        assert_eq!((read.attempt, read.original_topic.as_str()), (1, source.as_str()), "{record:?}");
        assert!(read.error.ends_with("PermanentFailure]"), "{}", read.error);
    }
}

/// A mixed estate: billing-bin in the Spring style shares a topic, and its
/// ladder as Spring names it, with the Spring peer. What billing-bin
/// dead-letters reaches Spring's `@DltHandler` with the original topic and
/// billing's error as the exception message, and reads back, through
/// Spring's headers alone, as billing-bin decided it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn springs_dlt_handler_receives_what_billing_bin_dead_letters_in_springs_style() {
    use crate::billing::Setup;
    let provider = FakeProvider::start(Faults::default()).await;
    let setup = Setup { schedule: "1s,2s,4s", partitions: 1, style: "spring", ..Setup::new("spring-mixed") };
    setup.create_topics().await;
    let topology = setup.topology();
    assert_eq!(topology.dead_letter_topic().as_str(), format!("{}-dlt", setup.topic));
    let service = setup.start(&provider).await;
    let mut peer = spring_peer(&setup.topic, &provider);
    // Both listeners read it, and both dead-letter it.
    produce(&setup.topic, 0, "garbage", "not json", &[]).await;
    let ours = loop {
        let line = peer
            .wait_for_line("billing-bin's dead letter", Duration::from_secs(90), |l| l.starts_with("dead-letter "))
            .await;
        let line: serde_json::Value = serde_json::from_str(line.trim_start_matches("dead-letter ")).unwrap();
        if line["exception"] == "retry_core.PermanentFailure" {
            break line;
        }
    };
    let log = service.log();
    service.stop().await;
    peer.stop();
    assert_eq!(ours["original_topic"], setup.topic.as_str(), "{ours}");
    assert_eq!(ours["key"], "garbage", "{ours}");
    // The record as billing-bin wrote it, read through Spring's headers.
    let dead = read(topology.dead_letter_topic().as_str()).await;
    let written = dead
        .iter()
        .find(|r| text(r, "kafka_exception-fqcn") == "retry_core.PermanentFailure")
        .unwrap_or_else(|| panic!("no dead letter of billing-bin's in {dead:?}; its log:\n{log}"));
    assert_eq!(ours["message"], text(written, "kafka_exception-message"), "{ours}");
    assert!(written.header("x-retry-attempt").is_none(), "ours are not written in the Spring style");
    let read = ours_of(written);
    assert_eq!((read.attempt, read.original_topic.as_str(), read.original_offset), (1, setup.topic.as_str(), 0));
    assert_eq!(read.error_kind, retry_core::FailureKind::Permanent);
    assert!(provider.ledger().is_empty());
}

/// Spring's dead letters, operated from here: `billing-bin operators` in
/// the Spring style serves the operators' API over the ladder the Spring
/// peer consumes, consuming nothing itself; `billing-bin dlq show` shows
/// Spring's dead letters with their original coordinates, attempts and
/// exception; `dlq replay` sends one back to Spring's source topic without
/// Spring's retry headers (Spring would read the old attempt count), where
/// Spring charges it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn springs_dead_letters_are_shown_and_replayed_to_spring_by_billing_bin() {
    use crate::billing::Setup;
    let provider = FakeProvider::start(Faults::default()).await;
    let setup = Setup { schedule: "1s,2s,4s", partitions: 1, style: "spring", ..Setup::new("spring-operated") };
    // The source only: Spring creates its ladder itself.
    create_topic(&setup.topic, 1).await;
    let (exhausted, rejected) = (Uuid::new_v4().to_string(), Uuid::new_v4().to_string());
    provider.script(&exhausted, Script::FailTimes { times: 4 });
    provider.script(&rejected, Script::Reject);
    let exhausted_at = produce(&setup.topic, 0, &exhausted, &order_event(&exhausted), &[]).await;
    let rejected_at = produce(&setup.topic, 0, &rejected, &order_event(&rejected), &[]).await;
    let mut peer = spring_peer(&setup.topic, &provider);
    for _ in 0..2 {
        peer.wait_for_line("a dead letter", Duration::from_secs(90), |l| l.starts_with("dead-letter ")).await;
    }
    assert!(provider.ledger().is_empty(), "nothing charged yet");

    let operators = setup.operators_alone().await;
    let (code, stdout, stderr) = setup.dlq_cli(&operators, &["show"]).await;
    assert_eq!(code, 0, "{stderr}");
    let page: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let messages = page["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{page}");
    for (key, offset, attempts, error, cause) in [
        (&exhausted, exhausted_at, 4, "503", "TransientFailure]"),
        (&rejected, rejected_at, 1, "400", "PermanentFailure]"),
    ] {
        let message = messages.iter().find(|m| m["key"]["text"] == key.as_str()).expect("its dead letter");
        let retry = &message["retry"];
        assert_eq!(retry["original_topic"], setup.topic.as_str(), "{message}");
        assert_eq!((retry["original_partition"].as_i64(), retry["original_offset"].as_i64()), (Some(0), Some(offset)));
        assert_eq!(retry["attempt"], attempts, "{message}");
        let text = retry["error"].as_str().unwrap_or_default();
        assert!(text.contains(error) && text.ends_with(cause), "{message}");
        assert_eq!(retry["replay_count"], 0, "{message}");
        // Every header in order, Spring's binary ones in base64.
        let headers = message["headers"].as_array().expect("headers");
        let all = |name: &str| headers.iter().filter(|h| h["name"] == name).collect::<Vec<_>>();
        assert_eq!(all("kafka_original-partition")[0]["base64"], "AAAAAA==", "{message}");
        assert_eq!(all("kafka_original-topic")[0]["text"], setup.topic.as_str(), "{message}");
        assert_eq!(all("retry_topic-attempts").len(), attempts as usize, "one per hop: {message}");
    }

    // The provider would charge the exhausted order now: replay it alone.
    let (code, stdout, stderr) = setup.dlq_cli(&operators, &["replay", "--key", &exhausted]).await;
    assert_eq!(code, 0, "{stderr}");
    let job: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!((job["state"].as_str(), job["report"]["replayed"].as_u64()), (Some("succeeded"), Some(1)), "{job}");
    peer.wait_for_line("Spring's charge", Duration::from_secs(60), |l| {
        l.contains(&format!("charged order {exhausted}"))
    })
    .await;
    let replayed = read(&setup.topic).await.into_iter().last().expect("the replayed record");
    assert_eq!(replayed.key.as_deref(), Some(exhausted.as_bytes()));
    assert_eq!(text(&replayed, "x-replay-count"), "1");
    let spring: Vec<&str> = replayed
        .headers
        .iter()
        .filter_map(|(n, _)| std::str::from_utf8(n).ok())
        .filter(|n| retry_core::spring::header_names::is_spring_header(n))
        .collect();
    assert!(spring.is_empty(), "Spring's headers of the last pass: {spring:?}");

    // What is left: the rejected order, one dead letter.
    let (code, stdout, stderr) = setup.dlq_cli(&operators, &["list"]).await;
    assert_eq!(code, 0, "{stderr}");
    let listing: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listing["topics"][0]["topic"], format!("{}-dlt", setup.topic), "{listing}");
    assert_eq!(listing["topics"][0]["backlog"], 1, "{listing}");
    operators.stop().await;
    let log = peer.log();
    peer.stop();
    assert_eq!(provider.charges_for(&exhausted).len(), 1, "{log}");
    assert!(provider.charges_for(&rejected).is_empty());
}

/// A listener migrated from Spring to billing-bin mid-stream: the Spring
/// peer is stopped (SIGTERM) while orders wait on its first rung, and
/// billing-bin, in the Spring style on the same topics and consumer group,
/// takes the ladder over where Spring's groups stand. Every order is
/// charged exactly once, with one request per scripted failure and one
/// more (nothing handled twice, nothing skipped), and none is tried before
/// the due time written on the rung it waited on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_migrated_from_spring_mid_stream_charges_each_order_once_when_due() {
    use crate::billing::{wait_drained, Setup};
    let provider = FakeProvider::start(Faults::default()).await;
    let mut setup = Setup { schedule: "5s,10s,20s", partitions: 1, style: "spring", ..Setup::new("spring-migrated") };
    setup.group = format!("{}-spring", setup.topic);
    // The source only: Spring creates its ladder itself.
    create_topic(&setup.topic, 1).await;
    // Charged at once, after one, two and three failures; then one declined.
    let orders: Vec<(String, u32)> = (0..4).map(|failures| (Uuid::new_v4().to_string(), failures)).collect();
    for (order, failures) in &orders {
        provider.script(order, Script::FailTimes { times: *failures });
        produce(&setup.topic, 0, order, &order_event(order), &[]).await;
    }
    let declined = Uuid::new_v4().to_string();
    provider.script(&declined, Script::Reject);
    produce(&setup.topic, 0, &declined, &order_event(&declined), &[]).await;

    let mut peer = spring_peer_with(&setup.topic, &setup.group, &provider, "5000");
    // Spring handles the source in order and publishes synchronously: when
    // the last order is dead-lettered, the others wait on the first rung.
    peer.wait_for_line("the declined order's dead letter", Duration::from_secs(90), |l| l.starts_with("dead-letter "))
        .await;
    let spring_log = peer.terminate().await;
    let first_rung = format!("{}-retry-5000", setup.topic);
    let rung_group = format!("{}-retry-5000", setup.group);
    let connection = integration::connection("kafka-retry-it");
    let left = committed(&connection, &rung_group, &first_rung, 1).await[&0].unwrap_or(0);
    assert!(left < 3, "Spring left no order waiting on {first_rung} (its group stands at {left}): nothing to migrate");

    let service = setup.start(&provider).await;
    for (order, _) in &orders {
        eventually(&format!("order {order} charged"), Duration::from_secs(90), || async {
            (!provider.charges_for(order).is_empty()).then_some(())
        })
        .await;
    }
    wait_drained(&setup).await;
    let log = service.log();
    service.stop().await;
    for (order, failures) in &orders {
        let charges = provider.charges_for(order);
        assert_eq!(charges.len(), 1, "{order}: {charges:?}\n{log}");
        let arrivals = provider.arrivals(order);
        assert_eq!(
            charges[0].requests,
            failures + 1,
            "{order}: one request per failure, one that charged; they came at {arrivals:?}\n\
             Spring's log:\n{spring_log}\nbilling-bin's log:\n{log}"
        );
        // The request after each hop came when the hop said it was due.
        for (hop, delay) in ["5000", "10000", "20000"].into_iter().take(*failures as usize).enumerate() {
            let rung = read(&format!("{}-retry-{delay}", setup.topic)).await;
            let record = rung.iter().find(|r| r.key.as_deref() == Some(order.as_bytes())).expect("its hop");
            let due = big_endian(record.header("retry_topic-backoff-timestamp").flatten().expect("a due time"));
            assert!(
                arrivals[hop + 1] >= due,
                "{order}: attempt {} at {} before its due time {due}",
                hop + 2,
                arrivals[hop + 1]
            );
        }
    }
    assert!(provider.charges_for(&declined).is_empty());
}
