//! Where the operators' pause of a listener is kept: the pause group's
//! committed offset on partition 0 of the source topic (see
//! [`retry_core::pause`]). Written by the operators' side, polled by every
//! instance of the listener.

use std::collections::BTreeMap;

use retry_core::{
    groups::LadderGroups,
    pause::{ListenerPause, RESUMED},
    RetryTopology,
};
use tokio::sync::Mutex;

use crate::{protocol::group::GroupClient, ConnectionConfig, Result, TopicPartition};

/// The pause of one listener, as its pause group keeps it.
pub(crate) struct PauseRecord {
    client: Mutex<GroupClient>,
    at: TopicPartition,
}

impl PauseRecord {
    pub(crate) fn new(connection: ConnectionConfig, groups: &LadderGroups, topology: &RetryTopology) -> Self {
        PauseRecord {
            client: Mutex::new(GroupClient::new(connection, groups.pause()).for_tools()),
            at: TopicPartition::new(topology.source_topic().as_str(), 0),
        }
    }

    /// The pause committed last, if it was not a resume.
    pub(crate) async fn read(&self) -> Result<Option<ListenerPause>> {
        let committed = self.client.lock().await.committed_with_metadata(std::slice::from_ref(&self.at)).await?;
        let (offset, metadata) = committed.get(&self.at).cloned().unwrap_or_default();
        Ok(ListenerPause::read(offset, metadata.as_deref()))
    }

    /// Commits `pause`, or a resume (`None`), from outside the group.
    pub(crate) async fn write(&self, pause: Option<&ListenerPause>) -> Result<()> {
        let commit = match pause {
            Some(pause) => (pause.committed_offset(), Some(pause.metadata())),
            None => (RESUMED, None),
        };
        let offsets = BTreeMap::from([(self.at.clone(), commit)]);
        self.client.lock().await.commit_with_metadata(-1, "", &offsets).await
    }
}
