//! Replaying a dead-lettered record: which topic it goes back to and which
//! headers it carries there. Operators decide to replay; this only says how.

use crate::{header_names as names, Headers, RetryHeaders, RetryPolicy, Timestamp, TopicName};

/// Where a replay writes: the source topic (the record starts the ladder
/// again) or the first retry rung (it gets the first rung's attempt at once,
/// Uber's "merge" of the dead-letter queue back into the ladder).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayTarget {
    /// The listener's source topic.
    Source,
    /// The first retry topic.
    FirstRetry,
}

/// Why a record may not be replayed.
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
}

impl std::fmt::Display for ReplayRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayRefused::TooOftenReplayed { count, max } => {
                write!(f, "replayed {count} times already (at most {max}): override the loop guard to replay it again")
            }
            ReplayRefused::CorruptHeaders(e) => write!(f, "cannot be replayed to the first retry topic: {e}"),
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
    /// To the source, our other headers are dropped: the ladder starts over.
    /// To the first rung, the record looks as if its first attempt had just
    /// failed: attempt 1, due now, with its original coordinates and error.
    ///
    /// Refused when the record was replayed `max_replays` times already (a
    /// loop guard; `None` lifts it, except at `u32::MAX` replays, where the
    /// count cannot go up), or, to the first rung, when its retry headers
    /// cannot be decoded.
    pub fn replay_headers(
        &self,
        headers: &Headers,
        target: ReplayTarget,
        now: Timestamp,
        max_replays: Option<u32>,
    ) -> Result<Headers, ReplayRefused> {
        let count = RetryHeaders::decode_replay_count(headers).unwrap_or(0);
        let max = max_replays.unwrap_or(u32::MAX);
        if count >= max {
            return Err(ReplayRefused::TooOftenReplayed { count, max });
        }
        let count = count.saturating_add(1);
        let mut out = headers.without_retry_headers();
        match target {
            ReplayTarget::Source => out.insert(names::REPLAY_COUNT, count.to_string()),
            ReplayTarget::FirstRetry => {
                let previous = RetryHeaders::decode(headers).map_err(ReplayRefused::CorruptHeaders)?;
                let replayed = RetryHeaders {
                    attempt: 1,
                    due_at: Some(now),
                    dead_letter_reason: None,
                    replay_count: count,
                    ..previous
                };
                replayed.encode_into(&mut out);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FailureKind, PolicyConfig, RecordMeta, RetrySchedule, RetryTopology, Stage};

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
                    .replay_headers(&dead_letter(count), target, now, max)
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
        let h = p.replay_headers(&dead_letter(0), ReplayTarget::Source, Timestamp::from_millis(500), Some(3)).unwrap();
        let names: Vec<&str> = h.iter().map(|(k, _)| k).collect();
        assert_eq!(names, ["traceparent", "x-replay-count"]);
        assert_eq!(h.get("x-replay-count"), Some(&b"1"[..]));
        // The source keeps the count when the record fails again.
        let record = RecordMeta { topic: "o", partition: 0, offset: 1, timestamp: None, headers: &h };
        let failed = Err(crate::HandlerError::transient("again"));
        match p.decide(Stage::SOURCE, &record, &failed, Timestamp::from_millis(600)) {
            crate::Decision::Retry { headers, .. } => {
                assert_eq!(RetryHeaders::decode(&headers).unwrap().replay_count, 1)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn to_the_first_rung_it_is_due_at_once_as_attempt_one() {
        let p = policy();
        let now = Timestamp::from_millis(500);
        let h = p.replay_headers(&dead_letter(1), ReplayTarget::FirstRetry, now, Some(3)).unwrap();
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
            p.replay_headers(&dead_letter(3), ReplayTarget::Source, now, Some(3)),
            Err(ReplayRefused::TooOftenReplayed { count: 3, max: 3 })
        );
        assert!(p.replay_headers(&dead_letter(3), ReplayTarget::Source, now, None).is_ok());
        let mut corrupt = dead_letter(0);
        corrupt.insert("x-original-offset", "lots");
        assert!(matches!(
            p.replay_headers(&corrupt, ReplayTarget::FirstRetry, now, Some(3)),
            Err(ReplayRefused::CorruptHeaders(_))
        ));
        assert!(p.replay_headers(&corrupt, ReplayTarget::Source, now, Some(3)).is_ok());
    }
}
