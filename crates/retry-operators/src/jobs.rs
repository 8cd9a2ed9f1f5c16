//! Replay jobs: a replay runs in a task of its own, so a client that
//! disconnects does not stop it halfway, and its progress can be asked for
//! by id. One runs at a time per service; the dead-letter store makes it
//! one per operators' group across instances.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use retry_kafka::{ReplayReport, ReplayRequest};
use tokio::sync::watch;

use super::{
    api::{JobState, ReplayJob, ReplayOutcome},
    store::DeadLetterStore,
};

/// How many finished jobs are remembered for `GET /admin/dlq/replays/{id}`.
const KEPT_JOBS: usize = 100;

/// The jobs of one service.
#[derive(Default)]
pub(crate) struct Jobs {
    jobs: Mutex<VecDeque<Arc<Job>>>,
    running: Arc<tokio::sync::Mutex<()>>,
}

/// One job: its state, and signals for its start (the replay lock held)
/// and its end.
pub(crate) struct Job {
    state: Mutex<ReplayJob>,
    started: watch::Sender<bool>,
    done: watch::Sender<bool>,
    /// Whether it ended because another instance replays.
    elsewhere: std::sync::atomic::AtomicBool,
}

impl Job {
    pub(crate) fn snapshot(&self) -> ReplayJob {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn update(&self, change: impl FnOnce(&mut ReplayJob)) {
        change(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The job once it ended, or as it is after `limit`.
    pub(crate) async fn wait(&self, limit: Duration) -> ReplayJob {
        let mut done = self.done.subscribe();
        let _ = tokio::time::timeout(limit, done.wait_for(|done| *done)).await;
        self.snapshot()
    }

    /// Waits (up to `limit`) until the job started or ended; `Err` with the
    /// reason when it could not start because another instance replays.
    pub(crate) async fn wait_started(&self, limit: Duration) -> Result<(), String> {
        let (mut started, mut done) = (self.started.subscribe(), self.done.subscribe());
        let _ = tokio::time::timeout(limit, async {
            tokio::select! {
                _ = started.wait_for(|s| *s) => {}
                _ = done.wait_for(|d| *d) => {}
            }
        })
        .await;
        if self.elsewhere.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(self.snapshot().error.unwrap_or_default());
        }
        Ok(())
    }
}

impl Jobs {
    /// The jobs this service ran recently, newest first.
    pub(crate) fn recent(&self) -> Vec<ReplayJob> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.iter().rev().map(|job| job.snapshot()).collect()
    }

    /// The job with `id`, if this service ran it recently.
    pub(crate) fn get(&self, id: &str) -> Option<ReplayJob> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.iter().map(|job| job.snapshot()).find(|job| job.id == id)
    }

    /// Starts `request` as `job` in a task of its own; refused with the id
    /// of the job that runs when one does.
    pub(crate) fn start<S: DeadLetterStore>(
        &self,
        store: Arc<S>,
        request: ReplayRequest,
        job: ReplayJob,
    ) -> Result<Arc<Job>, String> {
        let Ok(guard) = self.running.clone().try_lock_owned() else {
            let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
            let running = jobs.iter().map(|j| j.snapshot()).find(|j| j.state == JobState::Running);
            return Err(running.map(|j| j.id).unwrap_or_default());
        };
        let entry = Arc::new(Job {
            state: Mutex::new(job),
            started: watch::Sender::new(false),
            done: watch::Sender::new(false),
            elsewhere: Default::default(),
        });
        {
            let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
            jobs.push_back(entry.clone());
            while jobs.len() > KEPT_JOBS {
                jobs.pop_front();
            }
        }
        let job = entry.clone();
        tokio::spawn(async move {
            let progress_of = job.clone();
            let progress = Box::new(move |report: &ReplayReport| {
                progress_of.update(|state| state.report = ReplayOutcome::from(report));
                progress_of.started.send_replace(true);
            });
            let outcome = store.replay(&request, progress).await;
            job.update(|state| {
                state.finished_at = Some(now_ms());
                match outcome {
                    Ok(report) => {
                        state.state = if report.failed() { JobState::PartiallyFailed } else { JobState::Succeeded };
                        state.report = ReplayOutcome::from(&report);
                    }
                    Err(e) => {
                        if matches!(e, retry_kafka::Error::ReplayElsewhere { .. }) {
                            job.elsewhere.store(true, std::sync::atomic::Ordering::SeqCst);
                        }
                        state.state = JobState::Failed;
                        state.error = Some(e.to_string());
                    }
                }
            });
            let finished = job.snapshot();
            super::audit::audit_job(&finished);
            drop(guard);
            job.done.send_replace(true);
        });
        Ok(entry)
    }
}

/// Now, in ms since the epoch.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
