use std::time::Duration;

/// A point in time as Kafka sees it: milliseconds since the Unix epoch.
///
/// `retry-core` never reads a clock; callers pass `now` as a `Timestamp`.
/// Arithmetic saturates, so a hostile header can never overflow it.
///
/// ```
/// use std::time::Duration;
/// use retry_core::Timestamp;
///
/// let now = Timestamp::from_millis(1_000);
/// let due = now.saturating_add(Duration::from_secs(5));
/// assert_eq!((due.as_millis(), now.until(due)), (6_000, Duration::from_secs(5)));
/// // Already due: no wait.
/// assert_eq!(due.until(now), Duration::ZERO);
/// // A hostile `x-retry-due-at` cannot overflow it.
/// assert_eq!(Timestamp::from_millis(i64::MAX).saturating_add(Duration::MAX).as_millis(), i64::MAX);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    /// A timestamp from milliseconds since the Unix epoch.
    pub const fn from_millis(millis: i64) -> Self {
        Timestamp(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// `self + d`, saturating at the representable maximum.
    pub fn saturating_add(self, d: Duration) -> Self {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_add(ms))
    }

    /// How long from `self` until `later`; zero when `later` is not after `self`.
    pub fn until(self, later: Timestamp) -> Duration {
        let ms = later.0.saturating_sub(self.0);
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    }
}

impl From<std::time::SystemTime> for Timestamp {
    /// Converts a wall-clock reading; times before the epoch become the epoch.
    fn from(t: std::time::SystemTime) -> Self {
        let ms = t
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Timestamp(ms)
    }
}

/// `d` for people: `25h03m`, `4m10s`, `12s`, `350ms`.
pub(crate) fn roughly(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        3600.. => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        60.. => format!("{}m{:02}s", secs / 60, secs % 60),
        1.. => format!("{secs}s"),
        0 => format!("{}ms", d.as_millis()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let max = Timestamp::from_millis(i64::MAX);
        assert_eq!(max.saturating_add(Duration::from_secs(1)), max);
        assert_eq!(max.saturating_add(Duration::MAX), max);
        let t = Timestamp::from_millis(1_000);
        assert_eq!(t.until(Timestamp::from_millis(500)), Duration::ZERO);
        assert_eq!(t.until(Timestamp::from_millis(1_250)), Duration::from_millis(250));
        assert_eq!(Timestamp::from_millis(i64::MIN).until(max), Duration::from_millis(i64::MAX as u64));
    }
}
