//! An operators' pause of a listener: every instance of the listener's
//! group stops running records until a time, then goes on by itself.
//!
//! The pause is kept where every instance can read it without a topic of
//! its own: as the offset the pause group ([`LadderGroups::pause`]) commits
//! on partition 0 of the source topic, the end of the pause in milliseconds
//! since the epoch, with who paused and why in the commit's metadata
//! (brokers that drop metadata still keep the pause). A resume commits
//! [`RESUMED`]. Each instance polls it; records that wait keep their place,
//! and the group's members keep heartbeating, so a pause rebalances nothing.
//!
//! [`LadderGroups::pause`]: crate::groups::LadderGroups::pause
//!
//! ```
//! use std::time::Duration;
//! use retry_core::{pause::ListenerPause, Timestamp};
//!
//! let now = Timestamp::from_millis(1_000_000);
//! let pause = ListenerPause::new(now, Duration::from_secs(600), "ana", "provider maintenance").unwrap();
//! assert_eq!(pause.committed_offset(), 1_600_000);
//! // What another instance reads back from the group.
//! let read = ListenerPause::read(Some(1_600_000), Some(&pause.metadata())).unwrap();
//! assert_eq!((read.by.as_str(), read.reason.as_str()), ("ana", "provider maintenance"));
//! assert!(read.holds_at(now) && !read.holds_at(Timestamp::from_millis(1_600_000)));
//! // Resumed, or never paused.
//! assert_eq!(ListenerPause::read(Some(0), None), None);
//! assert_eq!(ListenerPause::read(None, None), None);
//! ```

use std::time::Duration;

use crate::Timestamp;

/// The shortest pause.
pub const MIN_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause: a week. A forgotten pause ends by itself.
pub const MAX_PAUSE: Duration = Duration::from_secs(7 * 24 * 3600);
/// The most bytes of who paused, and of why, kept with the pause.
pub const MAX_PAUSE_TEXT_BYTES: usize = 200;
/// The offset a resume commits: no pause.
pub const RESUMED: i64 = 0;

const BY: &str = "paused-by:";
const REASON: &str = "\nreason:";

/// A pause of a listener, as its group keeps it.
///
/// ```
/// use std::time::Duration;
/// use retry_core::{pause::ListenerPause, Timestamp};
///
/// let pause = ListenerPause::new(Timestamp::from_millis(0), Duration::from_secs(60), "10.0.0.7:51234", "").unwrap();
/// assert_eq!((pause.until.as_millis(), pause.by.as_str()), (60_000, "10.0.0.7:51234"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerPause {
    /// When records run again.
    pub until: Timestamp,
    /// Who paused (the operator's name, or their address); empty when the
    /// broker kept no metadata.
    pub by: String,
    /// Why, as the operator said; may be empty.
    pub reason: String,
}

/// Why a pause was refused.
///
/// ```
/// use std::time::Duration;
/// use retry_core::{pause::{ListenerPause, PauseRefused}, Timestamp};
///
/// let refused = ListenerPause::new(Timestamp::from_millis(0), Duration::from_secs(8 * 24 * 3600), "ana", "");
/// assert_eq!(refused, Err(PauseRefused::Duration(Duration::from_secs(8 * 24 * 3600))));
/// assert_eq!(refused.unwrap_err().to_string(), "a pause lasts from 1s to 7 days (168h), not 691200s");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PauseRefused {
    /// Shorter than [`MIN_PAUSE`] or longer than [`MAX_PAUSE`].
    #[error("a pause lasts from 1s to 7 days (168h), not {0:?}")]
    Duration(Duration),
}

impl ListenerPause {
    /// A pause from `now` for `duration`, by `by`, for `reason` (each cut
    /// to [`MAX_PAUSE_TEXT_BYTES`], control characters replaced).
    pub fn new(now: Timestamp, duration: Duration, by: &str, reason: &str) -> Result<Self, PauseRefused> {
        if !(MIN_PAUSE..=MAX_PAUSE).contains(&duration) {
            return Err(PauseRefused::Duration(duration));
        }
        Ok(ListenerPause { until: now.saturating_add(duration), by: clean(by), reason: clean(reason) })
    }

    /// The offset the pause group commits: the end of the pause.
    pub fn committed_offset(&self) -> i64 {
        self.until.as_millis()
    }

    /// The commit's metadata: who paused, and why.
    pub fn metadata(&self) -> String {
        format!("{BY}{}{REASON}{}", self.by, self.reason)
    }

    /// The pause the group committed (`offset`, `metadata`), if any: none
    /// when nothing was committed or a resume was. Metadata that is not a
    /// pause's (absent, dropped by the broker, written by hand) leaves who
    /// and why empty; the pause holds all the same.
    pub fn read(offset: Option<i64>, metadata: Option<&str>) -> Option<ListenerPause> {
        let until = offset.filter(|o| *o > RESUMED)?;
        let (by, reason) = metadata
            .and_then(|m| m.strip_prefix(BY))
            .and_then(|m| m.split_once(REASON))
            .map(|(by, reason)| (clean(by), clean(reason)))
            .unwrap_or_default();
        Some(ListenerPause { until: Timestamp::from_millis(until), by, reason })
    }

    /// Whether records wait at `now`.
    pub fn holds_at(&self, now: Timestamp) -> bool {
        now < self.until
    }
}

/// `text` cut to [`MAX_PAUSE_TEXT_BYTES`] on a character boundary, its
/// control characters (the metadata's separator among them) as spaces.
fn clean(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if out.len() + c.len_utf8() > MAX_PAUSE_TEXT_BYTES {
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_new(duration: Duration, by: &str, reason: &str, expected: Result<(i64, &str, &str), PauseRefused>) {
        let got = ListenerPause::new(Timestamp::from_millis(10_000), duration, by, reason);
        let got = got.as_ref().map(|p| (p.committed_offset(), p.by.as_str(), p.reason.as_str())).map_err(Clone::clone);
        assert_eq!(got, expected, "{duration:?} {by:?} {reason:?}");
    }

    #[test]
    fn pauses_are_bounded_and_their_texts_cleaned() {
        let s = Duration::from_secs;
        check_new(s(1), "ana", "", Ok((11_000, "ana", "")));
        check_new(MAX_PAUSE, "ana", "why", Ok((10_000 + 604_800_000, "ana", "why")));
        check_new(Duration::from_millis(999), "ana", "", Err(PauseRefused::Duration(Duration::from_millis(999))));
        check_new(MAX_PAUSE + s(1), "ana", "", Err(PauseRefused::Duration(MAX_PAUSE + s(1))));
        // The separator cannot be forged from a reason or a name.
        check_new(s(5), "ana\nreason:x", "a\nb\tc", Ok((15_000, "ana reason:x", "a b c")));
        let long = "é".repeat(150);
        let cut = ListenerPause::new(Timestamp::from_millis(0), s(5), &long, &long).unwrap();
        assert_eq!((cut.by.len(), cut.reason.len()), (200, 200));
    }

    fn check_read(offset: Option<i64>, metadata: Option<&str>, expected: Option<(i64, &str, &str)>) {
        let got = ListenerPause::read(offset, metadata);
        let got = got.as_ref().map(|p| (p.until.as_millis(), p.by.as_str(), p.reason.as_str()));
        assert_eq!(got, expected, "{offset:?} {metadata:?}");
    }

    #[test]
    fn what_the_group_committed_reads_as_a_pause_or_none() {
        check_read(None, None, None);
        check_read(Some(RESUMED), Some("paused-by:ana\nreason:x"), None);
        check_read(Some(-1), None, None);
        check_read(Some(5_000), Some("paused-by:ana\nreason:maintenance"), Some((5_000, "ana", "maintenance")));
        check_read(Some(5_000), Some("paused-by:ana\nreason:"), Some((5_000, "ana", "")));
        // Dropped or foreign metadata: the pause holds, unattributed.
        check_read(Some(5_000), None, Some((5_000, "", "")));
        check_read(Some(5_000), Some(""), Some((5_000, "", "")));
        check_read(Some(5_000), Some("handled-above:3"), Some((5_000, "", "")));
    }

    #[test]
    fn a_pause_holds_until_its_end() {
        let pause = ListenerPause::read(Some(5_000), None).unwrap();
        for (now, holds) in [(0, true), (4_999, true), (5_000, false), (i64::MAX, false)] {
            assert_eq!(pause.holds_at(Timestamp::from_millis(now)), holds, "{now}");
        }
    }
}
