use std::time::Duration;

use crate::{
    headers::truncate_utf8, DeadLetterReason, Error, FailureKind, HandlerError, HeaderProblem, HeaderStyle, Headers,
    RetryHeaders, RetryTopology, Timestamp, TopicName, MAX_ERROR_BYTES,
};

/// Which topic of the ladder a record was read from: the source topic or one
/// of the retry rungs. Obtained from [`RetryPolicy::stage_of`] or
/// [`RetryPolicy::stages`], so a retry stage always names an existing rung.
///
/// ```
/// use retry_core::{RetryPolicy, RetryTopology, Stage};
///
/// let topology = RetryTopology::new("orders", &"5s,30s".parse().unwrap()).unwrap();
/// let policy = RetryPolicy::new(topology, Default::default());
/// let stage = policy.stage_of("orders.retry-5s").unwrap();
/// assert_eq!((stage.rung(), stage.attempt()), (Some(0), 2));
/// assert_eq!((Stage::SOURCE.rung(), Stage::SOURCE.attempt()), (None, 1));
/// // The listener does not consume the dead-letter topic: it has no stage.
/// assert_eq!(policy.stage_of("orders.dlq"), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stage(Option<usize>);

impl Stage {
    /// The source topic: the first attempt.
    pub const SOURCE: Stage = Stage(None);

    /// The stage of rung `index`; callers make sure the rung exists.
    pub(crate) fn rung_at(index: usize) -> Stage {
        Stage(Some(index))
    }

    /// The rung index (0 is the first retry topic), or `None` for the source.
    pub fn rung(self) -> Option<usize> {
        self.0
    }

    /// Which attempt a record read at this stage is: 1 on the source topic,
    /// `n + 2` on rung `n`.
    ///
    /// ```
    /// use retry_core::{RetryPolicy, RetryTopology, Stage};
    ///
    /// let topology = RetryTopology::new("orders", &"5s,30s".parse().unwrap()).unwrap();
    /// let policy = RetryPolicy::new(topology, Default::default());
    /// assert_eq!(Stage::SOURCE.attempt(), 1);
    /// assert_eq!(policy.stage_of("orders.retry-30s").unwrap().attempt(), 3);
    /// ```
    pub fn attempt(self) -> u32 {
        // Rung indices are below MAX_RUNGS, so this cannot truncate.
        self.0.map_or(1, |rung| rung as u32 + 2)
    }
}

/// What the decision function needs to know about a record.
///
/// ```
/// use retry_core::{Headers, RecordMeta, RetryPolicy, RetryTopology, Timestamp};
///
/// let policy = RetryPolicy::new(RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap(), Default::default());
/// let headers = Headers::new();
/// let record = RecordMeta {
///     topic: "orders.retry-5s",
///     partition: 0,
///     offset: 7,
///     timestamp: Some(Timestamp::from_millis(10_000)),
///     headers: &headers,
/// };
/// // No `x-retry-due-at` header: the record is due its rung's delay after its timestamp.
/// let stage = policy.stage_of(record.topic).unwrap();
/// assert_eq!(policy.due_at(stage, &record, Timestamp::from_millis(12_000)), Timestamp::from_millis(15_000));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RecordMeta<'a> {
    /// The topic it was read from.
    pub topic: &'a str,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// Its timestamp, if it has one.
    pub timestamp: Option<Timestamp>,
    /// Its headers, ours and the producer's.
    pub headers: &'a Headers,
}

/// What to do with a record once its handler returned.
///
/// ```
/// use retry_core::{
///     DeadLetterReason, Decision, HandlerError, Headers, RecordMeta, RetryPolicy, RetryTopology, Stage, Timestamp,
/// };
///
/// let policy = RetryPolicy::new(RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap(), Default::default());
/// let headers = Headers::new();
/// let record = RecordMeta { topic: "orders", partition: 0, offset: 7, timestamp: None, headers: &headers };
/// let now = Timestamp::from_millis(1_000);
/// assert_eq!(policy.decide(Stage::SOURCE, &record, &Ok(()), now), Decision::Commit);
/// // No retry fixes a bad payload: it goes straight to the dead-letter topic.
/// let outcome = Err(HandlerError::permanent("the value is not JSON"));
/// match policy.decide(Stage::SOURCE, &record, &outcome, now) {
///     Decision::DeadLetter { topic, reason, headers } => {
///         assert_eq!((topic.as_str(), reason), ("orders.dlq", DeadLetterReason::PermanentFailure));
///         assert_eq!(headers.get("x-dead-letter-reason"), Some(&b"permanent-failure"[..]));
///     }
///     other => panic!("unexpected {other:?}"),
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Done: commit the offset.
    Commit,
    /// Publish the record's key and value with `headers` to `topic`; once the
    /// broker acknowledged the publish, commit the offset. The retry
    /// consumer handles it again at `due_at`.
    Retry {
        /// The next rung's topic.
        topic: TopicName,
        /// When the record becomes due on that topic.
        due_at: Timestamp,
        /// Every header of the new record: the producer's and ours.
        headers: Headers,
    },
    /// Publish the record's key and value with `headers` to the dead-letter
    /// topic; once acknowledged, commit the offset.
    DeadLetter {
        /// The dead-letter topic.
        topic: TopicName,
        /// Why the record is dead-lettered (also in `x-dead-letter-reason`).
        reason: DeadLetterReason,
        /// Every header of the new record: the producer's and ours.
        headers: Headers,
    },
}

/// Tunables of a [`RetryPolicy`].
///
/// ```
/// use std::time::Duration;
/// use retry_core::{
///     DeadLetterReason, Decision, HandlerError, Headers, PolicyConfig, RecordMeta, RetryPolicy, RetryTopology, Stage,
///     Timestamp,
/// };
///
/// let defaults = PolicyConfig::default();
/// assert_eq!((defaults.deadline, defaults.max_clock_skew), (None, Duration::from_secs(1)));
/// // Give up on a record not done within 3 s of its first failure.
/// let config = PolicyConfig { deadline: Some(Duration::from_secs(3)), ..defaults };
/// let policy = RetryPolicy::new(RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap(), config);
/// let headers = Headers::new();
/// let record = RecordMeta { topic: "orders", partition: 0, offset: 7, timestamp: None, headers: &headers };
/// let outcome = Err(HandlerError::transient("timed out"));
/// // The first retry would be due 5 s later, past the deadline.
/// let decision = policy.decide(Stage::SOURCE, &record, &outcome, Timestamp::from_millis(0));
/// assert!(matches!(decision, Decision::DeadLetter { reason: DeadLetterReason::DeadlineExceeded, .. }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyConfig {
    /// Dead-letter a record instead of retrying it when its retry would be
    /// due later than this long after its first failure. `None`: only the
    /// schedule bounds retries.
    pub deadline: Option<Duration>,
    /// How much later than its rung's delay a record may become due, to allow
    /// for clocks of different hosts; bounds the harm of a bad `x-retry-due-at`.
    pub max_clock_skew: Duration,
    /// The oldest an event may be and still be handled: the downstream's
    /// idempotency window less a safety margin. A record whose event was
    /// first produced this long ago or longer is dead-lettered
    /// (`idempotency-window-passed`) before its handler is called, unless an
    /// operator replayed it overriding the window (see [`RetryPolicy::admit`]).
    /// `None`: events of any age are handled.
    pub max_event_age: Option<Duration>,
    /// Which headers a hop writes: ours, Spring Kafka's, or both (see
    /// [`HeaderStyle`]). Both are always read.
    pub header_style: HeaderStyle,
}

impl Default for PolicyConfig {
    /// No deadline; 1 s of clock skew; events of any age; our headers.
    fn default() -> Self {
        PolicyConfig {
            deadline: None,
            max_clock_skew: Duration::from_secs(1),
            max_event_age: None,
            header_style: HeaderStyle::Native,
        }
    }
}

/// The decision function of one listener's ladder.
///
/// Attempts are bounded by construction: attempt 1 is on the source topic,
/// attempt `n + 1` on rung `n - 1`, and a failure on the last rung goes to
/// the dead-letter topic. Nothing is ever retried forever, and a failed
/// record always leaves with a [`Decision::Retry`] or
/// [`Decision::DeadLetter`]: nothing is dropped.
///
/// ```
/// use retry_core::{
///     DeadLetterReason, Decision, HandlerError, Headers, RecordMeta, RetryPolicy, RetryTopology, Stage, Timestamp,
/// };
///
/// let policy = RetryPolicy::new(RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap(), Default::default());
/// let failed = Err(HandlerError::transient("provider answered 503"));
/// let none = Headers::new();
/// let record = RecordMeta { topic: "orders", partition: 0, offset: 7, timestamp: None, headers: &none };
/// let first = policy.decide(Stage::SOURCE, &record, &failed, Timestamp::from_millis(0));
/// let Decision::Retry { topic, due_at, headers } = first else {
///     panic!("a transient failure on the source is retried")
/// };
/// // The record fails again on the only rung: the ladder ends in the dead-letter topic.
/// let retried = RecordMeta { topic: topic.as_str(), partition: 0, offset: 0, timestamp: None, headers: &headers };
/// let decision = policy.decide(policy.stage_of(topic.as_str()).unwrap(), &retried, &failed, due_at);
/// assert!(matches!(decision, Decision::DeadLetter { reason: DeadLetterReason::RetriesExhausted, .. }));
/// ```
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    topology: RetryTopology,
    config: PolicyConfig,
}

impl RetryPolicy {
    /// A policy for `topology`.
    pub fn new(topology: RetryTopology, config: PolicyConfig) -> Self {
        RetryPolicy { topology, config }
    }

    /// The ladder's topics.
    pub fn topology(&self) -> &RetryTopology {
        &self.topology
    }

    /// The policy's tunables.
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// The stage a record read from `topic` is at; `None` for the
    /// dead-letter topic and for topics outside the ladder.
    pub fn stage_of(&self, topic: &str) -> Option<Stage> {
        self.stages().find(|(_, t)| t.as_str() == topic).map(|(stage, _)| stage)
    }

    /// Every consumed topic with its stage: the source, then each rung.
    pub fn stages(&self) -> impl Iterator<Item = (Stage, &TopicName)> {
        std::iter::once((Stage::SOURCE, self.topology.source_topic()))
            .chain(self.topology.retry_topics().enumerate().map(|(i, (_, topic))| (Stage(Some(i)), topic)))
    }

    /// Decides what happens to `record`, read at `stage`, given its handler's
    /// `outcome`, at time `now`.
    ///
    /// - success: [`Decision::Commit`];
    /// - a permanent failure: dead-letter (`permanent-failure`);
    /// - a transient failure: the next rung, due `now` + its delay; after the
    ///   last rung dead-letter (`retries-exhausted`); past the configured
    ///   deadline dead-letter (`deadline-exceeded`);
    /// - any failure of a retry-topic record whose retry headers cannot be
    ///   decoded, or whose attempt count contradicts its rung: dead-letter
    ///   (`corrupt-retry-headers`), with the decoding error in `x-error`.
    pub fn decide(
        &self,
        stage: Stage,
        record: &RecordMeta<'_>,
        outcome: &Result<(), HandlerError>,
        now: Timestamp,
    ) -> Decision {
        let mut decision = self.decide_hop(stage, record, outcome, now);
        if let Decision::Retry { headers, .. } | Decision::DeadLetter { headers, .. } = &mut decision {
            // This attempt was due when the hop before said (a first
            // attempt, when its record was produced), and failed now.
            let due_at = stage.rung().and_then(|_| RetryHeaders::decode(record.headers).ok()?.due_at);
            crate::history::append(headers, record.headers, crate::history::AttemptTimes { due_at, failed_at: now });
        }
        decision
    }

    /// [`RetryPolicy::decide`] before the attempt's times are recorded.
    fn decide_hop(
        &self,
        stage: Stage,
        record: &RecordMeta<'_>,
        outcome: &Result<(), HandlerError>,
        now: Timestamp,
    ) -> Decision {
        let error = match outcome {
            Ok(()) => return Decision::Commit,
            Err(error) => error,
        };
        // The record's headers, with those the failure attached.
        let attached;
        let record_headers = if error.attached_headers().is_empty() {
            record.headers
        } else {
            let mut headers = record.headers.clone();
            for (name, value) in error.attached_headers().iter() {
                headers.insert(name, value);
            }
            attached = headers;
            &attached
        };
        let failed_attempts = stage.attempt();
        let mut next = match stage.rung() {
            // The ladder begins here. A replayed record carries its replay
            // count and first timestamp forward; a producer's garbage in
            // those headers counts as none.
            None => RetryHeaders {
                attempt: failed_attempts,
                original_topic: self.topology.source_topic().clone(),
                original_partition: record.partition,
                original_offset: record.offset,
                original_timestamp: record.timestamp,
                first_failure_at: now,
                due_at: None,
                error_kind: error.kind(),
                error: String::new(),
                dead_letter_reason: None,
                replay_count: RetryHeaders::decode_replay_count(record.headers).unwrap_or(0),
                first_timestamp: RetryHeaders::decode_first_timestamp(record.headers).unwrap_or(None),
                window_overridden_at: RetryHeaders::decode_window_overridden_at(record.headers).unwrap_or(None),
            },
            Some(_) => match previous_headers(stage, record.headers) {
                Ok(previous) => {
                    RetryHeaders { attempt: failed_attempts, due_at: None, dead_letter_reason: None, ..previous }
                }
                Err(corrupt) => {
                    let headers = RetryHeaders {
                        attempt: failed_attempts,
                        original_topic: TopicName::new(record.topic)
                            .unwrap_or_else(|_| self.topology.source_topic().clone()),
                        original_partition: record.partition,
                        original_offset: record.offset,
                        original_timestamp: record.timestamp,
                        first_failure_at: now,
                        due_at: None,
                        error_kind: error.kind(),
                        error: format!("{corrupt}; last failure: {}", error.message()),
                        dead_letter_reason: None,
                        replay_count: 0,
                        first_timestamp: None,
                        window_overridden_at: None,
                    };
                    return self.dead_letter(DeadLetterReason::CorruptRetryHeaders, headers, record_headers);
                }
            },
        };
        next.error_kind = error.kind();
        next.error = truncate_utf8(error.message(), MAX_ERROR_BYTES).to_owned();

        if error.kind() == FailureKind::Permanent {
            return self.dead_letter(DeadLetterReason::PermanentFailure, next, record_headers);
        }
        let next_rung = stage.rung().map_or(0, |rung| rung + 1);
        let Some((rung, topic)) = self.topology.retry_topics().nth(next_rung) else {
            return self.dead_letter(DeadLetterReason::RetriesExhausted, next, record_headers);
        };
        let due_at = now.saturating_add(rung.delay());
        if let Some(deadline) = self.config.deadline {
            if due_at > next.first_failure_at.saturating_add(deadline) {
                return self.dead_letter(DeadLetterReason::DeadlineExceeded, next, record_headers);
            }
        }
        next.due_at = Some(due_at);
        Decision::Retry {
            topic: topic.clone(),
            due_at,
            headers: with_retry_headers(record_headers, &next, self.config.header_style),
        }
    }

    /// Decides what happens to what was read at `stage` but cannot be handed
    /// to the handler as it is (`problem` says why: a header name that is
    /// not UTF-8, a batch that cannot be decoded): the dead-letter topic,
    /// `undecodable`, with `problem` in `x-error`, at once, whatever the
    /// rung. The record's own retry headers are carried forward when they
    /// decode.
    ///
    /// ```
    /// use retry_core::{DeadLetterReason, Decision, Headers, RecordMeta, RetryPolicy, RetryTopology, Stage, Timestamp};
    ///
    /// let policy = RetryPolicy::new(RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap(), Default::default());
    /// let none = Headers::new();
    /// let record = RecordMeta { topic: "orders", partition: 0, offset: 7, timestamp: None, headers: &none };
    /// let now = Timestamp::from_millis(0);
    /// let Decision::DeadLetter { reason, headers, .. } = policy.undecodable(Stage::SOURCE, &record, "bad batch", now) else {
    ///     panic!("always dead-lettered")
    /// };
    /// assert_eq!(reason, DeadLetterReason::Undecodable);
    /// assert_eq!(headers.get("x-error"), Some(&b"bad batch"[..]));
    /// assert_eq!(headers.get("x-original-offset"), Some(&b"7"[..]));
    /// ```
    pub fn undecodable(&self, stage: Stage, record: &RecordMeta<'_>, problem: &str, now: Timestamp) -> Decision {
        self.dead_letter_before_handling(stage, record, problem, now, DeadLetterReason::Undecodable)
    }

    /// Whether a record read at `stage` may be handed to its handler at
    /// `now`: `None` when it may; the dead-letter decision
    /// (`idempotency-window-passed`, the age in `x-error`) when its event was
    /// first produced [`PolicyConfig::max_event_age`] ago or longer, since
    /// the downstream may have forgotten its idempotency key and would act
    /// on it twice. Call it before each call of the handler: a record that
    /// waited (its rung's delay, a brake) may have aged past it meanwhile.
    ///
    /// The event's age counts from its first record before any replay
    /// (`x-first-timestamp`), else the timestamp of its original record (on
    /// the source, the record's own), else its first failure. A record of
    /// unknown age (no timestamp, retry headers that cannot be decoded) is handed
    /// to its handler, and so is one an operator replayed overriding the
    /// window (`x-idempotency-window-overridden-at`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use retry_core::{DeadLetterReason, Decision, Headers, PolicyConfig, RecordMeta, RetryPolicy, RetryTopology, Stage, Timestamp};
    ///
    /// let day = Duration::from_secs(24 * 3600);
    /// let config = PolicyConfig { max_event_age: Some(day), ..Default::default() };
    /// let policy = RetryPolicy::new(RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap(), config);
    /// let none = Headers::new();
    /// let produced = Timestamp::from_millis(1_000);
    /// let record = RecordMeta { topic: "orders", partition: 0, offset: 7, timestamp: Some(produced), headers: &none };
    /// assert_eq!(policy.admit(Stage::SOURCE, &record, produced.saturating_add(day / 2)), None);
    /// let Some(Decision::DeadLetter { reason, .. }) = policy.admit(Stage::SOURCE, &record, produced.saturating_add(day)) else {
    ///     panic!("an event as old as the window is not handled")
    /// };
    /// assert_eq!(reason, DeadLetterReason::IdempotencyWindowPassed);
    /// ```
    pub fn admit(&self, stage: Stage, record: &RecordMeta<'_>, now: Timestamp) -> Option<Decision> {
        let max_age = self.config.max_event_age?;
        let (first_seen, overridden) = match stage.rung() {
            None => (
                RetryHeaders::decode_first_timestamp(record.headers).ok().flatten().or(record.timestamp),
                RetryHeaders::decode_window_overridden_at(record.headers).ok().flatten(),
            ),
            Some(_) => match RetryHeaders::decode(record.headers) {
                Ok(ours) => (Some(ours.first_seen()), ours.window_overridden_at),
                Err(_) => return None,
            },
        };
        if overridden.is_some() {
            return None;
        }
        let age = Duration::from_millis(now.as_millis().saturating_sub(first_seen?.as_millis()).max(0) as u64);
        if age < max_age {
            return None;
        }
        let problem = format!(
            "first produced {} ago, past the {} the downstream is trusted to remember its idempotency key: \
             not handled, since it could act twice; an operator may replay it overriding the idempotency window",
            crate::time::roughly(age),
            crate::schedule::label_of(max_age)
        );
        Some(self.dead_letter_before_handling(stage, record, &problem, now, DeadLetterReason::IdempotencyWindowPassed))
    }

    /// The dead-letter decision for a record not handed to its handler:
    /// `reason`, with `problem` in `x-error`, whatever the rung.
    fn dead_letter_before_handling(
        &self,
        stage: Stage,
        record: &RecordMeta<'_>,
        problem: &str,
        now: Timestamp,
        reason: DeadLetterReason,
    ) -> Decision {
        match self.decide(stage, record, &Err(HandlerError::permanent(problem)), now) {
            Decision::DeadLetter { topic, reason: DeadLetterReason::PermanentFailure, mut headers } => {
                headers.insert(crate::header_names::DEAD_LETTER_REASON, reason.as_str());
                Decision::DeadLetter { topic, reason, headers }
            }
            other => other,
        }
    }

    /// When a record read at `stage` becomes due: at once on the source; on a
    /// retry rung at `x-retry-due-at`, or the record's timestamp plus the
    /// rung's delay when that header is absent or malformed, or `now` plus
    /// the delay when there is no timestamp either. Never later than `now` +
    /// delay + `max_clock_skew`, so no header can park a partition for long.
    pub fn due_at(&self, stage: Stage, record: &RecordMeta<'_>, now: Timestamp) -> Timestamp {
        let Some(delay) = stage.rung().and_then(|i| self.topology.schedule().rungs().get(i)).map(|r| r.delay()) else {
            return now;
        };
        let from_header = RetryHeaders::decode(record.headers).ok().and_then(|h| h.due_at);
        let candidate = from_header.unwrap_or_else(|| record.timestamp.unwrap_or(now).saturating_add(delay));
        candidate.min(now.saturating_add(delay.saturating_add(self.config.max_clock_skew)))
    }

    /// Decides what happens to a record whose retry was decided (`retry`:
    /// the headers of that [`Decision::Retry`]) but whose retry topic
    /// refused it as too large (`problem` says how): the dead-letter topic,
    /// `too-large-for-retry`, with `problem` before the last failure in
    /// `x-error`; everything else the retry carried stays.
    ///
    /// ```
    /// use retry_core::{DeadLetterReason, Decision, HandlerError, Headers, RecordMeta, RetryPolicy, RetryTopology, Stage, Timestamp};
    ///
    /// let policy = RetryPolicy::new(RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap(), Default::default());
    /// let none = Headers::new();
    /// let record = RecordMeta { topic: "orders", partition: 0, offset: 7, timestamp: None, headers: &none };
    /// let now = Timestamp::from_millis(0);
    /// let failed = Err(HandlerError::transient("provider answered 503"));
    /// let Decision::Retry { headers: retry, .. } = policy.decide(Stage::SOURCE, &record, &failed, now) else { panic!() };
    /// let Decision::DeadLetter { topic, reason, headers } = policy.too_large_for_retry(&retry, "refused: too large") else {
    ///     panic!("always dead-lettered")
    /// };
    /// assert_eq!(topic.as_str(), "orders.dlq");
    /// assert_eq!(reason, DeadLetterReason::TooLargeForRetry);
    /// assert_eq!(headers.get("x-error"), Some(&b"refused: too large; last failure: provider answered 503"[..]));
    /// assert_eq!(headers.get("x-retry-due-at"), None);
    /// assert_eq!(headers.get("x-original-offset"), Some(&b"7"[..]));
    /// ```
    pub fn too_large_for_retry(&self, retry: &Headers, problem: &str) -> Decision {
        let reason = DeadLetterReason::TooLargeForRetry;
        match RetryHeaders::decode(retry) {
            Ok(mut next) => {
                let error = format!("{problem}; last failure: {}", next.error);
                next.error = truncate_utf8(&error, MAX_ERROR_BYTES).to_owned();
                self.dead_letter(reason, next, retry)
            }
            // Not headers of ours (a retry decision always carries them):
            // the reason and the problem, on what there is.
            Err(_) => {
                let mut headers = retry.clone();
                headers.remove(crate::header_names::DUE_AT);
                headers.insert(crate::header_names::DEAD_LETTER_REASON, reason.as_str());
                headers.insert(crate::header_names::ERROR, truncate_utf8(problem, MAX_ERROR_BYTES));
                Decision::DeadLetter { topic: self.topology.dead_letter_topic().clone(), reason, headers }
            }
        }
    }

    fn dead_letter(&self, reason: DeadLetterReason, mut next: RetryHeaders, original: &Headers) -> Decision {
        next.dead_letter_reason = Some(reason);
        next.due_at = None;
        Decision::DeadLetter {
            topic: self.topology.dead_letter_topic().clone(),
            reason,
            headers: with_retry_headers(original, &next, self.config.header_style),
        }
    }
}

/// The headers a retry record carries from the attempt before `stage`.
fn previous_headers(stage: Stage, headers: &Headers) -> Result<RetryHeaders, Error> {
    let previous = RetryHeaders::decode(headers)?;
    let expected = stage.attempt() - 1;
    if previous.attempt != expected {
        return Err(Error::CorruptHeader {
            header: crate::header_names::ATTEMPT,
            problem: HeaderProblem::Mismatch { expected: expected.to_string(), found: previous.attempt.to_string() },
        });
    }
    Ok(previous)
}

fn with_retry_headers(original: &Headers, ours: &RetryHeaders, style: HeaderStyle) -> Headers {
    let mut headers = original.clone();
    ours.encode_as(&mut headers, style);
    headers
}

#[cfg(test)]
mod tests;
