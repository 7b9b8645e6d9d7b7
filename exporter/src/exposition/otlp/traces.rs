//! Span export to an OTLP endpoint: a bounded queue, batching, and retry with backoff, in
//! front of opentelemetry-otlp's `SpanExporter` (gRPC through tonic, or OTLP/HTTP with
//! protobuf or JSON bodies through the blocking reqwest client of [`super::tls`]; TLS for
//! `https://` endpoints as [`super::tls`] builds it).
//!
//! The queue holds at most `slow_calls.export_queue` spans, the batch being sent included, so
//! memory stays bounded however long the endpoint is down or slow; a span that does not fit
//! is dropped and counted (`export_queue_full`). One thread sends batches of at most
//! `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` spans when a batch is full or `OTEL_BSP_SCHEDULE_DELAY`
//! has passed. A failed request (after the exporter's own quick retries) is retried after a
//! pause that doubles from [`INITIAL_BACKOFF`] to [`MAX_BACKOFF`], so a dead endpoint costs
//! one request every few seconds and export resumes within [`MAX_BACKOFF`] of it coming back;
//! a batch that failed [`MAX_ATTEMPTS`] times is dropped and counted (`export_failed`).
//!
//! The thread is a plain OS thread: the HTTP exporter's blocking client must not run on a
//! tokio runtime thread, while tonic needs a runtime, which the thread borrows through a
//! [`tokio::runtime::Handle`] for gRPC only.

use std::{
    collections::{HashMap, VecDeque},
    sync::{mpsc, Arc, Condvar, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::{
    trace::{SpanData, SpanExporter as _},
    Resource,
};

use super::{
    config::{Protocol, SignalSettings},
    Stats,
};

/// Pause after the first failed request.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Longest pause between two attempts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Attempts per batch before it is dropped.
pub(crate) const MAX_ATTEMPTS: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum TraceExportError {
    #[error("OTLP span exporter for {endpoint}")]
    Build {
        endpoint: String,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    #[error("OTLP header `{name}`: not a valid {what}")]
    Header { name: String, what: &'static str },
    #[error("OTLP span exporter for {endpoint}")]
    Tls {
        endpoint: String,
        #[source]
        source: super::tls::TlsError,
    },
    #[error("OTLP gRPC export needs a tokio runtime")]
    NoRuntime,
    #[error("starting the span export thread")]
    Thread(#[source] std::io::Error),
}

#[derive(Debug, Default)]
struct State {
    spans: VecDeque<SpanData>,
    in_flight: usize,
    shutdown: bool,
}

#[derive(Debug)]
struct Queue {
    state: Mutex<State>,
    wake: Condvar,
    capacity: usize,
    max_batch: usize,
}

/// The running span exporter.
#[derive(Debug)]
pub(crate) struct SpanExport {
    queue: Arc<Queue>,
    stats: Arc<Stats>,
    done: Mutex<Option<mpsc::Receiver<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// How the export thread runs the exporter's futures.
#[derive(Clone)]
enum Driver {
    /// gRPC: tonic's connections live on the agent's runtime.
    Runtime(tokio::runtime::Handle),
    /// HTTP: the blocking client, outside any runtime.
    Blocking,
}

impl Driver {
    fn run<F: std::future::Future>(&self, f: F) -> F::Output {
        match self {
            Driver::Runtime(h) => h.block_on(f),
            Driver::Blocking => futures::executor::block_on(f),
        }
    }
}

fn build_exporter(
    settings: &SignalSettings,
    resource: &Resource,
) -> Result<opentelemetry_otlp::SpanExporter, TraceExportError> {
    let built = match settings.protocol {
        Protocol::Grpc => {
            let mut metadata = tonic::metadata::MetadataMap::new();
            for (k, v) in &settings.headers {
                let key =
                    tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                        .map_err(|_| TraceExportError::Header {
                            name: k.clone(),
                            what: "gRPC metadata key",
                        })?;
                let value = v.parse().map_err(|_| TraceExportError::Header {
                    name: k.clone(),
                    what: "gRPC metadata value",
                })?;
                metadata.insert(key, value);
            }
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(settings.endpoint.clone())
                .with_timeout(settings.timeout)
                .with_metadata(metadata);
            if settings.gzip {
                builder = builder.with_compression(opentelemetry_otlp::Compression::Gzip);
            }
            match &settings.tls {
                Some(tls) => builder
                    .with_tls_config(super::tls::tonic_config(tls))
                    .build(),
                None => builder.build(),
            }
        }
        Protocol::HttpProtobuf | Protocol::HttpJson => {
            let client =
                super::tls::http_client(settings).map_err(|source| TraceExportError::Tls {
                    endpoint: settings.endpoint.clone(),
                    source,
                })?;
            let builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(super::tls::BlockingHttpClient(client));
            let builder = if settings.gzip {
                builder.with_compression(opentelemetry_otlp::Compression::Gzip)
            } else {
                builder
            };
            builder
                .with_endpoint(settings.endpoint.clone())
                .with_protocol(if settings.protocol == Protocol::HttpJson {
                    opentelemetry_otlp::Protocol::HttpJson
                } else {
                    opentelemetry_otlp::Protocol::HttpBinary
                })
                .with_timeout(settings.timeout)
                .with_headers(settings.headers.iter().cloned().collect::<HashMap<_, _>>())
                .build()
        }
    };
    let mut exporter = built.map_err(|source| TraceExportError::Build {
        endpoint: settings.endpoint.clone(),
        source,
    })?;
    exporter.set_resource(resource);
    Ok(exporter)
}

impl SpanExport {
    /// Builds the exporter and starts the export thread. For gRPC, `runtime` must be the
    /// agent's tokio runtime.
    pub(crate) fn start(
        settings: SignalSettings,
        resource: Resource,
        capacity: usize,
        max_batch: usize,
        schedule_delay: Duration,
        stats: Arc<Stats>,
        runtime: Option<tokio::runtime::Handle>,
    ) -> Result<Self, TraceExportError> {
        let driver = match settings.protocol {
            Protocol::Grpc => Driver::Runtime(runtime.ok_or(TraceExportError::NoRuntime)?),
            Protocol::HttpProtobuf | Protocol::HttpJson => Driver::Blocking,
        };
        let queue = Arc::new(Queue {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            capacity: capacity.max(1),
            max_batch: max_batch.max(1),
        });
        // The exporter is created (and later dropped) on the export thread: the blocking HTTP
        // client must not be dropped inside the runtime. Build errors come back here.
        let (ready_tx, ready_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let thread = {
            let queue = queue.clone();
            let stats = stats.clone();
            let driver = driver.clone();
            std::thread::Builder::new()
                .name("otlp-spans".into())
                .spawn(move || {
                    let exporter = {
                        let _guard = match &driver {
                            Driver::Runtime(h) => Some(h.enter()),
                            Driver::Blocking => None,
                        };
                        build_exporter(&settings, &resource)
                    };
                    let exporter = match exporter {
                        Ok(e) => {
                            let _ = ready_tx.send(Ok(()));
                            e
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    tracing::info!(endpoint = %settings.endpoint, protocol = settings.protocol.as_str(), tls = settings.tls.is_some(), "exporting slow-call spans over OTLP");
                    export_loop(&queue, &exporter, &driver, &stats, schedule_delay, &settings.endpoint);
                    let _ = exporter.shutdown_with_timeout(Duration::from_secs(1));
                    let _ = done_tx.send(());
                })
                .map_err(TraceExportError::Thread)?
        };
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(TraceExportError::Thread(std::io::Error::other(
                    "span export thread ended during start-up",
                )))
            }
        }
        stats.enable_otlp_traces();
        Ok(Self {
            queue,
            stats,
            done: Mutex::new(Some(done_rx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues a span; when the queue is full it is dropped and counted.
    pub(crate) fn push(&self, span: SpanData) -> bool {
        let mut st = self.queue.state.lock().expect("span queue lock");
        if st.spans.len() + st.in_flight >= self.queue.capacity {
            self.stats.dropped("export_queue_full", 1);
            return false;
        }
        st.spans.push_back(span);
        self.stats
            .queued
            .set((st.spans.len() + st.in_flight) as i64);
        if st.spans.len() >= self.queue.max_batch {
            self.queue.wake.notify_one();
        }
        true
    }

    /// Sends what is queued (for at most `grace`) and stops the thread.
    pub(crate) fn shutdown(&self, grace: Duration) {
        {
            let mut st = self.queue.state.lock().expect("span queue lock");
            st.shutdown = true;
            self.queue.wake.notify_all();
        }
        let done = self.done.lock().expect("span export lock").take();
        if let Some(done) = done {
            if done.recv_timeout(grace).is_ok() {
                if let Some(t) = self.thread.lock().expect("span export lock").take() {
                    let _ = t.join();
                }
            } else {
                tracing::warn!("span export still busy after {grace:?}; leaving it behind");
            }
        }
    }
}

/// Waits for a batch: full, or the schedule delay passed with something queued, or shutdown.
fn next_batch(queue: &Queue, stats: &Stats, delay: Duration) -> Option<Vec<SpanData>> {
    let mut st = queue.state.lock().expect("span queue lock");
    let mut deadline = Instant::now() + delay;
    loop {
        if st.spans.len() >= queue.max_batch || (st.shutdown && !st.spans.is_empty()) {
            break;
        }
        if st.shutdown {
            return None;
        }
        let now = Instant::now();
        if now >= deadline {
            if !st.spans.is_empty() {
                break;
            }
            deadline = now + delay;
        }
        st = queue
            .wake
            .wait_timeout(st, deadline.saturating_duration_since(now))
            .expect("span queue lock")
            .0;
    }
    let n = st.spans.len().min(queue.max_batch);
    let batch: Vec<SpanData> = st.spans.drain(..n).collect();
    st.in_flight = n;
    stats.queued.set((st.spans.len() + st.in_flight) as i64);
    Some(batch)
}

fn finish_batch(queue: &Queue, stats: &Stats) {
    let mut st = queue.state.lock().expect("span queue lock");
    st.in_flight = 0;
    stats.queued.set(st.spans.len() as i64);
}

/// Sleeps for `pause` unless shutdown is requested meanwhile; returns whether it is.
fn pause_unless_shutdown(queue: &Queue, pause: Duration) -> bool {
    let deadline = Instant::now() + pause;
    let mut st = queue.state.lock().expect("span queue lock");
    while !st.shutdown {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        st = queue
            .wake
            .wait_timeout(st, deadline - now)
            .expect("span queue lock")
            .0;
    }
    true
}

fn export_loop(
    queue: &Queue,
    exporter: &opentelemetry_otlp::SpanExporter,
    driver: &Driver,
    stats: &Stats,
    delay: Duration,
    endpoint: &str,
) {
    let mut backoff = INITIAL_BACKOFF;
    let mut failing = false;
    while let Some(batch) = next_batch(queue, stats, delay) {
        let n = batch.len() as u64;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match driver.run(exporter.export(batch.clone())) {
                Ok(()) => {
                    tracing::debug!(spans = n, attempts, "OTLP span batch exported");
                    stats.request("traces", true);
                    stats.exported("otlp", n);
                    if failing {
                        tracing::info!(endpoint, "OTLP span export recovered");
                    }
                    failing = false;
                    backoff = INITIAL_BACKOFF;
                    break;
                }
                Err(e) => {
                    stats.request("traces", false);
                    if !failing {
                        tracing::warn!(endpoint, error = %e, "OTLP span export failed; retrying with backoff, spans beyond the queue are dropped and counted");
                    } else {
                        tracing::debug!(endpoint, error = %e, attempts, "OTLP span export failed again");
                    }
                    failing = true;
                    let shutting_down = pause_unless_shutdown(queue, backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    if attempts >= MAX_ATTEMPTS || shutting_down {
                        stats.dropped("export_failed", n);
                        break;
                    }
                }
            }
        }
        finish_batch(queue, stats);
    }
}

/// The instrumentation scope of every span sysscope exports.
static SCOPE: std::sync::LazyLock<opentelemetry::InstrumentationScope> =
    std::sync::LazyLock::new(|| {
        opentelemetry::InstrumentationScope::builder("sysscope")
            .with_version(crate::build_info::VERSION)
            .build()
    });

/// The OTLP endpoint as a destination of the slow-call source.
impl crate::spans::SpanSink for SpanExport {
    fn deliver(
        &self,
        call: &Arc<crate::spans::event::SlowCall>,
        _series_labels: &[(&'static str, String)],
    ) {
        self.push(call.to_span_data(&SCOPE));
    }

    fn shutdown(&self, grace: Duration) {
        SpanExport::shutdown(self, grace);
    }
}
