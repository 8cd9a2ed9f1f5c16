//! One consumer-group member: join, sync, heartbeat, and run a worker per
//! assigned partition for as long as the generation lasts. Heartbeats run
//! here, apart from record processing, so a slow handler or a retry rung
//! waiting for its due time never costs the group its member.
//!
//! The member also checks the coordinator's answers against what the
//! classic protocol promises (see [`Expectation`]): a coordinator that
//! completes a generation without its leader's assignment, or announces a
//! rebalance and never starts one, costs a rejoin, not partitions that
//! nobody consumes after a member crashed.
//!
//! Every request to the coordinator is bounded within the session (see
//! [`session`]); the committed offsets a generation starts from are read
//! beside its heartbeats and retried within it, as Kafka's own consumer
//! does, so a coordinator that moved costs a pause, not a rebalance. A
//! static member (`group_instance_id`) never leaves on shutdown, and one
//! that another instance fenced stops for good.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use retry_core::Stage;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{
    backoff::pauses,
    consumer::{
        commit::{committed_offsets, CommitSettings, Committer, Progress},
        position,
        shared::{detach_workers, Impaired, Shared},
        worker::{StopSignals, Worker},
    },
    protocol::{assignor, group::GroupClient},
    session::{self, DETACH_WAIT},
    BrokerError, RecordHandler, TopicPartition,
};

/// Why a generation ended.
enum End {
    Shutdown,
    /// The coordinator ended it (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION).
    Over,
    /// The coordinator forgot us, or we lost it for a whole session.
    RejoinAsNewMember,
    /// We joined it as a follower, were assigned nothing, and rejoin once
    /// to confirm that it has a leader (see [`Expectation::FollowerIn`]).
    Recheck,
    /// Another instance joined with our `group_instance_id`: we stop.
    Fenced,
}

/// What the next JoinGroup answer must show, given how the last generation
/// ended. Apache Kafka always keeps these; a coordinator that breaks one
/// holds a membership of ours that no rebalance will fix (a generation
/// completed without a leader's assignment, or a rebalance announced and
/// never started), and the way out is to leave and join as a new member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expectation {
    /// Anything goes: a first join, or a rejoin after our own trouble.
    Anything,
    /// The coordinator said generation `n` is over: the rebalance it
    /// announced must yield a newer one.
    NewerThan(i32),
    /// We rejoin generation `n`, in which we were a follower assigned
    /// nothing. A follower's JoinGroup with unchanged metadata starts no
    /// rebalance: the coordinator answers with the current generation and
    /// its leader, who assigned it, so who is not us.
    FollowerIn(i32),
}

impl Expectation {
    /// Why a JoinGroup answer of `generation_id`, naming us leader or not,
    /// breaks the expectation; `None` when it keeps it.
    fn broken_by(self, generation_id: i32, leader: bool) -> Option<String> {
        match self {
            Expectation::NewerThan(n) if generation_id <= n => Some(format!(
                "the coordinator ended generation {n} but answered our rejoin with generation {generation_id}"
            )),
            Expectation::FollowerIn(n) if generation_id == n && leader => Some(format!(
                "the coordinator named us leader of generation {n}, which we joined as a follower: no leader assigned it"
            )),
            _ => None,
        }
    }
}

/// What one JoinGroup and SyncGroup round gave.
enum Round {
    Assigned {
        generation_id: i32,
        leader: bool,
        partitions: Vec<i32>,
        /// The leader's count of the topic's partitions when it assigned them.
        counted: Option<i32>,
    },
    /// The coordinator broke an [`Expectation`]: why.
    Stale(String),
}

/// The first pause after a round failed for our side of things (the
/// coordinator unreachable, a malformed answer, committed offsets
/// unreadable), growing with jitter up to [`MAX_BACKOFF`], so a persistent
/// error does not turn into a rebalance storm.
pub(super) const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
/// The longest pause between such rounds.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What to do after a JoinGroup or SyncGroup round failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterJoinError {
    /// The rebalance moved on without us (a protocol signal): rejoin soon.
    Rejoin,
    /// The coordinator forgot our member id: rejoin soon as a new member.
    RejoinAsNewMember,
    /// Another instance joined with our `group_instance_id`: stop.
    Fenced,
    /// Our side of things failed: back off, then rejoin.
    BackOff,
}

impl AfterJoinError {
    pub(super) fn of(error: Option<BrokerError>) -> Self {
        match error {
            Some(BrokerError::REBALANCE_IN_PROGRESS | BrokerError::ILLEGAL_GENERATION) => AfterJoinError::Rejoin,
            Some(BrokerError::UNKNOWN_MEMBER_ID) => AfterJoinError::RejoinAsNewMember,
            Some(BrokerError::FENCED_INSTANCE_ID) => AfterJoinError::Fenced,
            _ => AfterJoinError::BackOff,
        }
    }
}

/// What a heartbeat's answer means for the generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterHeartbeat {
    /// Go on heartbeating.
    Continue,
    /// The generation ends this way.
    End(EndKind),
}

/// [`End`] without its payload, for the heartbeat table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndKind {
    Over,
    RejoinAsNewMember,
    Recheck,
    Fenced,
}

impl AfterHeartbeat {
    /// `answer` is `Ok` or the broker's error (`None` for a failure without
    /// one: a broken connection, a timeout); `silent_for` is how long no
    /// heartbeat got through; `recheck` asks to end after the first that does.
    fn of(answer: Result<(), Option<BrokerError>>, silent_for: Duration, session: Duration, recheck: bool) -> Self {
        match answer {
            Ok(()) if recheck => AfterHeartbeat::End(EndKind::Recheck),
            Ok(()) => AfterHeartbeat::Continue,
            Err(Some(BrokerError::REBALANCE_IN_PROGRESS | BrokerError::ILLEGAL_GENERATION)) => {
                AfterHeartbeat::End(EndKind::Over)
            }
            Err(Some(BrokerError::UNKNOWN_MEMBER_ID)) => AfterHeartbeat::End(EndKind::RejoinAsNewMember),
            Err(Some(BrokerError::FENCED_INSTANCE_ID)) => AfterHeartbeat::End(EndKind::Fenced),
            Err(_) if silent_for >= session => AfterHeartbeat::End(EndKind::RejoinAsNewMember),
            Err(_) => AfterHeartbeat::Continue,
        }
    }
}

/// What a heartbeat sent while the member drains its partitions says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WhileDraining {
    /// The session holds (REBALANCE_IN_PROGRESS is the expected answer):
    /// drain on.
    Holds,
    /// The coordinator dropped us (the drain outlived the rebalance), or
    /// another instance took our instance id: the partitions are someone
    /// else's now; abandon what is in flight at once.
    Evicted,
}

impl WhileDraining {
    fn of(answer: Result<(), Option<BrokerError>>) -> Self {
        match answer {
            Err(Some(BrokerError::UNKNOWN_MEMBER_ID | BrokerError::FENCED_INSTANCE_ID)) => WhileDraining::Evicted,
            _ => WhileDraining::Holds,
        }
    }
}

/// The pause before rejoining when the coordinator answered our SyncGroup
/// with a rebalance signal (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION,
/// UNKNOWN_MEMBER_ID): these are part of the protocol, so no backoff
/// builds up. Kafka's coordinator holds JoinGroup until the group is
/// ready; with one that answers at once, the pause keeps us from spinning.
pub(super) const REJOIN_PAUSE: Duration = Duration::from_millis(100);

/// One generation of ours, as the round that began it gave it.
struct Generation {
    id: i32,
    member_id: String,
    partitions: Vec<i32>,
    /// End it after the first heartbeat that got through (see [`End::Recheck`]).
    recheck: bool,
    /// As leader: the topic's partition count we assigned.
    counted: Option<i32>,
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
        let connection = config.group_connection();
        let instance = config.group_instance_id.as_deref();
        let mut client = GroupClient::new(connection, &self.group_id).with_instance_id(instance);
        let mut member_id = String::new();
        let mut expectation = Expectation::Anything;
        // The last generation re-checked: once per generation is enough.
        let mut rechecked = None;
        let mut backoff = pauses(INITIAL_BACKOFF, MAX_BACKOFF);
        let mut joined_once = false;
        let progress = Progress::default();
        // Not ready while rejoining after the group evicted us.
        let mut _evicted: Option<Impaired> = None;
        loop {
            if self.shutdown.is_cancelled() {
                self.leave(&mut client, &member_id).await;
                return;
            }
            let round = tokio::select! {
                _ = self.shutdown.cancelled() => {
                    // The coordinator may know us already (it named us in
                    // MEMBER_ID_REQUIRED, or holds our join): without a
                    // leave, the group would wait a session for us.
                    self.leave(&mut client, &member_id).await;
                    return;
                }
                result = self.join(&mut client, &mut member_id, &mut expectation) => result,
            };
            let (generation_id, leader, assigned, counted) = match round {
                Ok(Round::Assigned { generation_id, leader, partitions, counted }) => {
                    (generation_id, leader, partitions, counted)
                }
                Ok(Round::Stale(why)) => {
                    tracing::warn!(group = %self.group_id, member = %member_id, "{why}; leaving and joining as a new member");
                    if let Err(e) = client.leave(&member_id).await {
                        tracing::debug!(group = %self.group_id, error = %e, "leaving the stale membership failed");
                    }
                    self.forget(&mut member_id);
                    expectation = Expectation::Anything;
                    continue;
                }
                Err(e) => {
                    let pause = match AfterJoinError::of(e.broker_error()) {
                        AfterJoinError::Rejoin => {
                            tracing::info!(group = %self.group_id, error = %e, "the rebalance moved on; rejoining");
                            REJOIN_PAUSE
                        }
                        AfterJoinError::RejoinAsNewMember => {
                            tracing::info!(group = %self.group_id, error = %e, "the coordinator forgot us; joining as a new member");
                            self.forget(&mut member_id);
                            expectation = Expectation::Anything;
                            REJOIN_PAUSE
                        }
                        AfterJoinError::Fenced => return fenced(&self.shared, &self.group_id),
                        AfterJoinError::BackOff => {
                            let pause = backoff.next();
                            tracing::warn!(group = %self.group_id, error = %e, retry_in_ms = pause.as_millis() as u64, "joining the group failed; retrying");
                            pause
                        }
                    };
                    tokio::select! {
                        _ = self.shutdown.cancelled() => {}
                        _ = tokio::time::sleep(pause) => {}
                    }
                    continue;
                }
            };
            self.shared.metrics.rebalanced(&self.group_id);
            _evicted = None;
            if !joined_once {
                joined_once = true;
                self.shared.members_joined.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            tracing::info!(group = %self.group_id, generation_id, member = %member_id, leader, partitions = ?assigned, "assignment received");
            // A follower assigned nothing may be the last member of a
            // group whose coordinator took its empty SyncGroup for the
            // leader's: nobody would ever consume. Rejoining once settles it.
            let recheck = !leader && assigned.is_empty() && rechecked != Some(generation_id);
            if recheck {
                rechecked = Some(generation_id);
            }
            let generation =
                Generation { id: generation_id, member_id: member_id.clone(), partitions: assigned, recheck, counted };
            let (end, was_evicted) = self.run_generation(&mut client, &generation, &progress).await;
            backoff.reset();
            if was_evicted {
                self.shared.metrics.evicted(&self.group_id);
                _evicted = Some(Impaired::new(&self.shared));
            }
            match end {
                End::Shutdown => {
                    self.leave(&mut client, &member_id).await;
                    return;
                }
                End::Over => expectation = Expectation::NewerThan(generation_id),
                End::RejoinAsNewMember => {
                    self.forget(&mut member_id);
                    expectation = Expectation::Anything;
                }
                End::Recheck => expectation = Expectation::FollowerIn(generation_id),
                End::Fenced => return fenced(&self.shared, &self.group_id),
            }
        }
    }

    /// Leaves the group as `member_id`, if the coordinator knows us by one,
    /// so the group moves our partitions at once instead of after our
    /// session; bounded like every group request. A static member never
    /// leaves: its partitions wait a session for it to come back.
    async fn leave(&self, client: &mut GroupClient, member_id: &str) {
        if member_id.is_empty() || self.shared.config.group_instance_id.is_some() {
            return;
        }
        if let Err(e) = client.leave(member_id).await {
            tracing::warn!(group = %self.group_id, error = %e, "leaving the group failed; the coordinator will expire us");
        }
    }

    /// Joins as a new member next: the coordinator forgot `member_id`.
    ///
    /// What this member finished is kept: the group may have run
    /// generations without us meanwhile, but generations are numbered for
    /// the whole group, so [`position::resume_at`] uses it only when the
    /// next assignment is the very next generation, which no other member
    /// can have owned the partition in. A member whose coordinator was
    /// down past its session (it handled records it could not commit)
    /// resumes after them when the group has nothing newer; Kafka's
    /// coordinator, which counts a generation when the group empties, makes
    /// it start from the committed offsets instead.
    fn forget(&self, member_id: &mut String) {
        member_id.clear();
    }

    /// JoinGroup then SyncGroup; the leader assigns with the range
    /// assignor. `member_id` keeps what the coordinator calls us, whatever
    /// fails after it said so; `expectation` is checked against the
    /// JoinGroup answer and then spent.
    async fn join(
        &self,
        client: &mut GroupClient,
        member_id: &mut String,
        expectation: &mut Expectation,
    ) -> crate::Result<Round> {
        let config = &self.shared.config;
        let topics = [self.topic.clone()];
        let joined = client.join(member_id, &topics, None, config.session_timeout, config.rebalance_timeout).await?;
        let leader = joined.is_leader();
        if let Some(why) = std::mem::replace(expectation, Expectation::Anything).broken_by(joined.generation_id, leader)
        {
            return Ok(Round::Stale(why));
        }
        let (assignments, counted) = if leader {
            let counts = partition_counts(&self.shared, &joined.members).await?;
            (assignor::assign_range(&joined.members, &counts), counts.get(&self.topic).copied())
        } else {
            (BTreeMap::new(), None)
        };
        let mine = client.sync(&joined, &assignments, config.rebalance_timeout).await?;
        let partitions = mine.get(&self.topic).cloned().unwrap_or_default();
        Ok(Round::Assigned { generation_id: joined.generation_id, leader, partitions, counted })
    }

    /// Runs one generation: heartbeats from its start, workers once the
    /// committed offsets came, and when it ends, the drain. Says how it
    /// ended, and whether the group evicted us during the drain.
    async fn run_generation(
        &self,
        client: &mut GroupClient,
        generation: &Generation,
        progress: &Progress,
    ) -> (End, bool) {
        let config = &self.shared.config;
        let (generation_id, member_id) = (generation.id, generation.member_id.as_str());
        let connection = config.group_connection();
        let settings = CommitSettings {
            connection: &connection,
            group_id: &self.group_id,
            instance_id: config.group_instance_id.as_deref(),
            protocol: crate::GroupProtocol::Classic,
            interval: config.commit_interval,
            batch: config.commit_batch,
        };
        let committer = Committer::start(
            settings,
            generation_id,
            member_id.to_owned(),
            self.shared.metrics.clone(),
            progress.clone(),
            {
                let shared = self.shared.clone();
                move || shared.brake.marker()
            },
        );
        let signals = StopSignals { stop: CancellationToken::new(), abandon: CancellationToken::new() };
        let mut workers = JoinSet::new();
        let tps: Vec<TopicPartition> =
            generation.partitions.iter().map(|p| TopicPartition::new(self.topic.clone(), *p)).collect();

        let end = {
            let heartbeats = self.heartbeat(client, generation);
            tokio::pin!(heartbeats);
            if tps.is_empty() {
                heartbeats.await
            } else {
                tokio::select! {
                    end = &mut heartbeats => end,
                    committed = committed_offsets(&self.shared, &self.group_id, &tps) => {
                        let finished = progress.lock().expect("no panics while holding the lock").clone();
                        // An outage brake engaged where these partitions were
                        // committed last is taken up before any worker runs.
                        for marker in committed.values().filter_map(|(_, metadata)| metadata.as_deref()) {
                            self.shared.brake.resume(marker, &self.group_id);
                        }
                        for tp in tps {
                            let committed = committed.get(&tp).and_then(|(offset, _)| *offset);
                            let start = position::resume_at(committed, finished.get(&tp).copied(), generation_id);
                            if start != committed {
                                tracing::info!(group = %self.group_id, topic = %tp.topic, partition = tp.partition, ?committed, ?start, "resuming after records this member finished in the last generation but could not commit");
                            }
                            // Reported at once, so this generation's commits (and
                            // the brake's marker in them) cover every partition.
                            if let Some(start) = start {
                                committer.tracker.done(&tp, start);
                            }
                            let worker = Worker::new(&self.shared, self.stage, tp, &committer.tracker, &signals);
                            workers.spawn(worker.run(start));
                            self.shared.metrics.count(|s| &s.partitions_started);
                        }
                        // A worker ends only when stopped: one that ends
                        // before (a bug of ours that panicked) leaves its
                        // partition unconsumed, so the member rejoins, and
                        // every partition starts again from what was done.
                        tokio::select! {
                            end = &mut heartbeats => end,
                            Some(ended) = workers.join_next() => {
                                self.shared.metrics.worker_failed(&self.group_id);
                                let why = match ended {
                                    Err(e) if e.is_panic() => format!("it panicked: {}", super::worker::panic_message(e.into_panic())),
                                    Err(e) => e.to_string(),
                                    Ok(()) => "it returned".to_owned(),
                                };
                                tracing::error!(group = %self.group_id, generation = generation_id, reason = %why, "a partition's worker ended while the partition was still assigned: rejoining the group, so every partition starts again from what was done; not ready meanwhile");
                                // Not ready for two sessions from each such end: a
                                // record that makes it end every time keeps the
                                // listener not ready, and the metric counting.
                                let impaired = Impaired::new(&self.shared);
                                let cool_down = config.session_timeout * 2;
                                tokio::spawn(async move {
                                    tokio::time::sleep(cool_down).await;
                                    drop(impaired);
                                });
                                End::RejoinAsNewMember
                            }
                        }
                    }
                }
            }
        };

        // Revoke: stop fetching and waiting at once, give records in flight
        // their time (the shutdown grace when stopping; on a rebalance,
        // each call's whole timeout if longer), then commit what finished.
        // Heartbeats go on meanwhile: a drain as long as the session would
        // otherwise expire it, and the final commit with it. A heartbeat
        // that says the group dropped us ends the drain at once: the
        // partitions are another member's by now.
        signals.stop.cancel();
        self.shared.metrics.add(|s| &s.partitions_stopped, workers.len() as u64);
        let grace = match end {
            End::Shutdown => config.shutdown_grace,
            _ => config.timings().revocation_grace(),
        };
        let drain = async {
            let drained = tokio::time::timeout(grace, async { while workers.join_next().await.is_some() {} }).await;
            if drained.is_err() {
                tracing::warn!(group = %self.group_id, ?grace, "records still in flight after the grace period; abandoning them (they will be redelivered)");
                signals.abandon.cancel();
                self.end_workers(&mut workers).await;
            }
            committer.finish().await;
        };
        tokio::pin!(drain);
        let keep_alive = async {
            let mut last_ok = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(config.heartbeat_interval).await;
                let bound = session::heartbeat_bound(
                    config.connection.request_timeout,
                    config.session_timeout,
                    last_ok.elapsed(),
                );
                let answer = client.heartbeat(generation_id, member_id, bound).await;
                if matches!(
                    &answer,
                    Ok(()) | Err(crate::Error::Broker { error: BrokerError::REBALANCE_IN_PROGRESS, .. })
                ) {
                    last_ok = tokio::time::Instant::now();
                }
                let answer = answer.map_err(|e| e.broker_error());
                match WhileDraining::of(answer) {
                    WhileDraining::Holds => {
                        if let Err(e) = answer {
                            tracing::debug!(group = %self.group_id, error = ?e, "heartbeat while draining");
                        }
                    }
                    WhileDraining::Evicted => {
                        tracing::warn!(group = %self.group_id, answer = ?answer.err(), "the group dropped us while we drained: abandoning the records in flight (their partitions are another member's now)");
                        signals.abandon.cancel();
                        return;
                    }
                }
            }
        };
        let evicted = tokio::select! {
            () = &mut drain => false,
            () = keep_alive => {
                drain.await;
                true
            }
        };
        let end = match end {
            End::Shutdown | End::Fenced => end,
            _ if evicted => End::RejoinAsNewMember,
            other => other,
        };
        (end, evicted)
    }

    /// Heartbeats until the generation ends, whatever we were assigned
    /// (nothing included: only heartbeats tell us of rebalances). With
    /// `recheck`, ends it after the first heartbeat that got through, so the
    /// rejoin finds our session fresh. The leader also watches the topic's
    /// partition count and ends the generation when it changed, so added
    /// partitions get assigned without waiting for a member to come or go.
    /// Each heartbeat waits at most what is left of the session.
    /// Waits, for at most [`DETACH_WAIT`], for the workers told to abandon
    /// their records to end. A worker that does not is held by a polled
    /// handler call that blocks its thread (nothing can cancel a call
    /// between two of its polls): it is left to end detached, counted in
    /// `kafka_retry_detached_handler_calls`, and the listener is not ready
    /// until it ends. It reports nothing when it does (it was abandoned):
    /// its partitions' next owners redeliver what it had.
    async fn end_workers(&self, workers: &mut JoinSet<()>) {
        let all = async { while workers.join_next().await.is_some() {} };
        if tokio::time::timeout(DETACH_WAIT, all).await.is_ok() {
            return;
        }
        detach_workers(&self.shared, &self.group_id, &self.topic, std::mem::take(workers));
    }

    async fn heartbeat(&self, client: &mut GroupClient, generation: &Generation) -> End {
        let config = &self.shared.config;
        let (generation_id, member_id) = (generation.id, generation.member_id.as_str());
        let mut last_ok = tokio::time::Instant::now();
        let mut last_count = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return End::Shutdown,
                _ = tokio::time::sleep(config.heartbeat_interval) => {}
            }
            if let Some(counted) = generation.counted {
                if last_count.elapsed() >= config.partition_check_interval {
                    last_count = tokio::time::Instant::now();
                    // Bounded, so a hung metadata connection costs a check,
                    // never the heartbeats that keep our session.
                    let count = tokio::time::timeout(
                        config.heartbeat_interval,
                        partition_count(&self.shared, &self.topic, &self.group_id),
                    );
                    if let Ok(Some(now)) = count.await {
                        if now != counted {
                            tracing::info!(group = %self.group_id, topic = %self.topic, from = counted, to = now, "the topic's partition count changed; rejoining to assign them");
                            return End::Over;
                        }
                    }
                }
            }
            let bound =
                session::heartbeat_bound(config.connection.request_timeout, config.session_timeout, last_ok.elapsed());
            let answer = tokio::select! {
                _ = self.shutdown.cancelled() => return End::Shutdown,
                answer = client.heartbeat(generation_id, member_id, bound) => answer,
            };
            let step = AfterHeartbeat::of(
                answer.as_ref().map(|_| ()).map_err(|e| e.broker_error()),
                last_ok.elapsed(),
                config.session_timeout,
                generation.recheck,
            );
            if answer.is_ok() {
                last_ok = tokio::time::Instant::now();
            }
            match (step, answer) {
                (AfterHeartbeat::Continue, Ok(())) => {}
                (AfterHeartbeat::Continue, Err(e)) => {
                    tracing::warn!(group = %self.group_id, error = %e, "heartbeat failed");
                }
                (AfterHeartbeat::End(EndKind::Recheck), _) => {
                    tracing::info!(group = %self.group_id, generation_id, "assigned nothing as a follower; rejoining once to confirm the generation has a leader");
                    return End::Recheck;
                }
                (AfterHeartbeat::End(EndKind::Over), answer) => {
                    tracing::info!(group = %self.group_id, answer = ?answer.err(), "the generation is over (a rebalance); rejoining");
                    return End::Over;
                }
                (AfterHeartbeat::End(EndKind::RejoinAsNewMember), answer) => {
                    tracing::warn!(group = %self.group_id, answer = ?answer.err(), "the coordinator forgot us, or no heartbeat got through within the session timeout; rejoining as a new member");
                    return End::RejoinAsNewMember;
                }
                (AfterHeartbeat::End(EndKind::Fenced), _) => return End::Fenced,
            }
        }
    }
}

/// Another instance joined with our `group_instance_id`: two instances
/// share one, which the coordinator resolves by fencing the older. Going
/// on would fence the other in turn, forever; this member stops, and
/// the listener stays not ready.
pub(super) fn fenced<H>(shared: &Shared<H>, group_id: &str) {
    tracing::error!(
        group = %group_id,
        instance = ?shared.config.group_instance_id,
        "another instance joined the group with this group_instance_id, and the coordinator fenced this one: \
         two running instances share an instance id; this member stops consuming (give each instance its own)"
    );
    shared.metrics.evicted(group_id);
    std::mem::forget(Impaired::new(shared));
}

/// The consumed topic's partition count now, if the listing answers.
pub(super) async fn partition_count<H>(shared: &Shared<H>, topic: &str, group_id: &str) -> Option<i32> {
    match shared.cluster.list_topics().await {
        Ok(topics) => topics.into_iter().find(|t| t.name == topic).map(|t| t.partitions.len() as i32),
        Err(e) => {
            tracing::debug!(group = %group_id, error = %e, "cannot count the topic's partitions");
            None
        }
    }
}

/// The leader's count of its members' topics' partitions, bounded
/// within the session: the followers wait in SyncGroup meanwhile, and
/// the coordinator drops a leader that does not come back in time.
pub(super) async fn partition_counts<H>(
    shared: &Shared<H>,
    members: &BTreeMap<String, assignor::Subscription>,
) -> crate::Result<BTreeMap<String, i32>> {
    let config = &shared.config;
    let bound = session::request_bound(config.connection.request_timeout, config.session_timeout);
    let topics = match tokio::time::timeout(bound, shared.cluster.list_topics()).await {
        Ok(topics) => topics?,
        Err(_) => {
            return Err(crate::Error::Deadline { what: "counting the group's partitions".into(), timeout: bound })
        }
    };
    let wanted: std::collections::BTreeSet<&String> = members.values().flat_map(|s| &s.topics).collect();
    Ok(topics.into_iter().filter(|t| wanted.contains(&t.name)).map(|t| (t.name, t.partitions.len() as i32)).collect())
}

#[cfg(test)]
mod tests {
    use super::{
        AfterHeartbeat, AfterJoinError, EndKind,
        Expectation::{self, *},
        WhileDraining,
    };
    use std::time::Duration;

    use crate::BrokerError;

    /// Whether a JoinGroup answer (`generation`, naming us `leader` or not)
    /// keeps `expectation`.
    #[track_caller]
    fn check(expectation: Expectation, generation: i32, leader: bool, kept: bool) {
        let broken = expectation.broken_by(generation, leader);
        assert_eq!(
            broken.is_none(),
            kept,
            "{expectation:?} answered by generation {generation}, leader {leader}: {broken:?}"
        );
    }

    #[test]
    fn join_answers_against_expectations() {
        check(Anything, 3, false, true);
        check(Anything, 3, true, true);
        // After REBALANCE_IN_PROGRESS or ILLEGAL_GENERATION from a heartbeat.
        check(NewerThan(3), 4, false, true);
        check(NewerThan(3), 4, true, true);
        check(NewerThan(3), 3, false, false);
        check(NewerThan(3), 3, true, false);
        check(NewerThan(3), 2, false, false);
        // Rechecking a generation in which we were a follower assigned nothing.
        check(FollowerIn(3), 3, false, true);
        check(FollowerIn(3), 4, true, true);
        check(FollowerIn(3), 4, false, true);
        check(FollowerIn(3), 3, true, false);
    }

    #[test]
    fn after_a_failed_join() {
        let check = |error, expected| assert_eq!(AfterJoinError::of(error), expected, "{error:?}");
        check(Some(BrokerError::REBALANCE_IN_PROGRESS), AfterJoinError::Rejoin);
        check(Some(BrokerError::ILLEGAL_GENERATION), AfterJoinError::Rejoin);
        check(Some(BrokerError::UNKNOWN_MEMBER_ID), AfterJoinError::RejoinAsNewMember);
        check(Some(BrokerError::FENCED_INSTANCE_ID), AfterJoinError::Fenced);
        check(Some(BrokerError::COORDINATOR_NOT_AVAILABLE), AfterJoinError::BackOff);
        check(Some(BrokerError::NOT_COORDINATOR), AfterJoinError::BackOff);
        check(Some(BrokerError::GROUP_AUTHORIZATION_FAILED), AfterJoinError::BackOff);
        check(None, AfterJoinError::BackOff); // a broken connection, a timeout
    }

    #[test]
    fn after_a_heartbeat() {
        #[track_caller]
        fn check(answer: Result<(), Option<BrokerError>>, silent: u64, recheck: bool, expected: AfterHeartbeat) {
            let got = AfterHeartbeat::of(answer, Duration::from_secs(silent), Duration::from_secs(10), recheck);
            assert_eq!(got, expected, "{answer:?} after {silent} s of silence, recheck {recheck}");
        }
        use AfterHeartbeat::{Continue, End};
        check(Ok(()), 0, false, Continue);
        check(Ok(()), 0, true, End(EndKind::Recheck));
        check(Err(Some(BrokerError::REBALANCE_IN_PROGRESS)), 0, false, End(EndKind::Over));
        check(Err(Some(BrokerError::ILLEGAL_GENERATION)), 0, true, End(EndKind::Over));
        check(Err(Some(BrokerError::UNKNOWN_MEMBER_ID)), 0, false, End(EndKind::RejoinAsNewMember));
        check(Err(Some(BrokerError::FENCED_INSTANCE_ID)), 0, false, End(EndKind::Fenced));
        // Trouble reaching the coordinator: keep trying for a session.
        check(Err(None), 3, false, Continue);
        check(Err(Some(BrokerError::NOT_COORDINATOR)), 9, false, Continue);
        check(Err(None), 11, false, End(EndKind::RejoinAsNewMember));
        check(Err(Some(BrokerError::COORDINATOR_NOT_AVAILABLE)), 11, false, End(EndKind::RejoinAsNewMember));
    }

    #[test]
    fn a_heartbeat_while_draining() {
        let check = |answer: Result<(), Option<BrokerError>>, expected| {
            assert_eq!(WhileDraining::of(answer), expected, "{answer:?}");
        };
        check(Ok(()), WhileDraining::Holds);
        // The expected answer during a rebalance: the session holds.
        check(Err(Some(BrokerError::REBALANCE_IN_PROGRESS)), WhileDraining::Holds);
        // A static member absent from a completed rebalance stays a member.
        check(Err(Some(BrokerError::ILLEGAL_GENERATION)), WhileDraining::Holds);
        check(Err(Some(BrokerError::NOT_COORDINATOR)), WhileDraining::Holds);
        check(Err(None), WhileDraining::Holds);
        check(Err(Some(BrokerError::UNKNOWN_MEMBER_ID)), WhileDraining::Evicted);
        check(Err(Some(BrokerError::FENCED_INSTANCE_ID)), WhileDraining::Evicted);
    }
}
