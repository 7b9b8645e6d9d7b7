//! Slow-call spans: syscalls slower than their threshold, as sampled by the kernel.
//!
//! Probe: `sys_exit` (`ebpf/probes/src/syscalls.rs`, `sample_slow_call`) writes a
//! `SlowCallEvent` to the ring buffer `SLOW_EVENTS` ([`crate::kernel::slow_events`]) for each
//! call over its `SLOW_THRESHOLDS` entry, within the per-CPU budget of `SLOW_RATE` (drops
//! counted in `PROBE_COUNTERS`, exported as
//! `sysscope_spans_dropped_total{reason="rate_limited"|"ring_buffer_full"}` by the self-metrics
//! collector).
//!
//! Here is the source: [`reader`] drains the ring buffer (tokio `AsyncFd`), [`event`] turns each
//! record into a [`event::SlowCall`] with its context, and each call is handed, in order, to the
//! [`SpanSink`]s the composition root gives [`SlowCalls::start`]: the exemplar store that links
//! latency buckets to spans ([`exemplars`]), the OTLP span exporter when an endpoint is
//! configured (`crate::exposition::otlp::traces`), and the recent-calls store served at
//! [`recent::ROUTE`]. Metrics: `sysscope_spans_exported_total{destination="otlp"|"local"}`
//! (local only without an OTLP endpoint; the recent calls are served either way),
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

use crate::{
    collectors::self_metrics::SpanCounters, config::Config, kernel::slow_events::SlowEvents,
    metadata::SharedLabeler, series::LabelControl, util::error::Chain,
};

/// Series remembered for exemplars at most.
pub(crate) const EXEMPLAR_SERIES: usize = 4096;

/// Where slow calls go: handed to the source by the composition root.
pub(crate) trait SpanSink: Send + Sync {
    /// Takes one slow call, with the labels of the latency series it was counted in.
    fn deliver(&self, call: &Arc<event::SlowCall>, series_labels: &[(&'static str, String)]);

    /// Sends what is queued, for at most `grace`, and stops.
    fn shutdown(&self, _grace: Duration) {}
}

/// The running slow-call source.
pub(crate) struct SlowCalls {
    sinks: Arc<[Arc<dyn SpanSink>]>,
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for SlowCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlowCalls")
            .field("sinks", &self.sinks.len())
            .field("running", &self.running())
            .finish()
    }
}

impl SlowCalls {
    /// Starts reading `SLOW_EVENTS` (`ring`, taken from the probes at start-up; `None` when
    /// slow calls are off or the probes did not load) and handing each call to `sinks`, in
    /// order; `counters` count the records that cannot be decoded. A ring buffer that cannot
    /// be watched costs the spans, not the agent: it is logged and nothing runs. Must be
    /// called inside the agent's tokio runtime.
    pub(crate) fn start(
        config: &Config,
        labeler: SharedLabeler,
        ring: Option<SlowEvents>,
        sinks: Vec<Arc<dyn SpanSink>>,
        counters: SpanCounters,
    ) -> Self {
        let sinks: Arc<[Arc<dyn SpanSink>]> = sinks.into();
        let runtime = tokio::runtime::Handle::try_current().ok();
        let reader = match (ring, runtime) {
            (Some(ring), Some(rt)) if config.slow_calls.enabled => {
                let enricher = event::Enricher::new(labeler, config.slow_calls.resolve_file_paths)
                    .with_label_control(LabelControl::new(&config.labels))
                    .with_time_by_state(config.syscalls.time_by_state);
                let _guard = rt.enter();
                match reader::spawn(
                    ring,
                    Arc::new(Mutex::new(enricher)),
                    sinks.clone(),
                    counters,
                ) {
                    Ok(task) => Some(task),
                    Err(e) => {
                        tracing::error!(error = %Chain(&e), "slow-call spans unavailable");
                        None
                    }
                }
            }
            _ => None,
        };
        Self { sinks, reader }
    }

    /// Whether the ring buffer is being read (what the recent-calls route calls `enabled`).
    pub(crate) fn running(&self) -> bool {
        self.reader.is_some()
    }

    /// Stops reading, and lets every sink send what it queued, for at most `grace` each.
    pub(crate) fn shutdown(self, grace: Duration) {
        if let Some(r) = &self.reader {
            r.abort();
        }
        for sink in self.sinks.iter() {
            sink.shutdown(grace);
        }
    }
}

/// The exemplar store as a sink: each call becomes an exemplar of its latency series.
impl SpanSink for exemplars::ExemplarStore {
    fn deliver(&self, call: &Arc<event::SlowCall>, series_labels: &[(&'static str, String)]) {
        self.record(series_labels, call);
    }
}

/// Hands one enriched call to every sink, in order.
pub(crate) fn deliver(sinks: &[Arc<dyn SpanSink>], enriched: event::Enriched) {
    let call = Arc::new(enriched.call);
    for sink in sinks {
        sink.deliver(&call, &enriched.series_labels);
    }
}
