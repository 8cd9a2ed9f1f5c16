//! The operators' API under `/admin`: look at the dead-letter topic, replay
//! records into the ladder, or acknowledge them. By hand only: nothing here
//! runs on a schedule.
//!
//! Mounted only when `ADMIN_TOKEN` (or `ADMIN_TOKEN_FILE`) is set; every request needs
//! `Authorization: Bearer <token>`, compared in constant time, and every
//! action is logged as an audit event (target `audit`).

use std::{net::SocketAddr, sync::Arc};

use axum::{
    extract::{ConnectInfo, DefaultBodyLimit, Path, Query, Request, State},
    http::{header, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use base64::Engine;
use bytes::Bytes;
use retry_core::RetryPolicy;
use retry_kafka::{DeadLetter, DeadLetterAdmin, ReplayRequest};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use subtle::ConstantTimeEq;
use tracing::info;

/// The most records one page of `/messages` returns.
pub(crate) const MAX_PAGE: usize = 100;
/// The largest request body accepted.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// The loop guard: records replayed this often are refused unless overridden.
pub(crate) const MAX_REPLAYS: u32 = 3;

/// What the routes share.
pub(crate) struct Operators {
    pub(crate) token: String,
    pub(crate) policy: RetryPolicy,
    pub(crate) admin: DeadLetterAdmin,
    /// Held during a replay: a second concurrent one gets 409.
    pub(crate) replaying: tokio::sync::Mutex<()>,
}

/// The `/admin` routes.
pub(crate) fn routes(operators: Arc<Operators>) -> Router {
    Router::new()
        .route("/admin/dlq", get(list))
        .route("/admin/dlq/{topic}/messages", get(messages))
        .route("/admin/dlq/{topic}/replay", post(replay))
        .route("/admin/dlq/{topic}/ack", post(ack))
        .route("/admin/openapi.json", get(openapi))
        .layer(middleware::from_fn_with_state(operators.clone(), authorize))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(operators)
}

/// An error answer: a status and a reason, as JSON.
struct Problem(StatusCode, String);

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<retry_kafka::Error> for Problem {
    fn from(e: retry_kafka::Error) -> Self {
        Problem(StatusCode::BAD_GATEWAY, format!("kafka: {e}"))
    }
}

fn bad_request(reason: impl Into<String>) -> Problem {
    Problem(StatusCode::BAD_REQUEST, reason.into())
}

async fn authorize(State(ops): State<Arc<Operators>>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // Equal lengths are compared in constant time; a length mismatch only
    // tells that the length is wrong.
    let ok = presented.len() == ops.token.len() && bool::from(presented.as_bytes().ct_eq(ops.token.as_bytes()));
    if !ok {
        let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.to_string()).unwrap_or_default();
        info!(target: "audit", %peer, path = %request.uri().path(), "refused: missing or wrong admin token");
        return Problem(StatusCode::UNAUTHORIZED, "missing or wrong bearer token".into()).into_response();
    }
    next.run(request).await
}

/// Who did it, for the audit log: the caller's `X-Operator` header, else its address.
fn who(headers: &axum::http::HeaderMap, peer: SocketAddr) -> String {
    headers.get("x-operator").and_then(|v| v.to_str().ok()).map(str::to_owned).unwrap_or_else(|| peer.to_string())
}

fn check_topic(ops: &Operators, topic: &str) -> Result<(), Problem> {
    if topic == ops.policy.topology().dead_letter_topic().as_str() {
        Ok(())
    } else {
        Err(Problem(StatusCode::NOT_FOUND, format!("{topic} is not a dead-letter topic of this service")))
    }
}

async fn list(State(ops): State<Arc<Operators>>) -> Result<Json<Value>, Problem> {
    let status = ops.admin.status().await?;
    let partitions: Vec<Value> = status
        .partitions
        .iter()
        .map(|p| {
            json!({"partition": p.partition, "earliest": p.earliest, "end_offset": p.end,
                   "acknowledged_offset": p.acknowledged, "backlog": p.backlog})
        })
        .collect();
    Ok(Json(json!({ "topics": [{
        "topic": status.topic,
        "source_topic": ops.policy.topology().source_topic().as_str(),
        "backlog": status.backlog,
        "partitions": partitions,
    }]})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Page {
    partition: i32,
    #[serde(default)]
    offset: i64,
    limit: Option<usize>,
}

fn render(d: &DeadLetter) -> Value {
    let text = |b: &Option<Bytes>| match b {
        None => json!(null),
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => json!({"text": s}),
            Err(_) => json!({"base64": base64::engine::general_purpose::STANDARD.encode(b)}),
        },
    };
    let retry = match d.retry_headers() {
        Ok(h) => json!({
            "attempt": h.attempt,
            "original_topic": h.original_topic.as_str(),
            "original_partition": h.original_partition,
            "original_offset": h.original_offset,
            "first_failure_at": h.first_failure_at.as_millis(),
            "error_kind": h.error_kind.as_str(),
            "error": h.error,
            "reason": h.dead_letter_reason.map(|r| r.as_str()),
            "replay_count": h.replay_count,
        }),
        Err(e) => json!({"undecodable": e.to_string()}),
    };
    let headers: serde_json::Map<String, Value> =
        d.headers.iter().map(|(k, v)| (k.to_owned(), json!(String::from_utf8_lossy(v)))).collect();
    json!({
        "partition": d.partition,
        "offset": d.offset,
        "timestamp": d.timestamp.map(|t| t.as_millis()),
        "key": text(&d.key),
        "payload": text(&d.value),
        "retry": retry,
        "headers": headers,
    })
}

async fn messages(
    State(ops): State<Arc<Operators>>,
    Path(topic): Path<String>,
    page: Result<Query<Page>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, Problem> {
    check_topic(&ops, &topic)?;
    let Query(page) = page.map_err(|e| bad_request(e.body_text()))?;
    let limit = page.limit.unwrap_or(20);
    if limit == 0 || limit > MAX_PAGE {
        return Err(bad_request(format!("limit must be between 1 and {MAX_PAGE}")));
    }
    if page.offset < 0 {
        return Err(bad_request("offset must not be negative"));
    }
    let known = ops.admin.status().await?.partitions.iter().any(|p| p.partition == page.partition);
    if !known {
        return Err(Problem(StatusCode::NOT_FOUND, format!("{topic} has no partition {}", page.partition)));
    }
    let records = ops.admin.browse(page.partition, page.offset, limit).await?;
    let next = records.last().map(|r| r.offset + 1);
    Ok(Json(json!({ "messages": records.iter().map(render).collect::<Vec<_>>(), "next_offset": next })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayQuery {
    target_topic: String,
}

/// The optional JSON body of a replay.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    #[serde(default)]
    dry_run: bool,
    limit: Option<usize>,
    partition: Option<i32>,
    offsets: Option<Vec<i64>>,
    keys: Option<Vec<String>>,
    /// Replay records even if replayed `MAX_REPLAYS` times already.
    #[serde(default)]
    override_loop_guard: bool,
}

#[derive(Serialize)]
struct ReplayAnswer {
    target_topic: String,
    dry_run: bool,
    replayed: usize,
    skipped: Vec<Value>,
    covered: Vec<Value>,
}

async fn replay(
    State(ops): State<Arc<Operators>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: axum::http::HeaderMap,
    Path(topic): Path<String>,
    query: Result<Query<ReplayQuery>, axum::extract::rejection::QueryRejection>,
    body: Bytes,
) -> Result<Json<ReplayAnswer>, Problem> {
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
    let Ok(_replaying) = ops.replaying.try_lock() else {
        return Err(Problem(StatusCode::CONFLICT, format!("a replay of {topic} is already running")));
    };
    let request = ReplayRequest {
        target,
        dry_run: body.dry_run,
        limit: body.limit,
        partition: body.partition,
        offsets: body.offsets,
        keys: body.keys.map(|keys| keys.into_iter().map(Bytes::from).collect()),
        max_replays: (!body.override_loop_guard).then_some(MAX_REPLAYS),
    };
    let report = ops.admin.replay(&request).await?;
    info!(target: "audit", operator = %who(&headers, peer), action = "replay", %topic, target = %report.target,
          dry_run = report.dry_run, replayed = report.replayed, skipped = report.skipped.len(), covered = ?report.covered);
    Ok(Json(ReplayAnswer {
        target_topic: report.target,
        dry_run: report.dry_run,
        replayed: report.replayed,
        skipped: report
            .skipped
            .into_iter()
            .map(|(p, o, why)| json!({"partition": p, "offset": o, "reason": why}))
            .collect(),
        covered: report
            .covered
            .into_iter()
            .map(|(p, from, to)| json!({"partition": p, "from": from, "to": to}))
            .collect(),
    }))
}

/// Either `up_to_offset` (every record up to it), or `offsets` (these
/// records; they must follow on from the operators' position, since the
/// group keeps one position per partition).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AckBody {
    partition: i32,
    up_to_offset: Option<i64>,
    offsets: Option<Vec<i64>>,
}

async fn ack(
    State(ops): State<Arc<Operators>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: axum::http::HeaderMap,
    Path(topic): Path<String>,
    body: Result<Json<AckBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, Problem> {
    check_topic(&ops, &topic)?;
    let Json(body) = body.map_err(|e| bad_request(e.body_text()))?;
    let status = ops.admin.status().await?;
    let Some(p) = status.partitions.iter().find(|p| p.partition == body.partition) else {
        return Err(Problem(StatusCode::NOT_FOUND, format!("{topic} has no partition {}", body.partition)));
    };
    let up_to = match (body.up_to_offset, body.offsets) {
        (Some(up_to), None) => up_to,
        (None, Some(mut offsets)) if !offsets.is_empty() => {
            offsets.sort_unstable();
            offsets.dedup();
            let start = p.acknowledged.unwrap_or(p.earliest).max(p.earliest);
            let mut position = start;
            for offset in offsets.iter().copied().filter(|o| *o >= start) {
                if offset != position {
                    return Err(bad_request(format!(
                        "offset {offset} does not follow on from the operators' position {position}: \
                         acknowledge or replay the records before it first"
                    )));
                }
                position += 1;
            }
            position - 1
        }
        _ => return Err(bad_request("give either up_to_offset or a non-empty list of offsets")),
    };
    if up_to < 0 || up_to >= p.end {
        return Err(bad_request(format!("offset {up_to} is outside the partition (0 to {})", p.end - 1)));
    }
    let position = ops.admin.acknowledge(body.partition, up_to).await?;
    info!(target: "audit", operator = %who(&headers, peer), action = "acknowledge", %topic,
          partition = body.partition, up_to_offset = up_to, position);
    Ok(Json(json!({"topic": topic, "partition": body.partition, "acknowledged_offset": position})))
}

async fn openapi() -> Json<Value> {
    Json(crate::openapi::document())
}
