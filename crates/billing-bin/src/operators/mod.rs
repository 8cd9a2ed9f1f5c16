//! The operators' API under `/admin`, on a listener of its own
//! (`OPERATOR_LISTEN`): look at the dead-letter topic, replay records into
//! the ladder as jobs, or acknowledge them. By hand only: nothing here runs
//! on a schedule.
//!
//! Mounted only when `ADMIN_TOKEN` (or `ADMIN_TOKEN_FILE`) is set; every
//! request needs `Authorization: Bearer <token>`, compared in constant time.
//! A client address that fails authentication too often is answered 429 for
//! a while, unless it presents the right token: operators sharing an
//! address with whoever failed are never locked out. Every request, refused ones included, is one audit event
//! (target `audit`) with the operator, the route, its parameters and the
//! outcome; values that come from the request are escaped.

pub(crate) mod api;
mod auth;
mod jobs;
pub(crate) mod store;
#[cfg(test)]
mod tests;

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    extract::{ConnectInfo, DefaultBodyLimit, Path, Query, Request, State},
    http::{header, HeaderMap, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use bytes::Bytes;
use retry_core::{ReplayGuards, ReplaySelection, RetryPolicy};
use retry_kafka::{Acknowledgement, BrowsePage, ReplayRequest};
use subtle::ConstantTimeEq;
use tracing::info;

pub(crate) use self::auth::AuthFailures;
use self::{
    api::{
        AckAnswer, AckBody, DlqList, DlqTopic, JobState, Message, MessagesPage, MessagesQuery, Problem, ReplayBody,
        ReplayJob, ReplayOutcome, ReplayQuery,
    },
    jobs::{now_ms, Jobs},
    store::DeadLetterStore,
};

/// The most records one page of `/messages` returns.
pub(crate) const MAX_PAGE: usize = 100;
/// The most bytes of keys, values and headers one page of `/messages` returns.
pub(crate) const MAX_PAGE_BYTES: usize = 1 << 20;
/// The largest request body accepted.
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;
/// The loop guard: records replayed this often are refused unless overridden.
pub(crate) const MAX_REPLAYS: u32 = 3;

/// What the routes share.
pub(crate) struct Operators<S> {
    pub(crate) token: String,
    pub(crate) policy: RetryPolicy,
    pub(crate) store: Arc<S>,
    /// Replays refuse records older than this unless overridden.
    pub(crate) idempotency_window: Option<Duration>,
    /// How long `wait=true` waits for a replay before answering 202.
    pub(crate) wait_limit: Duration,
    pub(crate) auth_failures: Mutex<AuthFailures>,
    pub(crate) jobs: Jobs,
}

impl<S: DeadLetterStore> Operators<S> {
    pub(crate) fn new(
        token: String,
        policy: RetryPolicy,
        store: S,
        idempotency_window: Option<Duration>,
        auth_failures: AuthFailures,
    ) -> Self {
        Operators {
            token,
            policy,
            store: Arc::new(store),
            idempotency_window,
            wait_limit: Duration::from_secs(20),
            auth_failures: Mutex::new(auth_failures),
            jobs: Jobs::default(),
        }
    }
}

/// The `/admin` routes.
pub(crate) fn routes<S: DeadLetterStore>(operators: Arc<Operators<S>>) -> Router {
    Router::new()
        .route("/admin/dlq", get(list::<S>))
        .route("/admin/dlq/replays/{id}", get(replay_job::<S>))
        .route("/admin/dlq/{topic}/messages", get(messages::<S>))
        .route("/admin/dlq/{topic}/replay", post(replay::<S>))
        .route("/admin/dlq/{topic}/ack", post(ack::<S>))
        .route("/admin/openapi.json", get(openapi))
        .layer(middleware::from_fn_with_state(operators.clone(), authorize::<S>))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(audit))
        .with_state(operators)
}

/// An error answer: a status and a reason.
pub(crate) struct Refusal(StatusCode, String);

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

/// What a handler did, for the request's audit event: its parameters and
/// what came of them.
#[derive(Clone)]
struct Outcome(String);

/// A response carrying its audit outcome.
fn audited(response: impl IntoResponse, outcome: String) -> Response {
    let mut response = response.into_response();
    response.extensions_mut().insert(Outcome(outcome));
    response
}

/// Who made a request, for the audit log: its `X-Operator` header, else its address.
fn who(headers: &HeaderMap, peer: Option<SocketAddr>) -> String {
    match headers.get("x-operator").map(|v| v.to_str()) {
        Some(Ok(operator)) => excerpt(operator, 128),
        Some(Err(_)) => "(X-Operator is not text)".to_owned(),
        None => peer.map(|p| p.to_string()).unwrap_or_default(),
    }
}

/// At most `max_bytes` of `text`, cut on a character boundary.
fn excerpt(text: &str, max_bytes: usize) -> String {
    let mut end = text.len().min(max_bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

fn peer_of(request: &Request) -> Option<SocketAddr> {
    request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0)
}

/// One audit event per request, whatever became of it. Every value that
/// comes from the request is written with `?`, which escapes quotes, line
/// breaks and control characters, so no request can forge a log line. A
/// request cut off before it answered (the request deadline, a client
/// that left) is audited too, when it is dropped: what it did may have
/// landed.
async fn audit(request: Request, next: Next) -> Response {
    let peer = peer_of(&request);
    let mut event = AuditEvent {
        operator: who(request.headers(), peer),
        peer: peer.map(|p| p.to_string()),
        method: request.method().clone(),
        route: request.uri().path().to_owned(),
        query: request.uri().query().unwrap_or("").to_owned(),
        answered: false,
    };
    let response = next.run(request).await;
    let outcome = response.extensions().get::<Outcome>().map(|o| o.0.clone()).unwrap_or_default();
    event.write(response.status().as_u16(), &outcome);
    response
}

/// A request's audit event, written once: when it answered, or when it
/// was dropped unanswered.
struct AuditEvent {
    operator: String,
    peer: Option<String>,
    method: axum::http::Method,
    route: String,
    query: String,
    answered: bool,
}

impl AuditEvent {
    fn write(&mut self, status: u16, outcome: &str) {
        self.answered = true;
        let AuditEvent { operator, peer, method, route, query, .. } = &*self;
        info!(target: "audit", operator = ?operator, peer = ?peer, %method, route = ?route,
              query = ?query, status, outcome = ?outcome, "operators' API request");
    }
}

impl Drop for AuditEvent {
    fn drop(&mut self) {
        if !self.answered {
            // What the deadline answers (see `http::deadline`).
            self.write(
                503,
                "cut off before it answered (the request deadline, or the client left): what it did may have landed",
            );
        }
    }
}

/// The end of a replay job, as an audit event of its own.
pub(crate) fn audit_job(job: &ReplayJob) {
    info!(target: "audit", operator = ?job.operator, job = %job.id, state = ?job.state, topic = %job.topic,
          target = %job.target_topic, dry_run = job.request.dry_run, replayed = job.report.replayed,
          skipped = job.report.skipped_total, error = ?job.error, "replay job finished");
}

async fn authorize<S: DeadLetterStore>(State(ops): State<Arc<Operators<S>>>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // Equal lengths are compared in constant time; a length mismatch only
    // tells that the length is wrong.
    let ok = presented.len() == ops.token.len() && bool::from(presented.as_bytes().ct_eq(ops.token.as_bytes()));
    // The right token is accepted from any address: operators behind an
    // ingress or a published port share theirs with whoever failed there,
    // and must never be locked out by them. What keeps guesses out is the
    // token's length (16 characters at least, random); the limit below
    // keeps failures from flooding the service and its audit log.
    if ok {
        return next.run(request).await;
    }
    let ip = peer_of(&request).map(|p| p.ip());
    if let Some(ip) = ip {
        let mut failures = ops.auth_failures.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if let Some(retry_after) = failures.blocked(ip, now) {
            drop(failures);
            let refusal = Refusal(
                StatusCode::TOO_MANY_REQUESTS,
                format!("too many failed authentications from {ip}: try again in {}s", retry_after.as_secs().max(1)),
            );
            let mut response = refusal.into_response();
            if let Ok(value) = retry_after.as_secs().max(1).to_string().parse() {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            return response;
        }
        failures.failed(ip, now);
    }
    Refusal(StatusCode::UNAUTHORIZED, "missing or wrong bearer token".into()).into_response()
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
    if query.offset.is_some_and(|o| o < 0) {
        return Err(bad_request("offset must not be negative"));
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
    let page = BrowsePage { partition: query.partition, from: query.offset, limit, max_bytes: MAX_PAGE_BYTES };
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

#[utoipa::path(get, path = "/admin/openapi.json", tag = "meta", responses((status = 200, description = "this document")))]
/// This document.
pub(crate) async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(crate::openapi::document())
}
