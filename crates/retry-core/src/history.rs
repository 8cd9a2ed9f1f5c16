//! When each attempt at a record was due and when it failed, carried from
//! hop to hop in one header, `x-retry-history`, so that a dead letter tells
//! its whole story: `-/1000,6000/6012,36012/36020` is a first attempt that
//! failed at 1000 ms (it was due when produced), a second due at 6000 that
//! failed at 6012, a third due at 36012 that failed at 36020.
//!
//! The header is ours (see [`crate::header_names::ALL`]): a replay starts a
//! new history. Reading it is total: a header that does not parse reads as
//! no history, and never fails a record.
//!
//! ```
//! use retry_core::{history::{self, AttemptTimes}, Headers, Timestamp};
//!
//! let mut headers = Headers::new();
//! headers.insert("x-retry-history", "-/1000,6000/6012");
//! let read = history::read(&headers);
//! assert_eq!(read[1], AttemptTimes { due_at: Some(Timestamp::from_millis(6000)), failed_at: Timestamp::from_millis(6012) });
//! headers.insert("x-retry-history", "garbage");
//! assert!(history::read(&headers).is_empty());
//! ```

use crate::{header_names::HISTORY, Headers, Timestamp};

/// The most attempts the header keeps: the latest ones (a ladder has at
/// most [`crate::MAX_RUNGS`] rungs, so this is every attempt of one pass).
pub const MAX_ATTEMPTS_KEPT: usize = crate::MAX_RUNGS + 1;

/// One failed attempt.
///
/// ```
/// use retry_core::{history::AttemptTimes, Timestamp};
///
/// let first = AttemptTimes { due_at: None, failed_at: Timestamp::from_millis(1_000) };
/// assert_eq!(first.due_at, None); // a first attempt is due when its record is produced
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptTimes {
    /// When it was due: `None` for an attempt at the source topic (due
    /// when the record was produced).
    pub due_at: Option<Timestamp>,
    /// When it failed (the decision's `now`).
    pub failed_at: Timestamp,
}

/// The attempts `headers` record, oldest first; none when the header is
/// absent or does not parse.
///
/// ```
/// use retry_core::{history, Headers};
///
/// let mut headers = Headers::new();
/// assert!(history::read(&headers).is_empty());
/// headers.insert("x-retry-history", "-/1000");
/// assert_eq!(history::read(&headers)[0].failed_at.as_millis(), 1000);
/// ```
pub fn read(headers: &Headers) -> Vec<AttemptTimes> {
    let Some(value) = headers.get(HISTORY).and_then(|v| std::str::from_utf8(v).ok()) else {
        return Vec::new();
    };
    let parse = |entry: &str| {
        let (due, failed) = entry.split_once('/')?;
        let due_at = match due {
            "-" => None,
            due => Some(Timestamp::from_millis(due.parse().ok()?)),
        };
        Some(AttemptTimes { due_at, failed_at: Timestamp::from_millis(failed.parse().ok()?) })
    };
    value.split(',').map(parse).collect::<Option<Vec<_>>>().unwrap_or_default()
}

/// Writes into `out` the history of `consumed` (the record that was
/// handled) with `attempt` after it, keeping the latest
/// [`MAX_ATTEMPTS_KEPT`].
pub(crate) fn append(out: &mut Headers, consumed: &Headers, attempt: AttemptTimes) {
    let mut attempts = read(consumed);
    attempts.push(attempt);
    let skip = attempts.len().saturating_sub(MAX_ATTEMPTS_KEPT);
    let value = attempts[skip..]
        .iter()
        .map(|a| {
            let due = a.due_at.map_or_else(|| "-".to_owned(), |d| d.as_millis().to_string());
            format!("{due}/{}", a.failed_at.as_millis())
        })
        .collect::<Vec<_>>()
        .join(",");
    out.insert(HISTORY, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(consumed: Option<&str>, attempt: (Option<i64>, i64), expected: &str) {
        let mut headers = Headers::new();
        if let Some(history) = consumed {
            headers.insert(HISTORY, history);
        }
        let attempt = AttemptTimes {
            due_at: attempt.0.map(Timestamp::from_millis),
            failed_at: Timestamp::from_millis(attempt.1),
        };
        let mut out = headers.clone();
        append(&mut out, &headers, attempt);
        assert_eq!(out.get(HISTORY), Some(expected.as_bytes()), "{consumed:?} + {attempt:?}");
        assert_eq!(out.iter().filter(|(n, _)| *n == HISTORY).count(), 1);
    }

    #[test]
    fn each_attempt_is_appended() {
        check(None, (None, 1000), "-/1000");
        check(Some("-/1000"), (Some(6000), 6012), "-/1000,6000/6012");
        // A history that does not parse starts again.
        check(Some("-/1000,x"), (Some(6000), 6012), "6000/6012");
        check(Some(""), (Some(6000), 6012), "6000/6012");
        // The latest attempts are kept.
        let long = (0..MAX_ATTEMPTS_KEPT as i64).map(|i| format!("{i}/{i}")).collect::<Vec<_>>().join(",");
        let kept = (1..MAX_ATTEMPTS_KEPT as i64).map(|i| format!("{i}/{i}")).chain(["99/100".to_owned()]);
        check(Some(&long), (Some(99), 100), &kept.collect::<Vec<_>>().join(","));
    }

    #[test]
    fn a_dead_letter_tells_when_each_attempt_was_due_and_failed() {
        use crate::{Decision, HandlerError, RecordMeta, RetryPolicy, RetryTopology, Stage};
        let policy =
            RetryPolicy::new(RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap(), Default::default());
        let failed = Err(HandlerError::transient("503"));
        let none = Headers::new();
        let source = RecordMeta { topic: "orders", partition: 0, offset: 7, timestamp: None, headers: &none };
        let Decision::Retry { headers, .. } =
            policy.decide(Stage::SOURCE, &source, &failed, Timestamp::from_millis(1_000))
        else {
            panic!("retried")
        };
        let rung = RecordMeta { topic: "orders.retry-5s", partition: 0, offset: 0, timestamp: None, headers: &headers };
        let late = Timestamp::from_millis(6_010);
        let Decision::DeadLetter { headers, .. } = policy.decide(Stage::rung_at(0), &rung, &failed, late) else {
            panic!("dead-lettered")
        };
        let at = Timestamp::from_millis;
        assert_eq!(
            read(&headers),
            [
                AttemptTimes { due_at: None, failed_at: at(1_000) },
                AttemptTimes { due_at: Some(at(6_000)), failed_at: at(6_010) }
            ]
        );
    }

    proptest::proptest! {
        #[test]
        fn what_is_written_reads_back(attempts in proptest::collection::vec((proptest::option::of(0i64..i64::MAX), 0i64..i64::MAX), 1..20)) {
            let mut headers = Headers::new();
            for (due, failed) in &attempts {
                let before = headers.clone();
                append(&mut headers, &before, AttemptTimes { due_at: due.map(Timestamp::from_millis), failed_at: Timestamp::from_millis(*failed) });
            }
            let read = read(&headers);
            let expected: Vec<AttemptTimes> = attempts
                .iter()
                .map(|(due, failed)| AttemptTimes { due_at: due.map(Timestamp::from_millis), failed_at: Timestamp::from_millis(*failed) })
                .collect();
            proptest::prop_assert_eq!(&read[..], &expected[expected.len().saturating_sub(MAX_ATTEMPTS_KEPT)..]);
        }

        #[test]
        fn any_value_reads_without_panic(value in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let mut headers = Headers::new();
            headers.insert(HISTORY, value);
            let _ = read(&headers);
        }
    }
}
