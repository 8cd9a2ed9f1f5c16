//! What operators do with a dead-letter topic: look at it, replay records
//! into the ladder, or acknowledge them without replaying. Both decisions
//! advance the operators' group (`<group>.dlq-operators`), so repeating a
//! request never replays a record twice, and the backlog gauge follows.

use crate::telemetry::{Spans, Tracing};
use retry_core::trace::TraceContext;
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use bytes::Bytes;
use retry_core::{
    groups::LadderGroups, operators::OperatorsPosition, operators::ReplaySelection, pause::ListenerPause,
    replay::ReplayGuards, replay::ReplayTarget, Headers, RetryHeaders, RetryPolicy, Timestamp,
};
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use tokio::sync::Mutex;

use crate::{
    admin::{
        lag::{LagReader, TopicLag},
        pause::PauseRecord,
        replay_lock::ReplayLock,
    },
    connection::cluster::{deadline, Cluster},
    protocol::{
        batch::{Codec, RawHeader},
        fetch::{FetchError, Item, PartitionReader},
        group::GroupClient,
    },
    publisher::{republished_headers, Outgoing, Publisher},
    ConnectionConfig, Error, Result, TopicPartition,
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
    /// The operators' group position: records before it were replayed or
    /// acknowledged (`None` before the first commit).
    pub acknowledged: Option<i64>,
    /// Records after that position replayed or acknowledged out of order.
    pub handled_above: usize,
    /// Records neither replayed nor acknowledged.
    pub backlog: i64,
    /// Records retention deleted before operators replayed or acknowledged
    /// them: between the operators' position and the oldest offset kept.
    /// Lost to the backlog; an acknowledgement up to the oldest offset kept
    /// says an operator knows.
    pub lost_to_retention: i64,
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
    /// The sum of the partitions' records lost to retention.
    pub lost_to_retention: i64,
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

/// A record of the dead-letter topic as fetched.
struct Read {
    partition: i32,
    offset: i64,
    key: Option<Bytes>,
    value: Option<Bytes>,
    timestamp: Option<Timestamp>,
    /// The headers with a value, names not UTF-8 shown with replacement characters.
    headers: Headers,
    /// Every header as written.
    raw_headers: Vec<RawHeader>,
    /// Set for a batch that cannot be read: why (its bytes are the value).
    undecodable: Option<String>,
}

impl Read {
    fn of(item: Item, partition: i32) -> Read {
        match item {
            Item::Record(r) => {
                let headers = match r.valued_headers() {
                    Ok((headers, _)) => headers,
                    Err(_) => r
                        .headers
                        .iter()
                        .filter_map(|h| {
                            Some((String::from_utf8_lossy(&h.name).into_owned(), h.value.as_ref()?.to_vec()))
                        })
                        .collect(),
                };
                Read {
                    partition,
                    offset: r.offset,
                    key: r.key,
                    value: r.value,
                    timestamp: (r.timestamp >= 0).then(|| Timestamp::from_millis(r.timestamp)),
                    headers,
                    raw_headers: r.headers,
                    undecodable: None,
                }
            }
            Item::Undecodable { header, raw, problem } => {
                let problem = format!("offsets {} to {}: {problem}", header.base_offset, header.last_offset());
                let mut headers = Headers::new();
                headers.insert(retry_core::header_names::ERROR, problem.clone());
                Read {
                    partition,
                    offset: header.base_offset,
                    key: None,
                    value: Some(raw),
                    timestamp: None,
                    headers,
                    raw_headers: Vec::new(),
                    undecodable: Some(problem),
                }
            }
        }
    }

    fn into_dead_letter(self) -> DeadLetter {
        DeadLetter {
            partition: self.partition,
            offset: self.offset,
            key: self.key,
            value: self.value,
            timestamp: self.timestamp,
            headers: self.headers,
        }
    }
}

/// What [`DeadLetterAdmin::browse_page`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrowsePage {
    /// One partition, or every partition from the operators' position.
    pub partition: Option<i32>,
    /// With a partition, the first offset (the oldest kept record by default).
    pub from: Option<i64>,
    /// In each partition read, only records written at or after this time:
    /// from the broker's offset for the time (or `from` and the operators'
    /// position, when they come later), passing over earlier ones (brokers
    /// that answer the offset for a time loosely, tansu for one, and
    /// timestamps out of order).
    pub since: Option<Timestamp>,
    /// The most records.
    pub limit: usize,
    /// The most bytes of keys, values and headers (at least one record).
    pub max_bytes: usize,
}

impl DeadLetter {
    /// Its key, value and headers' size in bytes.
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Bytes::len)
            + self.value.as_ref().map_or(0, Bytes::len)
            + self.headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
    }

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
    /// Which records: a partition, offsets, keys, a limit.
    pub selection: ReplaySelection,
    /// The loop guard and the idempotency window.
    pub guards: ReplayGuards,
}

/// A record a replay refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedRecord {
    /// Its partition in the dead-letter topic.
    pub partition: i32,
    /// Its offset there.
    pub offset: i64,
    /// Why it was not replayed.
    pub reason: String,
}

/// What a replay did on one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionReplay {
    /// The partition.
    pub partition: i32,
    /// The operators' position when the replay started.
    pub from: i64,
    /// The end offset captured when the replay started: records
    /// dead-lettered later wait for the next replay.
    pub to: i64,
    /// Records replayed (or, in a dry run, that would be).
    pub replayed: usize,
    /// The operators' position when the replay ended.
    pub position: i64,
    /// Why the replay of this partition stopped early: what was replayed
    /// before is committed, a repeat goes on from there.
    pub error: Option<String>,
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayReport {
    /// Where the records went.
    pub target: String,
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// How many records were (or, in a dry run, would be) replayed.
    pub replayed: usize,
    /// How many records were refused.
    pub skipped_total: usize,
    /// The first [`MAX_SKIPPED_SHOWN`] of them, with the reason.
    pub skipped: Vec<SkippedRecord>,
    /// Each partition visited, in order.
    pub partitions: Vec<PartitionReplay>,
}

impl ReplayReport {
    /// Whether some partition stopped early on an error.
    pub fn failed(&self) -> bool {
        self.partitions.iter().any(|p| p.error.is_some())
    }

    fn skip(&mut self, partition: i32, offset: i64, reason: String) {
        self.skipped_total += 1;
        if self.skipped.len() < MAX_SKIPPED_SHOWN {
            self.skipped.push(SkippedRecord { partition, offset, reason });
        }
    }
}

/// How many refused records a [`ReplayReport`] lists (it counts them all).
pub const MAX_SKIPPED_SHOWN: usize = 100;

/// Operations on one ladder's dead-letter topic.
pub struct DeadLetterAdmin {
    cluster: Arc<Cluster>,
    connection: ConnectionConfig,
    policy: RetryPolicy,
    operators: Mutex<GroupClient>,
    /// The group whose leader holds the replay lock: apart from the
    /// operators' group, whose offsets every instance commits
    /// (acknowledgements included) without being a member.
    lock_group: String,
    publisher: Arc<Publisher>,
    /// The replay lock while this instance replays: commits go through its generation.
    lock: std::sync::Mutex<Option<Arc<ReplayLock>>>,
    /// This instance's name in the operators' group, for the others' refusals.
    instance: String,
    page_bytes: i32,
    /// Where the spans of replays go (nowhere unless asked).
    spans: Spans,
    /// Whether the broker keeps offset-commit metadata, where records
    /// handled out of order are recorded; learnt when first needed.
    keeps_metadata: tokio::sync::OnceCell<bool>,
    /// Each partition's client (offsets) and reader (fetches), kept: one
    /// connection to its leader for every poll of the backlog and every
    /// operators' request, not a handshake each (both find a moved leader
    /// again themselves).
    partition_clients: Mutex<BTreeMap<i32, Arc<PartitionClient>>>,
    readers: Mutex<BTreeMap<i32, Arc<Mutex<PartitionReader>>>>,
    /// The operators' pause of the ladder's listener.
    pause: PauseRecord,
    lag: LagReader,
}

/// The most bytes read per fetch while browsing or replaying.
const FETCH_BYTES: i32 = 1 << 20;

/// How often a replay tries a page's read, publish or commit before the
/// partition stops with the error, and the pauses between tries: a busy or
/// restarting broker is waited out, a refusal is not.
const PATIENCE_TRIES: usize = 6;
const PATIENCE_FIRST: std::time::Duration = std::time::Duration::from_millis(200);
const PATIENCE_LONGEST: std::time::Duration = std::time::Duration::from_secs(5);

/// How a replay step (reading a page, publishing it, committing it) is
/// tried again: up to [`PATIENCE_TRIES`] times, with backoff, while its
/// error may pass by itself ([`Error::passes`]). The one retry shell of a
/// replay.
struct Patience {
    what: &'static str,
    partition: Option<i32>,
    tries: usize,
    pauses: crate::backoff::Pauses,
}

impl Patience {
    fn new(what: &'static str, partition: Option<i32>) -> Patience {
        Patience { what, partition, tries: 1, pauses: crate::backoff::pauses(PATIENCE_FIRST, PATIENCE_LONGEST) }
    }

    /// After a try failed with `e`: pauses and answers true when the step
    /// is to be tried again, false when it gives up with `e`.
    async fn again(&mut self, e: &Error) -> bool {
        if self.tries >= PATIENCE_TRIES || !e.passes() {
            return false;
        }
        self.tries += 1;
        tracing::warn!(partition = ?self.partition, error = %e, "replay: {} failed, trying again", self.what);
        tokio::time::sleep(self.pauses.next()).await;
        true
    }
}

/// The largest page a replay grows to when the broker answers a smaller one
/// with nothing (a record larger than the page).
const MAX_PAGE_BYTES: i32 = 64 << 20;

/// What a replay does with one record of a page.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    /// Nothing: outside the page or the selection, handled already, or
    /// past the replay's limit.
    Passed,
    /// Not replayed, for this reason (the report lists it).
    Skipped(String),
    /// Replayed, with these headers of ours.
    Replayed(retry_core::Headers),
}

/// How one page of a partition's replay is judged: everything but the
/// records (pure; the replay reads, publishes and commits around it).
struct PagePlan<'a> {
    /// The first offset the page reads.
    from: i64,
    /// The end offset captured when the replay started.
    end: i64,
    /// Records replayed before this page (the selection's limit counts them).
    replayed_before: usize,
    selection: &'a retry_core::operators::ReplaySelection,
    policy: &'a RetryPolicy,
    target: retry_core::replay::ReplayTarget,
    guards: retry_core::replay::ReplayGuards,
    now: Timestamp,
    /// Whether the broker keeps commit metadata, where records handled out
    /// of order are recorded.
    keeps_metadata: bool,
}

/// A page judged: a verdict per record, the operators' position with the
/// replayed records handled, and where the next page starts.
struct PlannedPage {
    verdicts: Vec<Verdict>,
    page: OperatorsPosition,
    /// The offset after the last record read (`from` when none was).
    read_to: i64,
    /// Whether a record is replayed out of order (its metadata must be kept).
    out_of_order: bool,
}

impl PagePlan<'_> {
    fn plan(&self, records: &[Read], mut page: OperatorsPosition) -> PlannedPage {
        let mut verdicts = Vec::with_capacity(records.len());
        let (mut read_to, mut replayed, mut out_of_order, mut done) = (self.from, self.replayed_before, false, false);
        for r in records {
            let verdict = if done || r.offset < self.from || r.offset >= self.end {
                Verdict::Passed
            } else if self.selection.limit_reached(replayed) {
                done = true;
                Verdict::Passed
            } else {
                read_to = r.offset + 1;
                self.judge(r, &mut page, &mut out_of_order)
            };
            if matches!(verdict, Verdict::Replayed(_)) {
                replayed += 1;
            }
            verdicts.push(verdict);
        }
        PlannedPage { verdicts, page, read_to, out_of_order }
    }

    /// The verdict on one record read within the page.
    fn judge(&self, r: &Read, page: &mut OperatorsPosition, out_of_order: &mut bool) -> Verdict {
        if page.is_handled(r.offset) || !self.selection.selects(r.offset, r.key.as_deref()) {
            return Verdict::Passed;
        }
        if let Some(problem) = &r.undecodable {
            return Verdict::Skipped(format!("cannot be replayed: {problem}"));
        }
        let headers = match self.policy.replay_headers(&r.headers, self.target, self.now, self.guards) {
            Ok(headers) => headers,
            Err(refused) => return Verdict::Skipped(refused.to_string()),
        };
        if r.offset != page.next() {
            *out_of_order = true;
            if !self.keeps_metadata {
                return Verdict::Skipped(NO_METADATA.to_owned());
            }
        }
        match page.handle(r.offset) {
            Ok(()) => Verdict::Replayed(headers),
            Err(full) => Verdict::Skipped(full.to_string()),
        }
    }
}

impl DeadLetterAdmin {
    /// Connects to the cluster for `policy`'s dead-letter topic, with the
    /// operators' and replay-lock groups of `groups`.
    pub async fn connect(connection: ConnectionConfig, policy: RetryPolicy, groups: &LadderGroups) -> Result<Self> {
        let cluster = Arc::new(Cluster::connect(&connection).await?);
        Ok(Self::with_cluster(cluster, connection, policy, groups))
    }

    /// The same on a client the caller already has (the listener's).
    pub(crate) fn with_cluster(
        cluster: Arc<Cluster>,
        connection: ConnectionConfig,
        policy: RetryPolicy,
        groups: &LadderGroups,
    ) -> Self {
        DeadLetterAdmin {
            publisher: Arc::new(Publisher::new(
                cluster.clone(),
                &connection,
                crate::protocol::produce::DEFAULT_MAX_REQUEST_BYTES,
                Default::default(),
            )),
            operators: Mutex::new(GroupClient::new(connection.clone(), groups.operators()).for_tools()),
            pause: PauseRecord::new(connection.clone(), groups, policy.topology()),
            lag: LagReader::new(cluster.clone(), connection.clone(), policy.topology(), groups),
            lock_group: groups.replay_lock().to_owned(),
            connection,
            cluster,
            policy,
            lock: std::sync::Mutex::new(None),
            instance: instance_name(),
            page_bytes: FETCH_BYTES,
            spans: Spans::new(Tracing::Off),
            keeps_metadata: tokio::sync::OnceCell::new(),
            partition_clients: Mutex::default(),
            readers: Mutex::default(),
        }
    }

    /// Whether the broker keeps what a commit's metadata says: commits the
    /// current position again, with its (never empty) metadata, and reads it
    /// back. tansu 0.6, for one, answers every commit's metadata empty.
    async fn keeps_metadata(&self, operators: &mut GroupClient, partition: i32, earliest: i64) -> Result<bool> {
        if let Some(kept) = self.keeps_metadata.get() {
            return Ok(*kept);
        }
        let current = self.position(operators, partition, earliest).await?;
        self.commit_position(operators, partition, earliest, &current).await?;
        let tp = TopicPartition::new(self.topic(), partition);
        let read = operators.committed_with_metadata(std::slice::from_ref(&tp)).await?;
        let kept = read.get(&tp).and_then(|(_, metadata)| metadata.as_deref()).is_some_and(|m| !m.is_empty());
        if !kept {
            tracing::warn!(
                group = operators.group_id(),
                "the broker drops offset-commit metadata: records cannot be replayed or acknowledged out of order"
            );
        }
        Ok(*self.keeps_metadata.get_or_init(|| async { kept }).await)
    }

    /// Reads pages of at most `bytes` (1 MiB by default) while replaying:
    /// what a replay holds in memory at once.
    pub fn with_page_bytes(mut self, bytes: usize) -> Self {
        self.page_bytes = i32::try_from(bytes).unwrap_or(i32::MAX).max(1);
        self
    }

    /// Records each replayed record as a span through OpenTelemetry's
    /// global tracer provider (a child of the dead letter's last attempt),
    /// and has the replayed record carry its context.
    pub fn with_tracing(mut self, tracing: Tracing) -> Self {
        self.spans = Spans::new(tracing);
        self
    }

    fn held_lock(&self) -> Option<Arc<ReplayLock>> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn topic(&self) -> &str {
        self.policy.topology().dead_letter_topic().as_str()
    }

    /// Pauses the ladder's listener on every instance until `pause.until`:
    /// each instance reads it within its `pause_poll_interval`, and its
    /// records wait, keeping their place (see [`retry_core::pause`]).
    pub async fn pause_listener(&self, pause: &ListenerPause) -> Result<()> {
        self.pause.write(Some(pause)).await
    }

    /// Ends the listener's pause on every instance, if there is one.
    pub async fn resume_listener(&self) -> Result<()> {
        self.pause.write(None).await
    }

    /// The lag of every group of the ladder: the source's and each rung's,
    /// in that order.
    pub async fn lag(&self) -> Result<Vec<TopicLag>> {
        self.lag.read().await
    }

    /// The listener's pause as committed last (it may have ended: see
    /// [`ListenerPause::holds_at`]); `None` when none was, or a resume.
    pub async fn listener_pause(&self) -> Result<Option<ListenerPause>> {
        self.pause.read().await
    }

    async fn partition(&self, partition: i32) -> Result<Arc<PartitionClient>> {
        let mut clients = self.partition_clients.lock().await;
        if let Some(client) = clients.get(&partition) {
            return Ok(client.clone());
        }
        let client =
            Arc::new(self.cluster.partition_client(self.topic(), partition, UnknownTopicHandling::Error).await?);
        clients.insert(partition, client.clone());
        Ok(client)
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
        let tps: Vec<TopicPartition> = partitions.iter().map(|p| TopicPartition::new(topic.clone(), *p)).collect();
        let committed = self.operators.lock().await.committed_with_metadata(&tps).await?;
        let mut out = Vec::new();
        for p in partitions {
            let pc = self.partition(p).await?;
            let offset = |at| {
                let pc = &pc;
                let topic = &topic;
                async move { self.offsets(pc, at, topic).await }
            };
            let (earliest, end) = (offset(OffsetAt::Earliest).await?, offset(OffsetAt::Latest).await?);
            let (offset, metadata) = committed.get(&TopicPartition::new(topic.clone(), p)).cloned().unwrap_or_default();
            let position = OperatorsPosition::new(offset, metadata.as_deref(), earliest);
            let backlog = (end - position.next()).max(0) - position.handled_above(end) as i64;
            // The position as committed, not raised to what retention keeps:
            // what lies between was never replayed nor acknowledged.
            let unraised = OperatorsPosition::new(offset, metadata.as_deref(), 0);
            let lost = (earliest.min(end) - unraised.next()).max(0) - unraised.handled_above(earliest) as i64;
            out.push(PartitionStatus {
                partition: p,
                earliest,
                end,
                acknowledged: offset.map(|_| position.next()),
                handled_above: position.handled_above(end),
                backlog,
                lost_to_retention: lost.max(0),
            });
        }
        let backlog = out.iter().map(|p| p.backlog).sum();
        let lost_to_retention = out.iter().map(|p| p.lost_to_retention).sum();
        Ok(DeadLetterStatus { topic, partitions: out, backlog, lost_to_retention })
    }

    /// The partition's earliest or latest offset, within the request timeout.
    async fn offsets(&self, pc: &PartitionClient, at: OffsetAt, topic: &str) -> Result<i64> {
        let what = || format!("offsets of {topic}/{}", pc.partition());
        deadline(self.cluster.request_timeout(), what, pc.get_offset(at)).await
    }

    /// Up to `limit` records of `partition` from offset `from`, before
    /// `end`, and no more once they hold `max_bytes` (at least one record);
    /// records written before `since` are passed over.
    async fn read(
        &self,
        pc: &PartitionClient,
        from: i64,
        end: i64,
        limit: usize,
        max_bytes: usize,
        since: Option<Timestamp>,
    ) -> Result<Vec<DeadLetter>> {
        let mut out = Vec::new();
        let mut offset = from;
        let mut bytes = 0;
        while offset < end && out.len() < limit && bytes < max_bytes {
            let records = self.fetch(pc.partition(), offset, FETCH_BYTES).await?;
            let before = offset;
            for r in records {
                if r.offset < offset || r.offset >= end || out.len() >= limit || bytes >= max_bytes {
                    continue;
                }
                offset = r.offset + 1;
                let record = r.into_dead_letter();
                if since.is_some_and(|since| record.timestamp.is_some_and(|t| t < since)) {
                    continue;
                }
                bytes += record.size();
                out.push(record);
            }
            if offset == before {
                break; // nothing more below `end` (compacted or deleted offsets)
            }
        }
        Ok(out)
    }

    /// One fetch of `partition` from `from`, at most `max_bytes`: what it
    /// read, in order.
    async fn fetch(&self, partition: i32, from: i64, max_bytes: i32) -> Result<Vec<Read>> {
        let reader = {
            let mut readers = self.readers.lock().await;
            let reader = readers.entry(partition).or_insert_with(|| {
                Arc::new(Mutex::new(PartitionReader::new(
                    &self.connection,
                    self.topic(),
                    partition,
                    crate::IsolationLevel::ReadUncommitted,
                    MAX_PAGE_BYTES as usize * 4,
                )))
            });
            reader.clone()
        };
        let mut reader = reader.lock().await;
        let fetched = reader.fetch(from, max_bytes, std::time::Duration::ZERO).await.map_err(|e| match e {
            FetchError::OutOfRange => Error::Broker {
                api: "Fetch",
                context: Some(format!("{}/{partition}@{from}", self.topic())),
                error: crate::BrokerError::OFFSET_OUT_OF_RANGE,
            },
            FetchError::NoAnswer(e) | FetchError::Failed(e) => e,
        })?;
        Ok(fetched.readable.items.into_items().map(|item| Read::of(item, partition)).collect())
    }

    /// Where to read `pc`'s partition from for records written at or after
    /// `at`, no earlier than `from`: the broker's offset for the time, when
    /// the record before it is older than `at`; else `from` (the reader then
    /// passes over earlier records). The check is one small fetch: the mock
    /// cluster answers any time with the end, tansu loosely.
    async fn offset_at_time(&self, pc: &PartitionClient, at: Timestamp, from: i64, end: i64) -> Result<i64> {
        let Some(time) = chrono::DateTime::from_timestamp_millis(at.as_millis()) else {
            return Ok(from);
        };
        let what = || format!("the offset of {}/{} at a time", self.topic(), pc.partition());
        let offset = deadline(self.cluster.request_timeout(), what, pc.get_offset(OffsetAt::Timestamp(time))).await?;
        // Kafka answers -1 when no record is that recent.
        let offset = if offset < 0 { end } else { offset.min(end) };
        if offset <= from {
            return Ok(from);
        }
        let before = self.fetch(pc.partition(), offset - 1, 64 << 10).await?;
        let older = before
            .iter()
            .filter(|r| r.offset < offset)
            .max_by_key(|r| r.offset)
            .is_some_and(|r| r.timestamp.is_some_and(|t| t < at));
        Ok(if older { offset } else { from })
    }

    /// Up to `limit` records of `partition` from offset `from` on.
    pub async fn browse(&self, partition: i32, from: i64, limit: usize) -> Result<Vec<DeadLetter>> {
        let pc = self.partition(partition).await?;
        let end = self.offsets(&pc, OffsetAt::Latest, self.topic()).await?;
        let earliest = self.offsets(&pc, OffsetAt::Earliest, self.topic()).await?;
        self.read(&pc, from.max(earliest), end, limit, usize::MAX, None).await
    }

    /// One page of what `page` asks for: records of one partition from an
    /// offset, or of every partition from the operators' position (the
    /// backlog), partition after partition; at most `page.limit` records,
    /// and no more once they hold `page.max_bytes`.
    pub async fn browse_page(&self, page: &BrowsePage) -> Result<Vec<DeadLetter>> {
        let status = self.status().await?;
        let mut out: Vec<DeadLetter> = Vec::new();
        let mut bytes = 0;
        for p in status.partitions.iter().filter(|p| page.partition.is_none_or(|only| only == p.partition)) {
            if out.len() >= page.limit || bytes >= page.max_bytes {
                break;
            }
            let from = match (page.partition, page.from) {
                (Some(_), Some(from)) => from.max(p.earliest),
                (Some(_), None) => p.earliest,
                (None, _) => p.acknowledged.unwrap_or(p.earliest).max(p.earliest),
            };
            let pc = self.partition(p.partition).await?;
            let from = match page.since {
                Some(since) => self.offset_at_time(&pc, since, from, p.end).await?,
                None => from,
            };
            let records =
                self.read(&pc, from, p.end, page.limit - out.len(), page.max_bytes - bytes, page.since).await?;
            bytes += records.iter().map(DeadLetter::size).sum::<usize>();
            out.extend(records);
        }
        Ok(out)
    }

    /// The operators' position on `partition`, as committed.
    /// Publishes a replay page; a record the target refuses alone as too
    /// large fails the page (it goes back first in `outbox`): a replay
    /// sends every selected record or says which it could not.
    async fn publish_page(&self, outbox: &mut Vec<Outgoing>) -> Result<()> {
        let mut refused = Vec::new();
        let published = self.publisher.publish_all(outbox, &mut refused).await;
        match refused.into_iter().next() {
            Some((record, e)) => {
                outbox.insert(0, record);
                Err(e)
            }
            None => published,
        }
    }

    async fn position(&self, operators: &mut GroupClient, partition: i32, earliest: i64) -> Result<OperatorsPosition> {
        let tp = TopicPartition::new(self.topic(), partition);
        let committed = operators.committed_with_metadata(std::slice::from_ref(&tp)).await?;
        let (offset, metadata) = committed.get(&tp).cloned().unwrap_or_default();
        Ok(OperatorsPosition::new(offset, metadata.as_deref(), earliest))
    }

    /// Commits `position` merged with the group's current one, so that
    /// nothing handled meanwhile is undone; returns what was committed.
    /// While this instance replays, it first checks that it still holds
    /// the replay lock.
    async fn commit_position(
        &self,
        operators: &mut GroupClient,
        partition: i32,
        earliest: i64,
        position: &OperatorsPosition,
    ) -> Result<OperatorsPosition> {
        if self.held_lock().is_some_and(|lock| lock.generation().is_none()) {
            return Err(Error::ReplayLockLost { group: self.lock_group.clone() });
        }
        let merged = position.merge(&self.position(operators, partition, earliest).await?);
        let commit =
            BTreeMap::from([(TopicPartition::new(self.topic(), partition), (merged.next(), Some(merged.metadata())))]);
        operators.commit_with_metadata(-1, "", &commit).await?;
        Ok(merged)
    }

    /// Acknowledges records of `partition` without replaying them: they
    /// stay in the topic, for audit, and leave the backlog. Never moves the
    /// operators' position back; returns it.
    ///
    /// It takes the replay lock, as a replay does (or goes on under this
    /// instance's own replay's): the position is read, merged and committed
    /// by one instance at a time, so no instance commits a position that
    /// misses another's acknowledgement. While another instance replays,
    /// it is refused ([`Error::ReplayElsewhere`]).
    pub async fn acknowledge(&self, partition: i32, ack: &Acknowledgement) -> Result<OperatorsPosition> {
        let pc = self.partition(partition).await?;
        let earliest = self.offsets(&pc, OffsetAt::Earliest, self.topic()).await?;
        {
            // This instance replays: its lock covers the acknowledgement,
            // and is not released while the operators' client is in use.
            let mut operators = self.operators.lock().await;
            if self.held_lock().is_some() {
                return self.acknowledge_locked(&mut operators, partition, earliest, ack).await;
            }
        }
        let lock = ReplayLock::acquire(self.connection.clone(), &self.lock_group, &self.instance).await?;
        let outcome = async {
            let mut operators = self.operators.lock().await;
            if lock.generation().is_none() {
                return Err(Error::ReplayLockLost { group: self.lock_group.clone() });
            }
            self.acknowledge_locked(&mut operators, partition, earliest, ack).await
        }
        .await;
        lock.release().await;
        outcome
    }

    async fn acknowledge_locked(
        &self,
        operators: &mut GroupClient,
        partition: i32,
        earliest: i64,
        ack: &Acknowledgement,
    ) -> Result<OperatorsPosition> {
        let mut position = self.position(operators, partition, earliest).await?;
        match ack {
            Acknowledgement::UpTo(offset) => position.handle_before(offset.saturating_add(1)),
            Acknowledgement::Offsets(offsets) => {
                for offset in offsets {
                    position.handle(*offset).map_err(|full| Error::NotRecordable(full.to_string()))?;
                }
                if position.handled_above(i64::MAX) > 0 && !self.keeps_metadata(operators, partition, earliest).await? {
                    return Err(Error::NotRecordable(NO_METADATA.to_owned()));
                }
            }
        }
        self.commit_position(operators, partition, earliest, &position).await
    }

    /// Replays what `request` selects, from the operators' position up to
    /// the end offsets captured now: records dead-lettered meanwhile wait
    /// for the next request, so a replay always ends.
    ///
    /// It reads one page (at most 1 MiB) at a time, publishes that page's
    /// records (acknowledged by the broker) and commits the operators'
    /// position before reading the next, so memory stays bounded whatever
    /// the backlog, and a replay that stops midway (an error, a crash) has
    /// committed what it published. A partition that fails is reported and
    /// the others go on. Records replayed out of order (by key or offset)
    /// are recorded with the position, so a repeat skips them.
    pub async fn replay(&self, request: &ReplayRequest) -> Result<ReplayReport> {
        self.replay_reporting(request, |_| {}).await
    }

    /// [`replay`](Self::replay), calling `progress` after every page.
    pub async fn replay_reporting(
        &self,
        request: &ReplayRequest,
        mut progress: impl FnMut(&ReplayReport),
    ) -> Result<ReplayReport> {
        let lock = if request.dry_run {
            None
        } else {
            Some(Arc::new(ReplayLock::acquire(self.connection.clone(), &self.lock_group, &self.instance).await?))
        };
        *self.lock.lock().unwrap_or_else(|p| p.into_inner()) = lock.clone();
        let outcome = self.replay_locked(request, &mut progress).await;
        {
            // An acknowledgement going on under this lock ends first.
            let _operators = self.operators.lock().await;
            *self.lock.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        if let Some(lock) = lock {
            lock.release().await;
        }
        outcome
    }

    async fn replay_locked(
        &self,
        request: &ReplayRequest,
        progress: &mut impl FnMut(&ReplayReport),
    ) -> Result<ReplayReport> {
        let status = self.status().await?;
        let mut report = ReplayReport {
            target: self.policy.replay_topic(request.target).to_string(),
            dry_run: request.dry_run,
            replayed: 0,
            skipped_total: 0,
            skipped: Vec::new(),
            partitions: Vec::new(),
        };
        // Started: the lock is held (or not needed).
        progress(&report);
        for p in status.partitions.iter().filter(|p| request.selection.visits(p.partition)) {
            if request.selection.limit_reached(report.replayed) {
                break;
            }
            let outcome = self.replay_partition(request, p, &mut report, progress).await;
            if let Err(e) = outcome {
                if let Some(last) = report.partitions.last_mut().filter(|last| last.partition == p.partition) {
                    last.error = Some(e.to_string());
                }
            }
            progress(&report);
        }
        Ok(report)
    }

    async fn replay_partition(
        &self,
        request: &ReplayRequest,
        p: &PartitionStatus,
        report: &mut ReplayReport,
        progress: &mut impl FnMut(&ReplayReport),
    ) -> Result<()> {
        let mut position = {
            let mut operators = self.operators.lock().await;
            self.position(&mut operators, p.partition, p.earliest).await?
        };
        let at = report.partitions.len();
        report.partitions.push(PartitionReplay {
            partition: p.partition,
            from: position.next(),
            to: p.end,
            replayed: 0,
            position: position.next(),
            error: None,
        });
        let selection = &request.selection;
        let mut page_bytes = self.page_bytes;
        let mut next_read = selection.first_offset_from(position.next());
        while let Some(from) = next_read.filter(|from| *from < p.end) {
            if selection.limit_reached(report.replayed) {
                break;
            }
            // What operators acknowledged meanwhile is not replayed.
            position = {
                let mut operators = self.operators.lock().await;
                position.merge(&self.position(&mut operators, p.partition, p.earliest).await?)
            };
            report.partitions[at].position = position.next();
            let Some(from) = selection.first_offset_from(from.max(position.next())).filter(|from| *from < p.end) else {
                break;
            };
            let records = loop {
                let mut patience = Patience::new("reading a page", Some(p.partition));
                let records = loop {
                    match self.fetch(p.partition, from, page_bytes).await {
                        Err(e) if patience.again(&e).await => continue,
                        outcome => break outcome,
                    }
                }?;
                // Kafka answers at least one batch however small the page;
                // brokers that answer nothing get a larger page, kept from then on.
                if records.iter().any(|r| r.offset >= from) || page_bytes >= MAX_PAGE_BYTES {
                    break records;
                }
                page_bytes = page_bytes.saturating_mul(2).min(MAX_PAGE_BYTES);
            };
            let now = Timestamp::from(std::time::SystemTime::now());
            let page_of = |keeps_metadata| PagePlan {
                from,
                end: p.end,
                replayed_before: report.replayed,
                selection,
                policy: &self.policy,
                target: request.target,
                guards: request.guards,
                now,
                keeps_metadata,
            };
            // Records out of order are recorded in the commit's metadata:
            // asked of the broker only when a page has some.
            let mut planned = page_of(true).plan(&records, position.clone());
            if planned.out_of_order
                && !self.keeps_metadata(&mut *self.operators.lock().await, p.partition, p.earliest).await?
            {
                planned = page_of(false).plan(&records, position.clone());
            }
            let PlannedPage { page, read_to, verdicts, .. } = planned;
            let mut outbox = Vec::new();
            let mut spans = Vec::new();
            for (r, verdict) in records.into_iter().zip(verdicts) {
                match verdict {
                    Verdict::Passed => {}
                    Verdict::Skipped(reason) => report.skip(p.partition, r.offset, reason),
                    Verdict::Replayed(mut headers) => {
                        if !request.dry_run {
                            let incoming = TraceContext::read(&r.headers);
                            let span = self.spans.replay(incoming.context(), &report.target);
                            if let Some(context) = span.carried() {
                                context.write_into(&mut headers);
                            }
                            spans.push(span);
                        }
                        let source_partition =
                            RetryHeaders::decode(&r.headers).map(|h| h.original_partition).unwrap_or(p.partition);
                        outbox.push(Outgoing {
                            topic: report.target.clone(),
                            source_partition,
                            key: r.key,
                            value: r.value,
                            headers: republished_headers(&r.raw_headers, &headers),
                            timestamp: now,
                            codec: Codec::Lz4,
                        });
                        report.replayed += 1;
                        report.partitions[at].replayed += 1;
                    }
                }
            }
            if read_to == from {
                break; // nothing more below the end (compacted or deleted offsets)
            }
            next_read = selection.first_offset_from(read_to);
            if request.dry_run || outbox.is_empty() {
                progress(report);
                continue;
            }
            // Publish first: only what the broker acknowledged may be marked
            // done. What a failed try published is removed from the outbox.
            // Nothing of a failed page is committed: none of it counts.
            let outbox_len = outbox.len();
            let mut patience = Patience::new("publishing a page", Some(p.partition));
            let published = loop {
                match self.publish_page(&mut outbox).await {
                    Err(e) if patience.again(&e).await => continue,
                    outcome => break outcome,
                }
            };
            let failed = published.as_ref().err().map(|e| e.to_string());
            spans.into_iter().for_each(|span| span.sent(failed.as_deref()));
            if let Err(e) = published {
                // What the broker did take of it may reach the target again
                // on a repeat.
                let unpublished = outbox_len.min(report.partitions[at].replayed);
                report.replayed -= unpublished;
                report.partitions[at].replayed -= unpublished;
                return Err(e);
            }
            let mut operators = self.operators.lock().await;
            let mut patience = Patience::new("committing a page", Some(p.partition));
            let committed = loop {
                match self.commit_position(&mut operators, p.partition, p.earliest, &page).await {
                    Err(e) if patience.again(&e).await => continue,
                    outcome => break outcome,
                }
            };
            position = committed?;
            report.partitions[at].position = position.next();
            drop(operators);
            progress(report);
        }
        Ok(())
    }
}

/// Why a record cannot be handled out of order on some brokers.
const NO_METADATA: &str = "cannot be recorded out of order: this broker drops offset-commit metadata, \
    so a repeat would replay it again; replay or acknowledge the records before it first";

/// This instance's name, as other instances are told when it holds the
/// replay lock: the host and the process id.
fn instance_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    format!("{host} pid {}", std::process::id())
}

/// What an acknowledgement covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acknowledgement {
    /// Every record up to this offset, inclusive.
    UpTo(i64),
    /// These records, wherever they are: those above the operators'
    /// position are recorded with it.
    Offsets(BTreeSet<i64>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(offset: i64, headers: &[(&str, &str)], undecodable: Option<&str>) -> Read {
        Read {
            partition: 0,
            offset,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"v")),
            timestamp: None,
            headers: headers.iter().map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec())).collect(),
            raw_headers: Vec::new(),
            undecodable: undecodable.map(str::to_owned),
        }
    }

    fn shown(verdicts: &[Verdict]) -> Vec<String> {
        verdicts
            .iter()
            .map(|v| match v {
                Verdict::Passed => "passed".to_owned(),
                Verdict::Skipped(_) => "skipped".to_owned(),
                Verdict::Replayed(_) => "replayed".to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_page_is_judged_record_by_record() {
        let topology = retry_core::RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap();
        let policy = RetryPolicy::new(topology, Default::default());
        let records = [
            read(4, &[], None),                        // below the page
            read(5, &[], None),                        // replayed
            read(6, &[], Some("checksum mismatch")),   // cannot be read
            read(7, &[("x-replay-count", "3")], None), // the loop guard
            read(8, &[], None),                        // handled before
            read(9, &[], None),                        // out of order
            read(10, &[], None),                       // at the captured end
        ];
        let mut position = OperatorsPosition::new(Some(5), None, 0);
        position.handle(8).unwrap();
        let selection = ReplaySelection::default();
        let plan = |keeps_metadata, selection: &ReplaySelection| {
            PagePlan {
                from: 5,
                end: 10,
                replayed_before: 0,
                selection,
                policy: &policy,
                target: ReplayTarget::Source,
                guards: ReplayGuards { max_replays: Some(3), max_age: None },
                now: Timestamp::from_millis(1_000),
                keeps_metadata,
            }
            .plan(&records, position.clone())
        };
        let kept = plan(true, &selection);
        assert_eq!(
            shown(&kept.verdicts),
            ["passed", "replayed", "skipped", "skipped", "passed", "replayed", "passed"],
            "where the broker keeps commit metadata"
        );
        assert!(matches!(&kept.verdicts[2], Verdict::Skipped(r) if r == "cannot be replayed: checksum mismatch"));
        assert!(matches!(&kept.verdicts[3], Verdict::Skipped(r) if r.contains("replayed 3 times already")));
        assert!(kept.out_of_order);
        assert_eq!(kept.read_to, 10);
        assert!(kept.page.is_handled(5) && kept.page.is_handled(9) && !kept.page.is_handled(6));
        let dropped = plan(false, &selection);
        assert_eq!(
            shown(&dropped.verdicts),
            ["passed", "replayed", "skipped", "skipped", "passed", "skipped", "passed"],
            "where it drops it, 9 (out of order) is refused with the reason"
        );
        assert!(matches!(&dropped.verdicts[5], Verdict::Skipped(reason) if reason == NO_METADATA));
        // A limit of one: the page stops reading after the first replayed record.
        let one = ReplaySelection { limit: Some(1), ..Default::default() };
        let limited = plan(true, &one);
        assert_eq!(shown(&limited.verdicts), ["passed", "replayed", "passed", "passed", "passed", "passed", "passed"]);
        assert_eq!(limited.read_to, 6);
    }
}
