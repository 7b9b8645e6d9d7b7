//! The accept loop: each connection admitted ([`super::admission`]), TLS when the web config
//! file configures it (a plain-HTTP request to the TLS port gets a readable 400, as Go's
//! servers answer), HTTP/1 or HTTP/2 by hyper, every request through the auth gate, and a
//! graceful shutdown.

use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::{conn::auto, graceful::GracefulShutdown},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

use super::{
    admission::{idle_deadline, Connections, InFlight, IDLE_TIMEOUT},
    auth_gate::{handle_secured, Security},
    routes::AppState,
};
use crate::exposition::web_config::WebConfigFile;

/// Time a client has to complete the TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the client opened with a TLS handshake record (content type 22), peeking only.
async fn starts_with_tls_handshake(stream: &TcpStream) -> bool {
    let mut first = [0u8; 1];
    matches!(
        tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await,
        Ok(Ok(1)) if first[0] == 0x16
    )
}

/// Answers a plain-HTTP request on the TLS port with a readable 400. The request head is read
/// first and the client's remaining bytes drained after (each for at most a second): closing
/// with unread input would reset the connection and lose the answer.
async fn refuse_plain_http(mut stream: TcpStream) {
    const ANSWER: &[u8] =
        b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
        Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";
    let mut buf = [0u8; 4096];
    let mut head = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Ok(n @ 1..) = stream.read(&mut buf).await {
            head.extend_from_slice(&buf[..n]);
            if head.len() > 16 * 1024 || head.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    let _ = stream.write_all(ANSWER).await;
    let _ = stream.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Ok(1..) = stream.read(&mut buf).await {}
    })
    .await;
}

/// Accepts connections until `shutdown` resolves and serves them, with the TLS, basic auth and
/// headers of a `--web.config.file` when one is given; then lets in-flight requests finish (for
/// at most `grace`).
pub async fn serve_with(
    listener: TcpListener,
    state: Arc<AppState>,
    web: Option<Arc<WebConfigFile>>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .max_buf_size(64 * 1024)
        .header_read_timeout(Duration::from_secs(10))
        .timer(hyper_util::rt::TokioTimer::new());
    if web.as_ref().is_some_and(|w| !w.http2()) {
        builder = builder.http1_only();
    }
    let builder = Arc::new(builder);
    // Follows the web config file while the endpoint serves.
    if let Some(file) = &web {
        if let Err(e) = file.follow() {
            tracing::error!(error = %e, "cannot follow the web config file: changes need a restart");
        }
    }
    let security = Arc::new(Security::new(web));
    let connections = Arc::new(Mutex::new(Connections::default()));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let admitted = connections
            .lock()
            .expect("connection table lock")
            .admit(peer.ip());
        let Some((id, activity, evict)) = admitted else {
            tracing::debug!(%peer, "too many busy connections; closing this one");
            continue;
        };
        let (state, security, builder) = (state.clone(), security.clone(), builder.clone());
        // The file's TLS settings as they are now (they may have been changed).
        let tls = security.web.as_ref().and_then(|w| w.tls());
        let watcher = graceful.watcher();
        let table = connections.clone();
        tokio::spawn(async move {
            let serving = activity.clone();
            let service = hyper::service::service_fn(move |req| {
                let in_flight = InFlight::start(serving.clone());
                let (state, security) = (state.clone(), security.clone());
                async move {
                    let resp = handle_secured(state, &security, peer.ip(), &in_flight.0, req).await;
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            let serve = async move {
                let result = match tls {
                    None => {
                        let conn = builder.serve_connection(TokioIo::new(stream), service);
                        watcher.watch(conn.into_owned()).await
                    }
                    Some(tls) => {
                        if !starts_with_tls_handshake(&stream).await {
                            return refuse_plain_http(stream).await;
                        }
                        let accept = tokio_rustls::TlsAcceptor::from(tls).accept(stream);
                        let stream = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, accept).await
                        {
                            Ok(Ok(stream)) => stream,
                            Ok(Err(e)) => {
                                return tracing::debug!(%peer, error = %e, "TLS handshake failed")
                            }
                            Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
                        };
                        let conn = builder.serve_connection(TokioIo::new(stream), service);
                        watcher.watch(conn.into_owned()).await
                    }
                };
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            };
            tokio::select! {
                _ = serve => {}
                _ = evict.notified() => {}
                _ = idle_deadline(&activity) => {
                    tracing::debug!(%peer, "no request within {:?}; closing", IDLE_TIMEOUT);
                }
            }
            table.lock().expect("connection table lock").close(id);
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {:?}; closing them", grace);
    }
}
