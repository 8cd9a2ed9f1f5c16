//! The admin listener: `/healthz` (the process is alive) and `/readyz`
//! (topics verified and every consumer group joined).

use std::{
    net::SocketAddr,
    sync::{Arc, OnceLock},
};

use axum::{extract::State, http::StatusCode, routing::get, Router};
use retry_kafka::Readiness;
use tokio::{sync::oneshot, task::JoinHandle};

/// The running admin server.
pub(crate) struct Admin {
    addr: SocketAddr,
    ready: Arc<OnceLock<Readiness>>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Admin {
    /// Where it listens (useful when configured with port 0).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on, `/readyz` follows the listener.
    pub(crate) fn set_ready(&self, readiness: Readiness) {
        let _ = self.ready.set(readiness);
    }

    /// Stops accepting, finishes requests under way.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Binds `addr` and serves in the background.
pub(crate) async fn serve(addr: SocketAddr) -> std::io::Result<Admin> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on ADMIN_LISTEN={addr}: {e}")))?;
    let addr = listener.local_addr()?;
    let ready: Arc<OnceLock<Readiness>> = Arc::default();
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(ready.clone());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(async {
            let _ = stopped.await;
        });
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "admin server failed");
        }
    });
    Ok(Admin { addr, ready, stop, task })
}

async fn readyz(State(ready): State<Arc<OnceLock<Readiness>>>) -> (StatusCode, &'static str) {
    match ready.get() {
        Some(r) if r.is_ready() => (StatusCode::OK, "ready\n"),
        Some(_) => (StatusCode::SERVICE_UNAVAILABLE, "joining the consumer groups\n"),
        None => (StatusCode::SERVICE_UNAVAILABLE, "starting: verifying topics\n"),
    }
}
