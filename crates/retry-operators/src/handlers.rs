//! The operators' routes: list the dead-letter topics, browse one, replay
//! records into the ladder as jobs, follow a job, acknowledge records.
//! Each answer carries its audit outcome.

use std::{collections::BTreeSet, net::SocketAddr, sync::Arc};

use axum::{
    extract::{ConnectInfo, Path, Query, State},
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use bytes::Bytes;
use retry_core::{operators::ReplaySelection, pause::ListenerPause, replay::ReplayGuards};
use retry_kafka::{Acknowledgement, BrowsePage, ReplayRequest};

use super::{
    api::{
        AckAnswer, AckBody, BrakeAnswer, DlqList, DlqTopic, EngagementAnswer, JobState, ListenerAnswer, Message,
        MessagesPage, MessagesQuery, PartitionLag, PauseAnswer, PauseBody, Problem, ReplayBody, ReplayJob, ReplayJobs,
        ReplayOutcome, ReplayQuery, ResumeAnswer, TopicLag,
    },
    audit::{audited, excerpt, who, Outcome},
    jobs::now_ms,
    state::{Operators, MAX_PAGE, MAX_PAGE_BYTES, MAX_REPLAYS},
    store::DeadLetterStore,
};

/// An error answer: a status and a reason.
pub(crate) struct Refusal(pub(crate) StatusCode, pub(crate) String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut response = (self.0, Json(Problem { error: self.1.clone() })).into_response();
        response.extensions_mut().insert(Outcome(format!("refused: {}", self.1)));
        response
    }
}

impl From<retry_kafka::Error> for Refusal {
    fn from(e: retry_kafka::Error) -> Self {
        match e {
            // The request is fine, the broker cannot record it: say why.
            retry_kafka::Error::NotRecordable(reason) => Refusal(StatusCode::CONFLICT, reason),
            // Another instance replays: its position must not be raced.
            e @ retry_kafka::Error::ReplayElsewhere { .. } => Refusal(StatusCode::CONFLICT, e.to_string()),
            e => Refusal(StatusCode::BAD_GATEWAY, format!("kafka: {e}")),
        }
    }
}

fn bad_request(reason: impl Into<String>) -> Refusal {
    Refusal(StatusCode::BAD_REQUEST, reason.into())
}

fn check_topic<S>(ops: &Operators<S>, topic: &str) -> Result<(), Refusal> {
    if topic == ops.policy.topology().dead_letter_topic().as_str() {
        Ok(())
    } else {
        Err(Refusal(StatusCode::NOT_FOUND, format!("{topic:?} is not a dead-letter topic of this service")))
    }
}

#[utoipa::path(get, path = "/admin/dlq", tag = "dead letters",
    responses((status = 200, body = DlqList), (status = 401, body = Problem), (status = 429, body = Problem), (status = 502, body = Problem)))]
/// The service's dead-letter topics with their backlog, end and acknowledged offsets.
pub(crate) async fn list<S: DeadLetterStore>(State(ops): State<Arc<Operators<S>>>) -> Result<Response, Refusal> {
    let status = ops.store.status().await?;
    let backlog = status.backlog;
    let topic = DlqTopic::new(status, ops.policy.topology().source_topic().as_str());
    Ok(audited(Json(DlqList { topics: vec![topic] }), format!("backlog {backlog}")))
}

#[utoipa::path(get, path = "/admin/dlq/{topic}/messages", tag = "dead letters",
    params(("topic" = String, Path, description = "the dead-letter topic, e.g. orders.confirmed.dlq"), MessagesQuery),
    responses((status = 200, body = MessagesPage), (status = 400, body = Problem), (status = 401, body = Problem),
              (status = 404, body = Problem), (status = 429, body = Problem), (status = 502, body = Problem)))]
/// One page of dead-lettered records with decoded headers (at most 100
/// records and 1 MiB); payloads as text, or base64 when not UTF-8.
pub(crate) async fn messages<S: DeadLetterStore>(
    State(ops): State<Arc<Operators<S>>>,
    Path(topic): Path<String>,
    query: Result<Query<MessagesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Refusal> {
    check_topic(&ops, &topic)?;
    let Query(query) = query.map_err(|e| bad_request(e.body_text()))?;
    let limit = query.limit.unwrap_or(20);
    if limit == 0 || limit > MAX_PAGE {
        return Err(bad_request(format!("limit must be between 1 and {MAX_PAGE}")));
    }
    if query.offset.is_some_and(|o| o < 0) || query.since_ms.is_some_and(|t| t < 0) {
        return Err(bad_request("offset and since_ms must not be negative"));
    }
    if query.offset.is_some() && query.partition.is_none() {
        return Err(bad_request(
            "offset needs a partition: without one, every partition is read from the operators' position",
        ));
    }
    if let Some(partition) = query.partition {
        let known = ops.store.status().await?.partitions.iter().any(|p| p.partition == partition);
        if !known {
            return Err(Refusal(StatusCode::NOT_FOUND, format!("{topic} has no partition {partition}")));
        }
    }
    let page = BrowsePage {
        partition: query.partition,
        from: query.offset,
        since: query.since_ms.map(retry_core::Timestamp::from_millis),
        limit,
        max_bytes: MAX_PAGE_BYTES,
    };
    let records = ops.store.browse(&page).await?;
    let bytes: usize = records.iter().map(|r| r.size()).sum();
    let mut next_offsets = std::collections::BTreeMap::new();
    for r in &records {
        next_offsets.insert(r.partition, r.offset + 1);
    }
    let answer = MessagesPage {
        next_offset: query.partition.and_then(|p| next_offsets.get(&p).copied()),
        capped_by_bytes: records.len() < limit && bytes >= MAX_PAGE_BYTES,
        messages: records.iter().map(Message::new).collect(),
        next_offsets,
    };
    let outcome = format!("{} records, {bytes} bytes", answer.messages.len());
    Ok(audited(Json(answer), outcome))
}

#[utoipa::path(post, path = "/admin/dlq/{topic}/replay", tag = "dead letters",
    params(("topic" = String, Path, description = "the dead-letter topic"), ReplayQuery),
    request_body(content = Option<ReplayBody>, description = "which records; every field is optional"),
    responses((status = 200, body = ReplayJob, description = "the job ended (wait=true)"),
              (status = 202, body = ReplayJob, description = "the job runs: follow it at /admin/dlq/replays/{id}"),
              (status = 400, body = Problem), (status = 401, body = Problem), (status = 404, body = Problem),
              (status = 409, body = Problem, description = "a replay of this topic is already running"),
              (status = 413, body = Problem), (status = 429, body = Problem)))]
/// Replay records into the ladder, up to the end offsets captured when the
/// job starts, page by page; progress is committed in the operators' group,
/// so repeating a request never replays a record twice.
pub(crate) async fn replay<S: DeadLetterStore>(
    State(ops): State<Arc<Operators<S>>>,
    headers: HeaderMap,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(topic): Path<String>,
    query: Result<Query<ReplayQuery>, axum::extract::rejection::QueryRejection>,
    body: Bytes,
) -> Result<Response, Refusal> {
    check_topic(&ops, &topic)?;
    let Query(query) = query.map_err(|e| bad_request(e.body_text()))?;
    let target = ops.policy.replay_target(&query.target_topic).ok_or_else(|| {
        bad_request(format!(
            "target_topic must be {} or {}: replays go back into this service's ladder only",
            ops.policy.topology().source_topic(),
            ops.policy.topology().retry_topic(0).map(|t| t.as_str()).unwrap_or_default()
        ))
    })?;
    let body: ReplayBody = if body.is_empty() {
        ReplayBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| bad_request(format!("invalid body: {e}")))?
    };
    if body.limit == Some(0) {
        return Err(bad_request("limit must be at least 1"));
    }
    if body.offsets.as_ref().is_some_and(|o| o.iter().any(|o| *o < 0)) {
        return Err(bad_request("offsets must not be negative"));
    }
    let request = ReplayRequest {
        target,
        dry_run: body.dry_run,
        selection: ReplaySelection {
            partition: body.partition,
            offsets: body.offsets.as_ref().map(|o| o.iter().copied().collect::<BTreeSet<i64>>()),
            keys: body.keys.as_ref().map(|keys| keys.iter().map(|k| k.as_bytes().to_vec()).collect()),
            limit: body.limit,
        },
        guards: ReplayGuards {
            max_replays: (!body.override_loop_guard).then_some(MAX_REPLAYS),
            max_age: if body.override_idempotency_window { None } else { ops.idempotency_window },
        },
    };
    let job = ReplayJob {
        id: uuid::Uuid::new_v4().to_string(),
        state: JobState::Running,
        operator: who(&headers, Some(peer)),
        topic: topic.clone(),
        target_topic: query.target_topic.clone(),
        request: body.clone(),
        started_at: now_ms(),
        finished_at: None,
        report: ReplayOutcome { dry_run: body.dry_run, ..ReplayOutcome::default() },
        error: None,
    };
    let parameters = serde_json::to_string(&body).unwrap_or_default();
    let started = ops.jobs.start(ops.store.clone(), request, job).map_err(|running| {
        Refusal(StatusCode::CONFLICT, format!("a replay of {topic} is already running (job {running})"))
    })?;
    // Another instance replaying is a refusal, not a failed job to look up.
    started.wait_started(ops.wait_limit).await.map_err(|elsewhere| Refusal(StatusCode::CONFLICT, elsewhere))?;
    let job = if query.wait { started.wait(ops.wait_limit).await } else { started.snapshot() };
    let status = if job.state == JobState::Running { StatusCode::ACCEPTED } else { StatusCode::OK };
    let outcome = format!(
        "job {} {:?}: target {}, wait {}, {parameters}, replayed {}",
        job.id, job.state, query.target_topic, query.wait, job.report.replayed
    );
    let location = format!("/admin/dlq/replays/{}", job.id);
    Ok(audited((status, [(header::LOCATION, location)], Json(job)), outcome))
}

#[utoipa::path(get, path = "/admin/dlq/replays/{id}", tag = "dead letters",
    params(("id" = String, Path, description = "the job's id, from POST .../replay")),
    responses((status = 200, body = ReplayJob), (status = 401, body = Problem), (status = 404, body = Problem),
              (status = 429, body = Problem)))]
/// A replay job's progress or outcome. Jobs are kept by the instance that
/// runs them: ask the one that answered the POST.
pub(crate) async fn replay_job<S: DeadLetterStore>(
    State(ops): State<Arc<Operators<S>>>,
    Path(id): Path<String>,
) -> Result<Response, Refusal> {
    let job = ops.jobs.get(&id).ok_or_else(|| {
        Refusal(StatusCode::NOT_FOUND, format!("no replay job {:?} on this instance", excerpt(&id, 64)))
    })?;
    let outcome = format!("job {} {:?}, replayed {}", job.id, job.state, job.report.replayed);
    Ok(audited(Json(job), outcome))
}

#[utoipa::path(post, path = "/admin/dlq/{topic}/ack", tag = "dead letters",
    params(("topic" = String, Path, description = "the dead-letter topic")),
    request_body = AckBody,
    responses((status = 200, body = AckAnswer), (status = 400, body = Problem), (status = 401, body = Problem),
              (status = 404, body = Problem), (status = 409, body = Problem), (status = 413, body = Problem),
              (status = 429, body = Problem), (status = 502, body = Problem)))]
/// Acknowledge records without replaying them: they stay in the topic for
/// audit and leave the backlog. 409 while a replay runs on another
/// instance, or when the broker cannot record the offsets.
pub(crate) async fn ack<S: DeadLetterStore>(
    State(ops): State<Arc<Operators<S>>>,
    Path(topic): Path<String>,
    body: Result<Json<AckBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, Refusal> {
    check_topic(&ops, &topic)?;
    let Json(body) = body.map_err(|e| bad_request(e.body_text()))?;
    let status = ops.store.status().await?;
    let Some(p) = status.partitions.iter().find(|p| p.partition == body.partition) else {
        return Err(Refusal(StatusCode::NOT_FOUND, format!("{topic} has no partition {}", body.partition)));
    };
    let ack = match (&body.up_to_offset, &body.offsets) {
        (Some(up_to), None) => Acknowledgement::UpTo(*up_to),
        (None, Some(offsets)) if !offsets.is_empty() => Acknowledgement::Offsets(offsets.iter().copied().collect()),
        _ => return Err(bad_request("give either up_to_offset or a non-empty list of offsets")),
    };
    let outside = match &ack {
        Acknowledgement::UpTo(o) => (*o < 0 || *o >= p.end).then_some(*o),
        Acknowledgement::Offsets(os) => os.iter().copied().find(|o| *o < 0 || *o >= p.end),
    };
    if let Some(offset) = outside {
        return Err(bad_request(format!("offset {offset} is outside the partition (0 to {})", p.end - 1)));
    }
    let position = ops.store.acknowledge(body.partition, &ack).await?;
    let answer = AckAnswer {
        topic,
        partition: body.partition,
        acknowledged_offset: position.next(),
        handled_above: position.handled_above(p.end),
    };
    let outcome = format!("{ack:?} on partition {}: position {}", body.partition, answer.acknowledged_offset);
    Ok(audited(Json(answer), outcome))
}

#[utoipa::path(get, path = "/admin/dlq/replays", tag = "dead letters",
    responses((status = 200, body = ReplayJobs), (status = 401, body = Problem), (status = 429, body = Problem)))]
/// This instance's recent replay jobs, newest first.
pub(crate) async fn replay_jobs<S: DeadLetterStore>(State(ops): State<Arc<Operators<S>>>) -> Response {
    let jobs = ops.jobs.recent();
    let outcome = format!("{} jobs", jobs.len());
    audited(Json(ReplayJobs { jobs }), outcome)
}

#[utoipa::path(get, path = "/admin/listener", tag = "listener",
    responses((status = 200, body = ListenerAnswer), (status = 401, body = Problem), (status = 429, body = Problem),
              (status = 502, body = Problem)))]
/// The ladder's listener: this instance's brake, the operators' pause that
/// every instance follows, and each consumed topic's lag.
pub(crate) async fn listener<S: DeadLetterStore>(State(ops): State<Arc<Operators<S>>>) -> Result<Response, Refusal> {
    let now = retry_core::Timestamp::from(std::time::SystemTime::now());
    let pause = ops.store.listener_pause().await?.filter(|p| p.holds_at(now)).map(PauseAnswer::from);
    let lag = ops.store.lag().await?;
    let brake = ops.brake.get().map(|view| view.status());
    let answer = ListenerAnswer {
        topic: ops.policy.topology().source_topic().as_str().to_owned(),
        group: ops.group.clone(),
        consumed_here: brake.is_some(),
        paused_here: brake.as_ref().is_some_and(|status| status.pause.is_some()),
        brake: brake.and_then(|status| {
            let state = status.state?;
            Some(BrakeAnswer {
                state: format!("{state:?}").to_lowercase(),
                engaged_since_ms: status.engaged_since.map(|t| t.as_millis()),
                recent_engagements: status
                    .recent_engagements
                    .iter()
                    .map(|e| EngagementAnswer { at_ms: e.at.as_millis(), failed: e.failed, calls: e.calls })
                    .collect(),
            })
        }),
        pause,
        lag: lag
            .into_iter()
            .map(|t| TopicLag {
                lag: t.lag(),
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| PartitionLag { partition: p.partition, committed: p.committed, end: p.end, lag: p.lag })
                    .collect(),
                topic: t.topic,
                group: t.group,
            })
            .collect(),
    };
    let outcome = format!("paused {}", answer.pause.is_some());
    Ok(audited(Json(answer), outcome))
}

#[utoipa::path(post, path = "/admin/listener/pause", tag = "listener",
    request_body = PauseBody,
    responses((status = 200, body = PauseAnswer), (status = 400, body = Problem), (status = 401, body = Problem),
              (status = 413, body = Problem), (status = 429, body = Problem), (status = 502, body = Problem)))]
/// Pause the listener on every instance for a while: records wait, keeping
/// their place, and run again when the pause ends or is resumed. Each
/// instance follows within its pause poll interval (2s).
pub(crate) async fn pause<S: DeadLetterStore>(
    State(ops): State<Arc<Operators<S>>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Result<Json<PauseBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, Refusal> {
    let Json(body) = body.map_err(|e| bad_request(e.body_text()))?;
    let duration = retry_core::parse_duration(&body.duration).map_err(|e| bad_request(e.to_string()))?;
    let now = retry_core::Timestamp::from(std::time::SystemTime::now());
    let by = who(&headers, Some(peer));
    let pause = ListenerPause::new(now, duration, &by, &body.reason).map_err(|e| bad_request(e.to_string()))?;
    ops.store.set_listener_pause(Some(&pause)).await?;
    let outcome = format!("paused for {} until {} ms: {:?}", body.duration, pause.until.as_millis(), pause.reason);
    Ok(audited(Json(PauseAnswer::from(pause)), outcome))
}

#[utoipa::path(post, path = "/admin/listener/resume", tag = "listener",
    responses((status = 200, body = ResumeAnswer), (status = 401, body = Problem), (status = 429, body = Problem),
              (status = 502, body = Problem)))]
/// End the operators' pause on every instance (nothing changes when none holds).
pub(crate) async fn resume<S: DeadLetterStore>(State(ops): State<Arc<Operators<S>>>) -> Result<Response, Refusal> {
    let now = retry_core::Timestamp::from(std::time::SystemTime::now());
    let was_paused = ops.store.listener_pause().await?.is_some_and(|p| p.holds_at(now));
    ops.store.set_listener_pause(None).await?;
    Ok(audited(Json(ResumeAnswer { was_paused }), format!("resumed (was paused: {was_paused})")))
}

impl From<ListenerPause> for PauseAnswer {
    fn from(p: ListenerPause) -> Self {
        PauseAnswer { until_ms: p.until.as_millis(), by: p.by, reason: p.reason }
    }
}
