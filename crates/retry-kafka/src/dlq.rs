//! The dead-letter backlog: records in the dead-letter topic that operators
//! have neither replayed nor acknowledged. Operators' decisions advance the
//! committed offsets of the operators' group (`<group>.dlq-operators`), so
//! the backlog is the end offset minus that group's position, per partition,
//! counting only records retention still keeps.

use std::{sync::Arc, time::Duration};

use rskafka::client::{
    partition::{OffsetAt, UnknownTopicHandling},
    Client,
};
use tokio_util::sync::CancellationToken;

use crate::{group::GroupClient, metrics::Metrics, ConnectionConfig, Error, Result};

/// Measures the backlog every interval and sets `kafka_retry_dlq_backlog`.
pub(crate) struct BacklogMonitor {
    pub(crate) client: Arc<Client>,
    pub(crate) connection: ConnectionConfig,
    pub(crate) dead_letter_topic: String,
    pub(crate) operators_group: String,
    pub(crate) interval: Duration,
    pub(crate) metrics: Metrics,
}

impl BacklogMonitor {
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut offsets = GroupClient::new(self.connection.clone(), &self.operators_group);
        loop {
            match self.measure(&mut offsets).await {
                Ok(backlog) => self.metrics.dlq_backlog(&self.dead_letter_topic, backlog),
                Err(e) => {
                    tracing::warn!(topic = %self.dead_letter_topic, error = %e, "cannot measure the dead-letter backlog")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }

    async fn measure(&self, offsets: &mut GroupClient) -> Result<i64> {
        let topic = &self.dead_letter_topic;
        let client_error = |what: String| move |source| Error::Client { what, source };
        let topics = self.client.list_topics().await.map_err(client_error("listing topics".into()))?;
        let partitions: Vec<i32> = topics
            .into_iter()
            .find(|t| &t.name == topic)
            .map(|t| t.partitions.into_iter().collect())
            .unwrap_or_default();
        let tps: Vec<(String, i32)> = partitions.iter().map(|p| (topic.clone(), *p)).collect();
        let acknowledged = offsets.committed(&tps).await?;
        let mut backlog = 0;
        for (tp, acked) in acknowledged {
            let pc = self
                .client
                .partition_client(topic.clone(), tp.1, UnknownTopicHandling::Error)
                .await
                .map_err(client_error(format!("connecting to {topic}/{}", tp.1)))?;
            let end =
                pc.get_offset(OffsetAt::Latest).await.map_err(client_error(format!("end of {topic}/{}", tp.1)))?;
            let start =
                pc.get_offset(OffsetAt::Earliest).await.map_err(client_error(format!("start of {topic}/{}", tp.1)))?;
            backlog += end - acked.unwrap_or(start).max(start);
        }
        Ok(backlog.max(0))
    }
}
