//! What a group member's session allows: how long its requests may take,
//! and which of its settings fit together. Pure; the member does the I/O.
//!
//! The coordinator drops a member that sent no heartbeat for the session
//! timeout. A request that waits longer than what is left of the session
//! cannot save it; one that waits the whole request timeout (30 s by
//! default, against a 10 s session) keeps a member working on partitions
//! the group gave to another meanwhile.

use std::time::Duration;

/// The least a heartbeat is given, however little of the session is left:
/// a heartbeat that cannot even be answered in time only says the session
/// is lost, which the next step finds out anyway.
const MIN_HEARTBEAT_WAIT: Duration = Duration::from_millis(200);

/// How long one request to a group's coordinator (finding it, an offset
/// fetch or commit, a leave) or a listing a member needs mid-rebalance may
/// take: the request timeout, but at most half the session, so a member
/// whose coordinator stopped answering notices, and can try again, while
/// its session lasts.
pub(crate) fn request_bound(request_timeout: Duration, session_timeout: Duration) -> Duration {
    request_timeout.min(session_timeout / 2).max(MIN_HEARTBEAT_WAIT)
}

/// How long one heartbeat may take when none got through for `silent_for`:
/// what is left of the session, within the [`request_bound`].
pub(crate) fn heartbeat_bound(request_timeout: Duration, session_timeout: Duration, silent_for: Duration) -> Duration {
    let left = session_timeout.saturating_sub(silent_for);
    request_bound(request_timeout, session_timeout).min(left).max(MIN_HEARTBEAT_WAIT)
}

/// A listener's timing settings, to check together.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timings {
    pub(crate) request_timeout: Duration,
    pub(crate) session_timeout: Duration,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) rebalance_timeout: Duration,
    pub(crate) handler_timeout: Duration,
    pub(crate) shutdown_grace: Duration,
}

/// How long an aborted handler call may take to end before it is given up
/// (detached and reported): a call that ignores its cancellation (it blocks
/// its thread) would otherwise hold its partition, and the rebalance, for
/// as long as it runs.
pub(crate) const ABORT_WAIT: Duration = Duration::from_secs(2);

/// How long a member waits for its partitions' workers once told to
/// abandon their records: a spawned call's [`ABORT_WAIT`], and a moment for
/// its worker to end. A worker still running after that is held by a
/// polled call that blocks its thread, and is detached.
pub(crate) const DETACH_WAIT: Duration = Duration::from_secs(3);

impl Timings {
    /// How long records in flight may finish when the member's partitions
    /// are revoked by a rebalance: every call gets its whole timeout (a
    /// rebalance abandons no call that is still within it), or the
    /// shutdown grace where that is longer.
    pub(crate) fn revocation_grace(&self) -> Duration {
        self.handler_timeout.max(self.shutdown_grace)
    }

    /// What does not fit, said as what to change; `None` when all fits.
    pub(crate) fn problem(&self) -> Option<String> {
        let t = self;
        let bound = request_bound(t.request_timeout, t.session_timeout);
        // What a revoked member may take before it rejoins: its calls'
        // time, aborting what outlives it, a last commit.
        let grace = t.revocation_grace();
        let drain = grace + DETACH_WAIT + bound;
        if t.session_timeout.is_zero() || t.heartbeat_interval.is_zero() {
            Some("session_timeout and heartbeat_interval must be positive".to_owned())
        } else if t.heartbeat_interval * 2 > t.session_timeout {
            Some(format!(
                "heartbeat_interval ({:?}) must be at most half of session_timeout ({:?}), or one late heartbeat \
                 loses the session",
                t.heartbeat_interval, t.session_timeout
            ))
        } else if t.handler_timeout.is_zero() {
            Some("handler_timeout must be positive".to_owned())
        } else if drain >= t.rebalance_timeout {
            Some(format!(
                "rebalance_timeout ({:?}) must exceed what a revoked member may take to rejoin: the calls in \
                 flight ({grace:?}, the longer of handler_timeout and shutdown_grace), {DETACH_WAIT:?} to abort \
                 what outlives them, and a last commit ({bound:?}, the request timeout within half the session), \
                 {drain:?} in all; or a rebalance evicts it",
                t.rebalance_timeout
            ))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn requests_fit_in_the_session() {
        #[track_caller]
        fn check(request: f64, session: f64, expected: f64) {
            assert_eq!(request_bound(s(request), s(session)), s(expected), "request {request} s, session {session} s");
        }
        check(30.0, 10.0, 5.0); // the defaults: half the session, not 30 s
        check(3.0, 10.0, 3.0);
        check(30.0, 60.0, 30.0);
        check(30.0, 0.1, 0.2); // a floor
    }

    #[test]
    fn a_heartbeat_waits_at_most_what_is_left_of_the_session() {
        #[track_caller]
        fn check(silent: f64, expected: f64) {
            assert_eq!(heartbeat_bound(s(30.0), s(10.0), s(silent)), s(expected), "silent for {silent} s");
        }
        check(0.0, 5.0);
        check(3.0, 5.0);
        check(6.0, 4.0);
        check(9.5, 0.5);
        check(10.0, 0.2);
        check(60.0, 0.2);
    }

    #[test]
    fn settings_that_do_not_fit_together() {
        let fine = Timings {
            request_timeout: s(30.0),
            session_timeout: s(10.0),
            heartbeat_interval: s(3.0),
            rebalance_timeout: s(60.0),
            handler_timeout: s(30.0),
            shutdown_grace: s(30.0),
        };
        #[track_caller]
        fn check(t: Timings, expected: Option<&str>) {
            let problem = t.problem();
            match (expected, &problem) {
                (None, None) => {}
                (Some(part), Some(p)) if p.contains(part) => {}
                _ => panic!("{t:?}: expected {expected:?}, got {problem:?}"),
            }
        }
        check(fine, None);
        check(Timings { heartbeat_interval: s(6.0), ..fine }, Some("at most half of session_timeout"));
        check(Timings { handler_timeout: Duration::ZERO, ..fine }, Some("handler_timeout must be positive"));
        // 30 s for calls + 3 s to abort + 5 s to commit.
        check(Timings { rebalance_timeout: s(38.0), ..fine }, Some("38s in all"));
        check(Timings { rebalance_timeout: s(38.5), ..fine }, None);
        // The handler's timeout counts, however short the shutdown grace.
        check(Timings { shutdown_grace: s(1.0), rebalance_timeout: s(38.0), ..fine }, Some("38s in all"));
        check(
            Timings { handler_timeout: s(5.0), shutdown_grace: s(40.0), rebalance_timeout: s(48.0), ..fine },
            Some("48s in all"),
        );
        check(Timings { session_timeout: Duration::ZERO, ..fine }, Some("must be positive"));
    }

    #[test]
    fn a_rebalance_lets_every_call_run_its_time() {
        let t = |handler: f64, grace: f64| Timings {
            request_timeout: s(30.0),
            session_timeout: s(10.0),
            heartbeat_interval: s(3.0),
            rebalance_timeout: s(60.0),
            handler_timeout: s(handler),
            shutdown_grace: s(grace),
        };
        assert_eq!(t(30.0, 10.0).revocation_grace(), s(30.0));
        assert_eq!(t(5.0, 10.0).revocation_grace(), s(10.0));
    }
}
