//! The outage brake: when most calls to the downstream fail transiently,
//! stop feeding the ladder.
//!
//! A failing record or a short blip is what retry topics are for. A real
//! outage is different: every record fails, walks down the whole ladder and
//! lands in the dead-letter topic. The brake watches the outcomes of a
//! listener's handler calls. When transient failures pass a share of the
//! calls within a sliding window, or the last calls all failed (a
//! downstream that answered a second ago and fails every call now is down,
//! however many successes the window still holds), it engages: the transport stops starting
//! records (it keeps its assignments and heartbeats), then after a pause
//! lets one record through at a time (a probe), pausing longer after each
//! failed probe, and runs again after enough probes succeeded. While it is
//! engaged, a record that exhausted the ladder waits instead of being
//! dead-lettered, for at most [`BrakeConfig::max_engaged`].
//!
//! Permanent failures never count: a batch of bad events must not stop the
//! service. A transport reports the first attempts of records (those of the
//! source topic) and every probe: records on a retry rung failed before, so
//! a rung's share of failures says little of the downstream. Pure: the
//! caller passes `now`, and starts records as [`Brake::permit`] says.

use std::{collections::VecDeque, time::Duration};

/// How [`Brake::marker`] begins.
const MARKER_PREFIX: &str = "brake-engaged-since:";

use crate::{
    backoff::Backoff, backoff::BackoffConfig, DeadLetterReason, Decision, Error, FailureKind, Result, Timestamp,
};

/// When the brake engages and how it comes back.
///
/// ```
/// use std::time::Duration;
/// use retry_core::brake::BrakeConfig;
///
/// let config = BrakeConfig::default(); // 50 % of at least 20 calls in 30 s
/// assert_eq!(config.window(), Duration::from_secs(30));
/// let stricter = config.with_threshold(80, 50).unwrap();
/// assert!(config.with_threshold(0, 20).is_err());
/// # let _ = stricter;
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BrakeConfig {
    window: Duration,
    failure_percent: u8,
    min_calls: u32,
    probe_pauses: BackoffConfig,
    resume_after: u32,
    max_engaged: Duration,
}

impl Default for BrakeConfig {
    /// 50 % transient failures among at least 20 calls within 30 s engage
    /// it; probes after 5 s, doubling up to 1 min; 3 successful probes in a
    /// row release it; records are held back from the dead-letter topic for
    /// at most 30 min.
    fn default() -> Self {
        BrakeConfig {
            window: Duration::from_secs(30),
            failure_percent: 50,
            min_calls: 20,
            probe_pauses: BackoffConfig::new(Duration::from_secs(5), Duration::from_secs(60))
                .expect("valid by construction"),
            resume_after: 3,
            max_engaged: Duration::from_secs(30 * 60),
        }
    }
}

impl BrakeConfig {
    /// The same with another sliding window (at least 1 s).
    pub fn with_window(mut self, window: Duration) -> Result<Self> {
        if window < Duration::from_secs(1) {
            return Err(Error::InvalidBrake(format!("the window is {window:?}: at least 1s")));
        }
        self.window = window;
        Ok(self)
    }

    /// The same engaging at `failure_percent` (1 to 100) transient failures
    /// among at least `min_calls` (at least 1) calls within the window, or
    /// at `min_calls` transient failures in a row.
    pub fn with_threshold(mut self, failure_percent: u8, min_calls: u32) -> Result<Self> {
        if !(1..=100).contains(&failure_percent) {
            return Err(Error::InvalidBrake(format!("the failure rate is {failure_percent}%: 1% to 100%")));
        }
        if min_calls == 0 {
            return Err(Error::InvalidBrake("the minimum number of calls must be at least 1".into()));
        }
        self.failure_percent = failure_percent;
        self.min_calls = min_calls;
        Ok(self)
    }

    /// The same with other pauses before each probe.
    pub fn with_probe_pauses(mut self, pauses: BackoffConfig) -> Self {
        self.probe_pauses = pauses;
        self
    }

    /// The same releasing after `successes` (at least 1) successful probes in a row.
    pub fn with_resume_after(mut self, successes: u32) -> Result<Self> {
        if successes == 0 {
            return Err(Error::InvalidBrake("resuming needs at least 1 successful probe".into()));
        }
        self.resume_after = successes;
        Ok(self)
    }

    /// The same holding records back from the dead-letter topic for at most
    /// `max` (positive) after the brake engaged.
    pub fn with_max_engaged(mut self, max: Duration) -> Result<Self> {
        if max.is_zero() {
            return Err(Error::InvalidBrake("the maximum brake time must be positive".into()));
        }
        self.max_engaged = max;
        Ok(self)
    }

    /// The sliding window of outcomes.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The longest a record is held back from the dead-letter topic.
    pub fn max_engaged(&self) -> Duration {
        self.max_engaged
    }
}

/// What the brake lets the transport do now.
///
/// ```
/// use retry_core::{brake::Brake, brake::BrakeConfig, brake::Permit, Timestamp};
///
/// let mut brake = Brake::new(BrakeConfig::default(), || 0.0);
/// assert_eq!(brake.permit(Timestamp::from_millis(0)), Permit::Run);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Start records as usual.
    Run,
    /// Start this one record, a probe; report its end with [`Call::Probe`].
    Probe,
    /// Start nothing before this time.
    WaitUntil(Timestamp),
    /// Start nothing until the probe in flight ended.
    WaitForProbe,
}

/// The brake's state, as its gauge shows it.
///
/// ```
/// use retry_core::brake::BrakeState;
///
/// let gauge = [BrakeState::Running, BrakeState::Probing, BrakeState::Paused].map(BrakeState::gauge);
/// assert_eq!(gauge, [0, 1, 2]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrakeState {
    /// Records run as usual.
    Running,
    /// One record at a time runs, to see whether the downstream is back.
    Probing,
    /// Nothing runs until the next probe.
    Paused,
}

impl BrakeState {
    /// The gauge's value: 0 running, 1 probing, 2 paused.
    pub fn gauge(self) -> i64 {
        match self {
            BrakeState::Running => 0,
            BrakeState::Probing => 1,
            BrakeState::Paused => 2,
        }
    }
}

/// How a handler call started, as [`Brake::finished`] is told when it ends:
/// under [`Permit::Run`], or as the probe [`Permit::Probe`] let through.
///
/// ```
/// use retry_core::{brake::{Brake, BrakeConfig, Call, Permit}, Timestamp};
///
/// let mut brake = Brake::new(BrakeConfig::default(), || 0.0);
/// let t = Timestamp::from_millis(0);
/// let call = match brake.permit(t) {
///     Permit::Probe => Call::Probe,
///     _ => Call::Usual,
/// };
/// assert_eq!(call, Call::Usual);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// A call the brake let run as usual.
    Usual,
    /// The one call the brake let through to probe the downstream.
    Probe,
}

/// A change of state, for the transport to log and count.
///
/// ```
/// use retry_core::{brake::{Brake, BrakeChange, BrakeConfig, Call}, FailureKind, Timestamp};
///
/// let mut brake = Brake::new(BrakeConfig::default().with_threshold(100, 1).unwrap(), || 0.0);
/// let t = Timestamp::from_millis(0);
/// let change = brake.finished(Some(FailureKind::Transient), Call::Usual, t, t);
/// assert_eq!(change, Some(BrakeChange::Engaged { failed: 1, calls: 1 }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrakeChange {
    /// Transient failures passed the threshold: `failed` of the last `calls`
    /// calls (those of the window, or a run of failures in a row).
    Engaged {
        /// Transient failures in the window.
        failed: u32,
        /// Calls in the window, permanent failures not counted.
        calls: u32,
    },
    /// A probe failed: paused again until `until`.
    ProbeFailed {
        /// When the next probe may start.
        until: Timestamp,
    },
    /// Enough probes succeeded: running again.
    Released,
}

/// Where the brake stands; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engaged {
    No,
    Paused { since: Timestamp, until: Timestamp },
    Probing { since: Timestamp, in_flight: bool, successes: u32 },
}

/// The most outcomes the window remembers: beyond it, the oldest are
/// forgotten (at such rates the newest tell the share as well).
const MAX_SAMPLES: usize = 4096;

/// The brake of one listener.
///
/// ```
/// use std::time::Duration;
/// use retry_core::{brake::{Brake, BrakeConfig, BrakeState, Call, Permit}, FailureKind, Timestamp};
///
/// let config = BrakeConfig::default().with_threshold(50, 4).unwrap();
/// let mut brake = Brake::new(config, || 0.0); // no jitter
/// let t = Timestamp::from_millis(0);
/// for _ in 0..4 {
///     brake.finished(Some(FailureKind::Transient), Call::Usual, t, t);
/// }
/// assert_eq!(brake.state(), BrakeState::Paused);
/// assert_eq!(brake.permit(t), Permit::WaitUntil(t.saturating_add(Duration::from_secs(5))));
///
/// let later = t.saturating_add(Duration::from_secs(5));
/// assert_eq!(brake.permit(later), Permit::Probe);
/// assert_eq!(brake.permit(later), Permit::WaitForProbe, "one probe at a time");
/// ```
#[derive(Debug)]
pub struct Brake<R> {
    config: BrakeConfig,
    /// Outcomes in the window, oldest first: (when, failed transiently).
    outcomes: VecDeque<(Timestamp, bool)>,
    /// Transient failures since the last success, the last at `streak_at`;
    /// a run older than the window is over.
    streak: u32,
    streak_at: Timestamp,
    /// When the brake last engaged or released: calls started before then
    /// belong to another state and do not count.
    changed_at: Option<Timestamp>,
    engaged: Engaged,
    pauses: Backoff<R>,
}

impl<R: FnMut() -> f64> Brake<R> {
    /// A running brake, drawing the probe pauses' jitter from `random`.
    pub fn new(config: BrakeConfig, random: R) -> Self {
        let pauses = config.probe_pauses.pauses(random);
        Brake {
            config,
            outcomes: VecDeque::new(),
            streak: 0,
            streak_at: Timestamp::from_millis(0),
            changed_at: None,
            engaged: Engaged::No,
            pauses,
        }
    }

    /// The state now.
    pub fn state(&self) -> BrakeState {
        match self.engaged {
            Engaged::No => BrakeState::Running,
            Engaged::Paused { .. } => BrakeState::Paused,
            Engaged::Probing { .. } => BrakeState::Probing,
        }
    }

    /// What may start now. A [`Permit::Probe`] is the one probe: the
    /// caller starts exactly one record and reports it with `probe: true`.
    pub fn permit(&mut self, now: Timestamp) -> Permit {
        if let Engaged::Paused { since, until } = self.engaged {
            if now < until {
                return Permit::WaitUntil(until);
            }
            self.engaged = Engaged::Probing { since, in_flight: false, successes: 0 };
        }
        match &mut self.engaged {
            Engaged::No => Permit::Run,
            Engaged::Probing { in_flight: true, .. } => Permit::WaitForProbe,
            Engaged::Probing { in_flight, .. } => {
                *in_flight = true;
                Permit::Probe
            }
            Engaged::Paused { .. } => unreachable!("left above"),
        }
    }

    /// A handler call that started at `started` ended at `now`: `failure` is
    /// `None` on success; `call` says how it started. Calls that started before the brake last engaged
    /// or released end under the usual rules and change nothing (a call
    /// that hung through an outage says nothing of the downstream after it).
    pub fn finished(
        &mut self,
        failure: Option<FailureKind>,
        call: Call,
        started: Timestamp,
        now: Timestamp,
    ) -> Option<BrakeChange> {
        if failure == Some(FailureKind::Permanent) {
            if let (true, Engaged::Probing { in_flight, .. }) = (call == Call::Probe, &mut self.engaged) {
                // Says nothing about the downstream: probe again.
                *in_flight = false;
            }
            return None;
        }
        let failed = failure.is_some();
        let stale = self.changed_at.is_some_and(|changed| started < changed);
        match (&mut self.engaged, call == Call::Probe) {
            (Engaged::No, false) if stale => None,
            (Engaged::No, _) => self.observe(failed, now),
            (Engaged::Probing { since, in_flight, successes }, true) => {
                *in_flight = false;
                if failed {
                    let until = now.saturating_add(self.pauses.next().expect("the pauses never end"));
                    self.engaged = Engaged::Paused { since: *since, until };
                    Some(BrakeChange::ProbeFailed { until })
                } else {
                    *successes += 1;
                    if *successes < self.config.resume_after {
                        return None;
                    }
                    self.engaged = Engaged::No;
                    self.outcomes.clear();
                    self.streak = 0;
                    self.changed_at = Some(now);
                    self.pauses.reset();
                    Some(BrakeChange::Released)
                }
            }
            _ => None,
        }
    }

    /// The call == Call::Probe started under [`Permit::Probe`] will not end (its record
    /// was left to another owner, or the transport stops): another may start.
    pub fn probe_abandoned(&mut self) {
        if let Engaged::Probing { in_flight, .. } = &mut self.engaged {
            *in_flight = false;
        }
    }

    /// Until when a record that ran out of retries is held back: the
    /// engagement plus [`BrakeConfig::max_engaged`]; `None` while running.
    pub fn holds_until(&self) -> Option<Timestamp> {
        self.engaged_since().map(|since| since.saturating_add(self.config.max_engaged))
    }

    /// When the brake engaged, if it is engaged.
    pub fn engaged_since(&self) -> Option<Timestamp> {
        match self.engaged {
            Engaged::No => None,
            Engaged::Paused { since, .. } | Engaged::Probing { since, .. } => Some(since),
        }
    }

    /// The engagement, written so that whoever takes over this brake's work
    /// (another instance after a rebalance, this one after a restart) can
    /// take it up with [`Brake::resume`] before dead-lettering what this
    /// one held back: `brake-engaged-since:<ms>`; `None` while running.
    /// A transport keeps it beside its progress (Kafka: the offset commits'
    /// metadata).
    ///
    /// ```
    /// use std::time::Duration;
    /// use retry_core::{brake::{Brake, BrakeConfig, BrakeState, Call, Permit}, FailureKind, Timestamp};
    ///
    /// let config = BrakeConfig::default().with_threshold(50, 2).unwrap();
    /// let (mut old, mut new) = (Brake::new(config.clone(), || 0.0), Brake::new(config, || 0.0));
    /// let t = Timestamp::from_millis(1_000);
    /// assert_eq!(old.marker(), None);
    /// old.finished(Some(FailureKind::Transient), Call::Usual, t, t);
    /// old.finished(Some(FailureKind::Transient), Call::Usual, t, t);
    /// let marker = old.marker().unwrap();
    /// assert_eq!(marker, "brake-engaged-since:1000");
    /// // The next owner takes it up: engaged as of then, it probes first.
    /// let later = t.saturating_add(Duration::from_secs(60));
    /// assert!(new.resume(&marker, later));
    /// assert_eq!((new.state(), new.engaged_since()), (BrakeState::Paused, Some(t)));
    /// assert_eq!(new.permit(later), Permit::Probe);
    /// ```
    pub fn marker(&self) -> Option<String> {
        self.engaged_since().map(|since| format!("{MARKER_PREFIX}{}", since.as_millis()))
    }

    /// Takes up the engagement `marker` records (see [`Brake::marker`]):
    /// a running brake engages as of then, its next permit a probe, so the
    /// records the other brake held back are probed with before they are
    /// dead-lettered. Ignored (false) when this brake is engaged already,
    /// when the marker is not one, and when the engagement began
    /// [`BrakeConfig::max_engaged`] ago or longer (it would hold nothing
    /// any more). A marker from the future (another host's clock) counts
    /// as of `now`.
    pub fn resume(&mut self, marker: &str, now: Timestamp) -> bool {
        let since = marker.strip_prefix(MARKER_PREFIX).and_then(|ms| ms.parse::<i64>().ok());
        let Some(since) = since.map(|ms| Timestamp::from_millis(ms).min(now)) else { return false };
        if !matches!(self.engaged, Engaged::No) || since.saturating_add(self.config.max_engaged) <= now {
            return false;
        }
        self.engaged = Engaged::Paused { since, until: now };
        self.outcomes.clear();
        self.streak = 0;
        self.changed_at = Some(now);
        true
    }

    /// Whether `decision` should wait instead: a record that exhausted the
    /// ladder while the brake is engaged (a `deadline-exceeded` record is
    /// not: the deadline is the service's own bound), for at most
    /// [`BrakeConfig::max_engaged`] since it engaged. The caller keeps the
    /// record and tries it again when the brake permits.
    pub fn holds(&self, decision: &Decision, now: Timestamp) -> bool {
        let exhausted = matches!(decision, Decision::DeadLetter { reason: DeadLetterReason::RetriesExhausted, .. });
        exhausted && self.holds_until().is_some_and(|until| now < until)
    }

    /// Counts an outcome of a running brake, and engages it past the threshold.
    fn observe(&mut self, failed: bool, now: Timestamp) -> Option<BrakeChange> {
        if !failed || self.streak_at.saturating_add(self.config.window) <= now {
            self.streak = 0;
        }
        if failed {
            self.streak = self.streak.saturating_add(1);
            self.streak_at = now;
        }
        self.outcomes.push_back((now, failed));
        if self.outcomes.len() > MAX_SAMPLES {
            self.outcomes.pop_front();
        }
        while self.outcomes.front().is_some_and(|(at, _)| at.saturating_add(self.config.window) <= now) {
            self.outcomes.pop_front();
        }
        let calls = self.outcomes.len() as u32;
        let failed = self.outcomes.iter().filter(|(_, failed)| *failed).count() as u32;
        let over = u64::from(failed) * 100 >= u64::from(self.config.failure_percent) * u64::from(calls);
        let (failed, calls) = if calls >= self.config.min_calls && over {
            (failed, calls)
        } else if self.streak >= self.config.min_calls {
            (self.streak, self.streak)
        } else {
            return None;
        };
        let until = now.saturating_add(self.pauses.next().expect("the pauses never end"));
        self.engaged = Engaged::Paused { since: now, until };
        self.outcomes.clear();
        self.streak = 0;
        self.changed_at = Some(now);
        Some(BrakeChange::Engaged { failed, calls })
    }
}

#[cfg(test)]
mod tests;
