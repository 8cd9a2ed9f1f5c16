//! The operators' position on a dead-letter partition, and which records a
//! replay selects: the rules that make repeating a replay or an
//! acknowledgement harmless.
//!
//! The operators' consumer group keeps one committed offset per partition:
//! every record before it was replayed or acknowledged. Records handled
//! out of order (a replay by keys or offsets, an acknowledgement of single
//! offsets) are recorded above it, in the commit's metadata, until the
//! position reaches them. A position only moves forwards: two positions
//! merge into the furthest, with every record either has handled.

use std::collections::{BTreeMap, BTreeSet};

/// The most bytes of metadata a position writes: Kafka's default
/// `offset.metadata.max.bytes` is 4096.
pub const MAX_POSITION_METADATA_BYTES: usize = 4000;

/// What the metadata starts with, so that foreign metadata is not misread.
const METADATA_PREFIX: &str = "handled-above:";

/// Where operators stand on one dead-letter partition.
///
/// ```
/// use retry_core::operators::OperatorsPosition;
///
/// let mut position = OperatorsPosition::new(Some(10), None, 0);
/// position.handle(12).unwrap(); // replayed by key, out of order
/// assert_eq!((position.next(), position.metadata()), (10, "handled-above:12".to_owned()));
/// position.handle(10).unwrap();
/// position.handle(11).unwrap();
/// assert_eq!((position.next(), position.metadata()), (13, "handled-above:".to_owned()));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorsPosition {
    next: i64,
    /// The records handled above `next`, as ranges (first offset to last,
    /// inclusive), disjoint and apart: what the metadata writes, so each
    /// step costs the ranges, never the records (a replay of a million
    /// records out of order is a million steps over one range).
    handled_above: BTreeMap<i64, i64>,
}

/// A position cannot record one more record handled out of order: its
/// metadata would exceed [`MAX_POSITION_METADATA_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "too many records handled out of order above offset {next}: acknowledge or replay the records before them first"
)]
/// ```
/// use retry_core::{operators::OperatorsPosition, operators::PositionFull, operators::MAX_POSITION_METADATA_BYTES};
///
/// let mut position = OperatorsPosition::new(Some(0), None, 0);
/// // Every other record handled out of order: one range each, until the metadata is full.
/// let full = (1_000_000..).step_by(2).find_map(|offset| position.handle(offset).err()).unwrap();
/// assert_eq!(full, PositionFull { next: 0 });
/// assert!(position.metadata().len() <= MAX_POSITION_METADATA_BYTES);
/// assert!(full.to_string().starts_with("too many records handled out of order above offset 0"));
/// ```
pub struct PositionFull {
    /// The position's next offset.
    pub next: i64,
}

impl OperatorsPosition {
    /// The position a group's commit describes: `committed` (the next offset,
    /// `None` when nothing was committed) and its `metadata`, on a
    /// partition whose oldest kept record is `earliest`. Metadata this crate
    /// did not write is ignored.
    pub fn new(committed: Option<i64>, metadata: Option<&str>, earliest: i64) -> Self {
        let next = committed.unwrap_or(earliest).max(earliest);
        let handled_above = metadata.and_then(parse_ranges).unwrap_or_default();
        let mut position = OperatorsPosition { next, handled_above };
        position.settle();
        position
    }

    /// The first offset not known to be handled: what the group commits.
    pub fn next(&self) -> i64 {
        self.next
    }

    /// How many records between the position and `end` (exclusive) are
    /// handled already.
    pub fn handled_above(&self, end: i64) -> usize {
        let counted: i64 = self.handled_above.range(..end).map(|(&first, &last)| last.min(end - 1) - first + 1).sum();
        usize::try_from(counted).unwrap_or(usize::MAX)
    }

    /// Whether the record at `offset` was replayed or acknowledged.
    pub fn is_handled(&self, offset: i64) -> bool {
        offset < self.next || self.handled_above.range(..=offset).next_back().is_some_and(|(_, &last)| last >= offset)
    }

    /// Records `offset` as handled; refused when the metadata would grow too
    /// large, and the position is then unchanged.
    pub fn handle(&mut self, offset: i64) -> Result<(), PositionFull> {
        if self.is_handled(offset) {
            return Ok(());
        }
        let before = self.handled_above.clone();
        insert_range(&mut self.handled_above, offset, offset);
        self.settle();
        if self.metadata_len() > MAX_POSITION_METADATA_BYTES {
            self.handled_above = before;
            return Err(PositionFull { next: self.next });
        }
        Ok(())
    }

    /// Records every offset before `offset` as handled (an acknowledgement
    /// up to a point); never moves back.
    pub fn handle_before(&mut self, offset: i64) {
        self.next = self.next.max(offset);
        self.settle();
    }

    /// This position and `other` together: the furthest next offset, and
    /// every record either handled. What a commit writes after reading the
    /// group's current position, so no concurrent acknowledgement is undone.
    pub fn merge(&self, other: &OperatorsPosition) -> OperatorsPosition {
        let mut merged =
            OperatorsPosition { next: self.next.max(other.next), handled_above: self.handled_above.clone() };
        for (&first, &last) in &other.handled_above {
            insert_range(&mut merged.handled_above, first, last);
        }
        merged.settle();
        merged
    }

    /// The commit's metadata: the offsets handled above the position, as
    /// ranges (`handled-above:12,15-18`).
    pub fn metadata(&self) -> String {
        let mut out = String::from(METADATA_PREFIX);
        for (i, (&first, &last)) in self.handled_above.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            if first == last {
                out.push_str(&first.to_string());
            } else {
                out.push_str(&format!("{first}-{last}"));
            }
        }
        out
    }

    /// The length of [`OperatorsPosition::metadata`], without writing it.
    fn metadata_len(&self) -> usize {
        let digits = |n: i64| n.to_string().len();
        let ranges: usize = self
            .handled_above
            .iter()
            .map(|(&first, &last)| if first == last { digits(first) } else { digits(first) + 1 + digits(last) })
            .sum();
        METADATA_PREFIX.len() + ranges + self.handled_above.len().saturating_sub(1)
    }

    /// Moves the position over the handled offsets that follow it, and
    /// forgets those below it.
    fn settle(&mut self) {
        while let Some((&first, &last)) = self.handled_above.first_key_value() {
            if first > self.next {
                break;
            }
            self.handled_above.pop_first();
            self.next = self.next.max(last.saturating_add(1));
        }
    }
}

/// Adds `first..=last` to `ranges`, joining the ranges it touches or
/// overlaps, so they stay disjoint and apart.
fn insert_range(ranges: &mut BTreeMap<i64, i64>, mut first: i64, mut last: i64) {
    // A range that starts at or before `first` and reaches it (or its
    // neighbour) absorbs it.
    if let Some((&start, &end)) = ranges.range(..=first).next_back() {
        if end.saturating_add(1) >= first {
            first = start;
            last = last.max(end);
            ranges.remove(&start);
        }
    }
    // Ranges that start within it (or right after it) join it.
    while let Some((&start, &end)) = ranges.range(first..=last.saturating_add(1)).next() {
        last = last.max(end);
        ranges.remove(&start);
    }
    ranges.insert(first, last);
}

fn parse_ranges(metadata: &str) -> Option<BTreeMap<i64, i64>> {
    let ranges = metadata.strip_prefix(METADATA_PREFIX)?;
    let mut out = BTreeMap::new();
    for range in ranges.split(',').filter(|r| !r.is_empty()) {
        let (first, last) = match range.split_once('-') {
            Some((first, last)) => (first.parse::<i64>().ok()?, last.parse::<i64>().ok()?),
            None => {
                let offset = range.parse::<i64>().ok()?;
                (offset, offset)
            }
        };
        // Ranges are kept as ranges, whatever their length: anything the
        // writer writes, the reader reads.
        if first < 0 || last < first {
            return None;
        }
        insert_range(&mut out, first, last);
    }
    Some(out)
}

/// Which records of a dead-letter topic a replay selects; `None` fields
/// select everything. The operators' position decides separately which of
/// them were handled already.
///
/// ```
/// use retry_core::operators::ReplaySelection;
///
/// // One customer's records on partition 2, at most 100 of them.
/// let selection = ReplaySelection {
///     partition: Some(2),
///     keys: Some(vec![b"customer-7".to_vec()]),
///     limit: Some(100),
///     ..Default::default()
/// };
/// assert!(selection.visits(2) && !selection.visits(0));
/// assert!(selection.selects(15, Some(&b"customer-7"[..])));
/// assert!(!selection.selects(16, Some(&b"customer-8"[..])));
/// assert!(!selection.limit_reached(99) && selection.limit_reached(100));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplaySelection {
    /// Only this partition.
    pub partition: Option<i32>,
    /// Only these offsets.
    pub offsets: Option<BTreeSet<i64>>,
    /// Only records with one of these keys.
    pub keys: Option<Vec<Vec<u8>>>,
    /// At most this many records replayed (counted while reading).
    pub limit: Option<usize>,
}

impl ReplaySelection {
    /// Whether the replay reads `partition` at all.
    pub fn visits(&self, partition: i32) -> bool {
        self.partition.is_none_or(|only| only == partition)
    }

    /// Whether the record at `offset` with `key` is one the operator asked
    /// for (before the limit and the guards).
    pub fn selects(&self, offset: i64, key: Option<&[u8]>) -> bool {
        self.offsets.as_ref().is_none_or(|offsets| offsets.contains(&offset))
            && self.keys.as_ref().is_none_or(|keys| key.is_some_and(|key| keys.iter().any(|k| k == key)))
    }

    /// Whether `replayed` records reach the limit: reading stops there.
    pub fn limit_reached(&self, replayed: usize) -> bool {
        self.limit.is_some_and(|limit| replayed >= limit)
    }

    /// The first offset of a partition worth reading from `next` on: with an
    /// offset list, its first member at or after `next`; `None` when no
    /// offset there can be selected.
    pub fn first_offset_from(&self, next: i64) -> Option<i64> {
        match &self.offsets {
            None => Some(next),
            Some(offsets) => offsets.range(next..).next().copied(),
        }
    }

    /// Whether a targeted replay (by keys or offsets) could still select
    /// anything at or after `offset`.
    pub fn may_select_from(&self, offset: i64) -> bool {
        self.first_offset_from(offset).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A position from its committed offset and metadata, then `steps`:
    /// `h12` handles 12, `b20` handles before 20, `m<next>:<meta>` merges
    /// another position. Expected: next offset and metadata.
    #[track_caller]
    fn check(committed: Option<i64>, metadata: Option<&str>, earliest: i64, steps: &[&str], expected: (i64, &str)) {
        let mut position = OperatorsPosition::new(committed, metadata, earliest);
        for step in steps {
            let (kind, arg) = step.split_at(1);
            match kind {
                "h" => position.handle(arg.parse().unwrap()).unwrap(),
                "b" => position.handle_before(arg.parse().unwrap()),
                "m" => {
                    let (next, meta) = arg.split_once(':').unwrap();
                    let other = OperatorsPosition::new(
                        Some(next.parse().unwrap()),
                        Some(&format!("{METADATA_PREFIX}{meta}")),
                        0,
                    );
                    position = position.merge(&other);
                }
                _ => unreachable!("{step}"),
            }
        }
        assert_eq!(
            (position.next(), position.metadata().as_str()),
            (expected.0, &*format!("{METADATA_PREFIX}{}", expected.1))
        );
    }

    #[test]
    fn positions() {
        // Nothing committed: the oldest kept record.
        check(None, None, 5, &[], (5, ""));
        // Retention passed the commit.
        check(Some(3), None, 5, &[], (5, ""));
        check(Some(10), None, 0, &["h10", "h11"], (12, ""));
        // Out of order: recorded above, until the gap closes.
        check(Some(10), None, 0, &["h12", "h14", "h15"], (10, "12,14-15"));
        check(Some(10), None, 0, &["h12", "h14", "h15", "h10", "h11"], (13, "14-15"));
        check(Some(10), None, 0, &["h12", "h14", "h15", "h10", "h11", "h13"], (16, ""));
        // Below the position: already handled, nothing changes.
        check(Some(10), None, 0, &["h3"], (10, ""));
        // Acknowledging up to a point swallows what was above it, and moves on
        // over what follows.
        check(Some(10), None, 0, &["h12", "h20", "b13"], (13, "20"));
        check(Some(10), None, 0, &["h13", "b13"], (14, ""));
        // Never backwards.
        check(Some(10), None, 0, &["b4"], (10, ""));
        check(Some(10), Some("handled-above:12,14-15"), 0, &[], (10, "12,14-15"));
        // Metadata at or below the position is forgotten; foreign metadata is ignored.
        check(Some(10), Some("handled-above:3,10-11,13"), 0, &[], (12, "13"));
        check(Some(10), Some("some tool's note"), 0, &[], (10, ""));
        check(Some(10), Some("handled-above:x"), 0, &[], (10, ""));
        check(Some(10), Some("handled-above:9-2"), 0, &[], (10, ""));
        // Merging: an acknowledgement made while a replay ran is kept.
        check(Some(10), None, 0, &["h10", "m30:"], (30, ""));
        check(Some(10), None, 0, &["h10", "h12", "m5:14"], (11, "12,14"));
        check(Some(10), None, 0, &["h12", "m11:"], (11, "12"));
        check(Some(10), None, 0, &["h12", "m12:"], (13, ""));
    }

    #[test]
    fn metadata_is_capped_and_a_refused_handle_changes_nothing() {
        let mut position = OperatorsPosition::new(Some(0), None, 0);
        let mut offset = 1_000_000_000;
        let refused = loop {
            match position.handle(offset) {
                Ok(()) => offset += 2, // every other record: one range each
                Err(full) => break full,
            }
        };
        assert_eq!(refused, PositionFull { next: 0 });
        assert!(position.metadata().len() <= MAX_POSITION_METADATA_BYTES);
        assert_eq!(position.metadata_len(), position.metadata().len());
        assert!(!position.is_handled(offset));
        // A neighbour of a recorded offset extends its range; it may still fit.
        let round_trip = OperatorsPosition::new(Some(0), Some(&position.metadata()), 0);
        assert_eq!(round_trip, position);
    }

    #[test]
    fn ranges_join_whatever_the_order() {
        let ranges = |steps: &[(i64, i64)]| {
            let mut out = BTreeMap::new();
            for &(first, last) in steps {
                insert_range(&mut out, first, last);
            }
            out.into_iter().collect::<Vec<_>>()
        };
        assert_eq!(ranges(&[(5, 5), (7, 7), (6, 6)]), [(5, 7)]);
        assert_eq!(ranges(&[(5, 5), (9, 9), (1, 20)]), [(1, 20)]);
        assert_eq!(ranges(&[(10, 12), (1, 3), (4, 9)]), [(1, 12)]);
        assert_eq!(ranges(&[(10, 12), (1, 3), (5, 8)]), [(1, 3), (5, 8), (10, 12)]);
        assert_eq!(ranges(&[(1, 3), (2, 2), (3, 5)]), [(1, 5)]);
        assert_eq!(ranges(&[(i64::MAX, i64::MAX), (i64::MAX - 1, i64::MAX - 1)]), [(i64::MAX - 1, i64::MAX)]);
    }

    /// 1.2 million records handled out of order, one by one, above a gap:
    /// each step costs the ranges (one), and the metadata written is read
    /// back as it was, however long its range.
    #[test]
    fn a_long_run_out_of_order_stays_one_range_and_reads_back() {
        let mut position = OperatorsPosition::new(Some(0), None, 0);
        for offset in (10..1_200_010).rev() {
            position.handle(offset).unwrap();
        }
        assert_eq!(position.metadata(), "handled-above:10-1200009");
        assert_eq!(position.handled_above(1_000_010), 1_000_000);
        let read = OperatorsPosition::new(Some(0), Some(&position.metadata()), 0);
        assert_eq!(read, position);
        assert!(read.is_handled(1_100_000) && !read.is_handled(5) && !read.is_handled(1_200_010));
        let mut closed = read.clone();
        for offset in 0..10 {
            closed.handle(offset).unwrap();
        }
        assert_eq!((closed.next(), closed.metadata().as_str()), (1_200_010, METADATA_PREFIX));
    }

    #[test]
    fn selections() {
        let keys = |ks: &[&str]| Some(ks.iter().map(|k| k.as_bytes().to_vec()).collect());
        let offsets = |os: &[i64]| Some(os.iter().copied().collect());
        let all = ReplaySelection::default();
        let by_key = ReplaySelection { keys: keys(&["a", "b"]), ..Default::default() };
        let by_offset = ReplaySelection { offsets: offsets(&[3, 7]), ..Default::default() };
        let both = ReplaySelection { keys: keys(&["a"]), offsets: offsets(&[3]), ..Default::default() };
        let table: &[(&ReplaySelection, i64, Option<&str>, bool)] = &[
            (&all, 0, None, true),
            (&all, 9, Some("z"), true),
            (&by_key, 0, Some("a"), true),
            (&by_key, 0, Some("b"), true),
            (&by_key, 0, Some("c"), false),
            (&by_key, 0, None, false),
            (&by_offset, 3, None, true),
            (&by_offset, 4, None, false),
            (&both, 3, Some("a"), true),
            (&both, 3, Some("b"), false),
            (&both, 4, Some("a"), false),
        ];
        for (i, &(selection, offset, key, expected)) in table.iter().enumerate() {
            assert_eq!(selection.selects(offset, key.map(str::as_bytes)), expected, "case {i}");
        }
        assert_eq!(by_offset.first_offset_from(0), Some(3));
        assert_eq!(by_offset.first_offset_from(4), Some(7));
        assert_eq!(by_offset.first_offset_from(8), None);
        assert_eq!(all.first_offset_from(8), Some(8));
        let limited = ReplaySelection { limit: Some(2), partition: Some(1), ..Default::default() };
        assert_eq!((limited.limit_reached(1), limited.limit_reached(2)), (false, true));
        assert_eq!((limited.visits(1), limited.visits(0), all.visits(7)), (true, false, true));
    }
}
