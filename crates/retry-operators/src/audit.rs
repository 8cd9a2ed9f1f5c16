//! The audit log of the operators' API: one event per request, whatever
//! became of it (refusals and requests cut off included), and one per
//! finished replay job.

use std::net::SocketAddr;

use axum::{
    extract::{ConnectInfo, Request},
    http::HeaderMap,
    middleware::Next,
    response::{IntoResponse, Response},
};
use tracing::info;

use super::api::ReplayJob;

/// What a handler did, for the request's audit event: its parameters and
/// what came of them.
#[derive(Clone)]
pub(crate) struct Outcome(pub(crate) String);

/// A response carrying its audit outcome.
pub(crate) fn audited(response: impl IntoResponse, outcome: String) -> Response {
    let mut response = response.into_response();
    response.extensions_mut().insert(Outcome(outcome));
    response
}

/// Who made a request, for the audit log: its `X-Operator` header, else its address.
pub(crate) fn who(headers: &HeaderMap, peer: Option<SocketAddr>) -> String {
    match headers.get("x-operator").map(|v| v.to_str()) {
        Some(Ok(operator)) => excerpt(operator, 128),
        Some(Err(_)) => "(X-Operator is not text)".to_owned(),
        None => peer.map(|p| p.to_string()).unwrap_or_default(),
    }
}

/// At most `max_bytes` of `text`, cut on a character boundary.
pub(crate) fn excerpt(text: &str, max_bytes: usize) -> String {
    let mut end = text.len().min(max_bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

pub(crate) fn peer_of(request: &Request) -> Option<SocketAddr> {
    request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0)
}

/// One audit event per request, whatever became of it. Every value that
/// comes from the request is written with `?`, which escapes quotes, line
/// breaks and control characters, so no request can forge a log line. A
/// request cut off before it answered (the request deadline, a client
/// that left) is audited too, when it is dropped: what it did may have
/// landed.
pub(crate) async fn audit(request: Request, next: Next) -> Response {
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
