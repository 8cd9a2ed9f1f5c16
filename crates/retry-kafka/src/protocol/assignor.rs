//! The consumer protocol's wire formats (subscription and assignment, as
//! every Kafka client encodes them) and the range assignor the group leader
//! runs. Pure: unit-tested without a broker.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::{
    messages::{
        consumer_protocol_assignment::{ConsumerProtocolAssignment, TopicPartition as AssignedPartitions},
        ConsumerProtocolSubscription, TopicName,
    },
    protocol::Encodable,
};

use crate::protocol::wire::str_bytes;

/// The assignment strategy we implement and announce.
pub(crate) const RANGE: &str = "range";

/// Partitions per topic, as assigned to one member.
pub(crate) type Assignment = BTreeMap<String, Vec<i32>>;

/// Encodes a subscription to `topics` (consumer protocol, version 0).
pub(crate) fn encode_subscription(topics: &[String]) -> Bytes {
    let subscription =
        ConsumerProtocolSubscription::default().with_topics(topics.iter().map(|t| str_bytes(t)).collect());
    encode_versioned(&subscription, 0)
}

/// Decodes another member's subscription, whichever client and version
/// wrote it: every version starts with the topics, and later fields are
/// ignored, as the protocol intends.
///
/// Hand-written rather than through `kafka-protocol`, which allocates
/// whatever an array's length prefix claims: these bytes come from other
/// group members, and garbage must be an error, never an abort.
pub(crate) fn decode_subscription(bytes: &[u8]) -> Result<Vec<String>, String> {
    let mut r = Reader::new(bytes, "subscription")?;
    let n = r.array_len()?;
    (0..n).map(|_| r.string()).collect()
}

/// Encodes an assignment (consumer protocol, version 0).
pub(crate) fn encode_assignment(assignment: &Assignment) -> Bytes {
    let assigned = assignment
        .iter()
        .map(|(topic, partitions)| {
            AssignedPartitions::default().with_topic(TopicName(str_bytes(topic))).with_partitions(partitions.clone())
        })
        .collect();
    encode_versioned(&ConsumerProtocolAssignment::default().with_assigned_partitions(assigned), 0)
}

/// Decodes the assignment the leader sent us (any version: all start with
/// the assigned partitions). An empty byte string is an empty assignment.
pub(crate) fn decode_assignment(bytes: &[u8]) -> Result<Assignment, String> {
    if bytes.is_empty() {
        return Ok(Assignment::new());
    }
    let mut r = Reader::new(bytes, "assignment")?;
    let mut out = Assignment::new();
    for _ in 0..r.array_len()? {
        let topic = r.string()?;
        let n = r.array_len()?;
        let partitions = (0..n).map(|_| r.i32()).collect::<Result<Vec<_>, _>>()?;
        out.entry(topic).or_default().extend(partitions);
    }
    for partitions in out.values_mut() {
        partitions.sort_unstable();
        partitions.dedup();
    }
    Ok(out)
}

/// A bounds-checked reader of the consumer protocol's classic encoding.
struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// Starts after the version prefix, which must be non-negative.
    fn new(buf: &'a [u8], what: &'static str) -> Result<Self, String> {
        let mut r = Reader { buf, what };
        let version = r.take(2)?;
        if version[0] & 0x80 != 0 {
            return Err(format!("{what} has a negative version"));
        }
        Ok(r)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() < n {
            return Err(format!("{} is truncated", self.what));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    /// An array length, checked against the bytes left (each element takes
    /// at least 2 bytes), so a hostile prefix cannot make us allocate.
    fn array_len(&mut self) -> Result<usize, String> {
        let n = self.i32()?;
        let n = usize::try_from(n).map_err(|_| format!("{} has a negative array length {n}", self.what))?;
        if n > self.buf.len() / 2 {
            return Err(format!("{} claims {n} elements in {} bytes", self.what, self.buf.len()));
        }
        Ok(n)
    }

    fn string(&mut self) -> Result<String, String> {
        let len = i16::from_be_bytes(self.take(2)?.try_into().expect("2 bytes"));
        let len = usize::try_from(len).map_err(|_| format!("{} has a null or negative string", self.what))?;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{} has a string that is not UTF-8", self.what))
    }
}

fn encode_versioned<M: Encodable>(message: &M, version: i16) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_i16(version);
    message.encode(&mut buf, version).expect("consumer protocol messages of in-memory strings always encode");
    buf.freeze()
}

/// Kafka's range assignor: for each topic, the members subscribed to it,
/// sorted by member id, get contiguous ranges of partitions; the first
/// `partitions % members` get one extra. Topics with no known partition
/// count are skipped. Every member appears in the result, maybe with nothing.
pub(crate) fn assign_range(
    subscriptions: &BTreeMap<String, Vec<String>>,
    partition_counts: &BTreeMap<String, i32>,
) -> BTreeMap<String, Assignment> {
    let mut result: BTreeMap<String, Assignment> =
        subscriptions.keys().map(|member| (member.clone(), Assignment::new())).collect();
    for (topic, &count) in partition_counts {
        let members: Vec<&String> =
            subscriptions.iter().filter(|(_, topics)| topics.contains(topic)).map(|(member, _)| member).collect();
        if members.is_empty() || count <= 0 {
            continue;
        }
        let m = members.len() as i32;
        let (per_member, with_extra) = (count / m, count % m);
        for (i, member) in members.into_iter().enumerate() {
            let i = i as i32;
            let start = i * per_member + i.min(with_extra);
            let len = per_member + i32::from(i < with_extra);
            if len > 0 {
                result
                    .get_mut(member)
                    .expect("every member has an entry")
                    .insert(topic.clone(), (start..start + len).collect());
            }
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `members`: (member id, topics); `counts`: (topic, partitions);
    /// `expected`: one line per member, `member: topic[p, ...] ...`.
    #[track_caller]
    fn check(members: &[(&str, &[&str])], counts: &[(&str, i32)], expected: &[&str]) {
        let subscriptions =
            members.iter().map(|(m, ts)| (m.to_string(), ts.iter().map(|t| t.to_string()).collect())).collect();
        let counts = counts.iter().map(|(t, n)| (t.to_string(), *n)).collect();
        let result = assign_range(&subscriptions, &counts);
        let lines: Vec<String> = result
            .iter()
            .map(|(member, a)| {
                let parts: Vec<String> = a.iter().map(|(t, ps)| format!("{t}{ps:?}")).collect();
                format!("{member}: {}", parts.join(" "))
            })
            .map(|l| l.trim_end().to_owned())
            .collect();
        assert_eq!(lines, expected);
    }

    #[test]
    fn range_assignment() {
        check(&[("a", &["t"])], &[("t", 3)], &["a: t[0, 1, 2]"]);
        check(&[("a", &["t"]), ("b", &["t"])], &[("t", 3)], &["a: t[0, 1]", "b: t[2]"]);
        check(&[("b", &["t"]), ("a", &["t"])], &[("t", 4)], &["a: t[0, 1]", "b: t[2, 3]"]);
        check(&[("a", &["t"]), ("b", &["t"]), ("c", &["t"])], &[("t", 2)], &["a: t[0]", "b: t[1]", "c:"]);
        check(&[("a", &["t", "u"]), ("b", &["t"])], &[("t", 3), ("u", 2)], &["a: t[0, 1] u[0, 1]", "b: t[2]"]);
        check(&[("a", &["t", "missing"])], &[("t", 1)], &["a: t[0]"]);
        check(&[("a", &["t"])], &[("t", 0)], &["a:"]);
    }

    #[test]
    fn every_partition_is_assigned_exactly_once() {
        for members in 1..6 {
            for count in 0..13 {
                let subs: BTreeMap<String, Vec<String>> =
                    (0..members).map(|m| (format!("m{m}"), vec!["t".to_owned()])).collect();
                let result = assign_range(&subs, &BTreeMap::from([("t".to_owned(), count)]));
                let mut all: Vec<i32> = result.values().flat_map(|a| a.get("t").cloned().unwrap_or_default()).collect();
                all.sort_unstable();
                assert_eq!(all, (0..count).collect::<Vec<_>>(), "{members} members, {count} partitions");
                let sizes: Vec<usize> = result.values().map(|a| a.get("t").map_or(0, Vec::len)).collect();
                assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "balanced: {sizes:?}");
            }
        }
    }

    #[test]
    fn codecs_round_trip() {
        let topics = vec!["orders".to_owned(), "orders.retry-5s".to_owned()];
        assert_eq!(decode_subscription(&encode_subscription(&topics)).unwrap(), topics);
        let assignment = Assignment::from([("orders".to_owned(), vec![0, 2]), ("x".to_owned(), vec![1])]);
        assert_eq!(decode_assignment(&encode_assignment(&assignment)).unwrap(), assignment);
        assert_eq!(decode_assignment(&[]).unwrap(), Assignment::new());
    }

    #[test]
    fn decodes_what_the_java_client_writes() {
        // ConsumerProtocolSubscription v3 as Kafka's Java client encodes it:
        // topics ["t"], null user data, owned partitions t[0], generation 5, null rack.
        let mut v3 = BytesMut::new();
        v3.put_i16(3);
        v3.put_i32(1);
        v3.put_i16(1);
        v3.put_slice(b"t");
        v3.put_i32(-1); // user data: null
        v3.put_i32(1); // owned partitions
        v3.put_i16(1);
        v3.put_slice(b"t");
        v3.put_i32(1);
        v3.put_i32(0);
        v3.put_i32(5); // generation id
        v3.put_i16(-1); // rack id: null
        assert_eq!(decode_subscription(&v3).unwrap(), ["t"]);
        // A version from the future decodes as the newest we know.
        let mut v9 = v3.clone();
        v9[..2].copy_from_slice(&9i16.to_be_bytes());
        assert_eq!(decode_subscription(&v9).unwrap(), ["t"]);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(decode_subscription(&[]).is_err());
        assert!(decode_subscription(&[0]).is_err());
        assert!(decode_subscription(&[0xff, 0xff]).is_err());
        assert!(decode_subscription(&[0, 0, 0x7f, 0xff, 0xff, 0xff]).is_err());
        assert!(decode_assignment(&[0, 0, 0, 0, 0, 9, 0xff]).is_err());
        assert!(decode_assignment(&[0, 0, 0x7f, 0xff, 0xff, 0xff]).is_err());
        assert!(decode_subscription(&[0, 0, 0, 0, 0, 1, 0xff, 0xff]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let _ = decode_subscription(&bytes);
            let _ = decode_assignment(&bytes);
        }
    }
}
