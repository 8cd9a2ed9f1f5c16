//! One group member under the classic protocol with incremental
//! cooperative rebalancing (cooperative-sticky, KIP-429): a rebalance
//! stops nothing by itself. The member rejoins with the partitions it owns
//! (they keep running, and committing, meanwhile); the leader assigns with
//! [`assign_cooperative_sticky`](crate::protocol::assignor::assign_cooperative_sticky),
//! which holds back any partition that changes owner; the member gives up
//! what is missing from its assignment (drained and committed while it
//! heartbeats, see [`Partitions`]) and, once it is released, rejoins at
//! once, so the next rebalance assigns it to its new owner.
//!
//! A member that learns its generation is gone (ILLEGAL_GENERATION), that
//! the coordinator forgot it (UNKNOWN_MEMBER_ID), or that reached no
//! coordinator for its session, may have lost its partitions to others: it
//! abandons them at once, without a commit, and joins again.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use retry_core::Stage;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    backoff::pauses,
    consumer::{
        commit::{CommitSettings, Committer, Progress},
        member::{fenced, partition_count, partition_counts, INITIAL_BACKOFF, MAX_BACKOFF, REJOIN_PAUSE},
        partitions::{Happened, Partitions},
        shared::{Impaired, Shared},
    },
    protocol::{
        assignor::{self, Assignment},
        group::GroupClient,
    },
    session, BrokerError, GroupProtocol, RecordHandler,
};

/// What a failed join or heartbeat means for a cooperative member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterError {
    /// A rebalance began: rejoin, keeping every partition.
    Rejoin,
    /// The generation is gone without us: our partitions may be others'
    /// now; abandon them and rejoin.
    Lost,
    /// The same, and the coordinator forgot us, or none answered for a
    /// session: rejoin as a new member.
    LostAsNewMember,
    /// Another instance took our `group_instance_id`: stop.
    Fenced,
    /// Our side of things failed: try again after a pause.
    BackOff,
}

impl AfterError {
    /// `error` is the broker's, `None` for a failure without one (a
    /// broken connection, a timeout); `silent_for` is how long neither a
    /// join nor a heartbeat got through.
    fn of(error: Option<BrokerError>, silent_for: Duration, session: Duration) -> Self {
        match error {
            Some(BrokerError::REBALANCE_IN_PROGRESS) => AfterError::Rejoin,
            Some(BrokerError::ILLEGAL_GENERATION) => AfterError::Lost,
            Some(BrokerError::UNKNOWN_MEMBER_ID) => AfterError::LostAsNewMember,
            Some(BrokerError::FENCED_INSTANCE_ID) => AfterError::Fenced,
            _ if silent_for >= session => AfterError::LostAsNewMember,
            _ => AfterError::BackOff,
        }
    }
}

/// How one generation ended for the member.
enum End {
    Shutdown,
    /// Rejoin, keeping the partitions (a rebalance began, what moved was
    /// released, or the leader saw the partition count change).
    Rejoin,
    /// See [`AfterError`].
    Lost {
        new_member: bool,
    },
    Fenced,
}

/// One JoinGroup and SyncGroup round's outcome.
struct Round {
    generation_id: i32,
    partitions: Vec<i32>,
    /// As leader: the topic's partition count it assigned.
    counted: Option<i32>,
}

pub(crate) struct CooperativeMember<H> {
    pub(crate) shared: Arc<Shared<H>>,
    pub(crate) stage: Stage,
    pub(crate) topic: String,
    pub(crate) group_id: String,
    pub(crate) shutdown: CancellationToken,
}

impl<H: RecordHandler> CooperativeMember<H> {
    pub(crate) async fn run(self) {
        let config = &self.shared.config;
        let mut client = GroupClient::new(config.group_connection(), &self.group_id)
            .with_instance_id(config.group_instance_id.as_deref());
        let connection = config.group_connection();
        let settings = CommitSettings {
            connection: &connection,
            group_id: &self.group_id,
            instance_id: config.group_instance_id.as_deref(),
            protocol: GroupProtocol::Classic,
            interval: config.commit_interval,
            batch: config.commit_batch,
        };
        let committer =
            Committer::start(settings, -1, String::new(), self.shared.metrics.clone(), Progress::default(), {
                let shared = self.shared.clone();
                move || shared.brake.marker()
            });
        let mut partitions = Partitions::new(self.shared.clone(), self.stage, &self.topic, &self.group_id);
        let revocation_grace = config.timings().revocation_grace();
        let mut member_id = String::new();
        let mut generation = -1;
        let mut backoff = pauses(INITIAL_BACKOFF, MAX_BACKOFF);
        let mut joined_once = false;
        let mut last_ok = Instant::now();
        let mut _rejoining: Option<Impaired> = None;

        let fenced_at_last = 'member: loop {
            if self.shutdown.is_cancelled() {
                break false;
            }
            // Every partition goes on while the group rebalances.
            let owned = Assignment::from([(self.topic.clone(), partitions.owned())]);
            let round = {
                let join = self.join(&mut client, &mut member_id, &owned, generation);
                tokio::pin!(join);
                loop {
                    tokio::select! {
                        _ = self.shutdown.cancelled() => break 'member false,
                        round = &mut join => break round,
                        _ = partitions.next(&committer) => {}
                    }
                }
            };
            let end = match round {
                Ok(round) => {
                    last_ok = Instant::now();
                    backoff.reset();
                    _rejoining = None;
                    generation = round.generation_id;
                    committer.set_member(generation, &member_id);
                    self.shared.metrics.rebalanced(&self.group_id);
                    if !joined_once {
                        joined_once = true;
                        self.shared.members_joined.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    tracing::info!(group = %self.group_id, generation, member = %member_id, partitions = ?round.partitions, "assignment received (cooperative)");
                    let steps = partitions.assign(round.partitions.clone(), &committer, revocation_grace);
                    let released_rejoin = !steps.stop.is_empty();
                    self.generation(
                        &mut client,
                        &member_id,
                        &round,
                        released_rejoin,
                        &mut partitions,
                        &committer,
                        &mut last_ok,
                    )
                    .await
                }
                Err(e) => match AfterError::of(e.broker_error(), last_ok.elapsed(), config.session_timeout) {
                    AfterError::Rejoin => {
                        tracing::info!(group = %self.group_id, error = %e, "the rebalance moved on; rejoining");
                        tokio::time::sleep(REJOIN_PAUSE).await;
                        End::Rejoin
                    }
                    AfterError::Lost => End::Lost { new_member: false },
                    AfterError::LostAsNewMember => End::Lost { new_member: true },
                    AfterError::Fenced => End::Fenced,
                    AfterError::BackOff => {
                        let pause = backoff.next();
                        tracing::warn!(group = %self.group_id, error = %e, retry_in_ms = pause.as_millis() as u64, "joining the group failed; retrying");
                        let sleep = tokio::time::sleep(pause);
                        tokio::pin!(sleep);
                        loop {
                            tokio::select! {
                                _ = self.shutdown.cancelled() => break 'member false,
                                _ = &mut sleep => break,
                                _ = partitions.next(&committer) => {}
                            }
                        }
                        End::Rejoin
                    }
                },
            };
            match end {
                End::Shutdown => break false,
                End::Rejoin => {}
                End::Lost { new_member } => {
                    tracing::warn!(group = %self.group_id, member = %member_id, "this member's generation is gone: abandoning its partitions (others may own them now) and rejoining");
                    partitions.abandon_all(&committer).await;
                    self.shared.metrics.evicted(&self.group_id);
                    _rejoining = Some(Impaired::new(&self.shared));
                    generation = -1;
                    if new_member {
                        member_id.clear();
                    }
                    last_ok = Instant::now();
                }
                End::Fenced => break true,
            }
        };

        if fenced_at_last {
            partitions.abandon_all(&committer).await;
            committer.abandon().await;
            fenced(&self.shared, &self.group_id);
            return;
        }
        // Stopping: every partition drains and commits while heartbeats
        // keep the membership; then a last commit, and a dynamic member leaves.
        partitions.assign(Vec::new(), &committer, config.shutdown_grace);
        let mut beats = tokio::time::interval(config.heartbeat_interval);
        while !partitions.is_empty() {
            tokio::select! {
                _ = partitions.next(&committer) => {}
                _ = beats.tick(), if !member_id.is_empty() => {
                    let bound = session::heartbeat_bound(config.connection.request_timeout, config.session_timeout, last_ok.elapsed());
                    if client.heartbeat(generation, &member_id, bound).await.is_ok() {
                        last_ok = Instant::now();
                    }
                }
            }
        }
        committer.finish().await;
        if !member_id.is_empty() && config.group_instance_id.is_none() {
            if let Err(e) = client.leave(&member_id).await {
                tracing::warn!(group = %self.group_id, error = %e, "leaving the group failed; the coordinator will expire us");
            }
        }
    }

    /// JoinGroup then SyncGroup, announcing what the member owns; the
    /// leader assigns cooperative-sticky.
    async fn join(
        &self,
        client: &mut GroupClient,
        member_id: &mut String,
        owned: &Assignment,
        generation: i32,
    ) -> crate::Result<Round> {
        let config = &self.shared.config;
        let topics = [self.topic.clone()];
        let joined = client
            .join(member_id, &topics, Some((owned, generation)), config.session_timeout, config.rebalance_timeout)
            .await?;
        let (assignments, counted) = if joined.is_leader() {
            let counts = partition_counts(&self.shared, &joined.members).await?;
            (assignor::assign_cooperative_sticky(&joined.members, &counts), counts.get(&self.topic).copied())
        } else {
            (BTreeMap::new(), None)
        };
        let mine = client.sync(&joined, &assignments, config.rebalance_timeout).await?;
        let partitions = mine.get(&self.topic).cloned().unwrap_or_default();
        Ok(Round { generation_id: joined.generation_id, partitions, counted })
    }

    /// Heartbeats through one generation, the partitions going on; ends it
    /// when the coordinator starts a rebalance, when what this member gave
    /// up is released (`released_rejoin`: the next rebalance assigns it to
    /// its new owner), or, as leader, when the topic's partition count changed.
    #[allow(clippy::too_many_arguments)]
    async fn generation(
        &self,
        client: &mut GroupClient,
        member_id: &str,
        round: &Round,
        released_rejoin: bool,
        partitions: &mut Partitions<H>,
        committer: &Committer,
        last_ok: &mut Instant,
    ) -> End {
        let config = &self.shared.config;
        let mut last_count = Instant::now();
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return End::Shutdown,
                happened = partitions.next(committer) => {
                    if released_rejoin && happened == Happened::Released && !partitions.is_releasing() {
                        tracing::info!(group = %self.group_id, "what this member gave up is released; rejoining so that it is assigned");
                        return End::Rejoin;
                    }
                    continue;
                }
                _ = tokio::time::sleep(config.heartbeat_interval) => {}
            }
            if let Some(counted) = round.counted {
                if last_count.elapsed() >= config.partition_check_interval {
                    last_count = Instant::now();
                    let count = partition_count(&self.shared, &self.topic, &self.group_id);
                    if let Ok(Some(now)) = tokio::time::timeout(config.heartbeat_interval, count).await {
                        if now != counted {
                            tracing::info!(group = %self.group_id, topic = %self.topic, from = counted, to = now, "the topic's partition count changed; rejoining to assign them");
                            return End::Rejoin;
                        }
                    }
                }
            }
            let bound =
                session::heartbeat_bound(config.connection.request_timeout, config.session_timeout, last_ok.elapsed());
            let answer = tokio::select! {
                _ = self.shutdown.cancelled() => return End::Shutdown,
                answer = client.heartbeat(round.generation_id, member_id, bound) => answer,
            };
            let e = match answer {
                Ok(()) => {
                    *last_ok = Instant::now();
                    continue;
                }
                Err(e) => e,
            };
            match AfterError::of(e.broker_error(), last_ok.elapsed(), config.session_timeout) {
                AfterError::Rejoin => {
                    tracing::info!(group = %self.group_id, "a rebalance began; rejoining with every partition going on");
                    return End::Rejoin;
                }
                AfterError::Lost => return End::Lost { new_member: false },
                AfterError::LostAsNewMember => return End::Lost { new_member: true },
                AfterError::Fenced => return End::Fenced,
                AfterError::BackOff => tracing::warn!(group = %self.group_id, error = %e, "heartbeat failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AfterError;
    use std::time::Duration;

    use crate::BrokerError;

    #[test]
    fn after_a_failed_join_or_heartbeat() {
        #[track_caller]
        fn check(error: Option<BrokerError>, silent: u64, expected: AfterError) {
            let got = AfterError::of(error, Duration::from_secs(silent), Duration::from_secs(10));
            assert_eq!(got, expected, "{error:?} after {silent} s of silence");
        }
        check(Some(BrokerError::REBALANCE_IN_PROGRESS), 0, AfterError::Rejoin);
        // A rebalance is a rebalance, however long the silence before it.
        check(Some(BrokerError::REBALANCE_IN_PROGRESS), 30, AfterError::Rejoin);
        check(Some(BrokerError::ILLEGAL_GENERATION), 0, AfterError::Lost);
        check(Some(BrokerError::UNKNOWN_MEMBER_ID), 0, AfterError::LostAsNewMember);
        check(Some(BrokerError::FENCED_INSTANCE_ID), 0, AfterError::Fenced);
        check(Some(BrokerError::COORDINATOR_NOT_AVAILABLE), 3, AfterError::BackOff);
        check(None, 9, AfterError::BackOff);
        check(None, 10, AfterError::LostAsNewMember);
        check(Some(BrokerError::NOT_COORDINATOR), 11, AfterError::LostAsNewMember);
    }
}
