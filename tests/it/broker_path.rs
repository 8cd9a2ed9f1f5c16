//! The broker path itself: what every later test relies on.

use std::collections::BTreeMap;

use chrono::{TimeZone, Utc};
use integration::{create_topic, rskafka_client, unique_topic, within};
use rskafka::{
    client::partition::{Compression, OffsetAt, UnknownTopicHandling},
    record::Record,
};

#[tokio::test]
async fn create_produce_and_fetch_a_record_with_headers() {
    let client = rskafka_client().await;
    let topic = unique_topic("broker-path");
    create_topic(&topic, 2).await;

    let partition =
        within("partition_client", client.partition_client(&topic, 1, UnknownTopicHandling::Retry)).await.unwrap();
    let headers = BTreeMap::from([
        ("x-retry-attempt".to_owned(), b"1".to_vec()),
        ("binary".to_owned(), vec![0, 159, 146, 150]),
        ("empty".to_owned(), vec![]),
    ]);
    // Stamped now: records older than the topic's retention could be
    // deleted by the broker's next retention check, under the test.
    let now = crate::support::chrono_now_millis();
    let records: Vec<Record> = (0..3)
        .map(|i| Record {
            key: Some(format!("key-{i}").into_bytes()),
            value: Some(format!("{{\"n\":{i}}}").into_bytes()),
            headers: headers.clone(),
            timestamp: Utc.timestamp_millis_opt(now + i).unwrap(),
        })
        .collect();
    let offsets = within("produce", partition.produce(records.clone(), Compression::NoCompression)).await.unwrap();
    assert_eq!(offsets, [0, 1, 2]);

    let (fetched, high_watermark) =
        within("fetch_records", partition.fetch_records(0, 1..1_000_000, 1_000)).await.unwrap();
    assert_eq!(high_watermark, 3);
    let fetched: Vec<(i64, Record)> = fetched.into_iter().map(|r| (r.offset, r.record)).collect();
    assert_eq!(fetched, offsets.into_iter().zip(records).collect::<Vec<_>>());

    // Fetching from the middle of a batch returns the rest of it.
    let (tail, _) = within("fetch_records", partition.fetch_records(2, 1..1_000_000, 1_000)).await.unwrap();
    assert_eq!(tail.iter().map(|r| r.offset).collect::<Vec<_>>(), [2]);

    assert_eq!(within("get_offset", partition.get_offset(OffsetAt::Latest)).await.unwrap(), 3);
    assert_eq!(within("get_offset", partition.get_offset(OffsetAt::Earliest)).await.unwrap(), 0);
}

/// rskafka's Metadata requests for named topics allow auto-creation (it
/// sends `allow_auto_topic_creation = true`), so on a broker that
/// auto-creates on request (the mock cluster, or Apache Kafka with its
/// default `auto.create.topics.enable=true`) asking rskafka for a missing
/// topic creates it. Our code therefore asks rskafka only about topics it
/// verified through the all-topics listing, which never creates anything
/// (`topics::verification_names_every_missing_topic` checks that on every
/// broker). This test pins the quirk: if rskafka changes, it fails, and the
/// precaution can be revisited.
#[tokio::test]
async fn rskafka_metadata_for_a_missing_topic_auto_creates_it() {
    integration::MockCluster::get();
    let client = rskafka_client().await;
    let topic = unique_topic("absent");
    let topics = within("list_topics", client.list_topics()).await.unwrap();
    assert!(topics.iter().all(|t| t.name != topic), "listing all topics created {topic}");
    let _ = within("partition_client", client.partition_client(&topic, 0, UnknownTopicHandling::Error)).await;
    let topics = within("list_topics", client.list_topics()).await.unwrap();
    assert!(topics.iter().any(|t| t.name == topic), "rskafka no longer auto-creates {topic}");
}
