//! Replaying a dead-lettered record: which topic it goes back to, which
//! headers it carries there, and the guards that refuse it. Operators
//! decide to replay; this only says how, and when not.

use std::time::Duration;

use crate::{header_names as names, Headers, RetryHeaders, RetryPolicy, Timestamp, TopicName};

/// Where a replay writes: the source topic (the record starts the ladder
/// again) or the first retry rung (it gets the first rung's attempt at once,
/// Uber's "merge" of the dead-letter queue back into the ladder).
///
/// ```
/// use retry_core::{replay::ReplayTarget, RetryPolicy, RetryTopology};
///
/// let topology = RetryTopology::new("orders", &"5s,30s".parse().unwrap()).unwrap();
/// let policy = RetryPolicy::new(topology, Default::default());
/// assert_eq!(policy.replay_topic(ReplayTarget::Source).as_str(), "orders");
/// assert_eq!(policy.replay_topic(ReplayTarget::FirstRetry).as_str(), "orders.retry-5s");
/// assert_eq!(policy.replay_target("orders.retry-5s"), Some(ReplayTarget::FirstRetry));
/// // Only the start of the ladder takes replays.
/// assert_eq!(policy.replay_target("orders.retry-30s"), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayTarget {
    /// The listener's source topic.
    Source,
    /// The first retry topic.
    FirstRetry,
}

/// The guards a replay applies to each record; `None` lifts a guard, which
/// an operator must ask for explicitly.
///
/// ```
/// use std::time::Duration;
/// use retry_core::{Headers, replay::ReplayGuards, replay::ReplayRefused, replay::ReplayTarget, RetryPolicy, RetryTopology, Timestamp};
///
/// let policy = RetryPolicy::new(RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap(), Default::default());
/// let mut dead_letter = Headers::new();
/// dead_letter.insert("x-replay-count", "3");
/// let (to, now) = (ReplayTarget::Source, Timestamp::from_millis(0));
/// let guards = ReplayGuards { max_replays: Some(3), max_age: Some(Duration::from_secs(24 * 3600)) };
/// let refused = policy.replay_headers(&dead_letter, to, now, guards);
/// assert_eq!(refused, Err(ReplayRefused::TooOftenReplayed { count: 3, max: 3 }));
/// // The default lifts both guards.
/// let replayed = policy.replay_headers(&dead_letter, to, now, ReplayGuards::default()).unwrap();
/// assert_eq!(replayed.get("x-replay-count"), Some(&b"4"[..]));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplayGuards {
    /// The loop guard: refuse records replayed this many times already.
    pub max_replays: Option<u32>,
    /// The idempotency window: refuse records whose event was first produced
    /// this long ago or longer, since the downstream may have forgotten its
    /// idempotency key and would act on it twice (providers keep keys for
    /// about a day). Lifted (`None`), the replayed record is marked
    /// (`x-idempotency-window-overridden-at`) so that the listener hands it
    /// to its handler whatever its age ([`RetryPolicy::admit`]).
    pub max_age: Option<Duration>,
}

/// Why a record may not be replayed.
///
/// ```
/// use std::time::Duration;
/// use retry_core::{Headers, replay::ReplayGuards, replay::ReplayRefused, replay::ReplayTarget, RetryPolicy, RetryTopology, Timestamp};
///
/// let policy = RetryPolicy::new(RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap(), Default::default());
/// let window = Duration::from_secs(24 * 3600);
/// let guards = ReplayGuards { max_replays: None, max_age: Some(window) };
/// // Without retry headers the record's age is unknown, so the window refuses it.
/// let refused = policy.replay_headers(&Headers::new(), ReplayTarget::Source, Timestamp::from_millis(0), guards);
/// assert_eq!(refused, Err(ReplayRefused::UnknownAge { window }));
/// assert!(refused.unwrap_err().to_string().contains("override the idempotency window"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayRefused {
    /// It was replayed `count` times already, and the loop guard allows `max`.
    TooOftenReplayed {
        /// Replays so far (`x-replay-count`).
        count: u32,
        /// The most allowed.
        max: u32,
    },
    /// Its retry headers cannot be decoded, which a replay to the first rung needs.
    CorruptHeaders(crate::Error),
    /// Its event was first produced longer ago than the idempotency window.
    OutsideIdempotencyWindow {
        /// How long ago (zero for a timestamp in the future).
        age: Duration,
        /// The window.
        window: Duration,
    },
    /// The idempotency window applies but the record's age is unknown: it
    /// has no retry headers to tell it.
    UnknownAge {
        /// The window.
        window: Duration,
    },
}

impl std::fmt::Display for ReplayRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayRefused::TooOftenReplayed { count, max } => {
                write!(f, "replayed {count} times already (at most {max}): override the loop guard to replay it again")
            }
            ReplayRefused::CorruptHeaders(e) => write!(f, "cannot be replayed to the first retry topic: {e}"),
            ReplayRefused::OutsideIdempotencyWindow { age, window } => write!(
                f,
                "first produced {} ago, outside the {} idempotency window: the downstream may no longer \
                 recognise its idempotency key and act twice; override the idempotency window to replay it",
                crate::time::roughly(*age),
                crate::schedule::label_of(*window)
            ),
            ReplayRefused::UnknownAge { window } => write!(
                f,
                "its age is unknown (no retry headers), so it may be outside the {} idempotency window: \
                 override the idempotency window to replay it",
                crate::schedule::label_of(*window)
            ),
        }
    }
}

impl RetryPolicy {
    /// The topic a replay to `target` writes to.
    pub fn replay_topic(&self, target: ReplayTarget) -> &TopicName {
        match target {
            ReplayTarget::Source => self.topology().source_topic(),
            ReplayTarget::FirstRetry => self.topology().retry_topic(0).expect("a schedule has at least one rung"),
        }
    }

    /// The target that `topic` names, if a replay may write there: only the
    /// source topic and the first retry topic.
    pub fn replay_target(&self, topic: &str) -> Option<ReplayTarget> {
        [ReplayTarget::Source, ReplayTarget::FirstRetry].into_iter().find(|t| self.replay_topic(*t).as_str() == topic)
    }

    /// The headers of a dead-letter record replayed to `target` at `now`.
    /// The producer's headers are kept and `x-replay-count` goes up by one.
    /// To the source, our other headers and Spring's are dropped: the ladder
    /// starts over. To the first rung, the record looks as if its first
    /// attempt had just failed: attempt 1, due now, with its original
    /// coordinates and error, written in the policy's
    /// [`header_style`](crate::PolicyConfig::header_style).
    ///
    /// Both carry `x-first-timestamp`, when the event was first produced,
    /// and, when the idempotency window is lifted, `x-idempotency-window-overridden-at`.
    ///
    /// Refused when the record was replayed `guards.max_replays` times
    /// already (a loop guard; `None` lifts it, except at `u32::MAX` replays,
    /// where the count cannot go up); when its event was first produced
    /// `guards.max_age` ago or longer, or its age is unknown (the
    /// idempotency window); or, to the first rung, when its retry headers
    /// cannot be decoded.
    pub fn replay_headers(
        &self,
        headers: &Headers,
        target: ReplayTarget,
        now: Timestamp,
        guards: ReplayGuards,
    ) -> Result<Headers, ReplayRefused> {
        let count = RetryHeaders::decode_replay_count(headers).unwrap_or(0);
        let max = guards.max_replays.unwrap_or(u32::MAX);
        if count >= max {
            return Err(ReplayRefused::TooOftenReplayed { count, max });
        }
        let decoded = RetryHeaders::decode(headers);
        let first_seen = match &decoded {
            Ok(previous) => Some(previous.first_seen()),
            Err(_) => RetryHeaders::decode_first_timestamp(headers).unwrap_or(None),
        };
        if let Some(window) = guards.max_age {
            let Some(first_seen) = first_seen else {
                return Err(ReplayRefused::UnknownAge { window });
            };
            let age = Duration::from_millis(now.as_millis().saturating_sub(first_seen.as_millis()).max(0) as u64);
            if age >= window {
                return Err(ReplayRefused::OutsideIdempotencyWindow { age, window });
            }
        }
        let count = count.saturating_add(1);
        let overridden = guards.max_age.is_none().then_some(now);
        // Spring's retry headers go too: Spring would read a replayed
        // record's old attempt count and send it on down its ladder.
        let mut out = headers.without_retry_headers();
        match target {
            ReplayTarget::Source => {
                out.insert(names::REPLAY_COUNT, count.to_string());
                if let Some(first_seen) = first_seen {
                    out.insert(names::FIRST_TIMESTAMP, first_seen.as_millis().to_string());
                }
                if let Some(at) = overridden {
                    out.insert(names::WINDOW_OVERRIDDEN_AT, at.as_millis().to_string());
                }
            }
            ReplayTarget::FirstRetry => {
                let previous = decoded.map_err(ReplayRefused::CorruptHeaders)?;
                let replayed = RetryHeaders {
                    attempt: 1,
                    due_at: Some(now),
                    dead_letter_reason: None,
                    replay_count: count,
                    first_timestamp: Some(previous.first_seen()),
                    window_overridden_at: overridden,
                    ..previous
                };
                replayed.encode_as(&mut out, self.config().header_style);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FailureKind, PolicyConfig, RecordMeta, RetrySchedule, RetryTopology, Stage};

    /// The loop guard alone: the idempotency window lifted.
    fn loop_guard(max_replays: Option<u32>) -> ReplayGuards {
        ReplayGuards { max_replays, max_age: None }
    }

    fn policy() -> RetryPolicy {
        let schedule: RetrySchedule = "5s,30s".parse().unwrap();
        RetryPolicy::new(RetryTopology::new("o", &schedule).unwrap(), PolicyConfig::default())
    }

    /// The headers of a record dead-lettered after its retries ran out.
    fn dead_letter(replays: u32) -> Headers {
        let mut h = Headers::new();
        h.insert("traceparent", "abc");
        RetryHeaders {
            attempt: 3,
            original_topic: TopicName::new("o").unwrap(),
            original_partition: 1,
            original_offset: 9,
            original_timestamp: None,
            first_failure_at: Timestamp::from_millis(100),
            due_at: None,
            error_kind: FailureKind::Transient,
            error: "503".into(),
            dead_letter_reason: Some(crate::DeadLetterReason::RetriesExhausted),
            replay_count: replays,
            first_timestamp: None,
            window_overridden_at: None,
        }
        .encode_into(&mut h);
        h
    }

    /// A count at the top of its range never wraps: it is over any guard,
    /// the lifted one included.
    #[test]
    fn replay_counts_near_the_top_saturate_and_are_refused() {
        let p = policy();
        let now = Timestamp::from_millis(5);
        for (count, max, expected) in [
            (u32::MAX - 1, None, Ok(u32::MAX)),
            (u32::MAX, None, Err(ReplayRefused::TooOftenReplayed { count: u32::MAX, max: u32::MAX })),
            (u32::MAX, Some(3), Err(ReplayRefused::TooOftenReplayed { count: u32::MAX, max: 3 })),
            (2, Some(3), Ok(3)),
        ] {
            for target in [ReplayTarget::Source, ReplayTarget::FirstRetry] {
                let got = p
                    .replay_headers(&dead_letter(count), target, now, loop_guard(max))
                    .map(|h| RetryHeaders::decode_replay_count(&h).unwrap());
                assert_eq!(got, expected, "count {count}, guard {max:?}, {target:?}");
            }
        }
    }

    #[test]
    fn replay_targets_are_the_source_and_the_first_rung_only() {
        let p = policy();
        assert_eq!(p.replay_target("o"), Some(ReplayTarget::Source));
        assert_eq!(p.replay_target("o.retry-5s"), Some(ReplayTarget::FirstRetry));
        assert_eq!(p.replay_target("o.retry-30s"), None);
        assert_eq!(p.replay_target("o.dlq"), None);
        assert_eq!(p.replay_target("elsewhere"), None);
    }

    #[test]
    fn to_the_source_the_ladder_starts_over() {
        let p = policy();
        let h = p
            .replay_headers(&dead_letter(0), ReplayTarget::Source, Timestamp::from_millis(500), loop_guard(Some(3)))
            .unwrap();
        let names: Vec<&str> = h.iter().map(|(k, _)| k).collect();
        assert_eq!(names, ["traceparent", "x-replay-count", "x-first-timestamp", "x-idempotency-window-overridden-at"]);
        // No original timestamp: the first failure is the oldest time known.
        assert_eq!(h.get("x-first-timestamp"), Some(&b"100"[..]));
        assert_eq!(h.get("x-replay-count"), Some(&b"1"[..]));
        // The source keeps the count when the record fails again.
        let record = RecordMeta { topic: "o", partition: 0, offset: 1, timestamp: None, headers: &h };
        let failed = Err(crate::HandlerError::transient("again"));
        match p.decide(Stage::SOURCE, &record, &failed, Timestamp::from_millis(600)) {
            crate::Decision::Retry { headers, .. } => {
                let decoded = RetryHeaders::decode(&headers).unwrap();
                assert_eq!((decoded.replay_count, decoded.first_timestamp), (1, Some(Timestamp::from_millis(100))));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn to_the_first_rung_it_is_due_at_once_as_attempt_one() {
        let p = policy();
        let now = Timestamp::from_millis(500);
        let h = p.replay_headers(&dead_letter(1), ReplayTarget::FirstRetry, now, loop_guard(Some(3))).unwrap();
        let decoded = RetryHeaders::decode(&h).unwrap();
        assert_eq!((decoded.attempt, decoded.due_at, decoded.replay_count), (1, Some(now), 2));
        assert_eq!((decoded.original_partition, decoded.original_offset), (1, 9));
        assert_eq!(decoded.dead_letter_reason, None);
        assert_eq!(h.get("traceparent"), Some(&b"abc"[..]));
        let record = RecordMeta { topic: "o.retry-5s", partition: 0, offset: 1, timestamp: None, headers: &h };
        assert_eq!(p.due_at(p.stage_of("o.retry-5s").unwrap(), &record, now), now);
    }

    #[test]
    fn the_loop_guard_refuses_records_replayed_too_often_unless_lifted() {
        let p = policy();
        let now = Timestamp::from_millis(500);
        assert_eq!(
            p.replay_headers(&dead_letter(3), ReplayTarget::Source, now, loop_guard(Some(3))),
            Err(ReplayRefused::TooOftenReplayed { count: 3, max: 3 })
        );
        assert!(p.replay_headers(&dead_letter(3), ReplayTarget::Source, now, loop_guard(None)).is_ok());
        let mut corrupt = dead_letter(0);
        corrupt.insert("x-original-offset", "lots");
        assert!(matches!(
            p.replay_headers(&corrupt, ReplayTarget::FirstRetry, now, loop_guard(Some(3))),
            Err(ReplayRefused::CorruptHeaders(_))
        ));
        assert!(p.replay_headers(&corrupt, ReplayTarget::Source, now, loop_guard(Some(3))).is_ok());
    }

    const HOUR: u64 = 3_600_000;

    /// A replay that lifts the window marks the record, on either target,
    /// and the listener then hands it to its handler however old it is; a
    /// replay within the window does not mark it.
    #[test]
    fn a_replay_overriding_the_window_is_handled_whatever_its_age() {
        let day = Duration::from_millis(24 * HOUR);
        let config = PolicyConfig { max_event_age: Some(day), ..PolicyConfig::default() };
        let p = RetryPolicy::new(RetryTopology::new("o", &"5s,30s".parse().unwrap()).unwrap(), config);
        let now = Timestamp::from_millis(100 * HOUR as i64);
        let old = aged(10 * HOUR as i64, "original");
        let lifted = ReplayGuards { max_replays: None, max_age: None };
        for (target, topic) in [(ReplayTarget::Source, "o"), (ReplayTarget::FirstRetry, "o.retry-5s")] {
            let h = p.replay_headers(&old, target, now, lifted).unwrap();
            assert_eq!(h.get("x-idempotency-window-overridden-at"), Some(&b"360000000"[..]), "{target:?}");
            let stage = p.stage_of(topic).unwrap();
            let record = RecordMeta { topic, partition: 0, offset: 1, timestamp: Some(now), headers: &h };
            assert_eq!(p.admit(stage, &record, now), None, "{target:?}");
            // Failing again, it keeps the mark down the ladder.
            let failed = Err(crate::HandlerError::transient("503"));
            let crate::Decision::Retry { headers, topic: next_topic, .. } = p.decide(stage, &record, &failed, now)
            else {
                panic!("retried")
            };
            let next = RecordMeta {
                topic: next_topic.as_str(),
                partition: 0,
                offset: 1,
                timestamp: Some(now),
                headers: &headers,
            };
            let next_stage = p.stage_of(next_topic.as_str()).unwrap();
            assert_eq!(p.admit(next_stage, &next, now), None, "{target:?} down the ladder");
            // Without the mark, the same record is not handed over.
            let within = ReplayGuards { max_replays: None, max_age: Some(Duration::from_millis(100 * HOUR)) };
            let h = p.replay_headers(&old, target, now, within).unwrap();
            assert_eq!(h.get("x-idempotency-window-overridden-at"), None);
            let record = RecordMeta { topic, partition: 0, offset: 1, timestamp: Some(now), headers: &h };
            assert!(p.admit(stage, &record, now).is_some(), "{target:?}");
        }
    }

    /// A dead letter whose event was first produced at `first` (ms), through
    /// which headers.
    fn aged(first: i64, through: &str) -> Headers {
        let mut h = dead_letter(0);
        let mut decoded = RetryHeaders::decode(&h).unwrap();
        decoded.first_failure_at = Timestamp::from_millis(first + 10);
        match through {
            "original" => decoded.original_timestamp = Some(Timestamp::from_millis(first)),
            // Replayed once: this pass's original record is recent, the event is not.
            "replayed" => {
                decoded.original_timestamp = Some(Timestamp::from_millis(first + 20 * HOUR as i64));
                decoded.first_timestamp = Some(Timestamp::from_millis(first));
            }
            _ => {}
        }
        decoded.encode_into(&mut h);
        h
    }

    /// The idempotency window measures from the event's first record, across
    /// replays, and refuses what it cannot date.
    #[test]
    fn the_idempotency_window() {
        let p = policy();
        let now = Timestamp::from_millis(100 * HOUR as i64);
        let window = Some(Duration::from_millis(24 * HOUR));
        let guards = |max_age| ReplayGuards { max_replays: Some(3), max_age };
        let outside = |age_ms: u64| {
            Err(ReplayRefused::OutsideIdempotencyWindow {
                age: Duration::from_millis(age_ms),
                window: Duration::from_millis(24 * HOUR),
            })
        };
        let mut foreign = Headers::new();
        foreign.insert("traceparent", "abc");
        type Case<'a> = (&'a str, Headers, Option<Duration>, Result<(), ReplayRefused>);
        let table: Vec<Case<'_>> = vec![
            ("an hour old", aged(99 * HOUR as i64, "original"), window, Ok(())),
            ("just inside", aged(76 * HOUR as i64 + 1, "original"), window, Ok(())),
            ("exactly the window", aged(76 * HOUR as i64, "original"), window, outside(24 * HOUR)),
            ("two days old", aged(52 * HOUR as i64, "original"), window, outside(48 * HOUR)),
            ("two days old, window lifted", aged(52 * HOUR as i64, "original"), None, Ok(())),
            ("replayed, recent pass of an old event", aged(60 * HOUR as i64, "replayed"), window, outside(40 * HOUR)),
            (
                "no timestamps: dated by its first failure",
                aged(60 * HOUR as i64, "none"),
                window,
                outside(40 * HOUR - 10),
            ),
            ("from the future", aged(101 * HOUR as i64, "original"), window, Ok(())),
            (
                "no retry headers",
                foreign.clone(),
                window,
                Err(ReplayRefused::UnknownAge { window: Duration::from_millis(24 * HOUR) }),
            ),
            ("no retry headers, window lifted", foreign, None, Ok(())),
        ];
        for (case, headers, max_age, expected) in table {
            let got = p.replay_headers(&headers, ReplayTarget::Source, now, guards(max_age)).map(|_| ());
            assert_eq!(got, expected, "{case}");
        }
        assert_eq!(
            outside(40 * HOUR + 61_000).unwrap_err().to_string(),
            "first produced 40h01m ago, outside the 24h idempotency window: the downstream may no longer \
             recognise its idempotency key and act twice; override the idempotency window to replay it"
        );
    }

    /// A dead letter as Spring's `@RetryableTopic` leaves it after four
    /// attempts: the original coordinates once, every hop's attempt and due
    /// time appended, the last exception.
    fn springs_dead_letter() -> Headers {
        let mut h: Vec<(String, Vec<u8>)> = vec![
            ("traceparent".into(), b"abc".to_vec()),
            ("kafka_original-topic".into(), b"o".to_vec()),
            ("kafka_original-partition".into(), 1i32.to_be_bytes().to_vec()),
            ("kafka_original-offset".into(), 9i64.to_be_bytes().to_vec()),
            ("kafka_original-timestamp".into(), 100i64.to_be_bytes().to_vec()),
            ("kafka_original-timestamp-type".into(), b"CreateTime".to_vec()),
        ];
        for attempt in 2i32..=4 {
            h.push(("retry_topic-attempts".into(), attempt.to_be_bytes().to_vec()));
            h.push(("retry_topic-backoff-timestamp".into(), (1_000 * attempt as i64).to_be_bytes().to_vec()));
        }
        h.push(("kafka_exception-message".into(), b"provider answered 503".to_vec()));
        h.into_iter().collect()
    }

    /// Replaying Spring's dead letters: to the source, none of Spring's
    /// headers go along (Spring would read the old attempt count and send
    /// the record on down its ladder); to the first rung, the headers are
    /// written in the policy's style; and in Spring's style, the replay
    /// count and the event's age ride along as ours, so the loop guard and
    /// the idempotency window hold down a Spring-style ladder too.
    #[test]
    fn springs_dead_letters_are_replayed_in_the_policys_style() {
        let schedule: RetrySchedule = "5s,30s".parse().unwrap();
        let spring = PolicyConfig { header_style: crate::HeaderStyle::Spring, ..PolicyConfig::default() };
        let p = RetryPolicy::new(RetryTopology::spring("o", &schedule).unwrap(), spring);
        let now = Timestamp::from_millis(500);
        let to_source = p.replay_headers(&springs_dead_letter(), ReplayTarget::Source, now, loop_guard(None)).unwrap();
        let names: Vec<&str> = to_source.iter().map(|(k, _)| k).collect();
        assert_eq!(names, ["traceparent", "x-replay-count", "x-first-timestamp", "x-idempotency-window-overridden-at"]);
        assert_eq!(to_source.get("x-first-timestamp"), Some(&b"100"[..]));

        let h = p.replay_headers(&springs_dead_letter(), ReplayTarget::FirstRetry, now, loop_guard(None)).unwrap();
        assert_eq!(h.iter().filter(|(k, _)| *k == "retry_topic-attempts").count(), 1, "{h:?}");
        assert_eq!(h.get("retry_topic-attempts"), Some(&2i32.to_be_bytes()[..]));
        assert_eq!(h.get("x-retry-attempt"), None, "ours are not written in the Spring style");
        let decoded = RetryHeaders::decode(&h).unwrap();
        assert_eq!((decoded.attempt, decoded.due_at, decoded.replay_count), (1, Some(now), 1));
        assert_eq!((decoded.original_partition, decoded.original_offset), (1, 9));
        assert_eq!(decoded.first_timestamp, Some(Timestamp::from_millis(100)));

        // Failing on every rung, it reaches the dead-letter topic with its
        // replay count, where the loop guard counts it.
        let mut headers = h;
        for topic in ["o-retry-5000", "o-retry-30000"] {
            let record = RecordMeta { topic, partition: 0, offset: 1, timestamp: Some(now), headers: &headers };
            let failed = Err(crate::HandlerError::transient("503"));
            headers = match p.decide(p.stage_of(topic).unwrap(), &record, &failed, now) {
                crate::Decision::Retry { headers, .. } | crate::Decision::DeadLetter { headers, .. } => headers,
                other => panic!("{other:?}"),
            };
        }
        assert!(RetryHeaders::decode(&headers).unwrap().dead_letter_reason.is_some());
        assert_eq!(
            p.replay_headers(&headers, ReplayTarget::Source, now, loop_guard(Some(1))),
            Err(ReplayRefused::TooOftenReplayed { count: 1, max: 1 })
        );
        let window = ReplayGuards { max_replays: None, max_age: Some(Duration::from_millis(300)) };
        assert!(matches!(
            p.replay_headers(&headers, ReplayTarget::Source, now, window),
            Err(ReplayRefused::OutsideIdempotencyWindow { .. })
        ));

        // A native policy writes ours to its first rung.
        let h = policy().replay_headers(&springs_dead_letter(), ReplayTarget::FirstRetry, now, loop_guard(None));
        let h = h.unwrap();
        assert_eq!(h.get("x-retry-attempt"), Some(&b"1"[..]));
        assert!(h.iter().all(|(k, _)| !crate::spring::header_names::is_spring_header(k)), "{h:?}");
    }

    /// The event's first timestamp survives a replay and the ladder after it.
    #[test]
    fn the_first_timestamp_is_carried_across_replays() {
        let p = policy();
        let first = 52 * HOUR as i64;
        let now = Timestamp::from_millis(60 * HOUR as i64);
        for target in [ReplayTarget::Source, ReplayTarget::FirstRetry] {
            let h = p.replay_headers(&aged(first, "original"), target, now, loop_guard(None)).unwrap();
            assert_eq!(RetryHeaders::decode_first_timestamp(&h), Ok(Some(Timestamp::from_millis(first))), "{target:?}");
        }
    }
}
