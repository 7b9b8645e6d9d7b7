//! OTLP: slow-call spans and the metric catalogue pushed to an OpenTelemetry endpoint.
//!
//! Configured by the standard `OTEL_*` environment variables over the config file's `[otlp]`
//! section ([`config`]); with no endpoint set nothing is sent. TLS (system roots or a CA file,
//! optional client certificates) and the shared blocking HTTP client are in `tls`.
//! Spans go through `traces` (opentelemetry-otlp's exporter behind sysscope's own bounded
//! queue, batching and backoff, so every drop is counted).
//! Metrics go through [`metrics`]: the same OpenMetrics exposition Prometheus scrapes is read
//! back (`openmetrics`) and sent as OTLP sums, gauges and explicit-bucket histograms, so both
//! outputs always carry the same numbers and bucket bounds.
//!
//! Self-metrics ([`Stats`]): `sysscope_spans_exported_total{destination}`,
//! `sysscope_spans_dropped_total{reason}` (user-space reasons), `sysscope_spans_queued`,
//! `sysscope_otlp_requests_total{signal,result}`.

pub mod config;
pub mod metrics;
pub(crate) mod openmetrics;
pub(crate) mod tls;
pub(crate) mod traces;

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use prometheus_client::{
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
};

use crate::collectors::Health;

/// Counters shared by the span pipeline, the exporters and the self-metrics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Spans accepted by the OTLP endpoint.
    pub(crate) exported_otlp: AtomicU64,
    /// Spans kept for the local JSON endpoint.
    pub(crate) exported_local: AtomicU64,
    /// Spans refused because the export queue was full (endpoint down or slow).
    pub(crate) dropped_queue_full: AtomicU64,
    /// Spans given up after repeated failed export attempts.
    pub(crate) dropped_export_failed: AtomicU64,
    /// Ring-buffer records too short to decode (never expected).
    pub(crate) dropped_malformed: AtomicU64,
    /// Spans waiting in the export queue (gauge).
    pub queued: AtomicU64,
    pub(crate) trace_requests_ok: AtomicU64,
    pub(crate) trace_requests_failed: AtomicU64,
    pub(crate) metric_requests_ok: AtomicU64,
    pub(crate) metric_requests_failed: AtomicU64,
    /// Which destinations exist: OTLP traces, local.
    pub(crate) otlp_traces: std::sync::atomic::AtomicBool,
    pub local: std::sync::atomic::AtomicBool,
}

impl Stats {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Span counters in the agent's `Health` form (`sysscope_spans_exported_total`,
    /// `sysscope_spans_dropped_total`).
    pub fn health(self: &Arc<Self>) -> Box<dyn Fn() -> Health + Send> {
        let stats = self.clone();
        Box::new(move || {
            let mut exported = Vec::new();
            if stats.otlp_traces.load(Ordering::Relaxed) {
                exported.push(("otlp", Self::get(&stats.exported_otlp)));
            }
            if stats.local.load(Ordering::Relaxed) {
                exported.push(("local", Self::get(&stats.exported_local)));
            }
            let mut dropped = vec![("malformed", Self::get(&stats.dropped_malformed))];
            if stats.otlp_traces.load(Ordering::Relaxed) {
                dropped.push(("export_queue_full", Self::get(&stats.dropped_queue_full)));
                dropped.push(("export_failed", Self::get(&stats.dropped_export_failed)));
            }
            Health {
                spans_dropped: dropped,
                spans_exported: exported,
                ..Health::default()
            }
        })
    }

    /// The families that do not fit `Health`: queue length and OTLP request outcomes.
    pub fn encode(
        &self,
        encoder: &mut DescriptorEncoder<'_>,
        traces: bool,
        metrics: bool,
    ) -> std::fmt::Result {
        if traces {
            encoder
                .encode_descriptor(
                    "sysscope_spans_queued",
                    "Slow-call spans waiting in the OTLP export queue (at most slow_calls.export_queue).",
                    None,
                    MetricType::Gauge,
                )?
                .encode_gauge(&(Self::get(&self.queued) as i64))?;
        }
        if traces || metrics {
            let mut family = encoder.encode_descriptor(
                "sysscope_otlp_requests",
                "OTLP export requests sent to the configured endpoint, by signal and result.",
                None,
                MetricType::Counter,
            )?;
            let mut rows = Vec::new();
            if traces {
                rows.push(("traces", "success", &self.trace_requests_ok));
                rows.push(("traces", "failure", &self.trace_requests_failed));
            }
            if metrics {
                rows.push(("metrics", "success", &self.metric_requests_ok));
                rows.push(("metrics", "failure", &self.metric_requests_failed));
            }
            for (signal, result, counter) in rows {
                family
                    .encode_family(&[("signal", signal), ("result", result)])?
                    .encode_counter::<NoLabelSet, _, u64>(&Self::get(counter), None)?;
            }
        }
        Ok(())
    }
}
