//! What operators do with a dead-letter topic: look at it, replay records
//! into the ladder, or acknowledge them without replaying. Both decisions
//! advance the operators' group (`<group>.dlq-operators`), so repeating a
//! request never replays a record twice, and the backlog gauge follows.

use std::{collections::BTreeMap, sync::Arc};

use bytes::Bytes;
use retry_core::{Headers, ReplayTarget, RetryHeaders, RetryPolicy, Timestamp};
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use tokio::sync::Mutex;

use crate::{
    cluster::{deadline, Cluster},
    protocol::fallback::Fetched,
    protocol::group::GroupClient,
    publisher::Outgoing,
    publisher::Publisher,
    ConnectionConfig, Result,
};

/// One partition of the dead-letter topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionStatus {
    /// The partition.
    pub partition: i32,
    /// The oldest offset retention keeps.
    pub earliest: i64,
    /// The next offset to be written.
    pub end: i64,
    /// The operators' group position: records before it were replayed or acknowledged.
    pub acknowledged: Option<i64>,
    /// Records neither replayed nor acknowledged.
    pub backlog: i64,
}

/// The dead-letter topic at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterStatus {
    /// Its name.
    pub topic: String,
    /// Each partition.
    pub partitions: Vec<PartitionStatus>,
    /// The sum of the partitions' backlogs.
    pub backlog: i64,
}

/// A dead-lettered record.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Its partition in the dead-letter topic.
    pub partition: i32,
    /// Its offset there.
    pub offset: i64,
    /// Its key.
    pub key: Option<Bytes>,
    /// Its value.
    pub value: Option<Bytes>,
    /// When it was dead-lettered.
    pub timestamp: Option<Timestamp>,
    /// All its headers.
    pub headers: Headers,
}

impl DeadLetter {
    /// Its retry headers, decoded (an error for a record someone else wrote).
    pub fn retry_headers(&self) -> retry_core::Result<RetryHeaders> {
        RetryHeaders::decode(&self.headers)
    }
}

/// Which records to replay, and where.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    /// The source topic or the first retry topic.
    pub target: ReplayTarget,
    /// Report what would be replayed, change nothing.
    pub dry_run: bool,
    /// Replay at most this many records.
    pub limit: Option<usize>,
    /// Only this partition of the dead-letter topic.
    pub partition: Option<i32>,
    /// Only these offsets.
    pub offsets: Option<Vec<i64>>,
    /// Only records with these keys.
    pub keys: Option<Vec<Bytes>>,
    /// The loop guard: refuse records replayed this many times already
    /// (`None` lifts the guard, explicitly).
    pub max_replays: Option<u32>,
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayReport {
    /// Where the records went.
    pub target: String,
    /// How many records were (or, in a dry run, would be) replayed.
    pub replayed: usize,
    /// Records refused, as (partition, offset, why).
    pub skipped: Vec<(i32, i64, String)>,
    /// The offsets examined, per partition: from the operators' position up
    /// to the end offsets captured when the request started (exclusive).
    pub covered: Vec<(i32, i64, i64)>,
    /// Whether nothing was changed.
    pub dry_run: bool,
}

/// Operations on one ladder's dead-letter topic.
pub struct DeadLetterAdmin {
    cluster: Arc<Cluster>,
    policy: RetryPolicy,
    operators: Mutex<GroupClient>,
    publisher: Publisher,
}

/// The most bytes read per fetch while browsing or replaying.
const FETCH_BYTES: i32 = 1 << 20;

impl DeadLetterAdmin {
    /// Connects to the cluster for `policy`'s dead-letter topic, with the
    /// operators' group `operators_group`.
    pub async fn connect(connection: ConnectionConfig, policy: RetryPolicy, operators_group: &str) -> Result<Self> {
        let cluster = Arc::new(Cluster::connect(&connection).await?);
        Ok(Self::with_cluster(cluster, connection, policy, operators_group))
    }

    /// The same on a client the caller already has (the listener's).
    pub(crate) fn with_cluster(
        cluster: Arc<Cluster>,
        connection: ConnectionConfig,
        policy: RetryPolicy,
        operators_group: &str,
    ) -> Self {
        DeadLetterAdmin {
            publisher: Publisher::new(
                cluster.clone(),
                crate::consumer::listener::DEFAULT_MAX_REQUEST_BYTES,
                Default::default(),
            ),
            operators: Mutex::new(GroupClient::new(connection, operators_group)),
            cluster,
            policy,
        }
    }

    fn topic(&self) -> &str {
        self.policy.topology().dead_letter_topic().as_str()
    }

    async fn partition(&self, partition: i32) -> Result<PartitionClient> {
        self.cluster.partition_client(self.topic(), partition, UnknownTopicHandling::Error).await
    }

    /// Every partition's offsets and backlog.
    pub async fn status(&self) -> Result<DeadLetterStatus> {
        let topic = self.topic().to_owned();
        let topics = self.cluster.list_topics().await?;
        let mut partitions: Vec<i32> = topics
            .into_iter()
            .find(|t| t.name == topic)
            .map(|t| t.partitions.into_iter().collect())
            .unwrap_or_default();
        partitions.sort_unstable();
        let tps: Vec<(String, i32)> = partitions.iter().map(|p| (topic.clone(), *p)).collect();
        let acknowledged = self.operators.lock().await.committed(&tps).await?;
        let mut out = Vec::new();
        for p in partitions {
            let pc = self.partition(p).await?;
            let offset = |at| {
                let pc = &pc;
                let topic = &topic;
                async move { self.offsets(pc, at, topic).await }
            };
            let (earliest, end) = (offset(OffsetAt::Earliest).await?, offset(OffsetAt::Latest).await?);
            let acked = acknowledged.get(&(topic.clone(), p)).copied().flatten();
            let backlog = (end - acked.unwrap_or(earliest).max(earliest)).max(0);
            out.push(PartitionStatus { partition: p, earliest, end, acknowledged: acked, backlog });
        }
        let backlog = out.iter().map(|p| p.backlog).sum();
        Ok(DeadLetterStatus { topic, partitions: out, backlog })
    }

    /// The partition's earliest or latest offset, within the request timeout.
    async fn offsets(&self, pc: &PartitionClient, at: OffsetAt, topic: &str) -> Result<i64> {
        let what = || format!("offsets of {topic}/{}", pc.partition());
        deadline(self.cluster.request_timeout(), what, pc.get_offset(at)).await
    }

    /// Up to `limit` records of `partition` from offset `from`, before `end`.
    async fn read(&self, pc: &PartitionClient, from: i64, end: i64, limit: usize) -> Result<Vec<DeadLetter>> {
        let mut out = Vec::new();
        let mut offset = from;
        while offset < end && out.len() < limit {
            let what = || format!("reading {}/{}", self.topic(), pc.partition());
            let (records, _) =
                deadline(self.cluster.request_timeout(), what, pc.fetch_records(offset, 1..FETCH_BYTES, 0)).await?;
            let before = out.len();
            for r in records.into_iter().map(Fetched::from) {
                if r.offset < offset || r.offset >= end || out.len() >= limit {
                    continue;
                }
                offset = r.offset + 1;
                out.push(DeadLetter {
                    partition: pc.partition(),
                    offset: r.offset,
                    key: r.key,
                    value: r.value,
                    timestamp: r.timestamp,
                    headers: r.headers,
                });
            }
            if out.len() == before {
                break; // nothing more below `end` (compacted or deleted offsets)
            }
        }
        Ok(out)
    }

    /// Up to `limit` records of `partition` from offset `from` on.
    pub async fn browse(&self, partition: i32, from: i64, limit: usize) -> Result<Vec<DeadLetter>> {
        let pc = self.partition(partition).await?;
        let end = self.offsets(&pc, OffsetAt::Latest, self.topic()).await?;
        let earliest = self.offsets(&pc, OffsetAt::Earliest, self.topic()).await?;
        self.read(&pc, from.max(earliest), end, limit).await
    }

    /// Acknowledges every record of `partition` up to `up_to_offset`
    /// (inclusive) without replaying it: they stay in the topic, for audit,
    /// and leave the backlog. Never moves the operators' position back.
    pub async fn acknowledge(&self, partition: i32, up_to_offset: i64) -> Result<i64> {
        let topic = self.topic().to_owned();
        let mut operators = self.operators.lock().await;
        let current = operators.committed(&[(topic.clone(), partition)]).await?;
        let current = current.get(&(topic.clone(), partition)).copied().flatten().unwrap_or(0);
        let next = current.max(up_to_offset + 1);
        operators.commit(-1, "", &BTreeMap::from([((topic, partition), next)])).await?;
        Ok(next)
    }

    /// Replays what `request` selects, from the operators' position up to the
    /// end offsets captured now: records dead-lettered meanwhile wait for the
    /// next request, so a replay always ends. The operators' position
    /// advances over the longest run of records replayed from its start.
    pub async fn replay(&self, request: &ReplayRequest) -> Result<ReplayReport> {
        let status = self.status().await?;
        let target = self.policy.replay_topic(request.target).to_string();
        let now = Timestamp::from(std::time::SystemTime::now());
        let mut report = ReplayReport {
            target: target.clone(),
            replayed: 0,
            skipped: Vec::new(),
            covered: Vec::new(),
            dry_run: request.dry_run,
        };
        let mut commits = BTreeMap::new();
        let mut outbox = Vec::new();
        for p in status.partitions.iter().filter(|p| request.partition.is_none_or(|only| only == p.partition)) {
            let start = p.acknowledged.unwrap_or(p.earliest).max(p.earliest);
            report.covered.push((p.partition, start, p.end));
            let pc = self.partition(p.partition).await?;
            let mut contiguous = true;
            let mut position = start;
            for record in self.read(&pc, start, p.end, usize::MAX).await? {
                let limit_reached = request.limit.is_some_and(|l| report.replayed >= l);
                let selected = request.offsets.as_ref().is_none_or(|o| o.contains(&record.offset))
                    && request.keys.as_ref().is_none_or(|keys| record.key.as_ref().is_some_and(|k| keys.contains(k)));
                if limit_reached || !selected {
                    contiguous = false;
                    continue;
                }
                match self.policy.replay_headers(&record.headers, request.target, now, request.max_replays) {
                    Ok(headers) => {
                        report.replayed += 1;
                        let source_partition =
                            record.retry_headers().map(|h| h.original_partition).unwrap_or(record.partition);
                        outbox.push(Outgoing {
                            topic: target.clone(),
                            source_partition,
                            key: record.key,
                            value: record.value,
                            headers,
                            timestamp: now,
                        });
                        if contiguous {
                            position = record.offset + 1;
                        }
                    }
                    Err(refused) => {
                        contiguous = false;
                        report.skipped.push((record.partition, record.offset, refused.to_string()));
                    }
                }
            }
            if position > start {
                commits.insert((self.topic().to_owned(), p.partition), position);
            }
        }
        if request.dry_run {
            return Ok(report);
        }
        // Publish first: only what the broker acknowledged may be marked done.
        self.publisher.publish_all(&mut outbox).await?;
        if !commits.is_empty() {
            self.operators.lock().await.commit(-1, "", &commits).await?;
        }
        Ok(report)
    }
}
