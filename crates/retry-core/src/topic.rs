use std::fmt;

use crate::{Error, Result, RetrySchedule, Rung};

/// Kafka's limit on a topic name's length.
pub const MAX_TOPIC_NAME_BYTES: usize = 249;

/// A topic name that obeys Kafka's rules: 1 to 249 characters from
/// `[a-zA-Z0-9._-]`, and neither `.` nor `..`.
///
/// ```
/// use retry_core::TopicName;
///
/// let topic = TopicName::new("orders.confirmed").unwrap();
/// assert_eq!(topic.as_str(), "orders.confirmed");
/// assert!(TopicName::new("orders confirmed").is_err());
/// assert!(TopicName::new("x".repeat(250)).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicName(String);

impl TopicName {
    /// Validates `name` against Kafka's rules.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let reason = if name.is_empty() {
            Some("a topic name cannot be empty")
        } else if name == "." || name == ".." {
            Some("a topic name cannot be \".\" or \"..\"")
        } else if name.len() > MAX_TOPIC_NAME_BYTES {
            Some("a topic name has at most 249 characters")
        } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
            Some("a topic name may only contain ASCII letters, digits, '.', '_' and '-'")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Error::InvalidTopicName { name, reason }),
            None => Ok(TopicName(name)),
        }
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for TopicName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The topics of one listener's ladder: the source topic, one retry topic per
/// rung (`<source>.retry-<label>`) and the dead-letter topic (`<source>.dlq`).
///
/// ```
/// use retry_core::{RetrySchedule, RetryTopology};
/// let t = RetryTopology::new("orders.confirmed", &"5s,30s,5m".parse().unwrap()).unwrap();
/// let names: Vec<&str> = t.retry_topics().map(|(_, topic)| topic.as_str()).collect();
/// assert_eq!(names, ["orders.confirmed.retry-5s", "orders.confirmed.retry-30s", "orders.confirmed.retry-5m"]);
/// assert_eq!(t.dead_letter_topic().as_str(), "orders.confirmed.dlq");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryTopology {
    source: TopicName,
    schedule: RetrySchedule,
    retry: Vec<TopicName>,
    dead_letter: TopicName,
}

impl RetryTopology {
    /// Derives every topic name from `source` and `schedule`; fails when the
    /// source or any derived name breaks Kafka's rules (e.g. is too long).
    pub fn new(source: &str, schedule: &RetrySchedule) -> Result<Self> {
        // No collisions are possible: the source is a strict prefix of every
        // derived name, labels are unique, and ".dlq" is no retry suffix.
        Self::named(source, schedule, |rung| format!(".retry-{}", rung.label()), ".dlq")
    }

    /// The ladder of `source` with each rung's topic suffixed by `retry`,
    /// and the dead-letter topic by `dead_letter`.
    fn named(
        source: &str,
        schedule: &RetrySchedule,
        retry: impl Fn(&Rung) -> String,
        dead_letter: &str,
    ) -> Result<Self> {
        let source = TopicName::new(source)?;
        let retry = schedule
            .rungs()
            .iter()
            .map(|rung| TopicName::new(format!("{source}{}", retry(rung))))
            .collect::<Result<Vec<_>>>()?;
        let dead_letter = TopicName::new(format!("{source}{dead_letter}"))?;
        Ok(RetryTopology { source, schedule: schedule.clone(), retry, dead_letter })
    }

    /// The ladder as Spring Kafka's `@RetryableTopic` names it, for a
    /// listener that takes over Spring's topics or shares them: one retry
    /// topic per rung named by its delay in milliseconds
    /// (`<source>-retry-5000`; a schedule's delays all differ, so each rung
    /// has a topic of its own, as Spring gives it) and `<source>-dlt`.
    /// Fails when a name breaks Kafka's rules.
    ///
    /// ```
    /// use retry_core::RetryTopology;
    ///
    /// let t = RetryTopology::spring("orders", &"1s,2s,4s".parse().unwrap()).unwrap();
    /// let names: Vec<&str> = t.all_topics().map(|t| t.as_str()).collect();
    /// assert_eq!(names, ["orders", "orders-retry-1000", "orders-retry-2000", "orders-retry-4000", "orders-dlt"]);
    /// ```
    pub fn spring(source: &str, schedule: &RetrySchedule) -> Result<Self> {
        Self::named(source, schedule, |rung| format!("-retry-{}", rung.delay().as_millis()), "-dlt")
    }

    /// The topic the listener consumes first.
    pub fn source_topic(&self) -> &TopicName {
        &self.source
    }

    /// The schedule the retry topics were derived from.
    pub fn schedule(&self) -> &RetrySchedule {
        &self.schedule
    }

    /// Each rung with its retry topic, first retry first.
    pub fn retry_topics(&self) -> impl ExactSizeIterator<Item = (&Rung, &TopicName)> {
        self.schedule.rungs().iter().zip(&self.retry)
    }

    /// The retry topic of rung `index` (0 is the first retry), if it exists.
    pub fn retry_topic(&self, index: usize) -> Option<&TopicName> {
        self.retry.get(index)
    }

    /// The dead-letter topic.
    pub fn dead_letter_topic(&self) -> &TopicName {
        &self.dead_letter
    }

    /// Every topic of the ladder: source, retry topics in order, dead-letter topic.
    pub fn all_topics(&self) -> impl Iterator<Item = &TopicName> {
        std::iter::once(&self.source).chain(&self.retry).chain([&self.dead_letter])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_name(name: &str, expected: Result<(), &str>) {
        let actual = TopicName::new(name).map(|_| ()).map_err(|e| match e {
            Error::InvalidTopicName { reason, .. } => reason,
            other => panic!("unexpected {other}"),
        });
        assert_eq!(actual, expected, "{name:?}");
    }

    #[test]
    fn topic_names_follow_kafka_rules() {
        check_name("orders.confirmed", Ok(()));
        check_name("a-b_c.D9", Ok(()));
        check_name("...", Ok(()));
        check_name(&"x".repeat(249), Ok(()));
        check_name("", Err("a topic name cannot be empty"));
        check_name(".", Err("a topic name cannot be \".\" or \"..\""));
        check_name("..", Err("a topic name cannot be \".\" or \"..\""));
        check_name(&"x".repeat(250), Err("a topic name has at most 249 characters"));
        for bad in ["orders confirmed", "orders/confirmed", "commandes.confirmées", "a:b", "a\0b"] {
            check_name(bad, Err("a topic name may only contain ASCII letters, digits, '.', '_' and '-'"));
        }
    }

    #[track_caller]
    fn check_topology(source: &str, schedule: &str, expected: Result<&[&str], &str>) {
        let schedule: RetrySchedule = schedule.parse().unwrap();
        let actual = RetryTopology::new(source, &schedule)
            .map(|t| t.all_topics().map(|t| t.to_string()).collect::<Vec<_>>())
            .map_err(|e| e.to_string());
        let expected = expected.map(|v| v.iter().map(|s| s.to_string()).collect::<Vec<_>>()).map_err(str::to_owned);
        assert_eq!(actual, expected);
    }

    #[test]
    fn derives_ladder_names() {
        check_topology(
            "orders.confirmed",
            "5s,30s,5m",
            Ok(&[
                "orders.confirmed",
                "orders.confirmed.retry-5s",
                "orders.confirmed.retry-30s",
                "orders.confirmed.retry-5m",
                "orders.confirmed.dlq",
            ]),
        );
        check_topology("o", "1500ms,1h", Ok(&["o", "o.retry-1500ms", "o.retry-1h", "o.dlq"]));
        check_topology(
            "bad topic",
            "5s",
            Err(
                r#"invalid topic name "bad topic": a topic name may only contain ASCII letters, digits, '.', '_' and '-'"#,
            ),
        );
    }

    #[test]
    fn derived_names_are_checked_for_length() {
        // 240 characters fit alone, but not with ".retry-1500ms" appended.
        let source = "x".repeat(240);
        let err = RetryTopology::new(&source, &"1500ms".parse().unwrap()).unwrap_err();
        assert_eq!(
            err,
            Error::InvalidTopicName {
                name: format!("{source}.retry-1500ms"),
                reason: "a topic name has at most 249 characters"
            }
        );
        // Every name fits at the limit.
        let source = "x".repeat(249 - ".retry-1500ms".len());
        assert!(RetryTopology::new(&source, &"1500ms".parse().unwrap()).is_ok());
    }

    #[test]
    fn retry_topics_pair_rungs_with_names() {
        let t = RetryTopology::new("o", &"5s,30s".parse().unwrap()).unwrap();
        let pairs: Vec<(String, String)> =
            t.retry_topics().map(|(r, n)| (r.label().to_owned(), n.to_string())).collect();
        assert_eq!(pairs, [("5s".to_owned(), "o.retry-5s".to_owned()), ("30s".to_owned(), "o.retry-30s".to_owned())]);
        assert_eq!(t.retry_topic(1).unwrap().as_str(), "o.retry-30s");
        assert_eq!(t.retry_topic(2), None);
        assert_eq!(t.source_topic().as_str(), "o");
    }
}
