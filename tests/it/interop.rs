//! A foreign client, confluent-kafka (librdkafka) through
//! `interop/kafka_client.py`, reads, commits and writes what rskafka does:
//! our records, headers and group offsets are plain Kafka, not a dialect that
//! only our own code understands.

use std::collections::BTreeMap;

use chrono::{TimeZone, Utc};
use integration::{broker_addr, kafka_client, rskafka_client, unique_topic, within};
use rskafka::{
    client::{
        partition::{Compression, PartitionClient, UnknownTopicHandling},
        Client,
    },
    record::Record,
};
use serde_json::{json, Value};

#[tokio::test]
async fn a_foreign_group_consumes_and_commits_what_rskafka_produced() {
    let client = rskafka_client().await;
    let topic = unique_topic("interop-consume");
    // Any unique string will do as a group id.
    let group = unique_topic("interop-group");
    let partition = create_topic(&client, &topic, 2, 1).await;

    // (key, value) of the records produced to partition 1; partition 0 stays empty.
    let table = [(Some("key-0"), Some("{\"n\":0}")), (Some("key-1"), None), (None, Some("{\"n\":2}"))];
    let headers =
        BTreeMap::from([("x-retry-attempt".to_owned(), b"1".to_vec()), ("binary".to_owned(), vec![0, 159, 146, 150])]);
    // Stamped now: records older than the topic's retention could be
    // deleted by the broker's next retention check, under the test.
    let records: Vec<Record> = table
        .iter()
        .zip(crate::support::chrono_now_millis()..)
        .map(|(&(key, value), millis)| Record {
            key: key.map(|k| k.as_bytes().to_vec()),
            value: value.map(|v| v.as_bytes().to_vec()),
            headers: headers.clone(),
            timestamp: Utc.timestamp_millis_opt(millis).unwrap(),
        })
        .collect();
    let offsets = within("produce", partition.produce(records, Compression::NoCompression)).await.unwrap();
    assert_eq!(offsets, [0, 1, 2]);

    assert_eq!(committed(&group, &topic, 2).await, json!({"0": null, "1": null}));

    let brokers = broker_addr();
    let output = kafka_client(&[
        "consume",
        "--brokers",
        &brokers,
        "--group",
        &group,
        "--topic",
        &topic,
        "--max-records",
        "3",
        "--idle-timeout-s",
        "20",
        "--commit",
    ])
    .await;
    let events = json_lines(&output);

    let (assignments, rest): (Vec<&Value>, Vec<&Value>) = events.iter().partition(|e| e["event"] == "assigned");
    assert!(!assignments.is_empty(), "the consumer was never assigned partitions:\n{output}");
    for assignment in assignments {
        assert_eq!(assignment["partitions"], json!([0, 1]), "a lone member gets every partition:\n{output}");
    }
    let expected: Vec<Value> = table
        .iter()
        .zip(0..)
        .map(|(&(key, value), offset)| {
            json!({
                "event": "record", "partition": 1, "offset": offset, "key": key, "value": value,
                // Header values are decoded as UTF-8 with replacement characters.
                "headers": {"x-retry-attempt": "1", "binary": "\u{0}\u{fffd}\u{fffd}\u{fffd}"},
                // rskafka's headers are a map: written in name order.
                "header_list": [["binary", "\u{0}\u{fffd}\u{fffd}\u{fffd}"], ["x-retry-attempt", "1"]],
            })
        })
        .chain([json!({"event": "closed"})])
        .collect();
    assert_eq!(rest, expected.iter().collect::<Vec<_>>(), "consumer output:\n{output}");

    // The committed offset is the next one to read.
    assert_eq!(committed(&group, &topic, 2).await, json!({"0": null, "1": 3}));
}

#[tokio::test]
async fn rskafka_fetches_what_a_foreign_producer_wrote() {
    let client = rskafka_client().await;
    let topic = unique_topic("interop-produce");
    let partition = create_topic(&client, &topic, 1, 0).await;

    let brokers = broker_addr();
    let output = kafka_client(&[
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        &topic,
        "--partition",
        "0",
        "--key",
        "order-7",
        "--value",
        "{\"amount\":12}",
        "--header",
        "x-retry-attempt=2",
        // Only the first `=` separates name from value.
        "--header",
        "x-error=upstream said: status=503",
    ])
    .await;
    assert_eq!(parse(&output), json!({"partition": 0, "offset": 0}));

    let (fetched, high_watermark) =
        within("fetch_records", partition.fetch_records(0, 1..1_000_000, 1_000)).await.unwrap();
    assert_eq!(high_watermark, 1);
    let [fetched] = &fetched[..] else { panic!("expected one record, fetched {fetched:?}") };
    assert_eq!(fetched.offset, 0);
    assert_eq!(fetched.record.key.as_deref(), Some(&b"order-7"[..]));
    assert_eq!(fetched.record.value.as_deref(), Some(&b"{\"amount\":12}"[..]));
    let headers = BTreeMap::from([
        ("x-retry-attempt".to_owned(), b"2".to_vec()),
        ("x-error".to_owned(), b"upstream said: status=503".to_vec()),
    ]);
    assert_eq!(fetched.record.headers, headers);
}

/// Creates `topic` with `partitions` partitions and returns a client for `partition`.
async fn create_topic(client: &Client, topic: &str, partitions: i32, partition: i32) -> PartitionClient {
    integration::create_topic(topic, partitions).await;
    within("partition_client", client.partition_client(topic, partition, UnknownTopicHandling::Retry)).await.unwrap()
}

/// The group's committed offsets as the foreign client reports them.
async fn committed(group: &str, topic: &str, partitions: u32) -> Value {
    let brokers = broker_addr();
    let partitions = partitions.to_string();
    let args = ["committed", "--brokers", &brokers, "--group", group, "--topic", topic, "--partitions", &partitions];
    parse(&kafka_client(&args).await)
}

fn parse(json: &str) -> Value {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("the interop client printed no JSON document ({e}):\n{json}"))
}

fn json_lines(output: &str) -> Vec<Value> {
    output.lines().map(parse).collect()
}

/// librdkafka's mock cluster lists no aborted transactions in its fetch
/// answers (it ignores the isolation level), so under read_committed the
/// records of an aborted transaction still reach the handler there: what
/// the broker does not say cannot be filtered. Pinned here, so that a
/// change shows; on Apache Kafka they never do
/// (`records::records_of_aborted_transactions_never_reach_the_handler`).
/// The abort marker itself is not a record and never reaches the handler,
/// and it does not wedge the partition (the mock writes markers whose
/// checksum is zero).
#[tokio::test]
async fn records_of_an_aborted_transaction_reach_the_handler_as_documented() {
    use crate::support::{start_joined, Ladder, Scripted};
    let ladder = Ladder::create("aborted-txn", "200ms", 1).await;
    let handler = Scripted::new(&[]);
    let listener = start_joined(&ladder, handler.clone()).await;
    let brokers = broker_addr();
    let transactional_id = unique_topic("txn");
    let args = [
        "produce",
        "--brokers",
        &brokers,
        "--topic",
        ladder.source(),
        "--partition",
        "0",
        "--key",
        "aborted",
        "--value",
        "{}",
        "--abort-transaction",
        &transactional_id,
    ];
    kafka_client(&args).await;
    crate::support::fence(&ladder, 0, 1).await;
    listener.shutdown().await;
    let mut keys: Vec<String> = handler.calls().into_iter().map(|c| c.key).collect();
    keys.sort();
    assert_eq!(keys, ["aborted", "fence"], "{:?}", handler.calls());
}
