//! Operators' work on a dead-letter topic: status, browse, replay, acknowledge.

use retry_core::{operators::ReplaySelection, replay::ReplayGuards, replay::ReplayTarget};
use retry_kafka::{Acknowledgement, BrowsePage, DeadLetterAdmin, Error, PartitionReplay, ReplayRequest};

use crate::support::{eventually, produce, start_joined, Ladder, Scripted, Step, SETTLE};

fn replay(target: ReplayTarget) -> ReplayRequest {
    ReplayRequest {
        target,
        dry_run: false,
        selection: ReplaySelection::default(),
        guards: ReplayGuards { max_replays: Some(3), max_age: None },
    }
}

fn keys(keys: &[&str]) -> ReplaySelection {
    ReplaySelection { keys: Some(keys.iter().map(|k| k.as_bytes().to_vec()).collect()), ..Default::default() }
}

/// A ladder whose handler fails `keys` permanently the first time, and the
/// listener that dead-lettered them.
async fn with_dead_letters(name: &str, keys: &[&str]) -> (Ladder, std::sync::Arc<Scripted>, retry_kafka::Listener) {
    let ladder = Ladder::create(name, "100ms", 1).await;
    let script: Vec<(&str, &[Step])> = keys.iter().map(|k| (*k, &[Step::Permanent][..])).collect();
    let handler = Scripted::new(&script);
    let listener = start_joined(&ladder, handler.clone()).await;
    for key in keys {
        produce(ladder.source(), 0, key, "v", &[("traceparent", b"t-1")]).await;
    }
    eventually("the dead letters", SETTLE, || async {
        (listener.stats().snapshot().dead_lettered == keys.len() as u64).then_some(())
    })
    .await;
    (ladder, handler, listener)
}

async fn admin(ladder: &Ladder) -> DeadLetterAdmin {
    DeadLetterAdmin::connect(ladder.connection.clone(), ladder.policy.clone(), &ladder.groups()).await.unwrap()
}

#[tokio::test]
async fn replay_brings_dead_letters_back_once_and_dry_runs_change_nothing() {
    let (ladder, handler, listener) = with_dead_letters("replay", &["a", "b", "c"]).await;
    let admin = admin(&ladder).await;
    let status = admin.status().await.unwrap();
    assert_eq!((status.backlog, status.partitions[0].end, status.partitions[0].acknowledged), (3, 3, None));
    let seen = admin.browse(0, 0, 10).await.unwrap();
    let keys: Vec<&[u8]> = seen.iter().map(|d| d.key.as_deref().unwrap()).collect();
    assert_eq!(keys, [b"a", b"b", b"c"]);
    let headers = seen[0].retry_headers().unwrap();
    assert_eq!((headers.original_topic.as_str(), headers.original_offset), (ladder.source(), 0));
    assert_eq!(seen[0].headers.get("traceparent"), Some(&b"t-1"[..]));

    let dry = admin.replay(&ReplayRequest { dry_run: true, ..replay(ReplayTarget::Source) }).await.unwrap();
    let covered = PartitionReplay { partition: 0, from: 0, to: 3, replayed: 3, position: 0, error: None };
    assert_eq!((dry.replayed, dry.partitions.clone(), dry.dry_run), (3, vec![covered], true));
    assert_eq!(admin.status().await.unwrap().backlog, 3, "a dry run changes nothing");

    let done = admin.replay(&replay(ReplayTarget::Source)).await.unwrap();
    assert_eq!((done.replayed, done.target.as_str()), (3, ladder.source()));
    assert_eq!(admin.status().await.unwrap().backlog, 0);
    eventually("the replayed records handled", SETTLE, || async {
        (["a", "b", "c"].iter().all(|k| handler.attempts(k) == [1, 1])).then_some(())
    })
    .await;
    let again = admin.replay(&replay(ReplayTarget::Source)).await.unwrap();
    assert_eq!(again.replayed, 0, "a second replay replays nothing");
    listener.shutdown().await;
}

#[tokio::test]
async fn replay_to_the_first_rung_and_the_loop_guard() {
    let (ladder, handler, listener) = with_dead_letters("replay-rung", &["x"]).await;
    let admin = admin(&ladder).await;
    // Replayed three times already, by the headers: the guard refuses it.
    let first = admin.browse(0, 0, 1).await.unwrap().remove(0);
    let mut headers: Vec<(&str, Vec<u8>)> = first.headers.iter().map(|(k, v)| (k, v.to_vec())).collect();
    headers.retain(|(k, _)| *k != "x-replay-count");
    headers.push(("x-replay-count", b"3".to_vec()));
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    produce(ladder.dlq(), 0, "looping", "v", &headers).await;

    let report = admin.replay(&replay(ReplayTarget::FirstRetry)).await.unwrap();
    assert_eq!(report.replayed, 1);
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert!(report.skipped[0].reason.contains("replayed 3 times already"), "{report:?}");
    assert_eq!(admin.status().await.unwrap().backlog, 1, "the refused record stays in the backlog");
    eventually("x on the first rung", SETTLE, || async { (handler.attempts("x") == [1, 2]).then_some(()) }).await;

    let mut lifted = replay(ReplayTarget::FirstRetry);
    lifted.guards.max_replays = None;
    let lifted = admin.replay(&lifted).await.unwrap();
    assert_eq!(lifted.replayed, 1);
    assert_eq!(admin.status().await.unwrap().backlog, 0);
    listener.shutdown().await;
}

#[tokio::test]
async fn acknowledging_drops_records_from_the_backlog_without_replaying() {
    let (ladder, handler, listener) = with_dead_letters("ack", &["p", "q", "r"]).await;
    let admin = admin(&ladder).await;
    assert_eq!(admin.acknowledge(0, &Acknowledgement::UpTo(1)).await.unwrap().next(), 2);
    assert_eq!(admin.status().await.unwrap().backlog, 1);
    assert_eq!(admin.acknowledge(0, &Acknowledgement::UpTo(0)).await.unwrap().next(), 2, "never moves back");
    let only_r = ReplayRequest { selection: keys(&["r"]), ..replay(ReplayTarget::Source) };
    assert_eq!(admin.replay(&only_r).await.unwrap().replayed, 1);
    eventually("r replayed", SETTLE, || async { (handler.attempts("r") == [1, 1]).then_some(()) }).await;
    assert_eq!(handler.attempts("p"), [1], "acknowledged records are not replayed");
    assert_eq!(admin.browse(0, 0, 10).await.unwrap().len(), 3, "they stay in the topic for audit");
    listener.shutdown().await;
}

/// A replay by key replays the records in the middle of the backlog and
/// records them with the operators' position: repeating it replays nothing,
/// and a replay of everything later skips them.
#[tokio::test]
async fn targeted_replays_are_recorded_and_never_repeated() {
    let (ladder, handler, listener) = with_dead_letters("replay-targeted", &["a", "b", "c"]).await;
    let admin = admin(&ladder).await;
    let only_b = ReplayRequest { selection: keys(&["b"]), ..replay(ReplayTarget::Source) };
    assert_eq!(admin.replay(&only_b).await.unwrap().replayed, 1);
    assert_eq!(admin.replay(&only_b).await.unwrap().replayed, 0, "a repeat replays nothing");
    let status = admin.status().await.unwrap();
    let p = &status.partitions[0];
    assert_eq!((p.acknowledged, p.handled_above, p.backlog), (Some(0), 1, 2), "{status:?}");

    let by_offset = ReplayRequest {
        selection: ReplaySelection { offsets: Some([1, 2].into()), ..Default::default() },
        ..replay(ReplayTarget::Source)
    };
    assert_eq!(admin.replay(&by_offset).await.unwrap().replayed, 1, "b was replayed already, c was not");
    let everything = admin.replay(&replay(ReplayTarget::Source)).await.unwrap();
    assert_eq!(everything.replayed, 1, "only a is left: {everything:?}");
    let status = admin.status().await.unwrap();
    assert_eq!(
        (status.partitions[0].acknowledged, status.partitions[0].handled_above, status.backlog),
        (Some(3), 0, 0)
    );
    eventually("each replayed once", SETTLE, || async {
        (["a", "b", "c"].iter().all(|k| handler.attempts(k) == [1, 1])).then_some(())
    })
    .await;
    listener.shutdown().await;
}

/// Runs `work` on a runtime of its own, in a thread of its own, and waits
/// for it: for acting from inside a replay's progress callback.
fn meanwhile<T: Send>(work: impl std::future::Future<Output = T> + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(work))
            .join()
            .unwrap()
    })
}

/// Twenty-six dead letters `d00`..`d25`, one batch each.
async fn many_dead_letters(name: &str) -> (Ladder, std::sync::Arc<Scripted>, retry_kafka::Listener) {
    let names: Vec<String> = (0..26).map(|i| format!("d{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (ladder, handler, listener) = with_dead_letters(name, &names).await;
    (ladder, handler, listener)
}

/// An operator acknowledges records while a replay runs on the same
/// instance: the replay neither replays them nor commits a position behind
/// the acknowledgement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledgement_during_a_replay_is_never_undone() {
    let (ladder, handler, listener) = many_dead_letters("replay-ack-meanwhile").await;
    // One record per page, so the replay reads in many steps.
    let admin = admin(&ladder).await.with_page_bytes(1);
    let mut acknowledged = false;
    let limited = ReplayRequest {
        selection: ReplaySelection { limit: Some(5), ..Default::default() },
        ..replay(ReplayTarget::Source)
    };
    let report = admin
        .replay_reporting(&limited, |_| {
            if !acknowledged {
                acknowledged = true;
                // The replay has started and read the status (nothing
                // acknowledged yet); the operator acknowledges meanwhile.
                let ack = tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(admin.acknowledge(0, &Acknowledgement::UpTo(19)))
                });
                assert_eq!(ack.unwrap().next(), 20);
            }
        })
        .await
        .unwrap();
    assert_eq!(report.replayed, 5, "{report:?}");
    let status = admin.status().await.unwrap();
    assert_eq!(status.partitions[0].acknowledged, Some(25), "20 acknowledged, then 5 replayed: {status:?}");
    // Records of different keys are dead-lettered in any order: go by offset.
    let by_offset: Vec<String> = admin
        .browse(0, 0, 26)
        .await
        .unwrap()
        .iter()
        .map(|d| String::from_utf8_lossy(d.key.as_deref().unwrap()).into_owned())
        .collect();
    eventually("offsets 20 to 24 replayed", SETTLE, || async {
        (by_offset[20..25].iter().all(|k| handler.attempts(k) == [1, 1])).then_some(())
    })
    .await;
    for key in &by_offset[..20] {
        assert_eq!(handler.attempts(key), [1], "{key} was acknowledged, not replayed");
    }
    listener.shutdown().await;
}

/// Two instances share the operators' group: while one replays, the
/// other's replay and acknowledgement are refused (both take the replay
/// lock, so neither can commit a position that misses the other's work);
/// once the first is done, the other acknowledges, and its replay finds
/// nothing left: the position never went back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replay_at_a_time_across_instances() {
    let (ladder, _handler, listener) = many_dead_letters("replay-exclusive").await;
    let first = admin(&ladder).await.with_page_bytes(1);
    let mut refused = None;
    let report = first
        .replay_reporting(&replay(ReplayTarget::Source), |report| {
            if refused.is_none() && report.replayed > 0 {
                refused = Some(meanwhile(async {
                    let second = self::admin(&ladder).await;
                    let replayed = second.replay(&replay(ReplayTarget::Source)).await;
                    let acknowledged = second.acknowledge(0, &Acknowledgement::UpTo(0)).await;
                    (replayed, acknowledged)
                }));
            }
        })
        .await
        .unwrap();
    let (refused, acknowledged) = refused.expect("the second instance tried");
    assert_eq!(report.replayed, 26, "the holder kept the lock through the other's attempts: {report:?}");
    for (what, outcome) in [("replay", refused.map(|_| ())), ("acknowledgement", acknowledged.map(|_| ()))] {
        match outcome {
            Err(Error::ReplayElsewhere { holder, .. }) => assert!(holder.starts_with("member "), "{what}: {holder}"),
            other => panic!("{what}: expected ReplayElsewhere, got {other:?}"),
        }
    }
    let second = admin(&ladder).await;
    let acknowledged = second.acknowledge(0, &Acknowledgement::UpTo(0)).await.unwrap();
    assert_eq!(acknowledged.next(), 26, "the replay's position stands, and the acknowledgement is inside it");
    assert_eq!(second.replay(&replay(ReplayTarget::Source)).await.unwrap().replayed, 0, "the lock is free again");
    listener.shutdown().await;
}

/// Dead letters deleted before operators replayed or acknowledged them
/// (retention, or records deleted by hand) are counted as lost, not
/// silently dropped from the backlog; an acknowledgement up to the oldest
/// offset kept says an operator knows, and the count goes back to zero.
#[tokio::test]
async fn dead_letters_deleted_unhandled_are_counted_as_lost() {
    let (ladder, _handler, listener) = with_dead_letters("dlq-lost", &["a", "b", "c"]).await;
    let admin = admin(&ladder).await;
    let before = admin.status().await.unwrap();
    assert_eq!((before.backlog, before.lost_to_retention), (3, 0));
    let client = integration::rskafka_client().await;
    let dlq = ladder.policy.topology().dead_letter_topic().to_string();
    let pc = client.partition_client(&dlq, 0, rskafka::client::partition::UnknownTopicHandling::Retry).await.unwrap();
    integration::within("delete records", pc.delete_records(2, 5_000)).await.unwrap();
    let after = admin.status().await.unwrap();
    assert_eq!(after.partitions[0].earliest, 2, "{after:?}");
    assert_eq!((after.backlog, after.lost_to_retention), (1, 2), "{after:?}");
    assert_eq!(after.partitions[0].lost_to_retention, 2);
    // The operator knows: acknowledged up to the oldest offset kept.
    admin.acknowledge(0, &Acknowledgement::UpTo(1)).await.unwrap();
    let known = admin.status().await.unwrap();
    assert_eq!((known.backlog, known.lost_to_retention), (1, 0), "{known:?}");
    listener.shutdown().await;
}

/// On a broker that drops offset-commit metadata (tansu), a record a
/// replay or an acknowledgement would handle above the operators' position
/// is refused with the reason; records that follow on from it are not.
#[tokio::test]
async fn a_record_above_the_position_is_refused_with_the_reason() {
    let (ladder, handler, listener) = with_dead_letters("replay-drops-metadata", &["a", "b", "c"]).await;
    let admin = admin(&ladder).await;
    let last = admin.browse(0, 2, 1).await.unwrap().remove(0);
    let last_key = String::from_utf8_lossy(last.key.as_deref().unwrap()).into_owned();
    let targeted = ReplayRequest { selection: keys(&[&last_key]), ..replay(ReplayTarget::Source) };
    let report = admin.replay(&targeted).await.unwrap();
    assert_eq!((report.replayed, report.skipped_total), (0, 1), "{report:?}");
    assert!(report.skipped[0].reason.contains("drops offset-commit metadata"), "{report:?}");
    let refused = admin.acknowledge(0, &Acknowledgement::Offsets([2].into())).await.unwrap_err();
    assert!(matches!(refused, Error::NotRecordable(_)), "{refused:?}");
    // In order, both work.
    assert_eq!(admin.acknowledge(0, &Acknowledgement::Offsets([0, 1].into())).await.unwrap().next(), 2);
    assert_eq!(admin.replay(&targeted).await.unwrap().replayed, 1);
    eventually("the last replayed", SETTLE, || async { (handler.attempts(&last_key) == [1, 1]).then_some(()) }).await;
    listener.shutdown().await;
}

/// Browsing without a partition lists every partition from the operators'
/// position; a page stops at its byte cap (with at least one record).
#[tokio::test]
async fn browse_pages_cover_every_partition_and_are_capped_in_bytes() {
    let ladder = Ladder::create("browse-pages", "100ms", 2).await;
    let handler = Scripted::new(&[("a", &[Step::Permanent][..]), ("b", &[Step::Permanent]), ("c", &[Step::Permanent])]);
    let listener = start_joined(&ladder, handler.clone()).await;
    produce(ladder.source(), 0, "a", "v", &[]).await;
    produce(ladder.source(), 1, "b", "v", &[]).await;
    produce(ladder.source(), 1, "c", "v", &[]).await;
    eventually("the dead letters", SETTLE, || async { (listener.stats().snapshot().dead_lettered == 3).then_some(()) })
        .await;
    let admin = admin(&ladder).await;
    let page = |max_bytes| BrowsePage { partition: None, from: None, since: None, limit: 10, max_bytes };
    let all = admin.browse_page(&page(usize::MAX)).await.unwrap();
    let seen: Vec<(i32, &[u8])> = all.iter().map(|d| (d.partition, d.key.as_deref().unwrap())).collect();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen.contains(&(0, b"a")) && seen.iter().filter(|(p, _)| *p == 1).count() == 2, "{seen:?}");
    assert_eq!(admin.browse_page(&page(1)).await.unwrap().len(), 1, "at least one record, however small the cap");
    let two = all[0].size() + all[1].size();
    assert_eq!(admin.browse_page(&page(two)).await.unwrap().len(), 2);
    // From the operators' position: acknowledged records are not listed.
    admin.acknowledge(0, &Acknowledgement::UpTo(0)).await.unwrap();
    assert_eq!(admin.browse_page(&page(usize::MAX)).await.unwrap().len(), 2);
    listener.shutdown().await;
}

/// A replay whose publishing to one partition is refused by the broker
/// commits what it published elsewhere and reports the partition that
/// failed; repeated once the broker accepts again, it replays only what is
/// left.
#[tokio::test]
async fn a_partly_failed_replay_commits_what_it_published_and_a_repeat_does_the_rest() {
    let mock = integration::MockCluster::get();
    let ladder = Ladder::create("replay-partial", "100ms", 2).await;
    let script: Vec<(&str, &[Step])> = ["p0", "p1"].iter().map(|k| (*k, &[Step::Permanent][..])).collect();
    let handler = Scripted::new(&script);
    let listener = start_joined(&ladder, handler.clone()).await;
    produce(ladder.source(), 0, "p0", "v", &[]).await;
    produce(ladder.source(), 1, "p1", "v", &[]).await;
    eventually("the dead letters", SETTLE, || async { (listener.stats().snapshot().dead_lettered == 2).then_some(()) })
        .await;
    let admin = admin(&ladder).await;
    // Publishing to the source's partition 1 is refused for a while.
    const PRODUCE: i16 = 0;
    const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    mock.push_partition_errors(ladder.source(), 1, PRODUCE, &[TOPIC_AUTHORIZATION_FAILED; 3]).await;
    let report = admin.replay(&replay(ReplayTarget::Source)).await.unwrap();
    assert!(report.failed(), "{report:?}");
    assert_eq!(report.replayed, 1, "{report:?}");
    let by_partition: Vec<(i32, usize, bool)> =
        report.partitions.iter().map(|p| (p.partition, p.replayed, p.error.is_some())).collect();
    assert_eq!(by_partition, [(0, 1, false), (1, 0, true)], "{report:?}");
    let status = admin.status().await.unwrap();
    assert_eq!(
        status.partitions.iter().map(|p| p.acknowledged).collect::<Vec<_>>(),
        [Some(1), None],
        "only what was published is committed"
    );

    mock.clear_request_errors(PRODUCE).await;
    let report = eventually("the broker accepts again", SETTLE, || async {
        admin.replay(&replay(ReplayTarget::Source)).await.ok().filter(|r| !r.failed())
    })
    .await;
    assert!(report.replayed <= 1, "{report:?}");
    eventually("each replayed once", SETTLE, || async {
        (["p0", "p1"].iter().all(|k| handler.attempts(k) == [1, 1])).then_some(())
    })
    .await;
    assert_eq!(admin.status().await.unwrap().backlog, 0);
    listener.shutdown().await;
}

/// A dead letter whose event was first produced longer ago than the
/// idempotency window is refused with the reason (the downstream may have
/// forgotten its key), stays in the backlog, and is replayed only when the
/// window is lifted explicitly.
#[tokio::test]
async fn records_older_than_the_idempotency_window_need_an_explicit_override() {
    let (ladder, handler, listener) = with_dead_letters("replay-window", &["old"]).await;
    let admin = admin(&ladder).await;
    // The same record as if its event had been produced two days ago.
    let record = admin.browse(0, 0, 1).await.unwrap().remove(0);
    let mut headers = record.headers.clone();
    let mut decoded = record.retry_headers().unwrap();
    let two_days_ago = retry_core::Timestamp::from(std::time::SystemTime::now()).as_millis() - 48 * 3_600_000;
    decoded.original_timestamp = Some(retry_core::Timestamp::from_millis(two_days_ago));
    decoded.encode_into(&mut headers);
    let headers: Vec<(&str, &[u8])> = headers.iter().collect();
    admin.acknowledge(0, &Acknowledgement::UpTo(0)).await.unwrap();
    produce(ladder.dlq(), 0, "old", "v", &headers).await;

    let mut windowed = replay(ReplayTarget::Source);
    windowed.guards.max_age = Some(std::time::Duration::from_secs(24 * 3600));
    let report = admin.replay(&windowed).await.unwrap();
    assert_eq!((report.replayed, report.skipped_total), (0, 1), "{report:?}");
    assert!(report.skipped[0].reason.contains("outside the 24h idempotency window"), "{report:?}");
    assert_eq!(admin.status().await.unwrap().backlog, 1, "a refused record stays in the backlog");

    windowed.guards.max_age = None;
    assert_eq!(admin.replay(&windowed).await.unwrap().replayed, 1);
    eventually("the old record replayed", SETTLE, || async { (handler.attempts("old") == [1, 1]).then_some(()) }).await;
    listener.shutdown().await;
}
