//! Reading a partition: Fetch through `kafka-protocol`, batches through our
//! own decoder ([`super::batch`]), and the records of aborted transactions
//! left out as Kafka's own consumer leaves them out under `read_committed`.
//!
//! A fetch says how far it read, control batches and compacted gaps
//! included, so a partition never waits below a transaction marker; a batch
//! that cannot be read is handed on as such (its bytes, its offsets, why),
//! never dropped and never the end of the partition.

use bytes::Bytes;
use kafka_protocol::{
    messages::{
        fetch_request::{FetchPartition, FetchTopic},
        BrokerId, FetchRequest, TopicName,
    },
    ResponseError,
};

use super::batch::{self, Batch, BatchHeader, Marker, RawRecord};
use crate::{
    protocol::{
        metadata::leader_of,
        wire::{str_bytes, Connection},
    },
    ConnectionConfig, Error, IsolationLevel,
};

/// A transaction the broker reports aborted: its producer, and the first
/// offset it wrote in this partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AbortedTransaction {
    pub(crate) producer_id: i64,
    pub(crate) first_offset: i64,
}

/// One thing a fetch read, in offset order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Item {
    /// A record for the handler.
    Record(RawRecord),
    /// A batch that cannot be read: the offsets it covers, its bytes, why.
    Undecodable { header: BatchHeader, raw: Bytes, problem: String },
}

impl Item {
    /// The (first) offset it stands at.
    #[cfg(test)]
    pub(crate) fn offset(&self) -> i64 {
        match self {
            Item::Record(r) => r.offset,
            Item::Undecodable { header, .. } => header.base_offset,
        }
    }
}

/// What a fetch at a position holds for the consumer.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Readable {
    /// Records and undecodable batches at or after the position.
    pub(crate) items: Items,
    /// The offset after the last whole batch read, data, control or
    /// aborted: where the next fetch starts. `None` when no whole batch came.
    pub(crate) next_offset: Option<i64>,
    /// Records left out because their transaction was aborted.
    pub(crate) aborted: usize,
}

/// The records and undecodable batches of a fetch, in offset order, kept
/// in the batches they came in: a fetch of thousands of records is handed
/// on one at a time, never copied into one large vector of its own.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Items {
    parts: Vec<Part>,
    len: usize,
}

#[derive(Debug, PartialEq, Eq)]
enum Part {
    /// A batch's records, from the `skip`-th on (those before the position
    /// are not read again).
    Records {
        records: Vec<RawRecord>,
        skip: usize,
    },
    Undecodable {
        header: BatchHeader,
        raw: Bytes,
        problem: String,
    },
}

impl Items {
    fn records(&mut self, records: Vec<RawRecord>, position: i64) {
        // A batch's records are in offset order.
        let skip = records.partition_point(|r| r.offset < position);
        self.len += records.len() - skip;
        self.parts.push(Part::Records { records, skip });
    }

    fn undecodable(&mut self, header: BatchHeader, raw: Bytes, problem: String) {
        self.len += 1;
        self.parts.push(Part::Undecodable { header, raw, problem });
    }

    /// How many items there are.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The items, one at a time.
    pub(crate) fn into_items(self) -> impl Iterator<Item = Item> + Send {
        self.parts.into_iter().flat_map(|part| {
            let (records, undecodable) = match part {
                Part::Records { records, skip } => (Some(records.into_iter().skip(skip).map(Item::Record)), None),
                Part::Undecodable { header, raw, problem } => (None, Some(Item::Undecodable { header, raw, problem })),
            };
            records.into_iter().flatten().chain(undecodable)
        })
    }
}

/// What of `batches`, fetched at `position`, a consumer at `isolation`
/// reads; `aborted` is the fetch's list of aborted transactions.
///
/// Under `read_committed` Kafka's rule (its `CompletedFetch`): a
/// transactional batch is skipped when its producer has an aborted
/// transaction that began at or before the batch's last offset and whose
/// abort marker has not been passed yet; the marker ends that.
pub(crate) fn readable(
    batches: Vec<Batch>,
    position: i64,
    aborted: &[AbortedTransaction],
    isolation: IsolationLevel,
) -> Readable {
    let mut pending: Vec<AbortedTransaction> = aborted.to_vec();
    pending.sort_by_key(|t| std::cmp::Reverse(t.first_offset)); // popped from the end, lowest first
    let mut aborting: Vec<i64> = Vec::new();
    let mut out = Readable::default();
    for batch in batches {
        let header = *batch.header();
        out.next_offset = Some(out.next_offset.unwrap_or(position).max(header.next_offset()));
        if header.next_offset() <= position {
            continue; // wholly before the position (a fetch starts at a batch's base)
        }
        if isolation == IsolationLevel::ReadCommitted && header.producer_id >= 0 {
            while pending.last().is_some_and(|t| t.first_offset <= header.last_offset()) {
                let t = pending.pop().expect("just seen");
                aborting.push(t.producer_id);
            }
            if let Batch::Control { marker: Marker::Abort, .. } = batch {
                aborting.retain(|p| *p != header.producer_id);
                continue;
            }
            if header.is_transactional() && aborting.contains(&header.producer_id) {
                if let Batch::Data { records, .. } = &batch {
                    out.aborted += records.len();
                }
                continue;
            }
        }
        match batch {
            Batch::Data { records, .. } => out.items.records(records, position),
            Batch::Control { .. } => {}
            Batch::Undecodable { header, raw, problem } => out.items.undecodable(header, raw, problem),
        }
    }
    out
}

/// What a fetch came back with.
#[derive(Debug)]
pub(crate) struct Fetched {
    pub(crate) readable: Readable,
    /// How far the consumer can read: the last stable offset under
    /// `read_committed` (when the broker tells it), else the high watermark.
    pub(crate) end: i64,
    /// Bytes came, but not one whole batch: the first batch is larger than
    /// the fetch may bring (a broker that does not answer with at least one
    /// whole batch, as Kafka does since KIP-74).
    pub(crate) cut: bool,
}

/// Why a fetch failed, as far as the consumer's next step goes.
#[derive(Debug)]
pub(crate) enum FetchError {
    /// OFFSET_OUT_OF_RANGE.
    OutOfRange,
    /// No answer within the deadline.
    NoAnswer(Error),
    /// Anything else: a broker error, a broken connection, a leader moved.
    Failed(Error),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::OutOfRange => write!(f, "offset out of range"),
            FetchError::NoAnswer(e) | FetchError::Failed(e) => e.fmt(f),
        }
    }
}

/// Reads one partition from its leader, over a connection of its own kept
/// between fetches and replaced after any failure.
pub(crate) struct PartitionReader {
    config: ConnectionConfig,
    topic: String,
    partition: i32,
    isolation: IsolationLevel,
    /// The most one batch may decompress to.
    max_inflated: usize,
    leader: Option<Connection>,
}

impl PartitionReader {
    pub(crate) fn new(
        config: &ConnectionConfig,
        topic: &str,
        partition: i32,
        isolation: IsolationLevel,
        max_inflated: usize,
    ) -> Self {
        PartitionReader {
            config: config.clone(),
            topic: topic.to_owned(),
            partition,
            isolation,
            max_inflated,
            leader: None,
        }
    }

    /// Fetches from `position`, the broker holding the answer up to
    /// `max_wait` for records, and returns what a consumer reads of it.
    pub(crate) async fn fetch(
        &mut self,
        position: i64,
        max_bytes: i32,
        max_wait: std::time::Duration,
    ) -> std::result::Result<Fetched, FetchError> {
        let mut conn = match self.leader.take() {
            Some(conn) => conn,
            None => {
                let leader = leader_of(&self.config, &self.topic, self.partition).await.map_err(FetchError::Failed)?;
                Connection::connect(&leader, &self.config).await.map_err(FetchError::Failed)?
            }
        };
        let fetched = self.fetch_on(&mut conn, position, max_bytes, max_wait).await?;
        self.leader = Some(conn);
        Ok(fetched)
    }

    async fn fetch_on(
        &self,
        conn: &mut Connection,
        position: i64,
        max_bytes: i32,
        max_wait: std::time::Duration,
    ) -> std::result::Result<Fetched, FetchError> {
        let (topic, partition) = (&self.topic, self.partition);
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(i32::try_from(max_wait.as_millis()).unwrap_or(i32::MAX))
            .with_min_bytes(1)
            .with_max_bytes(max_bytes)
            .with_isolation_level(match self.isolation {
                IsolationLevel::ReadUncommitted => 0,
                IsolationLevel::ReadCommitted => 1,
            })
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default().with_topic(TopicName(str_bytes(topic))).with_partitions(vec![
                FetchPartition::default()
                    .with_partition(partition)
                    .with_current_leader_epoch(-1)
                    .with_fetch_offset(position)
                    .with_last_fetched_epoch(-1)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(max_bytes),
            ])]);
        // The broker may hold the fetch for its max wait before answering.
        let (response, _) = conn.send_within(&request, conn.timeout() + max_wait).await.map_err(|e| match e {
            Error::Timeout { .. } => FetchError::NoAnswer(e),
            e => FetchError::Failed(e),
        })?;
        let broker_error = |code: i16| match ResponseError::try_from_code(code) {
            None => Ok(()),
            Some(ResponseError::OffsetOutOfRange) => Err(FetchError::OutOfRange),
            Some(error) => Err(FetchError::Failed(Error::Broker {
                api: "Fetch",
                context: Some(format!("{topic}/{partition}")),
                error: error.into(),
            })),
        };
        broker_error(response.error_code)?;
        let data = response
            .responses
            .into_iter()
            .flat_map(|t| t.partitions)
            .find(|p| p.partition_index == partition)
            .ok_or_else(|| {
            FetchError::Failed(Error::Protocol {
                addr: conn.addr().to_owned(),
                api: "Fetch",
                reason: format!("no data for {topic}/{partition} in the response"),
            })
        })?;
        broker_error(data.error_code)?;
        let bytes = data.records.unwrap_or_default();
        let had_bytes = !bytes.is_empty();
        let batches = batch::decode_all(bytes, self.max_inflated);
        let cut = had_bytes && batches.is_empty();
        let aborted: Vec<AbortedTransaction> = data
            .aborted_transactions
            .unwrap_or_default()
            .iter()
            .map(|t| AbortedTransaction { producer_id: t.producer_id.0, first_offset: t.first_offset })
            .collect();
        let readable = readable(batches, position, &aborted, self.isolation);
        let end = match self.isolation {
            IsolationLevel::ReadCommitted if data.last_stable_offset >= 0 => data.last_stable_offset,
            _ => data.high_watermark,
        };
        Ok(Fetched { readable, end, cut })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(base: i64, last_delta: i32, producer_id: i64, transactional: bool) -> BatchHeader {
        BatchHeader {
            base_offset: base,
            size: 100,
            magic: 2,
            crc: 0,
            attributes: if transactional { 0x10 } else { 0 },
            last_offset_delta: last_delta,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id,
            producer_epoch: 0,
            base_sequence: 0,
            record_count: last_delta + 1,
        }
    }

    fn record(offset: i64) -> RawRecord {
        RawRecord { offset, timestamp: 0, key: None, value: None, headers: vec![], codec: batch::Codec::None }
    }

    /// Data: records at base..=base+delta from `producer`.
    fn data(base: i64, delta: i32, producer: i64, transactional: bool) -> Batch {
        let records = (base..=base + i64::from(delta)).map(record).collect();
        Batch::Data { header: header(base, delta, producer, transactional), records }
    }

    fn marker(offset: i64, producer: i64, marker: Marker) -> Batch {
        let mut h = header(offset, 0, producer, true);
        h.attributes |= 0x20;
        Batch::Control { header: h, marker }
    }

    fn aborted(producer_id: i64, first_offset: i64) -> AbortedTransaction {
        AbortedTransaction { producer_id, first_offset }
    }

    /// The offsets read, where the next fetch starts, and how many records
    /// were left out as aborted.
    #[track_caller]
    fn check(
        batches: Vec<Batch>,
        position: i64,
        list: &[AbortedTransaction],
        isolation: IsolationLevel,
        expected: (&[i64], Option<i64>, usize),
    ) {
        let r = readable(batches, position, list, isolation);
        let len = r.items.len();
        let offsets: Vec<i64> = r.items.into_items().map(|i| i.offset()).collect();
        assert_eq!(len, offsets.len(), "the count of items says how many there are");
        assert_eq!((&offsets[..], r.next_offset, r.aborted), expected);
    }

    use IsolationLevel::{ReadCommitted as RC, ReadUncommitted as RU};

    #[test]
    fn aborted_transactions_are_left_out_under_read_committed() {
        // Producer 1 aborts [0,1], producer 2 commits [2,3] interleaved.
        let log = || {
            vec![
                data(0, 1, 1, true),
                data(2, 1, 2, true),
                marker(4, 1, Marker::Abort),
                marker(5, 2, Marker::Commit),
                data(6, 0, 3, false),
            ]
        };
        let list = [aborted(1, 0)];
        check(log(), 0, &list, RC, (&[2, 3, 6], Some(7), 2));
        check(log(), 0, &list, RU, (&[0, 1, 2, 3, 6], Some(7), 0));
        // The same producer's next transaction, committed after its abort, is read.
        let later =
            vec![data(0, 0, 1, true), marker(1, 1, Marker::Abort), data(2, 0, 1, true), marker(3, 1, Marker::Commit)];
        check(later, 0, &list, RC, (&[2], Some(4), 1));
        // An aborted transaction that began before the fetch's position.
        check(vec![data(5, 0, 1, true), marker(6, 1, Marker::Abort)], 5, &[aborted(1, 2)], RC, (&[], Some(7), 1));
        // Non-transactional batches of that producer id are never aborted.
        check(vec![data(0, 0, 1, false)], 0, &list, RC, (&[0], Some(1), 0));
        // An abort listed for later offsets leaves earlier batches alone.
        check(vec![data(0, 0, 1, true), data(1, 0, 1, true)], 0, &[aborted(1, 1)], RC, (&[0], Some(2), 1));
    }

    #[test]
    fn control_batches_and_gaps_move_the_position() {
        // Only a marker: nothing to read, the position moves past it.
        check(vec![marker(9, 1, Marker::Commit)], 9, &[], RC, (&[], Some(10), 0));
        // A compacted gap: the batch ends past its last record.
        let mut compacted = data(10, 0, -1, false);
        if let Batch::Data { header, .. } = &mut compacted {
            header.last_offset_delta = 4;
        }
        check(vec![compacted], 10, &[], RC, (&[10], Some(15), 0));
        // A batch that began before the position: its earlier records are not read again.
        check(vec![data(0, 4, -1, false)], 3, &[], RU, (&[3, 4], Some(5), 0));
        // Nothing whole came.
        check(vec![], 3, &[], RC, (&[], None, 0));
    }

    #[test]
    fn undecodable_batches_are_handed_on_in_order() {
        let broken =
            Batch::Undecodable { header: header(2, 2, -1, false), raw: Bytes::from_static(b"x"), problem: "p".into() };
        check(vec![data(0, 1, -1, false), broken, data(5, 0, -1, false)], 0, &[], RC, (&[0, 1, 2, 5], Some(6), 0));
    }
}
