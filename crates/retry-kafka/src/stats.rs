use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters of a running listener, for programs and tests. Monotonic.
/// Every event that also has a Prometheus metric is counted by the same
/// call that counts the metric, so the two agree.
#[derive(Debug, Default)]
pub struct ListenerStats {
    pub(crate) succeeded: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) handler_panics: AtomicU64,
    pub(crate) handler_timeouts: AtomicU64,
    pub(crate) publish_failures: AtomicU64,
    /// Shared with the publisher, which splits requests.
    pub(crate) publish_splits: std::sync::Arc<AtomicU64>,
    pub(crate) commit_failures: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) rebalances: AtomicU64,
    pub(crate) offset_resets: AtomicU64,
    pub(crate) positions_kept: AtomicU64,
    pub(crate) fetch_failures: AtomicU64,
    pub(crate) undecodable_records: AtomicU64,
    pub(crate) past_idempotency_window: AtomicU64,
    pub(crate) aborted_records_skipped: AtomicU64,
    pub(crate) null_header_records: AtomicU64,
    pub(crate) malformed_trace_context: AtomicU64,
    pub(crate) brake_engagements: AtomicU64,
    pub(crate) held_by_brake: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) worker_failures: AtomicU64,
    pub(crate) detached_calls: AtomicU64,
    pub(crate) blocking_calls: AtomicU64,
    pub(crate) offset_fetch_failures: AtomicU64,
    pub(crate) partitions_started: AtomicU64,
    pub(crate) partitions_stopped: AtomicU64,
}

/// A copy of [`ListenerStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Records whose handler succeeded (committed).
    pub succeeded: u64,
    /// Records republished to a retry topic.
    pub retried: u64,
    /// Records published to the dead-letter topic.
    pub dead_lettered: u64,
    /// Handler panics (each became a permanent failure).
    pub handler_panics: u64,
    /// Handler timeouts (each became a transient failure).
    pub handler_timeouts: u64,
    /// Failed publish attempts (each retried with backoff).
    pub publish_failures: u64,
    /// Produce requests the broker refused as too large, split in two.
    pub publish_splits: u64,
    /// Failed offset commits.
    pub commit_failures: u64,
    /// Successful offset commits.
    pub commits: u64,
    /// Completed group joins (assignments received), all groups together.
    pub rebalances: u64,
    /// Positions reset because they lay outside the log (below its start
    /// or past its end, as its leader reported).
    pub offset_resets: u64,
    /// Positions a fetch doubted (OFFSET_OUT_OF_RANGE, or nothing above the
    /// high watermark) that the log's range confirmed, so kept: a stale
    /// view during a leader change.
    pub positions_kept: u64,
    /// Failed fetches (each retried with backoff).
    pub fetch_failures: u64,
    /// Records that could not be handled as they are (a header name that is
    /// not UTF-8, a batch that cannot be decoded), each dead-lettered as it is.
    pub undecodable_records: u64,
    /// Records whose event was older than the policy's
    /// [`max_event_age`](retry_core::PolicyConfig::max_event_age) when due,
    /// dead-lettered without a call of the handler.
    pub past_idempotency_window: u64,
    /// Records of aborted transactions left out (`read_committed`).
    pub aborted_records_skipped: u64,
    /// Records with headers whose value is null: the handler does not see
    /// those headers; republications keep them.
    pub null_header_records: u64,
    /// Records whose `traceparent` could not be taken (malformed, or there
    /// twice): handled as if they had none.
    pub malformed_trace_context: u64,
    /// How often the outage brake engaged.
    pub brake_engagements: u64,
    /// Times a record that exhausted the ladder was held back from the
    /// dead-letter topic because the brake was engaged (it ran again later).
    pub held_by_brake: u64,
    /// Group members dropped by the coordinator while they drained their
    /// partitions (or fenced by another instance with their instance id).
    pub evictions: u64,
    /// Partition workers that ended while their partition was assigned:
    /// a bug of the listener's; the member rejoined its group.
    pub worker_failures: u64,
    /// Handler calls that ignored their cancellation, given up on and
    /// left to run detached.
    pub detached_calls: u64,
    /// Polled handler calls that held their thread past their timeout
    /// (their partition waited; see [`HandlerCalls`](crate::HandlerCalls)).
    pub blocking_calls: u64,
    /// Failed reads of a group's committed offsets at the start of a
    /// generation (each retried within the generation).
    pub offset_fetch_failures: u64,
    /// Partition workers started (a partition assigned, or started again),
    /// all groups together.
    pub partitions_started: u64,
    /// Partition workers stopped by a rebalance, a lost membership or a
    /// shutdown: under the classic protocol every partition of the member
    /// at each rebalance, under the consumer group protocol only those
    /// that moved.
    pub partitions_stopped: u64,
}

impl ListenerStats {
    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            succeeded: self.succeeded.load(Relaxed),
            retried: self.retried.load(Relaxed),
            dead_lettered: self.dead_lettered.load(Relaxed),
            handler_panics: self.handler_panics.load(Relaxed),
            handler_timeouts: self.handler_timeouts.load(Relaxed),
            publish_failures: self.publish_failures.load(Relaxed),
            publish_splits: self.publish_splits.load(Relaxed),
            commit_failures: self.commit_failures.load(Relaxed),
            commits: self.commits.load(Relaxed),
            rebalances: self.rebalances.load(Relaxed),
            offset_resets: self.offset_resets.load(Relaxed),
            positions_kept: self.positions_kept.load(Relaxed),
            fetch_failures: self.fetch_failures.load(Relaxed),
            undecodable_records: self.undecodable_records.load(Relaxed),
            past_idempotency_window: self.past_idempotency_window.load(Relaxed),
            aborted_records_skipped: self.aborted_records_skipped.load(Relaxed),
            null_header_records: self.null_header_records.load(Relaxed),
            malformed_trace_context: self.malformed_trace_context.load(Relaxed),
            brake_engagements: self.brake_engagements.load(Relaxed),
            held_by_brake: self.held_by_brake.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            worker_failures: self.worker_failures.load(Relaxed),
            detached_calls: self.detached_calls.load(Relaxed),
            blocking_calls: self.blocking_calls.load(Relaxed),
            offset_fetch_failures: self.offset_fetch_failures.load(Relaxed),
            partitions_started: self.partitions_started.load(Relaxed),
            partitions_stopped: self.partitions_stopped.load(Relaxed),
        }
    }
}
