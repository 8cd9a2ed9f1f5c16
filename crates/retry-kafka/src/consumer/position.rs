//! Where a partition's consumption starts, and whether a position a fetch
//! doubted is really gone: pure decisions, the worker does the I/O.
//!
//! A fetch can make a position look invalid when it is not. A new leader
//! whose high watermark still trails the old one's answers an empty fetch
//! with a high watermark below the position; a follower (or a broker that
//! still believes it leads) answers OFFSET_OUT_OF_RANGE for records it has
//! not replicated yet. Resetting then would skip or redeliver records. So a
//! doubted position is checked against the log's range as its leader
//! reports it (ListOffsets earliest and latest, which Kafka answers only once
//! the new leader's high watermark caught up, KIP-207) and reset only when
//! it lies outside: below the log start (retention deleted it) or past the
//! log end (the log was truncated or recreated).

use crate::consumer::config::OffsetReset;

/// What a fetch said that puts the position in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Doubt {
    /// The broker answered OFFSET_OUT_OF_RANGE.
    OutOfRange,
    /// The broker answered no records and a high watermark below the
    /// position (some brokers answer a position past the end this way).
    EmptyAboveHighWatermark {
        /// The high watermark the fetch reported.
        high_watermark: i64,
    },
}

impl Doubt {
    /// What a fetch answer of `records` records and `high_watermark` at
    /// `position` casts in doubt, if anything.
    pub(crate) fn of_fetch(position: i64, records: usize, high_watermark: i64) -> Option<Doubt> {
        (records == 0 && position > high_watermark).then_some(Doubt::EmptyAboveHighWatermark { high_watermark })
    }
}

/// What a fetch came back with, as far as deciding the next step goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FetchOutcome {
    /// An answer.
    Read {
        /// How many records (and undecodable batches) it holds for the handler.
        items: usize,
        /// The offset after the last whole batch read, if any came.
        next_offset: Option<i64>,
        /// How far the consumer can read (the last stable offset under
        /// `read_committed`, else the high watermark).
        end: i64,
        /// Bytes came, but not one whole batch.
        cut: bool,
    },
    /// OFFSET_OUT_OF_RANGE.
    OutOfRange,
    /// No answer within the deadline.
    NoAnswer,
    /// Any other failure (a broker error, a broken connection).
    Failed,
}

/// What a worker does after a fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterFetch {
    /// Handle the records, and move the position to where the fetch ended
    /// (past control batches, aborted records and compacted gaps too).
    Process,
    /// Caught up: wait for more.
    Wait,
    /// Check the position against the log's range before going on.
    CheckPosition(Doubt),
    /// The batch at the position is larger than a fetch may bring (part of
    /// it came, or nothing though the log holds more): fetch again with
    /// more room.
    Grow,
    /// Replace the partition's connection, then fetch again.
    Reconnect,
    /// Refresh metadata, back off, fetch again.
    Retry,
}

impl AfterFetch {
    /// The step after a fetch at `position` came back with `outcome`.
    pub(crate) fn of(position: i64, outcome: FetchOutcome) -> AfterFetch {
        match outcome {
            FetchOutcome::Read { items, next_offset, end, cut } => {
                if items > 0 || next_offset.is_some_and(|next| next > position) {
                    AfterFetch::Process
                } else if cut || (next_offset.is_none() && position < end) {
                    // Nothing whole came though there is more to read: the
                    // batch at the position is larger than the fetch may
                    // bring (Kafka answers it whole, KIP-74; brokers that
                    // store records, not batches, answer nothing).
                    AfterFetch::Grow
                } else {
                    match Doubt::of_fetch(position, 0, end) {
                        Some(doubt) => AfterFetch::CheckPosition(doubt),
                        None => AfterFetch::Wait,
                    }
                }
            }
            FetchOutcome::OutOfRange => AfterFetch::CheckPosition(Doubt::OutOfRange),
            FetchOutcome::NoAnswer => AfterFetch::Reconnect,
            FetchOutcome::Failed => AfterFetch::Retry,
        }
    }
}

/// A pause before the next fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pause {
    /// Fetch again at once.
    None,
    /// The next pause of the failure backoff.
    Backoff,
    /// The next pause of the idle backoff: a broker that answers an empty
    /// fetch at once, ignoring its maximum wait, must not make an idle
    /// partition spin.
    Idle,
}

/// Whether the partition is stalled on a batch larger than any fetch may
/// bring, even at the decompression cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Oversized {
    /// Not stalled.
    No,
    /// Stalled from this fetch on: say so, loudly, once.
    Begins,
    /// Still stalled.
    Still,
}

/// What a worker does between two fetches: the step after this one, how
/// long to pause, which backoffs start over, and how much the next fetch
/// may bring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) after: AfterFetch,
    pub(crate) pause: Pause,
    /// The failure backoff starts over (something worked).
    pub(crate) reset_backoff: bool,
    /// The idle backoff starts over (records came).
    pub(crate) reset_idle: bool,
    /// The size limit of the next fetch.
    pub(crate) max_bytes: i32,
    pub(crate) oversized: Oversized,
}

/// The fetch loop's own state, kept across fetches; each fetch's outcome
/// gives the next [`Step`] (pure: the worker only carries steps out).
#[derive(Debug, Clone)]
pub(crate) struct FetchLoop {
    /// How much one fetch brings as a rule.
    usual_max: i32,
    /// The most a fetch may ask for: the decompression cap.
    cap: i32,
    max_bytes: i32,
    oversized: bool,
}

impl FetchLoop {
    /// A loop whose fetches bring `usual_max` bytes, and up to `cap` for a
    /// batch larger than that.
    pub(crate) fn new(usual_max: i32, cap: usize) -> FetchLoop {
        let cap = i32::try_from(cap).unwrap_or(i32::MAX).max(usual_max);
        FetchLoop { usual_max, cap, max_bytes: usual_max, oversized: false }
    }

    /// The size limit of the next fetch.
    pub(crate) fn max_bytes(&self) -> i32 {
        self.max_bytes
    }

    /// The step after a fetch at `position` came back with `outcome`;
    /// `early` when it came back before half its maximum wait.
    pub(crate) fn step(&mut self, position: i64, outcome: FetchOutcome, early: bool) -> Step {
        let after = AfterFetch::of(position, outcome);
        let mut step = Step {
            after,
            pause: Pause::None,
            reset_backoff: false,
            reset_idle: false,
            max_bytes: self.max_bytes,
            oversized: if self.oversized { Oversized::Still } else { Oversized::No },
        };
        match after {
            AfterFetch::Process => {
                self.max_bytes = self.usual_max;
                self.oversized = false;
                step.reset_backoff = true;
                step.reset_idle = true;
                step.oversized = Oversized::No;
            }
            AfterFetch::Wait => {
                self.oversized = false;
                step.reset_backoff = true;
                step.oversized = Oversized::No;
                if early {
                    step.pause = Pause::Idle;
                }
            }
            AfterFetch::Grow if self.max_bytes < self.cap => {
                self.max_bytes = self.max_bytes.saturating_mul(2).min(self.cap);
            }
            AfterFetch::Grow => {
                if !self.oversized {
                    self.oversized = true;
                    step.oversized = Oversized::Begins;
                }
                step.pause = Pause::Backoff;
            }
            AfterFetch::CheckPosition(_) | AfterFetch::Retry => step.pause = Pause::Backoff,
            AfterFetch::Reconnect => {}
        }
        step.max_bytes = self.max_bytes;
        step
    }
}

/// The verdict on a doubted position, given the log's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The position lies within the log: the doubt came from a stale view
    /// (a leader change); keep it and fetch again after a pause.
    Keep,
    /// Retention deleted records from the position on: reset.
    BelowLogStart {
        /// The first offset still kept.
        log_start: i64,
    },
    /// The position lies past the log's end: reset.
    PastLogEnd {
        /// The log's end offset.
        log_end: i64,
    },
}

/// Judges `position` against the log's range `[log_start, log_end]` (the
/// end is the next offset to be written, a valid position to wait at).
pub(crate) fn judge(position: i64, log_start: i64, log_end: i64) -> Verdict {
    if position < log_start {
        Verdict::BelowLogStart { log_start }
    } else if position > log_end {
        Verdict::PastLogEnd { log_end }
    } else {
        Verdict::Keep
    }
}

/// Where a partition without a usable committed offset starts.
///
/// Retry rungs always start at the earliest offset, whatever the policy: a
/// record republished to a rung before the rung's group first committed is
/// owed its retry, and "latest" would skip it.
pub(crate) fn start_policy(policy: OffsetReset, is_retry_rung: bool) -> OffsetReset {
    if is_retry_rung {
        OffsetReset::Earliest
    } else {
        policy
    }
}

/// How far this member finished a partition, and in which generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Finished {
    /// Every record before it is done.
    pub(crate) offset: i64,
    /// The generation in which the member owned the partition then.
    pub(crate) generation: i32,
}

/// Where a partition assigned in `generation` resumes: the group's
/// committed offset, or further on when this member itself finished
/// records past it in the generation just before, whose last commits did
/// not land (the coordinator moved, a commit timed out). Records before a
/// finished offset were handled and their republications acknowledged;
/// handling them again would only duplicate work.
///
/// Only the generation just before: if the member owned the partition
/// longer ago, another member may have owned it since, and the group's
/// committed offset is the truth, even below what this member once
/// finished (the log was truncated and the other member reset its
/// position; an operator moved the group back while it was empty).
pub(crate) fn resume_at(committed: Option<i64>, finished_here: Option<Finished>, generation: i32) -> Option<i64> {
    match finished_here {
        Some(f) if f.generation.checked_add(1) == Some(generation) => committed.max(Some(f.offset)),
        _ => committed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_judge(position: i64, log_start: i64, log_end: i64, expected: Verdict) {
        assert_eq!(judge(position, log_start, log_end), expected, "position {position} in [{log_start}, {log_end}]");
    }

    #[test]
    fn doubted_positions() {
        // Within the log, its end included: a stale view, keep.
        check_judge(5, 0, 10, Verdict::Keep);
        check_judge(0, 0, 10, Verdict::Keep);
        check_judge(10, 0, 10, Verdict::Keep);
        check_judge(3, 3, 3, Verdict::Keep);
        // Retention deleted it.
        check_judge(2, 3, 10, Verdict::BelowLogStart { log_start: 3 });
        // The log was truncated or recreated.
        check_judge(11, 0, 10, Verdict::PastLogEnd { log_end: 10 });
        check_judge(50, 0, 0, Verdict::PastLogEnd { log_end: 0 });
    }

    #[track_caller]
    fn check_doubt(position: i64, records: usize, high_watermark: i64, expected: Option<Doubt>) {
        assert_eq!(Doubt::of_fetch(position, records, high_watermark), expected);
    }

    #[test]
    fn after_a_fetch() {
        let read = |items, next_offset, end| FetchOutcome::Read { items, next_offset, end, cut: false };
        let check = |position, outcome, expected| {
            assert_eq!(AfterFetch::of(position, outcome), expected, "{outcome:?} at {position}");
        };
        check(5, read(3, Some(8), 8), AfterFetch::Process);
        check(5, read(0, None, 5), AfterFetch::Wait);
        // Nothing came, though the log holds more.
        check(5, read(0, None, 9), AfterFetch::Grow);
        // Only a transaction marker, aborted records or a compacted gap:
        // nothing to handle, but the position moves past them.
        check(5, read(0, Some(6), 6), AfterFetch::Process);
        // A fetch that began inside a batch ending before the position.
        check(5, read(0, Some(5), 9), AfterFetch::Wait);
        check(5, read(0, None, 4), AfterFetch::CheckPosition(Doubt::EmptyAboveHighWatermark { high_watermark: 4 }));
        check(5, read(2, Some(7), 4), AfterFetch::Process); // records came: nothing to doubt
                                                            // Bytes, but no whole batch: a batch larger than the fetch may bring.
        check(5, FetchOutcome::Read { items: 0, next_offset: None, end: 9, cut: true }, AfterFetch::Grow);
        check(5, FetchOutcome::OutOfRange, AfterFetch::CheckPosition(Doubt::OutOfRange));
        check(5, FetchOutcome::NoAnswer, AfterFetch::Reconnect);
        check(5, FetchOutcome::Failed, AfterFetch::Retry);
    }

    #[test]
    fn fetches_that_cast_doubt() {
        check_doubt(5, 0, 5, None); // caught up, waiting for more
        check_doubt(5, 3, 8, None);
        check_doubt(5, 2, 4, None); // records came: nothing to doubt
        check_doubt(5, 0, 4, Some(Doubt::EmptyAboveHighWatermark { high_watermark: 4 }));
    }

    #[test]
    fn a_partition_resumes_after_what_was_finished() {
        #[track_caller]
        fn check(committed: Option<i64>, finished: Option<(i64, i32)>, generation: i32, expected: Option<i64>) {
            let finished = finished.map(|(offset, generation)| Finished { offset, generation });
            assert_eq!(
                resume_at(committed, finished, generation),
                expected,
                "{committed:?} {finished:?} in {generation}"
            );
        }
        check(None, None, 4, None);
        check(Some(5), None, 4, Some(5));
        // Owned in the generation just before: our last commits were lost.
        check(None, Some((7, 3)), 4, Some(7));
        check(Some(5), Some((7, 3)), 4, Some(7));
        check(Some(9), Some((7, 3)), 4, Some(9)); // committed further
                                                  // Owned longer ago: another member may have owned it since; after a
                                                  // truncation or a reset, its commit is below what we once finished.
        check(Some(5), Some((7, 2)), 4, Some(5));
        check(None, Some((7, 2)), 4, None);
        // A stale record of a later generation (a member that joined anew
        // starts counting from the group's generation) is no evidence.
        check(Some(5), Some((7, 9)), 4, Some(5));
        check(Some(5), Some((7, i32::MAX)), 4, Some(5));
    }

    #[test]
    fn retry_rungs_start_at_the_earliest_offset() {
        assert_eq!(start_policy(OffsetReset::Latest, false), OffsetReset::Latest);
        assert_eq!(start_policy(OffsetReset::Earliest, false), OffsetReset::Earliest);
        assert_eq!(start_policy(OffsetReset::Latest, true), OffsetReset::Earliest);
        assert_eq!(start_policy(OffsetReset::Earliest, true), OffsetReset::Earliest);
    }

    #[test]
    fn the_fetch_loop_between_fetches() {
        use AfterFetch::*;
        let read = |items, next_offset, end, cut| FetchOutcome::Read { items, next_offset, end, cut };
        // (outcome, early) -> (step, pause, resets, next max_bytes, oversized), in sequence.
        let mut fetches = FetchLoop::new(1_000, 4_500);
        type Row = (FetchOutcome, bool, AfterFetch, Pause, (bool, bool), i32, Oversized);
        let table: &[Row] = &[
            (read(3, Some(13), 20, false), false, Process, Pause::None, (true, true), 1_000, Oversized::No),
            // Caught up: an early empty answer pauses; one that waited does not.
            (read(0, None, 10, false), true, Wait, Pause::Idle, (true, false), 1_000, Oversized::No),
            (read(0, None, 10, false), false, Wait, Pause::None, (true, false), 1_000, Oversized::No),
            // A batch too large: more room at once, up to the cap...
            (read(0, None, 20, true), false, Grow, Pause::None, (false, false), 2_000, Oversized::No),
            (read(0, None, 20, true), false, Grow, Pause::None, (false, false), 4_000, Oversized::No),
            (read(0, None, 20, true), false, Grow, Pause::None, (false, false), 4_500, Oversized::No),
            // ...then a loud stall, said once, with backoff.
            (read(0, None, 20, true), false, Grow, Pause::Backoff, (false, false), 4_500, Oversized::Begins),
            (read(0, None, 20, true), false, Grow, Pause::Backoff, (false, false), 4_500, Oversized::Still),
            (FetchOutcome::Failed, false, Retry, Pause::Backoff, (false, false), 4_500, Oversized::Still),
            (FetchOutcome::NoAnswer, false, Reconnect, Pause::None, (false, false), 4_500, Oversized::Still),
            // The batch came whole at last: back to the usual size.
            (read(1, Some(11), 20, false), false, Process, Pause::None, (true, true), 1_000, Oversized::No),
            (
                FetchOutcome::OutOfRange,
                false,
                CheckPosition(Doubt::OutOfRange),
                Pause::Backoff,
                (false, false),
                1_000,
                Oversized::No,
            ),
        ];
        for (i, (outcome, early, after, pause, (reset_backoff, reset_idle), max_bytes, oversized)) in
            table.iter().enumerate()
        {
            let step = fetches.step(10, *outcome, *early);
            let expected = Step {
                after: *after,
                pause: *pause,
                reset_backoff: *reset_backoff,
                reset_idle: *reset_idle,
                max_bytes: *max_bytes,
                oversized: *oversized,
            };
            assert_eq!(step, expected, "fetch {i}: {outcome:?}");
            assert_eq!(fetches.max_bytes(), *max_bytes);
        }
    }
}
