//! What the probes could not record: the per-CPU `PROBE_COUNTERS` array of
//! `ebpf/probes/src/common.rs` (indices in `sysscope_abi::counters`), summed over CPUs. Every
//! probe family counts its losses there (maps full, ring buffers full, half-seen events);
//! the agent (for `sysscope_map_insert_failures_total` and the other loss counters) and the
//! command-line tools read it through [`ProbeCounters`].

use aya::maps::{MapData, PerCpuArray};
use sysscope_abi::maps;

use super::{read_err, ProbeError, Probes};

/// `PROBE_COUNTERS`, taken from the loaded object.
pub(crate) struct ProbeCounters {
    map: PerCpuArray<MapData, u64>,
}

impl std::fmt::Debug for ProbeCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeCounters").finish_non_exhaustive()
    }
}

impl ProbeCounters {
    /// Takes `PROBE_COUNTERS` from `probes`.
    pub(crate) fn take(probes: &mut Probes) -> Result<Self, ProbeError> {
        let map = PerCpuArray::try_from(probes.take_map(maps::PROBE_COUNTERS)?)
            .map_err(read_err(maps::PROBE_COUNTERS))?;
        Ok(Self { map })
    }

    /// Counter `index` summed over CPUs (the per-CPU values wrap as the kernel's do), or
    /// `None` when the read failed.
    pub(crate) fn get(&self, index: u32) -> Option<u64> {
        self.map
            .get(&index, 0)
            .ok()
            .map(|v| v.iter().fold(0u64, |a, x| a.wrapping_add(*x)))
    }
}
