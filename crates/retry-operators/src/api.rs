//! The operators' API as types: what each route takes and answers. The
//! routes, the `billing-bin dlq` client and the OpenAPI document all use
//! these, so none of them can drift from the others.

use std::collections::BTreeMap;

use base64::Engine;
use bytes::Bytes;
use retry_kafka::{DeadLetter, DeadLetterStatus, PartitionReplay, ReplayReport, SkippedRecord};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// An error answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// What went wrong, and what to do about it.
    pub error: String,
}

/// `GET /admin/dlq`: the service's dead-letter topics.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DlqList {
    /// One per ladder (this service has one).
    pub topics: Vec<DlqTopic>,
}

/// A dead-letter topic with its backlog.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DlqTopic {
    /// The dead-letter topic.
    pub topic: String,
    /// The source topic it belongs to.
    pub source_topic: String,
    /// Records neither replayed nor acknowledged, over every partition.
    pub backlog: i64,
    /// Records retention deleted before operators replayed or acknowledged
    /// them, over every partition: an acknowledgement up to each
    /// partition's earliest offset says an operator knows.
    pub lost_to_retention: i64,
    /// Each partition.
    pub partitions: Vec<DlqPartition>,
}

/// One partition of a dead-letter topic.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DlqPartition {
    /// The partition.
    pub partition: i32,
    /// The oldest offset retention keeps.
    pub earliest: i64,
    /// The next offset to be written.
    pub end_offset: i64,
    /// The operators' position: records before it were replayed or acknowledged.
    pub acknowledged_offset: Option<i64>,
    /// Records after that position replayed or acknowledged out of order.
    pub handled_above: usize,
    /// Records neither replayed nor acknowledged.
    pub backlog: i64,
    /// Records retention deleted before operators replayed or acknowledged them.
    pub lost_to_retention: i64,
}

impl DlqTopic {
    pub(crate) fn new(status: DeadLetterStatus, source_topic: &str) -> Self {
        DlqTopic {
            topic: status.topic,
            source_topic: source_topic.to_owned(),
            backlog: status.backlog,
            lost_to_retention: status.lost_to_retention,
            partitions: status
                .partitions
                .into_iter()
                .map(|p| DlqPartition {
                    partition: p.partition,
                    earliest: p.earliest,
                    end_offset: p.end,
                    acknowledged_offset: p.acknowledged,
                    handled_above: p.handled_above,
                    backlog: p.backlog,
                    lost_to_retention: p.lost_to_retention,
                })
                .collect(),
        }
    }
}

/// The query of `GET /admin/dlq/{topic}/messages`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MessagesQuery {
    /// One partition; without it, every partition from the operators'
    /// position (the backlog), one after the other.
    pub partition: Option<i32>,
    /// With a partition, the first offset (default: the oldest kept).
    pub offset: Option<i64>,
    /// In each partition read, start at the first record dead-lettered at
    /// or after this time (ms since the epoch), or later where the offset
    /// or the operators' position say so.
    pub since_ms: Option<i64>,
    /// How many records, 1 to 100 (default 20).
    pub limit: Option<usize>,
}

/// One page of dead-lettered records.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MessagesPage {
    /// The records, by partition then offset.
    pub messages: Vec<Message>,
    /// Where the next page starts, per partition read.
    pub next_offsets: BTreeMap<i32, i64>,
    /// With a partition: where the next page starts.
    pub next_offset: Option<i64>,
    /// Whether the page stopped at its byte cap rather than its record limit.
    pub capped_by_bytes: bool,
}

/// A key or payload: text when it is UTF-8, else base64.
#[derive(Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct Content {
    /// The content, when it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The content in base64, when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

impl Content {
    fn of(bytes: &Option<Bytes>) -> Option<Content> {
        Some(Content::encoded(bytes.as_ref()?, |_| true))
    }

    /// Text when `bytes` are UTF-8 that `readable` accepts, else base64.
    fn encoded(bytes: &[u8], readable: impl Fn(&str) -> bool) -> Content {
        match std::str::from_utf8(bytes) {
            Ok(text) if readable(text) => Content { text: Some(text.to_owned()), base64: None },
            _ => Content { text: None, base64: Some(base64::engine::general_purpose::STANDARD.encode(bytes)) },
        }
    }
}

/// The retry headers of a dead letter, decoded.
#[derive(Debug, Serialize, Deserialize, ToSchema, Default)]
pub struct RetryInfo {
    /// Why they cannot be decoded (a record someone else wrote); the other
    /// fields are then absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undecodable: Option<String>,
    /// Failed delivery attempts.
    pub attempt: Option<u32>,
    /// Where the record was first consumed.
    pub original_topic: Option<String>,
    /// Its partition there.
    pub original_partition: Option<i32>,
    /// Its offset there.
    pub original_offset: Option<i64>,
    /// When its first attempt failed, in ms since the epoch.
    pub first_failure_at: Option<i64>,
    /// `transient` or `permanent`.
    pub error_kind: Option<String>,
    /// The last failure.
    pub error: Option<String>,
    /// Why it was dead-lettered.
    pub reason: Option<String>,
    /// How often operators replayed it.
    pub replay_count: Option<u32>,
    /// When its event was first produced, before any replay, in ms since the epoch.
    pub first_seen_at: Option<i64>,
    /// Each failed attempt of this pass through the ladder, oldest first
    /// (empty for records written before the ladder recorded them).
    #[serde(default)]
    pub attempts: Vec<AttemptAnswer>,
}

/// One failed attempt.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AttemptAnswer {
    /// When it was due, in ms since the epoch; absent for the first (due when produced).
    pub due_at_ms: Option<i64>,
    /// When it failed, in ms since the epoch.
    pub failed_at_ms: i64,
}

/// A dead-lettered record.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Message {
    /// Its partition in the dead-letter topic.
    pub partition: i32,
    /// Its offset there.
    pub offset: i64,
    /// When it was dead-lettered, in ms since the epoch.
    pub timestamp: Option<i64>,
    /// Its key.
    pub key: Option<Content>,
    /// Its value.
    pub payload: Option<Content>,
    /// Its retry headers, decoded.
    pub retry: RetryInfo,
    /// The trace it belongs to (32 hex digits, from its `traceparent`):
    /// the one to look up in a tracing backend. Absent without a valid one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Every header, in order, repeated names included (Spring appends a
    /// value at every hop).
    pub headers: Vec<Header>,
}

/// One header of a record: its value as text when it is UTF-8 without
/// control characters (tabs and line breaks aside), else base64 (the
/// binary integers Spring Kafka writes, for one).
#[derive(Debug, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct Header {
    /// Its name.
    pub name: String,
    /// Its value.
    #[serde(flatten)]
    pub value: Content,
}

impl Header {
    pub(crate) fn of(name: &str, value: &[u8]) -> Header {
        let readable = |t: &str| !t.chars().any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'));
        Header { name: name.to_owned(), value: Content::encoded(value, readable) }
    }
}

impl Message {
    pub(crate) fn new(d: &DeadLetter) -> Self {
        let retry = match d.retry_headers() {
            Ok(h) => RetryInfo {
                undecodable: None,
                attempt: Some(h.attempt),
                original_topic: Some(h.original_topic.to_string()),
                original_partition: Some(h.original_partition),
                original_offset: Some(h.original_offset),
                first_failure_at: Some(h.first_failure_at.as_millis()),
                error_kind: Some(h.error_kind.as_str().to_owned()),
                reason: h.dead_letter_reason.map(|r| r.as_str().to_owned()),
                replay_count: Some(h.replay_count),
                first_seen_at: Some(h.first_seen().as_millis()),
                error: Some(h.error),
                attempts: retry_core::history::read(&d.headers)
                    .into_iter()
                    .map(|a| AttemptAnswer {
                        due_at_ms: a.due_at.map(|t| t.as_millis()),
                        failed_at_ms: a.failed_at.as_millis(),
                    })
                    .collect(),
            },
            Err(e) => RetryInfo { undecodable: Some(e.to_string()), ..RetryInfo::default() },
        };
        Message {
            partition: d.partition,
            offset: d.offset,
            timestamp: d.timestamp.map(|t| t.as_millis()),
            key: Content::of(&d.key),
            payload: Content::of(&d.value),
            retry,
            trace_id: retry_core::trace::TraceContext::read(&d.headers).context().map(|c| c.trace_id().to_string()),
            headers: d.headers.iter().map(|(k, v)| Header::of(k, v)).collect(),
        }
    }
}

/// The query of `POST /admin/dlq/{topic}/replay`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReplayQuery {
    /// The source topic, or its first retry topic; any other is refused.
    pub target_topic: String,
    /// Wait for the replay to finish (up to the wait limit) and answer with
    /// its outcome; without it, the answer comes at once with the job's id.
    #[serde(default)]
    pub wait: bool,
}

/// The body of `POST /admin/dlq/{topic}/replay`; every field is optional.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayBody {
    /// Report what would be replayed, change nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Replay at most this many records (at least 1).
    pub limit: Option<usize>,
    /// Only this partition.
    pub partition: Option<i32>,
    /// Only these offsets.
    pub offsets: Option<Vec<i64>>,
    /// Only records with these keys.
    pub keys: Option<Vec<String>>,
    /// Replay records even if replayed too often already (the loop guard).
    #[serde(default)]
    pub override_loop_guard: bool,
    /// Replay records whose event is older than the provider's idempotency
    /// window, which the provider may charge again.
    #[serde(default)]
    pub override_idempotency_window: bool,
}

/// Where a replay job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Still reading and publishing.
    Running,
    /// Done, every partition replayed.
    Succeeded,
    /// Done, but some partitions stopped on an error (see their `error`):
    /// what they published is committed; repeat the request for the rest.
    PartiallyFailed,
    /// Stopped before replaying anything (see `error`).
    Failed,
}

/// A replay job, as `POST .../replay` and `GET /admin/dlq/replays/{id}` show it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReplayJob {
    /// Its id.
    pub id: String,
    /// Where it is.
    pub state: JobState,
    /// Who started it (`X-Operator`, else the client's address).
    pub operator: String,
    /// The dead-letter topic.
    pub topic: String,
    /// Where records go.
    pub target_topic: String,
    /// What was asked.
    pub request: ReplayBody,
    /// When it started, in ms since the epoch.
    pub started_at: i64,
    /// When it ended, in ms since the epoch.
    pub finished_at: Option<i64>,
    /// Progress so far, or the outcome.
    pub report: ReplayOutcome,
    /// Why it failed.
    pub error: Option<String>,
}

/// What a replay did, so far or in the end.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct ReplayOutcome {
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// Records replayed (or, in a dry run, that would be).
    pub replayed: usize,
    /// Records refused.
    pub skipped_total: usize,
    /// The first hundred refused, with the reason.
    pub skipped: Vec<Skipped>,
    /// Each partition visited.
    pub partitions: Vec<PartitionOutcome>,
}

/// A record a replay refused.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Skipped {
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Why it was not replayed.
    pub reason: String,
}

/// What a replay did on one partition.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PartitionOutcome {
    /// The partition.
    pub partition: i32,
    /// The operators' position when the replay started.
    pub from: i64,
    /// The end offset captured when it started.
    pub to: i64,
    /// Records replayed.
    pub replayed: usize,
    /// The operators' position now.
    pub position: i64,
    /// Why this partition stopped early.
    pub error: Option<String>,
}

impl From<&ReplayReport> for ReplayOutcome {
    fn from(r: &ReplayReport) -> Self {
        ReplayOutcome {
            dry_run: r.dry_run,
            replayed: r.replayed,
            skipped_total: r.skipped_total,
            skipped: r
                .skipped
                .iter()
                .map(|SkippedRecord { partition, offset, reason }| Skipped {
                    partition: *partition,
                    offset: *offset,
                    reason: reason.clone(),
                })
                .collect(),
            partitions: r
                .partitions
                .iter()
                .map(|p: &PartitionReplay| PartitionOutcome {
                    partition: p.partition,
                    from: p.from,
                    to: p.to,
                    replayed: p.replayed,
                    position: p.position,
                    error: p.error.clone(),
                })
                .collect(),
        }
    }
}

/// The body of `POST /admin/dlq/{topic}/ack`: either `up_to_offset` (every
/// record up to it) or `offsets` (these records, wherever they are).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckBody {
    /// The partition.
    pub partition: i32,
    /// Every record up to this offset, inclusive.
    pub up_to_offset: Option<i64>,
    /// These records.
    pub offsets: Option<Vec<i64>>,
}

/// The answer to an acknowledgement.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AckAnswer {
    /// The dead-letter topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The operators' position now.
    pub acknowledged_offset: i64,
    /// Records above it handled out of order.
    pub handled_above: usize,
}

/// `GET /admin/listener`: the ladder's listener as operators see it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListenerAnswer {
    /// The listener's source topic.
    pub topic: String,
    /// Its consumer group (the rungs' groups add their suffix to it).
    pub group: String,
    /// Whether this instance consumes the ladder (`billing-bin operators`
    /// does not: it shows no brake).
    pub consumed_here: bool,
    /// This instance's outage brake; absent when it has none.
    pub brake: Option<BrakeAnswer>,
    /// The operators' pause, as the group keeps it for every instance,
    /// while it holds.
    pub pause: Option<PauseAnswer>,
    /// Whether this instance's records wait for a pause now (each instance
    /// reads the group's pause every 2s).
    pub paused_here: bool,
    /// Each consumed topic's lag: the group's committed offsets behind the
    /// partitions' ends.
    pub lag: Vec<TopicLag>,
}

/// An outage brake, on the instance that answers.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BrakeAnswer {
    /// `running`, `probing` (one record at a time) or `paused` (until the next probe).
    pub state: String,
    /// Since when it has been engaged, in milliseconds since the epoch, while it is.
    pub engaged_since_ms: Option<i64>,
    /// Its latest engagements (at most ten), oldest first.
    pub recent_engagements: Vec<EngagementAnswer>,
}

/// One engagement of the brake.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EngagementAnswer {
    /// When, in milliseconds since the epoch.
    pub at_ms: i64,
    /// Transient failures among the calls it saw.
    pub failed: u32,
    /// The calls it saw.
    pub calls: u32,
}

/// The operators' pause of the listener.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PauseAnswer {
    /// When records run again, in milliseconds since the epoch.
    pub until_ms: i64,
    /// Who paused (`X-Operator`, else their address); empty when the broker keeps no metadata.
    pub by: String,
    /// Why.
    pub reason: String,
}

/// `POST /admin/listener/pause`: pause the listener on every instance.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PauseBody {
    /// How long: `30s`, `10m`, `2h` (1s to 168h).
    pub duration: String,
    /// Why, for the other operators and the audit log (at most 200 bytes kept).
    #[serde(default)]
    pub reason: String,
}

/// `POST /admin/listener/resume`: what was resumed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ResumeAnswer {
    /// Whether a pause held when the resume came.
    pub was_paused: bool,
}

/// A consumed topic's lag, partition by partition.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TopicLag {
    /// The topic (the source or a rung).
    pub topic: String,
    /// The group that consumes it.
    pub group: String,
    /// The sum over its partitions.
    pub lag: i64,
    /// Each partition.
    pub partitions: Vec<PartitionLag>,
}

/// A partition's lag.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PartitionLag {
    /// The partition.
    pub partition: i32,
    /// The group's committed offset; absent before its first commit.
    pub committed: Option<i64>,
    /// The next offset to be written.
    pub end: i64,
    /// Records behind: the end minus the committed offset (or the earliest kept).
    pub lag: i64,
}

/// `GET /admin/dlq/replays`: this instance's recent replay jobs.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReplayJobs {
    /// Newest first (at most 100).
    pub jobs: Vec<ReplayJob>,
}
