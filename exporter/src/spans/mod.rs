//! Slow-call spans: syscalls slower than their threshold, as sampled by the kernel.
//!
//! Probe: `sys_exit` (`ebpf/probes/src/syscalls.rs`, `sample_slow_call`) writes a
//! `SlowCallEvent` to the ring buffer `SLOW_EVENTS` for each call over its `SLOW_THRESHOLDS`
//! entry, within the per-CPU budget of `SLOW_RATE` (drops counted in `PROBE_COUNTERS`, exported
//! as `sysscope_spans_dropped_total{reason="rate_limited"|"ring_buffer_full"}` by the self-metrics collector).
//!
//! Here: [`reader`] drains the ring buffer (tokio `AsyncFd`), [`event`] turns each record into
//! a [`event::SlowCall`] with its context, and each call goes to up to three places: the OTLP
//! span exporter when an endpoint is configured (`crate::exposition::otlp::traces`), the
//! recent-calls store served at [`recent::ROUTE`], and the exemplar store that links latency
//! buckets to spans ([`exemplars`]).
//! Metrics: `sysscope_spans_exported_total{destination="otlp"|"local"}` (local only without an
//! OTLP endpoint; the recent calls are served either way),
//! `sysscope_spans_dropped_total{reason="export_queue_full"|"export_failed"|"malformed"}`.

pub(crate) mod args;
pub(crate) mod clock;
pub(crate) mod event;
pub(crate) mod exemplars;
pub(crate) mod reader;
pub(crate) mod recent;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::Resource;

use crate::{
    config::Config,
    exposition::{
        http::Handler,
        otlp::{
            config::Settings,
            traces::{SpanExport, TraceExportError},
            Stats,
        },
        scrape::Annotator,
    },
    kernel::slow_events::SlowEvents,
    metadata::SharedLabeler,
    util::error::Chain,
};

/// Series remembered for exemplars at most.
const EXEMPLAR_SERIES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum SpanError {
    #[error("watching the slow-call ring buffer")]
    Watch(#[source] std::io::Error),
    #[error(transparent)]
    Export(#[from] TraceExportError),
}

/// Where each slow call goes.
#[derive(Debug)]
pub struct Sinks {
    pub(crate) recent: recent::RecentCalls,
    pub(crate) exemplars: exemplars::ExemplarStore,
    pub otlp: Option<SpanExport>,
    pub(crate) stats: Arc<Stats>,
    scope: InstrumentationScope,
}

impl Sinks {
    /// Hands one slow call to every destination.
    pub(crate) fn deliver(&self, enriched: event::Enriched) {
        let call = Arc::new(enriched.call);
        self.exemplars.record(&enriched.series_labels, &call);
        if let Some(otlp) = &self.otlp {
            otlp.push(call.to_span_data(&self.scope));
        }
        // The recent calls are always kept, but they are the destination (and counted) only
        // without an OTLP endpoint, so `exported` never counts one span twice.
        if self.recent.push(call) && self.otlp.is_none() {
            self.stats.exported("local", 1);
        }
    }
}

/// The running slow-call pipeline.
#[derive(Debug)]
pub struct SlowCalls {
    sinks: Arc<Sinks>,
    enabled: bool,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl SlowCalls {
    /// Starts reading `SLOW_EVENTS` (`ring`, taken from the probes at start-up; `None` when
    /// slow calls are off or the probes did not load) and exporting as `settings` say.
    /// Must be called inside the agent's tokio runtime.
    pub fn start(
        config: &Config,
        settings: &Settings,
        labeler: SharedLabeler,
        ring: Option<SlowEvents>,
        stats: Arc<Stats>,
    ) -> Result<Self, SpanError> {
        let runtime = tokio::runtime::Handle::try_current().ok();
        let enabled = config.slow_calls.enabled && ring.is_some();
        let otlp = match (&settings.traces, enabled) {
            (Some(traces), true) => Some(SpanExport::start(
                traces.clone(),
                resource(settings),
                config.slow_calls.export_queue,
                settings.max_batch,
                settings.schedule_delay,
                stats.clone(),
                runtime.clone(),
            )?),
            _ => None,
        };
        if otlp.is_none() && config.slow_calls.recent_capacity > 0 {
            stats.enable_local();
        }
        let sinks = Arc::new(Sinks {
            recent: recent::RecentCalls::new(config.slow_calls.recent_capacity),
            exemplars: exemplars::ExemplarStore::new(EXEMPLAR_SERIES),
            otlp,
            stats: stats.clone(),
            scope: InstrumentationScope::builder("sysscope")
                .with_version(crate::build_info::VERSION)
                .build(),
        });
        // A ring buffer that cannot be watched costs the spans, not the agent: log and go on.
        let reader = match (ring, runtime) {
            (Some(ring), Some(rt)) if enabled => {
                let enricher = event::Enricher::new(labeler, config.slow_calls.resolve_file_paths);
                let _guard = rt.enter();
                let started = reader::spawn(
                    ring,
                    Arc::new(Mutex::new(enricher)),
                    sinks.clone(),
                    stats.span_counters(),
                )
                .map_err(SpanError::Watch);
                match started {
                    Ok(task) => Some(task),
                    Err(e) => {
                        tracing::error!(error = %Chain(&e), "slow-call spans unavailable");
                        None
                    }
                }
            }
            _ => None,
        };
        Ok(Self {
            sinks,
            enabled: reader.is_some(),
            reader,
        })
    }

    /// Self-metric source for the agent (`sysscope_spans_*`).
    pub fn sinks(&self) -> &Arc<Sinks> {
        &self.sinks
    }

    /// The JSON route of the recent slow calls.
    pub fn route(&self) -> (String, Handler) {
        let sinks = self.sinks.clone();
        let enabled = self.enabled;
        let handler: Handler =
            Arc::new(move || ("application/json", sinks.recent.to_json(enabled)));
        (recent::ROUTE.to_string(), handler)
    }

    /// Adds exemplars to the OpenMetrics exposition.
    pub fn annotator(&self) -> Annotator {
        let sinks = self.sinks.clone();
        Arc::new(move |om: &mut String| sinks.exemplars.annotate(om))
    }

    /// Stops reading and sends what is queued, for at most `grace`.
    pub fn shutdown(self, grace: Duration) {
        if let Some(r) = &self.reader {
            r.abort();
        }
        if let Some(otlp) = &self.sinks.otlp {
            otlp.shutdown(grace);
        }
    }
}

/// The OTLP resource of spans: the same attributes as the metrics push.
pub(crate) fn resource(settings: &Settings) -> Resource {
    Resource::builder_empty()
        .with_attributes(
            settings
                .resource
                .iter()
                .map(|(k, v)| opentelemetry::KeyValue::new(k.clone(), v.clone())),
        )
        .build()
}
