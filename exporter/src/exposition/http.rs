//! The HTTP endpoint (hyper on tokio): the metrics at `--web.telemetry-path`, a landing page
//! at `/`, `/-/healthy`, `/-/ready`, and JSON routes other modules register (e.g. recent slow
//! calls). Only GET and HEAD are served; everything else gets a clear status.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    body::Incoming,
    header::{self, HeaderValue},
    Method, Request, Response, StatusCode,
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::{conn::auto, graceful::GracefulShutdown},
};
use tokio::net::TcpListener;

use super::{format::Format, scrape::Scraper};

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(
        "cannot listen on {address}: {source} (is another sysscope or exporter already using \
         this port? choose another with --web.listen-address)"
    )]
    Bind {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "invalid --web.listen-address `{0}`: expected host:port, e.g. 127.0.0.1:9812 or [::]:9812"
    )]
    Address(String),
}

/// A route that returns a body computed on each request (e.g. JSON state).
pub type Handler = Arc<dyn Fn() -> (&'static str, Bytes) + Send + Sync>;

pub struct AppState {
    pub scraper: Arc<Scraper>,
    pub telemetry_path: String,
    pub ready: AtomicBool,
    pub routes: BTreeMap<String, Handler>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("telemetry_path", &self.telemetry_path)
            .finish_non_exhaustive()
    }
}

/// Resolves `--web.listen-address` and binds it.
pub async fn bind(address: &str) -> Result<TcpListener, HttpError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(address)
        .await
        .map_err(|_| HttpError::Address(address.to_string()))?
        .collect();
    let first = *addrs
        .first()
        .ok_or_else(|| HttpError::Address(address.to_string()))?;
    TcpListener::bind(first)
        .await
        .map_err(|source| HttpError::Bind {
            address: address.to_string(),
            source,
        })
}

fn response(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn landing_page(state: &AppState) -> String {
    let mut extra = String::new();
    for path in state.routes.keys() {
        extra.push_str(&format!("<li><a href=\"{path}\">{path}</a></li>"));
    }
    format!(
        "<!DOCTYPE html><html><head><title>sysscope</title></head><body>\
         <h1>sysscope {}</h1><p>Always-on eBPF syscall, block-I/O, CPU and GPU metrics.</p>\
         <ul><li><a href=\"{}\">Metrics</a></li><li><a href=\"/-/healthy\">Health</a></li>\
         <li><a href=\"/-/ready\">Readiness</a></li>{}</ul></body></html>\n",
        crate::agent::VERSION,
        state.telemetry_path,
        extra
    )
}

/// Serves one request.
pub async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let head = req.method() == Method::HEAD;
    if req.method() != Method::GET && !head {
        let mut r = response(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET and HEAD are supported\n",
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    let path = req.uri().path();
    let mut resp = if path == state.telemetry_path {
        let accept = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let format = Format::negotiate(accept.as_deref());
        let scraper = state.scraper.clone();
        match tokio::task::spawn_blocking(move || scraper.scrape(format)).await {
            Ok(body) => response(StatusCode::OK, format.content_type(), body),
            Err(e) => {
                tracing::error!(error = %e, "scrape failed");
                response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain; charset=utf-8",
                    "scrape failed\n",
                )
            }
        }
    } else if path == "/" {
        response(
            StatusCode::OK,
            "text/html; charset=utf-8",
            landing_page(&state),
        )
    } else if path == "/-/healthy" {
        response(StatusCode::OK, "text/plain; charset=utf-8", "Healthy\n")
    } else if path == "/-/ready" {
        if state.ready.load(Ordering::Relaxed) {
            response(StatusCode::OK, "text/plain; charset=utf-8", "Ready\n")
        } else {
            response(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain; charset=utf-8",
                "Not ready\n",
            )
        }
    } else if let Some(handler) = state.routes.get(path) {
        let handler = handler.clone();
        match tokio::task::spawn_blocking(move || handler()).await {
            Ok((content_type, body)) => response(StatusCode::OK, content_type, body),
            Err(_) => response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain; charset=utf-8",
                "handler failed\n",
            ),
        }
    } else {
        response(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found\n",
        )
    };
    if head {
        *resp.body_mut() = Full::new(Bytes::new());
    }
    Ok(resp)
}

/// Accepts connections until `shutdown` resolves, then lets in-flight requests finish (for at
/// most `grace`).
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
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
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _peer) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let state = state.clone();
                let service = hyper::service::service_fn(move |req| handle(state.clone(), req));
                let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {:?}; closing them", grace);
    }
}
