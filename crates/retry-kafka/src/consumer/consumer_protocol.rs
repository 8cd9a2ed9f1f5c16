//! One group member under the consumer group protocol of KIP-848 (Kafka's
//! `group.protocol=consumer`): the coordinator assigns the partitions, and
//! the member reconciles (see [`reconcile`](super::reconcile)) through its
//! heartbeats: it gives up only the partitions taken away (their workers
//! drain and commit while every other partition goes on), reports them
//! released, and starts those it is given. No rebalance stops the group.
//!
//! Heartbeats run here at the coordinator's interval, apart from records;
//! drains and the reading of committed offsets run in tasks of their own,
//! so heartbeats go on through them. A member fenced by the coordinator
//! (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID), or that reached no coordinator
//! for its `session_timeout`, abandons every partition at once (another
//! member may own them now) and joins again with epoch 0 under the same
//! member id. A static member (`group_instance_id`) leaves with epoch -2,
//! so its partitions wait a session for it; another instance with its
//! instance id fences it for good.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use retry_core::Stage;
use tokio::{
    sync::mpsc,
    task::{Id, JoinSet},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use crate::{
    backoff::pauses,
    consumer::{
        commit::{CommitSettings, Committer, Flusher, Progress},
        reconcile::{Reconciler, Steps},
        shared::{Impaired, Shared},
        worker::{panic_message, StopSignals, Worker},
    },
    protocol::group::{Beat, BeatAnswer, GroupClient, TopicId, LEAVE_EPOCH, STATIC_LEAVE_EPOCH},
    session::{self, DETACH_WAIT},
    BrokerError, GroupProtocol, RecordHandler, TopicPartition,
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

/// A partition's running worker.
struct Running {
    task: Id,
    signals: StopSignals,
    /// Cancelled when the worker's task ended.
    ended: CancellationToken,
}

/// Committed offsets read for partitions to start, under the ticket each
/// start was given (a start overtaken by a later one is dropped).
type Ready = Vec<(i32, u64, Option<i64>)>;

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
                End::Fenced => {
                    tracing::error!(
                        group = %self.group_id,
                        instance = ?config.group_instance_id,
                        "another instance joined the group with this group_instance_id, and the coordinator fenced \
                         this one: two running instances share an instance id; this member stops consuming (give \
                         each instance its own)"
                    );
                    self.shared.metrics.evicted(&self.group_id);
                    std::mem::forget(Impaired::new(&self.shared));
                    return;
                }
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
        let mut state = Membership {
            reconciler: Reconciler::default(),
            running: BTreeMap::new(),
            tasks: HashMap::new(),
            workers: JoinSet::new(),
            tickets: BTreeMap::new(),
            next_ticket: 0,
            topic_id: None,
        };
        let (stopped_tx, mut stopped_rx) = mpsc::unbounded_channel::<Vec<i32>>();
        let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<Ready>();
        let mut epoch = 0;
        let mut full = true;
        let mut interval = config.heartbeat_interval;
        let mut next_beat = Instant::now();
        let mut last_ok = Instant::now();
        let mut backoff = pauses(INITIAL_BACKOFF, MAX_BACKOFF);
        let mut leaving = false;

        let end = loop {
            if leaving && state.reconciler.is_empty() {
                break End::Shutdown;
            }
            tokio::select! {
                _ = self.shutdown.cancelled(), if !leaving => {
                    leaving = true;
                    let steps = state.reconciler.assign([]);
                    self.act(&mut state, steps, &committer, &stopped_tx, &ready_tx, config.shutdown_grace);
                    continue;
                }
                Some(stopped) = stopped_rx.recv() => {
                    let steps = state.reconciler.stopped(&stopped);
                    self.act(&mut state, steps, &committer, &stopped_tx, &ready_tx, config.timings().revocation_grace());
                    // The coordinator learns at once that they are released.
                    next_beat = Instant::now();
                    continue;
                }
                Some(ready) = ready_rx.recv() => {
                    self.spawn_ready(&mut state, ready, &committer);
                    continue;
                }
                Some(ended) = state.workers.join_next_with_id() => {
                    self.worker_ended(&mut state, ended, &committer, &ready_tx);
                    continue;
                }
                _ = tokio::time::sleep_until(next_beat) => {}
            }

            let owned = state.topic_id.map(|id| BTreeMap::from([(id, state.reconciler.owned())]));
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
                    if epoch == 0 {
                        tracing::info!(group = %self.group_id, member = member_id, epoch = answer.member_epoch, "joined the group (consumer group protocol)");
                        *rejoining = None;
                    }
                    epoch = answer.member_epoch;
                    committer.set_generation(epoch);
                    if !answer.heartbeat_interval.is_zero() {
                        interval = answer.heartbeat_interval;
                    }
                    next_beat = Instant::now() + interval;
                    if leaving {
                        continue;
                    }
                    if let Some(steps) = self.take_assignment(&mut state, &answer, epoch) {
                        if !*joined_once {
                            *joined_once = true;
                            self.shared.members_joined.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        self.shared.metrics.rebalanced(&self.group_id);
                        let grace = config.timings().revocation_grace();
                        self.act(&mut state, steps, &committer, &stopped_tx, &ready_tx, grace);
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
                let lost = state.reconciler.lose_all();
                let abandoned: Vec<_> = lost.iter().filter_map(|p| state.running.remove(p)).collect();
                for running in &abandoned {
                    self.shared.metrics.count(|s| &s.partitions_stopped);
                    running.signals.stop.cancel();
                    running.signals.abandon.cancel();
                }
                let all = async { while state.workers.join_next().await.is_some() {} };
                if tokio::time::timeout(DETACH_WAIT, all).await.is_err() {
                    self.detach(std::mem::take(&mut state.workers));
                }
                committer.abandon().await;
            }
        }
        end
    }

    /// The partitions of our topic in `answer`'s assignment, as steps;
    /// `None` when the assignment did not change.
    fn take_assignment(&self, state: &mut Membership, answer: &BeatAnswer, epoch: i32) -> Option<Steps> {
        let assignment = answer.assignment.as_ref()?;
        // We subscribe to one topic: whichever id the assignment names is
        // that topic's (recreated, it has a new one).
        let mut topics = assignment.iter().filter(|(_, ps)| !ps.is_empty());
        let target = match (topics.next(), topics.next()) {
            (None, _) => Vec::new(),
            (Some((id, partitions)), None) => {
                state.topic_id = Some(*id);
                partitions.clone()
            }
            (Some(_), Some(_)) => {
                tracing::error!(group = %self.group_id, topics = assignment.len(), "the coordinator assigned partitions of several topics to a member subscribed to one; taking none of them");
                Vec::new()
            }
        };
        tracing::info!(group = %self.group_id, epoch, partitions = ?target, "assignment received");
        Some(state.reconciler.assign(target))
    }

    /// Carries `steps` out: drains the partitions to give up in a task of
    /// their own (within `grace`), and reads where the new ones start.
    fn act(
        &self,
        state: &mut Membership,
        steps: Steps,
        committer: &Committer,
        stopped: &mpsc::UnboundedSender<Vec<i32>>,
        ready: &mpsc::UnboundedSender<Ready>,
        grace: Duration,
    ) {
        if !steps.stop.is_empty() {
            let mut draining = Vec::new();
            for p in &steps.stop {
                // A partition whose offsets are still being read never ran.
                state.tickets.remove(p);
                if let Some(running) = state.running.remove(p) {
                    self.shared.metrics.count(|s| &s.partitions_stopped);
                    draining.push((running.signals, running.ended));
                }
            }
            let drain = Drain {
                group_id: self.group_id.clone(),
                partitions: steps.stop,
                workers: draining,
                grace,
                flusher: committer.flusher(),
                stopped: stopped.clone(),
            };
            tokio::spawn(drain.run());
        }
        if !steps.start.is_empty() {
            let mut starts = Vec::new();
            for p in steps.start {
                state.next_ticket += 1;
                state.tickets.insert(p, state.next_ticket);
                starts.push((p, state.next_ticket));
            }
            let (shared, group_id, topic, ready) =
                (self.shared.clone(), self.group_id.clone(), self.topic.clone(), ready.clone());
            tokio::spawn(async move {
                let tps: Vec<TopicPartition> = starts.iter().map(|(p, _)| TopicPartition::new(&topic, *p)).collect();
                let committed = super::commit::committed_offsets(&shared, &group_id, &tps).await;
                for marker in committed.values().filter_map(|(_, metadata)| metadata.as_deref()) {
                    shared.brake.resume(marker, &group_id);
                }
                let offsets = starts
                    .into_iter()
                    .map(|(p, ticket)| {
                        let offset = committed.get(&TopicPartition::new(&topic, p)).and_then(|(offset, _)| *offset);
                        (p, ticket, offset)
                    })
                    .collect();
                let _ = ready.send(offsets);
            });
        }
    }

    /// Starts a worker for each partition whose committed offset came,
    /// unless it was taken away (or started again) meanwhile.
    fn spawn_ready(&self, state: &mut Membership, ready: Ready, committer: &Committer) {
        for (p, ticket, committed) in ready {
            if state.tickets.get(&p) != Some(&ticket) || !state.reconciler.runs(p) || state.running.contains_key(&p) {
                continue;
            }
            state.tickets.remove(&p);
            let tp = TopicPartition::new(self.topic.clone(), p);
            // Reported at once, so commits (and the brake's marker in them)
            // cover every partition.
            if let Some(start) = committed {
                committer.tracker.done(&tp, start);
            }
            let signals = StopSignals { stop: CancellationToken::new(), abandon: CancellationToken::new() };
            let worker = Worker {
                shared: self.shared.clone(),
                stage: self.stage,
                metrics: self.shared.metrics.for_topic(&tp.topic),
                tp,
                tracker: committer.tracker.clone(),
                signals: signals.clone(),
            };
            let task = state.workers.spawn(worker.run(committed)).id();
            self.shared.metrics.count(|s| &s.partitions_started);
            state.tasks.insert(task, p);
            state.running.insert(p, Running { task, signals, ended: CancellationToken::new() });
        }
    }

    /// A worker's task ended: expected when it was told to stop (its drain
    /// learns of it); otherwise a bug of ours ended it (a panic), and its
    /// partition starts again from what was committed.
    fn worker_ended(
        &self,
        state: &mut Membership,
        ended: Result<(Id, ()), tokio::task::JoinError>,
        committer: &Committer,
        ready: &mpsc::UnboundedSender<Ready>,
    ) {
        let (id, why) = match ended {
            Ok((id, ())) => (id, "it returned".to_owned()),
            Err(e) => {
                let id = e.id();
                let why = if e.is_panic() {
                    format!("it panicked: {}", panic_message(e.into_panic()))
                } else {
                    e.to_string()
                };
                (id, why)
            }
        };
        let Some(p) = state.tasks.remove(&id) else { return };
        let current = state.running.get(&p).is_some_and(|r| r.task == id);
        if !current {
            return;
        }
        let running = state.running.remove(&p).expect("checked above");
        running.ended.cancel();
        if running.signals.stop.is_cancelled() || !state.reconciler.runs(p) {
            return;
        }
        self.shared.metrics.worker_failed(&self.group_id);
        tracing::error!(group = %self.group_id, partition = p, reason = %why, "a partition's worker ended while the partition was still assigned: it starts again from what was committed; not ready meanwhile");
        let impaired = Impaired::new(&self.shared);
        let cool_down = self.shared.config.session_timeout * 2;
        tokio::spawn(async move {
            tokio::time::sleep(cool_down).await;
            drop(impaired);
        });
        // Committed first, so the restart resumes after what it finished.
        state.next_ticket += 1;
        state.tickets.insert(p, state.next_ticket);
        let (shared, group_id, topic, ticket, ready) =
            (self.shared.clone(), self.group_id.clone(), self.topic.clone(), state.next_ticket, ready.clone());
        let flusher = committer.flusher();
        tokio::spawn(async move {
            flusher.flush().await;
            let tp = TopicPartition::new(&topic, p);
            let committed = super::commit::committed_offsets(&shared, &group_id, std::slice::from_ref(&tp)).await;
            let offset = committed.get(&tp).and_then(|(offset, _)| *offset);
            let _ = ready.send(vec![(p, ticket, offset)]);
        });
    }

    /// Leaves workers that do not end after abandoning their records to
    /// end detached: counted, and the listener not ready until they do.
    fn detach(&self, mut stuck: JoinSet<()>) {
        tracing::error!(group = %self.group_id, workers = stuck.len(), waited = ?DETACH_WAIT, "partition workers do not end after abandoning their records: a handler call blocks its thread; they end detached, and the listener is not ready until they do");
        let impaired = Impaired::new(&self.shared);
        let metrics = self.shared.metrics.clone();
        let topic = self.topic.clone();
        for _ in 0..stuck.len() {
            metrics.detached_call(&topic, true);
        }
        tokio::spawn(async move {
            while stuck.join_next().await.is_some() {
                metrics.detached_call(&topic, false);
            }
            drop(impaired);
        });
    }
}

/// What one membership runs.
struct Membership {
    reconciler: Reconciler,
    running: BTreeMap<i32, Running>,
    /// Which partition each worker task runs.
    tasks: HashMap<Id, i32>,
    workers: JoinSet<()>,
    /// The partitions whose committed offsets are being read, each under
    /// the ticket of its latest start.
    tickets: BTreeMap<i32, u64>,
    next_ticket: u64,
    /// Our topic's id, once an assignment named it.
    topic_id: Option<TopicId>,
}

/// Gives up partitions: stops their workers, lets records in flight
/// finish within the grace (abandoning what outlives it), commits what
/// they finished, and reports them stopped.
struct Drain {
    group_id: String,
    partitions: Vec<i32>,
    workers: Vec<(StopSignals, CancellationToken)>,
    grace: Duration,
    flusher: Flusher,
    stopped: mpsc::UnboundedSender<Vec<i32>>,
}

impl Drain {
    async fn run(self) {
        for (signals, _) in &self.workers {
            signals.stop.cancel();
        }
        let all_ended = || async {
            for (_, ended) in &self.workers {
                ended.cancelled().await;
            }
        };
        if tokio::time::timeout(self.grace, all_ended()).await.is_err() {
            tracing::warn!(group = %self.group_id, partitions = ?self.partitions, grace = ?self.grace, "records still in flight after the grace period; abandoning them (they will be redelivered)");
            for (signals, _) in &self.workers {
                signals.abandon.cancel();
            }
            // A worker that outlives this is held by a call that blocks its
            // thread; the partition is released anyway (what it finished
            // is committed below, what it holds is redelivered).
            let _ = tokio::time::timeout(DETACH_WAIT, all_ended()).await;
        }
        if !self.flusher.flush().await {
            tracing::warn!(group = %self.group_id, partitions = ?self.partitions, "the last commit of partitions given up failed: their next owner redelivers what they finished since the last commit");
        }
        let _ = self.stopped.send(self.partitions);
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
