//! The operators' API and console over one retry ladder, for any service
//! built on retry-kafka: look at the dead-letter topic, replay records into
//! the ladder as jobs, or acknowledge them; see the listener's brake and
//! lag, pause or resume it on every instance. By hand only: nothing here
//! runs on a schedule. [`OperatorsServer::serve`] puts the API under
//! `/admin` and the console, a page that calls it, under `/console`, on a
//! listener of their own; [`http`] serves any other router with the same
//! limits.
//!
//! Every request to `/admin` needs `Authorization: Bearer <token>`, compared
//! in constant time. A client address that fails authentication too often
//! is answered 429 for a while, unless it presents the right token:
//! operators sharing an address with whoever failed are never locked out.
//! Every request, refused ones included, is one audit event (target
//! `audit`) with the operator, the route, its parameters and the outcome;
//! values that come from the request are escaped.
//!
//! It never consumes the ladder, and never reads a token from anywhere but
//! its configuration: the service decides where the token comes from.

pub mod api;
mod audit;
mod auth;
mod console;
mod handlers;
pub mod http;
mod jobs;
mod openapi;
mod state;
mod store;
#[cfg(test)]
mod tests;

use std::{net::SocketAddr, sync::Arc, time::Duration, time::Instant};

use axum::{
    extract::{DefaultBodyLimit, Request, State},
    http::{header, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Router,
};
use retry_core::RetryPolicy;
use retry_kafka::{BrakeView, DeadLetterAdmin};
use subtle::ConstantTimeEq;

use self::{
    audit::{audit, peer_of},
    handlers::{ack, list, listener, messages, pause, replay, replay_job, replay_jobs, resume, Refusal},
    http::{HttpLimits, Server},
    openapi::openapi,
    store::DeadLetterStore,
};
pub(crate) use self::{
    auth::AuthFailures,
    state::{Operators, MAX_BODY_BYTES},
};

/// What the operators' API needs besides the ladder's dead-letter admin.
pub struct OperatorsConfig {
    /// The bearer token every request must present (16 characters at
    /// least, random). Never logged.
    pub token: String,
    /// The ladder's policy: its topics, and the replays' guards.
    pub policy: RetryPolicy,
    /// The consumer group of the ladder's source.
    pub group_id: String,
    /// Replays refuse records older than this unless overridden (the
    /// downstream's idempotency window).
    pub idempotency_window: Option<Duration>,
    /// Failed authentications from one address, within a minute, before it
    /// is answered 429 for a while.
    pub max_auth_failures: u32,
    /// How long `wait=true` waits for a replay before answering 202.
    pub wait_limit: Duration,
}

impl std::fmt::Debug for OperatorsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorsConfig")
            .field("token", &"(redacted)")
            .field("group_id", &self.group_id)
            .field("idempotency_window", &self.idempotency_window)
            .field("max_auth_failures", &self.max_auth_failures)
            .field("wait_limit", &self.wait_limit)
            .finish_non_exhaustive()
    }
}

/// The operators' API and console, listening.
pub struct OperatorsServer {
    server: Server,
    operators: Arc<Operators<DeadLetterAdmin>>,
}

impl OperatorsServer {
    /// Binds `addr` (the setting `setting`, for messages) and serves the
    /// API and the console over `admin`'s ladder under `limits`.
    pub async fn serve(
        setting: &str,
        addr: SocketAddr,
        config: OperatorsConfig,
        admin: DeadLetterAdmin,
        limits: HttpLimits,
    ) -> std::io::Result<OperatorsServer> {
        let failures = AuthFailures::new(config.max_auth_failures, Duration::from_secs(60));
        let mut operators =
            Operators::new(config.token, config.policy, admin, config.idempotency_window, failures, config.group_id);
        operators.wait_limit = config.wait_limit;
        let operators = Arc::new(operators);
        let server = http::serve(setting, addr, routes(operators.clone()), limits).await?;
        Ok(OperatorsServer { server, operators })
    }

    /// From now on, `/admin/listener` and the console show this instance's
    /// listener's brake (an instance that consumes nothing never sets it).
    pub fn show_brake(&self, brake: BrakeView) {
        let _ = self.operators.brake.set(brake);
    }

    /// Where it listens (useful when configured with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// Stops accepting and finishes requests under way, within a few seconds.
    pub async fn stop(self) {
        self.server.stop().await;
    }
}

/// The `/admin` routes, and the console at `/console` that calls them.
fn routes<S: DeadLetterStore>(operators: Arc<Operators<S>>) -> Router {
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
