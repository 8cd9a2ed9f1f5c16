//! The consumer groups of a ladder, derived from one group id.

use crate::{Error, Result, RetryTopology, Stage};

/// The longest group id accepted: room for the longest derived suffix
/// within what brokers and their logs handle comfortably.
pub const MAX_GROUP_ID_BYTES: usize = 200;

/// The consumer groups of one listener, all derived from its group id:
/// each consumed topic gets a group of its own (the group id with the
/// suffix the rung's topic has after its source's name), so that a rung's backlog
/// never holds back the source's commits, and the operators' position on the
/// dead-letter topic is a group that nothing consumes.
///
/// ```
/// use retry_core::{groups::LadderGroups, RetryTopology, Stage};
///
/// let topology = RetryTopology::new("orders.confirmed", &"5s,30s".parse().unwrap()).unwrap();
/// let groups = LadderGroups::new("billing", &topology).unwrap();
/// let consumed: Vec<(&str, &str)> = groups.consumed(&topology).map(|c| (c.topic, c.group)).collect();
/// assert_eq!(consumed, [
///     ("orders.confirmed", "billing"),
///     ("orders.confirmed.retry-5s", "billing.retry-5s"),
///     ("orders.confirmed.retry-30s", "billing.retry-30s"),
/// ]);
/// assert_eq!(groups.of(Stage::SOURCE), Some("billing"));
/// // A stage of a longer ladder has no group here.
/// let longer = RetryTopology::new("orders.confirmed", &"5s,30s,5m".parse().unwrap()).unwrap();
/// let far = LadderGroups::new("billing", &longer).unwrap().consumed(&longer).last().unwrap().stage;
/// assert_eq!(groups.of(far), None);
/// assert_eq!(groups.operators(), "billing.dlq-operators");
/// assert_eq!(groups.replay_lock(), "billing.dlq-operators.replay-lock");
/// assert_eq!(groups.pause(), "billing.dlq-operators.pause");
/// // A ladder named as Spring's @RetryableTopic names it has the groups
/// // Spring's containers use, so a listener taking over its topics goes on
/// // where Spring stood.
/// let spring = RetryTopology::spring("orders", &"1s,2s".parse().unwrap()).unwrap();
/// let groups = LadderGroups::new("billing", &spring).unwrap();
/// let consumed: Vec<&str> = groups.consumed(&spring).map(|c| c.group).collect();
/// assert_eq!(consumed, ["billing", "billing-retry-1000", "billing-retry-2000"]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LadderGroups {
    source: String,
    rungs: Vec<String>,
    operators: String,
    replay_lock: String,
    pause: String,
}

/// A topic a listener consumes, with its stage and its group (see
/// [`LadderGroups::consumed`]).
///
/// ```
/// use retry_core::{groups::LadderGroups, RetryTopology};
///
/// let topology = RetryTopology::new("orders", &"5s".parse().unwrap()).unwrap();
/// let groups = LadderGroups::new("billing", &topology).unwrap();
/// let rung = groups.consumed(&topology).nth(1).unwrap();
/// assert_eq!((rung.stage.rung(), rung.topic, rung.group), (Some(0), "orders.retry-5s", "billing.retry-5s"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumedTopic<'a> {
    /// Where on the ladder it is.
    pub stage: Stage,
    /// The topic.
    pub topic: &'a str,
    /// The group that consumes it.
    pub group: &'a str,
}

impl LadderGroups {
    /// Derives every group of `topology`'s ladder from `group_id`; fails when
    /// `group_id` is empty, longer than [`MAX_GROUP_ID_BYTES`], or holds
    /// whitespace or control characters (which make broker logs ambiguous).
    pub fn new(group_id: &str, topology: &RetryTopology) -> Result<Self> {
        let invalid = |reason| Err(Error::InvalidGroupId { group_id: group_id.chars().take(64).collect(), reason });
        if group_id.is_empty() {
            return invalid("a group id cannot be empty");
        }
        if group_id.len() > MAX_GROUP_ID_BYTES {
            return invalid("a group id has at most 200 bytes");
        }
        if group_id.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return invalid("a group id cannot hold whitespace or control characters");
        }
        // A retry topic's name is its source's and a suffix; its group the
        // group id and the same suffix.
        let source = topology.source_topic().as_str();
        let rungs = topology
            .retry_topics()
            .map(|(_, topic)| {
                let suffix =
                    topic.as_str().strip_prefix(source).expect("a retry topic's name begins with its source's");
                format!("{group_id}{suffix}")
            })
            .collect();
        let operators = format!("{group_id}.dlq-operators");
        let replay_lock = format!("{operators}.replay-lock");
        let pause = format!("{operators}.pause");
        Ok(LadderGroups { source: group_id.to_owned(), rungs, operators, replay_lock, pause })
    }

    /// The group that consumes the topic of `stage`; `None` for a rung
    /// this ladder does not have (a stage of another ladder).
    pub fn of(&self, stage: Stage) -> Option<&str> {
        match stage.rung() {
            None => Some(&self.source),
            Some(rung) => self.rungs.get(rung).map(String::as_str),
        }
    }

    /// Each consumed topic of `topology` (the one these groups were derived
    /// from) with its stage and group: the source first, then each rung.
    pub fn consumed<'a>(&'a self, topology: &'a RetryTopology) -> impl Iterator<Item = ConsumedTopic<'a>> {
        let source = ConsumedTopic {
            stage: Stage::SOURCE,
            topic: topology.source_topic().as_str(),
            group: self.source.as_str(),
        };
        let rungs = topology.retry_topics().zip(&self.rungs).enumerate().map(|(i, ((_, topic), group))| {
            ConsumedTopic { stage: Stage::rung_at(i), topic: topic.as_str(), group: group.as_str() }
        });
        std::iter::once(source).chain(rungs)
    }

    /// The operators' group: its committed offsets on the dead-letter topic
    /// mark what operators replayed or acknowledged. Nothing consumes it.
    pub fn operators(&self) -> &str {
        &self.operators
    }

    /// The group whose single member holds the replay lock: a replay runs
    /// only while its instance leads this group, whatever the instance count.
    pub fn replay_lock(&self) -> &str {
        &self.replay_lock
    }

    /// The group whose committed offset on the source topic's partition 0
    /// is the operators' pause of the listener (see [`crate::pause`]).
    /// Nothing consumes it.
    pub fn pause(&self) -> &str {
        &self.pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(group_id: &str, expected: Result<&str, &str>) {
        let topology = RetryTopology::new("orders", &"1s".parse().unwrap()).unwrap();
        let actual = LadderGroups::new(group_id, &topology).map(|g| g.of(Stage::rung_at(0)).unwrap().to_owned());
        let actual = actual.as_deref().map_err(|e| match e {
            Error::InvalidGroupId { reason, .. } => *reason,
            other => panic!("unexpected {other}"),
        });
        assert_eq!(actual, expected, "{group_id:?}");
    }

    #[test]
    fn group_ids() {
        check("billing", Ok("billing.retry-1s"));
        check("team/billing:v2", Ok("team/billing:v2.retry-1s"));
        check(&"g".repeat(200), Ok(&format!("{}.retry-1s", "g".repeat(200))));
        check("", Err("a group id cannot be empty"));
        check(&"g".repeat(201), Err("a group id has at most 200 bytes"));
        check("bill ing", Err("a group id cannot hold whitespace or control characters"));
        check("billing\n", Err("a group id cannot hold whitespace or control characters"));
    }
}
