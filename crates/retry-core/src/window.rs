//! The in-flight window of one partition: which fetched records may be
//! handled now, and how far the partition may be committed.
//!
//! Up to `max_in_flight` records are in the window at once. Records with the
//! same key are handled one after another in offset order; records with
//! different keys concurrently. Records without a key are ordered among
//! themselves, or not at all ([`NullKeys`]). The commit position is the
//! lowest offset whose record is not done: nothing above an unfinished
//! record is ever committed, so a crash redelivers at most the window.
//!
//! Pure bookkeeping: the caller fetches, starts handlers for what
//! [`InFlightWindow::start_ready`] returns, and reports each record's end
//! with [`InFlightWindow::finish`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::{Error, Result};

/// How records without a key are ordered.
///
/// ```
/// use retry_core::{InFlightWindow, NullKeys, WindowConfig};
///
/// for (null_keys, ready) in [(NullKeys::Ordered, vec![0]), (NullKeys::Unordered, vec![0, 1])] {
///     let mut window = InFlightWindow::new(WindowConfig::new(8, null_keys).unwrap(), 0);
///     window.admit(0, None).unwrap();
///     window.admit(1, None).unwrap();
///     assert_eq!(window.start_ready(), ready, "{null_keys:?}");
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NullKeys {
    /// One after another in offset order, as if they shared a key.
    #[default]
    Ordered,
    /// Concurrently, in any order.
    Unordered,
}

/// The window's settings; [`WindowConfig::new`] checks them.
///
/// ```
/// use retry_core::{NullKeys, WindowConfig};
///
/// let config = WindowConfig::new(16, NullKeys::Unordered).unwrap();
/// assert_eq!((config.max_in_flight(), config.null_keys()), (16, NullKeys::Unordered));
/// assert_eq!(WindowConfig::default().max_in_flight(), 64);
/// assert!(WindowConfig::new(0, NullKeys::Ordered).is_err());
/// assert!(WindowConfig::new(WindowConfig::MAX_IN_FLIGHT + 1, NullKeys::Ordered).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowConfig {
    max_in_flight: usize,
    null_keys: NullKeys,
}

impl WindowConfig {
    /// The largest window accepted: more records than this in memory per
    /// partition is a configuration mistake, not a throughput setting.
    pub const MAX_IN_FLIGHT: usize = 10_000;

    /// `max_in_flight` records at most (1 is the sequential consumer).
    pub fn new(max_in_flight: usize, null_keys: NullKeys) -> Result<Self> {
        if !(1..=Self::MAX_IN_FLIGHT).contains(&max_in_flight) {
            return Err(Error::InvalidWindow(format!(
                "max in flight is {max_in_flight}: expected 1 to {} (1 handles one record at a time)",
                Self::MAX_IN_FLIGHT
            )));
        }
        Ok(WindowConfig { max_in_flight, null_keys })
    }

    /// How many records may be in the window at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// How records without a key are ordered.
    pub fn null_keys(&self) -> NullKeys {
        self.null_keys
    }
}

impl Default for WindowConfig {
    /// 64 records, records without a key in order.
    fn default() -> Self {
        WindowConfig { max_in_flight: 64, null_keys: NullKeys::Ordered }
    }
}

/// The ordering group of a record: its key, the shared null-key group, or
/// none (unordered null keys).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Lane {
    Key(Vec<u8>),
    NullKey,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    Running,
    /// Handled, its key free for the next record, but not done: its
    /// republication awaits the broker's acknowledgement.
    Released,
    Done,
}

#[derive(Debug)]
struct Entry {
    lane: Option<Lane>,
    state: State,
}

/// One partition's window (see the module documentation).
///
/// ```
/// use retry_core::{InFlightWindow, WindowConfig};
///
/// let mut window = InFlightWindow::new(WindowConfig::default(), 100);
/// for (offset, key) in [(100, "a"), (101, "a"), (102, "b")] {
///     window.admit(offset, Some(key.as_bytes())).unwrap();
/// }
/// // 101 waits behind 100, which has the same key; 102 has a key of its own.
/// assert_eq!(window.start_ready(), [100, 102]);
/// // 100 goes to a retry topic: its key is free at once, but the partition is
/// // committed past it only once the broker acknowledges the republication.
/// window.release(100).unwrap();
/// assert_eq!(window.start_ready(), [101]);
/// assert_eq!(window.finish(102).unwrap(), None);
/// assert_eq!(window.finish(100).unwrap(), Some(101));
/// assert_eq!(window.finish(101).unwrap(), Some(103));
/// ```
#[derive(Debug)]
pub struct InFlightWindow {
    config: WindowConfig,
    /// Records admitted and not yet passed by the commit position.
    entries: BTreeMap<i64, Entry>,
    /// Per lane, its waiting and running records in offset order; the
    /// first one is the only one that may run.
    lanes: HashMap<Lane, VecDeque<i64>>,
    /// Waiting records that may start: first of their lane, or of none.
    /// Kept as records come and go, so starting costs what starts, not the
    /// whole window.
    ready: BTreeSet<i64>,
    /// The next offset expected, and the commit position when the window is empty.
    next_offset: i64,
}

impl InFlightWindow {
    /// An empty window whose first record will be at `start` (the position
    /// the partition resumes from).
    pub fn new(config: WindowConfig, start: i64) -> Self {
        InFlightWindow {
            config,
            entries: BTreeMap::new(),
            lanes: HashMap::new(),
            ready: BTreeSet::new(),
            next_offset: start,
        }
    }

    /// How many more records it takes now.
    pub fn room(&self) -> usize {
        self.config.max_in_flight - self.entries.len()
    }

    /// Whether no record is in it.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many records are in it (waiting, running or done above an unfinished one).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Takes the record at `offset` with `key`. Offsets must increase (gaps
    /// are fine: compacted or transactional logs skip offsets); the window
    /// must have room.
    pub fn admit(&mut self, offset: i64, key: Option<&[u8]>) -> Result<()> {
        if self.room() == 0 {
            return Err(Error::InvalidWindow(format!("record at offset {offset} admitted to a full window")));
        }
        if offset < self.next_offset {
            return Err(Error::InvalidWindow(format!(
                "record at offset {offset} admitted after offset {} (offsets must increase)",
                self.next_offset - 1
            )));
        }
        let lane = match (key, self.config.null_keys) {
            (Some(key), _) => Some(Lane::Key(key.to_vec())),
            (None, NullKeys::Ordered) => Some(Lane::NullKey),
            (None, NullKeys::Unordered) => None,
        };
        let first = match &lane {
            Some(lane) => {
                let queue = self.lanes.entry(lane.clone()).or_default();
                queue.push_back(offset);
                queue.len() == 1
            }
            None => true,
        };
        if first {
            self.ready.insert(offset);
        }
        self.entries.insert(offset, Entry { lane, state: State::Waiting });
        self.next_offset = offset + 1;
        Ok(())
    }

    /// Notes that the log holds nothing to handle before `offset` (a fetch
    /// ended past control records or compacted-away offsets), so once
    /// everything admitted is done the partition may be committed there.
    /// Returns the commit position when it moved.
    pub fn skip_to(&mut self, offset: i64) -> Option<i64> {
        let before = self.commit_position();
        self.next_offset = self.next_offset.max(offset);
        let after = self.commit_position();
        (after != before).then_some(after)
    }

    /// Its settings.
    pub fn config(&self) -> &WindowConfig {
        &self.config
    }

    /// The records that may start now, lowest offset first, marked running:
    /// those waiting with no earlier unfinished record of their key.
    pub fn start_ready(&mut self) -> Vec<i64> {
        let ready: Vec<i64> = std::mem::take(&mut self.ready).into_iter().collect();
        for offset in &ready {
            if let Some(entry) = self.entries.get_mut(offset) {
                entry.state = State::Running;
            }
        }
        ready
    }

    /// Records that the record at `offset` was handled but is not done yet
    /// (it goes to a retry topic, which has not acknowledged it): the next
    /// record of its key may start, the commit position stays below it.
    /// A failed key does not hold up its later records: that is the point
    /// of retrying through topics.
    pub fn release(&mut self, offset: i64) -> Result<()> {
        let entry =
            self.entries.get_mut(&offset).filter(|e| e.state == State::Running).ok_or_else(|| {
                Error::InvalidWindow(format!("record at offset {offset} released but it is not running"))
            })?;
        entry.state = State::Released;
        free_lane(&mut self.lanes, &mut self.ready, entry, offset);
        Ok(())
    }

    /// Records that the record at `offset` is done (handled, or its
    /// republication acknowledged); returns the commit position when it
    /// moved. A record neither running nor released is an error: the
    /// caller lost track.
    pub fn finish(&mut self, offset: i64) -> Result<Option<i64>> {
        let before = self.commit_position();
        let entry =
            self.entries.get_mut(&offset).filter(|e| matches!(e.state, State::Running | State::Released)).ok_or_else(
                || Error::InvalidWindow(format!("record at offset {offset} finished but it is not running")),
            )?;
        if entry.state == State::Running {
            free_lane(&mut self.lanes, &mut self.ready, entry, offset);
        }
        entry.state = State::Done;
        while let Some(entry) = self.entries.first_entry() {
            if entry.get().state != State::Done {
                break;
            }
            entry.remove();
        }
        let after = self.commit_position();
        Ok((after != before).then_some(after))
    }

    /// The offset to commit: the lowest record not done, or after the
    /// last record admitted when all are done.
    pub fn commit_position(&self) -> i64 {
        self.entries.first_key_value().map_or(self.next_offset, |(offset, _)| *offset)
    }
}

/// Lets the next record of `entry`'s lane start.
fn free_lane(lanes: &mut HashMap<Lane, VecDeque<i64>>, ready: &mut BTreeSet<i64>, entry: &Entry, offset: i64) {
    if let Some(lane) = &entry.lane {
        let queue = lanes.get_mut(lane).expect("a running record's lane exists");
        debug_assert_eq!(queue.front(), Some(&offset), "only a lane's first record runs");
        queue.pop_front();
        match queue.front() {
            Some(next) => {
                ready.insert(*next);
            }
            None => {
                lanes.remove(lane);
            }
        }
    }
}

#[cfg(test)]
mod tests;
