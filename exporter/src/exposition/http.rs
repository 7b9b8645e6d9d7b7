//! The HTTP endpoint (hyper on tokio): the metrics at `--web.telemetry-path`, a landing page
//! at `/`, `/-/healthy`, `/-/ready`, and JSON routes other modules register (e.g. recent slow
//! calls). Only GET and HEAD are served; everything else gets a clear status.
//!
//! With `--web.config.file` ([`super::web_config`]) connections are TLS (a plain-HTTP request
//! to the TLS port gets a readable 400, as Go's servers answer), every request needs basic
//! auth when users are configured (401 otherwise), and the configured headers are added. The
//! file is followed as it changes ([`WebConfigFile`]): each request is checked against it as
//! it is now, and answered 500 while a change left it invalid.
//! Concurrent connections are capped ([`MAX_CONNECTIONS`]) so a flood of clients cannot take
//! the file descriptors the collectors need to read /proc and the cgroup tree.
//!
//! No client can hold a connection without using it: every phase has a deadline (the TLS
//! handshake, the first request, which covers HTTP/1-vs-2 detection and request headers, and
//! [`IDLE_TIMEOUT`] between requests, HTTP/2 included). And when the cap is reached, a new
//! client is not turned away while a connection sits idle: the idle connection of the peer
//! holding the most connections is closed to make room, so silent or half-open connections
//! from one peer can never lock out Prometheus or the liveness probe. A connection whose
//! requests only wait for their password checks counts as idle for this: peers can send bad
//! passwords far faster than bcrypt answers them.

use std::{
    collections::{BTreeMap, HashMap},
    convert::Infallible,
    future::Future,
    net::{IpAddr, SocketAddr},
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
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
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::{conn::auto, graceful::GracefulShutdown},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::{Notify, Semaphore},
};

use super::{
    format::Format,
    scrape::Scraper,
    web_config::{AuthPrecheck, WebConfig, WebConfigFile},
};

/// Connections served at once; more are closed as soon as they are accepted.
pub const MAX_CONNECTIONS: usize = 512;
/// Time a client has to complete the TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a connection may go without a request in progress: from the accept to the first
/// request's headers (protocol detection included), and between requests (HTTP/1 keep-alive
/// and HTTP/2 alike).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// bcrypt checks running at once: each costs tens of milliseconds of CPU by design, so
/// guessing passwords must not take more than this many cores.
const MAX_CONCURRENT_PASSWORD_CHECKS: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(
        "cannot listen on {address} (is another sysscope or exporter already using this port? \
         choose another with --web.listen-address)"
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
    /// `POST /-/reload`: reloads the configuration; `Ok` with what changed, `Err` with why
    /// nothing did.
    pub reload: Option<ReloadHandler>,
}

/// What `POST /-/reload` runs.
pub type ReloadHandler = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

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
        response(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain; charset=utf-8",
            "Unhealthy: the agent's state was poisoned by a panic; restart the process\n",
        )
    } else {
        response(StatusCode::OK, "text/plain; charset=utf-8", "Healthy\n")
    }
}

/// `/-/reload`: POST reloads the configuration file (behind the same TLS and basic auth as
/// every route); any other method is refused.
async fn reload(state: &AppState, method: &Method) -> Response<Full<Bytes>> {
    let Some(handler) = state.reload.clone() else {
        return response(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found\n",
        );
    };
    if method != Method::POST {
        let mut r = response(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only POST reloads the configuration\n",
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    match tokio::task::spawn_blocking(move || handler()).await {
        Ok(Ok(changed)) => response(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            format!("{changed}\n"),
        ),
        Ok(Err(why)) => response(
            StatusCode::BAD_REQUEST,
            "text/plain; charset=utf-8",
            format!("{why}\n"),
        ),
        Err(_) => response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            "reload failed\n",
        ),
    }
}

/// Serves one request.
pub async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let head = req.method() == Method::HEAD;
    if req.uri().path() == "/-/reload" {
        return Ok(reload(&state, req.method()).await);
    }
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
        health(&state)
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
        // One render at a time, waiting here rather than on a blocking thread: a burst of
        // these requests must not take the blocking threads `/metrics` scrapes run on.
        let _turn = ROUTE_RENDERS.acquire().await;
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

/// Requests of one connection: whether one is in progress, and when the last one ended.
#[derive(Debug)]
struct Activity {
    in_flight: AtomicUsize,
    /// Of those, the requests waiting for their password check to start.
    queued: AtomicUsize,
    /// Milliseconds since the connection table's epoch at the last request start or end.
    last_ms: AtomicU64,
}

impl Activity {
    fn new(epoch: Instant) -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            last_ms: AtomicU64::new(epoch.elapsed().as_millis() as u64),
        }
    }

    fn since_last(&self, epoch: Instant) -> Duration {
        let now = epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Acquire)))
    }

    /// How long no request has been in progress; `None` while one is.
    fn idle_for(&self, epoch: Instant) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.since_last(epoch))
    }

    /// Whether closing the connection costs no work in progress: it is idle, or every request
    /// on it still waits for its peer's earlier password checks (a client can send those
    /// faster than bcrypt answers them, and must not fill the cap with them). For how long.
    fn evictable_for(&self, epoch: Instant) -> Option<Duration> {
        // Requests in progress first: one that stops waiting between the two loads (its
        // `queued` drops, its `in_flight` stays) is then seen busy, never idle.
        let in_flight = self.in_flight.load(Ordering::SeqCst);
        if in_flight > self.queued.load(Ordering::SeqCst) {
            return None;
        }
        Some(self.since_last(epoch))
    }
}

/// Marks a request as waiting for its password check (its turn in its peer's lane, then a
/// check slot) for as long as it lives.
struct Queued<'a>(&'a Activity);

impl<'a> Queued<'a> {
    fn start(activity: &'a Activity) -> Self {
        activity.queued.fetch_add(1, Ordering::SeqCst);
        Self(activity)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Marks a request in progress on its connection for as long as it lives.
struct InFlight {
    activity: Arc<Activity>,
    epoch: Instant,
}

impl InFlight {
    fn start(activity: Arc<Activity>, epoch: Instant) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity
            .last_ms
            .store(epoch.elapsed().as_millis() as u64, Ordering::Release);
        Self { activity, epoch }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.activity
            .last_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Release);
        self.activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Connection {
    peer: IpAddr,
    activity: Arc<Activity>,
    evict: Arc<Notify>,
}

/// The open connections, to pick one to close when the cap is reached.
struct Connections {
    epoch: Instant,
    next_id: u64,
    open: HashMap<u64, Connection>,
}

impl Connections {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            next_id: 0,
            open: HashMap::new(),
        }
    }

    /// Registers a new connection from `peer`. At the cap, a connection that is idle or only
    /// waits for password checks is evicted first: one of the peer (an IPv6 /64 counts as
    /// one, [`peer_group`]) with the most connections, the longest idle (or waiting) of those;
    /// `None` when every connection is busy. (The youngest go last: a connection in its TLS
    /// handshake, or whose first request just came, is as idle or waiting as any.)
    fn admit(&mut self, peer: IpAddr) -> Option<(u64, Arc<Activity>, Arc<Notify>)> {
        if self.open.len() >= MAX_CONNECTIONS {
            let mut per_peer: HashMap<IpAddr, usize> = HashMap::new();
            for c in self.open.values() {
                *per_peer.entry(peer_group(c.peer)).or_default() += 1;
            }
            let victim = self
                .open
                .iter()
                .filter_map(|(id, c)| {
                    let idle = c.activity.evictable_for(self.epoch)?;
                    Some((per_peer[&peer_group(c.peer)], idle, *id))
                })
                .max()
                .map(|(_, _, id)| id)?;
            if let Some(c) = self.open.remove(&victim) {
                tracing::debug!(peer = %c.peer, "connection cap reached; closing an idle or waiting connection");
                c.evict.notify_one();
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        let activity = Arc::new(Activity::new(self.epoch));
        let evict = Arc::new(Notify::new());
        self.open.insert(
            id,
            Connection {
                peer,
                activity: activity.clone(),
                evict: evict.clone(),
            },
        );
        Some((id, activity, evict))
    }
}

/// Resolves once the connection has had no request in progress for [`IDLE_TIMEOUT`].
async fn idle_deadline(activity: &Activity, epoch: Instant) {
    loop {
        let wait = match activity.idle_for(epoch) {
            Some(idle) if idle >= IDLE_TIMEOUT => return,
            Some(idle) => IDLE_TIMEOUT - idle,
            None => IDLE_TIMEOUT,
        };
        tokio::time::sleep(wait.max(Duration::from_millis(100))).await;
    }
}

/// What `--web.config.file` asks of every request, shared by the connections.
struct Security {
    web: Option<Arc<WebConfigFile>>,
    password_checks: PasswordChecks,
}

impl Security {
    /// Checks a request's credentials against `file` as it is in force: the config checked
    /// against and whether they are allowed; `None` while the file is invalid. A password
    /// check can wait for its turn; if the file changed meanwhile (a rotated password), the
    /// request is checked again against what is in force now.
    async fn authorize(
        &self,
        file: &WebConfigFile,
        peer: IpAddr,
        header: Option<&[u8]>,
        activity: &Activity,
    ) -> Option<(Arc<WebConfig>, bool)> {
        for _ in 0..3 {
            let web = file.current().ok()?;
            let allowed = match &web.basic_auth {
                None => true,
                Some(auth) => {
                    self.password_checks
                        .allowed(peer, auth, header, activity)
                        .await
                }
            };
            if Arc::ptr_eq(&file.current().ok()?, &web) {
                return Some((web, allowed));
            }
        }
        // Changed at every check: refuse rather than check forever.
        Some((file.current().ok()?, false))
    }
}

/// Who runs bcrypt, and when. Checks are capped at [`MAX_CONCURRENT_PASSWORD_CHECKS`] and
/// each peer (an IPv6 /64 counts as one, [`peer_group`]) gets one lane: its requests are
/// checked one after another, so however many guesses one peer sends, they hold one slot at
/// most and a login from another address waits for at most one check in progress. Verified
/// credentials are looked up before the lane and again after it: the same peer's login checked
/// meanwhile is not checked again.
///
/// The lane and the slot are held by the check itself, not by the request: a request whose
/// client hangs up (or whose connection is evicted) mid-check frees neither before bcrypt is
/// done, so hanging up cannot start more checks than the caps allow.
struct PasswordChecks {
    slots: Arc<Semaphore>,
    lanes: Mutex<Lanes>,
}

/// The peers' lanes, held weakly: a lane lives as long as a request holds it, and dead entries
/// are swept once the table has doubled since the last sweep, so a request dropped at any
/// point leaves nothing behind for long: the table holds at most twice the lanes alive at the
/// last sweep, or [`LANES_SWEEP_MIN`].
struct Lanes {
    by_peer: HashMap<IpAddr, std::sync::Weak<tokio::sync::Mutex<()>>>,
    sweep_at: usize,
}

/// The fewest entries of [`Lanes`] before a sweep.
const LANES_SWEEP_MIN: usize = 64;

impl PasswordChecks {
    fn new() -> Self {
        Self {
            slots: Arc::new(Semaphore::new(MAX_CONCURRENT_PASSWORD_CHECKS)),
            lanes: Mutex::new(Lanes {
                by_peer: HashMap::new(),
                sweep_at: LANES_SWEEP_MIN,
            }),
        }
    }

    /// The lane of `peer`'s group, made if no request holds it.
    fn lane(&self, peer: IpAddr) -> Arc<tokio::sync::Mutex<()>> {
        let mut lanes = self
            .lanes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let group = peer_group(peer);
        if let Some(lane) = lanes.by_peer.get(&group).and_then(std::sync::Weak::upgrade) {
            return lane;
        }
        if lanes.by_peer.len() >= lanes.sweep_at {
            lanes.by_peer.retain(|_, lane| lane.strong_count() > 0);
            lanes.sweep_at = (lanes.by_peer.len() * 2).max(LANES_SWEEP_MIN);
        }
        let lane = Arc::new(tokio::sync::Mutex::new(()));
        lanes.by_peer.insert(group, Arc::downgrade(&lane));
        lane
    }

    async fn allowed(
        &self,
        peer: IpAddr,
        auth: &Arc<super::web_config::BasicAuth>,
        header: Option<&[u8]>,
        activity: &Activity,
    ) -> bool {
        // A credential verified before, or none at all, is answered at once: it never waits
        // in a lane behind guesses from its own address (a shared NAT, say).
        match auth.precheck(header) {
            AuthPrecheck::Allowed => return true,
            AuthPrecheck::Denied => return false,
            AuthPrecheck::Verify { .. } => {}
        }
        let lane = self.lane(peer);
        // Counted as waiting only while it does wait: an uncontended turn never makes its
        // connection look evictable.
        let turn = match lane.clone().try_lock_owned() {
            Ok(turn) => turn,
            Err(_) => {
                let _queued = Queued::start(activity);
                lane.lock_owned().await
            }
        };
        match auth.precheck(header) {
            AuthPrecheck::Allowed => true,
            AuthPrecheck::Denied => false,
            AuthPrecheck::Verify { user, password } => {
                let slot = match self.slots.clone().try_acquire_owned() {
                    Ok(slot) => Ok(slot),
                    Err(_) => {
                        // Waiting for a check slot (other peers' checks) is waiting too.
                        let _queued = Queued::start(activity);
                        self.slots.clone().acquire_owned().await
                    }
                };
                let Ok(slot) = slot else {
                    return false;
                };
                let auth = auth.clone();
                tokio::task::spawn_blocking(move || {
                    let _held = (turn, slot);
                    auth.verify(&user, &password)
                })
                .await
                .unwrap_or(false)
            }
        }
    }
}

/// Whom a peer address counts as, for its password lane and its share of the connections: the
/// address itself for IPv4, its /64 for IPv6 (one host or one subnet typically holds a whole
/// /64, so its addresses are not many peers).
fn peer_group(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(std::net::Ipv6Addr::from(prefix))
        }
        v4 => v4,
    }
}

/// The answer to every request while the web config file is invalid.
fn web_config_invalid() -> Response<Full<Bytes>> {
    response(
        StatusCode::INTERNAL_SERVER_ERROR,
        "text/plain; charset=utf-8",
        "The web config file is invalid; see the exporter's log.\n",
    )
}

fn unauthorized() -> Response<Full<Bytes>> {
    let mut r = response(
        StatusCode::UNAUTHORIZED,
        "text/plain; charset=utf-8",
        "Unauthorized\n",
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"sysscope\""),
    );
    r
}

/// Serves one request after basic auth, adding the configured headers.
async fn handle_secured(
    state: Arc<AppState>,
    security: Arc<Security>,
    peer: IpAddr,
    activity: Arc<Activity>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let Some(file) = &security.web else {
        return handle(state, req).await;
    };
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let Some((web, allowed)) = security.authorize(file, peer, header, &activity).await else {
        // Logged when the file changed; refused until it is fixed.
        return Ok(web_config_invalid());
    };
    let mut resp = if allowed {
        handle(state, req).await?
    } else {
        unauthorized()
    };
    for (name, value) in &web.headers {
        resp.headers_mut().insert(name.clone(), value.clone());
    }
    Ok(resp)
}

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
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
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
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// Accepts connections until `shutdown` resolves, then lets in-flight requests finish (for at
/// most `grace`).
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    serve_with(listener, state, None, shutdown, grace).await
}

/// [`serve`] with the TLS, basic auth and headers of a `--web.config.file`.
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
    let security = Arc::new(Security {
        web,
        password_checks: PasswordChecks::new(),
    });
    let connections = Arc::new(Mutex::new(Connections::new()));
    let epoch = connections.lock().expect("connection table lock").epoch;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let admitted = connections
                    .lock()
                    .expect("connection table lock")
                    .admit(peer.ip());
                let Some((id, activity, evict)) = admitted else {
                    tracing::debug!(%peer, "too many busy connections; closing this one");
                    drop(stream);
                    continue;
                };
                let state = state.clone();
                let security = security.clone();
                let builder = builder.clone();
                // The file's TLS settings as they are now (they may have been changed).
                let tls = security
                    .web
                    .as_ref()
                    .and_then(|w| w.tls())
                    .map(tokio_rustls::TlsAcceptor::from);
                let watcher = graceful.watcher();
                let table = connections.clone();
                tokio::spawn(async move {
                    let serve_activity = activity.clone();
                    let service = hyper::service::service_fn(move |req| {
                        let in_flight = InFlight::start(serve_activity.clone(), epoch);
                        let (state, security) = (state.clone(), security.clone());
                        let activity = serve_activity.clone();
                        async move {
                            let resp =
                                handle_secured(state, security, peer.ip(), activity, req).await;
                            drop(in_flight);
                            resp
                        }
                    });
                    let serve = async move {
                    let result = match tls {
                        None => {
                            let conn = builder.serve_connection(TokioIo::new(stream), service);
                            watcher.watch(conn.into_owned()).await
                        }
                        Some(acceptor) => {
                            if !starts_with_tls_handshake(&stream).await {
                                refuse_plain_http(stream).await;
                                return;
                            }
                            let tls_stream = match tokio::time::timeout(
                                TLS_HANDSHAKE_TIMEOUT,
                                acceptor.accept(stream),
                            )
                            .await
                            {
                                Ok(Ok(s)) => s,
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => {
                                    tracing::debug!(%peer, "TLS handshake timed out");
                                    return;
                                }
                            };
                            let conn = builder.serve_connection(TokioIo::new(tls_stream), service);
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
                        _ = idle_deadline(&activity, epoch) => {
                            tracing::debug!(%peer, "no request within {:?}; closing", IDLE_TIMEOUT);
                        }
                    }
                    table.lock().expect("connection table lock").open.remove(&id);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_requests_waiting_for_password_checks_make_room_and_work_in_progress_does_not() {
        let mut table = Connections::new();
        let (flooder, scraper): (IpAddr, IpAddr) =
            ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        // Every connection has a request in progress: one being served, the rest waiting in
        // the flooder's password lane.
        let mut flood = Vec::new();
        for i in 0..MAX_CONNECTIONS {
            let (id, activity, evict) = table.admit(flooder).unwrap();
            activity.in_flight.fetch_add(1, Ordering::AcqRel);
            if i > 0 {
                activity.queued.fetch_add(1, Ordering::AcqRel);
            }
            flood.push((id, activity, evict));
        }
        // A newcomer gets in: one of the waiting requests' connections is closed for it.
        let (scraper_id, scraper_activity, _) = table.admit(scraper).expect("admitted");
        assert_eq!(table.open.len(), MAX_CONNECTIONS);
        let evicted: Vec<u64> = flood
            .iter()
            .filter(|(id, _, _)| !table.open.contains_key(id))
            .map(|(id, _, _)| *id)
            .collect();
        assert_eq!(evicted.len(), 1);
        assert_ne!(
            evicted[0], flood[0].0,
            "the request being served was closed"
        );
        // Once nothing waits, nothing busy is closed: the newcomer is refused.
        for (_, activity, _) in &flood {
            activity.queued.store(0, Ordering::Release);
        }
        scraper_activity.in_flight.fetch_add(1, Ordering::AcqRel);
        assert!(table.admit(scraper).is_none());
        assert!(table.open.contains_key(&scraper_id));
    }

    fn two_thread_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// A connection from `peer` admitted to `table`, with `in_flight` requests of which
    /// `queued` wait for password checks, its last request started `ago` before now.
    fn admitted(
        table: &mut Connections,
        peer: &str,
        in_flight: usize,
        queued: usize,
        ago: Duration,
    ) -> u64 {
        let (id, activity, _) = table.admit(peer.parse().unwrap()).expect("admitted");
        activity.in_flight.store(in_flight, Ordering::SeqCst);
        activity.queued.store(queued, Ordering::SeqCst);
        let at = table.epoch.elapsed().saturating_sub(ago);
        activity
            .last_ms
            .store(at.as_millis() as u64, Ordering::SeqCst);
        id
    }

    #[test]
    fn at_the_cap_young_connections_stay_and_an_ipv6_subnet_is_one_peer() {
        let mut table = Connections::new();
        // Backdated, so "30 s ago" lies after the table's epoch.
        table.epoch -= Duration::from_secs(60);
        // One IPv4 peer per connection, all busy but three: a waiter of 30 s, one just
        // admitted (in its TLS handshake: idle for no time), and an idle one of 20 s.
        let mut ids = Vec::new();
        for i in 0..MAX_CONNECTIONS - 2 {
            let peer = format!("198.51.{}.{}", i / 250, i % 250 + 1);
            let (in_flight, queued, ago) = match i {
                0 => (1, 1, Duration::from_secs(30)),
                1 => (0, 0, Duration::ZERO),
                2 => (0, 0, Duration::from_secs(20)),
                _ => (1, 0, Duration::ZERO),
            };
            ids.push(admitted(&mut table, &peer, in_flight, queued, ago));
        }
        // Two idle connections of one /64, from two addresses, idle for 1 s: the subnet holds
        // the most connections, so one of them goes first.
        let v6: Vec<u64> = ["2001:db8:1:2::1", "2001:db8:1:2:ffff::9"]
            .iter()
            .map(|peer| admitted(&mut table, peer, 0, 0, Duration::from_secs(1)))
            .collect();
        admitted(&mut table, "203.0.113.1", 1, 0, Duration::ZERO);
        assert_eq!(
            v6.iter().filter(|id| table.open.contains_key(id)).count(),
            1,
            "the /64's addresses were taken for two peers"
        );
        // Then the longest waiting or idle: the 30 s waiter, the 20 s idle one, the other
        // address of the /64; the young connection last.
        for (n, gone) in [ids[0], ids[2]].into_iter().enumerate() {
            admitted(
                &mut table,
                &format!("203.0.113.{}", n + 2),
                1,
                0,
                Duration::ZERO,
            );
            assert!(
                !table.open.contains_key(&gone),
                "step {n}: the oldest stayed"
            );
            assert!(
                table.open.contains_key(&ids[1]),
                "the young connection went"
            );
        }
        admitted(&mut table, "203.0.113.9", 1, 0, Duration::ZERO);
        assert!(v6.iter().all(|id| !table.open.contains_key(id)));
        assert!(
            table.open.contains_key(&ids[1]),
            "the young connection went"
        );

        assert_eq!(
            peer_group("::ffff:192.0.2.7".parse().unwrap()),
            "192.0.2.7".parse::<IpAddr>().unwrap()
        );
        assert_ne!(
            peer_group("2001:db8:1:2::1".parse().unwrap()),
            peer_group("2001:db8:1:3::1".parse().unwrap())
        );
    }

    #[test]
    fn a_verified_credential_is_answered_without_waiting_behind_its_address_guesses() {
        use base64::Engine as _;
        let hash = bcrypt::hash("right", 4).unwrap();
        let auth = crate::exposition::web_config::WebConfig::parse(
            &format!("basic_auth_users:\n  ops: '{hash}'\n"),
            "web.yml",
            std::path::Path::new("."),
        )
        .unwrap()
        .basic_auth
        .unwrap();
        let header = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("ops:right")
        );
        assert!(auth.check(Some(header.as_bytes())), "verified once");
        two_thread_runtime().block_on(async {
            let checks = PasswordChecks::new();
            let peer: IpAddr = "192.0.2.1".parse().unwrap();
            // A guess from the same address (a shared NAT) holds the address's turn.
            let lane = checks.lane(peer);
            let _guess = lane.lock().await;
            let activity = Activity::new(Instant::now());
            let answered = tokio::time::timeout(
                Duration::from_secs(5),
                checks.allowed(peer, &auth, Some(header.as_bytes()), &activity),
            )
            .await;
            assert_eq!(
                answered,
                Ok(true),
                "a verified credential waited behind its address's guesses"
            );
        });
    }

    #[test]
    fn a_check_whose_request_is_dropped_holds_its_slot_until_bcrypt_is_done_and_leaves_no_lane() {
        let runtime = two_thread_runtime();
        runtime.block_on(async {
            let checks = Arc::new(PasswordChecks::new());
            // Cost 11: a check takes long enough (about a second, unoptimized) to drop the
            // request during it and look, even on a loaded machine.
            let hash = bcrypt::hash("right", 11).unwrap();
            let auth = Arc::new(
                crate::exposition::web_config::WebConfig::parse(
                    &format!("basic_auth_users:\n  ops: '{hash}'\n"),
                    "web.yml",
                    std::path::Path::new("."),
                )
                .unwrap()
                .basic_auth
                .unwrap(),
            );
            use base64::Engine as _;
            let header = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("ops:wrong")
            );
            let peer: IpAddr = "192.0.2.1".parse().unwrap();
            let request = {
                let (checks, auth) = (checks.clone(), auth.clone());
                tokio::spawn(async move {
                    let activity = Activity::new(Instant::now());
                    checks
                        .allowed(peer, &auth, Some(header.as_bytes()), &activity)
                        .await
                })
            };
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while checks.slots.available_permits() == MAX_CONCURRENT_PASSWORD_CHECKS {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the check never started"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // The client hangs up mid-check.
            request.abort();
            assert!(request.await.unwrap_err().is_cancelled());
            assert_eq!(
                checks.slots.available_permits(),
                MAX_CONCURRENT_PASSWORD_CHECKS - 1,
                "the slot was freed while bcrypt still ran"
            );
            assert!(
                checks.lane(peer).try_lock().is_err(),
                "the lane was free while its check still ran"
            );
            while checks.slots.available_permits() < MAX_CONCURRENT_PASSWORD_CHECKS {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the slot never came back"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });

        // Lanes of peers gone are swept: many peers one after another leave a bounded table.
        let checks = PasswordChecks::new();
        for i in 0..10_000u32 {
            drop(checks.lane(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i))));
        }
        let left = checks.lanes.lock().unwrap().by_peer.len();
        assert!(left <= LANES_SWEEP_MIN, "{left} lanes of gone peers kept");
    }

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
    fn a_password_check_that_waited_through_a_rotation_is_checked_again() {
        use crate::exposition::web_config::tests::ops_with as users;
        use base64::Engine as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(&path, users("old")).unwrap();
        let file = Arc::new(WebConfigFile::load(&path).unwrap());
        let security = Arc::new(Security {
            web: Some(file.clone()),
            password_checks: PasswordChecks::new(),
        });
        let peer: IpAddr = "192.0.2.1".parse().unwrap();
        let header = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("ops:old")
        );
        let runtime = two_thread_runtime();
        runtime.block_on(async {
            let allowed = |security: Arc<Security>, file: Arc<WebConfigFile>| {
                let header = header.clone();
                async move {
                    let activity = Activity::new(Instant::now());
                    security
                        .authorize(&file, peer, Some(header.as_bytes()), &activity)
                        .await
                        .map(|(_, allowed)| allowed)
                }
            };
            // (The credential is not checked first: a verified one is answered from the cache
            // without waiting, so it could not wait through anything.)
            // The peer's lane is busy (another check of its in progress): the request waits,
            // and the password is rotated meanwhile.
            let lane = security.password_checks.lane(peer);
            let busy = lane.lock().await;
            let waiting = tokio::spawn(allowed(security.clone(), file.clone()));
            // The request holds the lane (ours, its own) once it has read the config in force
            // and waits for its turn: only then is the rotation "meanwhile".
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while Arc::strong_count(&lane) < 2 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the request never queued"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            std::fs::write(&path, users("new")).unwrap();
            file.check();
            file.check();
            drop(busy);
            assert_eq!(
                waiting.await.unwrap(),
                Some(false),
                "a request that waited through a rotation was let in with the old password"
            );
        });
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
