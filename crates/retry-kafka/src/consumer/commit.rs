//! Batched offset commits for one generation of one group member (under
//! the consumer group protocol, for one membership, across its epochs).
//!
//! Workers report a partition's next offset once a record's outcome is
//! fully done (handled, and any republication acknowledged); the committer
//! commits what was reported, every interval or once enough piled up, when
//! asked to (partitions about to be given up), and a last time when the
//! generation ends. It never commits an offset no
//! worker reported, so a commit never covers unfinished work.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::{mpsc, oneshot, Notify};
use tokio_util::sync::CancellationToken;

use crate::{
    backoff::pauses,
    consumer::{position::Finished, shared::Shared},
    metrics::Metrics,
    protocol::group::GroupClient,
    ConnectionConfig, GroupProtocol, TopicPartition,
};

/// How far a member finished each partition it consumed, and in which
/// generation, kept across its generations (see
/// [`crate::consumer::position::resume_at`]).
pub(crate) type Progress = Arc<Mutex<BTreeMap<TopicPartition, Finished>>>;

/// Where workers report finished offsets.
#[derive(Default)]
pub(crate) struct CommitTracker {
    pending: Mutex<BTreeMap<TopicPartition, i64>>,
    progress: Progress,
    /// The generation the finished offsets belong to.
    generation: i32,
    done_since_commit: std::sync::atomic::AtomicUsize,
    batch_full: Notify,
    batch_size: usize,
}

impl CommitTracker {
    pub(crate) fn new(batch_size: usize, progress: Progress, generation: i32) -> Self {
        CommitTracker { batch_size: batch_size.max(1), progress, generation, ..Default::default() }
    }

    /// Records that every record of `tp` before `next_offset` is done.
    pub(crate) fn done(&self, tp: &TopicPartition, next_offset: i64) {
        self.done_many(tp, next_offset, 1);
    }

    /// Records that every record of `tp` before `next_offset` is done, and
    /// that `records` records finished since the last report (they count
    /// toward the batch that triggers a commit).
    pub(crate) fn done_many(&self, tp: &TopicPartition, next_offset: i64, records: usize) {
        // Keys are cloned only the first time a partition reports: this
        // runs once per batch of finished records.
        {
            let mut pending = self.pending.lock().expect("no panics while holding the lock");
            match pending.get_mut(tp) {
                Some(offset) => *offset = (*offset).max(next_offset),
                None => {
                    pending.insert(tp.clone(), next_offset);
                }
            }
        }
        let mut progress = self.progress.lock().expect("no panics while holding the lock");
        let finished = Finished { offset: next_offset, generation: self.generation };
        match progress.get_mut(tp) {
            // A later generation's: a worker detached in this one reports
            // late, and must not take its partition's progress back.
            Some(entry) if entry.generation > self.generation => {}
            Some(entry) if entry.generation == self.generation && entry.offset >= next_offset => {}
            Some(entry) => *entry = finished,
            None => {
                progress.insert(tp.clone(), finished);
            }
        }
        drop(progress);
        let n = self.done_since_commit.fetch_add(records, std::sync::atomic::Ordering::Relaxed) + records;
        if n >= self.batch_size {
            self.batch_full.notify_one();
        }
    }

    /// Records that `tp`'s position was reset to `offset` (the log was
    /// truncated or recreated): what was finished before means nothing now,
    /// so both what is pending and the member's progress start over there.
    pub(crate) fn reset(&self, tp: &TopicPartition, offset: i64) {
        self.pending.lock().expect("no panics while holding the lock").insert(tp.clone(), offset);
        let finished = Finished { offset, generation: self.generation };
        self.progress.lock().expect("no panics while holding the lock").insert(tp.clone(), finished);
    }

    /// Forgets what is pending for `partitions` of `topic`: they were given
    /// up (committed by their drain) or lost (another member's now), and no
    /// later commit of this member may carry them.
    pub(crate) fn forget(&self, topic: &str, partitions: &[i32]) {
        let mut pending = self.pending.lock().expect("no panics while holding the lock");
        pending.retain(|tp, _| tp.topic != topic || !partitions.contains(&tp.partition));
    }

    /// How far this generation finished each partition it reported:
    /// what was committed, or is about to be.
    fn finished(&self) -> BTreeMap<TopicPartition, i64> {
        let progress = self.progress.lock().expect("no panics while holding the lock");
        progress.iter().filter(|(_, f)| f.generation == self.generation).map(|(tp, f)| (tp.clone(), f.offset)).collect()
    }

    fn take(&self) -> BTreeMap<TopicPartition, i64> {
        self.done_since_commit.store(0, std::sync::atomic::Ordering::Relaxed);
        std::mem::take(&mut *self.pending.lock().expect("no panics while holding the lock"))
    }

    /// Puts back offsets whose commit failed, unless newer ones arrived.
    fn restore(&self, offsets: BTreeMap<TopicPartition, i64>) {
        let mut pending = self.pending.lock().expect("no panics while holding the lock");
        for (tp, offset) in offsets {
            pending.entry(tp).or_insert(offset);
        }
    }
}

/// The committing task of one generation.
pub(crate) struct Committer {
    pub(crate) tracker: Arc<CommitTracker>,
    /// The generation (or member epoch) and member id the commits carry.
    member: Arc<Mutex<(i32, String)>>,
    /// Asks for a commit now; answered with whether it landed.
    flushes: mpsc::UnboundedSender<oneshot::Sender<bool>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Where and how often a member commits.
pub(crate) struct CommitSettings<'a> {
    /// The coordinator's connections, their requests bounded within the session.
    pub(crate) connection: &'a ConnectionConfig,
    pub(crate) group_id: &'a str,
    /// A static member's instance id.
    pub(crate) instance_id: Option<&'a str>,
    /// The group's protocol: which OffsetCommit carries the generation.
    pub(crate) protocol: GroupProtocol,
    /// Commit at least this often...
    pub(crate) interval: Duration,
    /// ...or as soon as this many records finished.
    pub(crate) batch: usize,
}

impl Committer {
    /// Starts committing for `member_id` of generation `generation_id`.
    /// Every commit carries `marker()` as its metadata (the outage brake's
    /// engagement, for whoever takes the partitions over); when it changes,
    /// what this generation finished is committed again with it.
    pub(crate) fn start(
        settings: CommitSettings<'_>,
        generation_id: i32,
        member_id: String,
        metrics: Metrics,
        progress: Progress,
        marker: impl Fn() -> Option<String> + Send + 'static,
    ) -> Self {
        let interval = settings.interval;
        let tracker = Arc::new(CommitTracker::new(settings.batch, progress, generation_id));
        let stop = CancellationToken::new();
        let member = Arc::new(Mutex::new((generation_id, member_id)));
        let (flushes, mut flush_asks) = mpsc::unbounded_channel::<oneshot::Sender<bool>>();
        let mut client = GroupClient::new(settings.connection.clone(), settings.group_id)
            .with_instance_id(settings.instance_id)
            .speaking(settings.protocol);
        let task = {
            let tracker = tracker.clone();
            let stop = stop.clone();
            let member = member.clone();
            tokio::spawn(async move {
                // After a failed commit, the next try waits longer (with
                // jitter) than the interval: a coordinator that refuses
                // commits for a while is not asked five times a second.
                let mut backoff = pauses(interval, interval.max(Duration::from_secs(5)));
                let mut wait = interval;
                let mut marked = None;
                let with_marker = |offsets: &BTreeMap<TopicPartition, i64>, marker: &Option<String>| {
                    offsets.iter().map(|(tp, offset)| (tp.clone(), (*offset, marker.clone()))).collect()
                };
                loop {
                    let mut asked = Vec::new();
                    let last = tokio::select! {
                        _ = stop.cancelled() => true,
                        _ = tokio::time::sleep(wait) => false,
                        _ = tracker.batch_full.notified(), if wait == interval => false,
                        Some(ask) = flush_asks.recv() => {
                            asked.push(ask);
                            while let Ok(ask) = flush_asks.try_recv() {
                                asked.push(ask);
                            }
                            false
                        }
                    };
                    wait = interval;
                    let (generation_id, member_id) = member.lock().expect("no panics while holding the lock").clone();
                    let mut landed = true;
                    let mut offsets = tracker.take();
                    let marker = marker();
                    if marker != marked {
                        for (tp, offset) in tracker.finished() {
                            offsets.entry(tp).or_insert(offset);
                        }
                    }
                    if !offsets.is_empty() {
                        match client
                            .commit_with_metadata(generation_id, &member_id, &with_marker(&offsets, &marker))
                            .await
                        {
                            Ok(()) => {
                                marked = marker.clone();
                                backoff.reset();
                                metrics.count(|s| &s.commits);
                                tracing::debug!(group = client.group_id(), ?offsets, "committed");
                            }
                            Err(e) => {
                                metrics.commit_failed(client.group_id());
                                tracing::warn!(group = client.group_id(), error = %e, "offset commit failed; will retry");
                                tracker.restore(offsets);
                                wait = backoff.next();
                                landed = false;
                                if last || !asked.is_empty() {
                                    // The epoch may have moved on meanwhile
                                    // (STALE_MEMBER_EPOCH): the try again uses
                                    // the latest.
                                    let (generation_id, member_id) =
                                        member.lock().expect("no panics while holding the lock").clone();
                                    // One more try for the final commit: the records
                                    // are redelivered otherwise (safe, but wasteful).
                                    let offsets = with_marker(&tracker.take(), &marker);
                                    if let Err(e) =
                                        client.commit_with_metadata(generation_id, &member_id, &offsets).await
                                    {
                                        tracing::warn!(group = client.group_id(), error = %e, "final offset commit failed; these records will be redelivered");
                                        tracker.restore(offsets.into_iter().map(|(tp, (o, _))| (tp, o)).collect());
                                    } else {
                                        metrics.count(|s| &s.commits);
                                        landed = true;
                                    }
                                }
                            }
                        }
                    }
                    for ask in asked {
                        let _ = ask.send(landed);
                    }
                    if last {
                        return;
                    }
                }
            })
        };
        Committer { tracker, member, flushes, stop, task }
    }

    /// Commits from now on as generation (or member epoch) `id`.
    pub(crate) fn set_generation(&self, id: i32) {
        self.member.lock().expect("no panics while holding the lock").0 = id;
    }

    /// Commits from now on as `member_id` of generation `id`.
    pub(crate) fn set_member(&self, id: i32, member_id: &str) {
        *self.member.lock().expect("no panics while holding the lock") = (id, member_id.to_owned());
    }

    /// A handle that asks for commits, for a task of its own.
    pub(crate) fn flusher(&self) -> Flusher {
        Flusher(self.flushes.clone())
    }

    /// Stops without committing what is pending: the partitions were lost
    /// (another member may own them by now, and commit further).
    pub(crate) async fn abandon(self) {
        self.tracker.take();
        self.stop.cancel();
        self.task.abort();
        let _ = self.task.await;
    }

    /// Commits what is pending and stops.
    pub(crate) async fn finish(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// The group's committed offsets of `tps` with their metadata, read on a
/// connection of their own (the heartbeats keep theirs) and retried until
/// they come: a coordinator that moved, still loads the group, or has an
/// offset commit of a transaction pending answers again a moment later.
/// The caller drops this when the partitions are no longer wanted first.
pub(crate) async fn committed_offsets<H>(
    shared: &Shared<H>,
    group_id: &str,
    tps: &[TopicPartition],
) -> BTreeMap<TopicPartition, (Option<i64>, Option<String>)> {
    let mut client = GroupClient::new(shared.config.group_connection(), group_id);
    let mut backoff = pauses(Duration::from_millis(200), Duration::from_secs(5));
    loop {
        match client.committed_with_metadata(tps).await {
            Ok(committed) => return committed,
            Err(e) => {
                shared.metrics.count(|s| &s.offset_fetch_failures);
                let pause = backoff.next();
                tracing::warn!(group = %group_id, error = %e, retry_in_ms = pause.as_millis() as u64, "cannot read the committed offsets yet; retrying");
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// Asks a [`Committer`] for a commit now, from another task.
#[derive(Clone)]
pub(crate) struct Flusher(mpsc::UnboundedSender<oneshot::Sender<bool>>);

impl Flusher {
    /// Commits what is pending now; says whether it landed (or there was
    /// nothing to commit).
    pub(crate) async fn flush(&self) -> bool {
        let (ask, answer) = oneshot::channel();
        if self.0.send(ask).is_err() {
            return false;
        }
        answer.await.unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> TopicPartition {
        TopicPartition::new("t", 0)
    }

    #[test]
    fn finished_offsets_only_grow_within_a_generation_until_a_reset() {
        let progress = Progress::default();
        let finished = |offset, generation| Finished { offset, generation };
        let tracker = CommitTracker::new(10, progress.clone(), 3);
        tracker.done(&tp(), 100);
        tracker.done(&tp(), 90); // a late report never moves it back
        assert_eq!(progress.lock().unwrap()[&tp()], finished(100, 3));
        // The log was truncated and the position reset: start over there.
        tracker.reset(&tp(), 40);
        assert_eq!(progress.lock().unwrap()[&tp()], finished(40, 3));
        assert_eq!(tracker.take(), BTreeMap::from([(tp(), 40)]));
        tracker.done(&tp(), 41);
        assert_eq!(progress.lock().unwrap()[&tp()], finished(41, 3));
        // A later generation's report replaces it, even below it: what
        // counts is how far this member got in the generation it reports.
        let later = CommitTracker::new(10, progress.clone(), 5);
        later.done(&tp(), 20);
        assert_eq!(progress.lock().unwrap()[&tp()], finished(20, 5));
        // A worker of the earlier generation, detached, reports late: the
        // later generation's progress stands.
        tracker.done(&tp(), 500);
        assert_eq!(progress.lock().unwrap()[&tp()], finished(20, 5));
    }
}
