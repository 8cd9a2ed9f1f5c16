//! The pauses between attempts of anything retried in place: reconnecting,
//! fetching again, publishing again, rejoining a group.
//!
//! A pure iterator: it reads no clock and draws no randomness of its own.
//! The caller injects the jitter source (a closure returning a number in
//! `[0, 1)`), so tests pin it and the transport uses a real generator.
//! Jitter spreads out the retries of many clients that failed together (a
//! broker restart), so they do not come back as a storm.

use std::time::Duration;

use crate::{Error, Result};

/// How pauses grow: from `initial`, times `multiplier` after each attempt,
/// capped at `max`, each shortened by up to `jitter` of itself.
///
/// ```
/// use std::time::Duration;
/// use retry_core::backoff::BackoffConfig;
///
/// let ms = Duration::from_millis;
/// let config = BackoffConfig::new(ms(100), ms(1_000)).unwrap();
/// // A draw of 0 shortens no pause, so the doubling shows plainly.
/// let pauses: Vec<Duration> = config.pauses(|| 0.0).take(6).collect();
/// assert_eq!(pauses, [100, 200, 400, 800, 1_000, 1_000].map(ms));
/// let tripling: Vec<Duration> = config.with_multiplier(3.0).unwrap().pauses(|| 0.0).take(3).collect();
/// assert_eq!(tripling, [100, 300, 900].map(ms));
/// assert!(config.with_jitter(1.5).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffConfig {
    initial: Duration,
    max: Duration,
    multiplier: f64,
    jitter: f64,
}

impl BackoffConfig {
    /// Doubling pauses from `initial` up to `max`, with 20 % jitter.
    /// Fails unless `0 < initial <= max`.
    pub fn new(initial: Duration, max: Duration) -> Result<Self> {
        if initial.is_zero() || initial > max {
            return Err(Error::InvalidBackoff(format!(
                "the first pause ({initial:?}) must be positive and at most the longest ({max:?})"
            )));
        }
        Ok(BackoffConfig { initial, max, multiplier: 2.0, jitter: 0.2 })
    }

    /// The same with another growth factor (at least 1).
    pub fn with_multiplier(mut self, multiplier: f64) -> Result<Self> {
        if !(multiplier.is_finite() && multiplier >= 1.0) {
            return Err(Error::InvalidBackoff(format!("the multiplier must be at least 1, not {multiplier}")));
        }
        self.multiplier = multiplier;
        Ok(self)
    }

    /// The same with another jitter: each pause is shortened by a random
    /// fraction of itself, up to `jitter` (between 0 and 1).
    pub fn with_jitter(mut self, jitter: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&jitter) {
            return Err(Error::InvalidBackoff(format!("the jitter must be between 0 and 1, not {jitter}")));
        }
        self.jitter = jitter;
        Ok(self)
    }

    /// The longest pause.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The pauses, drawing jitter from `random` (numbers in `[0, 1)`).
    pub fn pauses<R: FnMut() -> f64>(self, random: R) -> Backoff<R> {
        Backoff { config: self, next: self.initial, random }
    }
}

/// The pauses of one sequence of attempts; endless (the caller decides when
/// to give up). [`reset`](Self::reset) after a success.
///
/// ```
/// use std::time::Duration;
/// use retry_core::backoff::BackoffConfig;
///
/// let ms = Duration::from_millis;
/// // Full jitter and draws of one half: each pause is half the unjittered one.
/// let mut pauses = BackoffConfig::new(ms(100), ms(1_000)).unwrap().with_jitter(1.0).unwrap().pauses(|| 0.5);
/// assert_eq!((pauses.next(), pauses.next(), pauses.next()), (Some(ms(50)), Some(ms(100)), Some(ms(200))));
/// // Connected again: the next failure starts from the first pause.
/// pauses.reset();
/// assert_eq!(pauses.next(), Some(ms(50)));
/// ```
#[derive(Debug, Clone)]
pub struct Backoff<R> {
    config: BackoffConfig,
    next: Duration,
    random: R,
}

impl<R> Backoff<R> {
    /// Starts over from the first pause.
    pub fn reset(&mut self) {
        self.next = self.config.initial;
    }
}

impl<R: FnMut() -> f64> Iterator for Backoff<R> {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let base = self.next;
        // Saturates at the longest pause rather than overflowing a Duration.
        let grown = Duration::try_from_secs_f64(base.as_secs_f64() * self.config.multiplier);
        self.next = grown.map_or(self.config.max, |d| d.min(self.config.max));
        let draw = (self.random)().clamp(0.0, 1.0);
        Some(base.mul_f64(1.0 - self.config.jitter * draw))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The first pauses of `config` with every jitter draw at `draw`.
    #[track_caller]
    fn check(config: BackoffConfig, draw: f64, expected: &[u64]) {
        let got: Vec<u64> = config.pauses(|| draw).take(expected.len()).map(|d| d.as_millis() as u64).collect();
        assert_eq!(got, expected, "{config:?} with draws of {draw}");
    }

    #[test]
    fn pauses() {
        let doubling = BackoffConfig::new(ms(100), ms(1000)).unwrap();
        check(doubling, 0.0, &[100, 200, 400, 800, 1000, 1000]);
        check(doubling, 0.5, &[90, 180, 360, 720, 900, 900]);
        check(doubling.with_jitter(0.0).unwrap(), 0.99, &[100, 200, 400, 800, 1000]);
        check(doubling.with_jitter(1.0).unwrap(), 0.5, &[50, 100, 200, 400, 500]);
        check(doubling.with_multiplier(1.0).unwrap(), 0.0, &[100, 100, 100]);
        check(doubling.with_multiplier(3.0).unwrap(), 0.0, &[100, 300, 900, 1000]);
        check(BackoffConfig::new(ms(5), ms(5)).unwrap(), 0.0, &[5, 5]);
        // A huge multiplier saturates at the longest pause.
        check(doubling.with_multiplier(1e300).unwrap(), 0.0, &[100, 1000, 1000]);
    }

    #[test]
    fn reset_starts_over() {
        let mut pauses = BackoffConfig::new(ms(100), ms(1000)).unwrap().pauses(|| 0.0);
        pauses.nth(3);
        pauses.reset();
        assert_eq!(pauses.next(), Some(ms(100)));
    }

    #[test]
    fn invalid_configs() {
        let refused = |r: Result<BackoffConfig>| assert!(matches!(r, Err(Error::InvalidBackoff(_))), "{r:?}");
        refused(BackoffConfig::new(Duration::ZERO, ms(1)));
        refused(BackoffConfig::new(ms(2), ms(1)));
        let ok = BackoffConfig::new(ms(1), ms(2)).unwrap();
        refused(ok.with_multiplier(0.5));
        refused(ok.with_multiplier(f64::NAN));
        refused(ok.with_jitter(-0.1));
        refused(ok.with_jitter(1.5));
    }

    proptest! {
        /// Every pause lies between the unjittered one shortened by the
        /// jitter and the unjittered one, which never exceeds the maximum.
        #[test]
        fn pauses_stay_within_their_bounds(
            initial in 1u64..10_000,
            extra in 0u64..100_000,
            multiplier in 1.0f64..4.0,
            jitter in 0.0f64..=1.0,
            draws in proptest::collection::vec(0.0f64..1.0, 1..40),
        ) {
            let config = BackoffConfig::new(ms(initial), ms(initial + extra)).unwrap()
                .with_multiplier(multiplier).unwrap()
                .with_jitter(jitter).unwrap();
            let mut unjittered = config.with_jitter(0.0).unwrap().pauses(|| 0.0);
            let mut draws_iter = draws.clone().into_iter();
            let jittered = config.pauses(move || draws_iter.next().unwrap_or(0.0));
            for (pause, base) in jittered.zip(&mut unjittered).take(draws.len()) {
                prop_assert!(base <= config.max());
                prop_assert!(pause <= base);
                prop_assert!(pause >= base.mul_f64(1.0 - jitter) - Duration::from_nanos(1));
            }
        }
    }
}
