//! The admin listener: `/healthz` (the process is alive), `/readyz` (topics
//! verified and every consumer group joined) and `/metrics` (Prometheus text).

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
use prometheus_client::registry::Registry;
use retry_kafka::Readiness;
use tokio::{sync::oneshot, task::JoinHandle};

/// The running admin server.
pub(crate) struct Admin {
    addr: SocketAddr,
    ready: Arc<OnceLock<Running>>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Admin {
    /// Where it listens (useful when configured with port 0).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on, `/readyz` follows the listener and `/metrics` shows `registry`.
    pub(crate) fn set_running(&self, readiness: Readiness, registry: Registry) {
        let _ = self.ready.set(Running { readiness, registry });
    }

    /// Stops accepting, finishes requests under way.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Binds `addr` and serves in the background; with `operators`, also the
/// operators' API under `/admin`.
pub(crate) async fn serve(
    addr: SocketAddr,
    operators: Option<Arc<crate::operators::Operators>>,
) -> std::io::Result<Admin> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on ADMIN_LISTEN={addr}: {e}")))?;
    let addr = listener.local_addr()?;
    let ready: Arc<OnceLock<Running>> = Arc::default();
    let mut app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(ready.clone());
    if let Some(operators) = operators {
        app = app.merge(crate::operators::routes(operators));
    }
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        let serve = axum::serve(listener, app).with_graceful_shutdown(async {
            let _ = stopped.await;
        });
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "admin server failed");
        }
    });
    Ok(Admin { addr, ready, stop, task })
}

/// What the endpoints show once the listener runs.
struct Running {
    readiness: Readiness,
    registry: Registry,
}

async fn readyz(State(ready): State<Arc<OnceLock<Running>>>) -> (StatusCode, &'static str) {
    match ready.get() {
        Some(r) if r.readiness.is_ready() => (StatusCode::OK, "ready\n"),
        Some(_) => (StatusCode::SERVICE_UNAVAILABLE, "joining the consumer groups\n"),
        None => (StatusCode::SERVICE_UNAVAILABLE, "starting: verifying topics\n"),
    }
}

async fn metrics(State(ready): State<Arc<OnceLock<Running>>>) -> impl IntoResponse {
    let mut text = String::new();
    if let Some(running) = ready.get() {
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &running.registry) {
            return (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain")], format!("{e}\n"));
        }
    } else {
        text.push_str("# EOF\n");
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
}
