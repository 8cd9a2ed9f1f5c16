//! Prometheus metrics of a listener. Names and labels are part of the API:
//! dashboards and the alert rules in `docker/prometheus/alerts.yml` use them.
//! Each event is reported once, here: the methods below count it in the
//! Prometheus family and in the [`ListenerStats`] a program reads, so the
//! two never disagree. Their names and labels: [`MetricsExposition`].

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

use std::sync::{
    atomic::{AtomicU64, Ordering::Relaxed},
    Arc,
};

use crate::ListenerStats;

type Labels = Vec<(&'static str, String)>;

/// A listener's Prometheus metrics, as a `/metrics` endpoint serves them:
/// cheap to clone, so the endpoint can hold one (from
/// [`Listener::metrics`](crate::Listener::metrics)). Names and labels are
/// part of the API: dashboards and the alert rules in
/// `docker/prometheus/alerts.yml` use them.
///
/// | metric | labels | meaning |
/// | --- | --- | --- |
/// | `kafka_retry_records_total` | `topic`, `outcome` | records done: `success`, `retry`, `dead_letter` |
/// | `kafka_retry_handler_duration_seconds` | `topic` | handler call durations (histogram) |
/// | `kafka_retry_publish_failures_total` | `topic` | failed publish attempts to a retry or dead-letter topic |
/// | `kafka_retry_commit_failures_total` | `group` | failed offset commits |
/// | `kafka_retry_rebalances_total` | `group` | assignments received |
/// | `kafka_retry_offset_resets_total` | `topic` | positions reset (committed offset out of range) |
/// | `kafka_retry_malformed_trace_context_total` | `topic` | records whose `traceparent` could not be taken (handled as if they had none) |
/// | `kafka_retry_consumer_lag` | `topic`, `partition` | high watermark minus the position |
/// | `kafka_retry_dlq_backlog` | `topic` | dead-letter records not yet replayed or acknowledged |
/// | `kafka_retry_dlq_lost_to_retention` | `topic` | dead-letter records retention deleted before operators replayed or acknowledged them |
/// | `kafka_retry_partition_stalled` | `topic`, `partition` | 1 while the partition's republications keep failing (the broker refuses them), else 0 |
/// | `kafka_retry_brake_state` | `topic` (the source) | the outage brake: 0 running, 1 probing, 2 paused (absent when the brake is off) |
/// | `kafka_retry_brake_engagements_total` | `topic` (the source) | how often the brake engaged |
/// | `kafka_retry_listener_paused` | `topic` (the source) | 1 while the operators' pause holds the listener's records, else 0 |
/// | `kafka_retry_member_evictions_total` | `group` | members the group dropped while they drained their partitions, or fenced by another instance with their `group.instance.id` |
/// | `kafka_retry_worker_failures_total` | `group` | partition workers that ended while their partition was assigned (a bug: the member rejoins) |
/// | `kafka_retry_detached_handler_calls` | `topic` | handler calls that ignored their cancellation and still run (the listener is not ready meanwhile) |
#[derive(Clone)]
pub struct MetricsExposition(Arc<Registry>);

impl MetricsExposition {
    /// The content type of [`encode`](Self::encode)'s text.
    pub const CONTENT_TYPE: &'static str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

    pub(crate) fn of(metrics: &Metrics) -> MetricsExposition {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        MetricsExposition(Arc::new(registry))
    }

    /// The metrics now, in the OpenMetrics text format (`# EOF` included).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.0).expect("writing to a String does not fail");
        text
    }

    /// The value of the sample `name{labels}` (labels as written in the
    /// text, e.g. `topic="orders",partition="0"`), if it is there.
    pub fn sample(&self, name: &str, labels: &str) -> Option<f64> {
        let prefix = if labels.is_empty() { format!("{name} ") } else { format!("{name}{{{labels}}} ") };
        self.encode().lines().find_map(|line| line.strip_prefix(&prefix)?.trim().parse().ok())
    }
}

impl std::fmt::Debug for MetricsExposition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsExposition").finish_non_exhaustive()
    }
}

/// Every metric of one listener; cheap to clone (the families are shared).
#[derive(Clone)]
pub(crate) struct Metrics {
    records: Family<Labels, Counter>,
    handler_duration: Family<Labels, Histogram, fn() -> Histogram>,
    publish_failures: Family<Labels, Counter>,
    commit_failures: Family<Labels, Counter>,
    rebalances: Family<Labels, Counter>,
    offset_resets: Family<Labels, Counter>,
    malformed_trace_context: Family<Labels, Counter>,
    consumer_lag: Family<Labels, Gauge>,
    dlq_backlog: Family<Labels, Gauge>,
    dlq_lost: Family<Labels, Gauge>,
    stalled: Family<Labels, Gauge>,
    brake_state: Family<Labels, Gauge>,
    brake_engagements: Family<Labels, Counter>,
    paused: Family<Labels, Gauge>,
    evictions: Family<Labels, Counter>,
    worker_failures: Family<Labels, Counter>,
    detached_calls: Family<Labels, Gauge>,
    blocking_calls: Family<Labels, Counter>,
    stats: Arc<ListenerStats>,
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
    stats: Arc<ListenerStats>,
}

impl TopicMetrics {
    pub(crate) fn record_done(&self, outcome: Outcome, n: u64) {
        let (counter, stat) = match outcome {
            Outcome::Success => (&self.success, &self.stats.succeeded),
            Outcome::Retry => (&self.retry, &self.stats.retried),
            Outcome::DeadLetter => (&self.dead_letter, &self.stats.dead_lettered),
        };
        if n > 0 {
            counter.inc_by(n);
            stat.fetch_add(n, Relaxed);
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

impl Metrics {
    /// Metrics that also count in `stats`.
    pub(crate) fn new(stats: Arc<ListenerStats>) -> Self {
        Metrics {
            records: Family::default(),
            handler_duration: Family::new_with_constructor(handler_buckets),
            publish_failures: Family::default(),
            commit_failures: Family::default(),
            rebalances: Family::default(),
            offset_resets: Family::default(),
            malformed_trace_context: Family::default(),
            consumer_lag: Family::default(),
            dlq_backlog: Family::default(),
            dlq_lost: Family::default(),
            stalled: Family::default(),
            brake_state: Family::default(),
            brake_engagements: Family::default(),
            paused: Family::default(),
            evictions: Family::default(),
            worker_failures: Family::default(),
            detached_calls: Family::default(),
            blocking_calls: Family::default(),
            stats,
        }
    }

    /// Counts an event that has no Prometheus metric of its own.
    pub(crate) fn count(&self, stat: impl FnOnce(&ListenerStats) -> &AtomicU64) {
        self.add(stat, 1);
    }

    /// Counts `n` events that have no Prometheus metric of their own.
    pub(crate) fn add(&self, stat: impl FnOnce(&ListenerStats) -> &AtomicU64, n: u64) {
        stat(&self.stats).fetch_add(n, Relaxed);
    }

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
            "kafka_retry_malformed_trace_context",
            "Records whose traceparent header could not be taken, handled as if they had none",
            self.malformed_trace_context.clone(),
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
            "kafka_retry_dlq_lost_to_retention",
            "Dead-letter records retention deleted before the operators' group replayed or acknowledged them",
            self.dlq_lost.clone(),
        );
        r.register(
            "kafka_retry_partition_stalled",
            "1 while a partition cannot publish its retries or dead letters",
            self.stalled.clone(),
        );
        r.register(
            "kafka_retry_brake_state",
            "The outage brake: 0 running, 1 probing one record at a time, 2 paused",
            self.brake_state.clone(),
        );
        r.register(
            "kafka_retry_brake_engagements",
            "How often the outage brake engaged",
            self.brake_engagements.clone(),
        );
        r.register(
            "kafka_retry_listener_paused",
            "1 while the operators' pause holds the listener's records",
            self.paused.clone(),
        );
        r.register(
            "kafka_retry_member_evictions",
            "Group members dropped by the coordinator while they drained, or fenced by another instance",
            self.evictions.clone(),
        );
        r.register(
            "kafka_retry_worker_failures",
            "Partition workers that ended while their partition was assigned (the member rejoined)",
            self.worker_failures.clone(),
        );
        r.register(
            "kafka_retry_detached_handler_calls",
            "Handler calls that ignored their cancellation and still run",
            self.detached_calls.clone(),
        );
        r.register(
            "kafka_retry_blocking_handler_calls",
            "Polled handler calls that held their thread past their timeout",
            self.blocking_calls.clone(),
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
            stats: self.stats.clone(),
        }
    }

    /// A publish attempt failed; `target` is the topic of its first record.
    pub(crate) fn publish_failed(&self, target: Option<&str>) {
        self.count(|s| &s.publish_failures);
        if let Some(target) = target {
            self.publish_failures.get_or_create(&topic(target)).inc();
        }
    }

    pub(crate) fn commit_failed(&self, group_id: &str) {
        self.count(|s| &s.commit_failures);
        self.commit_failures.get_or_create(&group(group_id)).inc();
    }

    pub(crate) fn rebalanced(&self, group_id: &str) {
        self.count(|s| &s.rebalances);
        self.rebalances.get_or_create(&group(group_id)).inc();
    }

    pub(crate) fn offset_reset(&self, t: &str) {
        self.count(|s| &s.offset_resets);
        self.offset_resets.get_or_create(&topic(t)).inc();
    }

    pub(crate) fn malformed_trace_context(&self, t: &str) {
        self.count(|s| &s.malformed_trace_context);
        self.malformed_trace_context.get_or_create(&topic(t)).inc();
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

    pub(crate) fn brake_state(&self, t: &str, state: retry_core::brake::BrakeState) {
        self.brake_state.get_or_create(&topic(t)).set(state.gauge());
    }

    pub(crate) fn listener_paused(&self, t: &str, paused: bool) {
        self.paused.get_or_create(&topic(t)).set(i64::from(paused));
    }

    pub(crate) fn brake_engaged(&self, t: &str) {
        self.count(|s| &s.brake_engagements);
        self.brake_engagements.get_or_create(&topic(t)).inc();
    }

    pub(crate) fn evicted(&self, group_id: &str) {
        self.count(|s| &s.evictions);
        self.evictions.get_or_create(&group(group_id)).inc();
    }

    pub(crate) fn worker_failed(&self, group_id: &str) {
        self.count(|s| &s.worker_failures);
        self.worker_failures.get_or_create(&group(group_id)).inc();
    }

    /// A handler call on `t` ignored its cancellation (`running`: it runs
    /// on, detached) or ended at last (`!running`).
    pub(crate) fn detached_call(&self, t: &str, running: bool) {
        let gauge = self.detached_calls.get_or_create(&topic(t));
        if running {
            self.count(|s| &s.detached_calls);
            gauge.inc();
        } else {
            gauge.dec();
        }
    }

    /// A polled handler call on `t` held its thread past its timeout.
    pub(crate) fn blocking_call(&self, t: &str) {
        self.blocking_calls.get_or_create(&topic(t)).inc();
        self.count(|s| &s.blocking_calls);
    }

    pub(crate) fn dlq_backlog(&self, t: &str, backlog: i64) {
        self.dlq_backlog.get_or_create(&topic(t)).set(backlog.max(0));
    }

    pub(crate) fn dlq_lost_to_retention(&self, t: &str, lost: i64) {
        self.dlq_lost.get_or_create(&topic(t)).set(lost.max(0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of one sample in the text exposition.
    fn sample(text: &str, series: &str) -> u64 {
        let line = text.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("no {series} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn every_event_counts_in_the_metric_and_in_the_stats_alike() {
        let stats = Arc::new(ListenerStats::default());
        let metrics = Metrics::new(stats.clone());
        let orders = metrics.for_topic("orders");
        orders.record_done(Outcome::Success, 3);
        orders.record_done(Outcome::Retry, 2);
        orders.record_done(Outcome::DeadLetter, 1);
        metrics.publish_failed(Some("orders.retry-5s"));
        metrics.commit_failed("billing");
        metrics.rebalanced("billing");
        metrics.rebalanced("billing.retry-5s");
        metrics.offset_reset("orders");
        metrics.malformed_trace_context("orders");
        metrics.evicted("billing");
        metrics.worker_failed("billing");
        metrics.detached_call("orders", true);
        metrics.blocking_call("orders");
        metrics.dlq_backlog("orders.dlq", 4);
        metrics.dlq_lost_to_retention("orders.dlq", 2);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();

        let snapshot = stats.snapshot();
        let records = |outcome: &str| {
            sample(&text, &format!(r#"kafka_retry_records_total{{topic="orders",outcome="{outcome}"}}"#))
        };
        assert_eq!((records("success"), snapshot.succeeded), (3, 3));
        assert_eq!((records("retry"), snapshot.retried), (2, 2));
        assert_eq!((records("dead_letter"), snapshot.dead_lettered), (1, 1));
        let publish = sample(&text, r#"kafka_retry_publish_failures_total{topic="orders.retry-5s"}"#);
        assert_eq!((publish, snapshot.publish_failures), (1, 1));
        let commits = sample(&text, r#"kafka_retry_commit_failures_total{group="billing"}"#);
        assert_eq!((commits, snapshot.commit_failures), (1, 1));
        let rebalances = sample(&text, r#"kafka_retry_rebalances_total{group="billing"}"#)
            + sample(&text, r#"kafka_retry_rebalances_total{group="billing.retry-5s"}"#);
        assert_eq!((rebalances, snapshot.rebalances), (2, 2));
        let resets = sample(&text, r#"kafka_retry_offset_resets_total{topic="orders"}"#);
        assert_eq!((resets, snapshot.offset_resets), (1, 1));
        let malformed = sample(&text, r#"kafka_retry_malformed_trace_context_total{topic="orders"}"#);
        assert_eq!((malformed, snapshot.malformed_trace_context), (1, 1));
        let evictions = sample(&text, r#"kafka_retry_member_evictions_total{group="billing"}"#);
        assert_eq!((evictions, snapshot.evictions), (1, 1));
        let failures = sample(&text, r#"kafka_retry_worker_failures_total{group="billing"}"#);
        assert_eq!((failures, snapshot.worker_failures), (1, 1));
        let detached = sample(&text, r#"kafka_retry_detached_handler_calls{topic="orders"}"#);
        assert_eq!((detached, snapshot.detached_calls), (1, 1));
        let blocking = sample(&text, r#"kafka_retry_blocking_handler_calls_total{topic="orders"}"#);
        assert_eq!((blocking, snapshot.blocking_calls), (1, 1));
        assert_eq!(sample(&text, r#"kafka_retry_dlq_backlog{topic="orders.dlq"}"#), 4);
        assert_eq!(sample(&text, r#"kafka_retry_dlq_lost_to_retention{topic="orders.dlq"}"#), 2);
    }
}
