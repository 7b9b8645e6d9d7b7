//! sysscope's own metrics, collected like any other source: `sysscope_build_info`,
//! `sysscope_collector_up`, `sysscope_probe_*` (attached programs, the kernel's run-time
//! statistics of each, what the probes could not record), `sysscope_map_*` (occupancy, kernel
//! memory, insert failures), `sysscope_syscalls_folded_total`, `sysscope_spans_*`,
//! `sysscope_dropped_series_total` and `sysscope_scrape_duration_seconds`, then the families
//! other parts of the agent register here (OTLP requests, configuration reloads).
//!
//! Reads, through the kernel layer: `PROBE_COUNTERS` (`kernel::counters`), the programs' run
//! statistics and the fdinfo of every map sysscope holds. What the other collectors report
//! about themselves ([`Health`]) and whether they are up is handed over by the agent before
//! each refresh ([`SelfMetrics::observe`]): this collector summarizes the others, so it is
//! refreshed after them and is never itself reported down.
//!
//! Push-style counters are typed `prometheus_client` handles registered once: the span
//! pipeline increments [`SpanCounters`] where a span is exported or dropped, and the kernel's
//! drop reasons (`rate_limited`, `ring_buffer_full`) are added to the same family here.

use std::time::Duration;

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeCounterValue, EncodeMetric, NoLabelSet},
    metrics::{counter::Counter, family::Family, MetricType},
};
use sysscope_abi::{counters, maps};

use super::{CollectorError, Health, MapUsage};
use crate::{
    build_info::{REVISION, VERSION},
    kernel::{counters::ProbeCounters, Probes, ProgramStats},
};

/// The label set of a one-label family (`reason`, `destination`, ...).
pub(crate) type OneLabel = [(&'static str, &'static str); 1];

/// Where each probe drop counter is reported: (index, metric, label value).
const COUNTER_METRICS: &[(u32, CounterKind, &str)] = &[
    (
        counters::SYSCALL_STATS_FULL,
        CounterKind::MapFull,
        maps::SYSCALL_STATS,
    ),
    (
        counters::SYSCALL_ERRORS_FULL,
        CounterKind::MapFull,
        maps::SYSCALL_ERRORS,
    ),
    (
        counters::SYSCALL_THREADS_FULL,
        CounterKind::MapFull,
        maps::SYSCALL_THREADS,
    ),
    (
        counters::PROCESS_EXITS_FULL,
        CounterKind::MapFull,
        maps::PROCESS_EXITS,
    ),
    (
        counters::BLOCK_INFLIGHT_FULL,
        CounterKind::MapFull,
        maps::BLOCK_INFLIGHT,
    ),
    (
        counters::BLOCK_STATS_FULL,
        CounterKind::MapFull,
        maps::BLOCK_STATS,
    ),
    (
        counters::BLOCK_LATENCY_FULL,
        CounterKind::MapFull,
        maps::BLOCK_LATENCY,
    ),
    (
        counters::SLOW_RINGBUF_FULL,
        CounterKind::MapFull,
        maps::SLOW_EVENTS,
    ),
    (
        counters::TRACE_RINGBUF_FULL,
        CounterKind::MapFull,
        maps::TRACE_EVENTS,
    ),
    (
        counters::TRACE_STATE_RINGBUF_FULL,
        CounterKind::MapFull,
        maps::OFFCPU_EVENTS,
    ),
    (
        counters::SYSCALL_EXIT_WITHOUT_ENTER,
        CounterKind::Missed,
        "syscall_exit_without_enter",
    ),
    (
        counters::BLOCK_COMPLETE_WITHOUT_ISSUE,
        CounterKind::Missed,
        "block_complete_without_issue",
    ),
    (
        counters::SLOW_RATE_LIMITED,
        CounterKind::SpanDrop,
        "rate_limited",
    ),
    (
        counters::SLOW_RINGBUF_FULL,
        CounterKind::SpanDrop,
        "ring_buffer_full",
    ),
    (
        counters::SYSCALL_FOLDED,
        CounterKind::Folded,
        "cgroup_shared_key",
    ),
    (
        counters::SYSCALL_INVALID_NR,
        CounterKind::Folded,
        "invalid_syscall_number",
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CounterKind {
    MapFull,
    Missed,
    SpanDrop,
    /// Counted in full, but under a coarser key than usual.
    Folded,
}

/// The span pipeline's counters: `sysscope_spans_exported_total{destination}` and
/// `sysscope_spans_dropped_total{reason}`. Clones share their values.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpanCounters {
    exported: Family<OneLabel, Counter>,
    dropped: Family<OneLabel, Counter>,
}

impl SpanCounters {
    /// Spans handed to `destination` (`otlp`, `local`); the series exists from the first call.
    pub(crate) fn exported(&self, destination: &'static str) -> Counter {
        self.exported
            .get_or_create(&[("destination", destination)])
            .clone()
    }

    /// Spans dropped for `reason`; the series exists from the first call.
    pub(crate) fn dropped(&self, reason: &'static str) -> Counter {
        self.dropped.get_or_create(&[("reason", reason)]).clone()
    }

    fn any_exported(&self) -> bool {
        ["otlp", "local"]
            .iter()
            .any(|d| self.exported.get(&[("destination", d)]).is_some())
    }
}

/// One family another part of the agent registered (see [`SelfMetrics::register`]).
struct Registered {
    name: &'static str,
    help: &'static str,
    metric: Box<dyn EncodeMetric + Send + Sync>,
}

/// The collector of sysscope's own metrics.
pub struct SelfMetrics {
    probe_counters: Option<ProbeCounters>,
    /// Last value of each `PROBE_COUNTERS` index (a failed read keeps it: counters never go
    /// back).
    counter_values: Vec<u64>,
    /// The part of `counter_values` already added to `spans.dropped`.
    span_drops_added: Vec<u64>,
    spans: SpanCounters,
    /// Kernel memory per map name, read at the last refresh.
    map_memory: Vec<(String, u64)>,
    collectors_up: Vec<(&'static str, bool)>,
    health: Vec<Health>,
    last_scrape: Duration,
    registered: Vec<Registered>,
}

impl std::fmt::Debug for SelfMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelfMetrics")
            .field("probe_counters", &self.probe_counters.is_some())
            .field("collectors_up", &self.collectors_up)
            .field(
                "registered",
                &self.registered.iter().map(|r| r.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl SelfMetrics {
    /// Takes the loaded probes' `PROBE_COUNTERS` (the probes themselves stay with the agent,
    /// which hands them to [`SelfMetrics::refresh`] and [`SelfMetrics::encode`]).
    pub(crate) fn new(probes: Option<&mut Probes>) -> Self {
        let probe_counters = probes.and_then(|p| ProbeCounters::take(p).ok());
        let spans = SpanCounters::default();
        if probe_counters.is_some() {
            for (_, kind, reason) in COUNTER_METRICS {
                if *kind == CounterKind::SpanDrop {
                    spans.dropped(reason);
                }
            }
        }
        Self {
            probe_counters,
            counter_values: vec![0; counters::COUNT as usize],
            span_drops_added: vec![0; counters::COUNT as usize],
            spans,
            map_memory: Vec::new(),
            collectors_up: Vec::new(),
            health: Vec::new(),
            last_scrape: Duration::ZERO,
            registered: Vec::new(),
        }
    }

    /// The span pipeline's counters (a shared handle).
    pub(crate) fn span_counters(&self) -> SpanCounters {
        self.spans.clone()
    }

    /// Adds a family encoded after the agent's own, in registration order. `metric` is a
    /// typed handle (`Counter`, `Gauge`, `Family`) whose clone the registering part keeps.
    pub(crate) fn register(
        &mut self,
        name: &'static str,
        help: &'static str,
        metric: impl EncodeMetric + Send + Sync + 'static,
    ) {
        self.registered.push(Registered {
            name,
            help,
            metric: Box::new(metric),
        });
    }

    /// What the agent knows about the other collectors, for the next refresh and encode.
    pub(crate) fn observe(
        &mut self,
        collectors_up: Vec<(&'static str, bool)>,
        health: Vec<Health>,
    ) {
        self.collectors_up = collectors_up;
        self.health = health;
    }

    pub(crate) fn set_last_scrape(&mut self, d: Duration) {
        self.last_scrape = d;
    }

    fn encode_counters(
        &self,
        encoder: &mut DescriptorEncoder<'_>,
        kind: CounterKind,
        name: &str,
        help: &str,
        label: &'static str,
        extra: &[(&'static str, u64)],
    ) -> std::fmt::Result {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (value, n) in extra {
            family
                .encode_family(&[(label, *value)])?
                .encode_counter::<NoLabelSet, _, u64>(n, None)?;
        }
        for (index, k, value) in COUNTER_METRICS {
            if *k == kind {
                family
                    .encode_family(&[(label, *value)])?
                    .encode_counter::<NoLabelSet, _, u64>(
                        &self.counter_values[*index as usize],
                        None,
                    )?;
            }
        }
        Ok(())
    }

    fn maps(&self) -> impl Iterator<Item = &MapUsage> {
        self.health.iter().flat_map(|h| &h.maps)
    }
}

/// Name, help and value of one map-occupancy gauge family.
type OccupancyFamily = (&'static str, &'static str, fn(&MapUsage) -> u64);

/// One counter family of the programs' run-time statistics, a series per program.
fn encode_program_counter<N: EncodeCounterValue>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    stats: &[ProgramStats],
    value: impl Fn(&ProgramStats) -> N,
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for s in stats {
        family
            .encode_family(&[("program", s.program.as_str())])?
            .encode_counter::<NoLabelSet, N, f64>(&value(s), None)?;
    }
    Ok(())
}

/// The loaded programs: attached or not, and the kernel's run-time statistics of each.
fn encode_programs(encoder: &mut DescriptorEncoder<'_>, probes: &Probes) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(
        "sysscope_probe_attached",
        "1 if the eBPF program is attached to its tracepoint, 0 if attaching failed.",
        None,
        MetricType::Gauge,
    )?;
    for p in probes.programs() {
        family
            .encode_family(&[("program", p.program.as_str()), ("collector", p.collector)])?
            .encode_gauge(&(p.attached as i64))?;
    }
    encoder
            .encode_descriptor(
                "sysscope_probe_stats_coverage_ratio",
                "Fraction of the time the kernel's BPF run-time statistics were on: 1 makes sysscope_probe_run_seconds_total and sysscope_probe_runs_total exact, below 1 they are extrapolated from samples (collection.probe_stats).",
                None,
                MetricType::Gauge,
            )?
            .encode_gauge(&probes.stats_coverage())?;
    // Read here, not at refresh: background refreshes encode nothing.
    let program_stats = probes.program_stats();
    encode_program_counter(
        encoder,
        "sysscope_probe_run_seconds",
        "CPU time spent in the eBPF program (kernel BPF run-time statistics).",
        &program_stats,
        |s| s.run_time.as_secs_f64(),
    )?;
    encode_program_counter(
        encoder,
        "sysscope_probe_runs",
        "Times the eBPF program ran (kernel BPF run-time statistics).",
        &program_stats,
        |s| s.run_count,
    )?;
    Ok(())
}

/// Not a [`Collector`](super::Collector): the agent refreshes and encodes it last, with the probes it owns.
impl SelfMetrics {
    /// Reads the probes' counters and (with `probes`) the kernel memory of every map.
    pub(crate) fn refresh(&mut self, probes: Option<&Probes>) -> Result<(), CollectorError> {
        if probes.is_some() {
            self.map_memory = crate::kernel::map_memory();
        }
        if let Some(counters) = &self.probe_counters {
            for (i, value) in self.counter_values.iter_mut().enumerate() {
                if let Some(sum) = counters.get(i as u32) {
                    *value = sum;
                }
            }
            for (index, kind, reason) in COUNTER_METRICS {
                if *kind == CounterKind::SpanDrop {
                    let i = *index as usize;
                    let new = self.counter_values[i].saturating_sub(self.span_drops_added[i]);
                    self.spans.dropped(reason).inc_by(new);
                    self.span_drops_added[i] += new;
                }
            }
        }
        Ok(())
    }

    /// The kernel maps: occupancy, kernel memory, and what the probes could not store.
    fn encode_maps(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let occupancy: [OccupancyFamily; 2] = [
            (
                "sysscope_map_entries",
                "Entries in the kernel map at the last read.",
                |m| m.entries,
            ),
            (
                "sysscope_map_capacity_entries",
                "Maximum entries of the kernel map.",
                |m| m.capacity,
            ),
        ];
        for (name, help, value) in occupancy {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for m in self.maps() {
                family
                    .encode_family(&[("map", m.map)])?
                    .encode_gauge(&(value(m) as i64))?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_map_memory_bytes",
                "Kernel memory of the eBPF map, as the kernel accounts it (memlock in the map's fdinfo).",
                None,
                MetricType::Gauge,
            )?;
            for (map, bytes) in &self.map_memory {
                family
                    .encode_family(&[("map", map.as_str())])?
                    .encode_gauge(&(*bytes as i64))?;
            }
        }
        if self.probe_counters.is_some() {
            self.encode_counters(encoder, CounterKind::MapFull, "sysscope_map_insert_failures", "Records the probes could not store because the map was full (the data is lost, the loss is counted).", "map", &[])?;
            let missed: Vec<(&'static str, u64)> = self
                .health
                .iter()
                .flat_map(|h| h.missed_events.iter().copied())
                .collect();
            self.encode_counters(encoder, CounterKind::Missed, "sysscope_probe_missed_events", "Events the probes saw only half of (e.g. a syscall that returned without a recorded entry).", "reason", &missed)?;
            self.encode_counters(encoder, CounterKind::Folded, "sysscope_syscalls_folded", "Syscalls counted under a coarser key: their cgroup's comm=\"other\" (the cgroup held limits.max_syscall_entries_per_cgroup slots, or none was free) or syscall=\"invalid\" (a number outside the syscall table). Nothing is lost.", "reason", &[])?;
        }
        Ok(())
    }

    /// Encodes sysscope's own families; those of the programs only with `probes`.
    pub(crate) fn encode(
        &self,
        encoder: &mut DescriptorEncoder<'_>,
        probes: Option<&Probes>,
    ) -> std::fmt::Result {
        encoder
            .encode_descriptor(
                "sysscope_build_info",
                "sysscope's version; the value is always 1.",
                None,
                MetricType::Gauge,
            )?
            .encode_family(&[("version", VERSION), ("revision", REVISION)])?
            .encode_gauge(&1i64)?;

        {
            let mut family = encoder.encode_descriptor(
                "sysscope_collector_up",
                "1 if the collector is running and its last refresh succeeded, 0 otherwise.",
                None,
                MetricType::Gauge,
            )?;
            for (name, up) in &self.collectors_up {
                family
                    .encode_family(&[("collector", *name)])?
                    .encode_gauge(&(*up as i64))?;
            }
        }

        if let Some(probes) = probes {
            encode_programs(encoder, probes)?;
        }
        self.encode_maps(encoder)?;
        self.spans.dropped.encode(encoder.encode_descriptor(
            "sysscope_spans_dropped",
            "Slow-call samples not exported, by reason.",
            None,
            MetricType::Counter,
        )?)?;
        if self.spans.any_exported() {
            self.spans.exported.encode(encoder.encode_descriptor(
                "sysscope_spans_exported",
                "Slow-call spans handed to their destination, by destination.",
                None,
                MetricType::Counter,
            )?)?;
        }
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_dropped_series",
                "Label sets folded into an \"other\" series by the cardinality budget (limits.max_series).",
                None,
                MetricType::Counter,
            )?;
            for (fam, n) in self.health.iter().flat_map(|h| &h.folded_series) {
                family
                    .encode_family(&[("family", *fam)])?
                    .encode_counter::<NoLabelSet, _, u64>(n, None)?;
            }
        }
        for r in &self.registered {
            let family = encoder.encode_descriptor(r.name, r.help, None, r.metric.metric_type())?;
            r.metric.encode(family)?;
        }
        encoder
            .encode_descriptor(
                "sysscope_scrape_duration_seconds",
                "Time the previous scrape took to read the maps and encode the metrics.",
                None,
                MetricType::Gauge,
            )?
            .encode_gauge(&self.last_scrape.as_secs_f64())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn encode(m: SelfMetrics) -> String {
        #[derive(Debug)]
        struct View(Arc<Mutex<SelfMetrics>>);
        impl prometheus_client::collector::Collector for View {
            fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
                self.0.lock().unwrap().encode(&mut e, None)
            }
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(View(Arc::new(Mutex::new(m)))));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    fn families(text: &str) -> Vec<&str> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect()
    }

    #[test]
    fn span_counters_from_several_writers_land_in_one_family() {
        let mut m = SelfMetrics::new(None);
        let spans = m.span_counters();
        let other_writer = spans.clone();
        spans.dropped("malformed").inc();
        other_writer.dropped("malformed").inc_by(2);
        other_writer.exported("local").inc_by(5);
        m.observe(vec![("syscalls", true), ("gpu", false)], Vec::new());
        m.refresh(None).unwrap();
        let text = encode(m);
        assert!(
            text.contains("sysscope_spans_dropped_total{reason=\"malformed\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("sysscope_spans_exported_total{destination=\"local\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("sysscope_collector_up{collector=\"syscalls\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("sysscope_collector_up{collector=\"gpu\"} 0\n"),
            "{text}"
        );
        // Without probes there is nothing of theirs to report.
        assert!(!text.contains("sysscope_probe_attached"), "{text}");
        assert!(!text.contains("sysscope_map_insert_failures"), "{text}");
    }

    #[test]
    fn no_exported_family_without_a_destination() {
        let m = SelfMetrics::new(None);
        m.span_counters().dropped("malformed");
        let text = encode(m);
        assert!(!text.contains("sysscope_spans_exported"), "{text}");
        assert!(
            text.contains("sysscope_spans_dropped_total{reason=\"malformed\"} 0\n"),
            "{text}"
        );
    }

    #[test]
    fn registered_families_follow_the_agents_own_in_order() {
        let mut m = SelfMetrics::new(None);
        let requests = Family::<OneLabel, Counter>::default();
        requests.get_or_create(&[("result", "success")]).inc_by(4);
        m.register("sysscope_test_second", "Second.", Counter::<u64>::default());
        m.register("sysscope_test_first", "First.", requests.clone());
        // The registering part keeps its handle and counts after registration.
        requests.get_or_create(&[("result", "success")]).inc();
        m.observe(
            Vec::new(),
            vec![Health {
                maps: vec![MapUsage {
                    map: "M",
                    entries: 3,
                    capacity: 8,
                }],
                folded_series: vec![("syscalls", 2)],
                missed_events: Vec::new(),
            }],
        );
        let text = encode(m);
        assert!(
            text.contains("sysscope_test_first_total{result=\"success\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("sysscope_map_entries{map=\"M\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("sysscope_map_capacity_entries{map=\"M\"} 8\n"),
            "{text}"
        );
        assert!(
            text.contains("sysscope_dropped_series_total{family=\"syscalls\"} 2\n"),
            "{text}"
        );
        let order = families(&text);
        let at = |name: &str| order.iter().position(|f| *f == name).unwrap();
        assert!(at("sysscope_dropped_series") < at("sysscope_test_second"));
        assert!(at("sysscope_test_second") < at("sysscope_test_first"));
        assert_eq!(order.last(), Some(&"sysscope_scrape_duration_seconds"));
        assert_eq!(order.first(), Some(&"sysscope_build_info"));
    }
}
