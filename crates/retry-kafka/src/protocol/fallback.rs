//! Reading a batch that rskafka cannot decode.
//!
//! rskafka fails a whole fetch on a record it cannot represent, e.g. a
//! header whose value is null (legal in Kafka). Left alone, that wedges the
//! partition forever. When that happens the worker fetches the same offsets
//! here, through `kafka-protocol`, which decodes them, and hands the records
//! on like any other. What our records cannot carry is said out loud: a
//! null header value is dropped (with a warning and a counter), as rskafka
//! cannot write one either.

use bytes::Bytes;
// kafka-protocol's decompressor hook returns anyhow::Result; nothing else here uses anyhow.
use kafka_protocol::{
    compression::{self, Decompressor},
    messages::{
        fetch_request::{FetchPartition, FetchTopic},
        metadata_request::MetadataRequestTopic,
        BrokerId, FetchRequest, MetadataRequest, TopicName,
    },
    records::{Compression, RecordBatchDecoder},
};
use retry_core::{Headers, Timestamp};
use rskafka::record::RecordAndOffset;

use crate::{
    protocol::wire::{check, str_bytes, Connection},
    ConnectionConfig, Error, Result,
};

/// A fetched record, however it was decoded.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    pub(crate) offset: i64,
    pub(crate) key: Option<Bytes>,
    pub(crate) value: Option<Bytes>,
    pub(crate) headers: Headers,
    pub(crate) timestamp: Option<Timestamp>,
    /// Names of headers whose value was null, and so were dropped.
    pub(crate) null_headers: Vec<String>,
}

impl From<RecordAndOffset> for Fetched {
    fn from(r: RecordAndOffset) -> Self {
        let millis = r.record.timestamp.timestamp_millis();
        Fetched {
            offset: r.offset,
            key: r.record.key.map(Bytes::from),
            value: r.record.value.map(Bytes::from),
            headers: r.record.headers.into(),
            timestamp: (millis >= 0).then(|| Timestamp::from_millis(millis)),
            null_headers: Vec::new(),
        }
    }
}

/// Whether an rskafka fetch error means "the records could not be decoded"
/// rather than "the broker or the network failed".
pub(crate) fn is_undecodable(e: &rskafka::client::error::Error) -> bool {
    use rskafka::client::error::{Error as E, RequestError as R};
    matches!(e, E::InvalidResponse(_) | E::Request(R::ReadError(_) | R::ReadVersionedError(_)))
}

/// What a fallback fetch decoded.
#[derive(Debug, Default)]
pub(crate) struct Decoded {
    /// The data records, in order.
    pub(crate) records: Vec<Fetched>,
    /// The offset after the last batch read, data or control: a fetch that
    /// met only control batches (transaction markers) moves the position on
    /// without a record.
    pub(crate) next_offset: Option<i64>,
}

/// The attributes bit of a control batch (transaction markers).
const CONTROL_BATCH: i16 = 0x20;

/// If `bytes` starts with a whole control batch, the offset after it and its
/// size in bytes. Read from the batch header alone: a marker carries nothing
/// for us, so its checksum does not matter (librdkafka's mock cluster
/// writes markers whose checksum is zero).
fn control_batch(bytes: &[u8]) -> Option<(i64, usize)> {
    use bytes::Buf;
    // baseOffset 8, batchLength 4, partitionLeaderEpoch 4, magic 1, crc 4,
    // attributes 2, lastOffsetDelta 4.
    if bytes.len() < 27 {
        return None;
    }
    let mut header = &bytes[..27];
    let base_offset = header.get_i64();
    let length = usize::try_from(header.get_i32()).ok()?;
    let _leader_epoch = header.get_i32();
    let magic = header.get_i8();
    let _crc = header.get_u32();
    let attributes = header.get_i16();
    let last_offset_delta = header.get_i32();
    let size = 12 + length;
    (magic == 2 && attributes & CONTROL_BATCH != 0 && bytes.len() >= size)
        .then(|| (base_offset + i64::from(last_offset_delta) + 1, size))
}

/// Reads one partition through kafka-protocol, keeping its connection to
/// the partition's leader between fetches (a partition whose producers
/// compress with lz4 or zstd reads every batch this way).
pub(crate) struct FallbackReader {
    config: ConnectionConfig,
    topic: String,
    partition: i32,
    leader: Option<Connection>,
}

impl FallbackReader {
    pub(crate) fn new(config: &ConnectionConfig, topic: &str, partition: i32) -> Self {
        FallbackReader { config: config.clone(), topic: topic.to_owned(), partition, leader: None }
    }

    /// Fetches from `offset`, waiting up to `max_wait` for records, and
    /// decodes what comes back; records before `offset` (the start of a
    /// batch) and control batches are skipped. Any error drops the
    /// connection: the next fetch looks the leader up again.
    pub(crate) async fn fetch(
        &mut self,
        offset: i64,
        max_bytes: i32,
        max_wait: std::time::Duration,
    ) -> Result<Decoded> {
        let mut conn = match self.leader.take() {
            Some(conn) => conn,
            None => {
                let leader = leader_of(&self.config, &self.topic, self.partition).await?;
                Connection::connect(&leader, &self.config).await?
            }
        };
        let decoded = fetch_decoded(&mut conn, &self.topic, self.partition, offset, max_bytes, max_wait).await?;
        self.leader = Some(conn);
        Ok(decoded)
    }
}

/// Fetches `topic`/`partition` from `offset` on `conn` (the leader's) and
/// decodes what comes back.
async fn fetch_decoded(
    conn: &mut Connection,
    topic: &str,
    partition: i32,
    offset: i64,
    max_bytes: i32,
    max_wait: std::time::Duration,
) -> Result<Decoded> {
    let leader = conn.addr().to_owned();
    let request = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(i32::try_from(max_wait.as_millis()).unwrap_or(i32::MAX))
        .with_min_bytes(1)
        .with_max_bytes(max_bytes)
        .with_isolation_level(0)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default().with_topic(TopicName(str_bytes(topic))).with_partitions(vec![
            FetchPartition::default()
                .with_partition(partition)
                .with_current_leader_epoch(-1)
                .with_fetch_offset(offset)
                .with_last_fetched_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(max_bytes),
        ])]);
    // The broker may hold the fetch for its max wait before answering.
    let (response, version) = conn.send_within(&request, conn.timeout() + max_wait).await?;
    if version >= 7 {
        check("Fetch", || format!("{topic}/{partition}"), response.error_code)?;
    }
    let data =
        response.responses.iter().flat_map(|t| &t.partitions).find(|p| p.partition_index == partition).ok_or_else(
            || Error::Protocol {
                addr: leader.clone(),
                api: "Fetch",
                reason: format!("no data for {topic}/{partition} in the response"),
            },
        )?;
    check("Fetch", || format!("{topic}/{partition}"), data.error_code)?;
    let mut bytes = data.records.clone().unwrap_or_default();
    let mut out = Vec::new();
    let mut next_offset = None;
    // A fetch may end in a partial batch; what decoded before it counts.
    while !bytes.is_empty() {
        if let Some((after, size)) = control_batch(&bytes) {
            let _ = bytes.split_to(size);
            next_offset = Some(after.max(offset));
            continue;
        }
        let set = match RecordBatchDecoder::decode_with_custom_compression(&mut bytes, Some(decompress)) {
            Ok(set) => set,
            Err(e) if out.is_empty() && next_offset.is_none() => {
                return Err(Error::Protocol {
                    addr: leader,
                    api: "Fetch",
                    reason: format!("cannot decode the record batch at {topic}/{partition}@{offset}: {e}"),
                })
            }
            Err(_) => break,
        };
        for r in set.records {
            next_offset = Some(next_offset.unwrap_or(offset).max(r.offset + 1));
            if r.control || r.offset < offset {
                continue;
            }
            let mut headers = Headers::new();
            let mut null_headers = Vec::new();
            for (name, value) in r.headers {
                match value {
                    Some(v) => headers.insert(name.to_string(), v.to_vec()),
                    None => null_headers.push(name.to_string()),
                }
            }
            out.push(Fetched {
                offset: r.offset,
                key: r.key,
                value: r.value,
                headers,
                timestamp: (r.timestamp >= 0).then(|| Timestamp::from_millis(r.timestamp)),
                null_headers,
            });
        }
    }
    Ok(Decoded { records: out, next_offset })
}

/// Decompresses a batch: gzip and snappy through kafka-protocol, lz4 and
/// zstd through pure-Rust decoders (the crates' own use C libraries).
fn decompress(buf: &mut Bytes, compression: Compression) -> anyhow::Result<Bytes> {
    use std::io::Read;
    let copy = |b: &mut Bytes| -> anyhow::Result<Bytes> { Ok(b.split_to(b.len())) };
    let mut out = Vec::new();
    match compression {
        Compression::None => return copy(buf),
        Compression::Gzip => return compression::Gzip::decompress(buf, copy),
        Compression::Snappy => return compression::Snappy::decompress(buf, copy),
        Compression::Lz4 => {
            lz4_flex::frame::FrameDecoder::new(buf.as_ref()).read_to_end(&mut out)?;
        }
        Compression::Zstd => {
            let mut decoder =
                ruzstd::decoding::StreamingDecoder::new(buf.as_ref()).map_err(|e| anyhow::anyhow!("zstd: {e}"))?;
            decoder.read_to_end(&mut out)?;
        }
    }
    Ok(Bytes::from(out))
}

/// The address of the partition's leader, asked of each bootstrap broker in
/// turn until one answers.
async fn leader_of(config: &ConnectionConfig, topic: &str, partition: i32) -> Result<String> {
    let mut last_error = None;
    for addr in &config.bootstrap {
        match leader_from(config, addr, topic, partition).await {
            Ok(leader) => return Ok(leader),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.expect("bootstrap brokers are never empty"))
}

async fn leader_from(config: &ConnectionConfig, addr: &str, topic: &str, partition: i32) -> Result<String> {
    let mut conn = Connection::connect(addr, config).await?;
    let request = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(TopicName(str_bytes(topic))))]))
        .with_allow_auto_topic_creation(false);
    let (response, _) = conn.send(&request).await?;
    let leader = response
        .topics
        .iter()
        .filter(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
        .flat_map(|t| &t.partitions)
        .find(|p| p.partition_index == partition)
        .map(|p| p.leader_id);
    let broker = leader.and_then(|id| response.brokers.iter().find(|b| b.node_id == id));
    broker.map(|b| format!("{}:{}", b.host, b.port)).ok_or_else(|| Error::Protocol {
        addr: addr.to_owned(),
        api: "Metadata",
        reason: format!("no leader known for {topic}/{partition}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch header: base offset, length, epoch, magic, crc, attributes,
    /// last offset delta, then `body` bytes.
    fn batch(base: i64, attributes: i16, last_delta: i32, body: usize) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(base.to_be_bytes());
        b.extend(((15 + body) as i32).to_be_bytes()); // from the epoch on
        b.extend(0i32.to_be_bytes());
        b.push(2);
        b.extend(0u32.to_be_bytes());
        b.extend(attributes.to_be_bytes());
        b.extend(last_delta.to_be_bytes());
        b.extend(vec![0u8; body]);
        b
    }

    #[test]
    fn control_batches_are_recognised_from_their_header() {
        let check = |bytes: &[u8], expected: Option<(i64, usize)>| assert_eq!(control_batch(bytes), expected);
        // A transaction marker at offset 7: skipped whole, checksum unread.
        check(&batch(7, CONTROL_BATCH, 0, 10), Some((8, 37)));
        check(&batch(7, CONTROL_BATCH | 0x10, 2, 10), Some((10, 37))); // transactional too
                                                                       // Data batches, truncated ones and other magics are left to the decoder.
        check(&batch(7, 0, 0, 10), None);
        check(&batch(7, CONTROL_BATCH, 0, 10)[..30], None);
        check(&[0; 10], None);
        let mut old = batch(7, CONTROL_BATCH, 0, 10);
        old[16] = 1;
        check(&old, None);
    }
}
