//! When a member of the consumer group protocol (KIP-848) heartbeats next.
//! Pure: the member tells it what happened and when, it answers when to
//! beat.
//!
//! The coordinator pushes nothing: a member learns that partitions were
//! freed for it (released by the member that had them) only from its next
//! heartbeat. At the coordinator's interval alone, a partition moving to a
//! member that just joined waits up to one interval after its former
//! owner let it go, handling nothing. So while the group settles (from a
//! join or an assignment change, for as long as the other members take to
//! learn of it and drain), the member beats [`SETTLING_BEATS`] times as
//! often; otherwise at the coordinator's interval. Partitions it released
//! are reported at once.

use std::time::Duration;

use tokio::time::Instant;

/// How many times as often a settling member beats.
const SETTLING_BEATS: u32 = 5;
/// How many intervals a group takes to settle after a change: one for
/// every other member to hear of it at its own pace, one for their drains.
const SETTLING_INTERVALS: u32 = 2;

/// What the member saw before asking when to beat next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// An answer that joined the group or changed the assignment.
    Change,
    /// An answer that changed nothing.
    Quiet,
    /// Partitions it gave up are released: the coordinator must hear it.
    Released,
}

/// A member's heartbeat pace.
#[derive(Debug, Clone)]
pub(crate) struct Pace {
    interval: Duration,
    settling_until: Option<Instant>,
}

impl Pace {
    /// At `interval` until the coordinator names its own.
    pub(crate) fn new(interval: Duration) -> Self {
        Pace { interval, settling_until: None }
    }

    /// The coordinator's interval, from an answer (zero: keep ours).
    pub(crate) fn set_interval(&mut self, interval: Duration) {
        if !interval.is_zero() {
            self.interval = interval;
        }
    }

    /// When to beat next, having seen `seen` at `now`.
    pub(crate) fn next(&mut self, seen: Seen, now: Instant) -> Instant {
        match seen {
            Seen::Released => return now,
            Seen::Change => self.settling_until = Some(now + self.interval * SETTLING_INTERVALS),
            Seen::Quiet => {}
        }
        match self.settling_until {
            Some(until) if now < until => now + self.interval / SETTLING_BEATS,
            _ => {
                self.settling_until = None;
                now + self.interval
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `events` (milliseconds from the start, what was seen) to a
    /// pace at a 500 ms interval and checks the next beat, in
    /// milliseconds from the start, after each.
    #[track_caller]
    fn check(events: &[(u64, Seen, u64)]) {
        let start = Instant::now();
        let mut pace = Pace::new(Duration::from_millis(500));
        for (i, &(at, seen, expected)) in events.iter().enumerate() {
            let next = pace.next(seen, start + Duration::from_millis(at));
            assert_eq!((next - start).as_millis() as u64, expected, "event {i}: {seen:?} at {at} ms");
        }
    }

    #[test]
    fn a_quiet_member_beats_at_the_interval() {
        check(&[(0, Seen::Quiet, 500), (500, Seen::Quiet, 1000), (1000, Seen::Quiet, 1500)]);
    }

    #[test]
    fn a_change_quickens_the_beats_for_two_intervals() {
        check(&[
            (0, Seen::Change, 100),
            (100, Seen::Quiet, 200),
            (900, Seen::Quiet, 1000),
            // Settled: back to the coordinator's pace.
            (1000, Seen::Quiet, 1500),
            (1500, Seen::Quiet, 2000),
        ]);
    }

    #[test]
    fn each_change_settles_anew() {
        check(&[
            (0, Seen::Change, 100),
            (800, Seen::Change, 900),
            (1700, Seen::Quiet, 1800),
            (1800, Seen::Quiet, 2300),
        ]);
    }

    #[test]
    fn released_partitions_are_reported_at_once() {
        check(&[(0, Seen::Quiet, 500), (230, Seen::Released, 230), (230, Seen::Quiet, 730)]);
    }

    #[test]
    fn the_coordinators_interval_rules() {
        let start = Instant::now();
        let mut pace = Pace::new(Duration::from_millis(500));
        pace.set_interval(Duration::from_secs(5));
        assert_eq!(pace.next(Seen::Quiet, start) - start, Duration::from_secs(5));
        pace.set_interval(Duration::ZERO);
        assert_eq!(pace.next(Seen::Change, start) - start, Duration::from_secs(1));
    }
}
