//! What the operators' routes need of a dead-letter topic, as a trait: the
//! service uses [`DeadLetterAdmin`] on Kafka, the route tests a topic in
//! memory.

use std::future::Future;

use retry_core::{operators::OperatorsPosition, pause::ListenerPause};
use retry_kafka::{
    Acknowledgement, BrowsePage, DeadLetter, DeadLetterAdmin, DeadLetterStatus, ReplayReport, ReplayRequest, Result,
    TopicLag,
};

/// Progress of a replay, after every page.
pub(crate) type Progress = Box<dyn FnMut(&ReplayReport) + Send>;

/// A dead-letter topic and its operators' position.
pub(crate) trait DeadLetterStore: Send + Sync + 'static {
    /// Every partition's offsets and backlog.
    fn status(&self) -> impl Future<Output = Result<DeadLetterStatus>> + Send;
    /// One page of records.
    fn browse(&self, page: &BrowsePage) -> impl Future<Output = Result<Vec<DeadLetter>>> + Send;
    /// Replays what `request` selects.
    fn replay(&self, request: &ReplayRequest, progress: Progress) -> impl Future<Output = Result<ReplayReport>> + Send;
    /// Acknowledges records without replaying them.
    fn acknowledge(
        &self,
        partition: i32,
        ack: &Acknowledgement,
    ) -> impl Future<Output = Result<OperatorsPosition>> + Send;
    /// The listener's pause as committed last, if not a resume.
    fn listener_pause(&self) -> impl Future<Output = Result<Option<ListenerPause>>> + Send;
    /// Pauses the listener on every instance (`None`: resumes it).
    fn set_listener_pause(&self, pause: Option<&ListenerPause>) -> impl Future<Output = Result<()>> + Send;
    /// The lag of the ladder's groups.
    fn lag(&self) -> impl Future<Output = Result<Vec<TopicLag>>> + Send;
}

impl DeadLetterStore for DeadLetterAdmin {
    async fn status(&self) -> Result<DeadLetterStatus> {
        DeadLetterAdmin::status(self).await
    }

    async fn browse(&self, page: &BrowsePage) -> Result<Vec<DeadLetter>> {
        self.browse_page(page).await
    }

    async fn replay(&self, request: &ReplayRequest, mut progress: Progress) -> Result<ReplayReport> {
        self.replay_reporting(request, |report| progress(report)).await
    }

    async fn acknowledge(&self, partition: i32, ack: &Acknowledgement) -> Result<OperatorsPosition> {
        DeadLetterAdmin::acknowledge(self, partition, ack).await
    }

    async fn listener_pause(&self) -> Result<Option<ListenerPause>> {
        DeadLetterAdmin::listener_pause(self).await
    }

    async fn set_listener_pause(&self, pause: Option<&ListenerPause>) -> Result<()> {
        match pause {
            Some(pause) => self.pause_listener(pause).await,
            None => self.resume_listener().await,
        }
    }

    async fn lag(&self) -> Result<Vec<TopicLag>> {
        DeadLetterAdmin::lag(self).await
    }
}
