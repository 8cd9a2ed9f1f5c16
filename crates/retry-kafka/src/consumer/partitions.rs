//! The partitions a group member runs, when its assignment changes
//! without the rest of its partitions stopping (the consumer group
//! protocol, cooperative rebalancing): a worker per partition, each with
//! its own stop signals; partitions taken away drain and commit in a task
//! of their own while the member goes on heartbeating; partitions given
//! start once their committed offsets were read, in a task of their own
//! too. What to start and stop is decided in [`reconcile`](super::reconcile).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use retry_core::Stage;
use tokio::{
    sync::mpsc,
    task::{Id, JoinSet},
};
use tokio_util::sync::CancellationToken;

use crate::{
    consumer::{
        commit::{Committer, Flusher},
        reconcile::{Reconciler, Steps},
        shared::{detach_workers, Impaired, Shared},
        worker::{panic_message, StopSignals, Worker},
    },
    session::DETACH_WAIT,
    RecordHandler, TopicPartition,
};

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

/// What [`Partitions::next`] took in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Happened {
    /// Partitions given up are released: tell the coordinator.
    Released,
    /// Anything else (a partition started, a worker restarted).
    Other,
}

/// The partitions one member runs in one group.
pub(crate) struct Partitions<H> {
    shared: Arc<Shared<H>>,
    stage: Stage,
    topic: String,
    group_id: String,
    reconciler: Reconciler,
    running: BTreeMap<i32, Running>,
    /// Which partition each worker task runs, and the token cancelled when
    /// it ends (a drain waits on it).
    tasks: HashMap<Id, (i32, CancellationToken)>,
    workers: JoinSet<()>,
    /// The partitions whose committed offsets are being read, each under
    /// the ticket of its latest start.
    tickets: BTreeMap<i32, u64>,
    next_ticket: u64,
    stopped_tx: mpsc::UnboundedSender<Vec<i32>>,
    stopped_rx: mpsc::UnboundedReceiver<Vec<i32>>,
    ready_tx: mpsc::UnboundedSender<Ready>,
    ready_rx: mpsc::UnboundedReceiver<Ready>,
}

impl<H: RecordHandler> Partitions<H> {
    pub(crate) fn new(shared: Arc<Shared<H>>, stage: Stage, topic: &str, group_id: &str) -> Self {
        let (stopped_tx, stopped_rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = mpsc::unbounded_channel();
        Partitions {
            shared,
            stage,
            topic: topic.to_owned(),
            group_id: group_id.to_owned(),
            reconciler: Reconciler::default(),
            running: BTreeMap::new(),
            tasks: HashMap::new(),
            workers: JoinSet::new(),
            tickets: BTreeMap::new(),
            next_ticket: 0,
            stopped_tx,
            stopped_rx,
            ready_tx,
            ready_rx,
        }
    }

    /// The coordinator assigned `target`: stops what is no longer in it
    /// (records in flight get `grace`), starts what is new. Says what it does.
    pub(crate) fn assign(&mut self, target: Vec<i32>, committer: &Committer, grace: Duration) -> Steps {
        let steps = self.reconciler.assign(target);
        self.act(steps.clone(), committer, grace);
        steps
    }

    /// What the member owns: running, or still being given up.
    pub(crate) fn owned(&self) -> Vec<i32> {
        self.reconciler.owned()
    }

    /// Whether partitions taken away are still being given up.
    pub(crate) fn is_releasing(&self) -> bool {
        self.reconciler.is_releasing()
    }

    /// Whether nothing is owned any more.
    pub(crate) fn is_empty(&self) -> bool {
        self.reconciler.is_empty()
    }

    /// Waits for the next thing to take in (a drain that ended, committed
    /// offsets read, a worker that ended) and takes it in. Cancel-safe.
    pub(crate) async fn next(&mut self, committer: &Committer) -> Happened {
        tokio::select! {
            Some(stopped) = self.stopped_rx.recv() => {
                committer.tracker.forget(&self.topic, &stopped);
                let steps = self.reconciler.stopped(&stopped);
                self.act(steps, committer, Duration::ZERO);
                Happened::Released
            }
            Some(ready) = self.ready_rx.recv() => {
                self.spawn_ready(ready, committer);
                Happened::Other
            }
            Some(ended) = self.workers.join_next_with_id() => {
                self.worker_ended(ended, committer);
                Happened::Other
            }
        }
    }

    /// Every partition is lost (another member may own them by now):
    /// their workers abandon what they hold at once, and nothing more is
    /// committed. Waits a moment for them to end; those that do not end
    /// detached.
    pub(crate) async fn abandon_all(&mut self, committer: &Committer) {
        let lost = self.reconciler.lose_all();
        self.tickets.clear();
        for &p in &lost {
            if let Some(running) = self.running.remove(&p) {
                self.shared.metrics.count(|s| &s.partitions_stopped);
                running.signals.stop.cancel();
                running.signals.abandon.cancel();
            }
        }
        let workers = &mut self.workers;
        let all = async { while workers.join_next().await.is_some() {} };
        if tokio::time::timeout(DETACH_WAIT, all).await.is_err() {
            let stuck = std::mem::take(&mut self.workers);
            detach_workers(&self.shared, &self.group_id, &self.topic, stuck);
        }
        for (_, (_, ended)) in self.tasks.drain() {
            ended.cancel();
        }
        // After the workers ended: what they reported on the way out goes too.
        committer.tracker.forget(&self.topic, &lost);
    }

    /// Carries `steps` out: drains the partitions to give up in a task of
    /// their own (within `grace`), and reads where the new ones start.
    fn act(&mut self, steps: Steps, committer: &Committer, grace: Duration) {
        if !steps.stop.is_empty() {
            let mut draining = Vec::new();
            for p in &steps.stop {
                // A partition whose offsets are still being read never ran.
                self.tickets.remove(p);
                if let Some(running) = self.running.remove(p) {
                    self.shared.metrics.count(|s| &s.partitions_stopped);
                    draining.push((running.signals, running.ended));
                }
            }
            let drain = Drain {
                shared: self.shared.clone(),
                topic: self.topic.clone(),
                group_id: self.group_id.clone(),
                partitions: steps.stop,
                workers: draining,
                grace,
                flusher: committer.flusher(),
                stopped: self.stopped_tx.clone(),
            };
            tokio::spawn(drain.run());
        }
        if !steps.start.is_empty() {
            self.read_committed(steps.start, None);
        }
    }

    /// Reads where `partitions` start (after `flush`ing what was finished,
    /// when given), in a task of its own that reports to [`next`](Self::next).
    fn read_committed(&mut self, partitions: Vec<i32>, flush: Option<Flusher>) {
        let mut starts = Vec::new();
        for p in partitions {
            self.next_ticket += 1;
            self.tickets.insert(p, self.next_ticket);
            starts.push((p, self.next_ticket));
        }
        let (shared, group_id, topic, ready) =
            (self.shared.clone(), self.group_id.clone(), self.topic.clone(), self.ready_tx.clone());
        tokio::spawn(async move {
            if let Some(flush) = flush {
                flush.flush().await;
            }
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

    /// Starts a worker for each partition whose committed offset came,
    /// unless it was taken away (or started again) meanwhile.
    fn spawn_ready(&mut self, ready: Ready, committer: &Committer) {
        for (p, ticket, committed) in ready {
            if self.tickets.get(&p) != Some(&ticket) || !self.reconciler.runs(p) || self.running.contains_key(&p) {
                continue;
            }
            self.tickets.remove(&p);
            let tp = TopicPartition::new(self.topic.clone(), p);
            // Reported at once, so commits (and the brake's marker in them)
            // cover every partition.
            if let Some(start) = committed {
                committer.tracker.done(&tp, start);
            }
            let signals = StopSignals { stop: CancellationToken::new(), abandon: CancellationToken::new() };
            let worker = Worker::new(&self.shared, self.stage, tp, &committer.tracker, &signals);
            let task = self.workers.spawn(worker.run(committed)).id();
            self.shared.metrics.count(|s| &s.partitions_started);
            let ended = CancellationToken::new();
            self.tasks.insert(task, (p, ended.clone()));
            self.running.insert(p, Running { task, signals, ended });
        }
    }

    /// A worker's task ended: expected when it was told to stop (its drain
    /// learns of it); otherwise a bug of ours ended it (a panic), and its
    /// partition starts again from what was committed.
    fn worker_ended(&mut self, ended: Result<(Id, ()), tokio::task::JoinError>, committer: &Committer) {
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
        let Some((p, ended)) = self.tasks.remove(&id) else { return };
        ended.cancel();
        let current = self.running.get(&p).is_some_and(|r| r.task == id);
        if !current {
            // A worker told to stop: its drain learns of it by the token.
            return;
        }
        let running = self.running.remove(&p).expect("checked above");
        if running.signals.stop.is_cancelled() || !self.reconciler.runs(p) {
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
        self.read_committed(vec![p], Some(committer.flusher()));
    }
}

/// Gives up partitions: stops their workers, lets records in flight
/// finish within the grace (abandoning what outlives it), commits what
/// they finished, and reports them stopped.
struct Drain<H> {
    shared: Arc<Shared<H>>,
    topic: String,
    group_id: String,
    partitions: Vec<i32>,
    workers: Vec<(StopSignals, CancellationToken)>,
    grace: Duration,
    flusher: Flusher,
    stopped: mpsc::UnboundedSender<Vec<i32>>,
}

impl<H: RecordHandler> Drain<H> {
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
            // is committed below, what it holds is redelivered), and the
            // worker ends detached: counted, the listener not ready until then.
            if tokio::time::timeout(DETACH_WAIT, all_ended()).await.is_err() {
                let stuck: Vec<CancellationToken> =
                    self.workers.iter().map(|(_, ended)| ended.clone()).filter(|e| !e.is_cancelled()).collect();
                tracing::error!(group = %self.group_id, workers = stuck.len(), waited = ?DETACH_WAIT, "partition workers do not end after abandoning their records: a handler call blocks its thread; they end detached, and the listener is not ready until they do");
                let impaired = Impaired::new(&self.shared);
                let (metrics, topic) = (self.shared.metrics.clone(), self.topic.clone());
                for _ in &stuck {
                    metrics.detached_call(&topic, true);
                }
                tokio::spawn(async move {
                    for ended in stuck {
                        ended.cancelled().await;
                        metrics.detached_call(&topic, false);
                    }
                    drop(impaired);
                });
            }
        }
        if !self.flusher.flush().await {
            tracing::warn!(group = %self.group_id, partitions = ?self.partitions, "the last commit of partitions given up failed: their next owner redelivers what they finished since the last commit");
        }
        let _ = self.stopped.send(self.partitions);
    }
}
