//! Serving HTTP with limits, so that slow or hostile clients cannot take
//! the file descriptors the Kafka and provider connections need: a cap on
//! concurrent connections (more are closed at once), a deadline for a
//! request's headers and one for the whole request, and a graceful stop.

use std::{io, net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    extract::{ConnectInfo, Request, State},
    http::StatusCode,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    Extension, Router,
};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
    service::TowerToHyperService,
};
use tokio::{
    net::TcpListener,
    sync::{oneshot, Semaphore},
    task::JoinHandle,
};

/// How long a stop waits for requests under way.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The limits of one listener.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HttpLimits {
    /// How long a client may take to send a request's headers (an idle
    /// kept-alive connection included).
    pub(crate) header_read_timeout: Duration,
    /// How long a request may take, its body included.
    pub(crate) request_timeout: Duration,
    /// Connections served at once; more are closed on arrival.
    pub(crate) max_connections: usize,
}

/// A running listener.
pub(crate) struct Server {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Server {
    /// Where it listens (useful when configured with port 0).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and finishes requests under way, within a few seconds.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Binds `addr` (the setting `setting`, for messages) and serves `app` in
/// the background under `limits`.
pub(crate) async fn serve(setting: &str, addr: SocketAddr, app: Router, limits: HttpLimits) -> io::Result<Server> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {setting}={addr}: {e}")))?;
    let addr = listener.local_addr()?;
    let app = app.layer(middleware::from_fn_with_state(limits.request_timeout, deadline));
    let (stop, mut stopped) = oneshot::channel::<()>();
    let setting = setting.to_owned();
    let task = tokio::spawn(async move {
        let connections = Arc::new(Semaphore::new(limits.max_connections));
        let graceful = GracefulShutdown::new();
        loop {
            let (stream, peer) = tokio::select! {
                _ = &mut stopped => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors, most likely: let some close.
                        tracing::warn!(listener = %setting, error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let Ok(permit) = connections.clone().try_acquire_owned() else {
                tracing::debug!(listener = %setting, %peer, "connection refused: too many open");
                drop(stream);
                continue;
            };
            let service = TowerToHyperService::new(app.clone().layer(Extension(ConnectInfo(peer))));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(TokioIo::new(stream), service);
            let connection = graceful.watch(connection);
            tokio::spawn(async move {
                let _ = connection.await;
                drop(permit);
            });
        }
        drop(listener);
        let _ = tokio::time::timeout(STOP_GRACE, graceful.shutdown()).await;
    });
    Ok(Server { addr, stop, task })
}

/// Ends a request that takes longer than the limit with 503.
async fn deadline(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("the request took longer than {limit:?}\n")).into_response()
        }
    }
}
