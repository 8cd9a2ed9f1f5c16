//! Reading any partition as it is written, for tools and checks: every
//! codec, headers in order with repeated names, null values and names that
//! are not UTF-8, transaction markers passed over.

use bytes::Bytes;
use retry_core::Timestamp;

use crate::{
    protocol::fetch::{FetchError, Item, PartitionReader},
    ConnectionConfig, Error, IsolationLevel, Result,
};

/// A record as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenRecord {
    /// Its offset.
    pub offset: i64,
    /// Its key.
    pub key: Option<Bytes>,
    /// Its value.
    pub value: Option<Bytes>,
    /// Every header in order: its name as bytes, its value (`None`: null).
    pub headers: Vec<(Bytes, Option<Bytes>)>,
    /// Its timestamp, if it has one.
    pub timestamp: Option<Timestamp>,
}

impl WrittenRecord {
    /// The last value of header `name` (`Some(None)`: a null value).
    pub fn header(&self, name: &str) -> Option<Option<&[u8]>> {
        self.headers.iter().rev().find(|(n, _)| n == name.as_bytes()).map(|(_, v)| v.as_deref())
    }
}

/// Every record of `topic`/`partition` from `from` up to its end (its high
/// watermark when the reading began), records of aborted transactions
/// included (`read_uncommitted`). Fails on a batch it cannot decode,
/// naming it.
pub async fn read_partition(
    connection: &ConnectionConfig,
    topic: &str,
    partition: i32,
    from: i64,
) -> Result<Vec<WrittenRecord>> {
    const MAX_BYTES: i32 = 8 << 20;
    let mut reader = PartitionReader::new(connection, topic, partition, IsolationLevel::ReadUncommitted, 256 << 20);
    let mut out = Vec::new();
    let mut position = from;
    let mut end = None;
    loop {
        let fetched = reader.fetch(position, MAX_BYTES, std::time::Duration::ZERO).await.map_err(|e| match e {
            FetchError::OutOfRange => Error::Broker {
                api: "Fetch",
                context: Some(format!("{topic}/{partition}@{position}")),
                error: crate::BrokerError::OFFSET_OUT_OF_RANGE,
            },
            FetchError::NoAnswer(e) | FetchError::Failed(e) => e,
        })?;
        let end = *end.get_or_insert(fetched.end);
        for item in fetched.readable.items.into_items() {
            match item {
                Item::Record(r) if r.offset < end => out.push(WrittenRecord {
                    offset: r.offset,
                    key: r.key,
                    value: r.value,
                    headers: r.headers.into_iter().map(|h| (h.name, h.value)).collect(),
                    timestamp: (r.timestamp >= 0).then(|| Timestamp::from_millis(r.timestamp)),
                }),
                Item::Record(_) => {}
                Item::Undecodable { header, problem, .. } => {
                    return Err(Error::Protocol {
                        addr: connection.bootstrap.join(","),
                        api: "Fetch",
                        reason: format!(
                            "the batch at {topic}/{partition}, offsets {} to {}, cannot be decoded: {problem}",
                            header.base_offset,
                            header.last_offset()
                        ),
                    })
                }
            }
        }
        match fetched.readable.next_offset {
            Some(next) if next > position && next < end => position = next,
            _ => return Ok(out),
        }
    }
}
