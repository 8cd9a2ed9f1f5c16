//! One assigned partition: fetch in order, wait until due (retry rungs),
//! handle, execute the decision, report the finished offset.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use futures_util::{
    stream::{FuturesUnordered, StreamExt},
    FutureExt,
};

use retry_core::{
    trace::{Incoming, TraceContext},
    window::InFlightWindow,
    Decision, HandlerError, RecordMeta, Stage, Timestamp,
};
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    backoff::pauses,
    connection::cluster::deadline,
    consumer::brake::Admitted,
    consumer::commit::CommitTracker,
    consumer::config::{HandlerCalls, OffsetReset},
    consumer::fetched::{Fetched, Waiting},
    consumer::position::{self, AfterFetch, Doubt, FetchLoop, FetchOutcome, Oversized, Pause, Verdict},
    consumer::shared::{Impaired, Shared},
    metrics::{Outcome, TopicMetrics},
    protocol::{
        batch::valued_headers,
        fetch::{FetchError, PartitionReader, Readable},
    },
    publisher::{republished_headers, Outgoing, PublishFailure},
    session::ABORT_WAIT,
    telemetry::Attempt,
    ConsumedRecord, Error, RecordHandler, TopicPartition,
};

/// How often a partition whose window is full measures its lag.
const LAG_WHILE_FULL: Duration = Duration::from_secs(2);

/// How a worker is told to stop: `stop` ends fetching and waiting at once;
/// `abandon` (fired after the grace period) also gives up on the record in
/// flight, which is then redelivered to the partition's next owner.
#[derive(Clone)]
pub(crate) struct StopSignals {
    pub(crate) stop: CancellationToken,
    pub(crate) abandon: CancellationToken,
}

pub(crate) struct Worker<H> {
    pub(crate) shared: Arc<Shared<H>>,
    pub(crate) stage: Stage,
    pub(crate) tp: TopicPartition,
    pub(crate) tracker: Arc<CommitTracker>,
    pub(crate) signals: StopSignals,
    pub(crate) metrics: TopicMetrics,
}

impl<H> Worker<H> {
    /// A worker of `tp` for `stage`, reporting to `tracker`.
    pub(crate) fn new(
        shared: &Arc<Shared<H>>,
        stage: Stage,
        tp: TopicPartition,
        tracker: &Arc<CommitTracker>,
        signals: &StopSignals,
    ) -> Self {
        let metrics = shared.metrics.for_topic(&tp.topic);
        Worker { shared: shared.clone(), stage, tp, tracker: tracker.clone(), signals: signals.clone(), metrics }
    }
}

/// Republications decided but not yet acknowledged.
#[derive(Default)]
struct Outbox {
    records: Vec<Outgoing>,
    /// What they add to produce requests, estimated.
    bytes: usize,
    retries: u64,
    dead_letters: u64,
}

impl Outbox {
    fn push(&mut self, record: Outgoing, dead_letter: bool) {
        self.bytes += record.estimated_size();
        self.records.push(record);
        if dead_letter {
            self.dead_letters += 1;
        } else {
            self.retries += 1;
        }
    }

    fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// A partition reported stalled, for as long as this lives: counted in the
/// listener's readiness and shown by the `kafka_retry_partition_stalled` gauge.
struct Stall {
    stalled: Arc<std::sync::atomic::AtomicUsize>,
    metrics: crate::metrics::Metrics,
    tp: TopicPartition,
}

impl Stall {
    fn new<H>(shared: &Shared<H>, tp: &TopicPartition) -> Stall {
        shared.stalled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        shared.metrics.stalled(&tp.topic, tp.partition, true);
        Stall { stalled: shared.stalled.clone(), metrics: shared.metrics.clone(), tp: tp.clone() }
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        self.stalled.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.metrics.stalled(&self.tp.topic, self.tp.partition, false);
    }
}

/// What became of one record.
enum Processed {
    /// Handled: nothing more to do.
    Done,
    /// Handled: it goes to a retry or dead-letter topic, and is done once
    /// the broker acknowledged that.
    Republish {
        /// The record to publish.
        record: Outgoing,
        /// Whether it goes to the dead-letter topic.
        dead_letter: bool,
    },
    /// Not handled: the worker was stopped while the record waited for its
    /// due time; the partition's next owner handles it.
    Left,
    /// Given up midway (the grace period ran out); redelivered to the
    /// partition's next owner.
    Abandoned,
}

/// One record's handling: its offset and what became of it.
type Handling<'a> = Pin<Box<dyn Future<Output = (i64, Processed)> + Send + 'a>>;

/// One publish of republications: the offsets it covers, and whether it
/// went through (false: abandoned).
type Publishing<'a> = Pin<Box<dyn Future<Output = (Vec<i64>, bool)> + Send + 'a>>;

/// Records marked done in the window, and the commit position they moved
/// it to, if they did: reported once for all of them.
#[derive(Default)]
struct Finished {
    position: Option<i64>,
    records: usize,
}

impl Finished {
    fn add(&mut self, window: &mut InFlightWindow, offset: i64) {
        self.records += 1;
        if let Some(position) = window.finish(offset).expect("a record ends once") {
            self.position = Some(position);
        }
    }
}

/// What happened in the window.
enum Event {
    /// Records ended (one, and every other that had ended meanwhile).
    Ended(Vec<(i64, Processed)>),
    /// A publish was acknowledged (or abandoned) for these offsets.
    Published(Vec<i64>, bool),
}

/// A partition's records in handling, kept across fetches.
struct InFlight<'a> {
    window: InFlightWindow,
    /// Admitted to the window, waiting behind an earlier record of their key.
    admitted: Waiting,
    running: FuturesUnordered<Handling<'a>>,
    /// Republications decided while another publish is under way: they go
    /// out together once it is acknowledged.
    outbox: Outbox,
    /// The offsets of the outbox's records.
    unacknowledged: Vec<i64>,
    /// The publish under way, beside the handlers (they go on meanwhile).
    publishing: Option<Publishing<'a>>,
    /// A record was left or abandoned: the worker stops, nothing more starts.
    ending: bool,
}

impl<'a> InFlight<'a> {
    fn new(config: retry_core::window::WindowConfig) -> Self {
        InFlight {
            window: InFlightWindow::new(config, 0),
            admitted: Waiting::default(),
            running: FuturesUnordered::new(),
            outbox: Outbox::default(),
            unacknowledged: Vec::new(),
            publishing: None,
            ending: false,
        }
    }

    /// Whether records are in handling or republications in flight.
    fn busy(&self) -> bool {
        !self.running.is_empty() || self.publishing.is_some()
    }

    /// Starts the window over at `offset`; nothing may be in it.
    fn restart_at(&mut self, offset: i64) {
        debug_assert!(!self.busy() && self.outbox.is_empty());
        self.admitted.clear();
        self.window = InFlightWindow::new(*self.window.config(), offset);
    }

    /// The next thing to happen: records ending, or the publish under way
    /// ending. Only called when [`busy`](Self::busy).
    async fn next_event(&mut self) -> Event {
        let ended = async {
            if self.running.is_empty() {
                return std::future::pending().await;
            }
            let mut ended = vec![self.running.next().await.expect("records are running")];
            while let Some(Some(more)) = self.running.next().now_or_never() {
                ended.push(more);
            }
            ended
        };
        let published = async {
            match self.publishing.as_mut() {
                Some(publishing) => publishing.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ended = ended => Event::Ended(ended),
            (offsets, ok) = published => {
                self.publishing = None;
                Event::Published(offsets, ok)
            }
        }
    }
}

impl<H: RecordHandler> Worker<H> {
    /// Runs until stopped; `committed` is the group's committed offset.
    /// Records still in handling when it stops finish (or are abandoned
    /// after the grace period) before it returns.
    pub(crate) async fn run(self, committed: Option<i64>) {
        let mut in_flight = InFlight::new(self.shared.config.window);
        self.consume(&mut in_flight, committed).await;
        self.drain(&mut in_flight).await;
    }

    /// Fetches and hands records to the in-flight window until stopped.
    async fn consume<'a>(&'a self, in_flight: &mut InFlight<'a>, committed: Option<i64>) {
        let TopicPartition { topic, partition } = self.tp.clone();
        let Some(mut client) = self.connect().await else { return };
        let mut offset = match committed {
            Some(offset) => offset,
            None => {
                let policy = position::start_policy(self.shared.config.offset_reset, self.stage.rung().is_some());
                let Some(offset) = self.offset_at(&mut client, policy).await else { return };
                tracing::info!(%topic, partition, offset, reset = ?policy, "no committed offset; starting from the reset position");
                // Committed at once, so a later generation starts here
                // instead of resolving "latest" again past what came meanwhile.
                self.tracker.done(&self.tp, offset);
                offset
            }
        };
        tracing::info!(%topic, partition, offset, "partition assigned; consuming");
        in_flight.restart_at(offset);
        let mut backoff = pauses(Duration::from_millis(100), Duration::from_secs(5));
        let config = &self.shared.config;
        let max_inflated = config.max_batch_inflated_bytes();
        let mut reader =
            PartitionReader::new(&config.connection, &topic, partition, config.isolation_level, max_inflated);
        // What happens between fetches is decided by `fetches`, purely.
        let mut fetches = FetchLoop::new(self.max_fetch_bytes(), max_inflated);
        // Set while a batch larger than any fetch may bring holds the partition.
        let mut _oversized: Option<Stall> = None;
        // Brokers that answer an empty fetch at once, ignoring its max wait,
        // must not make an idle partition spin: wait longer after each.
        let fetch_max_wait = config.fetch_max_wait.max(Duration::from_millis(10));
        let mut idle = pauses(Duration::from_millis(10), fetch_max_wait);
        loop {
            let fetched_at = tokio::time::Instant::now();
            // Records in handling finish while the fetch waits.
            let fetch = self.unless_stopped(reader.fetch(offset, fetches.max_bytes(), config.fetch_max_wait));
            let Some(Some(result)) = self.drive(in_flight, fetch).await else { return };
            let outcome = match &result {
                Ok(f) => FetchOutcome::Read {
                    items: f.readable.items.len(),
                    next_offset: f.readable.next_offset,
                    end: f.end,
                    cut: f.cut,
                },
                Err(FetchError::OutOfRange) => FetchOutcome::OutOfRange,
                Err(FetchError::NoAnswer(_)) => FetchOutcome::NoAnswer,
                Err(FetchError::Failed(_)) => FetchOutcome::Failed,
            };
            let early = fetched_at.elapsed() < config.fetch_max_wait / 2;
            let step = fetches.step(offset, outcome, early);
            if step.reset_backoff {
                backoff.reset();
            }
            if step.reset_idle {
                idle.reset();
            }
            match step.oversized {
                Oversized::No => _oversized = None,
                Oversized::Begins => {
                    let max_bytes = step.max_bytes;
                    tracing::error!(%topic, partition, offset, max_bytes, "the partition is stalled: the broker answers this offset with part of a batch, or nothing, even at the decompression cap (raise the listener's max_batch_inflated, or, with the service stopped, move the group past this offset: `billing-bin offsets skip`)");
                    _oversized = Some(Stall::new(&self.shared, &self.tp));
                }
                Oversized::Still => {}
            }
            match (step.after, result) {
                (AfterFetch::Reconnect, _) => {
                    // The reader dropped the connection; the next fetch makes a new one.
                    self.shared.metrics.count(|s| &s.fetch_failures);
                    tracing::warn!(%topic, partition, offset, "a fetch got no answer; replacing the partition's connection");
                }
                (AfterFetch::CheckPosition(doubt), _) => {
                    // Some brokers answer a position past the end with an
                    // empty fetch instead of OFFSET_OUT_OF_RANGE; a new leader
                    // whose high watermark still trails, or a follower, can
                    // answer either. Check before resetting.
                    match self.check_position(&mut client, offset, doubt).await {
                        Some(new) if new != offset => {
                            // A new position: the records in handling end
                            // first, and the window starts over there.
                            if !self.drain(in_flight).await {
                                return;
                            }
                            offset = new;
                            in_flight.restart_at(offset);
                        }
                        Some(_) => {}
                        None => return,
                    }
                }
                (AfterFetch::Wait, _) => {}
                (AfterFetch::Grow, _) if step.oversized == Oversized::No => {
                    let max_bytes = step.max_bytes;
                    tracing::info!(%topic, partition, offset, max_bytes, "the batch at the position is larger than a fetch brought; fetching with more room");
                }
                (AfterFetch::Grow, _) => self.shared.metrics.count(|s| &s.fetch_failures),
                (AfterFetch::Process, Ok(fetched)) => {
                    let Readable { items, next_offset, aborted } = fetched.readable;
                    if aborted > 0 {
                        self.shared.metrics.add(|s| &s.aborted_records_skipped, aborted as u64);
                    }
                    // One at a time from the fetch's batches, as the window takes them.
                    let records = items.into_items().map(|item| Fetched::of(item, &topic, partition));
                    if !self.admit(in_flight, records, &mut offset, &client).await {
                        return;
                    }
                    // Past what carried nothing to handle (markers, aborted
                    // records, compacted offsets) after the last record.
                    if let Some(next) = next_offset.filter(|next| *next > offset) {
                        offset = next;
                        if let Some(position) = in_flight.window.skip_to(next) {
                            self.tracker.done(&self.tp, position);
                        }
                    }
                    self.shared.metrics.lag(&topic, partition, (fetched.end - offset).max(0));
                }
                (_, other) => {
                    self.shared.metrics.count(|s| &s.fetch_failures);
                    let error = other.err().map(|e| e.to_string()).unwrap_or_default();
                    tracing::warn!(%topic, partition, offset, %error, "fetch failed; retrying");
                }
            }
            let pause = match step.pause {
                Pause::None => continue,
                Pause::Backoff => backoff.next(),
                Pause::Idle => idle.next(),
            };
            // Records in handling finish while the partition pauses.
            if self.drive(in_flight, self.pause(pause)).await != Some(false) {
                return;
            }
        }
    }

    /// Admits a fetched batch to the partition's in-flight window and
    /// starts what it lets start: up to `max_in_flight` records at once, one
    /// at a time per key, in offset order per key. Returns once the whole
    /// batch is admitted and the window has room for more, so the next fetch
    /// overlaps the records still in handling. False when the worker must
    /// stop.
    async fn admit<'a>(
        &'a self,
        in_flight: &mut InFlight<'a>,
        records: impl Iterator<Item = Fetched> + Send,
        offset: &mut i64,
        client: &PartitionClient,
    ) -> bool {
        for record in records {
            if record.offset < *offset {
                continue; // the batch began before our position
            }
            if !self.make_room(in_flight, *offset, client).await {
                return false;
            }
            in_flight.window.admit(record.offset, record.key.as_deref()).expect("fetched offsets increase");
            let (at, next) = (record.offset, record.next_offset);
            *offset = next;
            in_flight.admitted.push(record);
            if next > at + 1 {
                // An undecodable batch stands for all its offsets.
                if let Some(position) = in_flight.window.skip_to(next) {
                    self.tracker.done(&self.tp, position);
                }
            }
            self.start_ready(in_flight);
        }
        self.make_room(in_flight, *offset, client).await
    }

    /// Handles the ends of records until the window has room, and the
    /// republications decided while one is under way fill less than a
    /// produce request (they wait in memory meanwhile). False when the
    /// worker must stop. While it waits, no fetch tells how far behind the
    /// partition is (records wait for the brake, for a slow handler, or for
    /// the broker): the lag gauge is measured from `position` now and then.
    async fn make_room<'a>(&'a self, in_flight: &mut InFlight<'a>, position: i64, client: &PartitionClient) -> bool {
        let mut measure_at = tokio::time::Instant::now() + LAG_WHILE_FULL;
        let max_outbox = self.shared.config.publish_max_request_bytes;
        while in_flight.window.room() == 0 || in_flight.outbox.bytes >= max_outbox {
            if self.signals.stop.is_cancelled() || !in_flight.busy() {
                return false;
            }
            let event = tokio::select! {
                event = in_flight.next_event() => event,
                () = tokio::time::sleep_until(measure_at) => {
                    // Set first: an event that cuts a measure short waits
                    // for the next one, instead of starting it again at once.
                    measure_at = tokio::time::Instant::now() + LAG_WHILE_FULL;
                    self.measure_lag(position, client).await;
                    continue;
                }
            };
            if !self.settle(in_flight, event) {
                return false;
            }
        }
        !self.signals.stop.is_cancelled()
    }

    /// Sets the lag gauge from the partition's end; a failure leaves it as
    /// it was (it is a gauge, the next measure will tell).
    async fn measure_lag(&self, position: i64, client: &PartitionClient) {
        let TopicPartition { topic, partition } = &self.tp;
        let timeout = self.shared.cluster.request_timeout();
        let what = || format!("reading the end of {topic}/{partition}");
        if let Ok(end) = deadline(timeout, what, client.get_offset(OffsetAt::Latest)).await {
            self.shared.metrics.lag(topic, *partition, end - position);
        }
    }

    /// Starts the records the window lets start, unless the worker stops.
    fn start_ready<'a>(&'a self, in_flight: &mut InFlight<'a>) {
        if self.signals.stop.is_cancelled() || in_flight.ending {
            return;
        }
        let TopicPartition { topic, partition } = &self.tp;
        for offset in in_flight.window.start_ready() {
            let record = in_flight.admitted.take(offset).expect("a started record was admitted");
            let span = tracing::info_span!(
                "record",
                %topic,
                partition,
                offset,
                key = tracing::field::Empty,
                attempt = self.stage.attempt()
            );
            // The key's text, and the span itself, only for a span someone
            // records.
            let recorded = !span.is_disabled();
            if recorded {
                let key = record.key.as_deref().map(|k| String::from_utf8_lossy(&k[..k.len().min(64)]).into_owned());
                span.record("key", key.as_deref().unwrap_or(""));
            }
            let handling = async move { (offset, self.process(record).await) };
            if recorded {
                in_flight.running.push(Box::pin(handling.instrument(span)));
            } else {
                in_flight.running.push(Box::pin(handling));
            }
        }
    }

    /// Awaits `work` while handling the ends of records meanwhile (and
    /// starting those they let start). `None` when a republication was
    /// abandoned: the worker must stop.
    async fn drive<'a, T>(
        &'a self,
        in_flight: &mut InFlight<'a>,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let mut work = std::pin::pin!(work);
        loop {
            if !in_flight.busy() {
                return Some(work.await);
            }
            let event = tokio::select! {
                output = &mut work => return Some(output),
                event = in_flight.next_event() => event,
            };
            if !self.settle(in_flight, event) {
                return None;
            }
        }
    }

    /// Waits for every record in handling to end (records not started are
    /// left to the partition's next owner when stopping) and publishes what
    /// they decided. False when abandoned meanwhile.
    async fn drain<'a>(&'a self, in_flight: &mut InFlight<'a>) -> bool {
        while in_flight.busy() {
            let event = in_flight.next_event().await;
            if !self.settle(in_flight, event) {
                // The handlers still running see the abandon too and end at once.
                in_flight.publishing = None;
                while in_flight.running.next().await.is_some() {}
                return false;
            }
        }
        true
    }

    /// Takes in what happened: records that ended move the commit position
    /// or go to the outbox; an acknowledged publish marks its records done.
    /// Then starts the next publish if none is under way, and the records
    /// the window lets start. False when a publish was abandoned.
    fn settle<'a>(&'a self, in_flight: &mut InFlight<'a>, event: Event) -> bool {
        // The partition's position is reported once, after all that ended.
        let mut finished = Finished::default();
        match event {
            Event::Ended(ended) => {
                for (offset, processed) in ended {
                    match processed {
                        Processed::Done => finished.add(&mut in_flight.window, offset),
                        Processed::Republish { record, dead_letter } => {
                            // Its key is free at once; it is done once acknowledged.
                            in_flight.window.release(offset).expect("a record ends once");
                            in_flight.outbox.push(record, dead_letter);
                            in_flight.unacknowledged.push(offset);
                        }
                        // Stopping: nothing more starts, the position stays below.
                        Processed::Left | Processed::Abandoned => in_flight.ending = true,
                    }
                }
            }
            Event::Published(_, false) => return false,
            Event::Published(offsets, true) => {
                for offset in offsets {
                    finished.add(&mut in_flight.window, offset);
                }
            }
        }
        if let Some(position) = finished.position {
            self.tracker.done_many(&self.tp, position, finished.records);
        }
        if in_flight.publishing.is_none() && !in_flight.outbox.is_empty() {
            let mut batch = std::mem::take(&mut in_flight.outbox);
            let offsets = std::mem::take(&mut in_flight.unacknowledged);
            in_flight.publishing = Some(Box::pin(async move {
                let ok = self.flush(&mut batch).await;
                (offsets, ok)
            }));
        }
        self.start_ready(in_flight);
        true
    }

    /// How much one fetch may bring: less on retry rungs, which mostly wait.
    fn max_fetch_bytes(&self) -> i32 {
        match self.stage.rung() {
            None => self.shared.config.fetch_max_bytes,
            Some(_) => self.shared.config.retry_fetch_max_bytes,
        }
    }

    /// Awaits `work` unless the worker is told to stop first (`None`).
    async fn unless_stopped<T>(&self, work: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::select! {
            _ = self.signals.stop.cancelled() => None,
            result = work => Some(result),
        }
    }

    /// Sleeps unless stopped; true when stopped.
    async fn pause(&self, d: Duration) -> bool {
        self.unless_stopped(tokio::time::sleep(d)).await.is_none()
    }

    /// Checks a position a fetch doubted against the log's range as the
    /// partition's leader reports it, and resets it, loudly and counted, only
    /// when it lies outside (see [`position`]). The position to go on from;
    /// `None` when stopped.
    async fn check_position(&self, client: &mut PartitionClient, offset: i64, doubt: Doubt) -> Option<i64> {
        let TopicPartition { topic, partition } = &self.tp;
        let log_start = self.offset_at(client, OffsetReset::Earliest).await?;
        let log_end = self.offset_at(client, OffsetReset::Latest).await?;
        let verdict = position::judge(offset, log_start, log_end);
        let policy = position::start_policy(self.shared.config.offset_reset, self.stage.rung().is_some());
        let reset_to = match (verdict, policy) {
            (Verdict::Keep, _) => {
                self.shared.metrics.count(|s| &s.positions_kept);
                tracing::info!(%topic, partition, offset, log_start, log_end, ?doubt, "the fetch doubted a position that lies within the log (a leader change?); keeping it");
                return Some(offset);
            }
            (_, OffsetReset::Earliest) => log_start,
            (_, OffsetReset::Latest) => log_end,
            (_, timed) => self.offset_at(client, timed).await?.clamp(log_start, log_end),
        };
        self.shared.metrics.offset_reset(topic);
        tracing::warn!(%topic, partition, offset, log_start, log_end, ?doubt, ?verdict, reset = ?policy, to = reset_to, "the position lies outside the log (retention deleted unread records, or the log was truncated); resetting");
        // What was finished before the reset means nothing in the log now:
        // the next commit and any later resume start here.
        self.tracker.reset(&self.tp, reset_to);
        Some(reset_to)
    }

    /// The partition's offset at `at`: its earliest, its latest, or the
    /// first at or after a time (its latest when no record is that recent),
    /// retried until it comes (on a new connection after one that did not
    /// answer); `None` when stopped.
    async fn offset_at(&self, client: &mut PartitionClient, at: OffsetReset) -> Option<i64> {
        let TopicPartition { topic, partition } = &self.tp;
        let time = |t: Timestamp| {
            let ms = t.as_millis().max(0);
            OffsetAt::Timestamp(chrono::DateTime::from_timestamp_millis(ms).unwrap_or(chrono::DateTime::UNIX_EPOCH))
        };
        let mut at = match at {
            OffsetReset::Earliest => OffsetAt::Earliest,
            OffsetReset::Latest => OffsetAt::Latest,
            OffsetReset::At(t) => time(t),
            OffsetReset::ByDuration(d) => {
                let now = Timestamp::from(std::time::SystemTime::now());
                time(Timestamp::from_millis(now.as_millis().saturating_sub(d.as_millis().min(i64::MAX as u128) as i64)))
            }
        };
        let mut backoff = pauses(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let what = || format!("reading the offsets of {topic}/{partition}");
            let call = deadline(self.shared.cluster.request_timeout(), what, client.get_offset(at));
            let result = self.unless_stopped(call).await?;
            match result {
                // No record is that recent: the end of the log, unless its
                // last record says otherwise (a broker that cannot look up
                // by time answers so for any time): then its start.
                Ok(offset) if offset < 0 && matches!(at, OffsetAt::Timestamp(_)) => {
                    let OffsetAt::Timestamp(time) = at else { unreachable!() };
                    let end = Box::pin(self.offset_at(client, OffsetReset::Latest)).await?;
                    let after = Timestamp::from_millis(time.timestamp_millis());
                    if !self.last_record_since(end, after).await {
                        return Some(end);
                    }
                    tracing::warn!(%topic, partition, "the broker found no record at or after the time asked, but the log's last record is that recent: it cannot look records up by time; starting at the earliest offset instead");
                    at = OffsetAt::Earliest;
                }
                Ok(offset) => return Some(offset),
                Err(e) => {
                    tracing::warn!(%topic, partition, error = %e, "cannot read the partition's offsets; retrying");
                    if matches!(e, Error::Deadline { .. }) {
                        *client = self.connect().await?;
                    } else if self.pause(backoff.next()).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Whether the record before `end` has a timestamp at or after `time`;
    /// false when it cannot be read.
    async fn last_record_since(&self, end: i64, time: Timestamp) -> bool {
        let TopicPartition { topic, partition } = &self.tp;
        if end <= 0 {
            return false;
        }
        let config = &self.shared.config;
        let mut reader = PartitionReader::new(
            &config.connection,
            topic,
            *partition,
            config.isolation_level,
            config.max_batch_inflated_bytes(),
        );
        let fetch = reader.fetch(end - 1, self.max_fetch_bytes(), Duration::ZERO);
        let Some(Ok(fetched)) = self.unless_stopped(fetch).await else { return false };
        fetched
            .readable
            .items
            .into_items()
            .any(|item| matches!(item, crate::protocol::fetch::Item::Record(r) if r.timestamp >= time.as_millis()))
    }

    /// A client of the partition on a new connection to its leader, retried
    /// until it comes; `None` when stopped.
    async fn connect(&self) -> Option<PartitionClient> {
        let TopicPartition { topic, partition } = &self.tp;
        let mut backoff = pauses(Duration::from_millis(200), Duration::from_secs(5));
        loop {
            let connect = self.shared.cluster.partition_client(topic, *partition, UnknownTopicHandling::Retry);
            let result = self.unless_stopped(connect).await?;
            match result {
                Ok(client) => return Some(client),
                Err(e) => {
                    self.shared.metrics.count(|s| &s.fetch_failures);
                    tracing::warn!(%topic, partition, error = %e, "cannot reach the partition; retrying");
                    self.unless_stopped(self.shared.cluster.refresh_metadata()).await?;
                    if self.pause(backoff.next()).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Handles one record: waits until it is due (on retry rungs), runs the
    /// handler, and says what to do with the outcome.
    async fn process(&self, record: Fetched) -> Processed {
        let TopicPartition { topic, partition } = &self.tp;
        let shared = &self.shared;
        let policy = &shared.config.policy();
        let Fetched { offset, key, value, headers, raw_headers, timestamp, codec, null_headers, poison, .. } = record;
        #[cfg(feature = "fault-injection")]
        if headers.get("x-fault-injection") == Some(b"panic-worker-once") {
            static SEEN: std::sync::Mutex<Vec<(String, i32, i64)>> = std::sync::Mutex::new(Vec::new());
            let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
            if !seen.contains(&(topic.clone(), *partition, offset)) {
                seen.push((topic.clone(), *partition, offset));
                drop(seen);
                panic!("fault injection: the worker of {topic}/{partition} panics at offset {offset}");
            }
        }
        if null_headers > 0 {
            shared.metrics.count(|s| &s.null_header_records);
            tracing::debug!(
                null_headers,
                "headers whose value is null are not shown to the handler (republications keep them)"
            );
        }
        let meta = RecordMeta { topic, partition: *partition, offset, timestamp, headers: &headers };
        let codec = shared.config.publish_compression.codec_for(codec);
        // The clock is read only where a decision needs it: a record of the
        // source that succeeds needs none.
        let clock = || Timestamp::from(std::time::SystemTime::now());
        if let Some(problem) = poison {
            let now = clock();
            // Nothing to hand to the handler: to the dead-letter topic as it is.
            shared.metrics.count(|s| &s.undecodable_records);
            tracing::error!(%problem, "dead-lettering what cannot be handled, as it is");
            let Decision::DeadLetter { topic: target, headers: decided, .. } =
                policy.undecodable(self.stage, &meta, &problem, now)
            else {
                unreachable!("an undecodable record is always dead-lettered")
            };
            let record = self.republication(&target, &raw_headers, &decided, key, value, now, codec);
            return Processed::Republish { record, dead_letter: true };
        }

        // Retry rungs wait until the record is due; stopping ends the wait
        // and leaves the record to the partition's next owner.
        if self.stage.rung().is_some() {
            let now = clock();
            let due = policy.due_at(self.stage, &meta, now);
            if due > now && self.pause(now.until(due)).await {
                return Processed::Left;
            }
        }

        let window = policy.config().max_event_age.is_some();

        let incoming = TraceContext::read(&headers);
        if let Incoming::Malformed(problem) = &incoming {
            shared.metrics.malformed_trace_context(topic);
            tracing::debug!(%problem, "the record's traceparent is ignored");
        }
        let group = shared.config.groups().of(self.stage).unwrap_or_default();
        let attempt =
            Attempt { topic, partition: *partition, offset, group, attempt: self.stage.attempt(), key: key.as_deref() };
        let mut span = shared.spans.attempt(incoming.context(), attempt);

        // The handler takes the headers; a failure's decision reads them
        // again from the record as written (success needs none).
        let mut consumed = Some(ConsumedRecord {
            topic: topic.clone(),
            partition: *partition,
            offset,
            key: key.clone(),
            value: value.clone(),
            headers,
            timestamp,
            attempt: self.stage.attempt(),
            trace: span.context().cloned(),
        });
        let mut read_again = None;
        // The outage brake may hold the record back before its call, and
        // after it, instead of dead-lettering it: then it runs again later.
        let mut held = None;
        let (outcome, now, decision) = loop {
            let ticket = match shared.brake.admit(&self.signals.stop, held.is_some()).await {
                None => return Processed::Left,
                Some(Admitted::Run(ticket)) => ticket,
                Some(Admitted::HoldExpired) => {
                    tracing::warn!("the brake has been engaged longer than its maximum: the record is dead-lettered");
                    break held.take().expect("only a held record is told its hold expired");
                }
            };
            // An event older than the downstream remembers its idempotency
            // key is not handed over: checked right before each call, after
            // any wait (a rung's delay, the brake).
            if window {
                let now = clock();
                let headers = &consumed.as_ref().expect("kept while the record may run again").headers;
                let meta = RecordMeta { topic, partition: *partition, offset, timestamp, headers };
                if let Some(decision) = policy.admit(self.stage, &meta, now) {
                    shared.metrics.count(|s| &s.past_idempotency_window);
                    let outcome = Err(HandlerError::permanent(dead_letter_error(&decision).unwrap_or_default()));
                    span.handled(&outcome);
                    break (outcome, now, decision);
                }
            }
            // A copy only when the brake may hold the record and run it again.
            let record = if shared.brake.is_on() { consumed.clone() } else { consumed.take() };
            let record = record.expect("a record runs again only when the brake is on");
            // Dropping the ticket unreported (abandoned) frees a probe's slot.
            let Some(outcome) = self.run_handler(record).await else { return Processed::Abandoned };
            span.handled(&outcome);
            shared.brake.finished(ticket, &outcome, self.stage);
            // A success is committed, which needs no time: only a failure's
            // decision (and its republication) reads the clock.
            let now = if outcome.is_ok() { Timestamp::from_millis(0) } else { clock() };
            let decision = match &outcome {
                Ok(()) => Decision::Commit,
                Err(_) => {
                    let headers = read_again.get_or_insert_with(|| valued_headers(&raw_headers).unwrap_or_default().0);
                    let meta = RecordMeta { topic, partition: *partition, offset, timestamp, headers };
                    policy.decide(self.stage, &meta, &outcome, now)
                }
            };
            if !shared.brake.holds(&decision) {
                break (outcome, now, decision);
            }
            shared.metrics.count(|s| &s.held_by_brake);
            tracing::info!(error = ?outcome.as_ref().err(), "retries exhausted while the brake is engaged: the record waits to run again instead of being dead-lettered");
            held = Some((outcome, now, decision));
        };
        let carried = span.carried().cloned();
        span.decided(&decision);
        let (target, mut headers, dead_letter) = match decision {
            Decision::Commit => {
                self.metrics.record_done(Outcome::Success, 1);
                return Processed::Done;
            }
            Decision::Retry { topic: target, due_at, headers } => {
                tracing::info!(%target, due_in_ms = now.until(due_at).as_millis() as u64, error = ?outcome.as_ref().err(), "retrying later");
                (target, headers, false)
            }
            Decision::DeadLetter { topic: target, reason, headers } => {
                tracing::warn!(%target, %reason, error = ?outcome.as_ref().err(), "dead-lettering");
                (target, headers, true)
            }
        };
        // The next attempt (or the dead letter) continues from this one.
        if let Some(context) = carried {
            context.write_into(&mut headers);
        }
        let record = self.republication(&target, &raw_headers, &headers, key, value, now, codec);
        Processed::Republish { record, dead_letter }
    }

    /// The record that goes to `target`: the key and value as read, the
    /// headers as read (`raw`) with ours as `decided`.
    #[allow(clippy::too_many_arguments)]
    fn republication(
        &self,
        target: &retry_core::TopicName,
        raw: &[crate::protocol::batch::RawHeader],
        decided: &retry_core::Headers,
        key: Option<bytes::Bytes>,
        value: Option<bytes::Bytes>,
        now: Timestamp,
        codec: crate::protocol::batch::Codec,
    ) -> Outgoing {
        Outgoing {
            topic: target.to_string(),
            source_partition: self.tp.partition,
            key,
            value,
            headers: republished_headers(raw, decided),
            timestamp: now,
            codec,
        }
    }

    /// Publishes what the outbox holds until the broker acknowledged all of
    /// it (the partition's other records wait meanwhile; heartbeats do
    /// not). False when abandoned.
    async fn flush(&self, outbox: &mut Outbox) -> bool {
        if outbox.is_empty() {
            return true;
        }
        let shared = &self.shared;
        let mut backoff = pauses(shared.config.publish_backoff_initial, shared.config.publish_backoff_max);
        let failing_since = tokio::time::Instant::now();
        let mut stall: Option<Stall> = None;
        let mut refused = Vec::new();
        loop {
            let tmp_n = outbox.records.len();
            let tmp_t = std::time::Instant::now(); // TEMP
            let result = tokio::select! {
                _ = self.signals.abandon.cancelled() => return false,
                result = shared.publisher.publish_all(&mut outbox.records, &mut refused) => result,
            };
            if std::env::var_os("TMP_PUBLISH_TRACE").is_some() {
                eprintln!("publish p{} n={} took={:?} at={:?}", self.tp.partition, tmp_n, tmp_t.elapsed(), tmp_t);
            } // TEMP
            let result = match self.dead_letter_refused(outbox, &mut refused) {
                Some(e) => Err(e),
                None if !outbox.is_empty() && result.is_ok() => continue, // the dead letters of refused retries
                None => result,
            };
            let Err(e) = result else { break };
            shared.metrics.publish_failed(outbox.records.first().map(|r| r.topic.as_str()));
            let failure = PublishFailure::of_error(&e);
            let pause = backoff.next();
            let stalled =
                failure != PublishFailure::Retriable || failing_since.elapsed() >= shared.config.publish_stall_after;
            match &stall {
                None if stalled => {
                    tracing::error!(error = %e, ?failure, left = outbox.records.len(), "the partition is stalled: its retries and dead letters cannot be published, and it waits until they can (fix the cause: brokers down with too few replicas in sync, ACLs, topic configs, record sizes)");
                    stall = Some(Stall::new(&self.shared, &self.tp));
                }
                None => {
                    tracing::warn!(error = %e, left = outbox.records.len(), retry_in_ms = pause.as_millis() as u64, "publish failed; the partition waits");
                }
                Some(_) => tracing::debug!(error = %e, "publish still failing; the partition stays stalled"),
            }
            tokio::select! {
                _ = self.signals.abandon.cancelled() => return false,
                _ = tokio::time::sleep(pause) => {}
            }
        }
        if stall.is_some() {
            tracing::info!(
                stalled_for_ms = failing_since.elapsed().as_millis() as u64,
                "publishing works again; the partition resumes"
            );
        }
        self.metrics.record_done(Outcome::Retry, outbox.retries);
        self.metrics.record_done(Outcome::DeadLetter, outbox.dead_letters);
        *outbox = Outbox::default();
        true
    }

    /// Sends the retries that their retry topic refused alone as too large
    /// (`refused`, emptied) to the dead-letter topic instead, back in
    /// `outbox`. A dead letter refused as too large cannot go anywhere: it
    /// goes back as it was, and its refusal is returned (the partition
    /// stalls on it until a topic's limit is raised, or an operator skips
    /// it).
    fn dead_letter_refused(
        &self,
        outbox: &mut Outbox,
        refused: &mut Vec<(Outgoing, crate::Error)>,
    ) -> Option<crate::Error> {
        let policy = self.shared.config.policy();
        let dead_letter_topic = policy.topology().dead_letter_topic().as_str();
        let mut stuck = None;
        for (mut record, e) in refused.drain(..) {
            if record.topic == dead_letter_topic {
                outbox.records.push(record);
                stuck.get_or_insert(e);
                continue;
            }
            let problem = format!("the retry topic {} refused the record as too large: {e}", record.topic);
            let retry = valued_headers(&record.headers).unwrap_or_default().0;
            let Decision::DeadLetter { topic, reason, headers } = policy.too_large_for_retry(&retry, &problem) else {
                unreachable!("a record too large for its retry topic is always dead-lettered")
            };
            tracing::warn!(%problem, %reason, target = %topic, "dead-lettering a record its retry topic refused");
            record.headers = republished_headers(&record.headers, &headers);
            record.topic = topic.to_string();
            outbox.records.push(record);
            outbox.retries -= 1;
            outbox.dead_letters += 1;
        }
        stuck
    }

    /// Runs the handler as [`HandlerCalls`] says: a panic is caught (a
    /// permanent failure), a call that runs out of time is cancelled (a
    /// transient one). `None` when the record was abandoned (the grace
    /// period of a revocation or shutdown ran out): the call is then
    /// cancelled too.
    async fn run_handler(&self, record: ConsumedRecord) -> Option<Result<(), HandlerError>> {
        match self.shared.config.handler_calls {
            HandlerCalls::Polled => self.poll_handler(record).await,
            HandlerCalls::Spawned => Box::pin(self.spawn_handler(record)).await,
        }
    }

    /// Polls the handler call here, beside the partition's other calls. It
    /// is first polled alone: a call that ends at once needs no timer and
    /// no watch of the abandon signal.
    async fn poll_handler(&self, record: ConsumedRecord) -> Option<Result<(), HandlerError>> {
        let timeout = self.shared.config.handler_timeout;
        let started = tokio::time::Instant::now();
        let mut call = std::pin::pin!(std::panic::AssertUnwindSafe(self.shared.handler.handle(record)).catch_unwind());
        let result = match (&mut call).now_or_never() {
            Some(ended) => Ok(ended),
            None => {
                tokio::select! {
                    // In this order: a call that ended counts as ended even
                    // when its time ran out, or it was abandoned, meanwhile.
                    biased;
                    ended = &mut call => Ok(ended),
                    _ = self.signals.abandon.cancelled() => return None,
                    _ = tokio::time::sleep_until(started + timeout) => Err(()),
                }
            }
        };
        let took = started.elapsed();
        self.metrics.handler_took(took);
        Some(match result {
            Ok(ended) => {
                // Well past its time (not a call that ended as its timer
                // came due): it held its thread, when nothing could cancel
                // it, and its outcome is known.
                if took > timeout + timeout / 10 {
                    let TopicPartition { topic, partition } = &self.tp;
                    self.shared.metrics.blocking_call(topic);
                    tracing::warn!(%topic, partition, took_ms = took.as_millis() as u64, timeout_ms = timeout.as_millis() as u64, "a handler call held its thread past its timeout (blocking work belongs in tokio::task::spawn_blocking): its partition waited, and its outcome counts");
                }
                match ended {
                    Ok(outcome) => outcome,
                    Err(panic) => self.panicked(panic_message(panic)),
                }
            }
            Err(()) => {
                // Dropped: cancelled.
                self.shared.metrics.count(|s| &s.handler_timeouts);
                Err(HandlerError::transient(format!("handler timed out after {timeout:?}")))
            }
        })
    }

    /// A handler call that panicked: a permanent failure.
    fn panicked(&self, message: String) -> Result<(), HandlerError> {
        self.shared.metrics.count(|s| &s.handler_panics);
        tracing::error!(panic = %message, "handler panicked");
        Err(HandlerError::permanent(format!("handler panicked: {message}")))
    }

    /// Runs the handler call in a task of its own. When abandoned, the
    /// call has ended when this returns, so nothing of it outlives the
    /// partition's ownership, unless it ignores its cancellation (see
    /// [`Worker::abort`]).
    async fn spawn_handler(&self, record: ConsumedRecord) -> Option<Result<(), HandlerError>> {
        let handler = self.shared.handler.clone();
        let mut task = tokio::spawn(async move { handler.handle(record).await });
        let timeout = self.shared.config.handler_timeout;
        // The timer's deadline says when the call started: one clock read
        // fewer per record.
        let expiry = tokio::time::sleep(timeout);
        let started = expiry.deadline() - timeout;
        let result = tokio::select! {
            // In this order: an abandon wins, and a call that ended counts
            // as ended even when its time ran out meanwhile.
            biased;
            _ = self.signals.abandon.cancelled() => {
                self.abort(task).await;
                return None;
            }
            result = &mut task => Ok(result),
            _ = expiry => Err(()),
        };
        self.metrics.handler_took(started.elapsed());
        Some(match result {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(join_error)) => self.panicked(match join_error.try_into_panic() {
                Ok(panic) => panic_message(panic),
                Err(e) => e.to_string(),
            }),
            Err(_) => {
                self.abort(task).await;
                self.shared.metrics.count(|s| &s.handler_timeouts);
                Err(HandlerError::transient(format!("handler timed out after {timeout:?}")))
            }
        })
    }

    /// Cancels a handler call and waits until it ended, for at most
    /// [`ABORT_WAIT`]: a call that ignores its cancellation (it blocks its
    /// thread and never reaches an await) runs on, detached, counted in the
    /// `kafka_retry_detached_handler_calls` gauge, and the listener is not
    /// ready until it ends: the partition has moved on, and whatever the
    /// call still does, it does for a record that is no longer this
    /// member's to finish.
    async fn abort(&self, mut task: tokio::task::JoinHandle<Result<(), HandlerError>>) {
        task.abort();
        if tokio::time::timeout(ABORT_WAIT, &mut task).await.is_ok() {
            return;
        }
        let TopicPartition { topic, partition } = &self.tp;
        tracing::error!(%topic, partition, waited = ?ABORT_WAIT, "a handler call ignores its cancellation (it blocks its thread?): it runs on, detached, and the listener is not ready until it ends");
        let impaired = Impaired::new(&self.shared);
        let metrics = self.shared.metrics.clone();
        let topic = topic.clone();
        metrics.detached_call(&topic, true);
        tokio::spawn(async move {
            let _ = task.await;
            metrics.detached_call(&topic, false);
            drop(impaired);
            tracing::info!(%topic, "a detached handler call ended at last");
        });
    }
}

/// What a panic said, when it said it with text.
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string payload".into())
}

/// The failure a dead-letter decision wrote in `x-error`.
fn dead_letter_error(decision: &Decision) -> Option<String> {
    let Decision::DeadLetter { headers, .. } = decision else { return None };
    headers.get(retry_core::header_names::ERROR).map(|e| String::from_utf8_lossy(e).into_owned())
}
