//! retry-core's outage brake, shared by every worker of a listener: a
//! worker asks it before running a record's handler, tells it how the call
//! ended, and asks it before dead-lettering a record that exhausted the
//! ladder. The decisions are retry-core's; this only waits and wakes.
//!
//! The operators' pause of the listener waits here too, before the brake,
//! whether the brake is on or off.

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicI64, Ordering},
        Mutex,
    },
};

use retry_core::{
    brake::{Brake, BrakeChange, BrakeConfig, BrakeState, Call, Permit},
    pause::ListenerPause,
    Decision, HandlerError, Stage, Timestamp,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// retry-core's brake, its probe pauses jittered by a real generator.
type JitteredBrake = Brake<fn() -> f64>;

/// The brake of one listener, or none when it is off.
pub(crate) struct SharedBrake {
    brake: Option<Mutex<JitteredBrake>>,
    /// Woken on every change of state and at the end of every probe.
    changed: Notify,
    metrics: Metrics,
    /// The listener's source topic, which labels the brake's metrics.
    topic: String,
    /// The end of the operators' pause in milliseconds since the epoch;
    /// 0 when there is none (so that a record's admission reads no clock).
    paused_until: AtomicI64,
    /// The pause itself, for [`SharedBrake::status`].
    pause: Mutex<Option<ListenerPause>>,
    /// The latest engagements, newest last.
    engagements: Mutex<VecDeque<Engagement>>,
}

/// How many engagements [`BrakeStatus::recent_engagements`] keeps.
const RECENT_ENGAGEMENTS: usize = 10;

/// What a listener's brake and the operators' pause are doing, as
/// [`BrakeView::status`](crate::BrakeView::status) reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrakeStatus {
    /// The listener's source topic.
    pub topic: String,
    /// The brake's state; `None` when the listener has no brake.
    pub state: Option<BrakeState>,
    /// Since when it has been engaged, while it is.
    pub engaged_since: Option<Timestamp>,
    /// The latest engagements (at most ten), oldest first.
    pub recent_engagements: Vec<Engagement>,
    /// The operators' pause in force on this instance, if any.
    pub pause: Option<ListenerPause>,
}

/// One engagement of the brake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Engagement {
    /// When it engaged.
    pub at: Timestamp,
    /// How many of the calls it saw had failed transiently.
    pub failed: u32,
    /// How many calls it saw.
    pub calls: u32,
}

/// What [`SharedBrake::admit`] allows.
#[derive(Debug)]
pub(crate) enum Admitted<'a> {
    /// Run the record, as the call started at `started`; report its end
    /// through the ticket (dropping it unreported frees a probe's slot).
    Run(Ticket<'a>),
    /// The record was held back from the dead-letter topic, and the
    /// brake's maximum time passed first: carry out its decision now.
    HoldExpired,
}

/// A record admitted to run. A probe's ticket dropped without
/// [`SharedBrake::finished`] (the record left, the task panicked) frees
/// the probe's slot, so the brake never waits for a probe that is gone.
#[derive(Debug)]
pub(crate) struct Ticket<'a> {
    brake: &'a SharedBrake,
    run: Call,
    started: Timestamp,
    reported: bool,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.reported && self.run == Call::Probe {
            self.brake.abandoned();
        }
    }
}

impl std::fmt::Debug for SharedBrake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBrake").field("topic", &self.topic).field("on", &self.brake.is_some()).finish()
    }
}

fn now() -> Timestamp {
    Timestamp::from(std::time::SystemTime::now())
}

impl SharedBrake {
    pub(crate) fn new(config: Option<BrakeConfig>, metrics: Metrics, topic: &str) -> Self {
        let brake = config.map(|c| Mutex::new(Brake::new(c, rand::random::<f64> as fn() -> f64)));
        if brake.is_some() {
            metrics.brake_state(topic, retry_core::brake::BrakeState::Running);
        }
        SharedBrake {
            brake,
            changed: Notify::new(),
            metrics,
            topic: topic.to_owned(),
            paused_until: AtomicI64::new(0),
            pause: Mutex::new(None),
            engagements: Mutex::new(VecDeque::new()),
        }
    }

    /// Sets the operators' pause as read from its group (`None`: none, or
    /// it ended); a change wakes the records waiting for it.
    pub(crate) fn set_pause(&self, pause: Option<ListenerPause>) {
        let mut current = self.pause.lock().unwrap_or_else(|p| p.into_inner());
        if *current == pause {
            return;
        }
        match &pause {
            Some(p) => {
                tracing::warn!(topic = %self.topic, until_ms = p.until.as_millis(), by = %p.by, reason = %p.reason, "operators paused the listener: records wait, keeping their place, until the pause ends or is resumed")
            }
            None => tracing::info!(topic = %self.topic, "the operators' pause ended: records run again"),
        }
        self.paused_until.store(pause.as_ref().map_or(0, |p| p.until.as_millis().max(1)), Ordering::Relaxed);
        self.metrics.listener_paused(&self.topic, pause.is_some());
        *current = pause;
        drop(current);
        self.changed.notify_waiters();
    }

    /// Waits while the operators' pause holds; false when `stop` came first.
    async fn pass_pause(&self, stop: &CancellationToken) -> bool {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            let until = self.paused_until.load(Ordering::Relaxed);
            if until == 0 {
                return true;
            }
            let wait = now().until(Timestamp::from_millis(until));
            if wait.is_zero() {
                return true;
            }
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = changed => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// What the brake and the pause are doing now.
    pub(crate) fn status(&self) -> BrakeStatus {
        let (state, engaged_since) = match &self.brake {
            Some(brake) => {
                let brake = Self::lock(brake);
                (Some(brake.state()), brake.engaged_since())
            }
            None => (None, None),
        };
        let pause = self.pause.lock().unwrap_or_else(|p| p.into_inner()).clone().filter(|p| p.holds_at(now()));
        let recent_engagements = self.engagements.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect();
        BrakeStatus { topic: self.topic.clone(), state, engaged_since, recent_engagements, pause }
    }

    fn lock(brake: &Mutex<JitteredBrake>) -> std::sync::MutexGuard<'_, JitteredBrake> {
        brake.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until a record may run; `None` when `stop` came first. A held
    /// record passes `held` and gets [`Admitted::HoldExpired`] once the
    /// brake may no longer hold it.
    pub(crate) async fn admit(&self, stop: &CancellationToken, held: bool) -> Option<Admitted<'_>> {
        if !self.pass_pause(stop).await {
            return None;
        }
        let ticket = |run| Admitted::Run(Ticket { brake: self, run, started: now(), reported: false });
        // Without a brake, the start is never read: no clock read per record.
        let Some(brake) = &self.brake else {
            return Some(Admitted::Run(Ticket {
                brake: self,
                run: Call::Usual,
                started: Timestamp::from_millis(0),
                reported: false,
            }));
        };
        loop {
            // Registered before the state is read, so no wake-up is missed.
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            let (permit, state, holds_until) = {
                let mut brake = Self::lock(brake);
                let holds_until = brake.holds_until();
                if held && holds_until.is_some_and(|until| until <= now()) {
                    return Some(Admitted::HoldExpired);
                }
                (brake.permit(now()), brake.state(), holds_until)
            };
            let mut wait = match permit {
                // The common case: no gauge to update, the state did not change.
                Permit::Run => return Some(ticket(Call::Usual)),
                Permit::Probe => {
                    self.metrics.brake_state(&self.topic, state);
                    tracing::info!(topic = %self.topic, "the brake lets one record through to probe the downstream");
                    return Some(ticket(Call::Probe));
                }
                Permit::WaitUntil(until) => now().until(until),
                // Woken when the probe ends; the pause is a safety net.
                Permit::WaitForProbe => std::time::Duration::from_secs(1),
            };
            if let (true, Some(until)) = (held, holds_until) {
                wait = wait.min(now().until(until));
            }
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = changed => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// The handler call of `ticket`, for a record read at `stage`, ended
    /// with `outcome`. Only first attempts (and probes) count: records on a
    /// rung failed before, so a rung's share of failures says little of the
    /// downstream (a rung holds precisely the records that fail).
    pub(crate) fn finished(&self, mut ticket: Ticket<'_>, outcome: &Result<(), HandlerError>, stage: Stage) {
        ticket.reported = true;
        let run = ticket.run;
        let Some(brake) = &self.brake else { return };
        if run == Call::Usual && stage != Stage::SOURCE {
            return;
        }
        let failure = outcome.as_ref().err().map(|e| e.kind());
        let (change, state) = {
            let mut brake = Self::lock(brake);
            (brake.finished(failure, run, ticket.started, now()), brake.state())
        };
        if change.is_some() || run == Call::Probe {
            self.metrics.brake_state(&self.topic, state);
        }
        match change {
            None => {}
            Some(BrakeChange::Engaged { failed, calls }) => {
                self.metrics.brake_engaged(&self.topic);
                let mut engagements = self.engagements.lock().unwrap_or_else(|p| p.into_inner());
                if engagements.len() == RECENT_ENGAGEMENTS {
                    engagements.pop_front();
                }
                engagements.push_back(Engagement { at: now(), failed, calls });
                drop(engagements);
                tracing::warn!(topic = %self.topic, failed, calls, "the brake engaged: {failed} of the last {calls} calls failed transiently; records wait instead of moving down the ladder, and the downstream is probed one record at a time");
            }
            Some(BrakeChange::ProbeFailed { until }) => {
                let retry_in_ms = now().until(until).as_millis() as u64;
                tracing::info!(topic = %self.topic, retry_in_ms, "a probe failed; the brake stays engaged");
            }
            Some(BrakeChange::Released) => {
                tracing::info!(topic = %self.topic, "the brake released: probes succeeded, records run again");
            }
        }
        if run == Call::Probe || change.is_some() {
            self.changed.notify_waiters();
        }
    }

    /// The probe will not run to its end (its ticket was dropped unreported).
    fn abandoned(&self) {
        if let Some(brake) = &self.brake {
            Self::lock(brake).probe_abandoned();
            self.changed.notify_waiters();
        }
    }

    /// The engagement, as the commits' metadata keeps it for whoever takes
    /// over the partitions (`None` while running, or without a brake).
    pub(crate) fn marker(&self) -> Option<String> {
        self.brake.as_ref().and_then(|brake| Self::lock(brake).marker())
    }

    /// Takes up an engagement a commit's metadata recorded (another
    /// instance's brake, or this one's before a restart): the records it
    /// held back are probed with before any is dead-lettered.
    pub(crate) fn resume(&self, marker: &str, group: &str) {
        let Some(brake) = &self.brake else { return };
        let (resumed, state) = {
            let mut brake = Self::lock(brake);
            (brake.resume(marker, now()), brake.state())
        };
        if resumed {
            self.metrics.brake_state(&self.topic, state);
            tracing::warn!(topic = %self.topic, %group, %marker, "the brake was engaged where this group's partitions were committed last: engaged here too, so the records held back there are probed with before any is dead-lettered");
            self.changed.notify_waiters();
        }
    }

    /// Whether the brake is on: only then may a record be held and run again.
    pub(crate) fn is_on(&self) -> bool {
        self.brake.is_some()
    }

    /// Whether `decision` waits for the brake instead of being carried out.
    pub(crate) fn holds(&self, decision: &Decision) -> bool {
        self.brake.as_ref().is_some_and(|brake| Self::lock(brake).holds(decision, now()))
    }
}
