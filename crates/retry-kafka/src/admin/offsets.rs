use std::collections::BTreeMap;

use crate::{protocol::group::GroupClient, ConnectionConfig, Result, TopicPartition};

/// A consumer group's state, as its coordinator says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupState {
    /// Kafka's name for it: `Stable` (every member runs what it was
    /// assigned), `PreparingRebalance` and `CompletingRebalance` (classic),
    /// `Assigning` and `Reconciling` (consumer group protocol), `Empty`, `Dead`.
    pub state: String,
    /// How many members it has.
    pub members: usize,
}

impl GroupState {
    /// Whether every member runs what it was assigned, nothing moving.
    pub fn is_stable(&self) -> bool {
        self.state == "Stable"
    }
}

/// A group's committed offsets, read and written from outside the group:
/// what operators' tools and tests use. Offsets are ordinary group offsets,
/// visible to every Kafka client's `OffsetFetch`.
pub struct GroupOffsets {
    client: GroupClient,
}

impl GroupOffsets {
    /// A client for `group_id`'s offsets.
    pub fn new(config: ConnectionConfig, group_id: &str) -> Self {
        GroupOffsets { client: GroupClient::new(config, group_id).for_tools() }
    }

    /// The committed offsets (the next offset to read) of `partitions`;
    /// `None` where nothing was committed.
    pub async fn committed(&mut self, partitions: &[TopicPartition]) -> Result<BTreeMap<TopicPartition, Option<i64>>> {
        self.client.committed(partitions).await
    }

    /// The group's state now, as its coordinator says it.
    pub async fn state(&mut self) -> Result<GroupState> {
        let (state, members) = self.client.describe().await?;
        Ok(GroupState { state, members })
    }

    /// Commits `offsets` without being a member of the group (generation -1),
    /// as admin tools do. The broker refuses while the group has members.
    pub async fn commit(&mut self, offsets: &BTreeMap<TopicPartition, i64>) -> Result<()> {
        self.client.commit(-1, "", offsets).await
    }
}
