//! One consumer-group member: join, sync, heartbeat, and run a worker per
//! assigned partition for as long as the generation lasts. Heartbeats run
//! here, apart from record processing, so a slow handler or a retry rung
//! waiting for its due time never costs the group its member.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use kafka_protocol::ResponseError;
use retry_core::Stage;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{
    assignor,
    commit::Committer,
    group::GroupClient,
    listener::Shared,
    stats::bump,
    worker::{StopSignals, Worker},
    Error, RecordHandler, TopicPartition,
};

/// Why a generation ended.
enum End {
    Shutdown,
    Rejoin,
    RejoinAsNewMember,
}

pub(crate) struct Member<H> {
    pub(crate) shared: Arc<Shared<H>>,
    pub(crate) stage: Stage,
    pub(crate) topic: String,
    pub(crate) group_id: String,
    pub(crate) shutdown: CancellationToken,
}

impl<H: RecordHandler> Member<H> {
    pub(crate) async fn run(self) {
        let config = &self.shared.config;
        let mut client = GroupClient::new(config.connection.clone(), &self.group_id);
        let mut member_id = String::new();
        let mut backoff = Duration::from_millis(200);
        loop {
            if self.shutdown.is_cancelled() {
                return;
            }
            let generation = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                result = self.join(&mut client, &member_id) => result,
            };
            let (generation_id, assigned) = match generation {
                Ok((joined_member, generation_id, assigned)) => {
                    member_id = joined_member;
                    backoff = Duration::from_millis(200);
                    (generation_id, assigned)
                }
                Err(e) => {
                    if matches!(e.broker_error(), Some(ResponseError::UnknownMemberId)) {
                        member_id.clear();
                    }
                    tracing::warn!(group = %self.group_id, error = %e, "joining the group failed; retrying");
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            bump(&self.shared.stats.rebalances);
            tracing::info!(group = %self.group_id, generation_id, member = %member_id, partitions = ?assigned, "assignment received");
            match self.run_generation(&mut client, generation_id, &member_id, assigned).await {
                End::Shutdown => {
                    if let Err(e) = client.leave(&member_id).await {
                        tracing::warn!(group = %self.group_id, error = %e, "leaving the group failed; the coordinator will expire us");
                    }
                    return;
                }
                End::Rejoin => {}
                End::RejoinAsNewMember => member_id.clear(),
            }
        }
    }

    /// JoinGroup then SyncGroup; the leader assigns with the range assignor.
    async fn join(&self, client: &mut GroupClient, member_id: &str) -> crate::Result<(String, i32, Vec<i32>)> {
        let config = &self.shared.config;
        let topics = [self.topic.clone()];
        let joined = client.join(member_id, &topics, config.session_timeout, config.rebalance_timeout).await?;
        let assignments = if joined.is_leader() {
            let counts = self.partition_counts(&joined.members).await?;
            assignor::assign_range(&joined.members, &counts)
        } else {
            BTreeMap::new()
        };
        let mine = client.sync(&joined, &assignments, config.rebalance_timeout).await?;
        let partitions = mine.get(&self.topic).cloned().unwrap_or_default();
        Ok((joined.member_id, joined.generation_id, partitions))
    }

    async fn partition_counts(&self, members: &BTreeMap<String, Vec<String>>) -> crate::Result<BTreeMap<String, i32>> {
        let topics = self
            .shared
            .client
            .list_topics()
            .await
            .map_err(|source| Error::Client { what: "listing topics for the assignment".into(), source })?;
        let wanted: std::collections::BTreeSet<&String> = members.values().flatten().collect();
        Ok(topics
            .into_iter()
            .filter(|t| wanted.contains(&t.name))
            .map(|t| (t.name, t.partitions.len() as i32))
            .collect())
    }

    async fn run_generation(
        &self,
        client: &mut GroupClient,
        generation_id: i32,
        member_id: &str,
        partitions: Vec<i32>,
    ) -> End {
        let config = &self.shared.config;
        let committer = Committer::start(
            config.connection.clone(),
            &self.group_id,
            generation_id,
            member_id.to_owned(),
            config.commit_interval,
            config.commit_batch,
            self.shared.stats.clone(),
        );
        let signals = StopSignals { stop: CancellationToken::new(), abandon: CancellationToken::new() };
        let mut workers = JoinSet::new();
        let tps: Vec<TopicPartition> = partitions.iter().map(|p| (self.topic.clone(), *p)).collect();
        let mut end = None;
        if !tps.is_empty() {
            let committed = tokio::select! {
                _ = self.shutdown.cancelled() => { end = Some(End::Shutdown); None }
                result = client.committed(&tps) => Some(result),
            };
            match committed {
                Some(Ok(committed)) => {
                    for tp in tps {
                        let start = committed.get(&tp).copied().flatten();
                        let worker = Worker {
                            shared: self.shared.clone(),
                            stage: self.stage,
                            tp,
                            tracker: committer.tracker.clone(),
                            signals: signals.clone(),
                        };
                        workers.spawn(worker.run(start));
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(group = %self.group_id, error = %e, "cannot read committed offsets; rejoining");
                    end = Some(End::Rejoin);
                }
                None => {}
            }
        }
        let end = match end {
            Some(end) => end,
            None => self.heartbeat(client, generation_id, member_id).await,
        };

        // Revoke: stop fetching and waiting at once, give records in flight
        // the grace period, then commit what finished.
        signals.stop.cancel();
        let drained =
            tokio::time::timeout(config.shutdown_grace, async { while workers.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(group = %self.group_id, "records still in flight after the grace period; abandoning them (they will be redelivered)");
            signals.abandon.cancel();
            while workers.join_next().await.is_some() {}
        }
        committer.finish().await;
        end
    }

    async fn heartbeat(&self, client: &mut GroupClient, generation_id: i32, member_id: &str) -> End {
        let config = &self.shared.config;
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return End::Shutdown,
                _ = tokio::time::sleep(config.heartbeat_interval) => {}
            }
            match client.heartbeat(generation_id, member_id).await {
                Ok(()) => last_ok = tokio::time::Instant::now(),
                Err(e) => match e.broker_error() {
                    Some(ResponseError::RebalanceInProgress) => {
                        tracing::info!(group = %self.group_id, "rebalance in progress; rejoining");
                        return End::Rejoin;
                    }
                    Some(ResponseError::IllegalGeneration) => {
                        tracing::info!(group = %self.group_id, "generation is over; rejoining");
                        return End::Rejoin;
                    }
                    Some(ResponseError::UnknownMemberId | ResponseError::FencedInstanceId) => {
                        tracing::warn!(group = %self.group_id, "the coordinator forgot us; rejoining as a new member");
                        return End::RejoinAsNewMember;
                    }
                    _ => {
                        tracing::warn!(group = %self.group_id, error = %e, "heartbeat failed");
                        if last_ok.elapsed() > config.session_timeout {
                            tracing::warn!(group = %self.group_id, "no heartbeat got through within the session timeout; rejoining");
                            return End::RejoinAsNewMember;
                        }
                    }
                },
            }
        }
    }
}
