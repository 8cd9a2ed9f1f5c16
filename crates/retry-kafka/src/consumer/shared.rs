//! The state a listener's tasks share (its members, their workers, the
//! publisher), below all of them.

use std::sync::Arc;

use crate::{
    connection::cluster::Cluster, consumer::brake::SharedBrake, consumer::config::ListenerConfig, metrics::Metrics,
    publisher::Publisher,
};

/// State shared by a listener's tasks.
pub(crate) struct Shared<H> {
    pub(crate) config: ListenerConfig,
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) publisher: Arc<Publisher>,
    pub(crate) handler: Arc<H>,
    pub(crate) metrics: Metrics,
    /// How many group members received their first assignment.
    pub(crate) members_joined: std::sync::atomic::AtomicUsize,
    /// How many partitions cannot publish (see `publish_stall_after`).
    pub(crate) stalled: Arc<std::sync::atomic::AtomicUsize>,
    /// How many troubles make the listener not ready besides stalls (see [`Impaired`]).
    pub(crate) impaired: Arc<std::sync::atomic::AtomicUsize>,
    /// The listener's outage brake, shared by every worker.
    pub(crate) brake: Arc<SharedBrake>,
    /// Where the spans of attempts go (nowhere when tracing is off).
    pub(crate) spans: crate::telemetry::Spans,
}

/// A trouble that makes the listener not ready for as long as this lives:
/// a handler call that ignored its cancellation and runs on, a member that
/// rejoins after the group evicted it, or one fenced for good.
pub(crate) struct Impaired(Arc<std::sync::atomic::AtomicUsize>);

impl Impaired {
    pub(crate) fn new<H>(shared: &Shared<H>) -> Impaired {
        shared.impaired.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Impaired(shared.impaired.clone())
    }
}

impl Drop for Impaired {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Leaves partition workers that do not end after abandoning their
/// records (a handler call blocks its thread) to end detached: logged,
/// counted in `kafka_retry_detached_handler_calls`, and the listener not
/// ready until they end.
pub(crate) fn detach_workers<H>(shared: &Shared<H>, group_id: &str, topic: &str, mut stuck: tokio::task::JoinSet<()>) {
    tracing::error!(group = %group_id, workers = stuck.len(), waited = ?crate::session::DETACH_WAIT, "partition workers do not end after abandoning their records: a handler call blocks its thread; they end detached, and the listener is not ready until they do");
    let impaired = Impaired::new(shared);
    let metrics = shared.metrics.clone();
    let topic = topic.to_owned();
    for _ in 0..stuck.len() {
        metrics.detached_call(&topic, true);
    }
    tokio::spawn(async move {
        while stuck.join_next().await.is_some() {
            metrics.detached_call(&topic, false);
        }
        drop(impaired);
        tracing::info!(%topic, "detached partition workers ended at last");
    });
}
