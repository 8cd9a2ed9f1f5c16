//! Which partitions a member starts and stops when its assignment changes
//! and the rest of its partitions go on (the consumer group protocol of
//! KIP-848). Pure: the member does the I/O and tells this what happened.
//!
//! A partition taken away is owned until its worker stopped and what it
//! finished was committed: heartbeats report it as owned meanwhile, so the
//! coordinator gives it to nobody else before. A partition assigned while
//! it is still being given up (it came back) starts again once it stopped.

use std::collections::BTreeSet;

/// What the member must do now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Steps {
    /// Partitions to start: read their committed offsets, run a worker.
    pub(crate) start: Vec<i32>,
    /// Partitions to give up: stop their workers, drain, commit, then
    /// report them [`stopped`](Reconciler::stopped).
    pub(crate) stop: Vec<i32>,
}

/// A member's partitions: running, being given up, and assigned.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reconciler {
    running: BTreeSet<i32>,
    stopping: BTreeSet<i32>,
    target: BTreeSet<i32>,
}

impl Reconciler {
    /// The coordinator assigned `target`: stop what is no longer in it,
    /// start what is new (unless it is still stopping).
    pub(crate) fn assign(&mut self, target: impl IntoIterator<Item = i32>) -> Steps {
        self.target = target.into_iter().collect();
        let stop: Vec<i32> = self.running.difference(&self.target).copied().collect();
        for p in &stop {
            self.running.remove(p);
            self.stopping.insert(*p);
        }
        let start: Vec<i32> =
            self.target.iter().filter(|p| !self.running.contains(p) && !self.stopping.contains(p)).copied().collect();
        self.running.extend(&start);
        Steps { start, stop }
    }

    /// `partitions` were given up (stopped, and committed as far as they
    /// could be). Those assigned again meanwhile start anew.
    pub(crate) fn stopped(&mut self, partitions: &[i32]) -> Steps {
        let mut start = Vec::new();
        for p in partitions {
            if self.stopping.remove(p) && self.target.contains(p) && self.running.insert(*p) {
                start.push(*p);
            }
        }
        Steps { start, stop: Vec::new() }
    }

    /// Every partition is lost at once (the coordinator fenced the
    /// member, or it could not be reached for a session): what ran or
    /// was stopping, to abandon without a commit. Nothing is assigned after.
    pub(crate) fn lose_all(&mut self) -> Vec<i32> {
        let lost = self.running.union(&self.stopping).copied().collect();
        *self = Reconciler::default();
        lost
    }

    /// What heartbeats report as owned: running or still stopping.
    pub(crate) fn owned(&self) -> Vec<i32> {
        self.running.union(&self.stopping).copied().collect()
    }

    /// Whether `partition` runs and is meant to (a worker of it that
    /// ended did so unasked).
    pub(crate) fn runs(&self, partition: i32) -> bool {
        self.running.contains(&partition)
    }

    /// Whether partitions taken away are still being given up.
    pub(crate) fn is_releasing(&self) -> bool {
        !self.stopping.is_empty()
    }

    /// Nothing is owned any more (a member that leaves waits for this).
    pub(crate) fn is_empty(&self) -> bool {
        self.running.is_empty() && self.stopping.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step of a member's life, and what it must see.
    enum Event<'a> {
        Assign(&'a [i32]),
        Stopped(&'a [i32]),
        LoseAll,
    }
    use Event::*;

    /// An event, the partitions it starts and stops, and what is owned after it.
    type Row<'a> = (Event<'a>, &'a [i32], &'a [i32], &'a [i32]);

    /// Runs `events` from nothing, checking each row.
    #[track_caller]
    fn check(events: &[Row<'_>]) {
        let mut r = Reconciler::default();
        for (i, (event, start, stop, owned)) in events.iter().enumerate() {
            let steps = match event {
                Assign(target) => r.assign(target.iter().copied()),
                Stopped(ps) => r.stopped(ps),
                LoseAll => Steps { start: Vec::new(), stop: r.lose_all() },
            };
            assert_eq!((steps.start.as_slice(), steps.stop.as_slice()), (*start, *stop), "step {i}");
            assert_eq!(r.owned(), *owned, "owned after step {i}");
        }
    }

    #[test]
    fn only_what_moves_stops_or_starts() {
        check(&[
            (Assign(&[0, 1, 2]), &[0, 1, 2], &[], &[0, 1, 2]),
            // Another member joined: 2 moves away, 0 and 1 go on.
            (Assign(&[0, 1]), &[], &[2], &[0, 1, 2]),
            // Heartbeats report 2 as owned until it stopped.
            (Stopped(&[2]), &[], &[], &[0, 1]),
            // It left again: 2 comes back.
            (Assign(&[0, 1, 2]), &[2], &[], &[0, 1, 2]),
            // The same assignment again changes nothing.
            (Assign(&[0, 1, 2]), &[], &[], &[0, 1, 2]),
        ]);
    }

    #[test]
    fn a_partition_assigned_again_while_stopping_restarts_once_stopped() {
        check(&[
            (Assign(&[0, 1]), &[0, 1], &[], &[0, 1]),
            (Assign(&[0]), &[], &[1], &[0, 1]),
            (Assign(&[0, 1]), &[], &[], &[0, 1]),
            (Stopped(&[1]), &[1], &[], &[0, 1]),
        ]);
        // Taken away, assigned again, taken away again: it stops once.
        check(&[
            (Assign(&[3]), &[3], &[], &[3]),
            (Assign(&[]), &[], &[3], &[3]),
            (Assign(&[3]), &[], &[], &[3]),
            (Assign(&[]), &[], &[], &[3]),
            (Stopped(&[3]), &[], &[], &[]),
        ]);
    }

    #[test]
    fn losing_everything_abandons_running_and_stopping_alike() {
        check(&[
            (Assign(&[0, 1, 2]), &[0, 1, 2], &[], &[0, 1, 2]),
            (Assign(&[0, 1]), &[], &[2], &[0, 1, 2]),
            (LoseAll, &[], &[0, 1, 2], &[]),
            // A late report of the drain changes nothing.
            (Stopped(&[2]), &[], &[], &[]),
            (Assign(&[1]), &[1], &[], &[1]),
        ]);
    }
}
