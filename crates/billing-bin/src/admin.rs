//! The admin listener: `/healthz` (the process is alive), `/readyz` (topics
//! verified and every consumer group joined) and `/metrics` (Prometheus text).
//! Nothing else: the operators' API listens elsewhere.

use std::{
    net::SocketAddr,
    sync::{Arc, OnceLock},
};

use axum::{
    extract::State,
    http::{header, StatusCode},
    response::IntoResponse,
    routing::get,
    Router,
};
use retry_kafka::{MetricsExposition, Readiness};

use retry_operators::http::{HttpLimits, Server};

/// The running admin server.
pub(crate) struct Admin {
    server: Server,
    ready: Arc<OnceLock<Running>>,
}

impl Admin {
    /// Where it listens (useful when configured with port 0).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// From now on, `/readyz` follows the listener and `/metrics` shows its `metrics`.
    pub(crate) fn set_running(&self, readiness: Readiness, metrics: MetricsExposition) {
        let _ = self.ready.set(Running { readiness, metrics });
    }

    /// Stops accepting, finishes requests under way.
    pub(crate) async fn stop(self) {
        self.server.stop().await;
    }
}

/// Binds `addr` and serves the probes and metrics in the background. The
/// operators' API has a listener of its own, so that an orchestrator can
/// reach these without reaching it.
pub(crate) async fn serve(addr: SocketAddr, limits: HttpLimits) -> std::io::Result<Admin> {
    let ready: Arc<OnceLock<Running>> = Arc::default();
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(ready.clone());
    let server = retry_operators::http::serve("ADMIN_LISTEN", addr, app, limits).await?;
    Ok(Admin { server, ready })
}

/// What the endpoints show once the listener runs.
struct Running {
    readiness: Readiness,
    metrics: MetricsExposition,
}

async fn readyz(State(ready): State<Arc<OnceLock<Running>>>) -> (StatusCode, &'static str) {
    match ready.get() {
        Some(r) if r.readiness.is_ready() => (StatusCode::OK, "ready\n"),
        Some(_) => (StatusCode::SERVICE_UNAVAILABLE, "joining the consumer groups\n"),
        None => (StatusCode::SERVICE_UNAVAILABLE, "starting: verifying topics\n"),
    }
}

async fn metrics(State(ready): State<Arc<OnceLock<Running>>>) -> impl IntoResponse {
    let text = match ready.get() {
        Some(running) => running.metrics.encode(),
        None => "# EOF\n".to_owned(),
    };
    (StatusCode::OK, [(header::CONTENT_TYPE, MetricsExposition::CONTENT_TYPE)], text)
}
