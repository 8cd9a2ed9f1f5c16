//! A producer of raw record batches, for records that no client library
//! writes: header names that are not UTF-8 (Kafka keeps header names as
//! bytes; Java, librdkafka and rskafka only write strings). It speaks the
//! wire protocol through `kafka-protocol` on a plaintext listener (on
//! Apache Kafka, the brokers' internal one), and encodes the batch itself.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::{
    messages::{
        metadata_request::MetadataRequestTopic,
        produce_request::{PartitionProduceData, TopicProduceData},
        MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
    },
    protocol::{Decodable, Encodable, StrBytes},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// A record as written on the wire, header names as bytes.
#[derive(Debug, Clone)]
pub struct RawRecord {
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub value: Option<Vec<u8>>,
    /// Its headers in order: names as bytes, values (`None`: null).
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// Produces `records` as one uncompressed batch to `topic`/`partition`
/// (acks=all) and returns the first offset.
pub async fn produce(topic: &str, partition: i32, records: &[RawRecord]) -> i64 {
    produce_batch(topic, partition, encode(records)).await
}

/// The same batch with one bit of its last record flipped, its checksum
/// left as it was: a batch that fails its CRC.
pub fn corrupt(records: &[RawRecord]) -> Bytes {
    let mut batch = BytesMut::from(&encode(records)[..]);
    let last = batch.len() - 1;
    batch[last] ^= 1;
    batch.freeze()
}

/// Produces one batch as given (acks=all) and returns the first offset.
pub async fn produce_batch(topic: &str, partition: i32, batch: Bytes) -> i64 {
    let mut brokers = plaintext_brokers();
    let bootstrap = brokers.remove(0);
    let metadata: MetadataResponse = exchange(
        &bootstrap,
        3,
        8,
        &MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(topic.to_owned()))))
            ]))
            .with_allow_auto_topic_creation(false),
    )
    .await;
    let leader = metadata
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .find(|p| p.partition_index == partition)
        .map(|p| p.leader_id)
        .unwrap_or_else(|| panic!("no leader of {topic}/{partition} in {metadata:?}"));
    let broker = metadata.brokers.iter().find(|b| b.node_id == leader).expect("the leader is listed");
    let addr = format!("{}:{}", broker.host, broker.port);
    let request = ProduceRequest::default().with_acks(-1).with_timeout_ms(10_000).with_topic_data(vec![
        TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
            .with_partition_data(vec![PartitionProduceData::default().with_index(partition).with_records(Some(batch))]),
    ]);
    let response: ProduceResponse = exchange(&addr, 0, 8, &request).await;
    let answer = &response.responses[0].partition_responses[0];
    assert_eq!(answer.error_code, 0, "raw produce to {topic}/{partition} refused: {answer:?}");
    answer.base_offset
}

/// Plaintext addresses of the brokers: Apache Kafka's internal listeners,
/// or the suite's broker when it runs without security.
fn plaintext_brokers() -> Vec<String> {
    if let Some(cluster) = crate::KafkaCluster::from_env() {
        return cluster.brokers().iter().map(|b| b.internal.clone()).collect();
    }
    assert!(
        std::env::var("KAFKA_RETRY_SECURITY_PROTOCOL").map_or(true, |p| p.is_empty() || p == "PLAINTEXT")
            && std::env::var("KAFKA_RETRY_SASL_MECHANISM").map_or(true, |m| m.is_empty()),
        "raw produce needs a plaintext listener"
    );
    crate::bootstrap()
}

/// One request on a new connection, and its answer.
async fn exchange<R: Encodable, A: Decodable>(addr: &str, api_key: i16, version: i16, request: &R) -> A {
    let header = RequestHeader::default()
        .with_request_api_key(api_key)
        .with_request_api_version(version)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("kafka-retry-it-raw")));
    let mut body = BytesMut::new();
    header.encode(&mut body, 1).expect("encode the header");
    request.encode(&mut body, version).expect("encode the request");
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        stream.write_all(&(body.len() as i32).to_be_bytes()).await.unwrap();
        stream.write_all(&body).await.unwrap();
        let len = stream.read_i32().await.unwrap();
        let mut answer = vec![0; len as usize];
        stream.read_exact(&mut answer).await.unwrap();
        answer
    };
    let answer = tokio::time::timeout(Duration::from_secs(30), exchange).await.expect("an answer within 30 s");
    let mut answer = Bytes::from(answer);
    ResponseHeader::decode(&mut answer, 0).expect("a response header");
    A::decode(&mut answer, version).expect("a response")
}

/// One batch (magic 2) at offset 0, uncompressed, no producer id.
fn encode(records: &[RawRecord]) -> Bytes {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let mut body = BytesMut::new();
    for (i, r) in records.iter().enumerate() {
        let mut record = BytesMut::new();
        record.put_u8(0);
        varint(&mut record, 0);
        varint(&mut record, i as i64);
        field(&mut record, r.key.as_deref());
        field(&mut record, r.value.as_deref());
        varint(&mut record, r.headers.len() as i64);
        for (name, value) in &r.headers {
            field(&mut record, Some(name));
            field(&mut record, value.as_deref());
        }
        varint(&mut body, record.len() as i64);
        body.extend_from_slice(&record);
    }
    let mut b = BytesMut::new();
    b.put_i64(0);
    b.put_i32((49 + body.len()) as i32);
    b.put_i32(-1);
    b.put_i8(2);
    b.put_u32(0);
    b.put_i16(0);
    b.put_i32(records.len() as i32 - 1);
    b.put_i64(now);
    b.put_i64(now);
    b.put_i64(-1);
    b.put_i16(-1);
    b.put_i32(-1);
    b.put_i32(records.len() as i32);
    b.extend_from_slice(&body);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b.freeze()
}

fn varint(out: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

fn field(out: &mut BytesMut, f: Option<&[u8]>) {
    match f {
        None => varint(out, -1),
        Some(b) => {
            varint(out, b.len() as i64);
            out.extend_from_slice(b);
        }
    }
}
