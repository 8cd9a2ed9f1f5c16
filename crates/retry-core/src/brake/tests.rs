use std::time::Duration;

use super::*;
use crate::{FailureKind::Permanent, FailureKind::Transient, Headers, TopicName};

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

/// Engages at 50 % of at least 4 calls within 10 s; probes after 1 s,
/// doubling up to 4 s; releases after 2 good probes; holds dead letters 60 s.
fn config() -> BrakeConfig {
    BrakeConfig::default()
        .with_window(Duration::from_secs(10))
        .unwrap()
        .with_threshold(50, 4)
        .unwrap()
        .with_probe_pauses(BackoffConfig::new(Duration::from_secs(1), Duration::from_secs(4)).unwrap())
        .with_resume_after(2)
        .unwrap()
        .with_max_engaged(Duration::from_secs(60))
        .unwrap()
}

/// One step of a scenario.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// At `ms`, a call ended (`None`: success); `true` if it was a probe.
    End(i64, Option<FailureKind>, bool),
    /// At `ms`, the transport asks what may start.
    Ask(i64),
}

use Step::{Ask, End};

/// What each step answered, one line per step.
fn run(steps: &[Step]) -> Vec<String> {
    let mut brake = Brake::new(config(), || 0.0);
    steps
        .iter()
        .map(|step| match *step {
            End(ms, failure, probe) => {
                let change = brake.finished(failure, if probe { Call::Probe } else { Call::Usual }, at(ms), at(ms));
                format!("{ms}: end {failure:?} probe={probe} -> {change:?}, {:?}", brake.state())
            }
            Ask(ms) => format!("{ms}: ask -> {:?}", brake.permit(at(ms))),
        })
        .collect()
}

#[track_caller]
fn check(steps: &[Step], expected: &[&str]) {
    assert_eq!(run(steps), expected);
}

#[test]
fn engages_at_the_threshold() {
    check(
        &[
            End(0, None, false),
            End(1, None, false),
            End(2, Some(Transient), false),
            Ask(3),
            End(4, Some(Transient), false),
            Ask(5),
        ],
        &[
            "0: end None probe=false -> None, Running",
            "1: end None probe=false -> None, Running",
            "2: end Some(Transient) probe=false -> None, Running",
            "3: ask -> Run",
            "4: end Some(Transient) probe=false -> Some(Engaged { failed: 2, calls: 4 }), Paused",
            "5: ask -> WaitUntil(Timestamp(1004))",
        ],
    );
}

#[test]
fn a_run_of_failures_engages_whatever_successes_the_window_holds() {
    let mut steps: Vec<Step> = (0..10).map(|ms| End(ms, None, false)).collect();
    steps.extend((10..13).map(|ms| End(ms, Some(Transient), false)));
    steps.push(End(13, Some(Permanent), false)); // not a success: the run goes on
    steps.push(End(14, Some(Transient), false));
    let answers = run(&steps);
    assert_eq!(answers[12], "12: end Some(Transient) probe=false -> None, Running", "3 in a row, 3 of 13");
    assert_eq!(answers[14], "14: end Some(Transient) probe=false -> Some(Engaged { failed: 4, calls: 4 }), Paused");
    // A success breaks the run.
    let mut steps: Vec<Step> = (0..10).map(|ms| End(ms, None, false)).collect();
    steps.extend([10, 11, 12].map(|ms| End(ms, Some(Transient), false)));
    steps.extend([End(13, None, false), End(14, Some(Transient), false)]);
    assert!(run(&steps).iter().all(|a| a.ends_with("Running")));
}

#[test]
fn a_run_of_failures_older_than_the_window_is_over() {
    let mut brake = Brake::new(config(), || 0.0);
    for ms in [0, 9_000, 18_000] {
        assert_eq!(brake.finished(Some(Transient), Call::Usual, at(ms), at(ms)), None);
    }
    // 10 s after the last one, the run starts over: 3 in a row, not 4.
    for ms in [28_000, 28_001, 28_002] {
        assert_eq!(brake.finished(Some(Transient), Call::Usual, at(ms), at(ms)), None, "{ms}");
    }
    assert_eq!(brake.state(), BrakeState::Running);
}

#[test]
fn calls_started_before_a_release_do_not_count_after_it() {
    let mut brake = Brake::new(config(), || 0.0);
    for ms in 0..4 {
        brake.finished(Some(Transient), Call::Usual, at(ms), at(ms));
    }
    assert_eq!(brake.permit(at(1_003)), Permit::Probe);
    brake.finished(None, Call::Probe, at(1_003), at(1_004));
    assert_eq!(brake.permit(at(1_005)), Permit::Probe);
    assert_eq!(brake.finished(None, Call::Probe, at(1_005), at(1_006)), Some(BrakeChange::Released));
    // Calls that hung through the outage time out now: they count for nothing.
    for ms in 1_007..1_020 {
        assert_eq!(brake.finished(Some(Transient), Call::Usual, at(2), at(ms)), None);
    }
    assert_eq!(brake.state(), BrakeState::Running);
    // Calls started after the release do.
    for ms in 1_020..1_024 {
        brake.finished(Some(Transient), Call::Usual, at(ms), at(ms));
    }
    assert_eq!(brake.state(), BrakeState::Paused);
    assert_eq!(brake.holds_until(), Some(at(1_023 + 60_000)));
}

#[test]
fn too_few_calls_never_engage() {
    check(
        &[End(0, Some(Transient), false), End(1, Some(Transient), false), End(2, Some(Transient), false), Ask(3)],
        &[
            "0: end Some(Transient) probe=false -> None, Running",
            "1: end Some(Transient) probe=false -> None, Running",
            "2: end Some(Transient) probe=false -> None, Running",
            "3: ask -> Run",
        ],
    );
}

#[test]
fn permanent_failures_never_count() {
    let mut steps: Vec<Step> = (0..10).map(|ms| End(ms, Some(Permanent), false)).collect();
    steps.extend([End(10, None, false), End(11, None, false), End(12, Some(Transient), false), Ask(13)]);
    let answers = run(&steps);
    assert!(answers.iter().all(|a| a.ends_with("Running") || a.ends_with("Run")), "{answers:#?}");
}

#[test]
fn outcomes_leave_the_window_when_it_slides_past_them() {
    check(
        &[
            End(0, Some(Transient), false),
            End(1, Some(Transient), false),
            End(2, Some(Transient), false),
            // 10 s on, the first two are out: 2 calls, too few.
            End(10_001, None, false),
            // The third is out at 10 002: 2 calls again.
            End(10_002, Some(Transient), false),
            End(10_003, Some(Transient), false),
            End(10_004, Some(Transient), false),
        ],
        &[
            "0: end Some(Transient) probe=false -> None, Running",
            "1: end Some(Transient) probe=false -> None, Running",
            "2: end Some(Transient) probe=false -> None, Running",
            "10001: end None probe=false -> None, Running",
            "10002: end Some(Transient) probe=false -> None, Running",
            "10003: end Some(Transient) probe=false -> None, Running",
            "10004: end Some(Transient) probe=false -> Some(Engaged { failed: 3, calls: 4 }), Paused",
        ],
    );
}

/// Four transient failures at 0 to 3 ms: engaged at 3 ms, first probe at 1 003.
fn engaged() -> Vec<Step> {
    (0..4).map(|ms| End(ms, Some(Transient), false)).collect()
}

#[test]
fn probes_one_at_a_time_pausing_longer_after_each_failure_and_releases_after_enough_successes() {
    let mut steps = engaged();
    steps.extend([
        Ask(1_002),
        Ask(1_003),
        Ask(1_004),
        // A call started before the brake engaged ends: it changes nothing.
        End(1_005, None, false),
        End(1_006, Some(Transient), true),
        Ask(1_007),
        Ask(3_006),
        End(3_010, Some(Transient), true),
        Ask(7_010),
        // A permanent failure says nothing of the downstream: probe again.
        End(7_011, Some(Permanent), true),
        Ask(7_012),
        End(7_013, None, true),
        Ask(7_014),
        End(7_015, None, true),
        Ask(7_016),
    ]);
    assert_eq!(
        run(&steps)[4..],
        [
            "1002: ask -> WaitUntil(Timestamp(1003))",
            "1003: ask -> Probe",
            "1004: ask -> WaitForProbe",
            "1005: end None probe=false -> None, Probing",
            "1006: end Some(Transient) probe=true -> Some(ProbeFailed { until: Timestamp(3006) }), Paused",
            "1007: ask -> WaitUntil(Timestamp(3006))",
            "3006: ask -> Probe",
            "3010: end Some(Transient) probe=true -> Some(ProbeFailed { until: Timestamp(7010) }), Paused",
            "7010: ask -> Probe",
            "7011: end Some(Permanent) probe=true -> None, Probing",
            "7012: ask -> Probe",
            "7013: end None probe=true -> None, Probing",
            "7014: ask -> Probe",
            "7015: end None probe=true -> Some(Released), Running",
            "7016: ask -> Run",
        ]
    );
}

#[test]
fn an_abandoned_probe_lets_another_start() {
    let mut brake = Brake::new(config(), || 0.0);
    for ms in 0..4 {
        brake.finished(Some(Transient), Call::Usual, at(ms), at(ms));
    }
    assert_eq!(brake.engaged_since(), Some(at(3)));
    assert_eq!(brake.permit(at(1_003)), Permit::Probe);
    assert_eq!(brake.permit(at(1_004)), Permit::WaitForProbe);
    brake.probe_abandoned();
    assert_eq!(brake.permit(at(1_005)), Permit::Probe);
}

#[test]
fn pauses_start_over_after_a_release() {
    let mut steps = engaged();
    steps.extend([Ask(1_003), End(1_004, None, true), Ask(1_005), End(1_006, None, true)]);
    steps.extend((0..4).map(|i| End(2_000 + i, Some(Transient), false)));
    steps.push(Ask(2_004));
    let answers = run(&steps);
    assert_eq!(answers.last().unwrap(), "2004: ask -> WaitUntil(Timestamp(3003))", "{answers:#?}");
}

#[test]
fn exhausted_records_wait_while_engaged_for_at_most_the_maximum() {
    let dead_letter = |reason| Decision::DeadLetter {
        topic: TopicName::new("orders.dlq").unwrap(),
        reason,
        headers: Headers::default(),
    };
    let exhausted = dead_letter(DeadLetterReason::RetriesExhausted);
    let mut brake = Brake::new(config(), || 0.0);
    assert!(!brake.holds(&exhausted, at(0)), "a running brake holds nothing");
    for ms in 0..4 {
        brake.finished(Some(Transient), Call::Usual, at(ms), at(ms));
    }
    for (decision, ms, held) in [
        (&exhausted, 3, true),
        (&exhausted, 60_002, true),
        (&exhausted, 60_003, false),
        (&dead_letter(DeadLetterReason::PermanentFailure), 10, false),
        (&dead_letter(DeadLetterReason::CorruptRetryHeaders), 10, false),
        (&Decision::Commit, 10, false),
    ] {
        assert_eq!(brake.holds(decision, at(ms)), held, "{decision:?} at {ms}");
    }
}

#[test]
fn settings_are_checked() {
    let d = BrakeConfig::default();
    assert!(d.with_window(Duration::from_millis(999)).is_err());
    assert!(d.with_threshold(101, 1).is_err());
    assert!(d.with_threshold(0, 1).is_err());
    assert!(d.with_threshold(50, 0).is_err());
    assert!(d.with_resume_after(0).is_err());
    assert!(d.with_max_engaged(Duration::ZERO).is_err());
    assert!(d.with_threshold(100, 1).is_ok());
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    /// What a transport may do next, `ms` after the previous step.
    #[derive(Debug, Clone)]
    enum Op {
        Ask(u16),
        /// A usual call ends: `None` success, `Some(true)` transient, `Some(false)` permanent.
        End(u16, Option<bool>),
        /// The probe in flight, if any, ends the same way.
        EndProbe(u16, Option<bool>),
        AbandonProbe,
    }

    fn op() -> impl Strategy<Value = Op> {
        let outcome = prop_oneof![Just(None), Just(Some(true)), Just(Some(false))];
        prop_oneof![
            (0u16..3_000).prop_map(Op::Ask),
            (0u16..3_000, outcome.clone()).prop_map(|(ms, o)| Op::End(ms, o)),
            (0u16..3_000, outcome).prop_map(|(ms, o)| Op::EndProbe(ms, o)),
            Just(Op::AbandonProbe),
        ]
    }

    fn kind(outcome: Option<bool>) -> Option<FailureKind> {
        outcome.map(|transient| if transient { Transient } else { Permanent })
    }

    proptest! {
        /// Whatever happens, at most one probe is out at a time, a running
        /// brake permits everything, and only transient failures engage it.
        #[test]
        fn one_probe_at_a_time_and_only_transient_failures_engage(ops in prop::collection::vec(op(), 0..200)) {
            let mut brake = Brake::new(config(), || 0.5);
            let mut now = at(0);
            let mut probing = false;
            let mut transient_seen = false;
            for op in ops {
                match op {
                    Op::Ask(ms) => {
                        now = now.saturating_add(Duration::from_millis(u64::from(ms)));
                        let permit = brake.permit(now);
                        if permit == Permit::Probe {
                            prop_assert!(!probing, "a second probe while one is out");
                            probing = true;
                        }
                        if brake.state() == BrakeState::Running {
                            prop_assert_eq!(permit, Permit::Run);
                        }
                    }
                    Op::End(ms, outcome) => {
                        now = now.saturating_add(Duration::from_millis(u64::from(ms)));
                        transient_seen |= outcome == Some(true);
                        brake.finished(kind(outcome), Call::Usual, now, now);
                    }
                    Op::EndProbe(ms, outcome) if probing => {
                        now = now.saturating_add(Duration::from_millis(u64::from(ms)));
                        transient_seen |= outcome == Some(true);
                        probing = false;
                        brake.finished(kind(outcome), Call::Probe, now, now);
                    }
                    Op::EndProbe(..) => {}
                    Op::AbandonProbe => {
                        if probing {
                            brake.probe_abandoned();
                            probing = false;
                        }
                    }
                }
                if !transient_seen {
                    prop_assert_eq!(brake.state(), BrakeState::Running, "engaged without a transient failure");
                }
            }
        }
    }
}

/// An engagement another brake recorded is taken up only when it is one,
/// still within the maximum, and this brake runs; taken up, the next
/// permit is a probe and exhausted records are held.
#[test]
fn a_marker_is_taken_up_while_it_still_holds() {
    let max = config().max_engaged().as_millis() as i64;
    let now = at(10 * max);
    let engaged = |ms: i64| format!("brake-engaged-since:{ms}");
    let table: &[(&str, String, bool, Option<i64>)] = &[
        ("half a minute ago", engaged(now.as_millis() - 30_000), true, Some(now.as_millis() - 30_000)),
        ("just within the maximum", engaged(now.as_millis() - max + 1), true, Some(now.as_millis() - max + 1)),
        ("the maximum ago", engaged(now.as_millis() - max), false, None),
        ("from the future: as of now", engaged(now.as_millis() + 5_000), true, Some(now.as_millis())),
        ("not a marker", "handled-above:5".to_owned(), false, None),
        ("garbage after the prefix", "brake-engaged-since:soon".to_owned(), false, None),
        ("empty", String::new(), false, None),
    ];
    for (case, marker, resumed, since) in table {
        let mut brake = Brake::new(config(), || 0.0);
        assert_eq!(brake.resume(marker, now), *resumed, "{case}");
        assert_eq!(brake.engaged_since().map(|t| t.as_millis()), *since, "{case}");
        if *resumed {
            assert_eq!(brake.permit(now), Permit::Probe, "{case}: probes first");
            assert_eq!(brake.marker(), Some(engaged(since.unwrap())), "{case}: and passes it on");
        }
    }
    // An engaged brake keeps its own engagement.
    let mut brake = Brake::new(config(), || 0.0);
    assert!(brake.resume(&engaged(now.as_millis() - 1_000), now));
    assert!(!brake.resume(&engaged(now.as_millis() - 500), now));
    assert_eq!(brake.engaged_since(), Some(at(now.as_millis() - 1_000)));
}
