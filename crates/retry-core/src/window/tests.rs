use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn window(max_in_flight: usize, null_keys: NullKeys, start: i64) -> InFlightWindow {
    InFlightWindow::new(WindowConfig::new(max_in_flight, null_keys).unwrap(), start)
}

/// Admits `records` (offset, key), then plays `steps`: `Start` starts what
/// is ready, `Finish(o)` finishes `o`. Each step renders as one line.
#[derive(Debug, Clone, Copy)]
enum Step {
    Start,
    Release(i64),
    Finish(i64),
}

#[track_caller]
fn check(null_keys: NullKeys, records: &[(i64, Option<&str>)], steps: &[Step], expected: &str) {
    let mut w = window(8, null_keys, records.first().map_or(0, |r| r.0));
    for (offset, key) in records {
        w.admit(*offset, key.map(str::as_bytes)).unwrap();
    }
    let mut lines = Vec::new();
    for step in steps {
        lines.push(match step {
            Step::Start => format!("start {:?}", w.start_ready().collect::<Vec<_>>()),
            Step::Release(o) => format!("release {o} -> {:?}", w.release(*o)),
            Step::Finish(o) => format!("finish {o} -> {:?}", w.finish(*o).unwrap()),
        });
    }
    lines.push(format!("commit at {}", w.commit_position()));
    assert_eq!(lines.join("\n"), expected.trim());
}

use Step::{Finish, Release, Start};

#[test]
fn per_key_order_and_the_commit_position() {
    // Different keys run together; the position waits for the lowest.
    check(
        NullKeys::Ordered,
        &[(10, Some("a")), (11, Some("b")), (12, Some("a")), (13, Some("c"))],
        &[Start, Finish(11), Start, Finish(10), Start, Finish(13), Finish(12)],
        "
start [10, 11, 13]
finish 11 -> None
start []
finish 10 -> Some(12)
start [12]
finish 13 -> None
finish 12 -> Some(14)
commit at 14",
    );
    // Records without a key share one lane unless unordered.
    let nulls = [(0, None), (1, None), (2, Some("k"))];
    check(
        NullKeys::Ordered,
        &nulls,
        &[Start, Finish(0), Start],
        "start [0, 2]\nfinish 0 -> Some(1)\nstart [1]\ncommit at 1",
    );
    check(NullKeys::Unordered, &nulls, &[Start], "start [0, 1, 2]\ncommit at 0");
    // A record going to a retry topic frees its key at once; the position
    // waits for the broker's acknowledgement.
    check(
        NullKeys::Ordered,
        &[(0, Some("a")), (1, Some("a"))],
        &[Start, Release(0), Start, Finish(1), Finish(0)],
        "
start [0]
release 0 -> Ok(())
start [1]
finish 1 -> None
finish 0 -> Some(2)
commit at 2",
    );
    // Gaps in offsets (compaction, transaction markers) are passed.
    check(
        NullKeys::Ordered,
        &[(5, Some("a")), (9, Some("b"))],
        &[Start, Finish(5)],
        "start [5, 9]\nfinish 5 -> Some(9)\ncommit at 9",
    );
}

#[test]
fn misuse_is_an_error_not_a_silent_skip() {
    let mut w = window(2, NullKeys::Ordered, 0);
    w.admit(0, Some(b"a")).unwrap();
    assert!(w.admit(0, Some(b"b")).unwrap_err().to_string().contains("offsets must increase"));
    w.admit(1, Some(b"a")).unwrap();
    assert_eq!(w.room(), 0);
    assert!(w.admit(2, None).unwrap_err().to_string().contains("full window"));
    assert!(w.finish(0).unwrap_err().to_string().contains("not running"));
    assert!(w.start_ready().eq([0]));
    assert!(w.finish(1).is_err(), "1 waits behind 0, same key");
    assert_eq!(w.finish(0).unwrap(), Some(1));
    assert!(w.finish(0).is_err(), "finished twice");
    assert_eq!(w.room(), 1);
    for bad in [0, WindowConfig::MAX_IN_FLIGHT + 1] {
        assert!(WindowConfig::new(bad, NullKeys::Ordered).is_err(), "{bad}");
    }
}

#[test]
fn records_handled_above_an_unfinished_one_hold_no_place_in_handling() {
    let config = WindowConfig::new(2, NullKeys::Ordered).unwrap().with_max_uncommitted(4).unwrap();
    let mut w = InFlightWindow::new(config, 0);
    w.admit(0, Some(b"a")).unwrap();
    w.admit(1, Some(b"b")).unwrap();
    assert_eq!(w.room(), 0, "two in handling, the most");
    assert!(w.start_ready().eq([0, 1]));
    w.release(0).unwrap();
    assert_eq!((w.in_handling(), w.room()), (1, 1), "0 awaits its acknowledgement: its place is free");
    assert_eq!(w.finish(1).unwrap(), None, "0 holds the position");
    assert_eq!((w.in_handling(), w.room()), (0, 2));
    w.admit(2, Some(b"c")).unwrap();
    w.admit(3, Some(b"d")).unwrap();
    assert!(w.start_ready().eq([2, 3]));
    assert_eq!(w.finish(2).unwrap(), None);
    assert_eq!(w.finish(3).unwrap(), None);
    assert_eq!((w.in_handling(), w.len(), w.room()), (0, 4, 0), "four above the position, the most");
    assert_eq!(w.finish(0).unwrap(), Some(4), "acknowledged: the position passes everything done");
    assert_eq!((w.len(), w.room()), (0, 2));
    assert!(config.with_max_uncommitted(1).is_err(), "fewer than in handling");
    assert!(config.with_max_uncommitted(WindowConfig::MAX_UNCOMMITTED + 1).is_err());
}

#[test]
fn an_empty_window_commits_past_skipped_offsets() {
    let mut w = window(4, NullKeys::Ordered, 100);
    assert_eq!(w.commit_position(), 100);
    assert_eq!(w.skip_to(104), Some(104));
    assert_eq!(w.commit_position(), 104);
    w.admit(104, None).unwrap();
    assert_eq!(w.skip_to(110), None);
    assert_eq!(w.commit_position(), 104, "the unfinished record holds the position");
    w.start_ready().for_each(drop);
    assert_eq!(w.finish(104).unwrap(), Some(110));
}

proptest! {
    /// For any keys and any order of completions: a key never has two
    /// records running, each key's records start in offset order, every
    /// record runs exactly once, the window never has more records in
    /// handling, nor holds more in all, than it may, and the commit position
    /// never passes an unfinished record.
    #[test]
    fn any_interleaving_keeps_key_order_and_a_safe_position(
        keys in proptest::collection::vec(proptest::option::weighted(0.8, 0u8..5), 1..120),
        gaps in proptest::collection::vec(1i64..3, 120),
        picks in proptest::collection::vec(any::<prop::sample::Index>(), 400),
        max_in_flight in 1usize..12,
        more_uncommitted in 0usize..12,
        unordered in any::<bool>(),
    ) {
        let null_keys = if unordered { NullKeys::Unordered } else { NullKeys::Ordered };
        let mut offsets = Vec::new();
        let mut offset = 7;
        for gap in gaps.iter().take(keys.len()) {
            offsets.push(offset);
            offset += gap;
        }
        let max_uncommitted = max_in_flight + more_uncommitted;
        let config = WindowConfig::new(max_in_flight, null_keys).unwrap().with_max_uncommitted(max_uncommitted).unwrap();
        let mut w = InFlightWindow::new(config, offsets[0]);
        let mut next = 0; // next record to admit
        let mut running: BTreeSet<i64> = BTreeSet::new();
        let mut finished: BTreeSet<i64> = BTreeSet::new();
        // Handled and going to a retry topic, awaiting the acknowledgement.
        let mut released: Vec<i64> = Vec::new();
        let mut started_per_key: BTreeMap<Option<u8>, Vec<i64>> = BTreeMap::new();
        let key_of: BTreeMap<i64, Option<u8>> = offsets.iter().copied().zip(keys.iter().copied()).collect();
        let mut picks = picks.into_iter();
        while finished.len() < offsets.len() {
            while next < offsets.len() && w.room() > 0 {
                let key = keys[next].map(|k| vec![k]);
                w.admit(offsets[next], key.as_deref()).unwrap();
                next += 1;
            }
            prop_assert!(w.in_handling() <= max_in_flight);
            prop_assert!(w.len() <= max_uncommitted);
            for o in w.start_ready().collect::<Vec<_>>() {
                let key = key_of[&o];
                if key.is_some() || !unordered {
                    prop_assert!(
                        !running.iter().any(|r| key_of[r] == key),
                        "two records of key {:?} running at once", key
                    );
                    if let Some(previous) = started_per_key.get(&key).and_then(|v| v.last()) {
                        prop_assert!(*previous < o, "key {:?}: {} started after {}", key, o, previous);
                        prop_assert!(finished.contains(previous) || released.contains(previous));
                    }
                }
                prop_assert!(running.insert(o), "{} started twice", o);
                started_per_key.entry(key).or_default().push(o);
            }
            if running.is_empty() {
                let acked = released.pop();
                prop_assert!(acked.is_some(), "nothing runs and nothing awaits an acknowledgement: a stall");
                let acked = acked.unwrap();
                finished.insert(acked);
                w.finish(acked).unwrap();
                continue;
            }
            let chosen = match picks.next() {
                Some(index) => *index.get(&running.iter().copied().collect::<Vec<_>>()),
                None => *running.iter().next().unwrap(),
            };
            running.remove(&chosen);
            if chosen % 3 == 0 {
                w.release(chosen).unwrap();
                released.push(chosen);
            } else {
                finished.insert(chosen);
                w.finish(chosen).unwrap();
            }
            if released.len() > 2 {
                let acked = released.remove(0);
                finished.insert(acked);
                w.finish(acked).unwrap();
            }
            let position = w.commit_position();
            let lowest_unfinished = offsets.iter().copied().find(|o| !finished.contains(o));
            match lowest_unfinished {
                Some(lowest) => prop_assert!(position <= lowest, "position {} passes unfinished {}", position, lowest),
                None => prop_assert_eq!(position, *offsets.last().unwrap() + 1),
            }
            // Everything below the position is finished.
            prop_assert!(offsets.iter().filter(|o| **o < position).all(|o| finished.contains(o)));
        }
        prop_assert!(w.is_empty());
    }
}
