//! Spring Kafka's retry headers, as `@RetryableTopic` and its
//! `DeadLetterPublishingRecoverer` write them (Spring Kafka 4): read
//! wherever ours are absent, so records Spring retried or dead-lettered are
//! handled, shown and replayed with their history.
//!
//! What Spring writes (pinned by the integration test that runs a Spring
//! peer, `tests/it/spring.rs`):
//! - the original record's coordinates, once, at the first hop:
//!   `kafka_original-topic` (UTF-8), `kafka_original-partition` (a 4-byte
//!   big-endian int), `kafka_original-offset` and `kafka_original-timestamp`
//!   (8-byte big-endian longs); a plain dead-letter recoverer writes them as
//!   `kafka_dlt-original-*`;
//! - at every hop, appended: `retry_topic-attempts` (the attempt about to
//!   run, a 4-byte big-endian int; one byte in old versions),
//!   `retry_topic-backoff-timestamp` (the due time) and
//!   `retry_topic-original-timestamp`, both in milliseconds as Java's
//!   `BigInteger.toByteArray` writes them (big-endian two's complement, as
//!   few bytes as the value needs);
//! - replaced at every hop: `kafka_exception-fqcn`,
//!   `kafka_exception-cause-fqcn`, `kafka_exception-message` (UTF-8).
//!
//! ```
//! use retry_core::{spring, Headers, RetryHeaders, Timestamp};
//!
//! let mut headers = Headers::new();
//! headers.insert(spring::header_names::ORIGINAL_TOPIC, "orders");
//! headers.insert(spring::header_names::ORIGINAL_PARTITION, 2i32.to_be_bytes());
//! headers.insert(spring::header_names::ORIGINAL_OFFSET, 42i64.to_be_bytes());
//! headers.insert(spring::header_names::ATTEMPTS, 2i32.to_be_bytes());
//! // 1_700_000_005_000 ms as BigInteger bytes: six of them.
//! headers.insert(spring::header_names::BACKOFF_TIMESTAMP, &1_700_000_005_000i64.to_be_bytes()[2..]);
//! headers.insert(spring::header_names::EXCEPTION_MESSAGE, "provider answered 503");
//! let read = RetryHeaders::decode(&headers).unwrap();
//! // Spring counts the attempt about to run; we count those that failed.
//! assert_eq!((read.attempt, read.original_topic.as_str(), read.original_offset), (1, "orders", 42));
//! assert_eq!(read.due_at, Some(Timestamp::from_millis(1_700_000_005_000)));
//! assert_eq!(read.error, "provider answered 503");
//! ```

use crate::{Error, HeaderProblem, Result, Timestamp, TopicName};

/// The names of Spring Kafka's retry and dead-letter headers.
///
/// ```
/// use retry_core::spring::header_names;
///
/// assert_eq!(header_names::ATTEMPTS, "retry_topic-attempts");
/// assert!(header_names::ALL.contains(&header_names::EXCEPTION_MESSAGE));
/// ```
pub mod header_names {
    /// The attempt about to run (4-byte big-endian int), appended at every hop.
    pub const ATTEMPTS: &str = "retry_topic-attempts";
    /// When the record is due, in ms (BigInteger bytes), appended at every hop.
    pub const BACKOFF_TIMESTAMP: &str = "retry_topic-backoff-timestamp";
    /// The original record's timestamp, in ms (BigInteger bytes).
    pub const RETRY_ORIGINAL_TIMESTAMP: &str = "retry_topic-original-timestamp";
    /// The original record's topic (UTF-8).
    pub const ORIGINAL_TOPIC: &str = "kafka_original-topic";
    /// The original record's partition (4-byte big-endian int).
    pub const ORIGINAL_PARTITION: &str = "kafka_original-partition";
    /// The original record's offset (8-byte big-endian long).
    pub const ORIGINAL_OFFSET: &str = "kafka_original-offset";
    /// The original record's timestamp, in ms (8-byte big-endian long).
    pub const ORIGINAL_TIMESTAMP: &str = "kafka_original-timestamp";
    /// The original record's timestamp type (`CreateTime`, `LogAppendTime`).
    pub const ORIGINAL_TIMESTAMP_TYPE: &str = "kafka_original-timestamp-type";
    /// The consumer group that failed it (UTF-8; written under this name in
    /// both styles).
    pub const ORIGINAL_CONSUMER_GROUP: &str = "kafka_dlt-original-consumer-group";
    /// The failure's class (UTF-8), usually Spring's wrapper.
    pub const EXCEPTION_FQCN: &str = "kafka_exception-fqcn";
    /// The class of the failure's root cause (UTF-8).
    pub const EXCEPTION_CAUSE_FQCN: &str = "kafka_exception-cause-fqcn";
    /// The failure's message (UTF-8).
    pub const EXCEPTION_MESSAGE: &str = "kafka_exception-message";
    /// The failure's stack trace (UTF-8).
    pub const EXCEPTION_STACKTRACE: &str = "kafka_exception-stacktrace";
    /// The prefix of the same headers as a plain dead-letter recoverer
    /// (without retry topics) names them: `kafka_dlt-original-topic`, ...
    pub const DLT_PREFIX: &str = "kafka_dlt-";

    /// Every name above (the `kafka_dlt-` variants excepted).
    pub const ALL: [&str; 13] = [
        ATTEMPTS,
        BACKOFF_TIMESTAMP,
        RETRY_ORIGINAL_TIMESTAMP,
        ORIGINAL_TOPIC,
        ORIGINAL_PARTITION,
        ORIGINAL_OFFSET,
        ORIGINAL_TIMESTAMP,
        ORIGINAL_TIMESTAMP_TYPE,
        ORIGINAL_CONSUMER_GROUP,
        EXCEPTION_FQCN,
        EXCEPTION_CAUSE_FQCN,
        EXCEPTION_MESSAGE,
        EXCEPTION_STACKTRACE,
    ];

    /// Whether `name` is one of Spring's retry or dead-letter headers.
    ///
    /// ```
    /// use retry_core::spring::header_names::is_spring_header;
    ///
    /// assert!(is_spring_header("retry_topic-attempts"));
    /// assert!(is_spring_header("kafka_dlt-exception-message"));
    /// assert!(!is_spring_header("traceparent"));
    /// ```
    pub fn is_spring_header(name: &str) -> bool {
        ALL.contains(&name) || name.starts_with(DLT_PREFIX)
    }
}

use header_names as names;

/// Whether the headers `get` looks up carry Spring's retry or dead-letter
/// headers (the original topic, under either of its names, or an attempt
/// count).
///
/// ```
/// use retry_core::{spring, Headers};
///
/// let mut headers = Headers::new();
/// assert!(!spring::carries_spring_headers(|n| headers.get(n)));
/// headers.insert("kafka_dlt-original-topic", "orders");
/// assert!(spring::carries_spring_headers(|n| headers.get(n)));
/// ```
pub fn carries_spring_headers<'a>(get: impl Fn(&str) -> Option<&'a [u8]>) -> bool {
    [names::ATTEMPTS, names::ORIGINAL_TOPIC, "kafka_dlt-original-topic"].iter().any(|n| get(n).is_some())
}

/// What Spring's headers say about a record; [`RetryHeaders::decode`](crate::RetryHeaders::decode)
/// turns it into ours.
///
/// ```
/// use retry_core::{spring::SpringHeaders, Headers, Timestamp};
///
/// let mut headers = Headers::new();
/// headers.insert("kafka_original-topic", "orders");
/// headers.insert("kafka_original-offset", 7i64.to_be_bytes());
/// headers.insert("retry_topic-attempts", 3i32.to_be_bytes());
/// headers.insert("retry_topic-backoff-timestamp", &5_000i64.to_be_bytes()[6..]);
/// let read = SpringHeaders::decode(|n| headers.get(n)).unwrap();
/// assert_eq!((read.next_attempt, read.due_at), (3, Some(Timestamp::from_millis(5_000))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpringHeaders {
    /// The attempt about to run (2 on the first retry topic); 2 when none
    /// was written (the first failure went straight to the dead-letter topic).
    pub next_attempt: u32,
    /// The original record's topic.
    pub original_topic: TopicName,
    /// The original record's partition (0 when absent).
    pub original_partition: i32,
    /// The original record's offset.
    pub original_offset: i64,
    /// The original record's timestamp, if known.
    pub original_timestamp: Option<Timestamp>,
    /// The last due time written, if any.
    pub due_at: Option<Timestamp>,
    /// The failure's message (empty when absent).
    pub exception_message: String,
    /// The class of the failure's root cause, if written.
    pub exception_cause: Option<String>,
}

impl SpringHeaders {
    /// Reads Spring's headers from the last value of each name `get` finds.
    /// Total: a missing or malformed header Spring always writes gives
    /// [`Error::CorruptHeader`] naming it, never a panic; the others may be
    /// absent.
    ///
    /// ```
    /// use retry_core::{spring::SpringHeaders, Headers};
    ///
    /// let mut headers = Headers::new();
    /// headers.insert("kafka_original-topic", "orders");
    /// headers.insert("kafka_original-offset", 7i64.to_be_bytes());
    /// let read = SpringHeaders::decode(|n| headers.get(n)).unwrap();
    /// assert_eq!((read.original_topic.as_str(), read.original_offset, read.next_attempt), ("orders", 7, 2));
    /// ```
    pub fn decode<'a>(get: impl Fn(&str) -> Option<&'a [u8]>) -> Result<SpringHeaders> {
        // Spring's retry-topic names first, a plain recoverer's second.
        let pick = |name: &'static str| -> (&'static str, Option<&'a [u8]>) {
            match get(name) {
                Some(value) => (name, Some(value)),
                None => match dlt_name(name).and_then(|dlt| Some((dlt, get(dlt)?))) {
                    Some((dlt, value)) => (dlt, Some(value)),
                    None => (name, None),
                },
            }
        };
        let missing = |header| Error::CorruptHeader { header, problem: HeaderProblem::Missing };
        let (name, topic) = pick(names::ORIGINAL_TOPIC);
        let topic = utf8(name, topic.ok_or(missing(name))?)?;
        let original_topic = TopicName::new(topic).map_err(|_| Error::CorruptHeader {
            header: name,
            problem: HeaderProblem::UnknownValue(topic.to_owned()),
        })?;
        let (name, partition) = pick(names::ORIGINAL_PARTITION);
        let original_partition = fixed::<4>(name, partition)?.map(i32::from_be_bytes).unwrap_or(0);
        let (name, offset) = pick(names::ORIGINAL_OFFSET);
        let original_offset = fixed::<8>(name, offset)?.map(i64::from_be_bytes).ok_or(missing(name))?;
        let (name, timestamp) = pick(names::ORIGINAL_TIMESTAMP);
        let original_timestamp = match fixed::<8>(name, timestamp)?.map(i64::from_be_bytes) {
            Some(ms) => Some(ms),
            None => get(names::RETRY_ORIGINAL_TIMESTAMP)
                .map(|v| big_integer(names::RETRY_ORIGINAL_TIMESTAMP, v))
                .transpose()?,
        }
        .filter(|ms| *ms >= 0)
        .map(Timestamp::from_millis);
        let next_attempt = get(names::ATTEMPTS).map(attempts).transpose()?.unwrap_or(2);
        if next_attempt < 2 {
            return Err(Error::CorruptHeader {
                header: names::ATTEMPTS,
                problem: HeaderProblem::UnknownValue(next_attempt.to_string()),
            });
        }
        let due_at = get(names::BACKOFF_TIMESTAMP)
            .map(|v| big_integer(names::BACKOFF_TIMESTAMP, v))
            .transpose()?
            .map(Timestamp::from_millis);
        let (name, message) = pick(names::EXCEPTION_MESSAGE);
        let exception_message = message.map(|m| utf8(name, m)).transpose()?.unwrap_or("").to_owned();
        let (name, cause) = pick(names::EXCEPTION_CAUSE_FQCN);
        let exception_cause = cause.map(|c| utf8(name, c)).transpose()?.filter(|c| !c.is_empty()).map(str::to_owned);
        Ok(SpringHeaders {
            next_attempt,
            original_topic,
            original_partition,
            original_offset,
            original_timestamp,
            due_at,
            exception_message,
            exception_cause,
        })
    }
}

/// How one of Spring's headers is written on a hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    /// Only where absent: the original record's, kept from the first hop.
    Once,
    /// After any earlier value: Spring keeps every hop's.
    Append,
    /// Instead of any earlier value.
    Replace,
}

impl SpringHeaders {
    /// These headers as Spring writes them on a hop to a retry topic
    /// (`due_at` set) or its dead-letter topic, with `exception_class` as
    /// the failure's class; `Write` says how each joins the record's
    /// earlier headers.
    pub(crate) fn encode(&self, exception_class: &str) -> Vec<(&'static str, Write, Vec<u8>)> {
        let mut out = vec![
            (names::ORIGINAL_TOPIC, Write::Once, self.original_topic.as_str().as_bytes().to_vec()),
            (names::ORIGINAL_PARTITION, Write::Once, self.original_partition.to_be_bytes().to_vec()),
            (names::ORIGINAL_OFFSET, Write::Once, self.original_offset.to_be_bytes().to_vec()),
        ];
        if let Some(t) = self.original_timestamp {
            out.push((names::ORIGINAL_TIMESTAMP, Write::Once, t.as_millis().to_be_bytes().to_vec()));
            out.push((names::ORIGINAL_TIMESTAMP_TYPE, Write::Once, b"CreateTime".to_vec()));
        }
        out.push((names::EXCEPTION_FQCN, Write::Replace, exception_class.as_bytes().to_vec()));
        out.push((names::EXCEPTION_CAUSE_FQCN, Write::Replace, exception_class.as_bytes().to_vec()));
        out.push((names::EXCEPTION_MESSAGE, Write::Replace, self.exception_message.as_bytes().to_vec()));
        out.push((names::ATTEMPTS, Write::Append, (self.next_attempt as i32).to_be_bytes().to_vec()));
        if let Some(due) = self.due_at {
            out.push((names::BACKOFF_TIMESTAMP, Write::Append, big_integer_bytes(due.as_millis())));
        }
        if let Some(t) = self.original_timestamp {
            out.push((names::RETRY_ORIGINAL_TIMESTAMP, Write::Append, big_integer_bytes(t.as_millis())));
        }
        out
    }
}

/// A long as Java's `BigInteger.toByteArray` writes it: big-endian two's
/// complement in as few bytes as keep its sign.
fn big_integer_bytes(n: i64) -> Vec<u8> {
    let all = n.to_be_bytes();
    let mut start = 0;
    // A leading byte may go when it only repeats the sign of the next one.
    while start < 7
        && ((all[start] == 0 && all[start + 1] & 0x80 == 0) || (all[start] == 0xff && all[start + 1] & 0x80 != 0))
    {
        start += 1;
    }
    all[start..].to_vec()
}

/// The name a plain dead-letter recoverer gives the same header.
fn dlt_name(name: &'static str) -> Option<&'static str> {
    Some(match name {
        names::ORIGINAL_TOPIC => "kafka_dlt-original-topic",
        names::ORIGINAL_PARTITION => "kafka_dlt-original-partition",
        names::ORIGINAL_OFFSET => "kafka_dlt-original-offset",
        names::ORIGINAL_TIMESTAMP => "kafka_dlt-original-timestamp",
        names::EXCEPTION_MESSAGE => "kafka_dlt-exception-message",
        names::EXCEPTION_CAUSE_FQCN => "kafka_dlt-exception-cause-fqcn",
        _ => return None,
    })
}

fn utf8<'a>(header: &'static str, value: &'a [u8]) -> Result<&'a str> {
    std::str::from_utf8(value).map_err(|_| Error::CorruptHeader { header, problem: HeaderProblem::NotUtf8 })
}

/// A value of exactly `N` bytes, if present.
fn fixed<const N: usize>(header: &'static str, value: Option<&[u8]>) -> Result<Option<[u8; N]>> {
    value
        .map(|v| {
            v.try_into().map_err(|_| Error::CorruptHeader {
                header,
                problem: HeaderProblem::Length { expected: N, found: v.len() },
            })
        })
        .transpose()
}

/// `retry_topic-attempts`: a 4-byte big-endian int, or one byte (older
/// versions), as Spring reads it.
fn attempts(value: &[u8]) -> Result<u32> {
    let n = match value {
        [one] => i32::from(*one),
        _ => i32::from_be_bytes(value.try_into().map_err(|_| Error::CorruptHeader {
            header: names::ATTEMPTS,
            problem: HeaderProblem::Length { expected: 4, found: value.len() },
        })?),
    };
    u32::try_from(n)
        .map_err(|_| Error::CorruptHeader { header: names::ATTEMPTS, problem: HeaderProblem::Negative(n.to_string()) })
}

/// A long as Java's `BigInteger.toByteArray` writes it: big-endian two's
/// complement in 1 to 8 bytes.
fn big_integer(header: &'static str, value: &[u8]) -> Result<i64> {
    if !(1..=8).contains(&value.len()) {
        return Err(Error::CorruptHeader {
            header,
            problem: HeaderProblem::Length { expected: 8, found: value.len() },
        });
    }
    let fill = if value[0] & 0x80 != 0 { 0xff } else { 0 };
    let mut all = [fill; 8];
    all[8 - value.len()..].copy_from_slice(value);
    Ok(i64::from_be_bytes(all))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(h: &[(String, Vec<u8>)]) -> Result<SpringHeaders> {
        SpringHeaders::decode(|n| h.iter().rev().find(|(k, _)| k == n).map(|(_, v)| v.as_slice()))
    }

    /// Headers as the Spring peer wrote them on its second retry topic.
    fn second_hop() -> Vec<(String, Vec<u8>)> {
        let mut h = Vec::new();
        let mut add = |name: &str, value: &[u8]| h.push((name.to_owned(), value.to_vec()));
        add(names::ORIGINAL_TOPIC, b"orders");
        add(names::ORIGINAL_PARTITION, &[0, 0, 0, 1]);
        add(names::ORIGINAL_OFFSET, &[0, 0, 0, 0, 0, 0, 0, 7]);
        add(names::ORIGINAL_TIMESTAMP, &1_700_000_000_000i64.to_be_bytes());
        add(names::ORIGINAL_TIMESTAMP_TYPE, b"CreateTime");
        add(names::EXCEPTION_FQCN, b"org.springframework.kafka.listener.ListenerExecutionFailedException");
        add(names::EXCEPTION_CAUSE_FQCN, b"billing.peer.TransientFailure");
        add(names::EXCEPTION_MESSAGE, b"Listener failed; the provider answered 503");
        // Appended at each hop: attempts 2 then 3, due times as BigInteger bytes.
        add(names::ATTEMPTS, &2i32.to_be_bytes());
        add(names::BACKOFF_TIMESTAMP, &1_700_000_001_000i64.to_be_bytes()[2..]);
        add(names::RETRY_ORIGINAL_TIMESTAMP, &1_700_000_000_000i64.to_be_bytes()[2..]);
        add(names::ATTEMPTS, &3i32.to_be_bytes());
        add(names::BACKOFF_TIMESTAMP, &1_700_000_003_000i64.to_be_bytes()[2..]);
        add(names::RETRY_ORIGINAL_TIMESTAMP, &1_700_000_000_000i64.to_be_bytes()[2..]);
        h
    }

    fn set(h: &mut Vec<(String, Vec<u8>)>, name: &str, value: &[u8]) {
        h.retain(|(k, _)| k != name);
        h.push((name.to_owned(), value.to_vec()));
    }

    #[test]
    fn the_last_hop_counts() {
        let read = decode(&second_hop()).unwrap();
        assert_eq!(read.next_attempt, 3);
        assert_eq!((read.original_topic.as_str(), read.original_partition, read.original_offset), ("orders", 1, 7));
        assert_eq!(read.original_timestamp, Some(Timestamp::from_millis(1_700_000_000_000)));
        assert_eq!(read.due_at, Some(Timestamp::from_millis(1_700_000_003_000)));
        assert_eq!(read.exception_message, "Listener failed; the provider answered 503");
        assert_eq!(read.exception_cause.as_deref(), Some("billing.peer.TransientFailure"));
    }

    #[test]
    fn big_integers_of_every_length() {
        let cases: &[(&[u8], i64)] = &[
            (&[0x01], 1),
            (&[0x7f], 127),
            (&[0x00, 0x80], 128),
            (&[0xff], -1),
            (&[0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00], 1_700_000_000_000),
            (&[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], i64::MAX),
        ];
        for (bytes, expected) in cases {
            assert_eq!(big_integer("h", bytes).unwrap(), *expected, "{bytes:?}");
        }
        for bad in [&[][..], &[0; 9][..]] {
            assert!(matches!(
                big_integer("h", bad),
                Err(Error::CorruptHeader { problem: HeaderProblem::Length { .. }, .. })
            ));
        }
    }

    proptest::proptest! {
        #[test]
        fn big_integers_round_trip(n in proptest::prelude::any::<i64>()) {
            let bytes = big_integer_bytes(n);
            proptest::prop_assert!(!bytes.is_empty() && bytes.len() <= 8);
            proptest::prop_assert_eq!(big_integer("h", &bytes).unwrap(), n);
        }
    }

    #[test]
    fn big_integers_are_written_as_java_writes_them() {
        let cases: &[(i64, &[u8])] = &[
            (0, &[0]),
            (1, &[1]),
            (127, &[0x7f]),
            (128, &[0x00, 0x80]),
            (-1, &[0xff]),
            (-129, &[0xff, 0x7f]),
            (1_700_000_000_000, &[0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00]),
            (i64::MIN, &[0x80, 0, 0, 0, 0, 0, 0, 0]),
        ];
        for (n, bytes) in cases {
            assert_eq!(big_integer_bytes(*n), *bytes, "{n}");
            assert_eq!(big_integer("h", bytes).unwrap(), *n);
        }
    }

    #[test]
    fn what_is_missing_or_malformed_is_named() {
        type Edit = fn(&mut Vec<(String, Vec<u8>)>);
        let cases: &[(&str, Edit, &str, HeaderProblem)] = &[
            (
                "no topic",
                |h| h.retain(|(k, _)| k != names::ORIGINAL_TOPIC),
                names::ORIGINAL_TOPIC,
                HeaderProblem::Missing,
            ),
            (
                "no offset",
                |h| h.retain(|(k, _)| k != names::ORIGINAL_OFFSET),
                names::ORIGINAL_OFFSET,
                HeaderProblem::Missing,
            ),
            (
                "a 2-byte partition",
                |h| set(h, names::ORIGINAL_PARTITION, &[0, 1]),
                names::ORIGINAL_PARTITION,
                HeaderProblem::Length { expected: 4, found: 2 },
            ),
            (
                "a 3-byte attempt count",
                |h| set(h, names::ATTEMPTS, &[0, 0, 3]),
                names::ATTEMPTS,
                HeaderProblem::Length { expected: 4, found: 3 },
            ),
            (
                "a negative attempt count",
                |h| set(h, names::ATTEMPTS, &(-2i32).to_be_bytes()),
                names::ATTEMPTS,
                HeaderProblem::Negative("-2".into()),
            ),
            (
                "attempt 1 on a retry",
                |h| set(h, names::ATTEMPTS, &1i32.to_be_bytes()),
                names::ATTEMPTS,
                HeaderProblem::UnknownValue("1".into()),
            ),
            (
                "a due time of nine bytes",
                |h| set(h, names::BACKOFF_TIMESTAMP, &[1; 9]),
                names::BACKOFF_TIMESTAMP,
                HeaderProblem::Length { expected: 8, found: 9 },
            ),
            (
                "a topic not UTF-8",
                |h| set(h, names::ORIGINAL_TOPIC, &[0xff]),
                names::ORIGINAL_TOPIC,
                HeaderProblem::NotUtf8,
            ),
        ];
        for (what, edit, header, problem) in cases {
            let mut h = second_hop();
            edit(&mut h);
            assert_eq!(decode(&h), Err(Error::CorruptHeader { header, problem: problem.clone() }), "{what}");
        }
    }

    #[test]
    fn a_plain_recoverers_names_and_old_versions_are_read() {
        let mut h = Vec::new();
        set(&mut h, "kafka_dlt-original-topic", b"orders");
        set(&mut h, "kafka_dlt-original-partition", &3i32.to_be_bytes());
        set(&mut h, "kafka_dlt-original-offset", &9i64.to_be_bytes());
        set(&mut h, "kafka_dlt-exception-message", b"bad payload");
        let read = decode(&h).unwrap();
        assert_eq!((read.next_attempt, read.original_partition, read.original_offset), (2, 3, 9));
        assert_eq!((read.exception_message.as_str(), read.due_at), ("bad payload", None));
        // One byte: how older versions counted.
        set(&mut h, names::ATTEMPTS, &[3]);
        assert_eq!(decode(&h).unwrap().next_attempt, 3);
    }
}
