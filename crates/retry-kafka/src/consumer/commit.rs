//! Batched offset commits for one generation of one group member.
//!
//! Workers report a partition's next offset once a record's outcome is
//! fully done (handled, and any republication acknowledged); the committer
//! commits what was reported, every interval or once enough piled up, and
//! a last time when the generation ends. It never commits an offset no
//! worker reported, so a commit never covers unfinished work.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{
    backoff::pauses, consumer::position::Finished, metrics::Metrics, protocol::group::GroupClient, ConnectionConfig,
    TopicPartition,
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
        let mut client =
            GroupClient::new(settings.connection.clone(), settings.group_id).with_instance_id(settings.instance_id);
        let task = {
            let tracker = tracker.clone();
            let stop = stop.clone();
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
                    let last = tokio::select! {
                        _ = stop.cancelled() => true,
                        _ = tokio::time::sleep(wait) => false,
                        _ = tracker.batch_full.notified(), if wait == interval => false,
                    };
                    wait = interval;
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
                                if last {
                                    // One more try for the final commit: the records
                                    // are redelivered otherwise (safe, but wasteful).
                                    let offsets = with_marker(&tracker.take(), &marker);
                                    if let Err(e) =
                                        client.commit_with_metadata(generation_id, &member_id, &offsets).await
                                    {
                                        tracing::warn!(group = client.group_id(), error = %e, "final offset commit failed; these records will be redelivered");
                                    } else {
                                        metrics.count(|s| &s.commits);
                                    }
                                }
                            }
                        }
                    }
                    if last {
                        return;
                    }
                }
            })
        };
        Committer { tracker, stop, task }
    }

    /// Commits what is pending and stops.
    pub(crate) async fn finish(self) {
        self.stop.cancel();
        let _ = self.task.await;
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
