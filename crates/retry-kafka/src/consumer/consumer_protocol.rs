//! One group member under the consumer group protocol of KIP-848 (Kafka's
//! `group.protocol=consumer`): the coordinator assigns the partitions, and
//! the member reconciles (see [`reconcile`](super::reconcile)) through its
//! heartbeats: it gives up only the partitions taken away (their workers
//! drain and commit while every other partition goes on), reports them
//! released, and starts those it is given. No rebalance stops the group.
//!
//! Heartbeats run here at the coordinator's interval, quicker while the
//! group settles (see [`beat_pace`](super::beat_pace)), apart from records;
//! drains and the reading of committed offsets run in tasks of their own,
//! so heartbeats go on through them. A member fenced by the coordinator
//! (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID), or that reached no coordinator
//! for its `session_timeout`, abandons every partition at once (another
//! member may own them now) and joins again with epoch 0 under the same
//! member id. A static member (`group_instance_id`) leaves with epoch -2,
//! so its partitions wait a session for it; another instance with its
//! instance id fences it for good.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use retry_core::Stage;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    backoff::pauses,
    consumer::{
        beat_pace::{Pace, Seen},
        commit::{CommitSettings, Committer, Progress},
        member::fenced,
        partitions::{Happened, Partitions},
        shared::{Impaired, Shared},
    },
    protocol::group::{Beat, BeatAnswer, GroupClient, TopicId, LEAVE_EPOCH, STATIC_LEAVE_EPOCH},
    session, BrokerError, GroupProtocol, RecordHandler,
};

/// The first pause after a heartbeat failed for our side of things,
/// growing with jitter up to [`MAX_BACKOFF`].
const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
/// The longest pause between such heartbeats.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What a heartbeat's answer means for the membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterBeat {
    /// Take the answer in; beat again at the coordinator's interval.
    Continue,
    /// Beat again soon, with every field: the coordinator moved, the
    /// link broke, or it refused for now (a static member's former self
    /// still holds the instance id).
    Retry,
    /// The coordinator fenced us, or none answered for a session: every
    /// partition may be another member's; abandon them and join again.
    Rejoin,
    /// Another instance took our `group_instance_id`: stop for good.
    Fenced,
    /// The coordinator does not speak this protocol.
    Unsupported,
}

impl AfterBeat {
    /// `answer` is `Ok` or the broker's error (`None` for a failure without
    /// one); `silent_for` is how long no heartbeat got through.
    fn of(answer: Result<(), Option<BrokerError>>, silent_for: Duration, session: Duration) -> Self {
        match answer {
            Ok(()) => AfterBeat::Continue,
            Err(Some(BrokerError::FENCED_MEMBER_EPOCH | BrokerError::UNKNOWN_MEMBER_ID)) => AfterBeat::Rejoin,
            Err(Some(BrokerError::FENCED_INSTANCE_ID)) => AfterBeat::Fenced,
            Err(Some(BrokerError::UNSUPPORTED_VERSION)) => AfterBeat::Unsupported,
            Err(_) if silent_for >= session => AfterBeat::Rejoin,
            Err(_) => AfterBeat::Retry,
        }
    }
}

/// How one membership (from a join with epoch 0) ended.
enum End {
    Shutdown,
    Rejoin,
    Fenced,
    Unsupported,
}

pub(crate) struct ConsumerMember<H> {
    pub(crate) shared: Arc<Shared<H>>,
    pub(crate) stage: Stage,
    pub(crate) topic: String,
    pub(crate) group_id: String,
    pub(crate) shutdown: CancellationToken,
}

impl<H: RecordHandler> ConsumerMember<H> {
    pub(crate) async fn run(self) {
        let config = &self.shared.config;
        let mut client = GroupClient::new(config.group_connection(), &self.group_id)
            .with_instance_id(config.group_instance_id.as_deref())
            .speaking(GroupProtocol::Consumer);
        // Version 1 of the protocol has the member name itself, once: the
        // same id across its rejoins.
        let member_id = uuid::Uuid::new_v4().to_string();
        let progress = Progress::default();
        let mut joined_once = false;
        let mut _rejoining: Option<Impaired> = None;
        // Between rejoins: a coordinator that fences every join (its
        // former member still there) is not asked in a loop.
        let mut rejoins = pauses(INITIAL_BACKOFF, MAX_BACKOFF);
        loop {
            let started = Instant::now();
            match self.membership(&mut client, &member_id, &progress, &mut joined_once, &mut _rejoining).await {
                End::Shutdown => return,
                End::Rejoin => {
                    self.shared.metrics.evicted(&self.group_id);
                    _rejoining = Some(Impaired::new(&self.shared));
                    if started.elapsed() > config.session_timeout {
                        rejoins.reset();
                    }
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return,
                        _ = tokio::time::sleep(rejoins.next()) => {}
                    }
                }
                End::Fenced => return fenced(&self.shared, &self.group_id),
                End::Unsupported => {
                    let addr = config.connection.bootstrap.join(",");
                    let e = crate::protocol::group::unsupported_consumer_protocol(&addr, &self.group_id);
                    tracing::error!(group = %self.group_id, "{e}; this member stops");
                    std::mem::forget(Impaired::new(&self.shared));
                    return;
                }
            }
        }
    }

    /// One membership, from a join with epoch 0 until it ends.
    async fn membership(
        &self,
        client: &mut GroupClient,
        member_id: &str,
        progress: &Progress,
        joined_once: &mut bool,
        rejoining: &mut Option<Impaired>,
    ) -> End {
        let config = &self.shared.config;
        let connection = config.group_connection();
        let settings = CommitSettings {
            connection: &connection,
            group_id: &self.group_id,
            instance_id: config.group_instance_id.as_deref(),
            protocol: GroupProtocol::Consumer,
            interval: config.commit_interval,
            batch: config.commit_batch,
        };
        let committer =
            Committer::start(settings, 0, member_id.to_owned(), self.shared.metrics.clone(), progress.clone(), {
                let shared = self.shared.clone();
                move || shared.brake.marker()
            });
        let mut partitions = Partitions::new(self.shared.clone(), self.stage, &self.topic, &self.group_id);
        let mut topic_id: Option<TopicId> = None;
        let revocation_grace = config.timings().revocation_grace();
        let mut epoch = 0;
        let mut full = true;
        let mut pace = Pace::new(config.heartbeat_interval);
        let mut next_beat = Instant::now();
        let mut last_ok = Instant::now();
        let mut backoff = pauses(INITIAL_BACKOFF, MAX_BACKOFF);
        let mut leaving = false;

        let end = loop {
            if leaving && partitions.is_empty() {
                break End::Shutdown;
            }
            tokio::select! {
                _ = self.shutdown.cancelled(), if !leaving => {
                    leaving = true;
                    partitions.assign(Vec::new(), &committer, config.shutdown_grace);
                    continue;
                }
                happened = partitions.next(&committer) => {
                    if happened == Happened::Released {
                        // The coordinator learns at once that they are released.
                        next_beat = pace.next(Seen::Released, Instant::now());
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(next_beat) => {}
            }

            let owned = topic_id.map(|id| BTreeMap::from([(id, partitions.owned())]));
            let beat = Beat {
                member_id,
                member_epoch: epoch,
                full,
                topic: &self.topic,
                rebalance_timeout: config.rebalance_timeout,
                owned: Some(owned.unwrap_or_default()),
            };
            let bound =
                session::heartbeat_bound(config.connection.request_timeout, config.session_timeout, last_ok.elapsed());
            let answer = client.consumer_heartbeat(&beat, bound).await;
            let step = AfterBeat::of(
                answer.as_ref().map(|_| ()).map_err(|e| e.broker_error()),
                last_ok.elapsed(),
                config.session_timeout,
            );
            match (step, answer) {
                (AfterBeat::Continue, Ok(answer)) => {
                    last_ok = Instant::now();
                    backoff.reset();
                    full = false;
                    let joined = epoch == 0;
                    if joined {
                        tracing::info!(group = %self.group_id, member = member_id, epoch = answer.member_epoch, "joined the group (consumer group protocol)");
                        *rejoining = None;
                    }
                    epoch = answer.member_epoch;
                    committer.set_generation(epoch);
                    pace.set_interval(answer.heartbeat_interval);
                    let target = if leaving { None } else { self.take_assignment(&mut topic_id, &answer, epoch) };
                    let seen = if joined || target.is_some() { Seen::Change } else { Seen::Quiet };
                    next_beat = pace.next(seen, Instant::now());
                    if let Some(target) = target {
                        if !*joined_once {
                            *joined_once = true;
                            self.shared.members_joined.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        self.shared.metrics.rebalanced(&self.group_id);
                        partitions.assign(target, &committer, revocation_grace);
                    }
                }
                (AfterBeat::Continue, Err(_)) => unreachable!("an answer that is not Ok is never Continue"),
                (AfterBeat::Retry, answer) => {
                    full = true;
                    let pause = backoff.next();
                    tracing::warn!(group = %self.group_id, error = ?answer.err(), retry_in_ms = pause.as_millis() as u64, "heartbeat failed; retrying");
                    next_beat = Instant::now() + pause;
                }
                (AfterBeat::Rejoin, answer) => {
                    tracing::warn!(group = %self.group_id, answer = ?answer.err(), "the coordinator fenced this member, or none answered within the session timeout: abandoning every partition (another member may own them now) and joining again");
                    break End::Rejoin;
                }
                (AfterBeat::Fenced, _) => break End::Fenced,
                (AfterBeat::Unsupported, _) => break End::Unsupported,
            }
        };

        match end {
            End::Shutdown => {
                committer.finish().await;
                // A static member's partitions wait a session for it;
                // a dynamic member's move at once.
                let leave_epoch = if config.group_instance_id.is_some() { STATIC_LEAVE_EPOCH } else { LEAVE_EPOCH };
                let beat = Beat {
                    member_id,
                    member_epoch: leave_epoch,
                    full: false,
                    topic: &self.topic,
                    rebalance_timeout: config.rebalance_timeout,
                    owned: None,
                };
                let bound = session::request_bound(config.connection.request_timeout, config.session_timeout);
                if let Err(e) = client.consumer_heartbeat(&beat, bound).await {
                    tracing::warn!(group = %self.group_id, error = %e, "leaving the group failed; the coordinator will expire us");
                }
            }
            End::Rejoin | End::Fenced | End::Unsupported => {
                // Nothing more is committed: the partitions may be
                // another member's by now.
                partitions.abandon_all(&committer).await;
                committer.abandon().await;
            }
        }
        end
    }

    /// The partitions of our topic in `answer`'s assignment; `None` when
    /// the assignment did not change.
    fn take_assignment(&self, topic_id: &mut Option<TopicId>, answer: &BeatAnswer, epoch: i32) -> Option<Vec<i32>> {
        let assignment = answer.assignment.as_ref()?;
        // We subscribe to one topic: whichever id the assignment names is
        // that topic's (recreated, it has a new one).
        let mut topics = assignment.iter().filter(|(_, ps)| !ps.is_empty());
        let target = match (topics.next(), topics.next()) {
            (None, _) => Vec::new(),
            (Some((id, partitions)), None) => {
                *topic_id = Some(*id);
                partitions.clone()
            }
            (Some(_), Some(_)) => {
                tracing::error!(group = %self.group_id, topics = assignment.len(), "the coordinator assigned partitions of several topics to a member subscribed to one; taking none of them");
                Vec::new()
            }
        };
        tracing::info!(group = %self.group_id, epoch, partitions = ?target, "assignment received");
        Some(target)
    }
}

#[cfg(test)]
mod tests {
    use super::AfterBeat;
    use std::time::Duration;

    use crate::BrokerError;

    #[test]
    fn after_a_heartbeat() {
        #[track_caller]
        fn check(answer: Result<(), Option<BrokerError>>, silent: u64, expected: AfterBeat) {
            let got = AfterBeat::of(answer, Duration::from_secs(silent), Duration::from_secs(10));
            assert_eq!(got, expected, "{answer:?} after {silent} s of silence");
        }
        check(Ok(()), 0, AfterBeat::Continue);
        check(Ok(()), 30, AfterBeat::Continue);
        check(Err(Some(BrokerError::FENCED_MEMBER_EPOCH)), 0, AfterBeat::Rejoin);
        check(Err(Some(BrokerError::UNKNOWN_MEMBER_ID)), 0, AfterBeat::Rejoin);
        check(Err(Some(BrokerError::FENCED_INSTANCE_ID)), 0, AfterBeat::Fenced);
        check(Err(Some(BrokerError::UNSUPPORTED_VERSION)), 0, AfterBeat::Unsupported);
        // A static member's former self has not left yet: wait for it.
        check(Err(Some(BrokerError::UNRELEASED_INSTANCE_ID)), 0, AfterBeat::Retry);
        // Trouble reaching the coordinator: keep trying for a session.
        check(Err(None), 3, AfterBeat::Retry);
        check(Err(Some(BrokerError::NOT_COORDINATOR)), 9, AfterBeat::Retry);
        check(Err(Some(BrokerError::COORDINATOR_NOT_AVAILABLE)), 10, AfterBeat::Rejoin);
        check(Err(None), 11, AfterBeat::Rejoin);
    }
}
