//! The in-flight window of one partition: which fetched records may be
//! handled now, and how far the partition may be committed.
//!
//! Up to `max_in_flight` records are in handling at once (waiting for an
//! earlier record of their key, or running). Records with the same key are
//! handled one after another in offset order; records with different keys
//! concurrently. Records without a key are ordered among themselves, or not
//! at all ([`NullKeys`]). The commit position is the lowest offset whose
//! record is not done: nothing above an unfinished record is ever
//! committed. Records handled above one that is not done yet (still
//! running, or handled and awaiting its republication's acknowledgement)
//! stay in the window without holding a place in handling, up to
//! `max_uncommitted` records in all, so a crash redelivers at most that
//! many (besides what finished since the last commit), and a slow broker
//! acknowledgement or a slow call does not stop the records around it.
//!
//! Pure bookkeeping: the caller fetches, starts handlers for what
//! [`InFlightWindow::start_ready`] returns, and reports each record's end
//! with [`InFlightWindow::finish`].

use std::{
    collections::{HashMap, VecDeque},
    hash::{BuildHasher, BuildHasherDefault, RandomState},
};

use crate::{Error, Result};

/// How records without a key are ordered.
///
/// ```
/// use retry_core::{window::InFlightWindow, window::NullKeys, window::WindowConfig};
///
/// for (null_keys, ready) in [(NullKeys::Ordered, vec![0]), (NullKeys::Unordered, vec![0, 1])] {
///     let mut window = InFlightWindow::new(WindowConfig::new(8, null_keys).unwrap(), 0);
///     window.admit(0, None).unwrap();
///     window.admit(1, None).unwrap();
///     assert_eq!(window.start_ready().collect::<Vec<_>>(), ready, "{null_keys:?}");
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

/// The window's settings; [`WindowConfig::new`] and
/// [`WindowConfig::with_max_uncommitted`] check them.
///
/// ```
/// use retry_core::{window::NullKeys, window::WindowConfig};
///
/// let config = WindowConfig::new(16, NullKeys::Unordered).unwrap();
/// assert_eq!((config.max_in_flight(), config.null_keys()), (16, NullKeys::Unordered));
/// assert_eq!(config.max_uncommitted(), WindowConfig::DEFAULT_MAX_UNCOMMITTED);
/// assert_eq!(config.with_max_uncommitted(100).unwrap().max_uncommitted(), 100);
/// assert_eq!(WindowConfig::default().max_in_flight(), 64);
/// assert!(WindowConfig::new(0, NullKeys::Ordered).is_err());
/// assert!(WindowConfig::new(WindowConfig::MAX_IN_FLIGHT + 1, NullKeys::Ordered).is_err());
/// // Fewer records uncommitted than in handling cannot be.
/// assert!(config.with_max_uncommitted(15).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowConfig {
    max_in_flight: usize,
    null_keys: NullKeys,
    max_uncommitted: usize,
}

impl WindowConfig {
    /// The largest window accepted: more records than this in memory per
    /// partition is a configuration mistake, not a throughput setting.
    pub const MAX_IN_FLIGHT: usize = 10_000;

    /// How many records the window holds at most unless told otherwise
    /// (or `max_in_flight`, if more): enough for a partition that handles
    /// records in microseconds to go on while the broker acknowledges a
    /// republication, few enough that a crash redelivers seconds of work
    /// at most.
    pub const DEFAULT_MAX_UNCOMMITTED: usize = 4_096;

    /// The most records a window may be told to hold.
    pub const MAX_UNCOMMITTED: usize = 100_000;

    /// `max_in_flight` records in handling at most (1 is the sequential
    /// consumer), [`DEFAULT_MAX_UNCOMMITTED`](Self::DEFAULT_MAX_UNCOMMITTED)
    /// records in the window at most (or `max_in_flight`, if more).
    pub fn new(max_in_flight: usize, null_keys: NullKeys) -> Result<Self> {
        if !(1..=Self::MAX_IN_FLIGHT).contains(&max_in_flight) {
            return Err(Error::InvalidWindow(format!(
                "max in flight is {max_in_flight}: expected 1 to {} (1 handles one record at a time)",
                Self::MAX_IN_FLIGHT
            )));
        }
        let max_uncommitted = Self::DEFAULT_MAX_UNCOMMITTED.max(max_in_flight);
        Ok(WindowConfig { max_in_flight, null_keys, max_uncommitted })
    }

    /// The same, holding at most `max_uncommitted` records from the commit
    /// position on: in handling, or handled above a record not done yet.
    pub fn with_max_uncommitted(self, max_uncommitted: usize) -> Result<Self> {
        if !(self.max_in_flight..=Self::MAX_UNCOMMITTED).contains(&max_uncommitted) {
            return Err(Error::InvalidWindow(format!(
                "max uncommitted is {max_uncommitted}: expected {} (max in flight) to {}",
                self.max_in_flight,
                Self::MAX_UNCOMMITTED
            )));
        }
        Ok(WindowConfig { max_uncommitted, ..self })
    }

    /// How many records may be in handling at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// How many records the window holds at most: a crash redelivers at
    /// most these (besides what finished since the last commit).
    pub fn max_uncommitted(&self) -> usize {
        self.max_uncommitted
    }

    /// How records without a key are ordered.
    pub fn null_keys(&self) -> NullKeys {
        self.null_keys
    }
}

impl Default for WindowConfig {
    /// 64 records in handling, records without a key in order,
    /// [`DEFAULT_MAX_UNCOMMITTED`](Self::DEFAULT_MAX_UNCOMMITTED) in all.
    fn default() -> Self {
        WindowConfig { max_in_flight: 64, null_keys: NullKeys::Ordered, max_uncommitted: Self::DEFAULT_MAX_UNCOMMITTED }
    }
}

/// A lane's identity: a keyed hash of the record's key (`None` for the
/// shared null-key lane). Two different keys whose hashes collide share a
/// lane: they are handled one after another instead of concurrently, each
/// still in its own offset order (a chance of one in 2^64 per pair, and
/// not predictable from outside: the hash key is random per window).
type LaneId = u64;

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
    offset: i64,
    /// Its lane, or none (unordered null keys).
    lane: Option<LaneId>,
    state: State,
    /// The next record of its lane, once admitted.
    next_in_lane: Option<i64>,
}

/// Hashes lane identities, which are already keyed hashes, as they are.
#[derive(Default)]
struct Identity(u64);

impl std::hash::Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64s are hashed; fold anything else all the same.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// One partition's window (see the module documentation).
///
/// Admitting, starting and finishing a record allocate nothing once the
/// window has held `max_in_flight` records: its state is a ring of
/// entries in offset order, each lane a chain through them.
///
/// ```
/// use retry_core::{window::InFlightWindow, window::WindowConfig};
///
/// let mut window = InFlightWindow::new(WindowConfig::default(), 100);
/// for (offset, key) in [(100, "a"), (101, "a"), (102, "b")] {
///     window.admit(offset, Some(key.as_bytes())).unwrap();
/// }
/// // 101 waits behind 100, which has the same key; 102 has a key of its own.
/// assert!(window.start_ready().eq([100, 102]));
/// // 100 goes to a retry topic: its key is free at once, but the partition is
/// // committed past it only once the broker acknowledges the republication.
/// window.release(100).unwrap();
/// assert!(window.start_ready().eq([101]));
/// assert_eq!(window.finish(102).unwrap(), None);
/// assert_eq!(window.finish(100).unwrap(), Some(101));
/// assert_eq!(window.finish(101).unwrap(), Some(103));
/// ```
pub struct InFlightWindow {
    config: WindowConfig,
    /// Records admitted and not yet passed by the commit position, in
    /// offset order.
    entries: VecDeque<Entry>,
    /// Per lane with waiting or running records, the offset of its last
    /// one; its first one (the only one that may run) is the lowest entry
    /// of the lane not released or done.
    lanes: HashMap<LaneId, i64, BuildHasherDefault<Identity>>,
    /// Keys the lane identities.
    hasher: RandomState,
    /// Waiting records that may start: first of their lane, or of none.
    /// Kept as records come and go, so starting costs what starts, not the
    /// whole window.
    ready: Vec<i64>,
    /// How many records are waiting or running.
    in_handling: usize,
    /// The next offset expected, and the commit position when the window is empty.
    next_offset: i64,
}

impl std::fmt::Debug for InFlightWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlightWindow")
            .field("config", &self.config)
            .field("entries", &self.entries)
            .field("ready", &self.ready)
            .field("next_offset", &self.next_offset)
            .finish_non_exhaustive()
    }
}

impl InFlightWindow {
    /// An empty window whose first record will be at `start` (the position
    /// the partition resumes from).
    pub fn new(config: WindowConfig, start: i64) -> Self {
        InFlightWindow {
            config,
            entries: VecDeque::with_capacity(config.max_in_flight.min(1024)),
            lanes: HashMap::default(),
            hasher: RandomState::new(),
            ready: Vec::new(),
            in_handling: 0,
            next_offset: start,
        }
    }

    /// How many more records it takes now: as many as fit in handling and
    /// in the window.
    pub fn room(&self) -> usize {
        let handling = self.config.max_in_flight - self.in_handling;
        handling.min(self.config.max_uncommitted - self.entries.len())
    }

    /// Whether no record is in it.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How many records are in it (waiting, running, awaiting their
    /// republication's acknowledgement, or done above an unfinished one).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// How many records are in handling: waiting for their key, or running.
    pub fn in_handling(&self) -> usize {
        self.in_handling
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
            (None, NullKeys::Unordered) => None,
            (key, _) => Some(self.hasher.hash_one(key)),
        };
        let first = match lane {
            None => true,
            Some(lane) => match self.lanes.insert(lane, offset) {
                None => true,
                Some(last) => {
                    let index = self.index_of(last).expect("a lane's last record is in the window");
                    self.entries[index].next_in_lane = Some(offset);
                    false
                }
            },
        };
        if first {
            self.ready.push(offset);
        }
        self.entries.push_back(Entry { offset, lane, state: State::Waiting, next_in_lane: None });
        self.in_handling += 1;
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
    pub fn start_ready(&mut self) -> std::vec::Drain<'_, i64> {
        self.ready.sort_unstable();
        for offset in &self.ready {
            let index = index_in(&self.entries, *offset).expect("a ready record is in the window");
            self.entries[index].state = State::Running;
        }
        self.ready.drain(..)
    }

    /// Records that the record at `offset` was handled but is not done yet
    /// (it goes to a retry topic, which has not acknowledged it): the next
    /// record of its key may start, the commit position stays below it.
    /// A failed key does not hold up its later records: that is the point
    /// of retrying through topics.
    pub fn release(&mut self, offset: i64) -> Result<()> {
        let index = self
            .index_of(offset)
            .filter(|i| self.entries[*i].state == State::Running)
            .ok_or_else(|| Error::InvalidWindow(format!("record at offset {offset} released but it is not running")))?;
        self.entries[index].state = State::Released;
        self.in_handling -= 1;
        self.free_lane(index);
        Ok(())
    }

    /// Records that the record at `offset` is done (handled, or its
    /// republication acknowledged); returns the commit position when it
    /// moved. A record neither running nor released is an error: the
    /// caller lost track.
    pub fn finish(&mut self, offset: i64) -> Result<Option<i64>> {
        let before = self.commit_position();
        let index = self
            .index_of(offset)
            .filter(|i| matches!(self.entries[*i].state, State::Running | State::Released))
            .ok_or_else(|| Error::InvalidWindow(format!("record at offset {offset} finished but it is not running")))?;
        if self.entries[index].state == State::Running {
            self.in_handling -= 1;
            self.free_lane(index);
        }
        self.entries[index].state = State::Done;
        while self.entries.front().is_some_and(|e| e.state == State::Done) {
            self.entries.pop_front();
        }
        let after = self.commit_position();
        Ok((after != before).then_some(after))
    }

    /// The offset to commit: the lowest record not done, or after the
    /// last record admitted when all are done.
    pub fn commit_position(&self) -> i64 {
        self.entries.front().map_or(self.next_offset, |e| e.offset)
    }

    /// Where the record at `offset` is in `entries`.
    fn index_of(&self, offset: i64) -> Option<usize> {
        index_in(&self.entries, offset)
    }

    /// Lets the next record of the lane of the entry at `index` start.
    fn free_lane(&mut self, index: usize) {
        let entry = &self.entries[index];
        let Some(lane) = entry.lane else { return };
        match entry.next_in_lane {
            Some(next) => self.ready.push(next),
            None => {
                let last = self.lanes.remove(&lane);
                debug_assert_eq!(last, Some(entry.offset), "a lane ends at its last record");
            }
        }
    }
}

/// Where the record at `offset` is in `entries` (in offset order): at its
/// distance from the first when no offset between was skipped, else found
/// by halves.
fn index_in(entries: &VecDeque<Entry>, offset: i64) -> Option<usize> {
    let first = entries.front()?.offset;
    let guess = usize::try_from(offset.checked_sub(first)?).ok()?;
    if entries.get(guess).is_some_and(|e| e.offset == offset) {
        return Some(guess);
    }
    entries.binary_search_by_key(&offset, |e| e.offset).ok()
}

#[cfg(test)]
mod tests;
