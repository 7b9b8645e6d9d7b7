//! The routes: the metrics at `--web.telemetry-path`, a landing page at `/`, `/-/healthy`,
//! `/-/ready`, `POST /-/reload`, and JSON routes other modules register (e.g. recent slow
//! calls). Only GET and HEAD are served otherwise; everything else gets a clear status.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    body::Incoming,
    header::{self, HeaderValue},
    Method, Request, Response, StatusCode,
};
use tokio::sync::Semaphore;

use crate::exposition::{format::Format, scrape::Scraper};

/// A route that returns a body computed on each request (e.g. JSON state).
pub type Handler = Arc<dyn Fn() -> (&'static str, Bytes) + Send + Sync>;

pub struct AppState {
    pub scraper: Arc<Scraper>,
    pub telemetry_path: String,
    pub ready: AtomicBool,
    pub routes: BTreeMap<String, Handler>,
    /// `POST /-/reload`: reloads the configuration; `Ok` with what changed, `Err` with why
    /// nothing did.
    pub reload: Option<ReloadHandler>,
}

/// What `POST /-/reload` runs.
pub type ReloadHandler = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

fn landing_page(state: &AppState) -> String {
    let extra: String = (state.routes.keys())
        .map(|path| format!("<li><a href=\"{path}\">{path}</a></li>"))
        .collect();
    format!(
        "<!DOCTYPE html><html><head><title>sysscope</title></head><body>\
         <h1>sysscope {}</h1><p>Always-on eBPF syscall, block-I/O, CPU and GPU metrics.</p>\
         <ul><li><a href=\"{}\">Metrics</a></li><li><a href=\"/-/healthy\">Health</a></li>\
         <li><a href=\"/-/ready\">Readiness</a></li>{}</ul></body></html>\n",
        crate::build_info::VERSION,
        state.telemetry_path,
        extra
    )
}

/// Renders of registered routes running at once (see [`handle`]).
static ROUTE_RENDERS: Semaphore = Semaphore::const_new(1);

/// A route whose body is rendered at most once per `ttl`; requests in between get the same
/// body. JSON state pages are read by people and dashboards, a second old is fresh enough.
pub fn cached(handler: Handler, ttl: Duration) -> Handler {
    let last: Mutex<Option<(Instant, &'static str, Bytes)>> = Mutex::new(None);
    Arc::new(move || {
        let mut last = last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, content_type, body)) = &*last {
            if at.elapsed() < ttl {
                return (content_type, body.clone());
            }
        }
        let (content_type, body) = handler();
        *last = Some((Instant::now(), content_type, body.clone()));
        (content_type, body)
    })
}

/// `/-/healthy`: 503 once a panic poisoned the agent's state, since every scrape would fail
/// from then on and only a restart (the liveness probe's job) brings metrics back.
fn health(state: &AppState) -> Response<Full<Bytes>> {
    if state.scraper.is_poisoned() {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            "Unhealthy: the agent's state was poisoned by a panic; restart the process\n",
        )
    } else {
        text(StatusCode::OK, "Healthy\n")
    }
}

/// 405 naming the methods `allow`ed.
fn not_allowed(allow: &'static str, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = text(StatusCode::METHOD_NOT_ALLOWED, body);
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

/// `/-/reload`: POST reloads the configuration file (behind the same TLS and basic auth as
/// every route); any other method is refused.
async fn reload(state: &AppState, method: &Method) -> Response<Full<Bytes>> {
    let Some(handler) = state.reload.clone() else {
        return text(StatusCode::NOT_FOUND, "not found\n");
    };
    if method != Method::POST {
        return not_allowed("POST", "only POST reloads the configuration\n");
    }
    match tokio::task::spawn_blocking(move || handler()).await {
        Ok(Ok(changed)) => text(StatusCode::OK, format!("{changed}\n")),
        Ok(Err(why)) => text(StatusCode::BAD_REQUEST, format!("{why}\n")),
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "reload failed\n"),
    }
}

/// Serves one request.
pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let head = req.method() == Method::HEAD;
    if req.uri().path() == "/-/reload" {
        return reload(&state, req.method()).await;
    }
    if req.method() != Method::GET && !head {
        return not_allowed("GET, HEAD", "only GET and HEAD are supported\n");
    }
    let mut resp = match req.uri().path() {
        path if path == state.telemetry_path => {
            let accept = req.headers().get(header::ACCEPT);
            let format = Format::negotiate(accept.and_then(|v| v.to_str().ok()));
            let scraper = state.scraper.clone();
            match tokio::task::spawn_blocking(move || scraper.scrape(format)).await {
                Ok(body) => response(StatusCode::OK, format.content_type(), body),
                Err(e) => {
                    tracing::error!(error = %e, "scrape failed");
                    text(StatusCode::INTERNAL_SERVER_ERROR, "scrape failed\n")
                }
            }
        }
        "/" => response(
            StatusCode::OK,
            "text/html; charset=utf-8",
            landing_page(&state),
        ),
        "/-/healthy" => health(&state),
        "/-/ready" if state.ready.load(Ordering::Relaxed) => text(StatusCode::OK, "Ready\n"),
        "/-/ready" => text(StatusCode::SERVICE_UNAVAILABLE, "Not ready\n"),
        path => match state.routes.get(path).cloned() {
            Some(handler) => {
                // One render at a time, waiting here rather than on a blocking thread: a burst
                // of these requests must not take the blocking threads `/metrics` scrapes run
                // on.
                let _turn = ROUTE_RENDERS.acquire().await;
                match tokio::task::spawn_blocking(move || handler()).await {
                    Ok((content_type, body)) => response(StatusCode::OK, content_type, body),
                    Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "handler failed\n"),
                }
            }
            None => text(StatusCode::NOT_FOUND, "not found\n"),
        },
    };
    if head {
        *resp.body_mut() = Full::new(Bytes::new());
    }
    resp
}

/// A response of `status` with `body` as `content_type`.
pub(super) fn response(
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

/// A plain-text response of `status`.
pub(super) fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    response(status, "text/plain; charset=utf-8", body)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[test]
    fn a_poisoned_agent_is_unhealthy() {
        let agent = Arc::new(Mutex::new(crate::agent::Agent::new(None)));
        let state = AppState {
            scraper: Arc::new(Scraper::new(agent.clone(), Duration::ZERO)),
            telemetry_path: "/metrics".into(),
            ready: true.into(),
            routes: BTreeMap::new(),
            reload: None,
        };
        assert_eq!(health(&state).status(), StatusCode::OK);
        let poisoner = agent.clone();
        let _ = std::thread::spawn(move || {
            let _held = poisoner.lock().unwrap();
            panic!("poison the agent lock (expected in this test)");
        })
        .join();
        assert_eq!(health(&state).status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn cached_routes_render_once_per_ttl() {
        let renders = Arc::new(AtomicUsize::new(0));
        let counter = renders.clone();
        let route = cached(
            Arc::new(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                ("application/json", Bytes::from(n.to_string()))
            }),
            Duration::from_secs(3600),
        );
        assert_eq!(route().1, route().1);
        assert_eq!(renders.load(Ordering::SeqCst), 1);
        let uncached = cached(
            Arc::new({
                let renders = renders.clone();
                move || {
                    renders.fetch_add(1, Ordering::SeqCst);
                    ("text/plain", Bytes::new())
                }
            }),
            Duration::ZERO,
        );
        uncached();
        uncached();
        assert_eq!(renders.load(Ordering::SeqCst), 3);
    }
}
