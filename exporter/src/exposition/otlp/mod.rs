//! OTLP: slow-call spans and the metric catalogue pushed to an OpenTelemetry endpoint.
//!
//! Configured by the standard `OTEL_*` environment variables over the config file's `[otlp]`
//! section (resolved in [`crate::config::otlp`]); with no endpoint set nothing is sent. TLS and
//! the blocking HTTP client are in `tls`. Spans go through `traces` (the SDK's batch span
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

/// A configured header that cannot be sent as it is.
#[derive(Debug, thiserror::Error)]
#[error("OTLP header `{name}`: not a valid {what}")]
pub struct HeaderError {
    name: String,
    what: &'static str,
}

/// Hands each configured header to `put`, which says what it could not take.
fn each_header(
    headers: &[(String, String)],
    mut put: impl FnMut(&str, &str) -> Result<(), &'static str>,
) -> Result<(), HeaderError> {
    for (name, value) in headers {
        put(name, value).map_err(|what| HeaderError {
            name: name.clone(),
            what,
        })?;
    }
    Ok(())
}

/// The configured headers as gRPC metadata (keys lower-cased, as gRPC requires).
pub(crate) fn grpc_metadata(
    headers: &[(String, String)],
) -> Result<tonic::metadata::MetadataMap, HeaderError> {
    let mut metadata = tonic::metadata::MetadataMap::new();
    each_header(headers, |k, v| {
        let key = tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
            .map_err(|_| "gRPC metadata key")?;
        metadata.insert(key, v.parse().map_err(|_| "gRPC metadata value")?);
        Ok(())
    })?;
    Ok(metadata)
}

/// The configured headers as HTTP headers.
pub(crate) fn http_headers(
    headers: &[(String, String)],
) -> Result<reqwest::header::HeaderMap, HeaderError> {
    use reqwest::header::{HeaderName, HeaderValue};
    let mut map = reqwest::header::HeaderMap::new();
    each_header(headers, |k, v| {
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| "HTTP header name")?;
        map.insert(
            name,
            HeaderValue::from_str(v).map_err(|_| "HTTP header value")?,
        );
        Ok(())
    })?;
    Ok(map)
}

/// The span pipeline's and the OTLP exporters' counters: typed handles registered once with
/// the self-metrics ([`Stats::register`]) and incremented where the event happens.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    spans: SpanCounters,
    /// Spans waiting in the export queue.
    pub(crate) queued: Gauge,
    requests: Family<[(&'static str, &'static str); 2], Counter>,
}

impl Stats {
    /// Counters writing into the self-metrics' span families, which always carry
    /// `reason="malformed"`; the OTLP and local series appear once those destinations are
    /// enabled ([`Self::enable_otlp_traces`], [`Self::enable_local`]).
    pub fn new(self_metrics: &SelfMetrics) -> Self {
        let stats = Self {
            spans: self_metrics.span_counters(),
            ..Self::default()
        };
        stats.spans.dropped("malformed");
        stats
    }

    /// The span counters, for the span pipeline's reader.
    pub(crate) fn span_counters(&self) -> SpanCounters {
        self.spans.clone()
    }

    /// Spans go to an OTLP endpoint: their export and drop series exist from now on.
    pub(crate) fn enable_otlp_traces(&self) {
        self.spans.exported("otlp");
        self.spans.dropped("export_queue_full");
        self.spans.dropped("export_failed");
    }

    /// Spans are kept for the local endpoint only (no OTLP endpoint).
    pub(crate) fn enable_local(&self) {
        self.spans.exported("local");
    }

    /// `n` spans handed to `destination` (`otlp`, `local`).
    pub(crate) fn exported(&self, destination: &'static str, n: u64) {
        self.spans.exported(destination).inc_by(n);
    }

    /// `n` spans dropped for `reason` (`export_queue_full`, `export_failed`, `malformed`).
    pub(crate) fn dropped(&self, reason: &'static str, n: u64) {
        self.spans.dropped(reason).inc_by(n);
    }

    /// One OTLP export request of `signal` (`traces`, `metrics`) and its outcome.
    pub(crate) fn request(&self, signal: &'static str, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.requests
            .get_or_create(&[("signal", signal), ("result", result)])
            .inc();
    }

    /// Registers the families that are not span counters: the export queue's length
    /// (with OTLP traces) and the OTLP requests by signal and result (with either signal).
    pub fn register(&self, self_metrics: &mut SelfMetrics, traces: bool, metrics: bool) {
        if traces {
            self_metrics.register(
                "sysscope_spans_queued",
                "Slow-call spans waiting in the OTLP export queue (at most slow_calls.export_queue).",
                self.queued.clone(),
            );
        }
        if traces || metrics {
            for (signal, on) in [("traces", traces), ("metrics", metrics)] {
                if on {
                    for result in ["success", "failure"] {
                        let _ = self
                            .requests
                            .get_or_create(&[("signal", signal), ("result", result)]);
                    }
                }
            }
            self_metrics.register(
                "sysscope_otlp_requests",
                "OTLP export requests sent to the configured endpoint, by signal and result.",
                self.requests.clone(),
            );
        }
    }
}
