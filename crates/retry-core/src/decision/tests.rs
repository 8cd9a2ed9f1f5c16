//! The decision table: each case is a stage, the record's headers, the
//! handler's outcome and the expected decision, rendered as one line.

use super::*;
use crate::{header_names as names, RetrySchedule};
use proptest::prelude::*;

const T0: i64 = 1_000_000;

fn policy(schedule: &str, deadline: Option<Duration>) -> RetryPolicy {
    let schedule: RetrySchedule = schedule.parse().unwrap();
    let topology = RetryTopology::new("o", &schedule).unwrap();
    RetryPolicy::new(topology, PolicyConfig { deadline, ..PolicyConfig::default() })
}

fn headers(pairs: &[(&str, &str)]) -> Headers {
    pairs.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect()
}

/// The retry headers a record on rung `rung` of `o` carries when all is well.
fn on_rung(rung: u32) -> Vec<(&'static str, String)> {
    vec![
        (names::ATTEMPT, (rung + 1).to_string()),
        (names::ORIGINAL_TOPIC, "o".into()),
        (names::ORIGINAL_PARTITION, "2".into()),
        (names::ORIGINAL_OFFSET, "7".into()),
        (names::ORIGINAL_TIMESTAMP, "900000".into()),
        (names::FIRST_FAILURE_AT, "950000".into()),
        (names::DUE_AT, T0.to_string()),
        (names::ERROR_KIND, "transient".into()),
        (names::ERROR, "earlier".into()),
        (names::REPLAY_COUNT, "0".into()),
    ]
}

fn with(mut base: Vec<(&'static str, String)>, changes: &[(&'static str, Option<&str>)]) -> Headers {
    for (name, value) in changes {
        base.retain(|(k, _)| k != name);
        if let Some(v) = value {
            base.push((name, v.to_string()));
        }
    }
    base.push(("traceparent", "abc".into()));
    base.into_iter().map(|(k, v)| (k.to_owned(), v.into_bytes())).collect()
}

/// One line per decision: where it goes and the headers that matter.
fn render(d: &Decision) -> String {
    let (what, h) = match d {
        Decision::Commit => return "commit".into(),
        Decision::Retry { topic, due_at, headers } => (format!("retry {topic} due {}", due_at.as_millis()), headers),
        Decision::DeadLetter { topic, reason, headers } => (format!("dead-letter {topic} ({reason})"), headers),
    };
    let decoded = RetryHeaders::decode(h).unwrap();
    assert_eq!(decoded.due_at.is_some(), matches!(d, Decision::Retry { .. }), "due-at only on retry topics");
    assert_eq!(h.get("traceparent"), Some(&b"abc"[..]), "producer headers are kept");
    format!(
        "{what}: attempt {} from {}/{}@{} first {} {}: {}{}",
        decoded.attempt,
        decoded.original_topic,
        decoded.original_partition,
        decoded.original_offset,
        decoded.first_failure_at.as_millis(),
        decoded.error_kind,
        decoded.error,
        if decoded.replay_count > 0 { format!(" (replayed {})", decoded.replay_count) } else { String::new() },
    )
}

#[track_caller]
fn check(policy: &RetryPolicy, topic: &str, headers: Headers, outcome: Result<(), HandlerError>, expected: &str) {
    let stage = policy.stage_of(topic).expect("a consumed topic");
    let record = RecordMeta {
        topic,
        partition: 2,
        offset: 7,
        timestamp: Some(Timestamp::from_millis(900_000)),
        headers: &headers,
    };
    let decision = policy.decide(stage, &record, &outcome, Timestamp::from_millis(T0));
    assert_eq!(render(&decision), expected);
}

fn transient() -> Result<(), HandlerError> {
    Err(HandlerError::transient("503 from provider"))
}

fn permanent() -> Result<(), HandlerError> {
    Err(HandlerError::permanent("400 from provider"))
}

#[test]
fn source_topic() {
    let p = policy("5s,30s,5m", None);
    let plain = || headers(&[("traceparent", "abc")]);
    check(&p, "o", plain(), Ok(()), "commit");
    check(
        &p,
        "o",
        plain(),
        transient(),
        "retry o.retry-5s due 1005000: attempt 1 from o/2@7 first 1000000 transient: 503 from provider",
    );
    check(
        &p,
        "o",
        plain(),
        permanent(),
        "dead-letter o.dlq (permanent-failure): attempt 1 from o/2@7 first 1000000 permanent: 400 from provider",
    );
}

#[test]
fn source_topic_ignores_stale_retry_headers_but_keeps_the_replay_count() {
    let p = policy("5s,30s,5m", None);
    // A record replayed from the dead-letter topic into the source.
    let replayed =
        with(on_rung(2), &[(names::REPLAY_COUNT, Some("2")), (names::DEAD_LETTER_REASON, Some("retries-exhausted"))]);
    check(
        &p,
        "o",
        replayed.clone(),
        transient(),
        "retry o.retry-5s due 1005000: attempt 1 from o/2@7 first 1000000 transient: 503 from provider (replayed 2)",
    );
    let garbage = with(vec![], &[(names::REPLAY_COUNT, Some("lots")), (names::ATTEMPT, Some("x"))]);
    check(
        &p,
        "o",
        garbage,
        transient(),
        "retry o.retry-5s due 1005000: attempt 1 from o/2@7 first 1000000 transient: 503 from provider",
    );
}

#[test]
fn climbing_the_ladder() {
    let p = policy("5s,30s,5m", None);
    check(&p, "o.retry-5s", with(on_rung(0), &[]), Ok(()), "commit");
    check(
        &p,
        "o.retry-5s",
        with(on_rung(0), &[]),
        transient(),
        "retry o.retry-30s due 1030000: attempt 2 from o/2@7 first 950000 transient: 503 from provider",
    );
    check(
        &p,
        "o.retry-30s",
        with(on_rung(1), &[]),
        transient(),
        "retry o.retry-5m due 1300000: attempt 3 from o/2@7 first 950000 transient: 503 from provider",
    );
    check(
        &p,
        "o.retry-5m",
        with(on_rung(2), &[]),
        transient(),
        "dead-letter o.dlq (retries-exhausted): attempt 4 from o/2@7 first 950000 transient: 503 from provider",
    );
    check(
        &p,
        "o.retry-30s",
        with(on_rung(1), &[]),
        permanent(),
        "dead-letter o.dlq (permanent-failure): attempt 3 from o/2@7 first 950000 permanent: 400 from provider",
    );
    check(
        &p,
        "o.retry-30s",
        with(on_rung(1), &[(names::REPLAY_COUNT, Some("1"))]),
        transient(),
        "retry o.retry-5m due 1300000: attempt 3 from o/2@7 first 950000 transient: 503 from provider (replayed 1)",
    );
}

#[test]
fn a_single_rung() {
    let p = policy("1500ms", None);
    check(
        &p,
        "o",
        headers(&[("traceparent", "abc")]),
        transient(),
        "retry o.retry-1500ms due 1001500: attempt 1 from o/2@7 first 1000000 transient: 503 from provider",
    );
    check(
        &p,
        "o.retry-1500ms",
        with(on_rung(0), &[]),
        transient(),
        "dead-letter o.dlq (retries-exhausted): attempt 2 from o/2@7 first 950000 transient: 503 from provider",
    );
}

#[test]
fn corrupt_retry_headers_dead_letter_instead_of_looping() {
    let p = policy("5s,30s,5m", None);
    let corrupt = |changes: &[(&'static str, Option<&str>)], expected: &str| {
        check(&p, "o.retry-30s", with(on_rung(1), changes), transient(), expected);
    };
    corrupt(
        &[(names::ATTEMPT, Some("two"))],
        r#"dead-letter o.dlq (corrupt-retry-headers): attempt 3 from o.retry-30s/2@7 first 1000000 transient: retry header x-retry-attempt is not a number in range: "two"; last failure: 503 from provider"#,
    );
    corrupt(
        &[(names::ATTEMPT, Some("9"))],
        r#"dead-letter o.dlq (corrupt-retry-headers): attempt 3 from o.retry-30s/2@7 first 1000000 transient: retry header x-retry-attempt is "9" but the topic implies "2"; last failure: 503 from provider"#,
    );
    corrupt(&[(names::ORIGINAL_OFFSET, None)], "dead-letter o.dlq (corrupt-retry-headers): attempt 3 from o.retry-30s/2@7 first 1000000 transient: retry header x-original-offset is missing; last failure: 503 from provider");
    corrupt(
        &[(names::FIRST_FAILURE_AT, Some("-5"))],
        r#"dead-letter o.dlq (corrupt-retry-headers): attempt 3 from o.retry-30s/2@7 first 1000000 transient: retry header x-first-failure-at is negative: "-5"; last failure: 503 from provider"#,
    );
    // No retry headers at all: someone produced straight into a retry topic.
    check(&p, "o.retry-5s", headers(&[("traceparent", "abc")]), permanent(), "dead-letter o.dlq (corrupt-retry-headers): attempt 2 from o.retry-5s/2@7 first 1000000 permanent: retry header x-retry-attempt is missing; last failure: 400 from provider");
    // Success needs no headers: the event was handled.
    check(&p, "o.retry-5s", headers(&[("traceparent", "abc")]), Ok(()), "commit");
}

#[test]
fn the_deadline_cuts_the_ladder_short() {
    // First failure at 950000; the deadline allows retries due until 1010000.
    let p = policy("5s,30s,5m", Some(Duration::from_secs(60)));
    check(
        &p,
        "o",
        headers(&[("traceparent", "abc")]),
        transient(),
        "retry o.retry-5s due 1005000: attempt 1 from o/2@7 first 1000000 transient: 503 from provider",
    );
    check(
        &p,
        "o.retry-5s",
        with(on_rung(0), &[]),
        transient(),
        "dead-letter o.dlq (deadline-exceeded): attempt 2 from o/2@7 first 950000 transient: 503 from provider",
    );
    let p = policy("5s,30s,5m", Some(Duration::from_secs(80)));
    check(
        &p,
        "o.retry-5s",
        with(on_rung(0), &[]),
        transient(),
        "retry o.retry-30s due 1030000: attempt 2 from o/2@7 first 950000 transient: 503 from provider",
    );
}

#[test]
fn stages_cover_source_and_rungs_but_not_the_dlq() {
    let p = policy("5s,30s", None);
    let stages: Vec<(Option<usize>, &str)> = p.stages().map(|(s, t)| (s.rung(), t.as_str())).collect();
    assert_eq!(stages, [(None, "o"), (Some(0), "o.retry-5s"), (Some(1), "o.retry-30s")]);
    assert_eq!(p.stage_of("o.dlq"), None);
    assert_eq!(p.stage_of("elsewhere"), None);
}

#[track_caller]
fn check_due(topic: &str, record_ts: Option<i64>, due_header: Option<&str>, expected: i64) {
    let p = policy("5s,30s", None);
    let h = with(on_rung(p.stage_of(topic).unwrap().rung().unwrap_or(0) as u32), &[(names::DUE_AT, due_header)]);
    let record =
        RecordMeta { topic, partition: 0, offset: 0, timestamp: record_ts.map(Timestamp::from_millis), headers: &h };
    let due = p.due_at(p.stage_of(topic).unwrap(), &record, Timestamp::from_millis(T0));
    assert_eq!(due.as_millis(), expected, "{topic} ts={record_ts:?} due-at={due_header:?}");
}

#[test]
fn due_times() {
    check_due("o", Some(1), Some("99999999"), T0); // the source never waits
    check_due("o.retry-5s", Some(T0), Some("1004000"), 1_004_000); // the header wins
    check_due("o.retry-5s", Some(T0), Some("1"), 1); // already due
    check_due("o.retry-5s", Some(T0), None, 1_005_000); // timestamp + delay
    check_due("o.retry-5s", Some(T0), Some("soon"), 1_005_000);
    check_due("o.retry-5s", None, None, 1_005_000); // now + delay
    check_due("o.retry-5s", Some(T0), Some("99999999999"), 1_006_000); // clamped: delay + 1 s skew
    check_due("o.retry-5s", Some(i64::MAX), None, 1_006_000);
    check_due("o.retry-30s", Some(T0), Some("9223372036854775807"), 1_031_000);
}

fn outcome() -> impl Strategy<Value = Result<(), HandlerError>> {
    prop_oneof![
        1 => Just(Ok(())),
        6 => Just(Err(HandlerError::transient("t"))),
        1 => Just(Err(HandlerError::permanent("p"))),
    ]
}

fn schedule() -> impl Strategy<Value = String> {
    proptest::collection::btree_set(1u64..10_000, 1..=crate::MAX_RUNGS)
        .prop_map(|set| set.into_iter().map(|ms| format!("{ms}ms")).collect::<Vec<_>>().join(","))
}

proptest! {
    /// Follow one record down the ladder as a transport would, with random
    /// outcomes, a random deadline and, sometimes, headers mangled in flight:
    /// it always ends committed or dead-lettered, within the schedule's
    /// attempts, with `x-retry-attempt` counting exactly the failures.
    #[test]
    fn attempts_never_exceed_the_schedule(
        schedule in schedule(),
        deadline_ms in proptest::option::of(0u64..20_000),
        outcomes in proptest::collection::vec(outcome(), 12),
        mangle in proptest::option::of((0usize..12, proptest::sample::select(names::ALL.to_vec()), "[ -~]{0,6}")),
    ) {
        let p = policy(&schedule, deadline_ms.map(Duration::from_millis));
        let max = p.topology().schedule().max_attempts() as usize;
        let mut topic = p.topology().source_topic().clone();
        let mut headers = headers(&[("traceparent", "abc")]);
        let mut now = Timestamp::from_millis(T0);
        for (attempt, outcome) in outcomes.iter().enumerate() {
            prop_assert!(attempt < max, "attempt {} of at most {}", attempt + 1, max);
            if let Some((at, name, value)) = &mangle {
                if *at == attempt {
                    headers.insert(*name, value.as_bytes());
                }
            }
            let stage = p.stage_of(topic.as_str()).unwrap();
            let record = RecordMeta { topic: topic.as_str(), partition: 0, offset: attempt as i64, timestamp: Some(now), headers: &headers };
            now = p.due_at(stage, &record, now);
            match p.decide(stage, &record, outcome, now) {
                Decision::Commit => {
                    prop_assert!(outcome.is_ok());
                    return Ok(());
                }
                Decision::Retry { topic: next, due_at, headers: next_headers } => {
                    prop_assert_eq!(RetryHeaders::decode(&next_headers).unwrap().attempt as usize, attempt + 1);
                    prop_assert!(due_at > now);
                    topic = next;
                    headers = next_headers;
                }
                Decision::DeadLetter { topic: dlq, headers: dlq_headers, .. } => {
                    prop_assert_eq!(dlq, p.topology().dead_letter_topic().clone());
                    let decoded = RetryHeaders::decode(&dlq_headers).unwrap();
                    prop_assert_eq!(decoded.attempt as usize, attempt + 1);
                    prop_assert_eq!(dlq_headers.get("traceparent"), Some(&b"abc"[..]));
                    return Ok(());
                }
            }
        }
        prop_assert!(false, "the record neither committed nor dead-lettered");
    }
}

#[test]
fn a_retry_its_topic_refused_goes_to_the_dead_letter_topic() {
    let p = policy("5s,30s,5m", None);
    let refused = "the retry topic o.retry-30s refused the record as too large";
    #[track_caller]
    fn check_refused(p: &RetryPolicy, retry: Headers, expected: &str) {
        let refused = "the retry topic o.retry-30s refused the record as too large";
        assert_eq!(render(&p.too_large_for_retry(&retry, refused)), expected);
    }
    // The retry a rung decided, as it would have been written.
    check_refused(
        &p,
        with(on_rung(1), &[(names::ATTEMPT, Some("2")), (names::ERROR, Some("503 from provider"))]),
        &format!("dead-letter o.dlq (too-large-for-retry): attempt 2 from o/2@7 first 950000 transient: {refused}; last failure: 503 from provider"),
    );
    // A replayed record keeps its count.
    check_refused(
        &p,
        with(on_rung(0), &[(names::REPLAY_COUNT, Some("3"))]),
        &format!("dead-letter o.dlq (too-large-for-retry): attempt 1 from o/2@7 first 950000 transient: {refused}; last failure: earlier (replayed 3)"),
    );
    // Headers not ours (never decided so): the reason and the problem on them.
    let Decision::DeadLetter { reason, headers, .. } = p.too_large_for_retry(&headers(&[("k", "v")]), refused) else {
        panic!("always dead-lettered")
    };
    assert_eq!(reason, DeadLetterReason::TooLargeForRetry);
    assert_eq!(headers.get(names::DEAD_LETTER_REASON), Some(&b"too-large-for-retry"[..]));
    assert_eq!(headers.get(names::ERROR), Some(refused.as_bytes()));
    assert_eq!(headers.get("k"), Some(&b"v"[..]));
}

/// Which records reach their handler under an idempotency window of 100 s
/// (the ages are counted from T0 = 1000 s): each case is a stage, the
/// record's timestamp and headers, and what `admit` says.
#[test]
fn the_idempotency_window_at_handling_time() {
    let config = PolicyConfig { max_event_age: Some(Duration::from_secs(100)), ..PolicyConfig::default() };
    let p = RetryPolicy::new(RetryTopology::new("o", &"5s,30s".parse().unwrap()).unwrap(), config);
    let fresh = (T0 - 99_999).to_string();
    let old = (T0 - 100_000).to_string();
    let rung = |changes: &[(&'static str, Option<&str>)]| with(on_rung(1), changes);
    type Case<'a> = (&'a str, &'a str, Option<i64>, Headers, &'a str);
    let table: Vec<Case<'_>> = vec![
        ("source, just inside", "o", Some(T0 - 99_999), with(vec![], &[]), "handled"),
        (
            "source, exactly the window",
            "o",
            Some(T0 - 100_000),
            with(vec![], &[]),
            "dead-letter (idempotency-window-passed) 1m40s",
        ),
        ("source, in the future", "o", Some(T0 + 5_000), with(vec![], &[]), "handled"),
        ("source, no timestamp", "o", None, with(vec![], &[]), "handled"),
        // A replayed record is as old as its event, not its new record.
        (
            "source, replayed old event",
            "o",
            Some(T0),
            headers(&[("x-first-timestamp", &old), ("traceparent", "abc")]),
            "dead-letter (idempotency-window-passed) 1m40s",
        ),
        (
            "source, replayed recent event",
            "o",
            Some(T0),
            headers(&[("x-first-timestamp", &fresh), ("traceparent", "abc")]),
            "handled",
        ),
        (
            "source, replayed overriding the window",
            "o",
            Some(T0),
            headers(&[
                ("x-first-timestamp", &old),
                ("x-idempotency-window-overridden-at", "5"),
                ("traceparent", "abc"),
            ]),
            "handled",
        ),
        (
            "source, garbage first timestamp: its own",
            "o",
            Some(T0),
            headers(&[("x-first-timestamp", "soon"), ("traceparent", "abc")]),
            "handled",
        ),
        // On a rung, the record's own timestamp is its republication: the
        // original's counts.
        (
            "rung, original inside",
            "o.retry-30s",
            Some(T0),
            rung(&[(names::ORIGINAL_TIMESTAMP, Some(&fresh))]),
            "handled",
        ),
        (
            "rung, original outside",
            "o.retry-30s",
            Some(T0),
            rung(&[(names::ORIGINAL_TIMESTAMP, Some(&old))]),
            "dead-letter (idempotency-window-passed) 1m40s",
        ),
        (
            "rung, no original timestamp: its first failure",
            "o.retry-30s",
            Some(T0),
            rung(&[(names::ORIGINAL_TIMESTAMP, None), (names::FIRST_FAILURE_AT, Some(&old))]),
            "dead-letter (idempotency-window-passed) 1m40s",
        ),
        (
            "rung, overridden",
            "o.retry-30s",
            Some(T0),
            rung(&[(names::ORIGINAL_TIMESTAMP, Some(&old)), ("x-idempotency-window-overridden-at", Some("5"))]),
            "handled",
        ),
        (
            "rung, corrupt headers: unknown age",
            "o.retry-30s",
            Some(T0 - 500_000),
            rung(&[(names::ATTEMPT, Some("x"))]),
            "handled",
        ),
    ];
    for (case, topic, timestamp, headers, expected) in table {
        let stage = p.stage_of(topic).unwrap();
        let record = RecordMeta {
            topic,
            partition: 2,
            offset: 7,
            timestamp: timestamp.map(Timestamp::from_millis),
            headers: &headers,
        };
        let got = match p.admit(stage, &record, Timestamp::from_millis(T0)) {
            None => "handled".to_owned(),
            Some(Decision::DeadLetter { topic, reason, headers }) => {
                assert_eq!(topic.as_str(), "o.dlq", "{case}");
                let ours = RetryHeaders::decode(&headers).unwrap();
                assert_eq!(ours.dead_letter_reason, Some(reason), "{case}");
                assert_eq!(ours.error_kind, FailureKind::Permanent, "{case}");
                assert!(ours.error.contains("idempotency window"), "{case}: {}", ours.error);
                let age = ours.error.split_whitespace().nth(2).unwrap().to_owned();
                format!("dead-letter ({reason}) {age}")
            }
            Some(other) => panic!("{case}: {other:?}"),
        };
        assert_eq!(got, expected, "{case}");
    }
    // Without a window, any age is handled.
    let p = policy("5s", None);
    let none = Headers::new();
    let ancient =
        RecordMeta { topic: "o", partition: 0, offset: 0, timestamp: Some(Timestamp::from_millis(0)), headers: &none };
    assert_eq!(p.admit(Stage::SOURCE, &ancient, Timestamp::from_millis(i64::MAX)), None);
}

/// What a failure attaches travels with the record: to the next rung and to
/// the dead-letter topic, replacing the record's own value of that name;
/// the names of our headers cannot be attached; a success attaches nothing.
#[test]
fn headers_attached_by_a_failure_travel_with_the_record() {
    let p = policy("5s", None);
    let now = Timestamp::from_millis(T0);
    let source = headers(&[("billing-currency", "USD"), ("traceparent", "abc")]);
    let failed = |e: HandlerError| Err(e.with_header("billing-currency", "EUR").with_header(names::ATTEMPT, "99"));
    type Case<'a> = (&'a str, Headers, Result<(), HandlerError>, &'a str);
    let table: Vec<Case<'_>> = vec![
        ("source, transient", source.clone(), failed(HandlerError::transient("503")), "retry o.retry-5s"),
        ("source, permanent", source.clone(), failed(HandlerError::permanent("400")), "dead-letter o.dlq"),
        (
            "last rung, transient",
            with(on_rung(0), &[("billing-currency", Some("USD"))]),
            failed(HandlerError::transient("503")),
            "dead-letter o.dlq",
        ),
    ];
    for (case, headers, outcome, expected) in table {
        let topic = if case.starts_with("source") { "o" } else { "o.retry-5s" };
        let record = RecordMeta { topic, partition: 2, offset: 7, timestamp: Some(now), headers: &headers };
        let decision = p.decide(p.stage_of(topic).unwrap(), &record, &outcome, now);
        let (to, h) = match &decision {
            Decision::Retry { topic, headers, .. } => (format!("retry {topic}"), headers),
            Decision::DeadLetter { topic, headers, .. } => (format!("dead-letter {topic}"), headers),
            Decision::Commit => panic!("{case}: committed"),
        };
        assert_eq!(to, expected, "{case}");
        let currencies: Vec<&[u8]> = h.iter().filter(|(k, _)| *k == "billing-currency").map(|(_, v)| v).collect();
        assert_eq!(currencies, [&b"EUR"[..]], "{case}: one value, the attached one");
        assert_eq!(h.get("traceparent"), Some(&b"abc"[..]), "{case}");
        assert_ne!(h.get(names::ATTEMPT), Some(&b"99"[..]), "{case}: our headers are ours");
    }
}

/// A record's journey down a ladder named and written as Spring's, in each
/// style that writes Spring's headers: every hop reads back as decided
/// (through Spring's headers alone in the Spring style), Spring's attempt
/// count and due times appended hop after hop, its original coordinates
/// written once.
#[test]
fn a_journey_in_springs_style_reads_back_as_decided() {
    use crate::spring::header_names as spring;
    let styles = [(HeaderStyle::Spring, false), (HeaderStyle::Both, true)];
    for (style, native) in styles {
        let schedule: RetrySchedule = "1s,2s".parse().unwrap();
        let topology = RetryTopology::spring("o", &schedule).unwrap();
        let policy = RetryPolicy::new(topology, PolicyConfig { header_style: style, ..PolicyConfig::default() });
        let failed = Err(HandlerError::transient("provider answered 503"));
        let mut carried = headers(&[("traceparent", "abc")]);
        let mut now = T0;
        let mut expected_topics = vec!["o-retry-1000", "o-retry-2000", "o-dlt"].into_iter();
        for (attempt, stage) in [(1, Stage::SOURCE), (2, Stage::rung_at(0)), (3, Stage::rung_at(1))] {
            let meta = RecordMeta {
                topic: "o",
                partition: 2,
                offset: 7,
                timestamp: Some(Timestamp::from_millis(900_000)),
                headers: &carried,
            };
            let decision = policy.decide(stage, &meta, &failed, Timestamp::from_millis(now));
            let (topic, next) = match decision {
                Decision::Retry { topic, headers, .. } | Decision::DeadLetter { topic, headers, .. } => {
                    (topic, headers)
                }
                Decision::Commit => panic!("{style:?}: a failure is never committed"),
            };
            assert_eq!(Some(topic.as_str()), expected_topics.next(), "{style:?} attempt {attempt}");
            let read = RetryHeaders::decode(&next).unwrap();
            assert_eq!((read.attempt, read.original_offset, read.original_partition), (attempt, 7, 2), "{style:?}");
            assert_eq!(next.get(names::ATTEMPT).is_some(), native, "{style:?}: ours written or not");
            let values = |name: &str| next.iter().filter(|(k, _)| *k == name).count();
            assert_eq!(values(spring::ORIGINAL_TOPIC), 1, "{style:?}: written once");
            assert_eq!(values(spring::ATTEMPTS), attempt as usize, "{style:?}: appended at every hop");
            assert_eq!(next.get(spring::ATTEMPTS), Some(&(attempt as i32 + 1).to_be_bytes()[..]));
            assert_eq!(next.get("traceparent"), Some(&b"abc"[..]), "{style:?}: the producer's header kept");
            carried = next;
            now += 10_000;
        }
    }
}

/// A permanent failure written in Spring's style reads back permanent,
/// with its message as it was: the kind travels as the exception's class.
#[test]
fn a_permanent_failure_in_springs_style_reads_back_permanent() {
    let schedule: RetrySchedule = "1s".parse().unwrap();
    let topology = RetryTopology::spring("o", &schedule).unwrap();
    let policy =
        RetryPolicy::new(topology, PolicyConfig { header_style: HeaderStyle::Spring, ..PolicyConfig::default() });
    let none = Headers::new();
    let meta = RecordMeta { topic: "o", partition: 0, offset: 3, timestamp: None, headers: &none };
    let failed = Err(HandlerError::permanent("card declined"));
    let Decision::DeadLetter { topic, headers, .. } =
        policy.decide(Stage::SOURCE, &meta, &failed, Timestamp::from_millis(T0))
    else {
        panic!("a permanent failure is dead-lettered")
    };
    assert_eq!(topic.as_str(), "o-dlt");
    let read = RetryHeaders::decode(&headers).unwrap();
    assert_eq!((read.error_kind, read.error.as_str()), (FailureKind::Permanent, "card declined"));
}
