//! Records as real producers write them: headers in order with repeated
//! names and null values, transactions (markers, aborts), batches larger
//! than a fetch, header names that are not UTF-8, and republications that a
//! lost produce answer must not write twice.

use integration::{broker_addr, kafka_client, raw, unique_topic};
use serde_json::{json, Value};

use crate::support::{committed, eventually, fence, start_joined, start_joined_with, Ladder, Scripted, Step, SETTLE};

/// Runs the foreign producer (librdkafka) for one record on partition 0.
async fn foreign_produce(topic: &str, key: &str, value: &str, extra: &[&str]) {
    let brokers = broker_addr();
    let args = ["produce", "--brokers", &brokers, "--topic", topic, "--partition", "0", "--key", key, "--value", value];
    kafka_client(&[&args[..], extra].concat()).await;
}

/// Reads `n` records of `topic` with the foreign consumer, in a group of its own.
async fn foreign_consume(topic: &str, n: usize) -> Vec<Value> {
    let brokers = broker_addr();
    let group = unique_topic("foreign-reader");
    let n = n.to_string();
    let args = [
        "consume",
        "--brokers",
        &brokers,
        "--group",
        &group,
        "--topic",
        topic,
        "--max-records",
        &n,
        "--idle-timeout-s",
        "20",
    ];
    let output = kafka_client(&args).await;
    output
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON lines"))
        .filter(|e| e["event"] == "record")
        .collect()
}

/// Fences the source, stops the listener, checks that only the fence was
/// handled and one record was undecodable, and returns the one dead letter.
async fn the_only_dead_letter(
    ladder: &Ladder,
    listener: retry_kafka::Listener,
    handler: &Scripted,
) -> retry_kafka::WrittenRecord {
    fence(ladder, 0, 1).await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    let keys: Vec<String> = handler.calls().into_iter().map(|c| c.key).collect();
    assert_eq!(keys, ["fence"], "only the fence reached the handler");
    assert_eq!(stats.undecodable_records, 1, "{stats:?}");
    let connection = integration::connection("kafka-retry-it-read");
    let mut dead = retry_kafka::read_partition(&connection, ladder.dlq(), 0, 0).await.unwrap();
    assert_eq!(dead.len(), 1, "one dead letter, got {dead:?}");
    dead.remove(0)
}

/// A header's value as text.
fn text(record: &retry_kafka::WrittenRecord, name: &str) -> String {
    String::from_utf8_lossy(record.header(name).flatten().unwrap_or(b"<absent>")).into_owned()
}

/// The end of the source's partition 0: where a consumer that read
/// everything, transaction markers included, stands.
async fn log_end(topic: &str) -> i64 {
    use rskafka::client::partition::{OffsetAt, UnknownTopicHandling};
    let client = integration::rskafka_client().await;
    let pc = integration::within("partition client", client.partition_client(topic, 0, UnknownTopicHandling::Retry))
        .await
        .unwrap();
    integration::within("log end", pc.get_offset(OffsetAt::Latest)).await.unwrap()
}

#[tokio::test]
async fn a_record_keeps_its_headers_in_order_through_the_ladder() {
    let ladder = Ladder::create("headers", "100ms", 1).await;
    let handler = Scripted::new(&[("odd", &[Step::Transient])]);
    let listener = start_joined(&ladder, handler.clone()).await;
    // A repeated name and a null value, compressed: all legal Kafka.
    let written = json!([["trace", "abc"], ["dup", "1"], ["empty", null], ["dup", "2"]]);
    let headers = written.to_string();
    foreign_produce(ladder.source(), "odd", "v1", &["--headers-json", &headers, "--compression", "lz4"]).await;
    eventually("the retry", SETTLE, || async { (handler.attempts("odd") == [1, 2]).then_some(()) }).await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;

    // The handler sees the headers with a value, in order, the repeated name twice.
    let seen: Vec<(String, String)> =
        handler.calls()[0].headers.iter().map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned())).collect();
    let pairs = |p: &[(&str, &str)]| p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
    assert_eq!(seen, pairs(&[("trace", "abc"), ("dup", "1"), ("dup", "2")]));
    assert_eq!(stats.null_header_records, 2, "both attempts saw the null header: {stats:?}");

    // The rung's copy, read by librdkafka: the producer's headers as
    // written (null value, repetition and order), then ours.
    let [copy] = &foreign_consume(ladder.retry(0), 1).await[..] else { panic!("one record on the rung") };
    let list = copy["header_list"].as_array().expect("a header list");
    assert_eq!(Value::Array(list[..4].to_vec()), written, "{copy}");
    for header in &list[4..] {
        assert!(header[0].as_str().unwrap().starts_with("x-"), "after the producer's, only ours: {copy}");
    }
    assert_eq!((copy["key"].as_str(), copy["value"].as_str()), (Some("odd"), Some("v1")));
}

/// A record ten times what one fetch may bring is read, whole: Kafka
/// answers the first batch whole whatever the limit (KIP-74); with a broker
/// that answers nothing instead, the fetch is made again with more room.
#[tokio::test]
async fn a_batch_larger_than_a_fetch_is_read() {
    let ladder = Ladder::create("large", "100ms", 1).await;
    let handler = Scripted::new(&[]);
    let mut config = ladder.config();
    config.fetch_max_bytes = 4096;
    let listener = start_joined_with(config, handler.clone()).await;
    foreign_produce(ladder.source(), "big", &"x".repeat(40_000), &[]).await;
    fence(&ladder, 0, 1).await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    let keys: Vec<String> = handler.calls().into_iter().map(|c| c.key).collect();
    assert_eq!(keys, ["big", "fence"]);
    assert_eq!((stats.fetch_failures, stats.undecodable_records), (0, 0), "{stats:?}");
}

/// Transaction markers hold no partition: a record after one is read,
/// and a partition whose last batch is a marker is committed past it (no
/// lag shown forever). tansu 0.6.0 has no transactions (no EndTxn).
#[tokio::test]
async fn transaction_markers_never_hold_a_partition() {
    let ladder = Ladder::create("markers", "100ms", 1).await;
    let handler = Scripted::new(&[]);
    let mut config = ladder.config();
    config.fetch_max_bytes = 4096;
    let listener = start_joined_with(config, handler.clone()).await;
    foreign_produce(ladder.source(), "committed", "{}", &["--commit-transaction", &unique_topic("txn")]).await;
    // After the marker, a batch ten times what one fetch may bring.
    foreign_produce(ladder.source(), "big", &"x".repeat(40_000), &[]).await;
    // And a transaction last: nothing after its marker.
    foreign_produce(ladder.source(), "last", "{}", &["--commit-transaction", &unique_topic("txn")]).await;
    eventually("every record", SETTLE, || async { (handler.calls().len() == 3).then_some(()) }).await;
    let end = log_end(ladder.source()).await;
    eventually("the commit past the last marker", SETTLE, || async {
        (committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0] == Some(end)).then_some(())
    })
    .await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    let keys: Vec<String> = handler.calls().into_iter().map(|c| c.key).collect();
    assert_eq!(keys, ["committed", "big", "last"]);
    assert_eq!((stats.fetch_failures, stats.undecodable_records), (0, 0), "{stats:?}");
}

/// Under read_committed (the default), the records of an aborted
/// transaction never reach the handler. Apache Kafka only: it is the
/// broker that lists aborted transactions in a fetch's answer, and tansu
/// 0.6.0 and librdkafka's mock cluster list none (see
/// `records_of_an_aborted_transaction_reach_the_handler_as_documented`).
#[tokio::test]
async fn records_of_aborted_transactions_never_reach_the_handler() {
    let ladder = Ladder::create("aborted", "100ms", 1).await;
    let handler = Scripted::new(&[]);
    let listener = start_joined(&ladder, handler.clone()).await;
    foreign_produce(ladder.source(), "aborted", "{}", &["--abort-transaction", &unique_topic("txn")]).await;
    foreign_produce(ladder.source(), "committed", "{}", &["--commit-transaction", &unique_topic("txn")]).await;
    foreign_produce(ladder.source(), "plain", "{}", &[]).await;
    fence(&ladder, 0, 1).await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    let mut keys: Vec<String> = handler.calls().into_iter().map(|c| c.key).collect();
    keys.sort();
    assert_eq!(keys, ["committed", "fence", "plain"]);
    assert_eq!(stats.aborted_records_skipped, 1, "{stats:?}");
}

/// A header name that is not UTF-8 (Kafka keeps names as bytes) cannot
/// reach a handler, whose headers are text: the record goes to the
/// dead-letter topic as it is, with why, and the partition goes on.
#[tokio::test]
async fn a_record_whose_header_name_is_not_utf8_is_dead_lettered_as_it_is() {
    let ladder = Ladder::create("raw-name", "100ms", 1).await;
    let handler = Scripted::new(&[]);
    let listener = start_joined(&ladder, handler.clone()).await;
    let headers = vec![(b"trace".to_vec(), Some(b"abc".to_vec())), (b"\xff\xfename".to_vec(), Some(b"v".to_vec()))];
    let record =
        raw::RawRecord { key: Some(b"odd".to_vec()), value: Some(b"payload".to_vec()), headers: headers.clone() };
    let offset = raw::produce(ladder.source(), 0, &[record]).await;
    let dead = &the_only_dead_letter(&ladder, listener, &handler).await;
    assert_eq!((dead.key.as_deref(), dead.value.as_deref()), (Some(&b"odd"[..]), Some(&b"payload"[..])));
    let written: Vec<(&[u8], Option<&[u8]>)> = headers.iter().map(|(n, v)| (&n[..], v.as_deref())).collect();
    let kept: Vec<(&[u8], Option<&[u8]>)> = dead.headers[..2].iter().map(|(n, v)| (&n[..], v.as_deref())).collect();
    assert_eq!(kept, written, "the record's headers, as written");
    let text = |name: &str| text(dead, name);
    assert_eq!(text("x-dead-letter-reason"), "undecodable");
    assert_eq!(text("x-original-offset"), offset.to_string());
    let error = text("x-error");
    assert!(error.contains("header 1 is not UTF-8") && error.contains("fffe6e616d65"), "{error}");
}

/// A record whose retry topic refuses it as too large (the rung's
/// `max.message.bytes` is 4 KiB, the record 16 KiB of random text, which
/// no codec shrinks enough) goes to the dead-letter topic instead, as it
/// is, with the reason `too-large-for-retry`; the partition never stalls.
/// On the mock cluster, which has no topic configs, the rung answers
/// MESSAGE_TOO_LARGE once. Not on tansu, which takes records of any size.
#[tokio::test]
async fn a_record_too_large_for_its_retry_topic_is_dead_lettered() {
    let ladder = match integration::MockCluster::from_env() {
        Some(mock) => {
            let ladder = Ladder::create("too-large", "100ms", 1).await;
            mock.push_partition_errors(ladder.retry(0), 0, 0, &[10]).await; // Produce: MESSAGE_TOO_LARGE
            ladder
        }
        None => {
            let limit = |plan: retry_kafka::TopicPlan| {
                plan.with_config(retry_kafka::TopicRole::Retry, "max.message.bytes", "4096")
            };
            Ladder::create_with("too-large", "100ms", 1, limit).await
        }
    };
    let handler = Scripted::new(&[("big", &[Step::Transient])]);
    let listener = start_joined(&ladder, handler.clone()).await;
    let big: String = (0..8192).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
    foreign_produce(ladder.source(), "big", &big, &["--compression", "lz4"]).await;
    foreign_produce(ladder.source(), "after", "{}", &[]).await;
    fence(&ladder, 0, 1).await;
    let ready = listener.is_ready();
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    assert!(ready, "stalled on a record the dead-letter topic takes");
    assert_eq!((stats.dead_lettered, stats.retried), (1, 0), "{stats:?}");
    let mut keys: Vec<String> = handler.calls().into_iter().map(|c| c.key).collect();
    keys.sort();
    assert_eq!(keys, ["after", "big", "fence"], "each handled once");
    let connection = integration::connection("kafka-retry-it-read");
    let dead = retry_kafka::read_partition(&connection, ladder.dlq(), 0, 0).await.unwrap();
    assert_eq!(dead.len(), 1, "one dead letter, got {dead:?}");
    let dead = &dead[0];
    assert_eq!((dead.key.as_deref(), dead.value.as_deref()), (Some(&b"big"[..]), Some(big.as_bytes())));
    assert_eq!(text(dead, "x-dead-letter-reason"), "too-large-for-retry");
    assert_eq!(text(dead, "x-original-offset"), "0");
    assert_eq!(text(dead, "x-retry-due-at"), "<absent>");
    let error = text(dead, "x-error");
    assert!(error.contains(ladder.retry(0)) && error.contains("too large"), "{error}");
    let on_rung = retry_kafka::read_partition(&connection, ladder.retry(0), 0, 0).await.unwrap();
    assert!(on_rung.is_empty(), "nothing on the rung: {on_rung:?}");
    let source = committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await;
    assert_eq!(source.values().map(|o| o.unwrap_or(0)).sum::<i64>(), 3, "{source:?}");
}

/// A batch that decompresses beyond the cap (here 2 MiB; a few kilobytes of
/// gzip that inflate to 20 MiB) is never read into memory: it goes to the
/// dead-letter topic as it is, its bytes the value, and the partition goes
/// on. Not on tansu, which stores records rather than the batches
/// producers wrote.
#[tokio::test]
async fn a_batch_that_inflates_beyond_the_cap_is_dead_lettered_as_it_is() {
    let ladder = Ladder::create("inflate", "100ms", 1).await;
    let handler = Scripted::new(&[]);
    let mut config = ladder.config();
    config.max_batch_inflated = Some(2 << 20);
    let listener = start_joined_with(config, handler.clone()).await;
    let zeros = (20 << 20).to_string();
    foreign_produce(ladder.source(), "bomb", "", &["--zeros", &zeros, "--compression", "gzip"]).await;
    let dead = &the_only_dead_letter(&ladder, listener, &handler).await;
    let text = |name: &str| text(dead, name);
    assert_eq!(text("x-dead-letter-reason"), "undecodable");
    assert!(text("x-error").contains("inflates beyond 2097152 bytes"), "{}", text("x-error"));
    let batch = dead.value.as_deref().expect("the batch as the value");
    assert!(batch.len() < 1 << 20 && batch[16] == 2, "the batch as fetched ({} bytes)", batch.len());
}

/// A batch whose checksum does not match its bytes cannot be read: it goes
/// to the dead-letter topic as it is, and the partition goes on. Mock only:
/// Apache Kafka and tansu check a batch's checksum when it is produced.
#[tokio::test]
async fn a_batch_that_fails_its_checksum_is_dead_lettered_as_it_is() {
    let ladder = Ladder::create("crc", "100ms", 1).await;
    let handler = Scripted::new(&[]);
    let listener = start_joined(&ladder, handler.clone()).await;
    let records: Vec<raw::RawRecord> = (0..3)
        .map(|i| raw::RawRecord {
            key: Some(format!("k{i}").into_bytes()),
            value: Some(b"v".to_vec()),
            headers: vec![],
        })
        .collect();
    let batch = raw::corrupt(&records);
    let offset = raw::produce_batch(ladder.source(), 0, batch.clone()).await;
    let dead = &the_only_dead_letter(&ladder, listener, &handler).await;
    let text = |name: &str| text(dead, name);
    assert_eq!(text("x-original-offset"), offset.to_string());
    let error = text("x-error");
    assert!(
        error.contains("checksum mismatch") && error.contains(&format!("offsets {offset} to {}", offset + 2)),
        "{error}"
    );
    // The batch as fetched: from its checksum on, as produced (the broker
    // sets its base offset and leader epoch).
    assert_eq!(dead.value.as_ref().map(|v| v[17..].to_vec()), Some(batch[17..].to_vec()));
}

/// The last resort for a partition stalled on a record that cannot even be
/// dead-lettered: with the service stopped, an operator moves the group past
/// exactly that record, and an audit line says who skipped what and why.
#[tokio::test]
async fn an_operator_skips_exactly_one_record_with_an_audit_line() {
    use crate::support::{billing_bin, produce};
    let ladder = Ladder::create("skip", "100ms", 1).await;
    for key in ["a", "stuck", "c"] {
        produce(ladder.source(), 0, key, "{}", &[]).await;
    }
    let tp = retry_kafka::TopicPartition::new(ladder.source(), 0);
    let mut offsets = retry_kafka::GroupOffsets::new(ladder.connection.clone(), &ladder.group_id);
    offsets.commit(&std::collections::BTreeMap::from([(tp, 1)])).await.unwrap();
    let skip = |offset: &'static str| {
        let args = [
            "offsets",
            "skip",
            "--group",
            &ladder.group_id,
            "--partition",
            "0",
            "--offset",
            offset,
            "--reason",
            "TICKET-7",
        ]
        .map(str::to_owned);
        let source = ladder.source().to_owned();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            billing_bin(&args, &[("BILLING_TOPIC", &source)], &[]).await
        }
    };
    // Not where the group stands: nothing moves.
    let refused = skip("2").await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.stderr.contains("stands at offset 1") && refused.stderr.contains("nothing skipped"), "{refused:?}");
    assert_eq!(committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0], Some(1));

    let done = skip("1").await;
    assert_eq!(done.code, Some(0), "{done:?}");
    assert!(done.stdout.contains("now stands at 2"), "{done:?}");
    assert!(done.stderr.contains("an operator skipped a record") && done.stderr.contains("TICKET-7"), "{done:?}");
    assert_eq!(committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0], Some(2));
}
