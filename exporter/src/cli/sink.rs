//! Where measured events go: the [`EventSink`] every tool implements (summary, trace,
//! diagnose, top) and the values handed to it. A leaf of `cli`: the event and block streams
//! both feed sinks, so the sink types live apart from either stream.

use std::collections::BTreeMap;

use sysscope_abi::{BlockTraceEvent, OffCpuEvent, TraceEvent};

/// Cumulative (bytes, requests) of the target per (kernel dev_t, op), since the probes
/// attached.
pub(crate) type BlockTotals = BTreeMap<(u32, u8), (u64, u64)>;

/// Receives trace records as they arrive.
pub(crate) trait EventSink {
    /// The measurement started at `start_ns` (CLOCK_MONOTONIC).
    fn start(&mut self, _start_ns: u64) {}
    fn event(&mut self, event: &TraceEvent);
    /// Called every loop iteration (about ten times a second), e.g. to sample counters.
    fn tick(&mut self, _now_ns: u64) {}
    /// One completed block request of the target (`sysscope trace` with block tracks).
    fn block_event(&mut self, _event: &BlockTraceEvent) {}
    /// The target's cumulative block I/O so far, read before every [`EventSink::tick`].
    fn block_totals(&mut self, _totals: &BlockTotals) {}
    /// One stretch a call of the target spent off its CPU (`sysscope trace`, when calls'
    /// time is split by state); it lies within that call's [`EventSink::event`].
    fn off_cpu(&mut self, _event: &OffCpuEvent) {}
}

/// A sink that ignores everything (runs without a stream).
#[derive(Debug, Default)]
pub(crate) struct NoEvents;

impl EventSink for NoEvents {
    fn event(&mut self, _event: &TraceEvent) {}
}
