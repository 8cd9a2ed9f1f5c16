//! Republishing records to retry and dead-letter topics: an idempotent
//! producer (the broker drops what a retried request already wrote), acks
//! by every in-sync replica, records written as they were read (headers in
//! order, duplicates, null values and names that are not UTF-8 included),
//! compressed.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{atomic::AtomicU64, Arc, Mutex},
};

use bytes::Bytes;
use retry_core::{Headers, Timestamp};

use crate::{
    connection::cluster::Cluster,
    protocol::{
        batch::{self, Codec, NewRecord, RawHeader, Sequenced},
        metadata,
        produce::{self, Identity, Written},
        wire::Connection,
    },
    BrokerError, ConnectionConfig, Error, Result,
};

/// Publishes to any topic-partition of the cluster.
pub(crate) struct Publisher {
    cluster: Arc<Cluster>,
    config: ConnectionConfig,
    partition_counts: Mutex<HashMap<String, i32>>,
    /// The leader of each target partition, as last learnt.
    leaders: Mutex<HashMap<(String, i32), String>>,
    /// One connection per broker, one request at a time on it.
    connections: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Connection>>>>>,
    idempotence: tokio::sync::Mutex<Idempotence>,
    /// The next sequence number per target partition.
    sequences: Mutex<HashMap<(String, i32), i32>>,
    /// Per target partition, the last request that got no acknowledgement,
    /// by its bytes: it may be in the log. Only the same request may carry
    /// its sequence numbers again; other records under them would be taken
    /// for a duplicate of it and dropped by the broker.
    unacknowledged: Mutex<HashMap<(String, i32), u64>>,
    max_request_bytes: usize,
    /// Produce requests split in two after the broker refused them as too large.
    splits: Arc<AtomicU64>,
}

/// The producer's identity, as far as it is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Idempotence {
    /// Not asked yet, or dropped after the broker forgot it.
    Unknown,
    Known(Identity),
    /// The broker has no InitProducerId: requests are not deduplicated.
    Unsupported,
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
    pub(crate) fn of(error: BrokerError) -> PublishFailure {
        match error {
            BrokerError::MESSAGE_TOO_LARGE | BrokerError::RECORD_LIST_TOO_LARGE => PublishFailure::TooLarge,
            BrokerError::NOT_ENOUGH_REPLICAS | BrokerError::NOT_ENOUGH_REPLICAS_AFTER_APPEND => {
                PublishFailure::UnderReplicated
            }
            BrokerError::TOPIC_AUTHORIZATION_FAILED
            | BrokerError::CLUSTER_AUTHORIZATION_FAILED
            | BrokerError::TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            | BrokerError::INVALID_RECORD
            | BrokerError::CORRUPT_MESSAGE
            | BrokerError::INVALID_TOPIC_EXCEPTION
            | BrokerError::INVALID_REQUIRED_ACKS
            | BrokerError::UNSUPPORTED_FOR_MESSAGE_FORMAT
            | BrokerError::UNSUPPORTED_COMPRESSION_TYPE
            | BrokerError::INVALID_TIMESTAMP
            | BrokerError::POLICY_VIOLATION => PublishFailure::Refused,
            _ => PublishFailure::Retriable,
        }
    }

    /// Classifies any error of [`Publisher::publish_all`].
    pub(crate) fn of_error(error: &Error) -> PublishFailure {
        match error {
            Error::Broker { api: "Produce", error, .. } => PublishFailure::of(*error),
            // A target topic that vanished or lost partitions.
            Error::MissingTopic { .. } => PublishFailure::Refused,
            _ => PublishFailure::Retriable,
        }
    }
}

/// A record to publish.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    pub(crate) topic: String,
    pub(crate) source_partition: i32,
    pub(crate) key: Option<Bytes>,
    pub(crate) value: Option<Bytes>,
    /// Every header, in order, as written.
    pub(crate) headers: Vec<RawHeader>,
    pub(crate) timestamp: Timestamp,
    /// How its batch is compressed.
    pub(crate) codec: Codec,
}

impl Outgoing {
    /// What it adds to a produce request before compression.
    pub(crate) fn estimated_size(&self) -> usize {
        batch::record_size(
            NewRecord { key: self.key.as_deref(), value: self.value.as_deref(), timestamp: 0 },
            self.headers.iter().map(|h| (&h.name[..], h.value.as_deref())),
        )
    }
}

/// `headers` as written on the wire.
pub(crate) fn raw_headers(headers: &Headers) -> Vec<RawHeader> {
    headers
        .iter()
        .map(|(name, value)| RawHeader {
            name: Bytes::copy_from_slice(name.as_bytes()),
            value: Some(Bytes::copy_from_slice(value)),
        })
        .collect()
}

/// The headers of a republication: the record's own as it was read
/// (`original`, ours among them left out, in their order, duplicates and
/// null values included), then ours as `decided`, and the headers the
/// handler's failure attached (a name whose last value `decided` sets to
/// another value than the record's, or that the record lacked), which
/// replace the record's own of that name. Spring's retry headers that
/// `decided` dropped (a replay starting the ladder over) are left out too.
pub(crate) fn republished_headers(original: &[RawHeader], decided: &Headers) -> Vec<RawHeader> {
    use retry_core::{header_names::is_retry_header, spring::header_names::is_spring_header};
    let ours = |name: &[u8]| {
        std::str::from_utf8(name)
            .is_ok_and(|name| is_retry_header(name) || (is_spring_header(name) && decided.get(name).is_none()))
    };
    let last_read = |name: &str| {
        original.iter().rev().find(|h| h.name == name.as_bytes() && h.value.is_some()).and_then(|h| h.value.as_deref())
    };
    let attached: Vec<&str> = decided
        .iter()
        .map(|(name, _)| name)
        .filter(|name| !is_retry_header(name) && decided.get(name) != last_read(name))
        .collect();
    let replaced = |name: &[u8]| ours(name) || attached.iter().any(|a| a.as_bytes() == name);
    let mut out: Vec<RawHeader> = original.iter().filter(|h| !replaced(&h.name)).cloned().collect();
    out.extend(raw_headers(decided).into_iter().filter(|h| replaced(&h.name)));
    out
}

impl Publisher {
    /// A publisher whose produce requests carry at most `max_request_bytes`
    /// (estimated, before compression) unless a single record is larger.
    /// Splits are counted in `splits`.
    pub(crate) fn new(
        cluster: Arc<Cluster>,
        config: &ConnectionConfig,
        max_request_bytes: usize,
        splits: Arc<AtomicU64>,
    ) -> Self {
        Publisher {
            cluster,
            config: config.clone(),
            partition_counts: Mutex::default(),
            leaders: Mutex::default(),
            connections: Mutex::default(),
            idempotence: tokio::sync::Mutex::new(Idempotence::Unknown),
            sequences: Mutex::default(),
            unacknowledged: Mutex::default(),
            max_request_bytes,
            splits,
        }
    }

    /// Publishes every record of `outbox`, in order per target partition,
    /// in produce requests of at most `max_request_bytes` each (sent one
    /// after the other per target partition, target partitions
    /// concurrently); returns once the broker acknowledged them (acks=all).
    /// A request the broker refuses as too large is split in two and sent
    /// again; a record it refuses alone as too large is taken out of
    /// `outbox` and put in `refused` with the broker's answer, and the
    /// records after it go on (the caller decides where it goes instead).
    /// Records acknowledged are removed from `outbox`; on error the rest
    /// stay, for a later try, and the first error is returned.
    ///
    /// Requests carry the producer's id and sequence numbers: a request
    /// tried again after its answer was lost is written once. A later call
    /// with what an earlier one left cuts the same requests again, so the
    /// broker recognises them.
    ///
    /// A record keeps its source partition number when the target has it
    /// (the usual case: topics are verified to have at least as many
    /// partitions), else the partition is chosen from the key like Kafka's
    /// default partitioner.
    ///
    /// Each target partition's requests run in a task of their own: a
    /// connection shared by several partitions is never held by a caller
    /// that stopped polling (a worker busy elsewhere), so no partition waits
    /// on another's caller.
    pub(crate) async fn publish_all(
        self: &Arc<Self>,
        outbox: &mut Vec<Outgoing>,
        refused: &mut Vec<(Outgoing, Error)>,
    ) -> Result<()> {
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
        let mut sends = tokio::task::JoinSet::new();
        for ((topic, partition), records) in groups {
            if partition < 0 {
                outbox.extend(records); // no partition count: not sent
                continue;
            }
            let this = self.clone();
            sends.spawn(async move { this.publish_partition(topic, partition, records).await });
        }
        while let Some(joined) = sends.join_next().await {
            let (result, unsent, too_large) = joined.expect("publish tasks do not panic");
            refused.extend(too_large);
            if let Err(e) = result {
                first_error.get_or_insert(e);
                outbox.extend(unsent);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Publishes `records` to `topic`/`partition` in order; on error, the
    /// error and what was not acknowledged; in any case, the records the
    /// broker refused alone as too large.
    async fn publish_partition(
        &self,
        topic: String,
        partition: i32,
        records: Vec<Outgoing>,
    ) -> (Result<()>, Vec<Outgoing>, Vec<(Outgoing, Error)>) {
        let mut refused = Vec::new();
        let mut queue: VecDeque<Vec<Outgoing>> = chunks(records, self.max_request_bytes).into();
        while let Some(chunk) = queue.pop_front() {
            let source = match self.send(&topic, partition, &chunk).await {
                Ok(()) => continue,
                Err(source) => source,
            };
            let too_large = matches!(&source, Error::Broker { api: "Produce", error, .. }
                if PublishFailure::of(*error) == PublishFailure::TooLarge);
            if too_large && chunk.len() > 1 {
                self.splits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut first = chunk;
                let second = first.split_off(first.len() / 2);
                tracing::info!(%topic, partition, records = first.len() + second.len(), "the broker refused a produce request as too large; splitting it");
                queue.push_front(second);
                queue.push_front(first);
                continue;
            }
            if too_large {
                tracing::warn!(%topic, partition, error = %source, "the broker refused a record alone as too large");
                let record = chunk.into_iter().next().expect("a chunk holds a record");
                refused.push((record, source));
                continue;
            }
            let unsent: Vec<Outgoing> = std::iter::once(chunk).chain(queue).flatten().collect();
            return (Err(source), unsent, refused);
        }
        (Ok(()), Vec::new(), refused)
    }

    /// Sends one produce request for `chunk` (records of one codec) to the
    /// partition's leader and waits for its answer.
    async fn send(&self, topic: &str, partition: i32, chunk: &[Outgoing]) -> Result<()> {
        let target = (topic.to_owned(), partition);
        let leader = self.leader(topic, partition).await?;
        let slot = self.connection_slot(&leader);
        let mut slot = slot.lock().await;
        let result = async {
            let conn = match slot.as_mut() {
                Some(conn) if !conn.is_broken() => conn,
                _ => slot.insert(Connection::connect(&leader, &self.config).await?),
            };
            let mut identity = self.identity(conn).await?;
            let mut batch = self.encode_for(&target, chunk, identity);
            let fingerprint = fingerprint_of(&batch);
            let other = self.unacknowledged.lock().expect("not poisoned").get(&target).is_some_and(|f| *f != fingerprint);
            if identity.is_some() && other {
                // Not the request that went unacknowledged (its records
                // were abandoned and handled again, or cut otherwise): it
                // may be in the log under these sequence numbers, so a new
                // producer id, under which nothing is a duplicate of it.
                tracing::info!(%topic, partition, "the records differ from an unacknowledged request's: starting a new producer id");
                self.forget_identity().await;
                identity = self.identity(conn).await?;
                batch = self.encode_for(&target, chunk, identity);
            }
            let fingerprint = fingerprint_of(&batch);
            let base_sequence = self.sequences.lock().expect("not poisoned").get(&target).copied().unwrap_or(0);
            let written = produce::produce(conn, topic, partition, batch, self.config.request_timeout)
                .await
                .inspect_err(|_| {
                    if identity.is_some() {
                        self.unacknowledged.lock().expect("not poisoned").insert(target.clone(), fingerprint);
                    }
                })?;
            self.unacknowledged.lock().expect("not poisoned").remove(&target);
            if written == Written::Duplicate {
                tracing::info!(%topic, partition, records = chunk.len(), "the broker had written these records already (a retried request): not written twice");
            }
            if identity.is_some() {
                let next = next_sequence(base_sequence, chunk.len());
                self.sequences.lock().expect("not poisoned").insert(target.clone(), next);
            }
            Ok(())
        }
        .await;
        if let Err(e) = &result {
            match e {
                Error::Broker { error, .. } => match *error {
                    BrokerError::OUT_OF_ORDER_SEQUENCE_NUMBER
                    | BrokerError::UNKNOWN_PRODUCER_ID
                    | BrokerError::INVALID_PRODUCER_EPOCH
                    | BrokerError::PRODUCER_FENCED => {
                        // The broker lost track of us: a new identity, sequences from 0.
                        tracing::warn!(%topic, partition, error = ?error, "the broker does not know the producer's sequence; starting a new producer id");
                        self.forget_identity().await;
                    }
                    _ => {
                        self.leaders.lock().expect("not poisoned").remove(&target);
                    }
                },
                // No answer, or a broken connection: the request may have
                // been written; the next try sends the same sequence.
                _ => {
                    *slot = None;
                    self.leaders.lock().expect("not poisoned").remove(&target);
                }
            }
        }
        result
    }

    /// Drops the producer's identity: the next request asks for a new one,
    /// and every partition's sequence starts again at 0.
    async fn forget_identity(&self) {
        *self.idempotence.lock().await = Idempotence::Unknown;
        self.sequences.lock().expect("not poisoned").clear();
        self.unacknowledged.lock().expect("not poisoned").clear();
    }

    /// `chunk` as one batch for `target`, with the producer's id and the
    /// partition's next sequence number when idempotent.
    fn encode_for(&self, target: &(String, i32), chunk: &[Outgoing], identity: Option<Identity>) -> Bytes {
        let base_sequence = self.sequences.lock().expect("not poisoned").get(target).copied().unwrap_or(0);
        let producer = identity.map(|id| Sequenced {
            producer_id: id.producer_id,
            producer_epoch: id.producer_epoch,
            base_sequence,
        });
        encode(chunk, producer)
    }

    /// The producer's identity, asked of `conn`'s broker the first time;
    /// `None` when the cluster does not offer idempotence.
    async fn identity(&self, conn: &mut Connection) -> Result<Option<Identity>> {
        let mut idempotence = self.idempotence.lock().await;
        match *idempotence {
            Idempotence::Known(identity) => return Ok(Some(identity)),
            Idempotence::Unsupported => return Ok(None),
            Idempotence::Unknown => {}
        }
        match produce::init_producer_id(conn).await? {
            Some(identity) => {
                tracing::debug!(
                    producer_id = identity.producer_id,
                    epoch = identity.producer_epoch,
                    "idempotent producer"
                );
                *idempotence = Idempotence::Known(identity);
                Ok(Some(identity))
            }
            None => {
                tracing::warn!(addr = %conn.addr(), "the broker has no InitProducerId: republications are not deduplicated when a produce request is retried");
                *idempotence = Idempotence::Unsupported;
                Ok(None)
            }
        }
    }

    async fn leader(&self, topic: &str, partition: i32) -> Result<String> {
        let key = (topic.to_owned(), partition);
        if let Some(addr) = self.leaders.lock().expect("not poisoned").get(&key) {
            return Ok(addr.clone());
        }
        let leaders = metadata::leaders(&self.config, topic).await?;
        let mut cache = self.leaders.lock().expect("not poisoned");
        for (p, addr) in leaders {
            cache.insert((topic.to_owned(), p), addr);
        }
        cache.get(&key).cloned().ok_or_else(|| Error::Protocol {
            addr: self.config.bootstrap.join(","),
            api: "Metadata",
            reason: format!("no leader known for {topic}/{partition}"),
        })
    }

    fn connection_slot(&self, addr: &str) -> Arc<tokio::sync::Mutex<Option<Connection>>> {
        self.connections.lock().expect("not poisoned").entry(addr.to_owned()).or_default().clone()
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
            .ok_or_else(|| Error::MissingTopic { topic: topic.to_owned(), remedy: "create the ladder's topics first" })
    }
}

/// What tells one request's bytes from another's.
fn fingerprint_of(batch: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    batch.hash(&mut hasher);
    hasher.finish()
}

/// The sequence after `count` records from `base` (Kafka wraps at i32::MAX).
fn next_sequence(base: i32, count: usize) -> i32 {
    ((i64::from(base) + count as i64) % (i64::from(i32::MAX) + 1)) as i32
}

/// One batch of `records` (all of one codec).
fn encode(records: &[Outgoing], producer: Option<Sequenced>) -> Bytes {
    let codec = records.first().map_or(Codec::None, |r| r.codec);
    let input: Vec<(NewRecord<'_>, batch::HeaderSlices<'_>)> = records
        .iter()
        .map(|r| {
            let headers = r.headers.iter().map(|h| (&h.name[..], h.value.as_deref())).collect();
            (
                NewRecord { key: r.key.as_deref(), value: r.value.as_deref(), timestamp: r.timestamp.as_millis() },
                headers,
            )
        })
        .collect();
    batch::encode(&input, codec, producer)
}

/// Cuts `records` into runs, in order, of at most `max_bytes` (estimated)
/// each and of one codec; a record larger than that alone makes a run.
fn chunks(records: Vec<Outgoing>, max_bytes: usize) -> Vec<Vec<Outgoing>> {
    const BATCH_OVERHEAD: usize = batch::HEADER_BYTES;
    let mut out: Vec<Vec<Outgoing>> = Vec::new();
    let mut size = 0;
    for record in records {
        let n = record.estimated_size();
        match out.last_mut() {
            Some(run) if size + n <= max_bytes && run[0].codec == record.codec => {
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
            headers: Vec::new(),
            timestamp: Timestamp::from_millis(0),
            codec: Codec::None,
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
        // Each record costs its value plus about 26; a run adds 61.
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
        check(BrokerError::NOT_LEADER_OR_FOLLOWER, PublishFailure::Retriable);
        check(BrokerError::REQUEST_TIMED_OUT, PublishFailure::Retriable);
        check(BrokerError::NOT_ENOUGH_REPLICAS, PublishFailure::UnderReplicated);
        check(BrokerError::NOT_ENOUGH_REPLICAS_AFTER_APPEND, PublishFailure::UnderReplicated);
        check(BrokerError::MESSAGE_TOO_LARGE, PublishFailure::TooLarge);
        check(BrokerError::RECORD_LIST_TOO_LARGE, PublishFailure::TooLarge);
        check(BrokerError::TOPIC_AUTHORIZATION_FAILED, PublishFailure::Refused);
        check(BrokerError::CLUSTER_AUTHORIZATION_FAILED, PublishFailure::Refused);
        check(BrokerError::INVALID_RECORD, PublishFailure::Refused);
        check(BrokerError::POLICY_VIOLATION, PublishFailure::Refused);
    }

    #[test]
    fn a_run_has_one_codec() {
        let mut records: Vec<Outgoing> = (0..4).map(|_| outgoing(10)).collect();
        records[2].codec = Codec::Lz4;
        records[3].codec = Codec::Lz4;
        let codecs: Vec<Vec<Codec>> =
            chunks(records, 1000).iter().map(|run| run.iter().map(|r| r.codec).collect()).collect();
        assert_eq!(codecs, [vec![Codec::None; 2], vec![Codec::Lz4; 2]]);
    }

    #[test]
    fn sequences_wrap_like_kafka() {
        assert_eq!(next_sequence(0, 3), 3);
        assert_eq!(next_sequence(i32::MAX - 1, 1), i32::MAX);
        assert_eq!(next_sequence(i32::MAX - 1, 3), 1);
    }

    #[test]
    fn republications_keep_the_record_s_headers_and_replace_ours() {
        let raw = |name: &[u8], value: Option<&[u8]>| RawHeader {
            name: Bytes::copy_from_slice(name),
            value: value.map(Bytes::copy_from_slice),
        };
        let original = vec![
            raw(b"b", Some(b"1")),
            raw(b"x-retry-attempt", Some(b"1")),
            raw(b"b", Some(b"2")),
            raw(b"null", None),
            raw(b"\xff", Some(b"bytes")),
            raw(b"kafka_original-offset", Some(b"\0\0\0\0\0\0\0\x07")),
        ];
        let mut decided = Headers::new();
        decided.insert("b", "2"); // what core kept of the producer's: ignored here
        decided.insert("x-retry-attempt", "2");
        decided.insert("x-error", "boom");
        let got = republished_headers(&original, &decided);
        let expected = vec![
            raw(b"b", Some(b"1")),
            raw(b"b", Some(b"2")),
            raw(b"null", None),
            raw(b"\xff", Some(b"bytes")),
            raw(b"x-retry-attempt", Some(b"2")),
            raw(b"x-error", Some(b"boom")),
        ];
        assert_eq!(got, expected, "Spring's header is dropped when the decision drops it");
        decided.insert("kafka_original-offset", b"\0\0\0\0\0\0\0\x07".to_vec());
        let got = republished_headers(&original, &decided);
        let spring = raw(b"kafka_original-offset", Some(b"\0\0\0\0\0\0\0\x07"));
        assert_eq!(got[4], spring, "and kept in its place when the decision keeps it");
        decided.remove("kafka_original-offset");
        // What the handler's failure attached: new, or replacing the record's own.
        decided.insert("currency", "EUR");
        decided.insert("b", "3");
        let got = republished_headers(&original, &decided);
        let expected = vec![
            raw(b"null", None),
            raw(b"\xff", Some(b"bytes")),
            raw(b"x-retry-attempt", Some(b"2")),
            raw(b"x-error", Some(b"boom")),
            raw(b"currency", Some(b"EUR")),
            raw(b"b", Some(b"3")),
        ];
        assert_eq!(got, expected);
    }

    #[test]
    fn partition_choice() {
        assert_eq!(choose_partition(2, Some(b"k"), 3), 2, "same partition when it exists");
        assert_eq!(choose_partition(5, None, 3), 2);
        let p = choose_partition(5, Some(b"foobar"), 3);
        assert_eq!(p, (-790332482i32 & 0x7fff_ffff) % 3);
    }
}
