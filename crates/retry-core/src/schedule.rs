use std::{fmt, str::FromStr, time::Duration};

use crate::{Error, Result};

/// The most rungs a schedule may have: past ten, a failure is not transient.
pub const MAX_RUNGS: usize = 10;

/// The longest delay one rung may have. Retry topics must retain records
/// longer than their delay, so unbounded delays would make retention unbounded.
pub const MAX_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);

/// One rung of the retry ladder: a delay and the label that names its topic.
///
/// ```
/// use std::time::Duration;
/// use retry_core::RetrySchedule;
///
/// let schedule: RetrySchedule = "5s,90m".parse().unwrap();
/// let rungs: Vec<(Duration, &str)> = schedule.rungs().iter().map(|rung| (rung.delay(), rung.label())).collect();
/// assert_eq!(rungs, [(Duration::from_secs(5), "5s"), (Duration::from_secs(5_400), "90m")]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rung {
    delay: Duration,
    label: String,
}

impl Rung {
    /// How long a record waits on this rung before it is retried.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The exact label of the delay (`5s`, `30s`, `5m`, `1h`, `1500ms`), used in
    /// the topic name. Two different delays never share a label.
    pub fn label(&self) -> &str {
        &self.label
    }
}

/// The delays of a retry ladder, in order: rung 0 is the first retry.
///
/// A schedule has 1 to [`MAX_RUNGS`] rungs, each a whole number of
/// milliseconds between 1 ms and [`MAX_DELAY`], all different. It parses from
/// and prints as a comma-separated list with units `ms`, `s`, `m` and `h`:
///
/// ```
/// use retry_core::RetrySchedule;
/// let s: RetrySchedule = "5s, 30s, 5m".parse().unwrap();
/// assert_eq!(s.to_string(), "5s,30s,5m");
/// assert_eq!(s.max_attempts(), 4);
/// assert_eq!("1500ms,90m".parse::<RetrySchedule>().unwrap().to_string(), "1500ms,90m");
/// assert_eq!("120m".parse::<RetrySchedule>().unwrap().to_string(), "2h");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RetrySchedule {
    rungs: Vec<Rung>,
}

impl RetrySchedule {
    /// A schedule from delays, validated as described on [`RetrySchedule`].
    pub fn new(delays: impl IntoIterator<Item = Duration>) -> Result<Self> {
        let delays: Vec<Duration> = delays.into_iter().collect();
        let input = delays.iter().map(|d| format!("{d:?}")).collect::<Vec<_>>().join(",");
        Self::validated(delays).map_err(|reason| Error::InvalidSchedule { input, reason })
    }

    fn validated(delays: Vec<Duration>) -> Result<Self, String> {
        if delays.is_empty() {
            return Err("a schedule needs at least one delay".into());
        }
        if delays.len() > MAX_RUNGS {
            return Err(format!("{} delays, at most {MAX_RUNGS} are allowed", delays.len()));
        }
        let mut rungs: Vec<Rung> = Vec::with_capacity(delays.len());
        for (i, delay) in delays.into_iter().enumerate() {
            if delay.is_zero() {
                return Err(format!("delay {} is zero", i + 1));
            }
            if delay.subsec_nanos() % 1_000_000 != 0 {
                return Err(format!("delay {} ({delay:?}) is not a whole number of milliseconds", i + 1));
            }
            let label = label_of(delay);
            if delay > MAX_DELAY {
                return Err(format!("delay {} ({label}) is longer than the maximum of 168h", i + 1));
            }
            if let Some(j) = rungs.iter().position(|r| r.label == label) {
                return Err(format!("delay {} ({label}) repeats delay {}", i + 1, j + 1));
            }
            rungs.push(Rung { delay, label });
        }
        Ok(RetrySchedule { rungs })
    }

    /// The rungs, first retry first.
    pub fn rungs(&self) -> &[Rung] {
        &self.rungs
    }

    /// How many times a record is handled at most: once on the source topic
    /// and once per rung.
    pub fn max_attempts(&self) -> u32 {
        // At most MAX_RUNGS + 1, so the cast cannot truncate.
        self.rungs.len() as u32 + 1
    }

    /// The longest delay of any rung (what retry-topic retention must exceed).
    pub fn longest_delay(&self) -> Duration {
        self.rungs.iter().map(|r| r.delay).max().unwrap_or_default()
    }
}

impl Default for RetrySchedule {
    /// `5s,30s,5m`.
    fn default() -> Self {
        RetrySchedule::new([5, 30, 300].map(Duration::from_secs)).expect("the default schedule is valid")
    }
}

impl FromStr for RetrySchedule {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let invalid = |reason: String| Error::InvalidSchedule { input: s.to_owned(), reason };
        let delays = s
            .split(',')
            .enumerate()
            .map(|(i, part)| parse_delay(part.trim()).map_err(|why| invalid(format!("delay {}: {why}", i + 1))))
            .collect::<Result<Vec<_>>>()?;
        Self::validated(delays).map_err(invalid)
    }
}

impl fmt::Display for RetrySchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rung) in self.rungs.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&rung.label)?;
        }
        Ok(())
    }
}

const UNITS: [(&str, u64); 4] = [("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)];

/// Parses one duration written like a schedule's delays: a whole number
/// with a unit, `ms`, `s`, `m` or `h` (`1500ms`, `10s`, `5m`, `1h`), for
/// other settings of a service that uses the schedule (timeouts, say).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(retry_core::parse_duration("10s").unwrap(), Duration::from_secs(10));
/// let error = retry_core::parse_duration("10").unwrap_err();
/// assert_eq!(error.to_string(), "invalid duration \"10\": \"10\" has no unit (use ms, s, m or h)");
/// ```
pub fn parse_duration(s: &str) -> crate::Result<Duration> {
    parse_delay(s.trim()).map_err(|reason| crate::Error::InvalidDuration { input: s.to_owned(), reason })
}

fn parse_delay(s: &str) -> Result<Duration, String> {
    if s.is_empty() {
        return Err("is empty (expected e.g. 5s, 30s, 5m, 1h or 1500ms)".into());
    }
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits_end);
    if number.is_empty() {
        return Err(format!("{s:?} does not start with a number"));
    }
    let per_unit = match UNITS.iter().find(|(name, _)| *name == unit) {
        Some((_, ms)) => *ms,
        None if unit.is_empty() => return Err(format!("{s:?} has no unit (use ms, s, m or h)")),
        None => return Err(format!("{s:?} has an unknown unit {unit:?} (use ms, s, m or h)")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(per_unit))
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// The largest unit that expresses `delay` exactly: one label per delay.
pub(crate) fn label_of(delay: Duration) -> String {
    let ms = delay.as_millis();
    let (unit, per_unit) = UNITS
        .iter()
        .find(|(_, per_unit)| ms.is_multiple_of(u128::from(*per_unit)))
        .expect("every whole-millisecond delay is a multiple of 1 ms");
    format!("{}{unit}", ms / u128::from(*per_unit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[track_caller]
    fn check(input: &str, expected: Result<&str, &str>) {
        let actual = input.parse::<RetrySchedule>().map(|s| s.to_string()).map_err(|e| e.to_string());
        assert_eq!(actual.as_deref().map_err(String::as_str), expected, "parsing {input:?}");
    }

    #[test]
    fn parses_and_labels_exactly() {
        check("5s,30s,5m", Ok("5s,30s,5m"));
        check(" 5s , 30s ,5m ", Ok("5s,30s,5m"));
        check("1500ms", Ok("1500ms"));
        check("1000ms", Ok("1s"));
        check("60s,90s", Ok("1m,90s"));
        check("120m", Ok("2h"));
        check("1h,61m", Ok("1h,61m"));
        check("168h", Ok("168h"));
        check("1ms,2ms,3ms,4ms,5ms,6ms,7ms,8ms,9ms,10ms", Ok("1ms,2ms,3ms,4ms,5ms,6ms,7ms,8ms,9ms,10ms"));
    }

    #[test]
    fn rejects_bad_schedules_with_reasons() {
        check("", Err(r#"invalid retry schedule "": delay 1: is empty (expected e.g. 5s, 30s, 5m, 1h or 1500ms)"#));
        check(
            "5s,,5m",
            Err(r#"invalid retry schedule "5s,,5m": delay 2: is empty (expected e.g. 5s, 30s, 5m, 1h or 1500ms)"#),
        );
        check("5", Err(r#"invalid retry schedule "5": delay 1: "5" has no unit (use ms, s, m or h)"#));
        check("5d", Err(r#"invalid retry schedule "5d": delay 1: "5d" has an unknown unit "d" (use ms, s, m or h)"#));
        check("s", Err(r#"invalid retry schedule "s": delay 1: "s" does not start with a number"#));
        check("-5s", Err(r#"invalid retry schedule "-5s": delay 1: "-5s" does not start with a number"#));
        check(
            "1.5s",
            Err(r#"invalid retry schedule "1.5s": delay 1: "1.5s" has an unknown unit ".5s" (use ms, s, m or h)"#),
        );
        check("0s", Err(r#"invalid retry schedule "0s": delay 1 is zero"#));
        check("169h", Err(r#"invalid retry schedule "169h": delay 1 (169h) is longer than the maximum of 168h"#));
        check(
            "99999999999999999999h",
            Err(r#"invalid retry schedule "99999999999999999999h": delay 1: "99999999999999999999h" is too large"#),
        );
        check("5s,5000ms", Err(r#"invalid retry schedule "5s,5000ms": delay 2 (5s) repeats delay 1"#));
        check(
            "1s,2s,3s,4s,5s,6s,7s,8s,9s,10s,11s",
            Err(r#"invalid retry schedule "1s,2s,3s,4s,5s,6s,7s,8s,9s,10s,11s": 11 delays, at most 10 are allowed"#),
        );
    }

    #[test]
    fn new_validates_like_parse() {
        assert_eq!(RetrySchedule::new([Duration::from_secs(5)]).unwrap().to_string(), "5s");
        assert!(RetrySchedule::new([]).is_err());
        assert!(RetrySchedule::new([Duration::from_micros(1500)]).is_err());
        assert!(RetrySchedule::new([Duration::from_secs(1), Duration::from_millis(1000)]).is_err());
    }

    #[test]
    fn default_is_the_documented_ladder() {
        let s = RetrySchedule::default();
        assert_eq!(s.to_string(), "5s,30s,5m");
        assert_eq!(s.max_attempts(), 4);
        assert_eq!(s.longest_delay(), Duration::from_secs(300));
    }

    fn delays() -> impl Strategy<Value = Vec<Duration>> {
        let unit = prop_oneof![Just(1u64), Just(1_000), Just(60_000), Just(3_600_000)];
        proptest::collection::vec((1u64..5_000, unit), 1..=MAX_RUNGS).prop_map(|v| {
            v.into_iter().map(|(n, unit)| Duration::from_millis((n * unit).min(MAX_DELAY.as_millis() as u64))).collect()
        })
    }

    proptest! {
        #[test]
        fn display_parses_back_to_the_same_schedule(delays in delays()) {
            if let Ok(s) = RetrySchedule::new(delays.clone()) {
                prop_assert_eq!(s.to_string().parse::<RetrySchedule>().unwrap(), s.clone());
                let got: Vec<Duration> = s.rungs().iter().map(Rung::delay).collect();
                prop_assert_eq!(got, delays);
            } else {
                // Only duplicates are invalid among these delays.
                let mut sorted = delays.clone();
                sorted.sort();
                sorted.dedup();
                prop_assert!(sorted.len() < delays.len());
            }
        }

        #[test]
        fn labels_are_unique(delays in delays()) {
            if let Ok(s) = RetrySchedule::new(delays) {
                let mut labels: Vec<&str> = s.rungs().iter().map(Rung::label).collect();
                labels.sort();
                labels.dedup();
                prop_assert_eq!(labels.len(), s.rungs().len());
            }
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,40}") {
            let _ = s.parse::<RetrySchedule>();
        }
    }
}
