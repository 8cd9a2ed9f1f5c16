//! Republishing records to retry and dead-letter topics, acknowledged by
//! all in-sync replicas (rskafka produces with acks=all).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use chrono::{TimeZone, Utc};
use retry_core::{Headers, Timestamp};
use rskafka::{
    client::{
        partition::{Compression, PartitionClient, UnknownTopicHandling},
        Client,
    },
    record::Record,
};

use tokio::task::JoinSet;

use crate::{Error, Result};

/// Publishes to any topic-partition, caching one rskafka client per target.
pub(crate) struct Publisher {
    client: Arc<Client>,
    partitions: Mutex<HashMap<(String, i32), Arc<PartitionClient>>>,
    partition_counts: Mutex<HashMap<String, i32>>,
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
    pub(crate) fn new(client: Arc<Client>) -> Self {
        Publisher { client, partitions: Mutex::default(), partition_counts: Mutex::default() }
    }

    /// Publishes every record of `outbox`, in order per target partition,
    /// one produce request per target partition, all concurrently; returns
    /// once the broker acknowledged them (acks=all). Records acknowledged are
    /// removed from `outbox`; on error the rest stay, for a later try, and
    /// the first error is returned.
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
            requests.spawn(async move {
                let batch = records.iter().map(to_rskafka).collect();
                let result = client
                    .produce(batch, Compression::NoCompression)
                    .await
                    .map_err(|source| Error::Client { what: format!("publishing to {topic}/{partition}"), source });
                (result, records)
            });
        }
        while let Some(joined) = requests.join_next().await {
            let (result, records) = joined.expect("produce tasks do not panic");
            if let Err(e) = result {
                first_error.get_or_insert(e);
                outbox.extend(records);
            }
        }
        match first_error {
            Some(e) => {
                // A leader may have moved: rskafka's cached view must not
                // send the next try to the same wrong broker.
                crate::listener::refresh_metadata(&self.client, Duration::from_secs(5)).await;
                Err(e)
            }
            None => Ok(()),
        }
    }

    async fn partition_count(&self, topic: &str) -> Result<i32> {
        if let Some(n) = self.partition_counts.lock().expect("not poisoned").get(topic) {
            return Ok(*n);
        }
        let topics = self
            .client
            .list_topics()
            .await
            .map_err(|source| Error::Client { what: "listing topics".into(), source })?;
        let mut counts = self.partition_counts.lock().expect("not poisoned");
        for t in topics {
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
        let client = self
            .client
            .partition_client(topic, partition, UnknownTopicHandling::Error)
            .await
            .map_err(|source| Error::Client { what: format!("connecting to {topic}/{partition}"), source })?;
        let client = Arc::new(client);
        self.partitions.lock().expect("not poisoned").insert(key, client.clone());
        Ok(client)
    }
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

    #[test]
    fn partition_choice() {
        assert_eq!(choose_partition(2, Some(b"k"), 3), 2, "same partition when it exists");
        assert_eq!(choose_partition(5, None, 3), 2);
        let p = choose_partition(5, Some(b"foobar"), 3);
        assert_eq!(p, (-790332482i32 & 0x7fff_ffff) % 3);
    }
}
