//! The public entry point: a listener consumes a source topic and its retry
//! rungs, one consumer group each, and runs the handler on every record.

use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{
    admin::{dlq::BacklogMonitor, pause::PauseRecord},
    connection::cluster::Cluster,
    consumer::{
        brake::{BrakeStatus, SharedBrake},
        config::ListenerConfig,
        consumer_protocol::ConsumerMember,
        cooperative::CooperativeMember,
        member::Member,
        pause::PauseWatch,
        shared::Shared,
    },
    metrics::{Metrics, MetricsExposition},
    protocol::group::check_consumer_protocol,
    publisher::Publisher,
    stats::ListenerStats,
    AssignmentStrategy, DeadLetterAdmin, GroupProtocol, RecordHandler, Result, TopicPlan,
};

/// A running listener. Dropping it stops nothing: call
/// [`shutdown`](Self::shutdown) to stop gracefully.
pub struct Listener {
    shutdown: CancellationToken,
    tasks: JoinSet<()>,
    stats: Arc<ListenerStats>,
    metrics: Metrics,
    ready: Readiness,
    brake: BrakeView,
}

/// The brake and the operators' pause of a listener, as operators see
/// them; cheap to clone, so an operators' endpoint can hold one.
#[derive(Clone)]
pub struct BrakeView(Arc<SharedBrake>);

impl BrakeView {
    /// What they are doing now.
    pub fn status(&self) -> BrakeStatus {
        self.0.status()
    }
}

impl std::fmt::Debug for BrakeView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BrakeView").field(&self.status()).finish()
    }
}

/// Whether a listener takes part in all its groups yet; cheap to clone, so a
/// health endpoint can hold one.
#[derive(Clone)]
pub struct Readiness(Arc<dyn Fn() -> bool + Send + Sync>);

impl Readiness {
    /// True once every group member has received its first assignment, and
    /// while no partition is stalled, no handler call outlives its
    /// abandonment, no member rejoins after the group evicted it, and none
    /// was fenced by another instance with its `group_instance_id`.
    pub fn is_ready(&self) -> bool {
        (self.0)()
    }
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Readiness").field(&self.is_ready()).finish()
    }
}

/// How long a listener's start-up check waits for topics the cluster does
/// not list yet: just created, they reach every broker a moment after the
/// controller answered CreateTopics.
const NEW_TOPICS_SETTLE: std::time::Duration = std::time::Duration::from_secs(3);

/// The start-up check of the ladder's topics: missing topics are looked for
/// again for [`NEW_TOPICS_SETTLE`] (the broker asked may not know them yet);
/// what is still wrong then, or wrong at once (too few partitions), fails.
async fn verify_topics(cluster: &Cluster, plan: &TopicPlan) -> Result<()> {
    let give_up = tokio::time::Instant::now() + NEW_TOPICS_SETTLE;
    loop {
        match plan.verify_with(cluster).await {
            Err(crate::Error::Topics(problems))
                if tokio::time::Instant::now() < give_up
                    && problems.0.iter().all(|p| matches!(p, crate::TopicProblem::Missing { .. })) =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            result => return result,
        }
    }
}

impl Listener {
    /// Connects, verifies that every topic of the ladder exists with enough
    /// partitions (refusing to start otherwise, naming each problem), and
    /// starts one group member per consumed topic.
    pub async fn start<H: RecordHandler>(config: ListenerConfig, handler: Arc<H>) -> Result<Listener> {
        config.validate()?;
        let cluster = Arc::new(Cluster::connect(&config.connection).await?);
        verify_topics(&cluster, &TopicPlan::new(config.policy.topology().clone(), 1)).await?;
        let stats = Arc::new(ListenerStats::default());
        let metrics = Metrics::new(stats.clone());
        let shared = Arc::new(Shared {
            publisher: Arc::new(Publisher::new(
                cluster.clone(),
                &config.connection,
                config.publish_max_request_bytes,
                stats.publish_splits.clone(),
            )),
            cluster,
            handler,
            members_joined: Default::default(),
            stalled: Default::default(),
            impaired: Default::default(),
            brake: Arc::new(SharedBrake::new(
                config.brake,
                metrics.clone(),
                config.policy.topology().source_topic().as_str(),
            )),
            metrics: metrics.clone(),
            spans: crate::telemetry::Spans::new(config.tracing),
            config,
        });
        let shutdown = CancellationToken::new();
        let mut tasks = JoinSet::new();
        if let Some(interval) = shared.config.pause_poll_interval {
            let record = PauseRecord::new(
                shared.config.group_connection(),
                &shared.config.groups,
                shared.config.policy.topology(),
            );
            let watch = PauseWatch { record, interval, brake: shared.brake.clone() };
            // Read before any record can run; then every interval.
            watch.read().await;
            tasks.spawn(watch.run(shutdown.clone()));
        }
        let consumed = shared.config.groups.consumed(shared.config.policy.topology());
        if shared.config.group_protocol == GroupProtocol::Consumer {
            // Refused here, with what to do, rather than by every member.
            let source_group = shared.config.groups.of(retry_core::Stage::SOURCE).expect("the source has a group");
            check_consumer_protocol(&shared.config.group_connection(), source_group).await?;
        }
        let mut members = 0;
        for retry_core::groups::ConsumedTopic { stage, topic, group: group_id } in consumed {
            let (topic, group_id) = (topic.to_owned(), group_id.to_owned());
            let shutdown = shutdown.clone();
            match (shared.config.group_protocol, shared.config.assignment_strategy) {
                (GroupProtocol::Classic, AssignmentStrategy::Range) => {
                    tasks.spawn(Member { shared: shared.clone(), stage, topic, group_id, shutdown }.run());
                }
                (GroupProtocol::Classic, AssignmentStrategy::CooperativeSticky) => {
                    tasks.spawn(CooperativeMember { shared: shared.clone(), stage, topic, group_id, shutdown }.run());
                }
                (GroupProtocol::Consumer, _) => {
                    tasks.spawn(ConsumerMember { shared: shared.clone(), stage, topic, group_id, shutdown }.run());
                }
            }
            members += 1;
        }
        let ready = {
            let shared = shared.clone();
            Readiness(Arc::new(move || {
                use std::sync::atomic::Ordering::Relaxed;
                ready(
                    members,
                    shared.members_joined.load(Relaxed),
                    shared.stalled.load(Relaxed),
                    shared.impaired.load(Relaxed),
                )
            }))
        };
        let monitor = BacklogMonitor {
            admin: DeadLetterAdmin::with_cluster(
                shared.cluster.clone(),
                shared.config.connection.clone(),
                shared.config.policy.clone(),
                &shared.config.groups,
            ),
            interval: shared.config.dlq_poll_interval,
            metrics: metrics.clone(),
        };
        tasks.spawn(monitor.run(shutdown.clone()));
        let brake = BrakeView(shared.brake.clone());
        Ok(Listener { shutdown, tasks, stats, metrics, ready, brake })
    }

    /// Whether every group member has received its first assignment (the
    /// topics were verified and the listener takes part in all its groups),
    /// no partition is stalled on republications the broker refuses, no
    /// handler call ignored its cancellation and runs on, and no member is
    /// evicted or fenced (see [`Readiness::is_ready`]).
    pub fn is_ready(&self) -> bool {
        self.ready.is_ready()
    }

    /// A handle on [`is_ready`](Self::is_ready) that outlives borrows of the listener.
    pub fn readiness(&self) -> Readiness {
        self.ready.clone()
    }

    /// A handle on the listener's brake and the operators' pause.
    pub fn brake(&self) -> BrakeView {
        self.brake.clone()
    }

    /// The listener's Prometheus metrics, to serve (see
    /// [`MetricsExposition`] for their names and labels).
    pub fn metrics(&self) -> MetricsExposition {
        MetricsExposition::of(&self.metrics)
    }

    /// The listener's counters.
    pub fn stats(&self) -> &Arc<ListenerStats> {
        &self.stats
    }

    /// Stops fetching, lets records in flight finish within the grace
    /// period, commits, and leaves every group.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        while self.tasks.join_next().await.is_some() {}
    }

    /// Stops at once, as a crash would: nothing more is committed and no
    /// group is left (the coordinator expires the members after the session
    /// timeout). For tests of crash recovery.
    pub fn abort(mut self) {
        self.tasks.abort_all();
        self.tasks.detach_all();
    }
}

/// Whether a listener of `members` group members is ready: each received
/// its first assignment, no partition is stalled, nothing impairs it (a
/// detached call, a member rejoining or fenced).
fn ready(members: usize, joined: usize, stalled: usize, impaired: usize) -> bool {
    joined >= members && stalled == 0 && impaired == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness() {
        // (members, joined, stalled, impaired) -> ready
        let table = [
            ((4, 4, 0, 0), true),
            ((4, 3, 0, 0), false),
            ((4, 5, 0, 0), true), // a member that rejoined counts again
            ((4, 4, 1, 0), false),
            ((4, 4, 0, 1), false),
            ((1, 0, 0, 0), false),
        ];
        for ((members, joined, stalled, impaired), expected) in table {
            assert_eq!(ready(members, joined, stalled, impaired), expected, "{members} {joined} {stalled} {impaired}");
        }
    }
}
