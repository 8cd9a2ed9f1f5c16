//! The pauses of every loop that retries in place (reconnecting, fetching,
//! publishing, rejoining): `retry-core`'s schedule with real jitter, so
//! clients that failed together (a broker restart) do not retry together.

use std::time::Duration;

use retry_core::{backoff::Backoff, backoff::BackoffConfig};

/// Pauses growing from a first one to a longest one.
pub(crate) struct Pauses(Backoff<fn() -> f64>);

/// Doubling pauses from `initial` to `max` (`initial` is raised to 1 ms and
/// `max` to `initial` if they are not), with 20 % jitter.
pub(crate) fn pauses(initial: Duration, max: Duration) -> Pauses {
    let initial = initial.max(Duration::from_millis(1));
    let config = BackoffConfig::new(initial, max.max(initial)).expect("0 < initial <= max by construction");
    Pauses(config.pauses(rand::random::<f64> as fn() -> f64))
}

impl Pauses {
    /// The next pause.
    pub(crate) fn next(&mut self) -> Duration {
        self.0.next().expect("the pauses never end")
    }

    /// Starts over from the first pause, after a success.
    pub(crate) fn reset(&mut self) {
        self.0.reset();
    }
}
