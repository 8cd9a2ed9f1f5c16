//! Operators' work on a dead-letter topic: status, browse, replay, acknowledge.

use bytes::Bytes;
use retry_core::ReplayTarget;
use retry_kafka::{DeadLetterAdmin, ReplayRequest};

use crate::support::{eventually, produce, start_joined, Ladder, Scripted, Step, SETTLE};

fn replay(target: ReplayTarget) -> ReplayRequest {
    ReplayRequest {
        target,
        dry_run: false,
        limit: None,
        partition: None,
        offsets: None,
        keys: None,
        max_replays: Some(3),
    }
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
    let config = ladder.config();
    DeadLetterAdmin::connect(ladder.connection.clone(), ladder.policy.clone(), &config.operators_group()).await.unwrap()
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
    assert_eq!((dry.replayed, dry.covered.clone(), dry.dry_run), (3, vec![(0, 0, 3)], true));
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
    assert!(report.skipped[0].2.contains("replayed 3 times already"), "{report:?}");
    assert_eq!(admin.status().await.unwrap().backlog, 1, "the refused record stays in the backlog");
    eventually("x on the first rung", SETTLE, || async { (handler.attempts("x") == [1, 2]).then_some(()) }).await;

    let lifted = admin.replay(&ReplayRequest { max_replays: None, ..replay(ReplayTarget::FirstRetry) }).await.unwrap();
    assert_eq!(lifted.replayed, 1);
    assert_eq!(admin.status().await.unwrap().backlog, 0);
    listener.shutdown().await;
}

#[tokio::test]
async fn acknowledging_drops_records_from_the_backlog_without_replaying() {
    let (ladder, handler, listener) = with_dead_letters("ack", &["p", "q", "r"]).await;
    let admin = admin(&ladder).await;
    assert_eq!(admin.acknowledge(0, 1).await.unwrap(), 2);
    assert_eq!(admin.status().await.unwrap().backlog, 1);
    assert_eq!(admin.acknowledge(0, 0).await.unwrap(), 2, "never moves back");
    let only_r = ReplayRequest { keys: Some(vec![Bytes::from_static(b"r")]), ..replay(ReplayTarget::Source) };
    assert_eq!(admin.replay(&only_r).await.unwrap().replayed, 1);
    eventually("r replayed", SETTLE, || async { (handler.attempts("r") == [1, 1]).then_some(()) }).await;
    assert_eq!(handler.attempts("p"), [1], "acknowledged records are not replayed");
    assert_eq!(admin.browse(0, 0, 10).await.unwrap().len(), 3, "they stay in the topic for audit");
    listener.shutdown().await;
}
