//! The agent: owns the loaded probes and the running collectors, refreshes them, and encodes
//! their metric families plus sysscope's own (`sysscope_build_info`, `sysscope_collector_up`,
//! `sysscope_probe_*`, `sysscope_map_*`, `sysscope_dropped_series_total`, ...).
//! Maps read here, through the kernel layer: `PROBE_COUNTERS` (what the probes could not
//! record, `kernel::counters`); the kernel memory of every map sysscope holds comes from their
//! fdinfo (`sysscope_map_memory_bytes`).

use std::{borrow::Cow, time::Duration};

use prometheus_client::{
    encoding::{DescriptorEncoder, EncodeCounterValue, NoLabelSet},
    metrics::MetricType,
};
use sysscope_abi::{counters, maps};

use crate::{
    build_info::{REVISION, VERSION},
    collectors::{Collector, CollectorError, Health},
    kernel::{counters::ProbeCounters, Probes, ProgramStats},
    util::error::Chain,
};

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

struct Slot {
    name: &'static str,
    collector: Option<Box<dyn Collector>>,
    up: bool,
    /// Failed at start: its collector, if any, only tells why (never refreshed, always down).
    failed: bool,
}

pub struct Agent {
    slots: Vec<Slot>,
    probes: Option<Probes>,
    probe_counters: Option<ProbeCounters>,
    counter_values: Vec<u64>,
    extra_health: Vec<Box<dyn Fn() -> Health + Send>>,
    extra_families: Vec<ExtraFamilies>,
    last_scrape: Duration,
    /// Kernel memory per map name, read at the last refresh.
    map_memory: Vec<(String, u64)>,
}

/// Name, help and value of one map-occupancy gauge family.
type OccupancyFamily = (
    &'static str,
    &'static str,
    fn(&crate::collectors::MapUsage) -> u64,
);

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

/// Encodes self-metric families of a source that is not a collector.
pub type ExtraFamilies = Box<dyn Fn(&mut DescriptorEncoder<'_>) -> std::fmt::Result + Send>;

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field(
                "collectors",
                &self
                    .slots
                    .iter()
                    .map(|s| (s.name, s.up))
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Agent {
    pub fn new(mut probes: Option<Probes>) -> Self {
        let probe_counters = probes.as_mut().and_then(|p| ProbeCounters::take(p).ok());
        Self {
            slots: Vec::new(),
            probes,
            probe_counters,
            counter_values: vec![0; counters::COUNT as usize],
            extra_health: Vec::new(),
            extra_families: Vec::new(),
            last_scrape: Duration::ZERO,
            map_memory: Vec::new(),
        }
    }

    /// Adds a running collector.
    pub fn add(&mut self, collector: Box<dyn Collector>) {
        self.slots.push(Slot {
            name: collector.name(),
            collector: Some(collector),
            up: true,
            failed: false,
        });
    }

    /// Records a collector that could not start: exported as down.
    pub fn add_failed(&mut self, name: &'static str) {
        self.slots.push(Slot {
            name,
            collector: None,
            up: false,
            failed: true,
        });
    }

    /// Records a collector that could not start but still exports what it knows about why
    /// (e.g. the GPU collector's count of GPUs on the PCI bus): exported as down, encoded,
    /// never refreshed.
    pub fn add_failed_with(&mut self, collector: Box<dyn Collector>) {
        self.slots.push(Slot {
            name: collector.name(),
            collector: Some(collector),
            up: false,
            failed: true,
        });
    }

    /// Adds a source of self-health that is not a collector (e.g. the span exporter).
    pub fn add_health(&mut self, source: Box<dyn Fn() -> Health + Send>) {
        self.extra_health.push(source);
    }

    /// Adds self-metric families of a source that is not a collector (e.g. OTLP export).
    pub fn add_families(&mut self, source: ExtraFamilies) {
        self.extra_families.push(source);
    }

    pub fn probes(&self) -> Option<&Probes> {
        self.probes.as_ref()
    }

    pub fn collectors_up(&self) -> Vec<(&'static str, bool)> {
        self.slots.iter().map(|s| (s.name, s.up)).collect()
    }

    /// Refreshes every collector; a failure marks that collector down until it succeeds again.
    pub fn refresh(&mut self) {
        for slot in &mut self.slots {
            if slot.failed {
                continue;
            }
            if let Some(c) = slot.collector.as_mut() {
                match c.refresh() {
                    Ok(()) => slot.up = true,
                    Err(e) => {
                        if slot.up {
                            tracing::warn!(collector = slot.name, error = %Chain(&e), "collector refresh failed");
                        }
                        slot.up = false;
                    }
                }
            }
        }
        if self.probes.is_some() {
            self.map_memory = crate::kernel::map_memory();
        }
        if let Some(counters) = &self.probe_counters {
            for (i, value) in self.counter_values.iter_mut().enumerate() {
                // A failed read keeps the last value: counters never go back.
                if let Some(sum) = counters.get(i as u32) {
                    *value = sum;
                }
            }
        }
    }

    /// Hands a reloaded configuration to every running collector; the first failure is
    /// returned with the collector's name (the others still got it).
    pub fn reconfigure(
        &mut self,
        config: &crate::config::Config,
    ) -> Result<(), (&'static str, CollectorError)> {
        let mut first_error = None;
        for slot in &mut self.slots {
            if slot.failed {
                continue;
            }
            if let Some(c) = slot.collector.as_mut() {
                if let Err(e) = c.reconfigure(config) {
                    first_error.get_or_insert((slot.name, e));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    pub fn set_last_scrape(&mut self, d: Duration) {
        self.last_scrape = d;
    }

    /// Encodes every collector's families, then the self-metrics.
    pub fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        for slot in &self.slots {
            if let Some(c) = &slot.collector {
                c.encode(encoder)?;
            }
        }
        self.encode_self(encoder)
    }

    fn encode_self(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let mut health: Vec<Health> = self
            .slots
            .iter()
            .filter_map(|s| s.collector.as_ref().map(|c| c.health()))
            .collect();
        health.extend(self.extra_health.iter().map(|f| f()));

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
            for slot in &self.slots {
                family
                    .encode_family(&[("collector", slot.name)])?
                    .encode_gauge(&(slot.up as i64))?;
            }
        }

        if let Some(probes) = &self.probes {
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
            let stats = probes.program_stats();
            encoder
                .encode_descriptor(
                    "sysscope_probe_stats_coverage_ratio",
                    "Fraction of the time the kernel's BPF run-time statistics were on: 1 makes sysscope_probe_run_seconds_total and sysscope_probe_runs_total exact, below 1 they are extrapolated from samples (collection.probe_stats).",
                    None,
                    MetricType::Gauge,
                )?
                .encode_gauge(&probes.stats_coverage())?;
            encode_program_counter(
                encoder,
                "sysscope_probe_run_seconds",
                "CPU time spent in the eBPF program (kernel BPF run-time statistics).",
                &stats,
                |s| s.run_time.as_secs_f64(),
            )?;
            encode_program_counter(
                encoder,
                "sysscope_probe_runs",
                "Times the eBPF program ran (kernel BPF run-time statistics).",
                &stats,
                |s| s.run_count,
            )?;
        }

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
            for m in health.iter().flat_map(|h| &h.maps) {
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
            let missed: Vec<(&'static str, u64)> = health
                .iter()
                .flat_map(|h| h.missed_events.iter().copied())
                .collect();
            self.encode_counters(encoder, CounterKind::Missed, "sysscope_probe_missed_events", "Events the probes saw only half of (e.g. a syscall that returned without a recorded entry).", "reason", &missed)?;
            self.encode_counters(encoder, CounterKind::Folded, "sysscope_syscalls_folded", "Syscalls counted under a coarser key: their cgroup's comm=\"other\" (the cgroup held limits.max_syscall_entries_per_cgroup slots, or none was free) or syscall=\"invalid\" (a number outside the syscall table). Nothing is lost.", "reason", &[])?;
        }
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_spans_dropped",
                "Slow-call samples not exported, by reason.",
                None,
                MetricType::Counter,
            )?;
            if self.probe_counters.is_some() {
                for (index, kind, reason) in COUNTER_METRICS {
                    if *kind == CounterKind::SpanDrop {
                        family
                            .encode_family(&[("reason", *reason)])?
                            .encode_counter::<NoLabelSet, _, u64>(
                                &self.counter_values[*index as usize],
                                None,
                            )?;
                    }
                }
            }
            for (reason, n) in health.iter().flat_map(|h| &h.spans_dropped) {
                family
                    .encode_family(&[("reason", *reason)])?
                    .encode_counter::<NoLabelSet, _, u64>(n, None)?;
            }
        }
        let exported: Vec<(Cow<'_, str>, u64)> = health
            .iter()
            .flat_map(|h| &h.spans_exported)
            .map(|(dest, n)| (Cow::Borrowed(*dest), *n))
            .collect();
        if !exported.is_empty() {
            let mut family = encoder.encode_descriptor(
                "sysscope_spans_exported",
                "Slow-call spans handed to their destination, by destination.",
                None,
                MetricType::Counter,
            )?;
            for (dest, n) in &exported {
                family
                    .encode_family(&[("destination", dest.as_ref())])?
                    .encode_counter::<NoLabelSet, _, u64>(n, None)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_dropped_series",
                "Label sets folded into an \"other\" series by the cardinality budget (limits.max_series).",
                None,
                MetricType::Counter,
            )?;
            for (fam, n) in health.iter().flat_map(|h| &h.folded_series) {
                family
                    .encode_family(&[("family", *fam)])?
                    .encode_counter::<NoLabelSet, _, u64>(n, None)?;
            }
        }
        for extra in &self.extra_families {
            extra(encoder)?;
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
}
