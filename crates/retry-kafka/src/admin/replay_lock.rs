//! One replay at a time per dead-letter topic, across every instance of a
//! service: a replay joins a lock group (`<operators' group>.replay-lock`),
//! under a protocol of its own, for as long as it runs, and the lock is the
//! group leader's. The coordinator keeps the leader when it rejoins, so a
//! holder keeps the lock through the rebalance a newcomer causes, and the
//! newcomer, a follower, leaves at once and is refused. The holder
//! heartbeats and rejoins when told to. A holder that dies loses the lock
//! when its session expires; one that stalls past it is removed, and finds
//! out before its next commit, so at most the page it was publishing is
//! replayed twice.

use std::{collections::BTreeMap, time::Duration};

use bytes::Bytes;
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{
    protocol::group::{GroupClient, RawJoined, RawProtocol},
    BrokerError, ConnectionConfig, Error, Result,
};

/// The group protocol of replays.
const PROTOCOL: RawProtocol = RawProtocol { kind: "dlq-replay", name: "lock" };
/// A holder silent this long loses the lock.
const SESSION: Duration = Duration::from_secs(10);
/// How long a rebalance waits for members to rejoin.
const REBALANCE: Duration = Duration::from_secs(10);
/// How often the holder heartbeats: a newcomer's join waits for the
/// holder to notice the rebalance and rejoin.
const HEARTBEAT: Duration = Duration::from_millis(500);

/// A member's JoinGroup metadata: version 1 and its instance's name, for
/// the holder's logs.
fn encode_claim(instance: &str) -> Bytes {
    let mut out = vec![1];
    out.extend_from_slice(instance.as_bytes());
    Bytes::from(out)
}

/// Whether a generation grants us the lock: we lead it.
pub(crate) fn granted(joined: &RawJoined) -> bool {
    joined.member_id == joined.leader_id
}

/// The generation a holder commits in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Generation {
    pub(crate) id: i32,
    pub(crate) member_id: String,
}

/// A held replay lock; released on [`release`](Self::release) (or, if
/// dropped, when its session expires).
pub(crate) struct ReplayLock {
    generation: watch::Receiver<Option<Generation>>,
    stop: CancellationToken,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl ReplayLock {
    /// Takes the lock of `group` for `instance`, or says which instance holds it.
    pub(crate) async fn acquire(connection: ConnectionConfig, group: &str, instance: &str) -> Result<ReplayLock> {
        let mut client = GroupClient::new(connection, group);
        let mut member_id = String::new();
        let mut attempts = 0;
        let mut pauses = crate::backoff::pauses(Duration::from_millis(100), Duration::from_millis(250));
        let outcome = loop {
            match round(&mut client, &mut member_id, instance).await {
                // A group still settling from its last holder's leave, or a
                // holder rejoining: join again.
                Err(e) if attempts < 20 && rejoin_after(&e) => {
                    attempts += 1;
                    if e.broker_error() == Some(BrokerError::UNKNOWN_MEMBER_ID) {
                        member_id.clear();
                    }
                    tokio::time::sleep(pauses.next()).await;
                }
                outcome => break outcome,
            }
        };
        let generation = match outcome {
            Ok(Ok(generation)) => generation,
            Ok(Err(leader)) => {
                let _ = client.leave(&member_id).await;
                return Err(Error::ReplayElsewhere { group: group.to_owned(), holder: format!("member {leader}") });
            }
            Err(e) => {
                if !member_id.is_empty() {
                    let _ = client.leave(&member_id).await;
                }
                return Err(e);
            }
        };
        tracing::info!(group, member = %generation.member_id, "replay lock taken");
        let (held, generation) = watch::channel(Some(generation));
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep(client, member_id, instance.to_owned(), held, stop.clone()));
        Ok(ReplayLock { generation, stop, task: std::sync::Mutex::new(Some(task)) })
    }

    /// The generation to commit in; `None` once the lock is lost.
    pub(crate) fn generation(&self) -> Option<Generation> {
        self.generation.borrow().clone()
    }

    /// Leaves the group, freeing the lock at once.
    pub(crate) async fn release(&self) {
        self.stop.cancel();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// One JoinGroup, and the SyncGroup that completes it when we lead: the
/// generation when granted, else the leader's member id.
async fn round(
    client: &mut GroupClient,
    member_id: &mut String,
    instance: &str,
) -> Result<std::result::Result<Generation, String>> {
    let joined = client.join_raw(member_id, &PROTOCOL, encode_claim(instance), SESSION, REBALANCE).await?;
    tracing::debug!(group = client.group_id(), generation = joined.generation_id, member = %joined.member_id,
                    leader = %joined.leader_id, members = joined.members.len(), "replay lock: joined");
    if !granted(&joined) {
        return Ok(Err(joined.leader_id));
    }
    let assignments = joined.members.keys().map(|m| (m.clone(), Bytes::new())).collect::<BTreeMap<_, _>>();
    client.sync_raw(&joined, &PROTOCOL, &assignments, REBALANCE).await?;
    Ok(Ok(Generation { id: joined.generation_id, member_id: joined.member_id }))
}

/// Whether a failed round is worth another: the group rebalances again, or
/// our generation or member id went stale, or the coordinator answered a
/// sync with no assignment at all (librdkafka's mock cluster does, to a
/// member that joined as another left).
fn rejoin_after(e: &Error) -> bool {
    matches!(
        e.broker_error(),
        Some(BrokerError::REBALANCE_IN_PROGRESS | BrokerError::ILLEGAL_GENERATION | BrokerError::UNKNOWN_MEMBER_ID)
    ) || matches!(e, Error::Protocol { api: "SyncGroup", .. })
}

/// Heartbeats, rejoins when the group rebalances, and leaves on stop.
async fn keep(
    mut client: GroupClient,
    mut member_id: String,
    instance: String,
    held: watch::Sender<Option<Generation>>,
    stop: CancellationToken,
) {
    let mut silent_since = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(HEARTBEAT) => {}
        }
        let Some(generation) = held.borrow().clone() else { break };
        let bound = crate::session::heartbeat_bound(SESSION, SESSION, silent_since.elapsed());
        match client.heartbeat(generation.id, &member_id, bound).await {
            Ok(()) => silent_since = tokio::time::Instant::now(),
            Err(e)
                if matches!(
                    e.broker_error(),
                    Some(BrokerError::REBALANCE_IN_PROGRESS | BrokerError::ILLEGAL_GENERATION)
                ) =>
            {
                // Rejoin at once, and again until the rebalance completes:
                // the newcomer's join waits for us.
                let rejoined = loop {
                    match round(&mut client, &mut member_id, &instance).await {
                        Err(e) if rejoin_after(&e) && silent_since.elapsed() < SESSION => {
                            tracing::debug!(group = client.group_id(), error = %e, "rejoining to keep the replay lock");
                        }
                        other => break other,
                    }
                };
                match rejoined {
                    Ok(Ok(generation)) => {
                        silent_since = tokio::time::Instant::now();
                        held.send_replace(Some(generation));
                    }
                    Ok(Err(leader)) => {
                        tracing::error!(group = client.group_id(), %leader, "the replay lock went to another member");
                        held.send_replace(None);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(group = client.group_id(), error = %e, "rejoining to keep the replay lock failed")
                    }
                }
            }
            Err(e) if silent_since.elapsed() > SESSION || e.broker_error() == Some(BrokerError::UNKNOWN_MEMBER_ID) => {
                tracing::error!(group = client.group_id(), error = %e, "the replay lock is lost");
                held.send_replace(None);
                break;
            }
            Err(e) => tracing::warn!(group = client.group_id(), error = %e, "replay lock heartbeat failed"),
        }
    }
    match client.leave(&member_id).await {
        Ok(()) => tracing::debug!(group = client.group_id(), %member_id, "replay lock released"),
        Err(e) => {
            tracing::warn!(group = client.group_id(), error = %e, "leaving the operators' group failed; the replay lock frees when its session expires")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_is_the_leaders() {
        let joined = |member: &str, leader: &str| RawJoined {
            generation_id: 3,
            member_id: member.into(),
            leader_id: leader.into(),
            members: BTreeMap::new(),
        };
        for (member, leader, expected) in [("a", "a", true), ("b", "a", false), ("", "a", false)] {
            assert_eq!(granted(&joined(member, leader)), expected, "{member} under {leader}");
        }
        assert_eq!(&encode_claim("host pid 7")[..], b"\x01host pid 7");
    }
}
