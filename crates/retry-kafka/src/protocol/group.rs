//! Requests to a consumer group's coordinator: membership (classic
//! protocol: JoinGroup, SyncGroup, Heartbeat, LeaveGroup; the consumer
//! group protocol of KIP-848: ConsumerGroupHeartbeat) and offsets
//! (OffsetCommit, OffsetFetch). Finds the coordinator, and finds it again
//! when it moves. Policy (when to rejoin, what to commit) lives in the
//! callers; this only speaks the protocol.

use std::{collections::BTreeMap, time::Duration};

use bytes::Bytes;

use kafka_protocol::{
    messages::{
        consumer_group_heartbeat_request::TopicPartitions as OwnedPartitions,
        join_group_request::JoinGroupRequestProtocol,
        leave_group_request::MemberIdentity,
        offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic},
        offset_fetch_request::OffsetFetchRequestTopic,
        sync_group_request::SyncGroupRequestAssignment,
        ConsumerGroupDescribeRequest, ConsumerGroupHeartbeatRequest, DescribeGroupsRequest, FindCoordinatorRequest,
        GroupId, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, OffsetCommitRequest, OffsetFetchRequest,
        SyncGroupRequest, TopicName,
    },
    ResponseError,
};

use crate::{
    protocol::assignor::{self, Assignment},
    protocol::wire::{check, str_bytes, Connection},
    BrokerError, ConnectionConfig, Error, GroupProtocol, Result, TopicPartition,
};

/// A topic's id, as the consumer group protocol names topics in assignments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct TopicId(pub(crate) u128);

/// What a member under the consumer group protocol says in one heartbeat.
#[derive(Debug, Clone)]
pub(crate) struct Beat<'a> {
    /// The id the member gave itself when it first joined.
    pub(crate) member_id: &'a str,
    /// 0 to join; the epoch the coordinator gave last; [`LEAVE_EPOCH`] or
    /// [`STATIC_LEAVE_EPOCH`] to leave.
    pub(crate) member_epoch: i32,
    /// Sends every field (joining, or after an error), not only what changed.
    pub(crate) full: bool,
    /// The one topic the member subscribes to.
    pub(crate) topic: &'a str,
    pub(crate) rebalance_timeout: Duration,
    /// The partitions the member owns now, by topic id; `None`: unchanged
    /// since the last heartbeat that got through.
    pub(crate) owned: Option<BTreeMap<TopicId, Vec<i32>>>,
}

/// A dynamic member leaves with this epoch.
pub(crate) const LEAVE_EPOCH: i32 = -1;
/// A static member leaves with this one: its partitions wait for it to
/// come back, for a session.
pub(crate) const STATIC_LEAVE_EPOCH: i32 = -2;

/// What the coordinator answered to a [`Beat`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BeatAnswer {
    pub(crate) member_epoch: i32,
    /// How often the coordinator wants heartbeats.
    pub(crate) heartbeat_interval: Duration,
    /// The partitions the member may own now, by topic id; `None`: unchanged.
    pub(crate) assignment: Option<BTreeMap<TopicId, Vec<i32>>>,
}

/// What JoinGroup told us.
#[derive(Debug, Clone)]
pub(crate) struct Joined {
    pub(crate) generation_id: i32,
    pub(crate) member_id: String,
    pub(crate) leader_id: String,
    pub(crate) protocol: String,
    /// Every member's subscription; only the leader gets them.
    pub(crate) members: BTreeMap<String, assignor::Subscription>,
}

/// A group protocol of our own: its type and its one protocol's name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawProtocol {
    pub(crate) kind: &'static str,
    pub(crate) name: &'static str,
}

/// What JoinGroup told us under a [`RawProtocol`].
#[derive(Debug, Clone)]
pub(crate) struct RawJoined {
    pub(crate) generation_id: i32,
    pub(crate) member_id: String,
    pub(crate) leader_id: String,
    /// Every member's metadata; only the leader gets them.
    pub(crate) members: BTreeMap<String, Bytes>,
}

impl Joined {
    pub(crate) fn is_leader(&self) -> bool {
        self.member_id == self.leader_id
    }
}

/// A client of one group's coordinator.
pub(crate) struct GroupClient {
    config: ConnectionConfig,
    group_id: String,
    /// A static member's `group.instance.id` (KIP-345), sent with every
    /// request that carries one, so the coordinator fences an older
    /// process of the same instance.
    instance_id: Option<String>,
    /// Which protocol the members committing through this client speak.
    protocol: GroupProtocol,
    /// Whether an offset read or commit asks again, twice at most, when the
    /// coordinator moved: tools do; members retry in their own way.
    asks_again: bool,
    coordinator: Option<Connection>,
}

impl GroupClient {
    pub(crate) fn new(config: ConnectionConfig, group_id: &str) -> Self {
        GroupClient {
            config,
            group_id: group_id.to_owned(),
            instance_id: None,
            protocol: GroupProtocol::Classic,
            asks_again: false,
            coordinator: None,
        }
    }

    /// The same, for a tool outside the group (operators' reads and
    /// acknowledgements, the pause, lag): an offset read or commit that
    /// meets a coordinator that moved finds it again and asks again.
    pub(crate) fn for_tools(mut self) -> Self {
        self.asks_again = true;
        self
    }

    /// The same, for a member of `protocol`: its commits carry a member
    /// epoch (OffsetCommit v9) under the consumer group protocol, a
    /// generation (v8 at most) under the classic one.
    pub(crate) fn speaking(mut self, protocol: GroupProtocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// The same, as the static member `instance_id` (none: dynamic).
    pub(crate) fn with_instance_id(mut self, instance_id: Option<&str>) -> Self {
        self.instance_id = instance_id.map(str::to_owned);
        self
    }

    fn instance(&self) -> Option<kafka_protocol::protocol::StrBytes> {
        self.instance_id.as_deref().map(str_bytes)
    }

    /// Fails, naming the request, when a static member's request would go
    /// at a version without `group.instance.id`: the broker would take it
    /// for a dynamic member's.
    fn check_static<R: kafka_protocol::protocol::Request>(&mut self, first_version: i16) -> Result<()> {
        if self.instance_id.is_none() {
            return Ok(());
        }
        let version = self.coordinator_version::<R>()?;
        if version < first_version {
            return Err(Error::setting(
                "ListenerConfig::group_instance_id",
                format!(
                    "group {} is joined as a static member (group.instance.id), which needs {} v{first_version} or \
                 later; the coordinator speaks v{version}: leave the instance id unset for this broker",
                    self.group_id,
                    crate::protocol::wire::api_name::<R>()
                ),
            ));
        }
        Ok(())
    }

    fn coordinator_version<R: kafka_protocol::protocol::Request>(&mut self) -> Result<i16> {
        match &self.coordinator {
            Some(conn) => conn.version_of::<R>(),
            None => Ok(i16::MAX),
        }
    }

    pub(crate) fn group_id(&self) -> &str {
        &self.group_id
    }

    /// The coordinator's connection, found through the bootstrap brokers.
    async fn coordinator(&mut self) -> Result<&mut Connection> {
        // A request abandoned midway (a cancelled heartbeat or offset fetch)
        // leaves its answer on the connection: start afresh.
        if self.coordinator.as_ref().is_some_and(Connection::is_broken) {
            self.coordinator = None;
        }
        if self.coordinator.is_none() {
            let mut last_error = None;
            for addr in &self.config.bootstrap {
                match self.find_coordinator(addr).await {
                    Ok(conn) => {
                        self.coordinator = Some(conn);
                        break;
                    }
                    Err(e) => last_error = Some(e),
                }
            }
            if self.coordinator.is_none() {
                return Err(last_error.expect("bootstrap brokers are never empty"));
            }
        }
        Ok(self.coordinator.as_mut().expect("set above"))
    }

    async fn find_coordinator(&self, bootstrap: &str) -> Result<Connection> {
        let mut conn = Connection::connect(bootstrap, &self.config).await?;
        let request = FindCoordinatorRequest::default().with_key(str_bytes(&self.group_id)).with_key_type(0);
        let (response, _) = conn.send(&request).await?;
        check("FindCoordinator", || format!("group {}", self.group_id), response.error_code)?;
        let addr = format!("{}:{}", response.host, response.port);
        if addr == conn.addr() {
            return Ok(conn);
        }
        Connection::connect(&addr, &self.config).await
    }

    /// Forgets the coordinator when `result` says it moved or the link broke.
    fn observe<T>(&mut self, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            if e.needs_reconnect() {
                self.coordinator = None;
            }
        }
        result
    }

    fn group_context(&self) -> String {
        format!("group {}", self.group_id)
    }

    /// Joins (or rejoins) the group, subscribed to `topics`, as `member_id`
    /// ("" for a new member). Handles the broker's MEMBER_ID_REQUIRED round
    /// trip. `member_id` takes the id the coordinator gives us as soon as it
    /// gives it, even if a later step fails: rejoining under a fresh id
    /// would leave the old one behind as a member that never syncs, which
    /// the group waits for until its session times out.
    ///
    /// `owned` makes the member a cooperative one (cooperative-sticky,
    /// KIP-429): what it owns and since which generation; `None`, an eager
    /// one (range).
    pub(crate) async fn join(
        &mut self,
        member_id: &mut String,
        topics: &[String],
        owned: Option<(&Assignment, i32)>,
        session_timeout: Duration,
        rebalance_timeout: Duration,
    ) -> Result<Joined> {
        let protocol = match owned {
            None => JoinGroupRequestProtocol::default()
                .with_name(str_bytes(assignor::RANGE))
                .with_metadata(assignor::encode_subscription(topics)),
            Some((owned, generation)) => JoinGroupRequestProtocol::default()
                .with_name(str_bytes(assignor::COOPERATIVE_STICKY))
                .with_metadata(assignor::encode_owned_subscription(topics, owned, generation)),
        };
        for _ in 0..3 {
            let request = JoinGroupRequest::default()
                .with_group_id(GroupId(str_bytes(&self.group_id)))
                .with_session_timeout_ms(millis(session_timeout))
                .with_rebalance_timeout_ms(millis(rebalance_timeout))
                .with_member_id(str_bytes(member_id))
                .with_group_instance_id(self.instance())
                .with_protocol_type(str_bytes("consumer"))
                .with_protocols(vec![protocol.clone()]);
            // The coordinator holds JoinGroup until every member rejoined.
            let wait = rebalance_timeout + self.config.request_timeout;
            let result = async {
                self.coordinator().await?;
                self.check_static::<JoinGroupRequest>(5)?;
                self.coordinator().await?.send_within(&request, wait).await
            }
            .await;
            let (response, _) = self.observe(result)?;
            match ResponseError::try_from_code(response.error_code) {
                Some(ResponseError::MemberIdRequired) => {
                    *member_id = response.member_id.to_string();
                    continue;
                }
                Some(error) => {
                    let result = Err(Error::Broker {
                        api: "JoinGroup",
                        context: Some(self.group_context()),
                        error: error.into(),
                    });
                    return self.observe(result);
                }
                None => {}
            }
            let mut members = BTreeMap::new();
            for member in &response.members {
                let subscription =
                    assignor::decode_subscription(&member.metadata).map_err(|reason| Error::Protocol {
                        addr: self.coordinator.as_ref().map(|c| c.addr().to_owned()).unwrap_or_default(),
                        api: "JoinGroup",
                        reason: format!("member {}: {reason}", member.member_id),
                    })?;
                members.insert(member.member_id.to_string(), subscription);
            }
            *member_id = response.member_id.to_string();
            let joined = Joined {
                generation_id: response.generation_id,
                member_id: member_id.clone(),
                leader_id: response.leader.to_string(),
                protocol: response.protocol_name.map(|p| p.to_string()).unwrap_or_else(|| assignor::RANGE.to_owned()),
                members,
            };
            // A leader that does not see its own subscription cannot assign
            // (it would hand out nothing, itself included): a broken answer,
            // not a generation to run.
            if joined.is_leader() && !joined.members.contains_key(&joined.member_id) {
                return Err(Error::Protocol {
                    addr: self.coordinator.as_ref().map(|c| c.addr().to_owned()).unwrap_or_default(),
                    api: "JoinGroup",
                    reason: format!(
                        "group {} named us ({}) leader of generation {} without our subscription among its {} member(s)",
                        self.group_id,
                        joined.member_id,
                        joined.generation_id,
                        joined.members.len()
                    ),
                });
            }
            return Ok(joined);
        }
        Err(Error::Protocol {
            addr: String::new(),
            api: "JoinGroup",
            reason: format!("group {} kept answering MEMBER_ID_REQUIRED", self.group_id),
        })
    }

    /// Joins (or rejoins) the group with a protocol of our own: not a
    /// consumer's, so no consumer tool mistakes the members for consumers.
    /// Handles MEMBER_ID_REQUIRED like [`join`](Self::join); `members`
    /// (leader only) holds every member's `metadata`.
    pub(crate) async fn join_raw(
        &mut self,
        member_id: &mut String,
        protocol: &RawProtocol,
        metadata: Bytes,
        session_timeout: Duration,
        rebalance_timeout: Duration,
    ) -> Result<RawJoined> {
        for _ in 0..3 {
            let request = JoinGroupRequest::default()
                .with_group_id(GroupId(str_bytes(&self.group_id)))
                .with_session_timeout_ms(millis(session_timeout))
                .with_rebalance_timeout_ms(millis(rebalance_timeout))
                .with_member_id(str_bytes(member_id))
                .with_protocol_type(str_bytes(protocol.kind))
                .with_protocols(vec![JoinGroupRequestProtocol::default()
                    .with_name(str_bytes(protocol.name))
                    .with_metadata(metadata.clone())]);
            let wait = rebalance_timeout + self.config.request_timeout;
            let result = async { self.coordinator().await?.send_within(&request, wait).await }.await;
            let (response, _) = self.observe(result)?;
            match ResponseError::try_from_code(response.error_code) {
                Some(ResponseError::MemberIdRequired) => {
                    *member_id = response.member_id.to_string();
                    continue;
                }
                Some(error) => {
                    let result = Err(Error::Broker {
                        api: "JoinGroup",
                        context: Some(self.group_context()),
                        error: error.into(),
                    });
                    return self.observe(result);
                }
                None => {}
            }
            *member_id = response.member_id.to_string();
            return Ok(RawJoined {
                generation_id: response.generation_id,
                member_id: member_id.clone(),
                leader_id: response.leader.to_string(),
                members: response.members.iter().map(|m| (m.member_id.to_string(), m.metadata.clone())).collect(),
            });
        }
        Err(Error::Protocol {
            addr: String::new(),
            api: "JoinGroup",
            reason: format!("group {} kept answering MEMBER_ID_REQUIRED", self.group_id),
        })
    }

    /// Completes a rebalance under our own protocol: the leader sends every
    /// member's assignment, the others none; everyone gets their own back.
    pub(crate) async fn sync_raw(
        &mut self,
        joined: &RawJoined,
        protocol: &RawProtocol,
        assignments: &BTreeMap<String, Bytes>,
        rebalance_timeout: Duration,
    ) -> Result<Bytes> {
        let request = SyncGroupRequest::default()
            .with_group_id(GroupId(str_bytes(&self.group_id)))
            .with_generation_id(joined.generation_id)
            .with_member_id(str_bytes(&joined.member_id))
            .with_protocol_type(Some(str_bytes(protocol.kind)))
            .with_protocol_name(Some(str_bytes(protocol.name)))
            .with_assignments(
                assignments
                    .iter()
                    .map(|(member, a)| {
                        SyncGroupRequestAssignment::default()
                            .with_member_id(str_bytes(member))
                            .with_assignment(a.clone())
                    })
                    .collect(),
            );
        let wait = rebalance_timeout + self.config.request_timeout;
        let result = async { self.coordinator().await?.send_within(&request, wait).await }.await;
        let (response, _) = self.observe(result)?;
        let context = self.group_context();
        let result = check("SyncGroup", || context, response.error_code);
        self.observe(result)?;
        Ok(response.assignment)
    }

    /// Completes a rebalance: the leader sends every member's assignment,
    /// the others send none; everyone gets their own back.
    pub(crate) async fn sync(
        &mut self,
        joined: &Joined,
        assignments: &BTreeMap<String, Assignment>,
        rebalance_timeout: Duration,
    ) -> Result<Assignment> {
        let assignments = assignments
            .iter()
            .map(|(member, a)| {
                SyncGroupRequestAssignment::default()
                    .with_member_id(str_bytes(member))
                    .with_assignment(assignor::encode_assignment(a))
            })
            .collect();
        let request = SyncGroupRequest::default()
            .with_group_id(GroupId(str_bytes(&self.group_id)))
            .with_generation_id(joined.generation_id)
            .with_member_id(str_bytes(&joined.member_id))
            .with_group_instance_id(self.instance())
            .with_protocol_type(Some(str_bytes("consumer")))
            .with_protocol_name(Some(str_bytes(&joined.protocol)))
            .with_assignments(assignments);
        let wait = rebalance_timeout + self.config.request_timeout;
        let result = async { self.coordinator().await?.send_within(&request, wait).await }.await;
        let (response, _) = self.observe(result)?;
        let context = self.group_context();
        let result = check("SyncGroup", || context, response.error_code);
        self.observe(result)?;
        assignor::decode_assignment(&response.assignment).map_err(|reason| Error::Protocol {
            addr: String::new(),
            api: "SyncGroup",
            reason,
        })
    }

    /// One heartbeat, given at most `bound` (the rest of the session: a
    /// later answer could not save it). `Err` with REBALANCE_IN_PROGRESS,
    /// ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID means: rejoin.
    pub(crate) async fn heartbeat(&mut self, generation_id: i32, member_id: &str, bound: Duration) -> Result<()> {
        let request = HeartbeatRequest::default()
            .with_group_id(GroupId(str_bytes(&self.group_id)))
            .with_generation_id(generation_id)
            .with_member_id(str_bytes(member_id))
            .with_group_instance_id(self.instance());
        let result = async { self.coordinator().await?.send_within(&request, bound).await }.await;
        let (response, _) = self.observe(result)?;
        let context = self.group_context();
        let result = check("Heartbeat", || context, response.error_code);
        self.observe(result)
    }

    /// One heartbeat of the consumer group protocol (KIP-848), given at most
    /// `bound`. Errors come as the broker's: FENCED_MEMBER_EPOCH and
    /// UNKNOWN_MEMBER_ID (rejoin with epoch 0), UNRELEASED_INSTANCE_ID (a
    /// static member's former self still holds the instance id),
    /// FENCED_INSTANCE_ID, and a coordinator that moved.
    pub(crate) async fn consumer_heartbeat(&mut self, beat: &Beat<'_>, bound: Duration) -> Result<BeatAnswer> {
        let mut request = ConsumerGroupHeartbeatRequest::default()
            .with_group_id(GroupId(str_bytes(&self.group_id)))
            .with_member_id(str_bytes(beat.member_id))
            .with_member_epoch(beat.member_epoch)
            .with_rebalance_timeout_ms(-1);
        if beat.full || beat.member_epoch <= 0 {
            // A static member names its instance on every full heartbeat,
            // its leave included: the coordinator keys it by that.
            request.instance_id = self.instance();
        }
        if beat.full {
            request.rebalance_timeout_ms = millis(beat.rebalance_timeout);
            request.subscribed_topic_names = Some(vec![TopicName(str_bytes(beat.topic))]);
        }
        let owned = match (&beat.owned, beat.full) {
            (Some(owned), _) => Some(owned.clone()),
            (None, true) => Some(BTreeMap::new()),
            (None, false) => None,
        };
        request.topic_partitions = owned.map(|owned| {
            owned
                .into_iter()
                .filter(|(_, partitions)| !partitions.is_empty())
                .map(|(TopicId(id), partitions)| {
                    OwnedPartitions::default().with_topic_id(uuid::Uuid::from_u128(id)).with_partitions(partitions)
                })
                .collect()
        });
        let result = async { self.coordinator().await?.send_within(&request, bound).await }.await;
        let (response, _) = self.observe(result)?;
        let context = self.group_context();
        let result = match response.error_message.as_ref().filter(|_| response.error_code != 0) {
            Some(message) => check("ConsumerGroupHeartbeat", || format!("{context}: {message}"), response.error_code),
            None => check("ConsumerGroupHeartbeat", || context, response.error_code),
        };
        self.observe(result)?;
        Ok(BeatAnswer {
            member_epoch: response.member_epoch,
            heartbeat_interval: Duration::from_millis(response.heartbeat_interval_ms.max(0) as u64),
            assignment: response.assignment.map(|a| {
                let mut out: BTreeMap<TopicId, Vec<i32>> = BTreeMap::new();
                for t in a.topic_partitions {
                    out.entry(TopicId(t.topic_id.as_u128())).or_default().extend(t.partitions);
                }
                for partitions in out.values_mut() {
                    partitions.sort_unstable();
                    partitions.dedup();
                }
                out
            }),
        })
    }

    /// The group's state as its coordinator names it (`Stable`,
    /// `PreparingRebalance`, `Reconciling`, `Empty`...) and how many members
    /// it has: ConsumerGroupDescribe for a group of the consumer group
    /// protocol, DescribeGroups for a classic one. For a tool, a coordinator
    /// that moved (or was not ready, as on a cluster just started) is found
    /// again and asked again, twice at most.
    pub(crate) async fn describe(&mut self) -> Result<(String, usize)> {
        asking_again!(self, self.describe_once().await)
    }

    async fn describe_once(&mut self) -> Result<(String, usize)> {
        let supported = self.coordinator().await?.version_of::<ConsumerGroupDescribeRequest>().is_ok();
        if supported {
            let request =
                ConsumerGroupDescribeRequest::default().with_group_ids(vec![GroupId(str_bytes(&self.group_id))]);
            let result = async { self.coordinator().await?.send(&request).await }.await;
            let (response, _) = self.observe(result)?;
            if let Some(group) = response.groups.first() {
                let context = self.group_context();
                match check("ConsumerGroupDescribe", || context, group.error_code) {
                    Ok(()) => return Ok((group.group_state.to_string(), group.members.len())),
                    // Not this coordinator's group any more: find it again.
                    Err(e) if coordinator_moved(&e) => return self.observe(Err(e)),
                    // A classic group: DescribeGroups tells.
                    Err(_) => {}
                }
            }
        }
        // A classic group (or a coordinator without the consumer group protocol).
        let request = DescribeGroupsRequest::default().with_groups(vec![GroupId(str_bytes(&self.group_id))]);
        let result = async { self.coordinator().await?.send(&request).await }.await;
        let (response, _) = self.observe(result)?;
        let context = self.group_context();
        let group = response.groups.first().ok_or_else(|| Error::Protocol {
            addr: String::new(),
            api: "DescribeGroups",
            reason: format!("no answer for {context}"),
        })?;
        let result = check("DescribeGroups", || context, group.error_code);
        self.observe(result)?;
        Ok((group.group_state.to_string(), group.members.len()))
    }

    /// Leaves the group, so its partitions move at once instead of after
    /// the session timeout.
    pub(crate) async fn leave(&mut self, member_id: &str) -> Result<()> {
        let group_id = GroupId(str_bytes(&self.group_id));
        let conn = self.coordinator().await?;
        let version = conn.version_of::<LeaveGroupRequest>()?;
        let mut request = LeaveGroupRequest::default().with_group_id(group_id);
        if version >= 3 {
            request.members = vec![MemberIdentity::default().with_member_id(str_bytes(member_id))];
        } else {
            request.member_id = str_bytes(member_id);
        }
        let result = conn.send(&request).await;
        let (response, _) = self.observe(result)?;
        let context = self.group_context();
        check("LeaveGroup", || context, response.error_code)
    }

    /// Commits `offsets` (the next offset to read, per partition) as
    /// `member_id` of `generation_id`; pass -1 and "" to commit outside a
    /// generation (a tool that is not a member).
    pub(crate) async fn commit(
        &mut self,
        generation_id: i32,
        member_id: &str,
        offsets: &BTreeMap<TopicPartition, i64>,
    ) -> Result<()> {
        let offsets = offsets.iter().map(|(tp, offset)| (tp.clone(), (*offset, None))).collect();
        self.commit_with_metadata(generation_id, member_id, &offsets).await
    }

    /// [`commit`](Self::commit), with a metadata string per partition. For
    /// a tool, a coordinator that moved is found again and asked again,
    /// twice at most (the same offsets: committing them twice is harmless).
    pub(crate) async fn commit_with_metadata(
        &mut self,
        generation_id: i32,
        member_id: &str,
        offsets: &BTreeMap<TopicPartition, (i64, Option<String>)>,
    ) -> Result<()> {
        asking_again!(self, self.commit_once(generation_id, member_id, offsets).await)
    }

    async fn commit_once(
        &mut self,
        generation_id: i32,
        member_id: &str,
        offsets: &BTreeMap<TopicPartition, (i64, Option<String>)>,
    ) -> Result<()> {
        let mut topics: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
        for (TopicPartition { topic, partition }, (offset, metadata)) in offsets {
            topics.entry(topic).or_default().push(
                OffsetCommitRequestPartition::default()
                    .with_partition_index(*partition)
                    .with_committed_offset(*offset)
                    .with_committed_leader_epoch(-1)
                    .with_committed_metadata(metadata.as_deref().map(str_bytes)),
            );
        }
        let request = OffsetCommitRequest::default()
            .with_group_id(GroupId(str_bytes(&self.group_id)))
            .with_generation_id_or_member_epoch(generation_id)
            .with_member_id(str_bytes(member_id))
            .with_group_instance_id(if generation_id >= 0 { self.instance() } else { None })
            .with_retention_time_ms(-1)
            .with_topics(
                topics
                    .into_iter()
                    .map(|(t, ps)| {
                        OffsetCommitRequestTopic::default().with_name(TopicName(str_bytes(t))).with_partitions(ps)
                    })
                    .collect(),
            );
        let highest = match self.protocol {
            GroupProtocol::Classic => 8,
            GroupProtocol::Consumer => 9,
        };
        let result = async { self.coordinator().await?.send_at_most(&request, highest).await }.await;
        let (response, _) = self.observe(result)?;
        for topic in &response.topics {
            for p in &topic.partitions {
                let context = || format!("group {} at {}/{}", self.group_id, topic.name.0, p.partition_index);
                let result = check("OffsetCommit", context, p.error_code);
                self.observe(result)?;
            }
        }
        Ok(())
    }

    /// The committed offsets of `partitions` (`None`: nothing committed).
    pub(crate) async fn committed(
        &mut self,
        partitions: &[TopicPartition],
    ) -> Result<BTreeMap<TopicPartition, Option<i64>>> {
        let committed = self.committed_with_metadata(partitions).await?;
        Ok(committed.into_iter().map(|(tp, (offset, _))| (tp, offset)).collect())
    }

    /// [`committed`](Self::committed), with each commit's metadata. For a
    /// tool, a coordinator that moved is found again and asked again, twice at most.
    pub(crate) async fn committed_with_metadata(
        &mut self,
        partitions: &[TopicPartition],
    ) -> Result<BTreeMap<TopicPartition, (Option<i64>, Option<String>)>> {
        asking_again!(self, self.committed_once(partitions).await)
    }

    async fn committed_once(
        &mut self,
        partitions: &[TopicPartition],
    ) -> Result<BTreeMap<TopicPartition, (Option<i64>, Option<String>)>> {
        let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for TopicPartition { topic, partition } in partitions {
            topics.entry(topic).or_default().push(*partition);
        }
        let request =
            OffsetFetchRequest::default().with_group_id(GroupId(str_bytes(&self.group_id))).with_topics(Some(
                topics
                    .into_iter()
                    .map(|(t, ps)| {
                        OffsetFetchRequestTopic::default().with_name(TopicName(str_bytes(t))).with_partition_indexes(ps)
                    })
                    .collect(),
            ));
        let result = async { self.coordinator().await?.send(&request).await }.await;
        let (response, version) = self.observe(result)?;
        if version >= 2 {
            let context = self.group_context();
            let result = check("OffsetFetch", || context, response.error_code);
            self.observe(result)?;
        }
        let mut out = BTreeMap::new();
        for topic in &response.topics {
            for p in &topic.partitions {
                let context = || format!("group {} at {}/{}", self.group_id, topic.name.0, p.partition_index);
                let result = check("OffsetFetch", context, p.error_code);
                self.observe(result)?;
                let offset = (p.committed_offset >= 0).then_some(p.committed_offset);
                let metadata = p.metadata.as_ref().map(|m| m.to_string());
                out.insert(TopicPartition::new(topic.name.0.to_string(), p.partition_index), (offset, metadata));
            }
        }
        Ok(out)
    }
}

/// The pauses before asking a coordinator that moved again: a leader
/// election among the brokers (Kafka's preferred-leader check, every five
/// minutes) moves coordinators while the group goes on.
/// Evaluates `$once` (a request of `$client`, awaited); for a tool, when the
/// coordinator moved (or was not ready), finds it again and evaluates
/// `$once` again, twice at most. (A macro: an async closure borrowing the
/// client would not be `Send`.)
macro_rules! asking_again {
    ($client:ident, $once:expr) => {{
        let mut answered = None;
        let asks_again = $client.asks_again;
        for pause in COORDINATOR_MOVED_PAUSES.into_iter().filter(|_| asks_again) {
            match $once {
                Err(e) if coordinator_moved(&e) => tokio::time::sleep(pause).await,
                other => {
                    answered = Some(other);
                    break;
                }
            }
        }
        match answered {
            Some(answer) => answer,
            None => $once,
        }
    }};
}
use asking_again;

const COORDINATOR_MOVED_PAUSES: [Duration; 2] = [Duration::from_millis(100), Duration::from_millis(500)];

/// Whether `e` says the coordinator moved or is not ready yet.
fn coordinator_moved(e: &Error) -> bool {
    matches!(
        e.broker_error(),
        Some(
            BrokerError::NOT_COORDINATOR
                | BrokerError::COORDINATOR_NOT_AVAILABLE
                | BrokerError::COORDINATOR_LOAD_IN_PROGRESS
        )
    )
}

/// Whether the cluster speaks the consumer group protocol (KIP-848), as
/// the first bootstrap broker that answers says (the coordinator may not
/// be ready yet while the cluster starts): `Ok(())`, or why not, said as
/// what to do.
pub(crate) async fn check_consumer_protocol(config: &ConnectionConfig, group_id: &str) -> Result<()> {
    let mut last_error = None;
    for addr in &config.bootstrap {
        match Connection::connect(addr, config).await {
            Ok(conn) => {
                return match conn.version_of::<ConsumerGroupHeartbeatRequest>() {
                    Ok(_) => Ok(()),
                    Err(Error::UnsupportedVersion { .. }) => Err(unsupported_consumer_protocol(addr, group_id)),
                    Err(e) => Err(e),
                }
            }
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.expect("bootstrap brokers are never empty"))
}

/// The error for a broker without the consumer group protocol.
pub(crate) fn unsupported_consumer_protocol(addr: &str, group_id: &str) -> Error {
    Error::setting(
        "ListenerConfig::group_protocol",
        format!(
            "the broker at {addr} (for group {group_id}) does not speak the consumer group protocol (KIP-848: \
             ConsumerGroupHeartbeat, Apache Kafka 4.0 or later): use the classic protocol (KAFKA_GROUP_PROTOCOL=classic \
             for billing-bin)"
        ),
    )
}

fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_go_to_the_wire_in_milliseconds_capped() {
        for (d, ms) in [
            (Duration::ZERO, 0),
            (Duration::from_millis(1500), 1500),
            (Duration::from_secs(3600), 3_600_000),
            (Duration::from_secs(u64::MAX), i32::MAX),
        ] {
            assert_eq!(millis(d), ms, "{d:?}");
        }
    }
}
