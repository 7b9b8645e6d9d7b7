//! The target's block I/O for `sysscope trace`: the block probes (`block_io_start`,
//! `block_rq_issue`, `block_rq_complete`) loaded with the global `BLOCK_TRACE` set, so they
//! record only the requests of the trace target (decided in the kernel when a request is
//! submitted, with the trace filter applied to the task it is charged to, see
//! `ebpf/probes/src/block_io.rs`). Reads `BLOCK_STATS` for exact cumulative totals per
//! (device, op) and drains `TRACE_BLOCK_EVENTS` for the individual requests; requests the
//! ring buffer could not hold are counted in `PROBE_COUNTERS[TRACE_BLOCK_RINGBUF_FULL]`.
//!
//! Optional by design: when the kernel lacks the tracepoints or the request layout, or the
//! config turns block I/O off, the trace runs without these tracks and says why.

use std::os::fd::AsRawFd;

use aya::maps::{HashMap as BpfHashMap, MapData, RingBuf};
use sysscope_abi::{maps, programs, BlockKey, BlockStats, BlockTraceEvent};

use super::{
    sink::{BlockTotals, EventSink},
    CliError,
};
use crate::{
    config::Config,
    kernel::block_io::{self, BlockIoPlan, SUBMIT_TRACEPOINT},
    kernel::Probes,
    metadata::cgroups,
    util::error::Chain,
};

/// The name the block programs are attached under (for detaching them on failure).
const ATTACHED_AS: &str = "trace_block_io";

/// What the kernel offers for block tracks, or why there are none (shown on stderr).
pub(crate) fn plan(config: &Config) -> Result<BlockIoPlan, String> {
    if !config.block_io.enabled {
        return Err("block_io.enabled is false in the config file".into());
    }
    let root = cgroups::v2_mount().map_err(|e| Chain(&e).to_string())?;
    block_io::plan(config, &root).map_err(|e| Chain(&e).to_string())
}

/// The attached block probes and the maps the trace reads.
pub(crate) struct BlockStream {
    ring: RingBuf<MapData>,
    stats: BpfHashMap<MapData, BlockKey, BlockStats>,
    /// Requests received so far.
    pub received: u64,
    totals: BlockTotals,
}

impl std::fmt::Debug for BlockStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockStream")
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

/// Adds one `BLOCK_STATS` entry to `totals`.
pub(crate) fn add_entry(totals: &mut BlockTotals, key: &BlockKey, stats: &BlockStats) {
    let t = totals.entry((key.dev, key.op)).or_default();
    t.0 += stats.bytes;
    t.1 += stats.requests;
}

impl BlockStream {
    /// Takes the maps and attaches the block programs (completion first, as the exporter
    /// does). The object must have been loaded with `plan.probe` and `block_trace` set.
    /// On failure nothing stays attached and the error says what failed.
    pub(crate) fn attach(
        probes: &mut Probes,
        config: &Config,
        plan: &BlockIoPlan,
    ) -> Result<Self, CliError> {
        let result = Self::try_attach(probes, config, plan);
        if result.is_err() {
            probes.detach_collector(ATTACHED_AS);
        }
        result
    }

    fn try_attach(
        probes: &mut Probes,
        config: &Config,
        plan: &BlockIoPlan,
    ) -> Result<Self, CliError> {
        let [issue, complete] = config.block_io.tracepoints.as_slice() else {
            return Err(CliError::Usage(format!(
                "block_io.tracepoints must name the issue and the completion tracepoint (got {:?})",
                config.block_io.tracepoints
            )));
        };
        let stats =
            BpfHashMap::try_from(probes.take_map(maps::BLOCK_STATS)?).map_err(|source| {
                CliError::Map {
                    map: maps::BLOCK_STATS,
                    source,
                }
            })?;
        let ring =
            RingBuf::try_from(probes.take_map(maps::TRACE_BLOCK_EVENTS)?).map_err(|source| {
                CliError::Map {
                    map: maps::TRACE_BLOCK_EVENTS,
                    source,
                }
            })?;
        probes.attach_raw_tracepoint(ATTACHED_AS, programs::BLOCK_RQ_COMPLETE, complete)?;
        probes.attach_raw_tracepoint(ATTACHED_AS, programs::BLOCK_RQ_ISSUE, issue)?;
        if plan.attribute_at_submit {
            probes.attach_raw_tracepoint(
                ATTACHED_AS,
                programs::BLOCK_IO_START,
                SUBMIT_TRACEPOINT,
            )?;
        }
        Ok(Self {
            ring,
            stats,
            received: 0,
            totals: BlockTotals::new(),
        })
    }

    /// The ring buffer's descriptor, to poll together with the syscall stream.
    pub(crate) fn fd(&self) -> i32 {
        self.ring.as_raw_fd()
    }

    /// Hands every request waiting in the ring buffer to `sink`.
    pub(crate) fn drain(&mut self, sink: &mut dyn EventSink) -> u64 {
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            if item.len() < std::mem::size_of::<BlockTraceEvent>() {
                continue;
            }
            // SAFETY: the record holds at least one BlockTraceEvent (checked above), written
            // by the probes with this layout; read_unaligned copes with any alignment.
            let event =
                unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<BlockTraceEvent>()) };
            drop(item);
            sink.block_event(&event);
            n += 1;
        }
        self.received += n;
        n
    }

    /// The target's totals now. With `BLOCK_TRACE` set the map holds only the target's
    /// requests, so every entry counts. A walk cut short by an error keeps the last totals.
    pub(crate) fn totals(&mut self) -> &BlockTotals {
        let mut totals = BlockTotals::new();
        for item in self.stats.iter() {
            match item {
                Ok((key, stats)) => add_entry(&mut totals, &key, &stats),
                Err(e) => {
                    tracing::debug!(error = %e, "reading BLOCK_STATS; keeping the last totals");
                    return &self.totals;
                }
            }
        }
        self.totals = totals;
        &self.totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sysscope_abi::{block_op, dev};

    #[test]
    fn totals_sum_over_processes_and_cgroups_per_device_and_op() {
        let loop0 = dev::make(7, 0);
        let key = |tgid: u32, cgroup_id: u64, op: u8| BlockKey {
            cgroup_id,
            tgid,
            dev: loop0,
            op,
            ..BlockKey::default()
        };
        let mut t = BlockTotals::new();
        let s = |bytes, requests| BlockStats { bytes, requests };
        add_entry(&mut t, &key(1, 10, block_op::WRITE), &s(1 << 20, 2));
        add_entry(&mut t, &key(2, 11, block_op::WRITE), &s(4096, 1));
        add_entry(&mut t, &key(2, 11, block_op::READ), &s(512, 1));
        assert_eq!(t[&(loop0, block_op::WRITE)], ((1 << 20) + 4096, 3));
        assert_eq!(t[&(loop0, block_op::READ)], (512, 1));
        assert_eq!(t.len(), 2);
    }
}
