//! The in-flight window against a real broker: records of different keys
//! handled at once, each key in offset order, the commit position never past
//! an unfinished record, and retry rungs whose records are due at mixed times.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use retry_core::{header_names, HandlerError};
use retry_kafka::{ConsumedRecord, Listener, RecordHandler};

use crate::support::{committed, eventually, produce, produce_batch, read_partition, Ladder, SETTLE};

/// A handler that takes `latency` per record, fails the keys it is told
/// to once, hangs on the offsets it is told to, and notes what it saw.
#[derive(Default)]
struct Observer {
    latency: Duration,
    hang_on: HashSet<(String, i64)>,
    fail_once: Mutex<HashSet<String>>,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// Keys being handled now.
    active: HashSet<String>,
    running: usize,
    most_at_once: usize,
    /// Per (topic, key), the offsets handled in order of their start.
    order: BTreeMap<(String, String), Vec<i64>>,
    /// A key handled twice at once, if that ever happened.
    overlap: Option<String>,
    calls: usize,
}

impl Observer {
    fn snapshot<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.seen.lock().unwrap())
    }
}

impl RecordHandler for Observer {
    async fn handle(&self, record: ConsumedRecord) -> Result<(), HandlerError> {
        let key = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
        {
            let mut seen = self.seen.lock().unwrap();
            if !seen.active.insert(key.clone()) {
                seen.overlap.get_or_insert(key.clone());
            }
            seen.running += 1;
            seen.most_at_once = seen.most_at_once.max(seen.running);
            seen.order.entry((record.topic.clone(), key.clone())).or_default().push(record.offset);
            seen.calls += 1;
        }
        struct Leave<'a>(&'a Observer, String);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                let mut seen = self.0.seen.lock().unwrap();
                seen.active.remove(&self.1);
                seen.running -= 1;
            }
        }
        let _leave = Leave(self, key.clone());
        if self.hang_on.contains(&(record.topic.clone(), record.offset)) {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(self.latency).await;
        if self.fail_once.lock().unwrap().remove(&key) {
            return Err(HandlerError::transient(format!("{key} fails once")));
        }
        Ok(())
    }
}

/// `n` records over `keys` keys (`k0`, `k1`, ...), round robin, in one batch.
fn records(n: usize, keys: usize) -> Vec<(String, String)> {
    (0..n).map(|i| (format!("k{}", i % keys), format!("{{\"i\": {i}}}"))).collect()
}

#[track_caller]
fn assert_key_order(observer: &Observer) {
    observer.snapshot(|seen| {
        assert_eq!(seen.overlap, None, "a key was handled twice at once");
        for ((topic, key), offsets) in &seen.order {
            assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{topic} {key}: offsets out of order {offsets:?}");
        }
    });
}

async fn start(ladder: &Ladder, observer: Arc<Observer>, max_in_flight: usize) -> Listener {
    let window = retry_core::window::WindowConfig::new(max_in_flight, retry_core::window::NullKeys::Ordered).unwrap();
    start_with(ladder, observer, window).await
}

async fn start_with(ladder: &Ladder, observer: Arc<Observer>, window: retry_core::window::WindowConfig) -> Listener {
    let mut config = ladder.config();
    config.window = window;
    // A record that hangs must stay unfinished while a test looks.
    config.handler_timeout = Duration::from_secs(120);
    config.rebalance_timeout = Duration::from_secs(130);
    integration::within("start", Listener::start(config, observer)).await.unwrap()
}

#[tokio::test]
async fn many_keys_are_handled_at_once_and_each_key_in_offset_order() {
    let ladder = Ladder::create("window-keys", "1s", 1).await;
    produce_batch(ladder.source(), 0, &records(300, 30)).await;
    let observer = Arc::new(Observer { latency: Duration::from_millis(50), ..Default::default() });
    let listener = start(&ladder, observer.clone(), 64).await;
    eventually("every record handled", SETTLE, || async { (observer.snapshot(|s| s.calls) >= 300).then_some(()) })
        .await;
    eventually("the source committed to its end", SETTLE, || async {
        (committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0] == Some(300)).then_some(())
    })
    .await;
    listener.shutdown().await;
    assert_key_order(&observer);
    let (calls, most) = observer.snapshot(|s| (s.calls, s.most_at_once));
    assert_eq!(calls, 300, "each record once");
    // Thirty keys ready at once, each call 50 ms: they overlap.
    assert!(most > 1, "records of different keys were never handled at once");
    eprintln!("300 records, 30 keys: up to {most} handled at once");
}

#[tokio::test]
async fn one_hot_key_is_handled_one_record_at_a_time() {
    let ladder = Ladder::create("window-hot", "1s", 1).await;
    produce_batch(ladder.source(), 0, &records(40, 1)).await;
    let observer = Arc::new(Observer { latency: Duration::from_millis(5), ..Default::default() });
    let listener = start(&ladder, observer.clone(), 64).await;
    eventually("every record handled", SETTLE, || async { (observer.snapshot(|s| s.calls) >= 40).then_some(()) }).await;
    listener.shutdown().await;
    assert_key_order(&observer);
    assert_eq!(observer.snapshot(|s| s.most_at_once), 1);
}

/// A record that never finishes holds the commit position while the
/// records after it (other keys) are handled, up to what the window may
/// hold; a crash then redelivers at most that.
#[tokio::test]
async fn a_crash_with_a_full_window_redelivers_at_most_the_window() {
    let ladder = Ladder::create("window-crash", "1s", 1).await;
    let first = produce_batch(ladder.source(), 0, &records(100, 50)).await;
    let stuck = (ladder.source().to_owned(), first);
    let observer = Arc::new(Observer { hang_on: HashSet::from([stuck]), ..Default::default() });
    // Eight in handling, sixteen in all.
    let window = retry_core::window::WindowConfig::new(8, retry_core::window::NullKeys::Ordered)
        .and_then(|w| w.with_max_uncommitted(16))
        .unwrap();
    let listener = start_with(&ladder, observer.clone(), window).await;
    // The stuck record and fifteen more done above it: the window is full.
    eventually("a full window", SETTLE, || async { (observer.snapshot(|s| s.calls) >= 16).then_some(()) }).await;
    let position = committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0];
    assert!(position.is_none_or(|p| p <= first), "committed {position:?} past the unfinished record at {first}");
    let handled_before = observer.snapshot(|s| s.calls);
    assert_eq!(handled_before, 16, "the window holds sixteen records, no more are taken");
    listener.abort();

    let after = Arc::new(Observer::default());
    let listener = start(&ladder, after.clone(), 8).await;
    eventually("every record handled after the crash", SETTLE, || async {
        (committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0] == Some(first + 100))
            .then_some(())
    })
    .await;
    listener.shutdown().await;
    assert_key_order(&after);
    // Everything from the unfinished record on, once: the fifteen records
    // done before the crash (within the window) are the only ones seen twice.
    assert_eq!(after.snapshot(|s| s.calls), 100);
}

/// On a retry rung, a record due later does not hold up a record behind it
/// that is due now.
#[tokio::test]
async fn a_rung_record_due_now_passes_one_due_later() {
    let ladder = Ladder::create("window-rung", "20s", 1).await;
    let observer =
        Arc::new(Observer { fail_once: Mutex::new(HashSet::from(["later".to_owned()])), ..Default::default() });
    let listener = start(&ladder, observer.clone(), 64).await;
    produce(ladder.source(), 0, "later", "{}", &[]).await;
    // "later" failed once: it waits on the rung for 20 s.
    let rung = ladder.retry(0).to_owned();
    let parked =
        eventually("the record on the rung", SETTLE, || async { read_partition(&rung, 0).await.into_iter().next() })
            .await;
    // Behind it, a record due now: the same retry headers, an earlier due time.
    let mut headers: Vec<(String, Vec<u8>)> = parked.record.headers.clone().into_iter().collect();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    for (name, value) in headers.iter_mut() {
        if name == header_names::DUE_AT {
            *value = now.to_string().into_bytes();
        }
    }
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
    produce(&rung, 0, "now", "{}", &headers).await;
    eventually("the record due now handled", Duration::from_secs(10), || async {
        observer.snapshot(|s| s.order.contains_key(&(rung.clone(), "now".to_owned()))).then_some(())
    })
    .await;
    assert!(
        !observer.snapshot(|s| s.order.contains_key(&(rung.clone(), "later".to_owned()))),
        "the record due in 20 s was handled before its time"
    );
    listener.shutdown().await;
}

/// A second member joins while the first has full windows on both
/// partitions: the partition that moves is drained (its records in
/// handling finish and are committed) before the new owner reads it, so
/// every record is handled exactly once and no key by two members at once.
/// (The mock cluster refuses the commit of the ending generation, so there
/// the moved records come again: at least once, as promised.)
#[tokio::test]
async fn a_revocation_with_a_full_window_hands_over_without_redelivery() {
    let ladder = Ladder::create("window-revoke", "1s", 2).await;
    for partition in 0..2 {
        let batch: Vec<(String, String)> =
            (0..100).map(|i| (format!("p{partition}-k{}", i % 40), format!("{{\"i\": {i}}}"))).collect();
        produce_batch(ladder.source(), partition, &batch).await;
    }
    let observer = Arc::new(Observer { latency: Duration::from_millis(300), ..Default::default() });
    let first = start(&ladder, observer.clone(), 16).await;
    eventually("full windows", SETTLE, || async { (observer.snapshot(|s| s.running) >= 30).then_some(()) }).await;
    let second = start(&ladder, observer.clone(), 16).await;
    eventually("every record handled and committed", Duration::from_secs(90), || async {
        let committed = committed(&ladder.connection, &ladder.group_id, ladder.source(), 2).await;
        (committed.values().all(|o| *o == Some(100))).then_some(())
    })
    .await;
    first.shutdown().await;
    second.shutdown().await;
    assert_key_order(&observer);
    assert_eq!(observer.snapshot(|s| s.calls), 200, "a record was handled twice (or lost) across the hand-over");
}
