//! Prometheus metrics of a listener. Names and labels are part of the API:
//! dashboards and the alert rules in `docker/prometheus/alerts.yml` use them.
//!
//! | metric | labels | meaning |
//! | --- | --- | --- |
//! | `kafka_retry_records_total` | `topic`, `outcome` | records done: `success`, `retry`, `dead_letter` |
//! | `kafka_retry_handler_duration_seconds` | `topic` | handler call durations (histogram) |
//! | `kafka_retry_publish_failures_total` | `topic` | failed publish attempts to a retry or dead-letter topic |
//! | `kafka_retry_commit_failures_total` | `group` | failed offset commits |
//! | `kafka_retry_rebalances_total` | `group` | assignments received |
//! | `kafka_retry_offset_resets_total` | `topic` | positions reset (committed offset out of range) |
//! | `kafka_retry_consumer_lag` | `topic`, `partition` | high watermark minus the position |
//! | `kafka_retry_dlq_backlog` | `topic` | dead-letter records not yet replayed or acknowledged |
//! | `kafka_retry_partition_stalled` | `topic`, `partition` | 1 while the partition's republications keep failing (the broker refuses them), else 0 |

use std::time::Duration;

use prometheus_client::{
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
    },
    registry::{Registry, Unit},
};

type Labels = Vec<(&'static str, String)>;

/// Every metric of one listener; cheap to clone (the families are shared).
#[derive(Clone)]
pub(crate) struct Metrics {
    records: Family<Labels, Counter>,
    handler_duration: Family<Labels, Histogram, fn() -> Histogram>,
    publish_failures: Family<Labels, Counter>,
    commit_failures: Family<Labels, Counter>,
    rebalances: Family<Labels, Counter>,
    offset_resets: Family<Labels, Counter>,
    consumer_lag: Family<Labels, Gauge>,
    dlq_backlog: Family<Labels, Gauge>,
    stalled: Family<Labels, Gauge>,
}

fn handler_buckets() -> Histogram {
    // 5 ms to about 40 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Handles on one topic's per-record metrics.
pub(crate) struct TopicMetrics {
    success: Counter,
    retry: Counter,
    dead_letter: Counter,
    handler_duration: Histogram,
}

impl TopicMetrics {
    pub(crate) fn record_done(&self, outcome: Outcome, n: u64) {
        let counter = match outcome {
            Outcome::Success => &self.success,
            Outcome::Retry => &self.retry,
            Outcome::DeadLetter => &self.dead_letter,
        };
        if n > 0 {
            counter.inc_by(n);
        }
    }

    pub(crate) fn handler_took(&self, d: Duration) {
        self.handler_duration.observe(d.as_secs_f64());
    }
}

/// A record's outcome, as the `outcome` label says it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    Success,
    Retry,
    DeadLetter,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Retry => "retry",
            Outcome::DeadLetter => "dead_letter",
        }
    }
}

fn topic(t: &str) -> Labels {
    vec![("topic", t.to_owned())]
}

fn group(g: &str) -> Labels {
    vec![("group", g.to_owned())]
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            records: Family::default(),
            handler_duration: Family::new_with_constructor(handler_buckets),
            publish_failures: Family::default(),
            commit_failures: Family::default(),
            rebalances: Family::default(),
            offset_resets: Family::default(),
            consumer_lag: Family::default(),
            dlq_backlog: Family::default(),
            stalled: Family::default(),
        }
    }
}

impl Metrics {
    /// Registers every metric in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        let r = registry;
        r.register("kafka_retry_records", "Records done, by topic and outcome", self.records.clone());
        r.register_with_unit(
            "kafka_retry_handler_duration",
            "Handler call durations",
            Unit::Seconds,
            self.handler_duration.clone(),
        );
        r.register(
            "kafka_retry_publish_failures",
            "Failed publish attempts to retry and dead-letter topics",
            self.publish_failures.clone(),
        );
        r.register("kafka_retry_commit_failures", "Failed offset commits", self.commit_failures.clone());
        r.register("kafka_retry_rebalances", "Assignments received", self.rebalances.clone());
        r.register(
            "kafka_retry_offset_resets",
            "Positions reset by the offset reset policy",
            self.offset_resets.clone(),
        );
        r.register(
            "kafka_retry_consumer_lag",
            "High watermark minus the consumer's position",
            self.consumer_lag.clone(),
        );
        r.register(
            "kafka_retry_dlq_backlog",
            "Dead-letter records neither replayed nor acknowledged by the operators' group",
            self.dlq_backlog.clone(),
        );
        r.register(
            "kafka_retry_partition_stalled",
            "1 while a partition cannot publish its retries or dead letters",
            self.stalled.clone(),
        );
    }

    /// The per-record metrics of one consumed topic, looked up once, so the
    /// record path only bumps shared atomics.
    pub(crate) fn for_topic(&self, source: &str) -> TopicMetrics {
        let records = |outcome: Outcome| {
            self.records
                .get_or_create(&vec![("topic", source.to_owned()), ("outcome", outcome.label().to_owned())])
                .clone()
        };
        TopicMetrics {
            success: records(Outcome::Success),
            retry: records(Outcome::Retry),
            dead_letter: records(Outcome::DeadLetter),
            handler_duration: self.handler_duration.get_or_create(&topic(source)).clone(),
        }
    }

    pub(crate) fn publish_failed(&self, target: &str) {
        self.publish_failures.get_or_create(&topic(target)).inc();
    }

    pub(crate) fn commit_failed(&self, group_id: &str) {
        self.commit_failures.get_or_create(&group(group_id)).inc();
    }

    pub(crate) fn rebalanced(&self, group_id: &str) {
        self.rebalances.get_or_create(&group(group_id)).inc();
    }

    pub(crate) fn offset_reset(&self, t: &str) {
        self.offset_resets.get_or_create(&topic(t)).inc();
    }

    pub(crate) fn lag(&self, t: &str, partition: i32, lag: i64) {
        self.consumer_lag
            .get_or_create(&vec![("topic", t.to_owned()), ("partition", partition.to_string())])
            .set(lag.max(0));
    }

    pub(crate) fn stalled(&self, t: &str, partition: i32, stalled: bool) {
        self.stalled
            .get_or_create(&vec![("topic", t.to_owned()), ("partition", partition.to_string())])
            .set(i64::from(stalled));
    }

    pub(crate) fn dlq_backlog(&self, t: &str, backlog: i64) {
        self.dlq_backlog.get_or_create(&topic(t)).set(backlog.max(0));
    }
}
