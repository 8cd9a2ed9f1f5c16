use std::{collections::BTreeMap, fmt};

use crate::{
    spring::{self, SpringHeaders, Write},
    Error, FailureKind, HeaderProblem, Result, Timestamp, TopicName,
};

/// The most bytes of a handler's error message kept in `x-error`.
pub const MAX_ERROR_BYTES: usize = 1024;

/// The names of the headers `retry-core` writes. Every other header belongs to
/// the producer and passes through the ladder untouched.
///
/// ```
/// use retry_core::header_names;
///
/// assert_eq!(header_names::ATTEMPT, "x-retry-attempt");
/// assert_eq!(header_names::DEAD_LETTER_REASON, "x-dead-letter-reason");
/// // Every name, e.g. to leave ours out when showing a record to operators.
/// assert!(header_names::ALL.contains(&header_names::DUE_AT));
/// ```
pub mod header_names {
    /// How many delivery attempts have failed so far (1 after the source topic).
    pub const ATTEMPT: &str = "x-retry-attempt";
    /// The topic where this pass through the ladder began.
    pub const ORIGINAL_TOPIC: &str = "x-original-topic";
    /// The partition of the original record.
    pub const ORIGINAL_PARTITION: &str = "x-original-partition";
    /// The offset of the original record.
    pub const ORIGINAL_OFFSET: &str = "x-original-offset";
    /// The original record's timestamp, in ms since the epoch (absent when it had none).
    pub const ORIGINAL_TIMESTAMP: &str = "x-original-timestamp";
    /// When the first attempt failed, in ms since the epoch.
    pub const FIRST_FAILURE_AT: &str = "x-first-failure-at";
    /// When a retry record becomes due, in ms since the epoch (retry topics only).
    pub const DUE_AT: &str = "x-retry-due-at";
    /// `transient` or `permanent`: the kind of the last failure.
    pub const ERROR_KIND: &str = "x-error-kind";
    /// The last failure's message, truncated to 1 KiB.
    pub const ERROR: &str = "x-error";
    /// Why the record was dead-lettered (dead-letter topic only).
    pub const DEAD_LETTER_REASON: &str = "x-dead-letter-reason";
    /// How many times operators replayed the record from the dead-letter topic.
    pub const REPLAY_COUNT: &str = "x-replay-count";
    /// The timestamp of the event's first record, before any replay, in ms
    /// since the epoch: how old its idempotency key may be. Written by a
    /// replay and carried forward like `x-replay-count`.
    pub const FIRST_TIMESTAMP: &str = "x-first-timestamp";
    /// When an operator replayed the record past the idempotency window, in
    /// ms since the epoch: the event is handled whatever its age. Written by
    /// such a replay and carried forward like `x-replay-count`.
    pub const WINDOW_OVERRIDDEN_AT: &str = "x-idempotency-window-overridden-at";
    /// When each attempt was due and failed (see [`crate::history`]).
    pub const HISTORY: &str = "x-retry-history";

    /// Every header name above.
    pub const ALL: [&str; 14] = [
        ATTEMPT,
        ORIGINAL_TOPIC,
        ORIGINAL_PARTITION,
        ORIGINAL_OFFSET,
        ORIGINAL_TIMESTAMP,
        FIRST_FAILURE_AT,
        DUE_AT,
        ERROR_KIND,
        ERROR,
        DEAD_LETTER_REASON,
        REPLAY_COUNT,
        FIRST_TIMESTAMP,
        WINDOW_OVERRIDDEN_AT,
        HISTORY,
    ];

    /// Whether `name` is one of ours.
    ///
    /// ```
    /// use retry_core::header_names::is_retry_header;
    ///
    /// assert!(is_retry_header("x-retry-due-at"));
    /// // The producer's headers pass through the ladder untouched.
    /// assert!(!is_retry_header("traceparent"));
    /// ```
    pub fn is_retry_header(name: &str) -> bool {
        ALL.contains(&name)
    }
}

use header_names as names;

/// A record's headers, in order. Kafka allows a name to repeat; lookups see
/// the last value, as Kafka's own `lastHeader` does.
///
/// ```
/// use retry_core::Headers;
///
/// let mut headers = Headers::new();
/// headers.insert("traceparent", "00-abc-01");
/// headers.insert("x-retry-attempt", "1");
/// // `insert` replaces, so a hop never leaves two attempt counts behind.
/// headers.insert("x-retry-attempt", "2");
/// assert_eq!((headers.get("x-retry-attempt"), headers.len()), (Some(&b"2"[..]), 2));
/// headers.insert("kafka_original-topic", "orders");
/// let producers = headers.without_retry_headers();
/// assert_eq!(producers.iter().collect::<Vec<_>>(), [("traceparent", &b"00-abc-01"[..])]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, Vec<u8>)>);

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Self::default()
    }

    /// The last value of header `name`.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.0.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_slice())
    }

    /// Sets `name` to `value`, replacing every earlier value of `name`.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) {
        let name = name.into();
        self.remove(&name);
        self.0.push((name, value.into()));
    }

    /// Removes every value of `name`.
    pub fn remove(&mut self, name: &str) {
        self.0.retain(|(k, _)| k != name);
    }

    /// The headers in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &[u8])> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
    }

    /// How many headers there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The producer's headers: these headers without ours and without
    /// Spring Kafka's retry and dead-letter headers.
    pub fn without_retry_headers(&self) -> Headers {
        let producers = |k: &str| !names::is_retry_header(k) && !spring::header_names::is_spring_header(k);
        Headers(self.0.iter().filter(|(k, _)| producers(k)).cloned().collect())
    }
}

impl FromIterator<(String, Vec<u8>)> for Headers {
    fn from_iter<I: IntoIterator<Item = (String, Vec<u8>)>>(iter: I) -> Self {
        Headers(iter.into_iter().collect())
    }
}

impl IntoIterator for Headers {
    type Item = (String, Vec<u8>);
    type IntoIter = std::vec::IntoIter<(String, Vec<u8>)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl From<BTreeMap<String, Vec<u8>>> for Headers {
    fn from(map: BTreeMap<String, Vec<u8>>) -> Self {
        map.into_iter().collect()
    }
}

impl From<Headers> for BTreeMap<String, Vec<u8>> {
    /// One value per name (the last), as transports with map headers need.
    fn from(headers: Headers) -> Self {
        headers.0.into_iter().collect()
    }
}

/// The exception classes our records name in Spring's style: the failure's kind.
const TRANSIENT_CLASS: &str = "retry_core.TransientFailure";
const PERMANENT_CLASS: &str = "retry_core.PermanentFailure";

/// Which headers a hop writes: ours (`native`, the default), Spring
/// Kafka's (`spring`: its names and binary encodings, so Spring's tooling
/// and `@DltHandler` read our records), or both.
///
/// ```
/// use retry_core::HeaderStyle;
///
/// assert_eq!("spring".parse::<HeaderStyle>(), Ok(HeaderStyle::Spring));
/// assert_eq!(HeaderStyle::default(), HeaderStyle::Native);
/// assert!("java".parse::<HeaderStyle>().unwrap_err().contains("native, spring or both"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    /// Ours only (`x-retry-attempt`, ...: plain text).
    #[default]
    Native,
    /// Spring Kafka's only (`retry_topic-attempts`, `kafka_original-*`, ...).
    Spring,
    /// Both.
    Both,
}

impl HeaderStyle {
    /// Whether ours are written.
    fn native(self) -> bool {
        matches!(self, HeaderStyle::Native | HeaderStyle::Both)
    }

    /// Whether Spring's are written.
    fn spring(self) -> bool {
        matches!(self, HeaderStyle::Spring | HeaderStyle::Both)
    }

    /// Its name in settings: `native`, `spring` or `both`.
    pub fn as_str(self) -> &'static str {
        match self {
            HeaderStyle::Native => "native",
            HeaderStyle::Spring => "spring",
            HeaderStyle::Both => "both",
        }
    }
}

impl std::str::FromStr for HeaderStyle {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "native" => Ok(HeaderStyle::Native),
            "spring" => Ok(HeaderStyle::Spring),
            "both" => Ok(HeaderStyle::Both),
            other => Err(format!("a header style is native, spring or both, not {other:?}")),
        }
    }
}

/// Why a record went to the dead-letter topic (`x-dead-letter-reason`).
///
/// ```
/// use retry_core::DeadLetterReason;
///
/// assert_eq!(DeadLetterReason::RetriesExhausted.as_str(), "retries-exhausted");
/// assert_eq!(DeadLetterReason::DeadlineExceeded.to_string(), "deadline-exceeded");
/// assert_eq!(DeadLetterReason::ALL.len(), 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The handler failed permanently (4xx, validation, bad payload, panic).
    PermanentFailure,
    /// Every rung of the schedule was tried and failed.
    RetriesExhausted,
    /// The overall deadline since the first failure passed.
    DeadlineExceeded,
    /// A record on a retry topic carried retry headers that cannot be decoded.
    CorruptRetryHeaders,
    /// What was read cannot be handled as it is (a header name that is not
    /// UTF-8, a batch that cannot be decoded): dead-lettered as it is, the
    /// handler never called.
    Undecodable,
    /// The record was to be retried, but its retry topic refused it as too
    /// large (the topic's `max.message.bytes` is below the record's size
    /// even compressed): dead-lettered instead, as it is, so the partition
    /// goes on.
    TooLargeForRetry,
    /// The event was first produced longer ago than the downstream keeps
    /// idempotency keys (less a safety margin): handling it could act on it
    /// twice, so it is dead-lettered before the handler is called. An
    /// operator may replay it, overriding the window.
    IdempotencyWindowPassed,
}

impl DeadLetterReason {
    /// The header value, e.g. `retries-exhausted`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::PermanentFailure => "permanent-failure",
            DeadLetterReason::RetriesExhausted => "retries-exhausted",
            DeadLetterReason::DeadlineExceeded => "deadline-exceeded",
            DeadLetterReason::CorruptRetryHeaders => "corrupt-retry-headers",
            DeadLetterReason::Undecodable => "undecodable",
            DeadLetterReason::TooLargeForRetry => "too-large-for-retry",
            DeadLetterReason::IdempotencyWindowPassed => "idempotency-window-passed",
        }
    }

    /// Every reason.
    pub const ALL: [DeadLetterReason; 7] = [
        DeadLetterReason::PermanentFailure,
        DeadLetterReason::RetriesExhausted,
        DeadLetterReason::DeadlineExceeded,
        DeadLetterReason::CorruptRetryHeaders,
        DeadLetterReason::Undecodable,
        DeadLetterReason::TooLargeForRetry,
        DeadLetterReason::IdempotencyWindowPassed,
    ];

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The retry headers of a record on a retry or dead-letter topic, decoded.
///
/// Values are ASCII decimal numbers (timestamps in ms since the epoch) or
/// fixed words, so operators can read them with any Kafka tool.
///
/// ```
/// use retry_core::{
///     Decision, HandlerError, Headers, RecordMeta, RetryHeaders, RetryPolicy, RetryTopology, Stage, Timestamp,
/// };
///
/// let policy = RetryPolicy::new(RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap(), Default::default());
/// let none = Headers::new();
/// let record = RecordMeta { topic: "orders", partition: 3, offset: 42, timestamp: None, headers: &none };
/// let failed = Err(HandlerError::transient("provider answered 503"));
/// let first = policy.decide(Stage::SOURCE, &record, &failed, Timestamp::from_millis(1_000));
/// let Decision::Retry { headers, .. } = first else {
///     panic!("a transient failure on the source is retried")
/// };
/// // Plain text, readable with any Kafka tool.
/// assert_eq!(headers.get("x-original-offset"), Some(&b"42"[..]));
/// let ours = RetryHeaders::decode(&headers).unwrap();
/// assert_eq!((ours.attempt, ours.error.as_str()), (1, "provider answered 503"));
/// assert_eq!(ours.due_at, Some(Timestamp::from_millis(6_000)));
/// let mut again = Headers::new();
/// ours.encode_into(&mut again);
/// // The same headers, but the attempts' times (see `retry_core::history`).
/// assert_eq!(headers.get("x-retry-history"), Some(&b"-/1000"[..]));
/// let mut without_history = headers.clone();
/// without_history.remove("x-retry-history");
/// assert_eq!(again, without_history);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryHeaders {
    /// How many delivery attempts have failed so far.
    pub attempt: u32,
    /// Where this pass through the ladder began.
    pub original_topic: TopicName,
    /// The original record's partition.
    pub original_partition: i32,
    /// The original record's offset.
    pub original_offset: i64,
    /// The original record's timestamp, if it had one.
    pub original_timestamp: Option<Timestamp>,
    /// When the first attempt failed.
    pub first_failure_at: Timestamp,
    /// When the record becomes due (retry topics only).
    pub due_at: Option<Timestamp>,
    /// The kind of the last failure.
    pub error_kind: FailureKind,
    /// The last failure's message (at most [`MAX_ERROR_BYTES`] once encoded).
    pub error: String,
    /// Why the record was dead-lettered (dead-letter topic only).
    pub dead_letter_reason: Option<DeadLetterReason>,
    /// How often operators replayed the record (0 when the header is absent).
    pub replay_count: u32,
    /// The timestamp of the event's first record, before any replay
    /// (absent until the record is replayed).
    pub first_timestamp: Option<Timestamp>,
    /// When an operator replayed it past the idempotency window (absent
    /// unless one did): it is handled whatever its age.
    pub window_overridden_at: Option<Timestamp>,
}

impl RetryHeaders {
    /// Decodes our headers from `headers`. Total: any missing or malformed
    /// header gives [`Error::CorruptHeader`], never a panic. Optional headers
    /// (`x-original-timestamp`, `x-retry-due-at`, `x-dead-letter-reason`,
    /// `x-replay-count`) may be absent, but not malformed.
    /// Headers are checked in the order of [`header_names::ALL`], so the
    /// error names the first bad one.
    ///
    /// A record without ours that carries Spring Kafka's retry or
    /// dead-letter headers is read from those (see [`crate::spring`]).
    pub fn decode(headers: &Headers) -> Result<Self> {
        if headers.get(names::ATTEMPT).is_none() && spring::carries_spring_headers(|n| headers.get(n)) {
            let spring = RetryHeaders::from_spring(SpringHeaders::decode(|n| headers.get(n))?);
            // What rides along as ours in the Spring style.
            return Ok(RetryHeaders {
                dead_letter_reason: optional(headers, names::DEAD_LETTER_REASON, parse_reason)?,
                replay_count: optional(headers, names::REPLAY_COUNT, parse_number)?.unwrap_or(0),
                first_timestamp: optional(headers, names::FIRST_TIMESTAMP, parse_timestamp)?,
                window_overridden_at: optional(headers, names::WINDOW_OVERRIDDEN_AT, parse_timestamp)?,
                ..spring
            });
        }
        Ok(RetryHeaders {
            attempt: required(headers, names::ATTEMPT, parse_number)?,
            original_topic: required(headers, names::ORIGINAL_TOPIC, |s| {
                TopicName::new(s).map_err(|_| HeaderProblem::UnknownValue(s.to_owned()))
            })?,
            original_partition: required(headers, names::ORIGINAL_PARTITION, parse_number)?,
            original_offset: required(headers, names::ORIGINAL_OFFSET, parse_number)?,
            original_timestamp: optional(headers, names::ORIGINAL_TIMESTAMP, parse_timestamp)?,
            first_failure_at: required(headers, names::FIRST_FAILURE_AT, parse_timestamp)?,
            due_at: optional(headers, names::DUE_AT, parse_timestamp)?,
            error_kind: required(headers, names::ERROR_KIND, |s| {
                FailureKind::parse(s).ok_or_else(|| HeaderProblem::UnknownValue(s.to_owned()))
            })?,
            error: required(headers, names::ERROR, |s| Ok(s.to_owned()))?,
            dead_letter_reason: optional(headers, names::DEAD_LETTER_REASON, parse_reason)?,
            replay_count: optional(headers, names::REPLAY_COUNT, parse_number)?.unwrap_or(0),
            first_timestamp: optional(headers, names::FIRST_TIMESTAMP, parse_timestamp)?,
            window_overridden_at: optional(headers, names::WINDOW_OVERRIDDEN_AT, parse_timestamp)?,
        })
    }

    /// Ours, from what Spring's headers say. What Spring does not record
    /// is made up as safely as it can be: the first failure is taken to be
    /// the original record's timestamp (which can only bring an age or a
    /// deadline closer); the failure is transient (Spring records no kind,
    /// and its default classification retries every failure but a few
    /// fatal ones; it writes a due time on its dead-letter hop too), unless
    /// the class is one we write in Spring's style
    /// (`retry_core.TransientFailure`, `retry_core.PermanentFailure`); the
    /// error is the exception's message, with any other root cause's class
    /// in brackets, which tells more.
    fn from_spring(spring: SpringHeaders) -> RetryHeaders {
        // Our own records in Spring's style name the kind as the class.
        let (error_kind, error) = match spring.exception_cause.as_deref() {
            Some(TRANSIENT_CLASS) => (FailureKind::Transient, spring.exception_message),
            Some(PERMANENT_CLASS) => (FailureKind::Permanent, spring.exception_message),
            Some(cause) => (FailureKind::Transient, format!("{} [{cause}]", spring.exception_message)),
            None => (FailureKind::Transient, spring.exception_message),
        };
        RetryHeaders {
            attempt: spring.next_attempt - 1,
            original_topic: spring.original_topic,
            original_partition: spring.original_partition,
            original_offset: spring.original_offset,
            original_timestamp: spring.original_timestamp,
            first_failure_at: spring.original_timestamp.unwrap_or(Timestamp::from_millis(0)),
            due_at: spring.due_at,
            error_kind,
            error,
            dead_letter_reason: None,
            replay_count: 0,
            first_timestamp: None,
            window_overridden_at: None,
        }
    }

    /// Appends, sets or keeps Spring's headers as Spring does on a hop.
    fn encode_spring(&self, headers: &mut Headers) {
        let spring = SpringHeaders {
            next_attempt: self.attempt.saturating_add(1),
            original_topic: self.original_topic.clone(),
            original_partition: self.original_partition,
            original_offset: self.original_offset,
            original_timestamp: self.original_timestamp,
            due_at: self.due_at,
            exception_message: truncate_utf8(&self.error, MAX_ERROR_BYTES).to_owned(),
            exception_cause: None,
        };
        let class = match self.error_kind {
            FailureKind::Transient => TRANSIENT_CLASS,
            FailureKind::Permanent => PERMANENT_CLASS,
        };
        for (name, write, value) in spring.encode(class) {
            match write {
                Write::Once if headers.get(name).is_some() => {}
                Write::Once | Write::Append => headers.0.push((name.to_owned(), value)),
                Write::Replace => headers.insert(name, value),
            }
        }
    }

    /// Decodes only `x-idempotency-window-overridden-at`: carried forward on
    /// a source topic after a replay that overrode the window.
    pub fn decode_window_overridden_at(headers: &Headers) -> Result<Option<Timestamp>> {
        optional(headers, names::WINDOW_OVERRIDDEN_AT, parse_timestamp)
    }

    /// Decodes only `x-first-timestamp`: carried forward on a source topic
    /// after a replay, with `x-replay-count`.
    pub fn decode_first_timestamp(headers: &Headers) -> Result<Option<Timestamp>> {
        optional(headers, names::FIRST_TIMESTAMP, parse_timestamp)
    }

    /// When the event was first produced, as far as these headers know: the
    /// first record before any replay, else this pass's original record,
    /// else (a record without a timestamp) its first failure. The age of
    /// its idempotency key downstream is at most the time since then.
    pub fn first_seen(&self) -> Timestamp {
        self.first_timestamp.or(self.original_timestamp).unwrap_or(self.first_failure_at)
    }

    /// Decodes only `x-replay-count` (0 when absent): the one header a record
    /// on a source topic carries forward, after a replay.
    pub fn decode_replay_count(headers: &Headers) -> Result<u32> {
        Ok(optional(headers, names::REPLAY_COUNT, parse_number)?.unwrap_or(0))
    }

    /// Writes these headers into `headers`: every header of ours already there
    /// is removed first (so a hop replaces, never appends), the producer's
    /// headers are kept as they are, and `error` is truncated to
    /// [`MAX_ERROR_BYTES`] on a UTF-8 boundary.
    pub fn encode_into(&self, headers: &mut Headers) {
        self.encode_as(headers, HeaderStyle::Native);
    }

    /// Writes these headers into `headers` in `style`: ours as
    /// [`encode_into`](Self::encode_into) does; Spring's as Spring does (the
    /// original record's coordinates only where absent, the attempt about to
    /// run and the due time appended, the exception replaced; see
    /// [`crate::spring`]). In the Spring style, ours are removed.
    ///
    /// ```
    /// use retry_core::{HeaderStyle, Headers, RetryHeaders};
    ///
    /// let mut native = Headers::new();
    /// native.insert("x-retry-attempt", "1");
    /// native.insert("x-original-topic", "orders");
    /// native.insert("x-original-partition", "0");
    /// native.insert("x-original-offset", "7");
    /// native.insert("x-first-failure-at", "1000");
    /// native.insert("x-retry-due-at", "6000");
    /// native.insert("x-error-kind", "transient");
    /// native.insert("x-error", "provider answered 503");
    /// let ours = RetryHeaders::decode(&native).unwrap();
    /// let mut spring = Headers::new();
    /// ours.encode_as(&mut spring, HeaderStyle::Spring);
    /// assert_eq!(spring.get("retry_topic-attempts"), Some(&2i32.to_be_bytes()[..]));
    /// assert_eq!(spring.get("x-retry-attempt"), None);
    /// // Read back through Spring's headers: the same attempt, offset and due time.
    /// let back = RetryHeaders::decode(&spring).unwrap();
    /// assert_eq!((back.attempt, back.original_offset, back.due_at), (1, 7, ours.due_at));
    /// ```
    pub fn encode_as(&self, headers: &mut Headers, style: HeaderStyle) {
        headers.0.retain(|(k, _)| !names::is_retry_header(k));
        if style.spring() {
            self.encode_spring(headers);
        }
        let mut put = |name: &str, value: String| headers.0.push((name.to_owned(), value.into_bytes()));
        if !style.native() {
            // Spring has no word for these; they ride along as ours, which
            // Spring copies from hop to hop, so that a record's replays and
            // age are known wherever it goes (the loop guard and the
            // idempotency window need them).
            if let Some(reason) = self.dead_letter_reason {
                put(names::DEAD_LETTER_REASON, reason.as_str().to_owned());
            }
            if self.replay_count > 0 {
                put(names::REPLAY_COUNT, self.replay_count.to_string());
            }
            self.encode_lineage(&mut put);
            return;
        }
        put(names::ATTEMPT, self.attempt.to_string());
        put(names::ORIGINAL_TOPIC, self.original_topic.to_string());
        put(names::ORIGINAL_PARTITION, self.original_partition.to_string());
        put(names::ORIGINAL_OFFSET, self.original_offset.to_string());
        if let Some(t) = self.original_timestamp {
            put(names::ORIGINAL_TIMESTAMP, t.as_millis().to_string());
        }
        put(names::FIRST_FAILURE_AT, self.first_failure_at.as_millis().to_string());
        if let Some(t) = self.due_at {
            put(names::DUE_AT, t.as_millis().to_string());
        }
        put(names::ERROR_KIND, self.error_kind.as_str().to_owned());
        put(names::ERROR, truncate_utf8(&self.error, MAX_ERROR_BYTES).to_owned());
        if let Some(reason) = self.dead_letter_reason {
            put(names::DEAD_LETTER_REASON, reason.as_str().to_owned());
        }
        put(names::REPLAY_COUNT, self.replay_count.to_string());
        self.encode_lineage(&mut put);
    }

    /// The event's first timestamp and the idempotency window's override,
    /// in either style.
    fn encode_lineage(&self, put: &mut impl FnMut(&str, String)) {
        if let Some(t) = self.first_timestamp {
            put(names::FIRST_TIMESTAMP, t.as_millis().to_string());
        }
        if let Some(t) = self.window_overridden_at {
            put(names::WINDOW_OVERRIDDEN_AT, t.as_millis().to_string());
        }
    }
}

/// The longest prefix of `s` that is at most `max` bytes and ends on a
/// character boundary.
pub(crate) fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn text<'a>(headers: &'a Headers, name: &'static str) -> Result<Option<&'a str>> {
    headers
        .get(name)
        .map(|v| {
            std::str::from_utf8(v).map_err(|_| Error::CorruptHeader { header: name, problem: HeaderProblem::NotUtf8 })
        })
        .transpose()
}

fn optional<T>(
    headers: &Headers,
    name: &'static str,
    parse: impl FnOnce(&str) -> Result<T, HeaderProblem>,
) -> Result<Option<T>> {
    text(headers, name)?.map(|s| parse(s).map_err(|problem| Error::CorruptHeader { header: name, problem })).transpose()
}

fn required<T>(
    headers: &Headers,
    name: &'static str,
    parse: impl FnOnce(&str) -> Result<T, HeaderProblem>,
) -> Result<T> {
    optional(headers, name, parse)?.ok_or(Error::CorruptHeader { header: name, problem: HeaderProblem::Missing })
}

/// A non-negative decimal integer: digits only, no sign, no spaces.
fn parse_number<T: std::str::FromStr>(s: &str) -> Result<T, HeaderProblem> {
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if s.strip_prefix('-').is_some_and(digits) {
        return Err(HeaderProblem::Negative(s.to_owned()));
    }
    if !digits(s) {
        return Err(HeaderProblem::NotANumber(s.to_owned()));
    }
    s.parse().map_err(|_| HeaderProblem::NotANumber(s.to_owned()))
}

fn parse_timestamp(s: &str) -> Result<Timestamp, HeaderProblem> {
    parse_number::<i64>(s).map(Timestamp::from_millis)
}

fn parse_reason(s: &str) -> Result<DeadLetterReason, HeaderProblem> {
    DeadLetterReason::parse(s).ok_or_else(|| HeaderProblem::UnknownValue(s.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> RetryHeaders {
        RetryHeaders {
            attempt: 2,
            original_topic: TopicName::new("orders.confirmed").unwrap(),
            original_partition: 3,
            original_offset: 42,
            original_timestamp: Some(Timestamp::from_millis(1_700_000_000_000)),
            first_failure_at: Timestamp::from_millis(1_700_000_000_100),
            due_at: Some(Timestamp::from_millis(1_700_000_030_100)),
            error_kind: FailureKind::Transient,
            error: "provider answered 503".into(),
            dead_letter_reason: None,
            replay_count: 0,
            first_timestamp: None,
            window_overridden_at: None,
        }
    }

    fn encoded(h: &RetryHeaders) -> Headers {
        let mut headers = Headers::new();
        h.encode_into(&mut headers);
        headers
    }

    #[test]
    fn encodes_readable_text() {
        let got: Vec<(String, String)> =
            encoded(&sample()).iter().map(|(k, v)| (k.to_owned(), String::from_utf8(v.to_vec()).unwrap())).collect();
        let want = [
            ("x-retry-attempt", "2"),
            ("x-original-topic", "orders.confirmed"),
            ("x-original-partition", "3"),
            ("x-original-offset", "42"),
            ("x-original-timestamp", "1700000000000"),
            ("x-first-failure-at", "1700000000100"),
            ("x-retry-due-at", "1700000030100"),
            ("x-error-kind", "transient"),
            ("x-error", "provider answered 503"),
            ("x-replay-count", "0"),
        ];
        assert_eq!(got, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
    }

    /// Decodes `sample()` with header `name` set to `value` (or removed).
    #[track_caller]
    fn check(name: &str, value: Option<&[u8]>, expected: Result<(), Error>) {
        let mut headers = encoded(&sample());
        match value {
            Some(v) => headers.insert(name, v),
            None => headers.remove(name),
        }
        assert_eq!(RetryHeaders::decode(&headers).map(|_| ()), expected, "{name} = {value:?}");
    }

    fn corrupt(header: &'static str, problem: HeaderProblem) -> Result<(), Error> {
        Err(Error::CorruptHeader { header, problem })
    }

    #[test]
    fn decoding_is_total() {
        use HeaderProblem::*;
        let s = |v: &str| NotANumber(v.to_owned());
        check(names::ATTEMPT, None, corrupt(names::ATTEMPT, Missing));
        check(names::ATTEMPT, Some(b""), corrupt(names::ATTEMPT, s("")));
        check(names::ATTEMPT, Some(b"two"), corrupt(names::ATTEMPT, s("two")));
        check(names::ATTEMPT, Some(b" 2"), corrupt(names::ATTEMPT, s(" 2")));
        check(names::ATTEMPT, Some(b"+2"), corrupt(names::ATTEMPT, s("+2")));
        check(names::ATTEMPT, Some(b"2.0"), corrupt(names::ATTEMPT, s("2.0")));
        check(names::ATTEMPT, Some(b"-1"), corrupt(names::ATTEMPT, Negative("-1".into())));
        check(names::ATTEMPT, Some(b"4294967296"), corrupt(names::ATTEMPT, s("4294967296")));
        check(names::ATTEMPT, Some(b"\xff\xfe"), corrupt(names::ATTEMPT, NotUtf8));
        check(names::ORIGINAL_TOPIC, None, corrupt(names::ORIGINAL_TOPIC, Missing));
        check(
            names::ORIGINAL_TOPIC,
            Some(b"no spaces please"),
            corrupt(names::ORIGINAL_TOPIC, UnknownValue("no spaces please".into())),
        );
        check(names::ORIGINAL_PARTITION, Some(b"2147483648"), corrupt(names::ORIGINAL_PARTITION, s("2147483648")));
        check(names::ORIGINAL_PARTITION, Some(b"-3"), corrupt(names::ORIGINAL_PARTITION, Negative("-3".into())));
        check(names::ORIGINAL_OFFSET, Some(b"-1"), corrupt(names::ORIGINAL_OFFSET, Negative("-1".into())));
        check(
            names::ORIGINAL_OFFSET,
            Some(b"9223372036854775808"),
            corrupt(names::ORIGINAL_OFFSET, s("9223372036854775808")),
        );
        check(names::ORIGINAL_TIMESTAMP, None, Ok(()));
        check(names::ORIGINAL_TIMESTAMP, Some(b"-1"), corrupt(names::ORIGINAL_TIMESTAMP, Negative("-1".into())));
        check(names::FIRST_FAILURE_AT, None, corrupt(names::FIRST_FAILURE_AT, Missing));
        check(names::DUE_AT, None, Ok(()));
        check(names::DUE_AT, Some(b"soon"), corrupt(names::DUE_AT, s("soon")));
        check(names::ERROR_KIND, Some(b"fatal"), corrupt(names::ERROR_KIND, UnknownValue("fatal".into())));
        check(names::ERROR, None, corrupt(names::ERROR, Missing));
        check(names::ERROR, Some(b""), Ok(()));
        check(names::ERROR, Some(b"\xc3"), corrupt(names::ERROR, NotUtf8));
        check(names::DEAD_LETTER_REASON, Some(b"retries-exhausted"), Ok(()));
        check(
            names::DEAD_LETTER_REASON,
            Some(b"bored"),
            corrupt(names::DEAD_LETTER_REASON, UnknownValue("bored".into())),
        );
        check(names::REPLAY_COUNT, None, Ok(()));
        check(names::REPLAY_COUNT, Some(b"x"), corrupt(names::REPLAY_COUNT, s("x")));
    }

    #[test]
    fn corrupt_header_messages_name_the_header() {
        let e = Error::CorruptHeader { header: names::ATTEMPT, problem: HeaderProblem::NotANumber("two".into()) };
        assert_eq!(e.to_string(), r#"retry header x-retry-attempt is not a number in range: "two""#);
        let e = Error::CorruptHeader { header: names::ERROR, problem: HeaderProblem::Missing };
        assert_eq!(e.to_string(), "retry header x-error is missing");
    }

    #[test]
    fn error_is_truncated_on_a_char_boundary() {
        let mut h = sample();
        h.error = "é".repeat(600); // 1200 bytes, 2 per char
        let decoded = RetryHeaders::decode(&encoded(&h)).unwrap();
        assert_eq!(decoded.error, "é".repeat(512));
        assert_eq!(truncate_utf8("aé", 2), "a");
        assert_eq!(truncate_utf8("abc", 3), "abc");
        assert_eq!(truncate_utf8("", 0), "");
    }

    #[test]
    fn a_hop_replaces_our_headers_and_keeps_the_producers() {
        let mut headers: Headers = [
            ("traceparent".to_owned(), b"00-abc-01".to_vec()),
            (names::ATTEMPT.to_owned(), b"1".to_vec()),
            (names::DEAD_LETTER_REASON.to_owned(), b"bogus".to_vec()),
            ("content-type".to_owned(), b"application/json".to_vec()),
            (names::ATTEMPT.to_owned(), b"7".to_vec()),
        ]
        .into_iter()
        .collect();
        sample().encode_into(&mut headers);
        let ours = headers.iter().filter(|(k, _)| names::is_retry_header(k)).count();
        assert_eq!(ours, 10, "each of ours once; no stale x-dead-letter-reason");
        assert_eq!(
            headers.without_retry_headers().iter().collect::<Vec<_>>(),
            [("traceparent", &b"00-abc-01"[..]), ("content-type", &b"application/json"[..])]
        );
        assert_eq!(RetryHeaders::decode(&headers).unwrap(), sample());
    }

    #[test]
    fn headers_lookup_sees_the_last_value() {
        let mut h: Headers = [("a".to_owned(), b"1".to_vec()), ("a".to_owned(), b"2".to_vec())].into_iter().collect();
        assert_eq!(h.get("a"), Some(&b"2"[..]));
        h.insert("a", "3");
        assert_eq!(h.len(), 1);
        let map: BTreeMap<String, Vec<u8>> = h.clone().into();
        assert_eq!(Headers::from(map), h);
    }

    fn retry_headers() -> impl Strategy<Value = RetryHeaders> {
        let ts = || prop_oneof![Just(0i64), 0..i64::MAX, Just(i64::MAX)].prop_map(Timestamp::from_millis);
        (
            (any::<u32>(), "[a-zA-Z0-9._-]{1,249}", 0..=i32::MAX, 0..=i64::MAX),
            (proptest::option::of(ts()), ts(), proptest::option::of(ts())),
            (prop_oneof![Just(FailureKind::Transient), Just(FailureKind::Permanent)], "\\PC{0,600}"),
            (
                proptest::option::of(proptest::sample::select(DeadLetterReason::ALL.to_vec())),
                any::<u32>(),
                proptest::option::of(ts()),
                proptest::option::of(ts()),
            ),
        )
            .prop_filter_map("topic names . and .. are invalid", |(a, b, c, d)| {
                Some(RetryHeaders {
                    attempt: a.0,
                    original_topic: TopicName::new(a.1).ok()?,
                    original_partition: a.2,
                    original_offset: a.3,
                    original_timestamp: b.0,
                    first_failure_at: b.1,
                    due_at: b.2,
                    error_kind: c.0,
                    error: c.1,
                    dead_letter_reason: d.0,
                    replay_count: d.1,
                    first_timestamp: d.2,
                    window_overridden_at: d.3,
                })
            })
    }

    fn foreign_headers() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
        proptest::collection::vec(("[a-z-]{1,12}", proptest::collection::vec(any::<u8>(), 0..16)), 0..6)
    }

    proptest! {
        #[test]
        fn round_trip(h in retry_headers(), foreign in foreign_headers()) {
            let foreign: Headers = foreign.into_iter().filter(|(k, _)| !names::is_retry_header(k)).collect();
            let mut headers = foreign.clone();
            h.encode_into(&mut headers);
            let decoded = RetryHeaders::decode(&headers).unwrap();
            let mut expected = h.clone();
            expected.error = truncate_utf8(&h.error, MAX_ERROR_BYTES).to_owned();
            prop_assert_eq!(decoded, expected);
            prop_assert_eq!(headers.without_retry_headers(), foreign);
            // Encoding twice is encoding once: sizes stay bounded along the ladder.
            let once = headers.clone();
            h.encode_into(&mut headers);
            prop_assert_eq!(headers, once);
        }

        /// Spring's style keeps what Spring's headers can say, and what
        /// rides along as ours (replays, the event's age, the reason); the
        /// first failure becomes the original record's timestamp.
        #[test]
        fn spring_style_round_trip(h in retry_headers(), foreign in foreign_headers()) {
            let h = RetryHeaders { attempt: h.attempt % (i32::MAX as u32 - 1) + 1, ..h };
            let foreign = Headers(foreign).without_retry_headers();
            let mut headers = foreign.clone();
            h.encode_as(&mut headers, HeaderStyle::Spring);
            prop_assert!(headers.iter().all(|(k, _)| k != names::ATTEMPT));
            let decoded = RetryHeaders::decode(&headers).unwrap();
            let expected = RetryHeaders {
                error: truncate_utf8(&h.error, MAX_ERROR_BYTES).to_owned(),
                first_failure_at: h.original_timestamp.unwrap_or(Timestamp::from_millis(0)),
                ..h.clone()
            };
            prop_assert_eq!(decoded, expected);
        }

        #[test]
        fn decode_never_panics(raw in proptest::collection::vec(
            (
                // Ours and Spring's, under both of its styles of names.
                proptest::sample::select(
                    [&names::ALL[..], &crate::spring::header_names::ALL[..], &["kafka_dlt-original-topic"]].concat()
                ),
                proptest::collection::vec(any::<u8>(), 0..24),
            ),
            0..16,
        )) {
            let headers: Headers = raw.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            let _ = RetryHeaders::decode(&headers);
            let _ = RetryHeaders::decode_replay_count(&headers);
            let _ = RetryHeaders::decode_first_timestamp(&headers);
        }
    }
}
