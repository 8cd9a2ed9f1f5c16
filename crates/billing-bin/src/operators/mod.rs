//! The operators' API under `/admin`, on a listener of its own
//! (`OPERATOR_LISTEN`): look at the dead-letter topic, replay records into
//! the ladder as jobs, or acknowledge them; see the listener's brake and
//! lag, pause or resume it on every instance. By hand only: nothing here
//! runs on a schedule. The console (`/console`) is a page that calls it.
//!
//! Mounted only when `ADMIN_TOKEN` (or `ADMIN_TOKEN_FILE`) is set; every
//! request needs `Authorization: Bearer <token>`, compared in constant time.
//! A client address that fails authentication too often is answered 429 for
//! a while, unless it presents the right token: operators sharing an
//! address with whoever failed are never locked out. Every request, refused ones included, is one audit event
//! (target `audit`) with the operator, the route, its parameters and the
//! outcome; values that come from the request are escaped.

pub(crate) mod api;
mod audit;
mod auth;
mod console;
mod handlers;
mod jobs;
mod openapi;
mod state;
pub(crate) mod store;
#[cfg(test)]
mod tests;

use std::{sync::Arc, time::Instant};

use axum::{
    extract::{DefaultBodyLimit, Request, State},
    http::{header, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Router,
};
use subtle::ConstantTimeEq;

use self::{
    audit::{audit, peer_of},
    handlers::{ack, list, listener, messages, pause, replay, replay_job, replay_jobs, resume, Refusal},
    openapi::openapi,
    store::DeadLetterStore,
};
pub(crate) use self::{
    auth::AuthFailures,
    state::{Operators, MAX_BODY_BYTES},
};

/// The `/admin` routes, and the console at `/console` that calls them.
pub(crate) fn routes<S: DeadLetterStore>(operators: Arc<Operators<S>>) -> Router {
    let api = Router::new()
        .route("/admin/dlq", get(list::<S>))
        .route("/admin/dlq/replays", get(replay_jobs::<S>))
        .route("/admin/dlq/replays/{id}", get(replay_job::<S>))
        .route("/admin/dlq/{topic}/messages", get(messages::<S>))
        .route("/admin/dlq/{topic}/replay", post(replay::<S>))
        .route("/admin/dlq/{topic}/ack", post(ack::<S>))
        .route("/admin/listener", get(listener::<S>))
        .route("/admin/listener/pause", post(pause::<S>))
        .route("/admin/listener/resume", post(resume::<S>))
        .route("/admin/openapi.json", get(openapi))
        .layer(middleware::from_fn_with_state(operators.clone(), authorize::<S>))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(audit))
        .with_state(operators);
    api.merge(console::routes())
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
