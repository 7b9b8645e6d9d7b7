//! The watch of this node's pods (kube-rs `watcher`, field selector `spec.nodeName=<node>`),
//! feeding the [`PodStore`] that names cgroups, and what it reports about itself
//! ([`WatchHealth`]), which the `kubernetes` collector (`crate::collectors::kubernetes`)
//! exports.
//!
//! The watch runs on a thread of its own with its own small runtime, so a slow or failing API
//! server never holds up the exporter or a scrape: scrapes only read the cache. Failed requests
//! are retried with kube-runtime's default backoff (0.8 s doubling to 30 s, jittered, as
//! client-go's reflector does); lists are served from the API server's watch cache
//! (`resourceVersion=0`), which matters when every node of a large cluster lists at once.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
    time::Instant,
};

use futures::StreamExt;
use hyper::{Request, Response};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    client::ClientBuilder,
    runtime::{
        utils::Backoff,
        watcher::{self, watcher, DefaultBackoff, Event},
        WatchStreamExt,
    },
    Api, Client,
};

use super::pods::PodStore;
use crate::config::KubernetesConfig;

/// The `collector` label of the pod watch.
pub(crate) const NAME: &str = "kubernetes";

/// Where a pod's service-account token is mounted.
pub(crate) const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchError {
    #[error(
        "the pod watch needs this node's name: set kubernetes.node_name in the config file or \
         the NODE_NAME environment variable (in a DaemonSet, from the downward API: \
         fieldRef spec.nodeName)"
    )]
    NoNodeName,
    #[error("no Kubernetes API configuration (in-cluster service account or kubeconfig): {0}")]
    Config(String),
    #[error("building the Kubernetes API client")]
    Client(#[source] kube::Error),
    #[error("starting the pod watch")]
    Runtime(#[source] std::io::Error),
    #[error("the pod watch thread stopped before it started")]
    Stopped,
}

/// Whether the pod watch runs with this configuration. "auto" means: when this process runs
/// in a pod (KUBERNETES_SERVICE_HOST set and a service-account token mounted).
pub(crate) fn enabled(config: &KubernetesConfig) -> bool {
    match config.pod_watch.as_str() {
        "on" => true,
        "off" => false,
        _ => in_cluster(),
    }
}

/// Whether this process runs in a Kubernetes pod with API credentials.
pub(crate) fn in_cluster() -> bool {
    std::env::var("KUBERNETES_SERVICE_HOST").is_ok_and(|h| !h.is_empty())
        && std::path::Path::new(TOKEN_PATH).exists()
}

/// The node whose pods are watched: `kubernetes.node_name`, else `$NODE_NAME`.
pub(crate) fn node_name(config: &KubernetesConfig) -> Option<String> {
    config
        .node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok())
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
}

/// How the API client is configured.
#[derive(Debug)]
pub(crate) enum ClientSource {
    /// The service account of the pod this runs in, else the kubeconfig (`KUBECONFIG`,
    /// `~/.kube/config`).
    Infer,
    /// A given configuration (the tests' fake API server).
    #[cfg(test)]
    Explicit(Box<kube::Config>),
}

/// What the watch reports about itself, shared with the collector.
#[derive(Debug, Default)]
pub(crate) struct WatchHealth {
    /// A complete list of the node's pods has been received at least once.
    synced: AtomicBool,
    /// The last API request (or the open watch stream) failed.
    failing: AtomicBool,
    errors: AtomicU64,
    last_error: Mutex<String>,
}

impl WatchHealth {
    pub(crate) fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    pub(crate) fn failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    /// API requests and watch streams that failed so far.
    pub(crate) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Acquire)
    }

    pub(crate) fn last_error(&self) -> String {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn ok(&self) {
        self.failing.store(false, Ordering::Release);
    }

    fn fail(&self, why: String) {
        if !self.failing.swap(true, Ordering::AcqRel) {
            tracing::warn!(collector = NAME, error = %why, "Kubernetes API request failed; retrying with backoff");
        } else {
            tracing::debug!(collector = NAME, error = %why, "Kubernetes API request failed again");
        }
        self.errors.fetch_add(1, Ordering::AcqRel);
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }
}

/// Observes every API response, so the watch counts as healthy again as soon as a request
/// succeeds (a resumed watch with no pod changes yields no event to tell it by).
#[derive(Debug, Clone)]
struct HealthLayer(Arc<WatchHealth>);

impl<S> tower::Layer<S> for HealthLayer {
    type Service = HealthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HealthService {
            inner,
            health: self.0.clone(),
        }
    }
}

#[derive(Debug, Clone)]
struct HealthService<S> {
    inner: S,
    health: Arc<WatchHealth>,
}

impl<S, ReqBody, ResBody> tower::Service<Request<ReqBody>> for HealthService<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: std::fmt::Display,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let health = self.health.clone();
        let what = format!("{} {}", req.method(), req.uri().path());
        let response = self.inner.call(req);
        Box::pin(async move {
            let result = response.await;
            match &result {
                Ok(r) if r.status().is_success() => health.ok(),
                Ok(r) => health.fail(format!("{what}: HTTP {}", r.status())),
                Err(e) => health.fail(format!("{what}: {e}")),
            }
            result
        })
    }
}

/// A running pod watch; dropping it stops the watch.
#[derive(Debug)]
pub(crate) struct PodWatch {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl PodWatch {
    /// Builds the API client and starts watching `node`'s pods into `store`. Returns once the
    /// client is built (local configuration only; no request has been made yet).
    pub(crate) fn spawn(
        source: ClientSource,
        node: String,
        store: Arc<PodStore>,
        health: Arc<WatchHealth>,
        backoff: impl Backoff + 'static,
    ) -> Result<Self, WatchError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), WatchError>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("sysscope-k8s".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(WatchError::Runtime(e)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let client = match build_client(source, health.clone()).await {
                        Ok(c) => c,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    run(client, &node, &store, &health, backoff, stop_rx).await;
                });
            })
            .map_err(WatchError::Runtime)?;
        ready_rx.recv().map_err(|_| WatchError::Stopped)??;
        Ok(Self {
            stop: Some(stop_tx),
        })
    }
}

async fn build_client(
    source: ClientSource,
    health: Arc<WatchHealth>,
) -> Result<Client, WatchError> {
    let config = match source {
        #[cfg(test)]
        ClientSource::Explicit(c) => *c,
        ClientSource::Infer => kube::Config::infer()
            .await
            .map_err(|e| WatchError::Config(e.to_string()))?,
    };
    Ok(ClientBuilder::try_from(config)
        .map_err(WatchError::Client)?
        .with_layer(&HealthLayer(health))
        .build())
}

async fn run(
    client: Client,
    node: &str,
    store: &PodStore,
    health: &WatchHealth,
    backoff: impl Backoff,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let api: Api<Pod> = Api::all(client);
    let mut config = watcher::Config::default()
        .fields(&format!("spec.nodeName={node}"))
        .any_semantic();
    // One node's pods fit one page, and only an unpaginated `resourceVersion=0` list is
    // served from the API server's cache rather than from etcd.
    config.page_size = None;
    let events = watcher(api, config).backoff(backoff);
    futures::pin_mut!(events);
    tracing::info!(collector = NAME, node, "watching this node's pods");
    loop {
        let next = tokio::select! {
            _ = &mut stop => return,
            next = events.next() => next,
        };
        let now = Instant::now();
        match next {
            Some(Ok(Event::Init)) => store.begin_resync(),
            Some(Ok(Event::InitApply(pod))) => store.apply(&pod, now),
            Some(Ok(Event::InitDone)) => {
                store.end_resync(now);
                if !health.synced.swap(true, Ordering::AcqRel) {
                    tracing::info!(
                        collector = NAME,
                        pods = store.len(),
                        "listed this node's pods"
                    );
                }
            }
            Some(Ok(Event::Apply(pod))) => store.apply(&pod, now),
            Some(Ok(Event::Delete(pod))) => store.delete(&pod, now),
            Some(Err(e)) => stream_error(health, e),
            None => return,
        }
    }
}

/// Errors the request layer did not see: those inside an open watch stream.
fn stream_error(health: &WatchHealth, e: watcher::Error) {
    match e {
        // "Too old resource version": routine; the watcher lists again.
        watcher::Error::WatchError(status) if status.code == 410 => {
            tracing::debug!(collector = NAME, "pod watch expired; listing again");
        }
        // Failed requests: already counted by the request layer.
        watcher::Error::InitialListFailed(_) | watcher::Error::WatchStartFailed(_) => {}
        other => health.fail(other.to_string()),
    }
}

/// Starts the pod watch if the configuration enables it: `Ok(None)` when it is off (or
/// "auto" outside a cluster).
pub(crate) fn start(config: &KubernetesConfig) -> Result<Option<Watch>, WatchError> {
    if !enabled(config) {
        tracing::debug!(
            collector = NAME,
            mode = %config.pod_watch,
            "pod watch disabled (not running in a Kubernetes pod)"
        );
        return Ok(None);
    }
    let node = node_name(config).ok_or(WatchError::NoNodeName)?;
    let store = Arc::new(PodStore::new(config.max_pods));
    Watch::start(ClientSource::Infer, node, store, DefaultBackoff::default()).map(Some)
}

/// A running pod watch: the cache it fills and what it reports about itself. Dropping it stops
/// the watch.
#[derive(Debug)]
pub(crate) struct Watch {
    pub(crate) store: Arc<PodStore>,
    pub(crate) health: Arc<WatchHealth>,
    /// When the watch started (the first list has a grace period).
    pub(crate) started: Instant,
    _watch: PodWatch,
}

impl Watch {
    pub(crate) fn start(
        source: ClientSource,
        node: String,
        store: Arc<PodStore>,
        backoff: impl Backoff + 'static,
    ) -> Result<Self, WatchError> {
        let health = Arc::new(WatchHealth::default());
        let watch = PodWatch::spawn(source, node, store.clone(), health.clone(), backoff)?;
        Ok(Self {
            store,
            health,
            started: Instant::now(),
            _watch: watch,
        })
    }
}

#[cfg(test)]
mod tests {
    //! The watch against a fake API server on loopback (hyper), which answers each list and
    //! watch request with the reply the test hands it, in order.

    use std::{convert::Infallible, net::SocketAddr, time::Duration};

    use bytes::Bytes;
    use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
    use hyper::body::Frame;
    use serde_json::{json, Value};
    use tokio::sync::mpsc;

    use prometheus_client::encoding::DescriptorEncoder;

    use super::*;
    use crate::{
        collectors::{kubernetes::PodWatchCollector, Collector},
        metadata::kubernetes::pods::tests::pod_json,
    };

    enum Reply {
        Status(u16),
        List(Vec<Value>, &'static str),
        /// A watch stream: each string is one JSON event; dropping the sender ends it.
        Stream(mpsc::UnboundedReceiver<String>),
    }

    struct FakeApi {
        addr: SocketAddr,
        lists: mpsc::UnboundedSender<Reply>,
        watches: mpsc::UnboundedSender<Reply>,
        requests: Arc<Mutex<Vec<String>>>,
    }

    type Queue = Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Reply>>>;

    impl FakeApi {
        /// Serves on a thread of its own, so the test's thread can poll synchronously.
        fn start() -> Self {
            let (lists, list_rx) = mpsc::unbounded_channel();
            let (watches, watch_rx) = mpsc::unbounded_channel();
            let requests = Arc::new(Mutex::new(Vec::new()));
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.set_nonblocking(true).unwrap();
            let addr = listener.local_addr().unwrap();
            let (list_q, watch_q): (Queue, Queue) = (
                Arc::new(tokio::sync::Mutex::new(list_rx)),
                Arc::new(tokio::sync::Mutex::new(watch_rx)),
            );
            let log = requests.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            return;
                        };
                        let (list_q, watch_q, log) = (list_q.clone(), watch_q.clone(), log.clone());
                        tokio::spawn(async move {
                            let service = hyper::service::service_fn(move |req| {
                                serve(req, list_q.clone(), watch_q.clone(), log.clone())
                            });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                .await;
                        });
                    }
                });
            });
            Self {
                addr,
                lists,
                watches,
                requests,
            }
        }

        fn config(&self) -> kube::Config {
            kube::Config::new(format!("http://{}", self.addr).parse().unwrap())
        }
    }

    async fn serve(
        req: Request<hyper::body::Incoming>,
        lists: Queue,
        watches: Queue,
        log: Arc<Mutex<Vec<String>>>,
    ) -> Result<Response<BoxBody<Bytes, Infallible>>, Infallible> {
        let uri = req.uri().to_string();
        log.lock().unwrap().push(uri.clone());
        let queue = if uri.contains("watch=true") {
            watches
        } else {
            lists
        };
        // Wait for the test to hand over the reply: the test decides the order of everything.
        let reply = queue.lock().await.recv().await;
        let response = match reply {
            None => status_response(500, "script exhausted"),
            Some(Reply::Status(code)) => status_response(code, "scripted failure"),
            Some(Reply::List(items, rv)) => {
                let body = json!({
                    "apiVersion": "v1", "kind": "PodList",
                    "metadata": {"resourceVersion": rv}, "items": items
                });
                json_response(200, body.to_string())
            }
            Some(Reply::Stream(rx)) => {
                let frames = futures::stream::unfold(rx, |mut rx| async move {
                    let line = rx.recv().await?;
                    Some((
                        Ok::<_, Infallible>(Frame::data(Bytes::from(line + "\n"))),
                        rx,
                    ))
                });
                Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(BodyExt::boxed(StreamBody::new(frames)))
                    .unwrap()
            }
        };
        Ok(response)
    }

    fn json_response(code: u16, body: String) -> Response<BoxBody<Bytes, Infallible>> {
        Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)).boxed())
            .unwrap()
    }

    fn status_response(code: u16, message: &str) -> Response<BoxBody<Bytes, Infallible>> {
        let body = json!({
            "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
            "message": message, "reason": "InternalError", "code": code
        });
        json_response(code, body.to_string())
    }

    fn with_rv(mut pod: Value, rv: &str) -> Value {
        pod["metadata"]["resourceVersion"] = json!(rv);
        pod
    }

    fn event(kind: &str, pod: Value) -> String {
        json!({"type": kind, "object": pod}).to_string()
    }

    /// A pod watch of node-a against the fake API, retrying fast, into a store of `capacity`
    /// pods that forgets deleted ones at once.
    fn watch_node_a(
        api: &FakeApi,
        capacity: usize,
    ) -> (Arc<PodStore>, Arc<WatchHealth>, PodWatchCollector) {
        let store = Arc::new(PodStore::with_grace(capacity, Duration::ZERO));
        let watch = Watch::start(
            ClientSource::Explicit(Box::new(api.config())),
            "node-a".into(),
            store.clone(),
            QuickRetry,
        )
        .unwrap();
        let health = watch.health.clone();
        (store, health, PodWatchCollector::new(watch))
    }

    /// Retries after 5 ms, so the tests need not wait for the default backoff's 0.8 s.
    struct QuickRetry;

    impl Iterator for QuickRetry {
        type Item = Duration;

        fn next(&mut self) -> Option<Duration> {
            Some(Duration::from_millis(5))
        }
    }

    impl Backoff for QuickRetry {
        fn reset(&mut self) {}
    }

    fn eventually(what: &str, mut f: impl FnMut() -> bool) {
        let start = Instant::now();
        while !f() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "timed out waiting for: {what}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The collector's families in the text format (consumes it: the registry owns it).
    fn encoded(c: PodWatchCollector) -> String {
        #[derive(Debug)]
        struct View(PodWatchCollector);
        impl prometheus_client::collector::Collector for View {
            fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
                self.0.encode(&mut e)
            }
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(View(c)));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    const A: &str = "aaaaaaaa-0000-0000-0000-000000000001";
    const B: &str = "bbbbbbbb-0000-0000-0000-000000000002";
    const C: &str = "cccccccc-0000-0000-0000-000000000003";
    const D: &str = "dddddddd-0000-0000-0000-000000000004";
    const E: &str = "eeeeeeee-0000-0000-0000-000000000005";
    const F: &str = "ffffffff-0000-0000-0000-000000000006";

    #[test]
    fn watch_follows_the_api_through_errors_restarts_and_deletions() {
        let api = FakeApi::start();
        let (store, health, mut collector) = watch_node_a(&api, 3);

        // Starting, the first list not answered yet: not down (yet).
        collector.refresh().unwrap();
        assert!(!health.synced());
        // The API fails: counted, reported down, retried.
        api.lists.send(Reply::Status(500)).unwrap();
        eventually("first error", || health.errors() == 1);
        assert!(collector.refresh().is_err());
        api.lists.send(Reply::Status(403)).unwrap();
        eventually("second error", || health.errors() == 2);
        assert!(
            health.last_error().contains("403"),
            "{}",
            health.last_error()
        );
        assert!(collector.refresh().is_err());

        // The list succeeds: the node's pods are cached and the collector is up.
        let a = pod_json("shop", "cart-0", A, &[("app", "containerd://a1")]);
        let b = pod_json("shop", "cart-1", B, &[("app", "containerd://b1")]);
        api.lists
            .send(Reply::List(vec![a.clone(), b.clone()], "10"))
            .unwrap();
        eventually("synced", || health.synced());
        collector.refresh().unwrap();
        assert_eq!(
            store.lookup(A, Some("a1")).unwrap().container.as_deref(),
            Some("app")
        );
        assert!(store.lookup(B, None).is_some());
        {
            let requests = api.requests.lock().unwrap();
            let list = requests
                .iter()
                .rfind(|r| !r.contains("watch=true"))
                .unwrap();
            assert!(
                list.starts_with("/api/v1/pods?")
                    && list.contains("fieldSelector=spec.nodeName%3Dnode-a"),
                "{list}"
            );
            assert!(
                list.contains("resourceVersion=0"),
                "served from the watch cache: {list}"
            );
        }

        // Watch: a restarted container, a new pod, a deleted pod.
        let (tx, rx) = mpsc::unbounded_channel();
        api.watches.send(Reply::Stream(rx)).unwrap();
        let mut a2 = pod_json("shop", "cart-0", A, &[("app", "containerd://a2")]);
        a2["status"]["containerStatuses"][0]["lastState"] =
            json!({"terminated": {"exitCode": 137, "containerID": "containerd://a1"}});
        tx.send(event("MODIFIED", with_rv(a2, "11"))).unwrap();
        let c = pod_json("batch", "job-x", C, &[("main", "cri-o://c1")]);
        tx.send(event("ADDED", with_rv(c.clone(), "12"))).unwrap();
        tx.send(event("DELETED", with_rv(b, "13"))).unwrap();
        eventually("deletion applied", || store.lookup(B, None).is_none());
        assert_eq!(
            store.lookup(A, Some("a2")).unwrap().container.as_deref(),
            Some("app")
        );
        assert!(store.lookup(A, Some("a1")).unwrap().container.is_some());
        assert_eq!(&*store.lookup(C, Some("c1")).unwrap().namespace, "batch");
        assert!(api
            .requests
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.contains("watch=true") && r.contains("resourceVersion=10")));

        // The watch expires (410 Gone): the watcher lists again, and a pod deleted while it
        // was not watching (C) is dropped. A routine expiry is not an error.
        tx.send(
            json!({"type": "ERROR", "object": {
                "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "message": "too old resource version", "reason": "Expired", "code": 410}})
            .to_string(),
        )
        .unwrap();
        let d = pod_json("shop", "cart-2", D, &[]);
        api.lists
            .send(Reply::List(vec![a.clone(), d.clone()], "20"))
            .unwrap();
        eventually("relisted", || {
            store.lookup(C, None).is_none() && store.lookup(D, None).is_some()
        });
        assert_eq!(health.errors(), 2);
        collector.refresh().unwrap();

        // The watch connection drops and re-watching fails: down, but the cache still answers.
        let (tx2, rx2) = mpsc::unbounded_channel::<String>();
        api.watches.send(Reply::Stream(rx2)).unwrap();
        eventually("second watch", || {
            api.requests
                .lock()
                .unwrap()
                .iter()
                .any(|r| r.contains("watch=true") && r.contains("resourceVersion=20"))
        });
        drop(tx);
        drop(tx2);
        api.watches.send(Reply::Status(500)).unwrap();
        eventually("watch error", || health.errors() == 3);
        let err = collector.refresh().unwrap_err().to_string();
        assert!(err.contains("500"), "{err}");
        assert!(store.lookup(A, None).is_some(), "cache kept through errors");

        // A new watch succeeds with no event to show for it: up again all the same.
        let (tx3, rx3) = mpsc::unbounded_channel();
        api.watches.send(Reply::Stream(rx3)).unwrap();
        eventually("recovered", || !health.failing());
        collector.refresh().unwrap();

        // The cache is bounded (3 pods): the fourth is not cached, and counted.
        let e = pod_json("shop", "cart-3", E, &[]);
        let f = pod_json("shop", "cart-4", F, &[]);
        tx3.send(event("ADDED", with_rv(e, "21"))).unwrap();
        tx3.send(event("ADDED", with_rv(f, "22"))).unwrap();
        eventually("bounded", || store.rejected() == 1);
        assert_eq!(store.len(), 3);
        assert!(store.lookup(F, None).is_none());

        let text = encoded(collector);
        for line in [
            "sysscope_kubernetes_pods 3",
            "sysscope_kubernetes_pods_not_cached_total 1",
            "sysscope_kubernetes_api_errors_total 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }

    #[test]
    fn a_broken_stream_is_an_error_and_is_retried() {
        let api = FakeApi::start();
        let (store, health, mut collector) = watch_node_a(&api, 8);
        api.lists.send(Reply::List(vec![], "5")).unwrap();
        eventually("synced", || health.synced());
        // Garbage on the watch stream: the watcher reports it; the pod watch retries.
        let (tx, rx) = mpsc::unbounded_channel();
        api.watches.send(Reply::Stream(rx)).unwrap();
        tx.send("{not json".into()).unwrap();
        eventually("stream error", || health.errors() == 1);
        assert!(collector.refresh().is_err());
        // The retried watch resumes, then a pod arrives.
        let (tx2, rx2) = mpsc::unbounded_channel();
        api.watches.send(Reply::Stream(rx2)).unwrap();
        drop(tx);
        let p = pod_json("ns", "p", A, &[("c", "containerd://x")]);
        tx2.send(event("ADDED", with_rv(p, "6"))).unwrap();
        eventually("pod after retry", || store.lookup(A, Some("x")).is_some());
        collector.refresh().unwrap();
    }

    #[test]
    fn modes_and_node_name() {
        let mut c = KubernetesConfig {
            pod_watch: "off".into(),
            ..Default::default()
        };
        assert!(!enabled(&c));
        c.pod_watch = "on".into();
        assert!(enabled(&c));
        c.node_name = Some(" node-b ".into());
        assert_eq!(node_name(&c).as_deref(), Some("node-b"));
        c.node_name = Some(String::new());
        // Falls back to $NODE_NAME, which the test environment does not set.
        if std::env::var("NODE_NAME").is_err() {
            assert_eq!(node_name(&c), None);
            assert!(matches!(start(&c), Err(WatchError::NoNodeName)));
        }
    }

    #[test]
    fn tls_client_builds() {
        // An https API server (as in a cluster) needs the TLS stack to initialise.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let config = kube::Config::new("https://10.0.0.1:443".parse().unwrap());
            build_client(
                ClientSource::Explicit(Box::new(config)),
                Arc::new(WatchHealth::default()),
            )
            .await
            .unwrap();
        });
    }
}
