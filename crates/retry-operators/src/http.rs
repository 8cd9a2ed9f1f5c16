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
pub struct HttpLimits {
    /// How long a client may take to send a request's headers (an idle
    /// kept-alive connection included).
    pub header_read_timeout: Duration,
    /// How long a request may take, its body included.
    pub request_timeout: Duration,
    /// Connections served at once; more are closed on arrival.
    pub max_connections: usize,
}

/// A running listener.
pub struct Server {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    connections: Arc<Semaphore>,
    max_connections: usize,
}

impl Server {
    /// Where it listens (useful when configured with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many connections it serves now.
    pub fn open_connections(&self) -> usize {
        self.max_connections - self.connections.available_permits()
    }

    /// Stops accepting and finishes requests under way, within a few seconds.
    pub async fn stop(self) {
        tracing::debug!(addr = %self.addr, open = self.open_connections(), "stopping the listener");
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Binds `addr` (the setting `setting`, for messages) and serves `app` in
/// the background under `limits`.
pub async fn serve(setting: &str, addr: SocketAddr, app: Router, limits: HttpLimits) -> io::Result<Server> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {setting}={addr}: {e}")))?;
    let addr = listener.local_addr()?;
    let app = app.layer(middleware::from_fn_with_state(limits.request_timeout, deadline));
    let (stop, mut stopped) = oneshot::channel::<()>();
    let setting = setting.to_owned();
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let task = tokio::spawn({
        let connections = connections.clone();
        async move {
            let graceful = GracefulShutdown::new();
            // One listener, nothing to spread out: no jitter.
            let pauses = retry_core::backoff::BackoffConfig::new(Duration::from_millis(10), Duration::from_secs(1))
                .and_then(|c| c.with_jitter(0.0))
                .expect("valid pauses");
            let mut pauses = pauses.pauses(|| 0.0);
            loop {
                let (stream, peer) = tokio::select! {
                    _ = &mut stopped => break,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => {
                            pauses.reset();
                            accepted
                        }
                        Err(e) => {
                            // Out of file descriptors, most likely: let some close.
                            tracing::warn!(listener = %setting, error = %e, "cannot accept a connection");
                            tokio::time::sleep(pauses.next().expect("the pauses never end")).await;
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
        }
    });
    Ok(Server { addr, stop, task, connections, max_connections: limits.max_connections })
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use axum::routing::get;
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpStream,
    };

    use super::*;

    /// Reads until the server closes the connection (or 5 s pass): what it sent.
    async fn until_closed(stream: &mut TcpStream) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        let read = async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), read).await.ok().map(|()| out)
    }

    /// Slow clients that never finish their headers hold a connection each
    /// for the header deadline at most, connections beyond the cap are
    /// closed on arrival, and the listener serves again once they are gone.
    #[tokio::test]
    async fn slow_clients_are_capped_and_cut_off() {
        let limits = HttpLimits {
            header_read_timeout: Duration::from_millis(500),
            request_timeout: Duration::from_secs(5),
            max_connections: 8,
        };
        let app = Router::new().route("/", get(|| async { "ok" }));
        let server = serve("TEST_LISTEN", "127.0.0.1:0".parse().unwrap(), app, limits).await.unwrap();
        let addr = server.addr();

        let mut slow = Vec::new();
        for _ in 0..limits.max_connections {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(b"GET / HTTP/1.1\r\nHost: slow\r\n").await.unwrap();
            slow.push(stream);
        }
        // The server accepted them all before the next one arrives.
        while server.open_connections() < limits.max_connections {
            tokio::task::yield_now().await;
        }
        let started = Instant::now();
        let mut extra = TcpStream::connect(addr).await.unwrap();
        let _ = extra.write_all(b"GET / HTTP/1.1\r\nHost: extra\r\n\r\n").await;
        let answer = until_closed(&mut extra).await.expect("the extra connection is closed");
        assert!(answer.is_empty(), "the extra connection was served: {}", String::from_utf8_lossy(&answer));
        assert!(started.elapsed() < limits.header_read_timeout, "closed on arrival, not after the deadline");

        for stream in &mut slow {
            let answer = until_closed(stream).await.expect("a slow client is cut off after the header deadline");
            let answer = String::from_utf8_lossy(&answer);
            assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
        }
        // Their slots are free again.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\nHost: fine\r\nConnection: close\r\n\r\n").await.unwrap();
        let answer = until_closed(&mut stream).await.expect("answered");
        assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
        server.stop().await;
    }

    /// A request that takes longer than the request deadline is answered 503.
    #[tokio::test]
    async fn slow_requests_end_at_the_deadline() {
        let limits = HttpLimits {
            header_read_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_millis(300),
            max_connections: 8,
        };
        let app = Router::new()
            .route("/", axum::routing::post(|body: bytes::Bytes| async move { format!("{} bytes", body.len()) }));
        let server = serve("TEST_LISTEN", "127.0.0.1:0".parse().unwrap(), app, limits).await.unwrap();
        let mut stream = TcpStream::connect(server.addr()).await.unwrap();
        // Headers promise a body that never comes.
        stream.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc").await.unwrap();
        let answer = until_closed(&mut stream).await.expect("answered");
        assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 503"), "{}", String::from_utf8_lossy(&answer));
        server.stop().await;
    }
}
