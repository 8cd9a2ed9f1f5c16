//! One assigned partition: fetch in order, wait until due (retry rungs),
//! handle, execute the decision, report the finished offset.

use std::{sync::Arc, time::Duration};

use retry_core::{Decision, HandlerError, RecordMeta, Stage, Timestamp};
use rskafka::client::{
    error::{Error as ClientError, ProtocolError},
    partition::{OffsetAt, PartitionClient, UnknownTopicHandling},
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    backoff::pauses,
    cluster::deadline,
    consumer::commit::CommitTracker,
    consumer::listener::{OffsetReset, Shared},
    consumer::position::{self, AfterFetch, Doubt, FetchOutcome, Verdict},
    metrics::{Outcome, TopicMetrics},
    protocol::fallback::{is_undecodable, Decoded, FallbackReader, Fetched},
    publisher::{Outgoing, PublishFailure},
    stats::bump,
    ConsumedRecord, Error, RecordHandler, TopicPartition,
};

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

/// How long a partition reads through the fallback reader after rskafka
/// failed one of its batches, before it tries rskafka again.
const FALLBACK_STICKS: Duration = Duration::from_secs(60);

/// The most republications a worker holds before sending them.
const MAX_OUTBOX: usize = 500;

/// Republications decided but not yet acknowledged.
#[derive(Default)]
struct Outbox {
    records: Vec<Outgoing>,
    retries: u64,
    dead_letters: u64,
}

impl Outbox {
    fn push(&mut self, record: Outgoing, dead_letter: bool) {
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
        shared.metrics.stalled(&tp.0, tp.1, true);
        Stall { stalled: shared.stalled.clone(), metrics: shared.metrics.clone(), tp: tp.clone() }
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        self.stalled.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.metrics.stalled(&self.tp.0, self.tp.1, false);
    }
}

enum Processed {
    Done,
    Abandoned,
}

impl<H: RecordHandler> Worker<H> {
    /// Runs until stopped; `committed` is the group's committed offset.
    pub(crate) async fn run(self, committed: Option<i64>) {
        let (topic, partition) = self.tp.clone();
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
        let mut backoff = pauses(Duration::from_millis(100), Duration::from_secs(5));
        let mut warned_fallback = false;
        // Set while a batch that no decoder reads holds the partition.
        let mut undecodable: Option<Stall> = None;
        let mut fallback = FallbackReader::new(&self.shared.config.connection, &topic, partition);
        // After rskafka failed a batch, the partition's next fetches go
        // straight to the fallback reader for a while: producers that
        // compress with lz4 or zstd do so for every batch, and each would
        // otherwise cost a failed rskafka fetch first.
        let mut fallback_until: Option<tokio::time::Instant> = None;
        // Brokers that answer an empty fetch at once, ignoring its max wait,
        // must not make an idle partition spin: wait longer after each.
        let mut idle = Duration::ZERO;
        loop {
            if fallback_until.is_some_and(|until| tokio::time::Instant::now() < until) {
                let max_bytes = self.max_fetch_bytes();
                let fetch = fallback.fetch(offset, max_bytes, self.shared.config.fetch_max_wait);
                let Some(result) = self.unless_stopped(fetch).await else { return };
                match result {
                    Ok(decoded) if decoded.next_offset.is_some_and(|next| next > offset) => {
                        if !self.take_decoded(decoded, &mut offset).await {
                            return;
                        }
                    }
                    // Caught up, or anything unusual: rskafka's path, which
                    // knows how to wait, to doubt a position and to recover.
                    Ok(_) => fallback_until = None,
                    Err(e) => {
                        tracing::debug!(%topic, partition, offset, error = %e, "the fallback reader failed; back to rskafka");
                        fallback_until = None;
                    }
                }
                continue;
            }
            let max_wait = i32::try_from(self.shared.config.fetch_max_wait.as_millis()).unwrap_or(i32::MAX);
            let fetch = client.fetch_records(offset, 1..self.max_fetch_bytes(), max_wait);
            // The broker may hold a fetch for its max wait, then answers.
            let fetch_deadline = self.shared.cluster.request_timeout() + self.shared.config.fetch_max_wait;
            let fetched_at = tokio::time::Instant::now();
            let Some(result) = self.unless_stopped(tokio::time::timeout(fetch_deadline, fetch)).await else { return };
            let outcome = match &result {
                Err(_) => FetchOutcome::NoAnswer,
                Ok(Ok((records, high_watermark))) => {
                    FetchOutcome::Records { count: records.len(), high_watermark: *high_watermark }
                }
                Ok(Err(ClientError::ServerError { protocol_error: ProtocolError::OffsetOutOfRange, .. })) => {
                    FetchOutcome::OutOfRange
                }
                Ok(Err(e)) if is_undecodable(e) => FetchOutcome::Undecodable,
                Ok(Err(_)) => FetchOutcome::Failed,
            };
            match (AfterFetch::of(offset, outcome), result) {
                (AfterFetch::Reconnect, _) => {
                    bump(&self.shared.stats.fetch_failures);
                    tracing::warn!(%topic, partition, offset, timeout = ?fetch_deadline, "a fetch got no answer; replacing the partition's connection");
                    let Some(new) = self.connect().await else { return };
                    client = new;
                }
                (AfterFetch::CheckPosition(doubt), _) => {
                    // Some brokers answer a position past the end with an
                    // empty fetch instead of OFFSET_OUT_OF_RANGE; a new leader
                    // whose high watermark still trails, or a follower, can
                    // answer either. Check before resetting.
                    match self.check_position(&mut client, offset, doubt).await {
                        Some(new) => offset = new,
                        None => return,
                    }
                    if self.pause(backoff.next()).await {
                        return;
                    }
                }
                (AfterFetch::Wait, _) => {
                    backoff.reset();
                    undecodable = None;
                    if fetched_at.elapsed() < self.shared.config.fetch_max_wait / 2 {
                        idle = (idle * 2).min(self.shared.config.fetch_max_wait).max(Duration::from_millis(10));
                        if self.pause(idle).await {
                            return;
                        }
                    }
                }
                (AfterFetch::Process, Ok(Ok((records, high_watermark)))) => {
                    backoff.reset();
                    undecodable = None;
                    idle = Duration::ZERO;
                    let records = records.into_iter().map(Fetched::from).collect();
                    if !self.process_batch(records, &mut offset).await {
                        return;
                    }
                    self.shared.metrics.lag(&topic, partition, high_watermark - offset);
                }
                (AfterFetch::Fallback, Ok(Err(e))) => {
                    bump(&self.shared.stats.undecodable_fetches);
                    // rskafka cannot decode this batch (e.g. a null header
                    // value): read it ourselves rather than stall forever.
                    let max_bytes = self.max_fetch_bytes();
                    let fetch = fallback.fetch(offset, max_bytes, Duration::ZERO);
                    let Some(decoded) = self.unless_stopped(fetch).await else { return };
                    match decoded {
                        Ok(decoded) if decoded.next_offset.is_some_and(|next| next > offset) => {
                            undecodable = None;
                            fallback_until = Some(tokio::time::Instant::now() + FALLBACK_STICKS);
                            // Said once per partition; the counter keeps the tally.
                            if !warned_fallback {
                                warned_fallback = true;
                                tracing::warn!(%topic, partition, offset, rskafka_error = %e, records = decoded.records.len(), "decoded a batch rskafka could not (null header values, lz4 or zstd, a transaction marker); later ones are counted in fallback_fetches");
                            } else {
                                tracing::debug!(%topic, partition, offset, records = decoded.records.len(), "decoded a batch rskafka could not");
                            }
                            if !self.take_decoded(decoded, &mut offset).await {
                                return;
                            }
                        }
                        other => {
                            bump(&self.shared.stats.fetch_failures);
                            let fallback_error =
                                other.err().map(|e| e.to_string()).unwrap_or_else(|| "no records".into());
                            if undecodable.is_none() {
                                tracing::error!(%topic, partition, offset, error = %e, %fallback_error, "the partition is stalled: a batch neither decoder can read; retrying (nothing is skipped: fix or delete the batch)");
                                undecodable = Some(Stall::new(&self.shared, &self.tp));
                            } else {
                                tracing::debug!(%topic, partition, offset, %fallback_error, "the batch is still undecodable");
                            }
                            if self.pause(backoff.next()).await {
                                return;
                            }
                        }
                    }
                }
                (_, other) => {
                    bump(&self.shared.stats.fetch_failures);
                    let error = other.ok().and_then(Result::err).map(|e| e.to_string()).unwrap_or_default();
                    tracing::warn!(%topic, partition, offset, %error, "fetch failed; retrying");
                    if self.unless_stopped(self.shared.cluster.refresh_metadata()).await.is_none() {
                        return;
                    }
                    if self.pause(backoff.next()).await {
                        return;
                    }
                }
            }
        }
    }

    /// Handles what the fallback decoder read, and moves past the control
    /// batches (transaction markers) after its records. False when the
    /// worker must stop.
    async fn take_decoded(&self, decoded: Decoded, offset: &mut i64) -> bool {
        bump(&self.shared.stats.fallback_fetches);
        let next = decoded.next_offset.unwrap_or(*offset);
        if !decoded.records.is_empty() && !self.process_batch(decoded.records, offset).await {
            return false;
        }
        if next > *offset {
            *offset = next;
            self.tracker.done(&self.tp, next);
        }
        true
    }

    /// Handles a fetched batch in order. Its republications are sent
    /// together, one request per target partition, and its offsets are
    /// reported done only once they are all acknowledged. False when the
    /// worker must stop.
    async fn process_batch(&self, records: Vec<Fetched>, offset: &mut i64) -> bool {
        let (topic, partition) = &self.tp;
        let mut outbox = Outbox::default();
        for r in records {
            if r.offset < *offset {
                continue; // the batch began before our position
            }
            if self.signals.stop.is_cancelled() {
                break;
            }
            let key = r.key.as_deref().map(|k| String::from_utf8_lossy(&k[..k.len().min(64)]).into_owned());
            let span = tracing::info_span!(
                "record",
                %topic,
                partition,
                offset = r.offset,
                key = key.as_deref().unwrap_or(""),
                attempt = self.attempt()
            );
            let next = r.offset + 1;
            match self.process(r, &mut outbox).instrument(span).await {
                Processed::Done => {
                    *offset = next;
                    if outbox.is_empty() {
                        self.tracker.done(&self.tp, next);
                    }
                }
                Processed::Abandoned => return false,
            }
            if outbox.records.len() >= MAX_OUTBOX && !self.flush(&mut outbox, *offset).await {
                return false;
            }
        }
        self.flush(&mut outbox, *offset).await && !self.signals.stop.is_cancelled()
    }

    /// How much one fetch may bring: less on retry rungs, which mostly wait.
    fn max_fetch_bytes(&self) -> i32 {
        match self.stage.rung() {
            None => self.shared.config.fetch_max_bytes,
            Some(_) => self.shared.config.retry_fetch_max_bytes,
        }
    }

    /// Which attempt a record of this stage gets: 1 on the source topic.
    fn attempt(&self) -> u32 {
        self.stage.rung().map_or(1, |rung| rung as u32 + 2)
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
        let (topic, partition) = &self.tp;
        let log_start = self.offset_at(client, OffsetReset::Earliest).await?;
        let log_end = self.offset_at(client, OffsetReset::Latest).await?;
        let verdict = position::judge(offset, log_start, log_end);
        let policy = position::start_policy(self.shared.config.offset_reset, self.stage.rung().is_some());
        let reset_to = match (verdict, policy) {
            (Verdict::Keep, _) => {
                bump(&self.shared.stats.positions_kept);
                tracing::info!(%topic, partition, offset, log_start, log_end, ?doubt, "the fetch doubted a position that lies within the log (a leader change?); keeping it");
                return Some(offset);
            }
            (_, OffsetReset::Earliest) => log_start,
            (_, OffsetReset::Latest) => log_end,
        };
        bump(&self.shared.stats.offset_resets);
        self.shared.metrics.offset_reset(topic);
        tracing::warn!(%topic, partition, offset, log_start, log_end, ?doubt, ?verdict, reset = ?policy, to = reset_to, "the position lies outside the log (retention deleted unread records, or the log was truncated); resetting");
        // What was finished before the reset means nothing in the log now:
        // the next commit and any later resume start here.
        self.tracker.reset(&self.tp, reset_to);
        Some(reset_to)
    }

    /// The partition's earliest or latest offset, retried until it comes
    /// (on a new connection after one that did not answer); `None` when stopped.
    async fn offset_at(&self, client: &mut PartitionClient, at: OffsetReset) -> Option<i64> {
        let (topic, partition) = &self.tp;
        let at = match at {
            OffsetReset::Earliest => OffsetAt::Earliest,
            OffsetReset::Latest => OffsetAt::Latest,
        };
        let mut backoff = pauses(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let what = || format!("reading the offsets of {topic}/{partition}");
            let call = deadline(self.shared.cluster.request_timeout(), what, client.get_offset(at));
            let result = self.unless_stopped(call).await?;
            match result {
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

    /// A client of the partition on a new connection to its leader, retried
    /// until it comes; `None` when stopped.
    async fn connect(&self) -> Option<PartitionClient> {
        let (topic, partition) = &self.tp;
        let mut backoff = pauses(Duration::from_millis(200), Duration::from_secs(5));
        loop {
            let connect = self.shared.cluster.partition_client(topic, *partition, UnknownTopicHandling::Retry);
            let result = self.unless_stopped(connect).await?;
            match result {
                Ok(client) => return Some(client),
                Err(e) => {
                    bump(&self.shared.stats.fetch_failures);
                    tracing::warn!(%topic, partition, error = %e, "cannot reach the partition; retrying");
                    self.unless_stopped(self.shared.cluster.refresh_metadata()).await?;
                    if self.pause(backoff.next()).await {
                        return None;
                    }
                }
            }
        }
    }

    async fn process(&self, record: Fetched, outbox: &mut Outbox) -> Processed {
        let (topic, partition) = &self.tp;
        let shared = &self.shared;
        let policy = &shared.config.policy;
        let Fetched { offset, key, value, headers, timestamp, null_headers } = record;
        if !null_headers.is_empty() {
            bump(&shared.stats.null_headers_dropped);
            tracing::warn!(?null_headers, "dropping header values that are null: records here carry none");
        }
        let meta = RecordMeta { topic, partition: *partition, offset, timestamp, headers: &headers };

        // Retry rungs wait until the record is due; stopping ends the wait
        // and leaves the record to the partition's next owner.
        let now = Timestamp::from(std::time::SystemTime::now());
        let due = policy.due_at(self.stage, &meta, now);
        if due > now {
            // Nothing already decided waits behind a due time.
            if !self.flush(outbox, offset).await {
                return Processed::Abandoned;
            }
            if self.pause(now.until(due)).await {
                return Processed::Abandoned;
            }
        }

        let consumed = ConsumedRecord {
            topic: topic.clone(),
            partition: *partition,
            offset,
            key: key.clone(),
            value: value.clone(),
            headers: headers.clone(),
            timestamp,
            attempt: self.attempt(),
        };
        let Some(outcome) = self.run_handler(consumed).await else { return Processed::Abandoned };
        let now = Timestamp::from(std::time::SystemTime::now());
        let decision = policy.decide(self.stage, &meta, &outcome, now);
        let (target, headers, dead_letter) = match decision {
            Decision::Commit => {
                bump(&shared.stats.succeeded);
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
        outbox.push(
            Outgoing { topic: target.to_string(), source_partition: *partition, key, value, headers, timestamp: now },
            dead_letter,
        );
        Processed::Done
    }

    /// Publishes what the outbox holds until the broker acknowledged all of
    /// it (the partition waits meanwhile; heartbeats do not), then reports
    /// every record before `next_offset` done. False when abandoned.
    async fn flush(&self, outbox: &mut Outbox, next_offset: i64) -> bool {
        if outbox.is_empty() {
            return true;
        }
        let shared = &self.shared;
        let mut backoff = pauses(shared.config.publish_backoff_initial, shared.config.publish_backoff_max);
        let failing_since = tokio::time::Instant::now();
        let mut stall: Option<Stall> = None;
        loop {
            let result = tokio::select! {
                _ = self.signals.abandon.cancelled() => return false,
                result = shared.publisher.publish_all(&mut outbox.records) => result,
            };
            let Err(e) = result else { break };
            bump(&shared.stats.publish_failures);
            if let Some(first) = outbox.records.first() {
                shared.metrics.publish_failed(&first.topic);
            }
            let failure = PublishFailure::of_error(&e);
            let pause = backoff.next();
            let stalled =
                failure != PublishFailure::Retriable || failing_since.elapsed() >= shared.config.publish_stall_after;
            match &stall {
                None if stalled => {
                    tracing::error!(error = %e, ?failure, left = outbox.records.len(), "the partition is stalled: its retries and dead letters cannot be published, and it waits until they can (fix the cause: ACLs, topic configs, record sizes)");
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
        shared.stats.retried.fetch_add(outbox.retries, std::sync::atomic::Ordering::Relaxed);
        shared.stats.dead_lettered.fetch_add(outbox.dead_letters, std::sync::atomic::Ordering::Relaxed);
        self.metrics.record_done(Outcome::Retry, outbox.retries);
        self.metrics.record_done(Outcome::DeadLetter, outbox.dead_letters);
        *outbox = Outbox::default();
        self.tracker.done(&self.tp, next_offset);
        true
    }

    /// Runs the handler in a task of its own, so a panic is caught and a
    /// timeout can cancel it. `None` when the record was abandoned (the
    /// grace period of a revocation or shutdown ran out): the call is then
    /// cancelled too, and has ended when this returns, so nothing of it
    /// outlives the partition's ownership.
    async fn run_handler(&self, record: ConsumedRecord) -> Option<Result<(), HandlerError>> {
        let handler = self.shared.handler.clone();
        let mut task = tokio::spawn(async move { handler.handle(record).await });
        let timeout = self.shared.config.handler_timeout;
        let started = tokio::time::Instant::now();
        let result = tokio::select! {
            _ = self.signals.abandon.cancelled() => {
                task.abort();
                let _ = (&mut task).await;
                return None;
            }
            result = tokio::time::timeout(timeout, &mut task) => result,
        };
        self.metrics.handler_took(started.elapsed());
        Some(match result {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(join_error)) => {
                bump(&self.shared.stats.handler_panics);
                let message = match join_error.try_into_panic() {
                    Ok(panic) => panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a non-string payload".into()),
                    Err(e) => e.to_string(),
                };
                tracing::error!(panic = %message, "handler panicked");
                Err(HandlerError::permanent(format!("handler panicked: {message}")))
            }
            Err(_) => {
                task.abort();
                let _ = task.await;
                bump(&self.shared.stats.handler_timeouts);
                Err(HandlerError::transient(format!("handler timed out after {timeout:?}")))
            }
        })
    }
}
