//! Failed authentications per client address: after too many within a
//! window, the address is answered 429 until the window ends, so a client
//! cannot guess the token at network speed. Pure: the caller passes `now`.

use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Duration, Instant},
};

/// Addresses tracked at most; beyond it, expired entries are dropped first
/// and then the oldest, so a flood of addresses cannot grow memory.
const MAX_TRACKED: usize = 10_000;

/// Failed authentications per address within a window.
#[derive(Debug)]
pub(crate) struct AuthFailures {
    max_failures: u32,
    window: Duration,
    by_address: HashMap<IpAddr, (Instant, u32)>,
}

impl AuthFailures {
    /// At most `max_failures` failures per address within `window`.
    pub(crate) fn new(max_failures: u32, window: Duration) -> Self {
        AuthFailures { max_failures, window, by_address: HashMap::new() }
    }

    /// How long `ip` must wait, if it failed too often.
    pub(crate) fn blocked(&mut self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let (since, count) = *self.by_address.get(&ip)?;
        let ends = since + self.window;
        if now >= ends {
            self.by_address.remove(&ip);
            return None;
        }
        (count >= self.max_failures).then(|| ends - now)
    }

    /// Counts a failure of `ip`.
    pub(crate) fn failed(&mut self, ip: IpAddr, now: Instant) {
        let window = self.window;
        let entry = self.by_address.entry(ip).or_insert((now, 0));
        if now >= entry.0 + window {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
        if self.by_address.len() > MAX_TRACKED {
            self.by_address.retain(|_, (since, _)| now < *since + window);
            while self.by_address.len() > MAX_TRACKED {
                let oldest = self.by_address.iter().min_by_key(|(_, (since, _))| *since).map(|(ip, _)| *ip);
                match oldest {
                    Some(ip) => self.by_address.remove(&ip),
                    None => break,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_per_address_within_a_window() {
        let start = Instant::now();
        let s = |secs: u64| start + Duration::from_secs(secs);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        // (step, address, at second, expected wait after the step, if blocked)
        let table: &[(&str, IpAddr, u64, Option<u64>)] = &[
            ("fail", a, 0, None),
            ("fail", a, 1, None),
            ("fail", a, 2, Some(58)), // the third failure blocks until the window ends
            ("check", a, 30, Some(30)),
            ("check", b, 30, None), // another address is not affected
            ("check", a, 60, None), // the window ended: a clean slate
            ("fail", a, 61, None),
            ("fail", b, 61, None),
            ("fail", b, 62, None),
            ("fail", b, 200, None), // failures far apart never add up
        ];
        let mut failures = AuthFailures::new(3, Duration::from_secs(60));
        for (i, &(step, ip, at, expected)) in table.iter().enumerate() {
            if step == "fail" {
                failures.failed(ip, s(at));
            }
            assert_eq!(
                failures.blocked(ip, s(at)),
                expected.map(Duration::from_secs),
                "step {i}: {step} {ip} at {at}s"
            );
        }
    }

    #[test]
    fn memory_is_bounded_whatever_the_addresses() {
        let now = Instant::now();
        let mut failures = AuthFailures::new(3, Duration::from_secs(60));
        for i in 0..(MAX_TRACKED as u32 + 500) {
            failures.failed(IpAddr::from(i.to_be_bytes()), now);
        }
        assert!(failures.by_address.len() <= MAX_TRACKED);
    }
}
