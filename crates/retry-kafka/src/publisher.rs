//! Republishing records to retry and dead-letter topics, acknowledged by
//! all in-sync replicas (rskafka produces with acks=all).

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{atomic::AtomicU64, Arc, Mutex},
};

use bytes::Bytes;
use chrono::{TimeZone, Utc};
use retry_core::{Headers, Timestamp};
use rskafka::{
    client::{
        error::{Error as ClientError, ProtocolError},
        partition::{Compression, PartitionClient, UnknownTopicHandling},
    },
    record::Record,
};

use tokio::task::JoinSet;

use crate::{cluster::Cluster, Error, Result};

/// Publishes to any topic-partition, caching one rskafka client per target.
pub(crate) struct Publisher {
    cluster: Arc<Cluster>,
    partitions: Mutex<HashMap<(String, i32), Arc<PartitionClient>>>,
    partition_counts: Mutex<HashMap<String, i32>>,
    max_request_bytes: usize,
    /// Produce requests split in two after the broker refused them as too large.
    splits: Arc<AtomicU64>,
}

/// How a failed publish is to be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PublishFailure {
    /// Worth trying again as it is (a leader moved, a broker restarts).
    Retriable,
    /// The request was too large: smaller requests may go through.
    TooLarge,
    /// The cluster cannot write durably now (fewer replicas in sync than
    /// the topic's `min.insync.replicas`: brokers are down): worth trying
    /// again as it is, and people must be told at once, not after
    /// `publish_stall_after`.
    UnderReplicated,
    /// The broker refuses it, and will until someone changes something (an
    /// ACL, a topic config, a deleted topic): trying again is still right,
    /// but people must be told.
    Refused,
}

impl PublishFailure {
    /// Classifies a broker's answer to a produce request.
    pub(crate) fn of(error: ProtocolError) -> PublishFailure {
        use ProtocolError::*;
        match error {
            MessageTooLarge | RecordListTooLarge => PublishFailure::TooLarge,
            NotEnoughReplicas | NotEnoughReplicasAfterAppend => PublishFailure::UnderReplicated,
            TopicAuthorizationFailed
            | ClusterAuthorizationFailed
            | TransactionalIdAuthorizationFailed
            | InvalidRecord
            | CorruptMessage
            | InvalidTopicException
            | InvalidRequiredAcks
            | UnsupportedForMessageFormat
            | UnsupportedCompressionType
            | InvalidTimestamp
            | PolicyViolation => PublishFailure::Refused,
            _ => PublishFailure::Retriable,
        }
    }

    /// Classifies any error of [`Publisher::publish_all`].
    pub(crate) fn of_error(error: &Error) -> PublishFailure {
        match error {
            Error::Client { source: ClientError::ServerError { protocol_error, .. }, .. } => {
                PublishFailure::of(*protocol_error)
            }
            // A target topic that vanished or lost partitions.
            Error::Config(_) => PublishFailure::Refused,
            _ => PublishFailure::Retriable,
        }
    }
}

/// A record to publish.
pub(crate) struct Outgoing {
    pub(crate) topic: String,
    pub(crate) source_partition: i32,
    pub(crate) key: Option<Bytes>,
    pub(crate) value: Option<Bytes>,
    pub(crate) headers: Headers,
    pub(crate) timestamp: Timestamp,
}

impl Publisher {
    /// A publisher whose produce requests carry at most `max_request_bytes`
    /// (estimated) unless a single record is larger.
    /// Splits are counted in `splits`.
    pub(crate) fn new(cluster: Arc<Cluster>, max_request_bytes: usize, splits: Arc<AtomicU64>) -> Self {
        Publisher {
            cluster,
            partitions: Mutex::default(),
            partition_counts: Mutex::default(),
            max_request_bytes,
            splits,
        }
    }

    /// Publishes every record of `outbox`, in order per target partition,
    /// in produce requests of at most `max_request_bytes` each (sent one
    /// after the other per target partition, target partitions
    /// concurrently); returns once the broker acknowledged them (acks=all).
    /// A request the broker refuses as too large is split in two and sent
    /// again. Records acknowledged are removed from `outbox`; on error the
    /// rest stay, for a later try, and the first error is returned.
    ///
    /// A record keeps its source partition number when the target has it
    /// (the usual case: topics are verified to have at least as many
    /// partitions), else the partition is chosen from the key like Kafka's
    /// default partitioner.
    pub(crate) async fn publish_all(&self, outbox: &mut Vec<Outgoing>) -> Result<()> {
        let mut groups: BTreeMap<(String, i32), Vec<Outgoing>> = BTreeMap::new();
        let mut first_error = None;
        for record in outbox.drain(..) {
            match self.partition_count(&record.topic).await {
                Ok(count) => {
                    let partition = choose_partition(record.source_partition, record.key.as_deref(), count);
                    groups.entry((record.topic.clone(), partition)).or_default().push(record);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                    groups.entry((record.topic.clone(), -1)).or_default().push(record);
                }
            }
        }
        let mut requests = JoinSet::new();
        for ((topic, partition), records) in groups {
            if partition < 0 {
                outbox.extend(records); // no partition count: not sent
                continue;
            }
            let client = match self.partition_client(&topic, partition).await {
                Ok(client) => client,
                Err(e) => {
                    first_error.get_or_insert(e);
                    outbox.extend(records);
                    continue;
                }
            };
            let max_bytes = self.max_request_bytes;
            let splits = self.splits.clone();
            let timeout = self.cluster.request_timeout();
            requests.spawn(async move {
                let mut queue: VecDeque<Vec<Outgoing>> = chunks(records, max_bytes).into();
                while let Some(chunk) = queue.pop_front() {
                    let batch = chunk.iter().map(to_rskafka).collect();
                    let produce = client.produce(batch, Compression::NoCompression);
                    let source = match tokio::time::timeout(timeout, produce).await {
                        Ok(Ok(_)) => continue,
                        Ok(Err(source)) => source,
                        Err(_) => {
                            let unsent: Vec<Outgoing> = std::iter::once(chunk).chain(queue).flatten().collect();
                            let what = format!("publishing to {topic}/{partition}");
                            return (Err(Error::Deadline { what, timeout }), unsent);
                        }
                    };
                    let too_large = matches!(
                        &source,
                        ClientError::ServerError { protocol_error, .. }
                            if PublishFailure::of(*protocol_error) == PublishFailure::TooLarge
                    );
                    if too_large && chunk.len() > 1 {
                        splits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let mut first = chunk;
                        let second = first.split_off(first.len() / 2);
                        tracing::info!(%topic, partition, records = first.len() + second.len(), "the broker refused a produce request as too large; splitting it");
                        queue.push_front(second);
                        queue.push_front(first);
                        continue;
                    }
                    let unsent: Vec<Outgoing> = std::iter::once(chunk).chain(queue).flatten().collect();
                    let error = Error::Client { what: format!("publishing to {topic}/{partition}"), source };
                    return (Err(error), unsent);
                }
                (Ok(()), Vec::new())
            });
        }
        while let Some(joined) = requests.join_next().await {
            let (result, records) = joined.expect("produce tasks do not panic");
            if let Err(e) = result {
                if let (Error::Deadline { .. }, Some(first)) = (&e, records.first()) {
                    // Its connection may be hung: the next try gets a new one.
                    let target = first.topic.clone();
                    let partition = choose_partition(first.source_partition, first.key.as_deref(), self.count(&target));
                    self.partitions.lock().expect("not poisoned").remove(&(target, partition));
                }
                first_error.get_or_insert(e);
                outbox.extend(records);
            }
        }
        match first_error {
            Some(e) => {
                // A leader may have moved: rskafka's cached view must not
                // send the next try to the same wrong broker.
                self.cluster.refresh_metadata().await;
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// The cached partition count of `topic` (0 when unknown).
    fn count(&self, topic: &str) -> i32 {
        self.partition_counts.lock().expect("not poisoned").get(topic).copied().unwrap_or(0)
    }

    async fn partition_count(&self, topic: &str) -> Result<i32> {
        if let Some(n) = self.partition_counts.lock().expect("not poisoned").get(topic).filter(|n| **n > 0) {
            return Ok(*n);
        }
        let topics = self.cluster.list_topics().await?;
        let mut counts = self.partition_counts.lock().expect("not poisoned");
        for t in topics.into_iter().filter(|t| !t.partitions.is_empty()) {
            counts.insert(t.name, t.partitions.len() as i32);
        }
        counts
            .get(topic)
            .copied()
            .filter(|n| *n > 0)
            .ok_or_else(|| Error::Config(format!("topic {topic} does not exist: create the ladder's topics first")))
    }

    async fn partition_client(&self, topic: &str, partition: i32) -> Result<Arc<PartitionClient>> {
        let key = (topic.to_owned(), partition);
        if let Some(c) = self.partitions.lock().expect("not poisoned").get(&key) {
            return Ok(c.clone());
        }
        let client = self.cluster.partition_client(topic, partition, UnknownTopicHandling::Error).await?;
        let client = Arc::new(client);
        self.partitions.lock().expect("not poisoned").insert(key, client.clone());
        Ok(client)
    }
}

/// What one record adds to a produce request, roughly: its bytes plus the
/// record and header framing (varints, attributes, deltas).
fn estimated_size(record: &Outgoing) -> usize {
    const RECORD_OVERHEAD: usize = 24;
    const HEADER_OVERHEAD: usize = 10;
    let headers: usize = record.headers.iter().map(|(k, v)| k.len() + v.len() + HEADER_OVERHEAD).sum();
    RECORD_OVERHEAD
        + record.key.as_ref().map_or(0, |k| k.len())
        + record.value.as_ref().map_or(0, |v| v.len())
        + headers
}

/// Cuts `records` into runs, in order, of at most `max_bytes` (estimated)
/// each; a record larger than that alone makes a run.
fn chunks(records: Vec<Outgoing>, max_bytes: usize) -> Vec<Vec<Outgoing>> {
    /// The batch header of a produce request's record batch.
    const BATCH_OVERHEAD: usize = 61;
    let mut out: Vec<Vec<Outgoing>> = Vec::new();
    let mut size = 0;
    for record in records {
        let n = estimated_size(&record);
        match out.last_mut() {
            Some(run) if size + n <= max_bytes => {
                size += n;
                run.push(record);
            }
            _ => {
                size = BATCH_OVERHEAD + n;
                out.push(vec![record]);
            }
        }
    }
    out
}

fn to_rskafka(record: &Outgoing) -> Record {
    let timestamp = Utc
        .timestamp_millis_opt(record.timestamp.as_millis())
        .single()
        .unwrap_or_else(|| Utc.timestamp_millis_opt(0).single().expect("the epoch exists"));
    Record {
        key: record.key.as_ref().map(|k| k.to_vec()),
        value: record.value.as_ref().map(|v| v.to_vec()),
        // rskafka's headers are a map: a repeated name keeps its last value.
        headers: record.headers.clone().into(),
        timestamp,
    }
}

fn choose_partition(source_partition: i32, key: Option<&[u8]>, count: i32) -> i32 {
    // Counts come from listings that skip topics without partitions; a
    // zero here would divide by zero below.
    let count = count.max(1);
    if source_partition < count {
        return source_partition;
    }
    match key {
        Some(key) => (murmur2(key) & 0x7fff_ffff) % count,
        None => source_partition % count,
    }
}

/// Kafka's murmur2, as its default partitioner hashes keys.
fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes(chunk.try_into().expect("4 bytes"));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafka() {
        // Kafka's own test vectors (UtilsTest.testMurmur2).
        let cases: &[(&str, i32)] = &[
            ("21", -973932308),
            ("foobar", -790332482),
            ("a-little-bit-long-string", -985981536),
            ("a-little-bit-longer-string", -1486304829),
            ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
            ("abc", 479470107),
        ];
        for (input, expected) in cases {
            assert_eq!(murmur2(input.as_bytes()), *expected, "{input}");
        }
    }

    fn outgoing(value_len: usize) -> Outgoing {
        Outgoing {
            topic: "t".into(),
            source_partition: 0,
            key: None,
            value: Some(Bytes::from(vec![b'x'; value_len])),
            headers: Headers::default(),
            timestamp: Timestamp::from_millis(0),
        }
    }

    /// Record value sizes cut into runs of at most `max` bytes: the sizes per run.
    #[track_caller]
    fn check_chunks(sizes: &[usize], max: usize, expected: &[&[usize]]) {
        let runs = chunks(sizes.iter().map(|n| outgoing(*n)).collect(), max);
        let got: Vec<Vec<usize>> =
            runs.iter().map(|run| run.iter().map(|r| r.value.as_ref().unwrap().len()).collect()).collect();
        assert_eq!(got, expected, "sizes {sizes:?} within {max}");
    }

    #[test]
    fn produce_requests_are_capped_in_bytes() {
        // Each record costs its value plus 24; a run adds 61.
        check_chunks(&[], 1000, &[]);
        check_chunks(&[100, 100, 100], 1000, &[&[100, 100, 100]]);
        check_chunks(&[300, 300, 300], 1000, &[&[300, 300], &[300]]);
        // A record larger than the cap goes alone, and is not dropped.
        check_chunks(&[50, 5000, 50], 1000, &[&[50], &[5000], &[50]]);
        check_chunks(&[900; 3], 1000, &[&[900], &[900], &[900]]);
    }

    #[test]
    fn publish_failures() {
        let check = |error, expected| assert_eq!(PublishFailure::of(error), expected, "{error:?}");
        check(ProtocolError::NotLeaderOrFollower, PublishFailure::Retriable);
        check(ProtocolError::RequestTimedOut, PublishFailure::Retriable);
        check(ProtocolError::NotEnoughReplicas, PublishFailure::UnderReplicated);
        check(ProtocolError::NotEnoughReplicasAfterAppend, PublishFailure::UnderReplicated);
        check(ProtocolError::MessageTooLarge, PublishFailure::TooLarge);
        check(ProtocolError::RecordListTooLarge, PublishFailure::TooLarge);
        check(ProtocolError::TopicAuthorizationFailed, PublishFailure::Refused);
        check(ProtocolError::ClusterAuthorizationFailed, PublishFailure::Refused);
        check(ProtocolError::InvalidRecord, PublishFailure::Refused);
        check(ProtocolError::PolicyViolation, PublishFailure::Refused);
    }

    #[test]
    fn partition_choice() {
        assert_eq!(choose_partition(2, Some(b"k"), 3), 2, "same partition when it exists");
        assert_eq!(choose_partition(5, None, 3), 2);
        let p = choose_partition(5, Some(b"foobar"), 3);
        assert_eq!(p, (-790332482i32 & 0x7fff_ffff) % 3);
    }
}
