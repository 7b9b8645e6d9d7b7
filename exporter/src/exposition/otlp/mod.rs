//! OTLP: slow-call spans and the metric catalogue pushed to an OpenTelemetry endpoint.
//!
//! Configured by the standard `OTEL_*` environment variables over the config file's `[otlp]`
//! section (resolved in [`crate::config::otlp`]); with no endpoint set nothing is sent. TLS and
//! the HTTP client are in `tls`. Spans go through `traces` (the SDK's batch span
//! processor, with every drop counted), metrics through [`metrics`] (built from the typed
//! families the protobuf exposition serves, so both outputs carry the same numbers).
//!
//! Self-metrics ([`Stats`]): `sysscope_spans_exported_total{destination}`,
//! `sysscope_spans_dropped_total{reason}` (user-space reasons), `sysscope_spans_queued`,
//! `sysscope_otlp_requests_total{signal,result}`.

pub mod metrics;
pub(crate) mod tls;
pub(crate) mod traces;

use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};

use crate::collectors::self_metrics::{SelfMetrics, SpanCounters};

/// Why an OTLP exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("OTLP endpoint `{endpoint}`: {problem}")]
    Endpoint { endpoint: String, problem: String },
    #[error("OTLP span exporter for {endpoint}")]
    Build {
        endpoint: String,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// The span pipeline's and the OTLP exporters' counters: typed handles registered once with
/// the self-metrics ([`Stats::new`]) and incremented where the event happens.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// The span families (`sysscope_spans_exported_total`, `sysscope_spans_dropped_total`).
    pub(crate) spans: SpanCounters,
    /// Spans waiting in the export queue.
    pub(crate) queued: Gauge,
    requests: Family<[(&'static str, &'static str); 2], Counter>,
}

impl Stats {
    /// Counters writing into the self-metrics' span families, which always carry
    /// `reason="malformed"`, with the series of OTLP spans (`traces`) and the OTLP request
    /// families (either signal) registered; the local destination's series appears once
    /// `spans.exported("local")` makes it.
    pub fn new(self_metrics: &mut SelfMetrics, traces: bool, metrics: bool) -> Self {
        let stats = Self {
            spans: self_metrics.span_counters(),
            ..Self::default()
        };
        stats.spans.dropped("malformed");
        if traces {
            stats.spans.exported("otlp");
            stats.spans.dropped("export_queue_full");
            stats.spans.dropped("export_failed");
            self_metrics.register(
                "sysscope_spans_queued",
                "Slow-call spans waiting in the OTLP export queue (at most slow_calls.export_queue).",
                stats.queued.clone(),
            );
        }
        for (signal, on) in [("traces", traces), ("metrics", metrics)] {
            for result in ["success", "failure"].into_iter().filter(|_| on) {
                let _ = stats
                    .requests
                    .get_or_create(&[("signal", signal), ("result", result)]);
            }
        }
        if traces || metrics {
            self_metrics.register(
                "sysscope_otlp_requests",
                "OTLP export requests sent to the configured endpoint, by signal and result.",
                stats.requests.clone(),
            );
        }
        stats
    }

    /// One OTLP export request of `signal` (`traces`, `metrics`) and its outcome.
    pub(crate) fn request(&self, signal: &'static str, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.requests
            .get_or_create(&[("signal", signal), ("result", result)])
            .inc();
    }
}
