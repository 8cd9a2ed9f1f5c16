//! What a listener is told: [`ListenerConfig`] (checked when built) and
//! where partitions without a committed offset start ([`OffsetReset`]).

use std::time::Duration;

use retry_core::{groups::LadderGroups, RetryPolicy};

use crate::{
    protocol::produce::DEFAULT_MAX_REQUEST_BYTES, session, Compression, ConnectionConfig, Error, IsolationLevel, Result,
};

/// How handler calls run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HandlerCalls {
    /// Polled by their partition's worker, beside each other (the default:
    /// no task, timer or registration per call that ends at once). A
    /// panic is caught and dead-letters the record; a timeout or an
    /// abandon cancels the call by dropping it. A call that blocks its
    /// thread (no `.await` for a long while) holds its partition until it
    /// returns, and its outcome counts; it is logged and counted in
    /// `kafka_retry_blocking_handler_calls`. It may hold more: when every
    /// other worker thread of the runtime sleeps, none wakes to drive
    /// tokio's timers and sockets, and the runtime (heartbeats included)
    /// stalls until the call returns. CPU-heavy or blocking work belongs in
    /// `tokio::task::spawn_blocking`.
    #[default]
    Polled,
    /// Each in a task of its own: the calls of one partition may run on
    /// several threads at once, and a call that blocks its thread is given
    /// up after its timeout (the partition goes on, the call runs on
    /// detached, counted in `kafka_retry_detached_handler_calls`, the
    /// listener not ready until it ends), at the cost of a task per call.
    Spawned,
}

/// How a listener's members take part in their consumer groups.
///
/// ```
/// use retry_kafka::GroupProtocol;
///
/// assert_eq!("consumer".parse::<GroupProtocol>().ok(), Some(GroupProtocol::Consumer));
/// assert_eq!(GroupProtocol::Consumer.name(), "consumer");
/// assert!("eager".parse::<GroupProtocol>().unwrap_err().to_string().contains("classic or consumer"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupProtocol {
    /// Kafka's classic protocol (JoinGroup, SyncGroup, Heartbeat): every
    /// broker speaks it; a rebalance stops the group's partitions.
    #[default]
    Classic,
    /// The consumer group protocol of KIP-848 (Kafka's `group.protocol=consumer`,
    /// Apache Kafka 4.0 and later): the coordinator assigns partitions,
    /// and a member gives up or takes only the partitions that move, while
    /// the others go on. Its session and heartbeat interval are the
    /// broker's (`group.consumer.session.timeout.ms`,
    /// `group.consumer.heartbeat.interval.ms`); `session_timeout` still
    /// bounds how long a member that cannot reach its coordinator works on.
    Consumer,
}

impl GroupProtocol {
    /// Its name, as Kafka's `group.protocol` says it.
    pub fn name(self) -> &'static str {
        match self {
            GroupProtocol::Classic => "classic",
            GroupProtocol::Consumer => "consumer",
        }
    }
}

impl std::str::FromStr for GroupProtocol {
    type Err = Error;

    /// `classic` or `consumer`, as Kafka's `group.protocol`.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "classic" => Ok(GroupProtocol::Classic),
            "consumer" => Ok(GroupProtocol::Consumer),
            other => Err(Error::setting(
                "ListenerConfig::group_protocol",
                format!("group protocol {other:?} is neither classic nor consumer: give classic or consumer"),
            )),
        }
    }
}

/// How the classic protocol's rebalances move partitions: which assignor
/// the members announce (Kafka's `partition.assignment.strategy`). Every
/// member of a group must announce the same one.
///
/// ```
/// use retry_kafka::AssignmentStrategy;
///
/// assert_eq!("cooperative-sticky".parse::<AssignmentStrategy>().ok(), Some(AssignmentStrategy::CooperativeSticky));
/// assert_eq!(AssignmentStrategy::Range.name(), "range");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AssignmentStrategy {
    /// Eager (`range`): at each rebalance every member stops all its
    /// partitions, and the leader assigns them afresh.
    #[default]
    Range,
    /// Incremental (`cooperative-sticky`, KIP-429): members keep their
    /// partitions through a rebalance, and only those that move stop, in a
    /// second rebalance that follows at once.
    CooperativeSticky,
}

impl AssignmentStrategy {
    /// Its name, as Kafka's `partition.assignment.strategy` says it.
    pub fn name(self) -> &'static str {
        match self {
            AssignmentStrategy::Range => "range",
            AssignmentStrategy::CooperativeSticky => "cooperative-sticky",
        }
    }
}

impl std::str::FromStr for AssignmentStrategy {
    type Err = Error;

    /// `range` or `cooperative-sticky`.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "range" => Ok(AssignmentStrategy::Range),
            "cooperative-sticky" => Ok(AssignmentStrategy::CooperativeSticky),
            other => Err(Error::setting(
                "ListenerConfig::assignment_strategy",
                format!("assignment strategy {other:?} is neither range nor cooperative-sticky: give one of them"),
            )),
        }
    }
}

/// Where to start a partition that has no committed offset, or whose
/// committed offset no longer exists (retention deleted it). Retry rungs
/// always start at their earliest record: what was republished to them is
/// owed its retry.
///
/// ```
/// use std::time::Duration;
/// use retry_kafka::OffsetReset;
///
/// assert_eq!("earliest".parse::<OffsetReset>().ok(), Some(OffsetReset::Earliest));
/// let day_less_an_hour = OffsetReset::ByDuration(Duration::from_secs(23 * 3600));
/// assert_eq!("by_duration:23h".parse::<OffsetReset>().ok(), Some(day_less_an_hour));
/// let at: OffsetReset = "2026-12-01T00:00:00Z".parse().unwrap();
/// assert_eq!(at, OffsetReset::At(retry_core::Timestamp::from_millis(1_796_083_200_000)));
/// assert_eq!("1796083200000".parse::<OffsetReset>().ok(), Some(at));
/// assert!("yesterday".parse::<OffsetReset>().unwrap_err().to_string().contains("earliest, latest"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffsetReset {
    /// The oldest record still kept.
    #[default]
    Earliest,
    /// Only records produced from now on.
    Latest,
    /// The first record whose timestamp is at or after this time; the end
    /// of the log when none is.
    At(retry_core::Timestamp),
    /// The first record produced at most this long before the partition
    /// starts (Kafka's `by_duration`); the end of the log when none is.
    ByDuration(Duration),
}

impl std::str::FromStr for OffsetReset {
    type Err = Error;

    /// `earliest`, `latest`, `by_duration:<duration>` (`by_duration:23h`), or
    /// a time: RFC 3339 (`2026-12-01T00:00:00Z`) or milliseconds since the epoch.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let bad = |why: String| {
            Error::setting(
                "ListenerConfig::offset_reset",
                format!(
                    "start position {s:?} is none of earliest, latest, by_duration:<duration> (by_duration:23h) or a \
                 time (2026-12-01T00:00:00Z, or milliseconds since the epoch){why}"
                ),
            )
        };
        match s {
            "earliest" => return Ok(OffsetReset::Earliest),
            "latest" => return Ok(OffsetReset::Latest),
            _ => {}
        }
        if let Some(d) = s.strip_prefix("by_duration:") {
            return retry_core::parse_duration(d).map(OffsetReset::ByDuration).map_err(|e| bad(format!(": {e}")));
        }
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            let ms = s.parse::<i64>().map_err(|e| bad(format!(": {e}")))?;
            return Ok(OffsetReset::At(retry_core::Timestamp::from_millis(ms)));
        }
        chrono::DateTime::parse_from_rfc3339(s)
            .map(|t| OffsetReset::At(retry_core::Timestamp::from_millis(t.timestamp_millis())))
            .map_err(|e| bad(if s.contains('T') { format!(": {e}") } else { String::new() }))
    }
}

/// Everything a listener needs to know.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// How to reach the cluster.
    pub connection: ConnectionConfig,
    /// The ladder's groups, derived from the source topic's group id.
    pub(crate) groups: LadderGroups,
    /// The ladder's topics and decisions.
    pub(crate) policy: RetryPolicy,
    /// The group session timeout: without a heartbeat for this long, the
    /// coordinator drops the member. Requests to the coordinator are
    /// bounded by half of it (or the request timeout, if shorter), and a
    /// heartbeat by what is left of it: a member never works on for long
    /// on partitions the group may have given to another.
    pub session_timeout: Duration,
    /// How long the coordinator waits for members to rejoin in a rebalance:
    /// longer than a revoked member's drain (its calls' time, aborting what
    /// outlives them, a last commit), which [`Listener::start`](crate::Listener::start) checks.
    pub rebalance_timeout: Duration,
    /// How often heartbeats are sent (at most half the session timeout).
    pub heartbeat_interval: Duration,
    /// How long one handler call may take; longer is a transient failure.
    /// A rebalance lets every call in flight run its time.
    pub handler_timeout: Duration,
    /// How handler calls run: polled by their partition's worker (the
    /// default), or each in a task of its own (see [`HandlerCalls`]).
    pub handler_calls: HandlerCalls,
    /// On shutdown, how long records in flight may finish before they are
    /// abandoned (and redelivered to the next owner). A rebalance waits
    /// the longer of this and `handler_timeout`.
    pub shutdown_grace: Duration,
    /// A stable identity of this instance in its groups (Kafka's
    /// `group.instance.id`, KIP-345), e.g. a StatefulSet pod's name: a
    /// restart within the session timeout gets its partitions back with no
    /// rebalance, and the instance does not leave its groups on shutdown
    /// (its partitions wait for it for a session). Two running instances
    /// must never share one: the coordinator fences the older, which then
    /// stops consuming and reports itself not ready. `None`: a dynamic
    /// member, which leaves on shutdown.
    pub group_instance_id: Option<String>,
    /// Which group protocol the members speak: the classic one (the
    /// default) or the consumer group protocol of KIP-848 (see [`GroupProtocol`]).
    pub group_protocol: GroupProtocol,
    /// Under the classic protocol, how rebalances move partitions: eagerly
    /// (`range`, the default) or incrementally (`cooperative-sticky`); see
    /// [`AssignmentStrategy`]. The consumer group protocol assigns on the broker.
    pub assignment_strategy: AssignmentStrategy,
    /// Commit finished offsets at least this often...
    pub commit_interval: Duration,
    /// ...or as soon as this many records finished.
    pub commit_batch: usize,
    /// The most bytes one fetch returns per partition: what a partition
    /// holds in memory at once, including one waiting for its due time.
    pub fetch_max_bytes: i32,
    /// The same for retry rungs, smaller: a rung's head record usually waits
    /// for its due time, and fetching far ahead of it only costs memory and
    /// broker work.
    pub retry_fetch_max_bytes: i32,
    /// How long the broker may hold a fetch that has no records yet.
    pub fetch_max_wait: Duration,
    /// Where to start without a (valid) committed offset.
    pub offset_reset: OffsetReset,
    /// Which records of transactional producers are read: only committed
    /// ones (Kafka's `read_committed`, the default), or all.
    pub isolation_level: IsolationLevel,
    /// The most bytes one fetched batch may decompress to; a batch that
    /// inflates further is dead-lettered as it is, never read into memory.
    /// `None`: 32 times `fetch_max_bytes`, and at least 16 MiB.
    pub max_batch_inflated: Option<usize>,
    /// How republications to retry and dead-letter topics are compressed
    /// (by default as the record's batch was, lz4 for uncompressed ones),
    /// so that a record that fit compressed on its topic fits on the next.
    pub publish_compression: Compression,
    /// First wait after a failed publish; doubles up to `publish_backoff_max`.
    pub publish_backoff_initial: Duration,
    /// Longest wait between publish attempts.
    pub publish_backoff_max: Duration,
    /// The most bytes one produce request to a retry or dead-letter topic
    /// carries (a single larger record goes alone); keep it within the
    /// brokers' `message.max.bytes`. A request the broker still refuses as
    /// too large is split in two.
    pub publish_max_request_bytes: usize,
    /// A partition whose republications keep failing for this long (or at
    /// once, when the broker refuses them outright: authorization, record
    /// too large) is reported stalled: an error log, the
    /// `kafka_retry_partition_stalled` gauge and [`Listener::is_ready`](crate::Listener::is_ready)
    /// turning false, until a publish goes through.
    pub publish_stall_after: Duration,
    /// How often the dead-letter backlog (`kafka_retry_dlq_backlog`) is measured.
    pub dlq_poll_interval: Duration,
    /// How often the operators' pause of the listener is read (see
    /// [`retry_core::pause`]): a pause or a resume reaches every instance
    /// within this. It is also read once before the groups are joined, so
    /// that an instance started during a pause runs nothing. `None`: this
    /// listener never reads it, and ignores operators' pauses (for tests
    /// whose brokers must see no other request).
    pub pause_poll_interval: Option<Duration>,
    /// How often each group's leader counts its topic's partitions: when
    /// the count changed (partitions were added), it rejoins so the new
    /// partitions get assigned.
    pub partition_check_interval: Duration,
    /// How many records of one partition are handled at once, and how
    /// records without a key are ordered: records of one key are handled
    /// one after another in offset order, records of different keys
    /// concurrently, and the partition is committed only up to its lowest
    /// unfinished record (see [`retry_core::window::InFlightWindow`]).
    pub window: retry_core::window::WindowConfig,
    /// The outage brake (off by default): when most handler calls fail
    /// transiently, records wait instead of moving down the ladder, the
    /// downstream is probed one record at a time, and records that
    /// exhausted the ladder are held back from the dead-letter topic for at
    /// most [`BrakeConfig::max_engaged`](retry_core::brake::BrakeConfig::max_engaged).
    /// See [`retry_core::brake::Brake`].
    pub brake: Option<retry_core::brake::BrakeConfig>,
    /// Spans of each attempt and replay through OpenTelemetry's global
    /// tracer provider (off by default; records keep their `traceparent`
    /// either way). See [`Tracing`](crate::Tracing).
    pub tracing: crate::Tracing,
}

impl ListenerConfig {
    /// A config with defaults: 10 s session, 3 s heartbeats, 60 s rebalance
    /// timeout, 30 s handler timeout, 10 s shutdown grace, a dynamic member,
    /// commits every second or 100 records, 1 MiB fetches (64 KiB on retry
    /// rungs), 64 records in flight per partition.
    ///
    /// `group_id` is the source topic's consumer group; the other groups
    /// derive from it ([`LadderGroups`]: rung `n` uses `<group_id>.retry-<label>`,
    /// e.g. `billing.retry-5s`, so each rung's progress is visible on its
    /// own). Fails when `group_id` cannot derive them.
    pub fn new(connection: ConnectionConfig, group_id: &str, policy: RetryPolicy) -> Result<Self> {
        let groups = LadderGroups::new(group_id, policy.topology())?;
        Ok(ListenerConfig {
            connection,
            groups,
            policy,
            session_timeout: Duration::from_secs(10),
            rebalance_timeout: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(3),
            handler_timeout: Duration::from_secs(30),
            handler_calls: HandlerCalls::Polled,
            shutdown_grace: Duration::from_secs(10),
            group_instance_id: None,
            group_protocol: GroupProtocol::Classic,
            assignment_strategy: AssignmentStrategy::Range,
            commit_interval: Duration::from_secs(1),
            commit_batch: 100,
            fetch_max_bytes: 1 << 20,
            retry_fetch_max_bytes: 64 << 10,
            fetch_max_wait: Duration::from_millis(500),
            offset_reset: OffsetReset::Earliest,
            isolation_level: IsolationLevel::ReadCommitted,
            max_batch_inflated: None,
            publish_compression: Compression::AsSource,
            publish_backoff_initial: Duration::from_millis(100),
            publish_backoff_max: Duration::from_secs(10),
            publish_max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            publish_stall_after: Duration::from_secs(60),
            dlq_poll_interval: Duration::from_secs(15),
            pause_poll_interval: Some(Duration::from_secs(2)),
            partition_check_interval: Duration::from_secs(30),
            window: retry_core::window::WindowConfig::default(),
            brake: None,
            tracing: crate::Tracing::Off,
        })
    }

    /// The ladder's topics and decisions.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The consumer group of each consumed topic, and the operators' groups.
    pub fn groups(&self) -> &LadderGroups {
        &self.groups
    }

    /// The most bytes one fetched batch may decompress to.
    pub(crate) fn max_batch_inflated_bytes(&self) -> usize {
        self.max_batch_inflated.unwrap_or_else(|| (32 * self.fetch_max_bytes.max(0) as usize).max(16 << 20))
    }

    /// The timing settings, to check and use together.
    pub(crate) fn timings(&self) -> session::Timings {
        session::Timings {
            request_timeout: self.connection.request_timeout,
            session_timeout: self.session_timeout,
            heartbeat_interval: self.heartbeat_interval,
            rebalance_timeout: self.rebalance_timeout,
            handler_timeout: self.handler_timeout,
            shutdown_grace: self.shutdown_grace,
        }
    }

    /// The coordinator's connections: requests bounded within the session.
    pub(crate) fn group_connection(&self) -> ConnectionConfig {
        let bound = session::request_bound(self.connection.request_timeout, self.session_timeout);
        self.connection.clone().bounded(bound)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let problem = if let Some(p) = self.timings().problem() {
            Some(("ListenerConfig's timeouts", p))
        } else if self.fetch_max_bytes < 1024 || self.retry_fetch_max_bytes < 1024 {
            Some((
                "ListenerConfig::fetch_max_bytes",
                "fetch_max_bytes and retry_fetch_max_bytes must be at least 1024".to_owned(),
            ))
        } else if self.publish_backoff_initial.is_zero() || self.publish_backoff_initial > self.publish_backoff_max {
            Some((
                "ListenerConfig::publish_backoff_initial",
                "publish_backoff_initial must be positive and at most publish_backoff_max".to_owned(),
            ))
        } else if self.pause_poll_interval.is_some_and(|i| i.is_zero()) {
            Some(("ListenerConfig::pause_poll_interval", "must be positive".to_owned()))
        } else if self.dlq_poll_interval.is_zero() {
            Some((
                "ListenerConfig::dlq_poll_interval",
                "must be positive (DLQ_POLL_INTERVAL for billing-bin)".to_owned(),
            ))
        } else if self.publish_max_request_bytes < 1024 {
            Some(("ListenerConfig::publish_max_request_bytes", "must be at least 1024".to_owned()))
        } else if self.max_batch_inflated_bytes() < self.fetch_max_bytes.max(self.retry_fetch_max_bytes) as usize {
            Some((
                "ListenerConfig::max_batch_inflated",
                "must be at least fetch_max_bytes and retry_fetch_max_bytes".to_owned(),
            ))
        } else {
            self.group_instance_id
                .as_deref()
                .and_then(instance_id_problem)
                .map(|p| ("ListenerConfig::group_instance_id", p))
        };
        match problem {
            Some((setting, problem)) => Err(Error::setting(setting, problem)),
            None => Ok(()),
        }
    }
}

/// Why `id` cannot be a `group.instance.id`: Kafka takes what a topic
/// name may be (at most 249 of `a-z A-Z 0-9 . _ -`).
fn instance_id_problem(id: &str) -> Option<String> {
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if id.is_empty() || id.len() > 249 || !id.chars().all(legal) || id == "." || id == ".." {
        Some(format!(
            "group_instance_id {id:?} is not a valid group.instance.id: 1 to 249 of a-z, A-Z, 0-9, '.', '_' and '-'"
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use retry_core::{RetryPolicy, RetryTopology};

    use super::ListenerConfig;
    use crate::{ConnectionConfig, Error};

    /// The setting `validate` names after `change`, or none.
    fn check(change: fn(&mut ListenerConfig), expected: Option<&str>) {
        let policy =
            RetryPolicy::new(RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap(), Default::default());
        let connection = ConnectionConfig::new("127.0.0.1:9092", "test").unwrap();
        let mut config = ListenerConfig::new(connection, "billing", policy).unwrap();
        change(&mut config);
        let named = match config.validate() {
            Ok(()) => None,
            Err(Error::InvalidSetting { setting, .. }) => Some(setting),
            Err(e) => panic!("{e}"),
        };
        assert_eq!(named, expected);
    }

    #[test]
    fn each_refusal_names_its_setting() {
        check(|_| {}, None);
        check(|c| c.pause_poll_interval = None, None);
        check(|c| c.pause_poll_interval = Some(Duration::ZERO), Some("ListenerConfig::pause_poll_interval"));
        check(|c| c.dlq_poll_interval = Duration::ZERO, Some("ListenerConfig::dlq_poll_interval"));
        check(|c| c.fetch_max_bytes = 10, Some("ListenerConfig::fetch_max_bytes"));
        check(|c| c.publish_max_request_bytes = 10, Some("ListenerConfig::publish_max_request_bytes"));
        check(|c| c.group_instance_id = Some("no spaces".into()), Some("ListenerConfig::group_instance_id"));
    }
}
