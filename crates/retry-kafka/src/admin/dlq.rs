//! The dead-letter backlog gauge: records in the dead-letter topic that
//! operators have neither replayed nor acknowledged, as
//! [`DeadLetterAdmin::status`](crate::DeadLetterAdmin::status) counts them
//! (end offsets minus the operators' group position, within retention).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{metrics::Metrics, DeadLetterAdmin};

/// Measures the backlog every interval and sets `kafka_retry_dlq_backlog`
/// and `kafka_retry_dlq_lost_to_retention`.
pub(crate) struct BacklogMonitor {
    pub(crate) admin: DeadLetterAdmin,
    pub(crate) interval: Duration,
    pub(crate) metrics: Metrics,
}

impl BacklogMonitor {
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        // Logged when it changes, not at every measure: the gauge and its
        // alert say it for as long as it lasts.
        let mut lost = 0;
        loop {
            match self.admin.status().await {
                Ok(status) => {
                    self.metrics.dlq_backlog(&status.topic, status.backlog);
                    self.metrics.dlq_lost_to_retention(&status.topic, status.lost_to_retention);
                    let changed = status.lost_to_retention != lost;
                    lost = status.lost_to_retention;
                    if changed && lost > 0 {
                        tracing::error!(topic = %status.topic, lost = status.lost_to_retention, "retention deleted dead letters that operators had neither replayed nor acknowledged: raise the dead-letter topic's retention.ms, and acknowledge up to its oldest offset once the loss is handled");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot measure the dead-letter backlog"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}
