//! The target's block I/O for `sysscope trace`: the block probes loaded with the global
//! `BLOCK_TRACE` set, so they record only the requests of the trace target (decided in the
//! kernel when a request is submitted, with the trace filter applied to the task it is charged
//! to, see `ebpf/probes/src/block_io.rs`), attached and read through the kernel layer's
//! [`BlockTrace`]. Here the entries of `BLOCK_STATS` become exact cumulative totals per
//! (device, op), and the requests streamed to `TRACE_BLOCK_EVENTS` go to the sink; requests
//! the ring buffer could not hold are counted in `PROBE_COUNTERS[TRACE_BLOCK_RINGBUF_FULL]`.
//!
//! Optional by design: when the kernel lacks the tracepoints or the request layout, or the
//! config turns block I/O off, the trace runs without these tracks and says why.

use sysscope_abi::{BlockKey, BlockStats};

use super::{
    sink::{BlockTotals, EventSink},
    CliError,
};
use crate::{
    config::Config,
    kernel::block_io::{self, BlockIoPlan, BlockTrace},
    kernel::Probes,
    metadata::cgroups,
    util::error::Chain,
};

/// The name the block programs are attached (and, on failure, detached) under.
const ATTACHED_AS: &str = "trace_block_io";

/// What the kernel offers for block tracks, or why there are none (shown on stderr).
pub(crate) fn plan(config: &Config) -> Result<BlockIoPlan, String> {
    if !config.block_io.enabled {
        return Err("block_io.enabled is false in the config file".into());
    }
    let root = cgroups::v2_mount().map_err(|e| Chain(&e).to_string())?;
    block_io::plan(config, &root).map_err(|e| Chain(&e).to_string())
}

/// The attached block probes, with what the trace has read of them.
pub(crate) struct BlockStream {
    trace: BlockTrace,
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
    /// Attaches the block probes to `block_io.tracepoints` (completion first, as the exporter
    /// does). The object must have been loaded with `plan.probe` and `block_trace` set.
    /// On failure nothing stays attached and the error says what failed.
    pub(crate) fn attach(
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
        let trace = BlockTrace::attach(probes, ATTACHED_AS, issue, complete, plan)?;
        Ok(Self {
            trace,
            received: 0,
            totals: BlockTotals::new(),
        })
    }

    /// The ring buffer's descriptor, to poll together with the syscall stream.
    pub(crate) fn fd(&self) -> i32 {
        self.trace.fd()
    }

    /// Hands every request waiting in the ring buffer to `sink`.
    pub(crate) fn drain(&mut self, sink: &mut dyn EventSink) -> u64 {
        let n = self.trace.drain(|event| sink.block_event(event));
        self.received += n;
        n
    }

    /// The target's totals now. With `BLOCK_TRACE` set the map holds only the target's
    /// requests, so every entry counts. A walk cut short by an error keeps the last totals.
    pub(crate) fn totals(&mut self) -> &BlockTotals {
        let mut totals = BlockTotals::new();
        match self
            .trace
            .read_stats(|key, stats| add_entry(&mut totals, key, stats))
        {
            Ok(()) => self.totals = totals,
            Err(e) => {
                tracing::debug!(error = %e, "reading BLOCK_STATS; keeping the last totals");
            }
        }
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
