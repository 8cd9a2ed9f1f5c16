//! The consumer protocol's wire formats (subscription and assignment, as
//! every Kafka client encodes them) and the assignors a group leader runs:
//! range (eager: every rebalance revokes everything) and cooperative-sticky
//! (KIP-429: members keep what they own, and a partition moves in two
//! rebalances, released by its owner in the first, assigned in the second).
//! Pure: unit-tested without a broker.

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

/// The eager assignment strategy we implement and announce.
pub(crate) const RANGE: &str = "range";

/// The cooperative one (Kafka's `cooperative-sticky`).
pub(crate) const COOPERATIVE_STICKY: &str = "cooperative-sticky";

/// Partitions per topic, as assigned to one member.
pub(crate) type Assignment = BTreeMap<String, Vec<i32>>;

/// What a member tells the group's leader when it joins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Subscription {
    pub(crate) topics: Vec<String>,
    /// The partitions it owns now (version 1 and later; cooperative members).
    pub(crate) owned: Assignment,
    /// The generation in which it owned them (version 2 and later), -1 unknown.
    pub(crate) generation: i32,
}

/// Encodes a subscription to `topics` (consumer protocol, version 0).
pub(crate) fn encode_subscription(topics: &[String]) -> Bytes {
    let subscription =
        ConsumerProtocolSubscription::default().with_topics(topics.iter().map(|t| str_bytes(t)).collect());
    encode_versioned(&subscription, 0)
}

/// Encodes a cooperative member's subscription: its topics, what it owns
/// and since which generation (version 2, as Kafka's Java client writes it).
pub(crate) fn encode_owned_subscription(topics: &[String], owned: &Assignment, generation: i32) -> Bytes {
    let owned = owned
        .iter()
        .filter(|(_, partitions)| !partitions.is_empty())
        .map(|(topic, partitions)| {
            kafka_protocol::messages::consumer_protocol_subscription::TopicPartition::default()
                .with_topic(TopicName(str_bytes(topic)))
                .with_partitions(partitions.clone())
        })
        .collect();
    let subscription = ConsumerProtocolSubscription::default()
        .with_topics(topics.iter().map(|t| str_bytes(t)).collect())
        .with_owned_partitions(owned)
        .with_generation_id(generation);
    encode_versioned(&subscription, 2)
}

/// Decodes another member's subscription, whichever client and version
/// wrote it: every version starts with the topics; owned partitions
/// (version 1) and the generation (version 2) are read when present, and
/// later fields are ignored, as the protocol intends.
///
/// Hand-written rather than through `kafka-protocol`, which allocates
/// whatever an array's length prefix claims: these bytes come from other
/// group members, and garbage must be an error, never an abort.
pub(crate) fn decode_subscription(bytes: &[u8]) -> Result<Subscription, String> {
    let mut r = Reader::new(bytes, "subscription")?;
    let version = r.version;
    let n = r.array_len()?;
    let topics = (0..n).map(|_| r.string()).collect::<Result<Vec<_>, _>>()?;
    let mut subscription = Subscription { topics, owned: Assignment::new(), generation: -1 };
    if version >= 1 {
        r.nullable_bytes()?; // user data
        for _ in 0..r.array_len()? {
            let topic = r.string()?;
            let n = r.array_len()?;
            let partitions = (0..n).map(|_| r.i32()).collect::<Result<Vec<_>, _>>()?;
            subscription.owned.entry(topic).or_default().extend(partitions);
        }
        for partitions in subscription.owned.values_mut() {
            partitions.sort_unstable();
            partitions.dedup();
        }
    }
    if version >= 2 {
        subscription.generation = r.i32()?;
    }
    Ok(subscription)
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
    version: i16,
}

impl<'a> Reader<'a> {
    /// Starts after the version prefix, which must be non-negative.
    fn new(buf: &'a [u8], what: &'static str) -> Result<Self, String> {
        let mut r = Reader { buf, what, version: 0 };
        let version = i16::from_be_bytes(r.take(2)?.try_into().expect("2 bytes"));
        if version < 0 {
            return Err(format!("{what} has a negative version"));
        }
        r.version = version;
        Ok(r)
    }

    /// Nullable bytes (an i32 length, -1 for null), skipped.
    fn nullable_bytes(&mut self) -> Result<(), String> {
        let len = self.i32()?;
        if len >= 0 {
            self.take(len as usize)?;
        }
        Ok(())
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

/// Calls `assign` for each topic with partitions and members subscribed
/// to it (`members`, sorted by id), on a result where every member starts
/// with nothing; returns that result.
fn each_topic(
    subscriptions: &BTreeMap<String, Subscription>,
    partition_counts: &BTreeMap<String, i32>,
    mut assign: impl FnMut(&String, i32, Vec<&String>, &mut BTreeMap<String, Assignment>),
) -> BTreeMap<String, Assignment> {
    let mut result: BTreeMap<String, Assignment> =
        subscriptions.keys().map(|member| (member.clone(), Assignment::new())).collect();
    for (topic, &count) in partition_counts {
        let members: Vec<&String> =
            subscriptions.iter().filter(|(_, s)| s.topics.contains(topic)).map(|(member, _)| member).collect();
        if !members.is_empty() && count > 0 {
            assign(topic, count, members, &mut result);
        }
    }
    result
}

/// Kafka's range assignor: for each topic, the members subscribed to it,
/// sorted by member id, get contiguous ranges of partitions; the first
/// `partitions % members` get one extra. Topics with no known partition
/// count are skipped. Every member appears in the result, maybe with nothing.
pub(crate) fn assign_range(
    subscriptions: &BTreeMap<String, Subscription>,
    partition_counts: &BTreeMap<String, i32>,
) -> BTreeMap<String, Assignment> {
    each_topic(subscriptions, partition_counts, |topic, count, members, result| {
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
    })
}

/// Kafka's cooperative-sticky assignor (KIP-429), for one round: each
/// member keeps what it owns, up to its share (the partitions of a topic
/// divided among the members subscribed to it, the first `count % members`
/// of those that own the most taking one more); what nobody keeps goes to
/// the members below their share, fewest first. A partition that changes
/// owner is held back this round: its owner sees it missing from its
/// assignment, releases it, and rejoins; the next round assigns it, free.
/// So no partition is ever owned by two members at once.
///
/// A partition two members claim (a member that missed a generation) is
/// the claim of the later generation, then the first member's by id.
pub(crate) fn assign_cooperative_sticky(
    subscriptions: &BTreeMap<String, Subscription>,
    partition_counts: &BTreeMap<String, i32>,
) -> BTreeMap<String, Assignment> {
    each_topic(subscriptions, partition_counts, |topic, count, members, result| {
        // Who owns each partition now, among the subscribed members.
        let mut owner: BTreeMap<i32, (&String, i32)> = BTreeMap::new();
        for member in &members {
            let s = &subscriptions[*member];
            for &p in s.owned.get(topic).into_iter().flatten().filter(|p| (0..count).contains(*p)) {
                match owner.get(&p) {
                    Some((_, generation)) if *generation >= s.generation => {}
                    _ => {
                        owner.insert(p, (member, s.generation));
                    }
                }
            }
        }
        let mut owned: BTreeMap<&String, Vec<i32>> = members.iter().map(|m| (*m, Vec::new())).collect();
        for (p, (member, _)) in &owner {
            owned.get_mut(*member).expect("an owner is a member").push(*p);
        }
        let m = members.len();
        let (base, mut extras) = (count as usize / m, count as usize % m);
        // Members that own more than the base keep one more, most first,
        // while shares above the base remain.
        let mut by_owned: Vec<&String> = members.clone();
        by_owned.sort_by_key(|member| std::cmp::Reverse(owned[*member].len()));
        let mut share: BTreeMap<&String, usize> = members.iter().map(|m| (*m, base)).collect();
        for member in by_owned {
            if extras > 0 && owned[member].len() > base {
                *share.get_mut(member).expect("every member has a share") += 1;
                extras -= 1;
            }
        }
        let mut kept: BTreeMap<&String, Vec<i32>> = BTreeMap::new();
        for member in &members {
            let mut mine = owned[*member].clone();
            mine.truncate(share[*member]);
            kept.insert(*member, mine);
        }
        let taken: std::collections::BTreeSet<i32> = kept.values().flatten().copied().collect();
        let mut free = (0..count).filter(|p| !taken.contains(p));
        // Fill every member to its share, fewest first; then the shares
        // above the base left go to members without one, fewest first.
        loop {
            let below =
                members.iter().filter(|m| kept[**m].len() < share[**m]).min_by_key(|m| kept[**m].len()).copied();
            let Some(member) = below else { break };
            match free.next() {
                Some(p) => kept.get_mut(member).expect("kept has every member").push(p),
                None => break,
            }
        }
        for p in free {
            let member = members
                .iter()
                .filter(|m| share[**m] == base)
                .min_by_key(|m| kept[**m].len())
                .copied()
                .expect("a partition left means a share above the base is left");
            *share.get_mut(member).expect("every member has a share") += 1;
            kept.get_mut(member).expect("kept has every member").push(p);
        }
        for (member, mut partitions) in kept {
            // Held back: partitions another member still owns.
            partitions.retain(|p| owner.get(p).is_none_or(|(o, _)| *o == member));
            partitions.sort_unstable();
            if !partitions.is_empty() {
                result.get_mut(member).expect("every member has an entry").insert(topic.clone(), partitions);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `members`: (member id, topics); `counts`: (topic, partitions);
    /// `expected`: one line per member, `member: topic[p, ...] ...`.
    #[track_caller]
    fn check(members: &[(&str, &[&str])], counts: &[(&str, i32)], expected: &[&str]) {
        let subscriptions = members
            .iter()
            .map(|(m, ts)| {
                let topics = ts.iter().map(|t| t.to_string()).collect();
                (m.to_string(), Subscription { topics, ..Subscription::default() })
            })
            .collect();
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
                let subs: BTreeMap<String, Subscription> = (0..members)
                    .map(|m| {
                        (format!("m{m}"), Subscription { topics: vec!["t".to_owned()], ..Subscription::default() })
                    })
                    .collect();
                let result = assign_range(&subs, &BTreeMap::from([("t".to_owned(), count)]));
                let mut all: Vec<i32> = result.values().flat_map(|a| a.get("t").cloned().unwrap_or_default()).collect();
                all.sort_unstable();
                assert_eq!(all, (0..count).collect::<Vec<_>>(), "{members} members, {count} partitions");
                let sizes: Vec<usize> = result.values().map(|a| a.get("t").map_or(0, Vec::len)).collect();
                assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "balanced: {sizes:?}");
            }
        }
    }

    /// One round of cooperative-sticky over topic `t` of `count`
    /// partitions: `members` are (member id, owned partitions);
    /// `expected` one line per member, `member: [p, ...]`.
    #[track_caller]
    fn check_sticky(members: &[(&str, &[i32])], count: i32, expected: &[&str]) {
        let result =
            assign_cooperative_sticky(&sticky_subscriptions(members), &BTreeMap::from([("t".to_owned(), count)]));
        let lines: Vec<String> = result
            .iter()
            .map(|(member, a)| format!("{member}: {:?}", a.get("t").cloned().unwrap_or_default()))
            .collect();
        assert_eq!(lines, expected);
    }

    fn sticky_subscriptions(members: &[(&str, &[i32])]) -> BTreeMap<String, Subscription> {
        members
            .iter()
            .map(|(m, owned)| {
                let owned = if owned.is_empty() {
                    Assignment::new()
                } else {
                    Assignment::from([("t".to_owned(), owned.to_vec())])
                };
                (m.to_string(), Subscription { topics: vec!["t".to_owned()], owned, generation: 1 })
            })
            .collect()
    }

    #[test]
    fn cooperative_sticky_assignment() {
        // A fresh group: spread like range.
        check_sticky(&[("a", &[]), ("b", &[])], 4, &["a: [0, 2]", "b: [1, 3]"]);
        // One member owns everything; a newcomer joins: a keeps half, and
        // the half that moves is held back this round (a releases it)...
        check_sticky(&[("a", &[0, 1, 2, 3, 4, 5]), ("b", &[])], 6, &["a: [0, 1, 2]", "b: []"]);
        // ...and assigned the next, free.
        check_sticky(&[("a", &[0, 1, 2]), ("b", &[])], 6, &["a: [0, 1, 2]", "b: [3, 4, 5]"]);
        // A member leaves: the others keep theirs and take its partitions.
        check_sticky(&[("a", &[0, 1]), ("c", &[4, 5])], 6, &["a: [0, 1, 2]", "c: [3, 4, 5]"]);
        // An odd count: the member owning more keeps the extra one.
        check_sticky(&[("a", &[0, 1]), ("b", &[2, 3, 4])], 5, &["a: [0, 1]", "b: [2, 3, 4]"]);
        // Partitions past the topic's count (it shrank, or garbage) are dropped.
        check_sticky(&[("a", &[0, 7])], 2, &["a: [0, 1]"]);
        // Two claims of one partition: the first member's, by id, at equal generations.
        check_sticky(&[("a", &[0]), ("b", &[0, 1])], 2, &["a: [0]", "b: [1]"]);
    }

    proptest::proptest! {
        /// Whatever each member owns (each partition by one member at
        /// most), a round never gives a partition to two members nor to
        /// one while another still owns it, takes nothing from a member
        /// within its share; and once the owners released what they lost,
        /// a second round assigns every partition, balanced.
        #[test]
        fn cooperative_sticky_moves_partitions_safely_and_settles(
            owners in proptest::collection::vec(proptest::option::of(0usize..4), 0..12),
            members in 1usize..5,
        ) {
            let count = owners.len() as i32;
            let names: Vec<String> = (0..members).map(|m| format!("m{m}")).collect();
            let mut owned: Vec<Vec<i32>> = vec![Vec::new(); members];
            for (p, o) in owners.iter().enumerate() {
                if let Some(o) = o.filter(|o| *o < members) {
                    owned[o].push(p as i32);
                }
            }
            let round = |owned: &[Vec<i32>]| {
                let subs: BTreeMap<String, Subscription> = names
                    .iter()
                    .zip(owned)
                    .map(|(n, o)| (n.clone(), Subscription { topics: vec!["t".into()], owned: Assignment::from([("t".to_owned(), o.clone())]), generation: 1 }))
                    .collect();
                let result = assign_cooperative_sticky(&subs, &BTreeMap::from([("t".to_owned(), count)]));
                names.iter().map(|n| result[n].get("t").cloned().unwrap_or_default()).collect::<Vec<Vec<i32>>>()
            };
            let first = round(&owned);
            let mut seen = std::collections::BTreeSet::new();
            for (m, assigned) in first.iter().enumerate() {
                for p in assigned {
                    proptest::prop_assert!(seen.insert(*p), "partition {} assigned twice: {:?}", p, first);
                    let other_owner = owned.iter().enumerate().any(|(o, ps)| o != m && ps.contains(p));
                    proptest::prop_assert!(!other_owner, "partition {} given to m{} while another owns it", p, m);
                }
                let share = count as usize / members + 1;
                if owned[m].len() <= count as usize / members {
                    proptest::prop_assert!(owned[m].iter().all(|p| assigned.contains(p)), "m{} lost a partition within its share", m);
                }
                proptest::prop_assert!(assigned.len() <= share);
            }
            // Each member now owns what it was assigned (it released the rest).
            let second = round(&first);
            let mut all: Vec<i32> = second.iter().flatten().copied().collect();
            all.sort_unstable();
            proptest::prop_assert_eq!(all, (0..count).collect::<Vec<_>>());
            let sizes: Vec<usize> = second.iter().map(Vec::len).collect();
            proptest::prop_assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "unbalanced: {:?}", second);
            for (m, assigned) in first.iter().enumerate() {
                proptest::prop_assert!(assigned.iter().all(|p| second[m].contains(p)), "the second round moved m{}'s partitions", m);
            }
        }
    }

    #[test]
    fn codecs_round_trip() {
        let topics = vec!["orders".to_owned(), "orders.retry-5s".to_owned()];
        assert_eq!(decode_subscription(&encode_subscription(&topics)).unwrap().topics, topics);
        let owned = Assignment::from([("orders".to_owned(), vec![1, 4])]);
        let decoded = decode_subscription(&encode_owned_subscription(&topics, &owned, 7)).unwrap();
        assert_eq!(decoded, Subscription { topics: topics.clone(), owned, generation: 7 });
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
        let expected = Subscription {
            topics: vec!["t".to_owned()],
            owned: Assignment::from([("t".to_owned(), vec![0])]),
            generation: 5,
        };
        assert_eq!(decode_subscription(&v3).unwrap(), expected);
        // A version from the future decodes as the newest we know.
        let mut v9 = v3.clone();
        v9[..2].copy_from_slice(&9i16.to_be_bytes());
        assert_eq!(decode_subscription(&v9).unwrap(), expected);
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
