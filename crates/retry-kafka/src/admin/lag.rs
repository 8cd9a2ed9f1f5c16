//! The lag of a ladder's groups: for each consumed topic (the source and
//! every rung), its group's committed offsets behind the partitions' ends,
//! as any instance or an operators' tool reads them from the broker.

use std::{collections::BTreeMap, sync::Arc};

use retry_core::{groups::LadderGroups, RetryTopology};
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use tokio::sync::Mutex;

use crate::{
    connection::cluster::{deadline, Cluster},
    protocol::group::GroupClient,
    ConnectionConfig, Result, TopicPartition,
};

/// A consumed topic's lag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicLag {
    /// The topic (the source or a rung).
    pub topic: String,
    /// The group that consumes it.
    pub group: String,
    /// Each partition, in order.
    pub partitions: Vec<PartitionLag>,
}

impl TopicLag {
    /// The sum of the partitions' lags.
    pub fn lag(&self) -> i64 {
        self.partitions.iter().map(|p| p.lag).sum()
    }
}

/// A partition's lag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionLag {
    /// The partition.
    pub partition: i32,
    /// The group's committed offset, if it committed one.
    pub committed: Option<i64>,
    /// The next offset to be written.
    pub end: i64,
    /// The end minus the committed offset, or minus the earliest offset
    /// retention keeps when nothing was committed.
    pub lag: i64,
}

/// Reads the lag of every group of a ladder, keeping its connections.
pub(crate) struct LagReader {
    cluster: Arc<Cluster>,
    /// Each consumed topic with its group, the source first.
    consumed: Vec<(String, String)>,
    connection: ConnectionConfig,
    partitions: Mutex<BTreeMap<TopicPartition, Arc<PartitionClient>>>,
    groups: Mutex<BTreeMap<String, GroupClient>>,
}

impl LagReader {
    pub(crate) fn new(
        cluster: Arc<Cluster>,
        connection: ConnectionConfig,
        topology: &RetryTopology,
        groups: &LadderGroups,
    ) -> Self {
        let consumed = groups.consumed(topology).map(|c| (c.topic.to_owned(), c.group.to_owned())).collect();
        LagReader { cluster, consumed, connection, partitions: Mutex::default(), groups: Mutex::default() }
    }

    async fn partition(&self, tp: &TopicPartition) -> Result<Arc<PartitionClient>> {
        let mut clients = self.partitions.lock().await;
        if let Some(client) = clients.get(tp) {
            return Ok(client.clone());
        }
        let client =
            Arc::new(self.cluster.partition_client(&tp.topic, tp.partition, UnknownTopicHandling::Error).await?);
        clients.insert(tp.clone(), client.clone());
        Ok(client)
    }

    async fn offset(&self, pc: &PartitionClient, at: OffsetAt) -> Result<i64> {
        let what = || format!("offsets of {}/{}", pc.topic(), pc.partition());
        deadline(self.cluster.request_timeout(), what, pc.get_offset(at)).await
    }

    /// Every consumed topic's lag, the source first.
    pub(crate) async fn read(&self) -> Result<Vec<TopicLag>> {
        let listed = self.cluster.list_topics().await?;
        let mut out = Vec::new();
        for (topic, group) in &self.consumed {
            let mut partitions: Vec<i32> = listed
                .iter()
                .find(|t| &t.name == topic)
                .map(|t| t.partitions.iter().copied().collect())
                .unwrap_or_default();
            partitions.sort_unstable();
            let tps: Vec<TopicPartition> = partitions.iter().map(|p| TopicPartition::new(topic.clone(), *p)).collect();
            let committed = {
                let mut groups = self.groups.lock().await;
                let client = groups
                    .entry(group.clone())
                    .or_insert_with(|| GroupClient::new(self.connection.clone(), group).for_tools());
                client.committed(&tps).await?
            };
            let mut lags = Vec::new();
            for tp in &tps {
                let pc = self.partition(tp).await?;
                let end = self.offset(&pc, OffsetAt::Latest).await?;
                let committed = committed.get(tp).copied().flatten();
                let from = match committed {
                    Some(offset) => offset,
                    None => self.offset(&pc, OffsetAt::Earliest).await?,
                };
                lags.push(PartitionLag { partition: tp.partition, committed, end, lag: (end - from).max(0) });
            }
            out.push(TopicLag { topic: topic.clone(), group: group.clone(), partitions: lags });
        }
        Ok(out)
    }
}
