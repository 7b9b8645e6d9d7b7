//! Span export to an OTLP endpoint: the OpenTelemetry SDK's `BatchSpanProcessor` (batching on
//! its own thread) in front of opentelemetry-otlp's `SpanExporter` with its retry policy (gRPC
//! through tonic, or OTLP/HTTP with protobuf or JSON bodies through the reqwest client of
//! [`super::tls`]; TLS for `https://` endpoints as [`super::tls`] builds it).
//!
//! What the SDK does not count is counted here. At most `slow_calls.export_queue` spans are
//! held, the batch being sent included (the sink admits a span only below that
//! bound, and the processor's own queue is as large, so it never drops one itself): memory
//! stays bounded however long the endpoint is down or slow, and a span that does not fit is
//! dropped and counted (`export_queue_full`). A batch that still fails after the exporter's
//! retries ([`RETRIES`], from [`INITIAL_BACKOFF`] doubling to [`MAX_BACKOFF`], within the
//! request timeout) is dropped and counted (`export_failed`), and the next batch waits
//! [`OUTAGE_PAUSE`], so a dead endpoint costs a few requests every few seconds, not a stream.
//! Why this, and not sysscope's own queue: docs/spans.md ("Export").
//!
//! The export thread is the processor's plain OS thread; each export is a task on the agent's
//! runtime (both clients are async), which the thread waits for: a runtime shutting down
//! cancels it rather than fail under it.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use opentelemetry_otlp::{
    tonic_types::metadata::MetadataMap, RetryPolicy, WithExportConfig, WithHttpConfig,
    WithTonicConfig,
};
use opentelemetry_sdk::{
    error::{OTelSdkError, OTelSdkResult},
    trace::{BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanExporter, SpanProcessor},
    Resource,
};

use super::{ExportError, Stats};
use crate::config::otlp::{Protocol, SignalSettings};

/// Retries of a failed request, after the first attempt.
pub(crate) const RETRIES: usize = 3;
/// Pause before the first retry.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Longest pause between two attempts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Pause after a batch was dropped, before the next one is tried.
pub(crate) const OUTAGE_PAUSE: Duration = Duration::from_secs(5);

/// The running span exporter.
#[derive(Debug)]
pub(crate) struct SpanExport {
    processor: BatchSpanProcessor,
    capacity: usize,
    shared: Arc<Shared>,
}

/// What the exporter's side and the processor's thread share.
#[derive(Debug)]
struct Shared {
    /// Spans handed to the processor and not yet exported or dropped.
    held: AtomicUsize,
    /// Set by shutdown: what is left is sent once, without pausing.
    closing: AtomicBool,
    failing: AtomicBool,
    stats: Arc<Stats>,
}

/// The OTLP exporter, counting what the processor hands it.
#[derive(Debug)]
struct Counted {
    otlp: Arc<opentelemetry_otlp::SpanExporter>,
    /// The agent's runtime, where the clients' connections live.
    runtime: tokio::runtime::Handle,
    endpoint: String,
    shared: Arc<Shared>,
}

impl SpanExporter for Counted {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let otlp = self.otlp.clone();
        let result = match self
            .runtime
            .spawn(async move { otlp.export(batch).await })
            .await
        {
            Ok(result) => result,
            Err(cancelled) => Err(OTelSdkError::InternalFailure(cancelled.to_string())),
        };
        let (shared, endpoint) = (&self.shared, &self.endpoint);
        shared.stats.request("traces", result.is_ok());
        match &result {
            Ok(()) => {
                shared.stats.spans.exported("otlp").inc_by(n as u64);
                if shared.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(endpoint, "OTLP span export recovered");
                }
            }
            Err(e) => {
                shared.stats.spans.dropped("export_failed").inc_by(n as u64);
                if !shared.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(endpoint, error = %e, "OTLP span export failed; batches that fail their retries are dropped and counted, and so are spans beyond the queue");
                } else {
                    tracing::debug!(endpoint, error = %e, "OTLP span export failed again");
                }
            }
        }
        let held = shared.held.fetch_sub(n, Ordering::AcqRel) - n;
        shared.stats.queued.set(held as i64);
        if result.is_err() && !shared.closing.load(Ordering::Relaxed) {
            // The processor's thread: no request until then, while spans beyond the queue
            // are counted as dropped.
            std::thread::sleep(OUTAGE_PAUSE);
        }
        // Handled: counted, logged once per outage (the processor would log every batch).
        Ok(())
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.otlp.shutdown_with_timeout(timeout)
    }
}

fn build_exporter(
    settings: &SignalSettings,
    resource: &Resource,
) -> Result<opentelemetry_otlp::SpanExporter, ExportError> {
    let retry = RetryPolicy::default()
        .with_max_retries(RETRIES)
        .with_initial_delay(INITIAL_BACKOFF)
        .with_max_delay(MAX_BACKOFF);
    let built = match settings.protocol {
        Protocol::Grpc => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(settings.endpoint.clone())
                .with_timeout(settings.timeout)
                .with_metadata(MetadataMap::from_headers(settings.headers.clone()))
                .with_retry_policy(retry);
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
            let client = super::tls::http_client(settings)?;
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(client)
                .with_retry_policy(retry);
            if settings.gzip {
                builder = builder.with_compression(opentelemetry_otlp::Compression::Gzip);
            }
            builder
                .with_endpoint(settings.endpoint.clone())
                .with_protocol(if settings.protocol == Protocol::HttpJson {
                    opentelemetry_otlp::Protocol::HttpJson
                } else {
                    opentelemetry_otlp::Protocol::HttpBinary
                })
                .with_timeout(settings.timeout)
                .build()
        }
    };
    let mut exporter = built.map_err(|source| ExportError::Build {
        endpoint: settings.endpoint.clone(),
        source,
    })?;
    exporter.set_resource(resource);
    Ok(exporter)
}

impl SpanExport {
    /// Builds the exporter and starts the export thread. Must be called on the agent's runtime,
    /// where every export runs.
    pub(crate) fn start(
        settings: SignalSettings,
        resource: Resource,
        capacity: usize,
        max_batch: usize,
        schedule_delay: Duration,
        stats: Arc<Stats>,
    ) -> Result<Self, ExportError> {
        let otlp = build_exporter(&settings, &resource)?;
        let shared = Arc::new(Shared {
            held: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            failing: AtomicBool::new(false),
            stats,
        });
        let exporter = Counted {
            otlp: Arc::new(otlp),
            runtime: tokio::runtime::Handle::current(),
            endpoint: settings.endpoint.clone(),
            shared: shared.clone(),
        };
        let capacity = capacity.max(1);
        let config = BatchConfigBuilder::default()
            .with_max_queue_size(capacity)
            .with_max_export_batch_size(max_batch.max(1))
            .with_scheduled_delay(schedule_delay)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(config)
            .build();
        tracing::info!(endpoint = %settings.endpoint, protocol = settings.protocol.as_str(), tls = settings.tls.is_some(), "exporting slow-call spans over OTLP");
        Ok(Self {
            processor,
            capacity,
            shared,
        })
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
    /// Queues the call's span; when the queue is full it is dropped and counted.
    fn deliver(
        &self,
        call: &Arc<crate::spans::event::SlowCall>,
        _series_labels: &[(&'static str, String)],
    ) {
        let stats = &self.shared.stats;
        let admitted = self
            .shared
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.capacity).then_some(n + 1)
            });
        match admitted {
            Ok(before) => {
                stats.queued.set(before as i64 + 1);
                self.processor.on_end(call.to_span_data(&SCOPE));
            }
            Err(_) => {
                stats.spans.dropped("export_queue_full").inc();
            }
        }
    }

    /// Sends what is queued (for at most `grace`) and stops the thread.
    fn shutdown(&self, grace: Duration) {
        self.shared.closing.store(true, Ordering::Relaxed);
        if self.processor.shutdown_with_timeout(grace).is_err() {
            tracing::warn!("span export still busy after {grace:?}; leaving it behind");
        }
    }
}
