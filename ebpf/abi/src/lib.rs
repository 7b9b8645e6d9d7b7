//! The contract between sysscope's eBPF probes and its exporter.
//!
//! Everything the kernel side writes and user space reads is declared here once, one module
//! per probe family, mirroring `ebpf/probes/src` and `exporter/src/kernel`: `syscalls`
//! (statistics, errors, exits, slow-call samples), `block_io`, `trace` (the on-demand trace),
//! `fd_class` (descriptor classes, and the file behind a slow call's descriptor), `counters`
//! (the probes' own drop counters), `empty` (the benchmark's calibration programs), and
//! `hist`, the latency bucket layout the families share. Each family declares its maps, programs and globals with the macros of
//! `contract.rs`: a name constant each and, with the `user` feature, a spec table
//! (`FAMILIES`) the exporter checks against the embedded object.
//!
//! The crate root re-exports the families' types and gathers their names in [`maps`],
//! [`programs`] and [`globals`], so user space names an item without knowing its family.
//! The crate is `no_std` so the probes can use it; the `user` feature adds `aya::Pod` impls.
#![no_std]

#[macro_use]
mod contract;

pub mod block_io;
pub mod counters;
pub mod empty;
pub mod fd_class;
pub mod hist;
pub mod syscalls;
pub mod trace;

#[cfg(feature = "user")]
pub use contract::{Family, GlobalSpec, MapKind, MapSpec};

pub use block_io::{
    block_held, block_op, charged_cgroup, dev, BlockInflight, BlockKey, BlockLatency,
    BlockLatencyKey, BlockProbeConfig, BlockStats, BlockTraceEvent,
};
pub use fd_class::{FdCache, FdClass, FdProbeConfig, FileIdentity, FileProbeConfig};
pub use hist::LatencyHistogram;
pub use syscalls::{
    bounded_compat_nr, bounded_nr, call_state, is_compat_nr, noreturn, own_share, quota_key,
    slot_cache, special, CallStamp, CpuState, ErrnoKey, OffCpuEvent, ProcessExit, RateWindow,
    SchedProbeConfig, SlotStats, SlowCallEvent, SlowCallScratch, StateStats, SyscallKey,
    SyscallStats, ThreadSpill, COMPAT_BASE, FOLDED_TGID, INVALID_NR, MAX_STAT_STRIPES,
    MAX_SYSCALL_NR,
};
pub use trace::{trace_flags, TraceEvent, TraceThread, TRACE_PATH_LEN};

/// Marks a struct member that does not exist on the running kernel in the offsets the loader
/// looks up in the kernel's BTF ([`BlockProbeConfig`], [`FdProbeConfig`], [`FileProbeConfig`]).
pub const NO_FIELD: u32 = u32::MAX;

/// Names of every family's maps, as user space looks them up in the loaded object.
pub mod maps {
    pub use crate::block_io::maps::*;
    pub use crate::counters::maps::*;
    pub use crate::empty::maps::*;
    pub use crate::syscalls::maps::*;
    pub use crate::trace::maps::*;
}

/// Names of every family's programs in the object file.
pub mod programs {
    pub use crate::block_io::programs::*;
    pub use crate::empty::programs::*;
    pub use crate::syscalls::programs::*;
    pub use crate::trace::programs::*;
}

/// Names of every family's global variables, which the loader sets before the programs load.
pub mod globals {
    pub use crate::block_io::globals::*;
    pub use crate::fd_class::globals::*;
    pub use crate::syscalls::globals::*;
    pub use crate::trace::globals::*;
}

/// Every family, with what it puts in the object: the maps, programs and globals the
/// exporter's object-contract test checks (and the object may hold nothing else).
#[cfg(feature = "user")]
pub const FAMILIES: &[Family] = &[
    Family {
        name: "syscalls",
        maps: syscalls::MAPS,
        programs: syscalls::PROGRAMS,
        globals: syscalls::GLOBALS,
    },
    Family {
        name: "block_io",
        maps: block_io::MAPS,
        programs: block_io::PROGRAMS,
        globals: block_io::GLOBALS,
    },
    Family {
        name: "trace",
        maps: trace::MAPS,
        programs: trace::PROGRAMS,
        globals: trace::GLOBALS,
    },
    Family {
        name: "fd_class",
        maps: &[],
        programs: &[],
        globals: fd_class::GLOBALS,
    },
    Family {
        name: "counters",
        maps: counters::MAPS,
        programs: &[],
        globals: &[],
    },
    Family {
        name: "empty",
        maps: empty::MAPS,
        programs: empty::PROGRAMS,
        globals: &[],
    },
];
