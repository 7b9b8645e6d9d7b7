//! The on-demand trace family (`ebpf/probes/src/trace.rs`, `exporter/src/kernel/trace.rs`):
//! every syscall of one target, one ring-buffer record per call, for `sysscope trace` and
//! `sysscope diagnose`. The exporter loads these programs but never attaches them.

use crate::{CallStamp, FdCache, FdClass};

maps! {
    /// Slot 0: the target cgroup (a cgroup array holds the directory's file descriptor).
    TRACE_CGROUPS: CgroupArray(u32 => u32),
    /// tgids traced when `TRACE_FILTER_TGIDS` is set (value unused).
    TRACE_TARGETS: HashMap(u32 => u8),
    /// LRU, tid -> the traced call in flight.
    TRACE_THREADS: LruHashMap(u32 => TraceThread),
    /// 1 + index of the argument holding a user-space path, per syscall number (0: none).
    TRACE_PATH_ARGS: Array(u32 => u8),
    /// Ring buffer of [`crate::TraceEvent`] records.
    TRACE_EVENTS: RingBuf(() => TraceEvent),
}

programs! {
    TRACE_SYS_ENTER = "trace_sys_enter",
    TRACE_SYS_EXIT = "trace_sys_exit",
}

globals! {
    /// `u64`: cgroup id whose syscalls the trace programs stream (0: use `TRACE_TARGETS` only).
    /// Tasks in descendant cgroups match too, through slot 0 of `TRACE_CGROUPS`.
    TRACE_CGROUP_ID: u64,
    /// `u32`: non-zero when the trace programs also follow the tgids listed in `TRACE_TARGETS`.
    TRACE_FILTER_TGIDS: u32,
}

/// Bytes of a path argument copied into a [`TraceEvent`] (NUL-terminated, truncated beyond).
pub const TRACE_PATH_LEN: usize = 128;

/// Flags of a [`TraceEvent`].
pub mod trace_flags {
    /// `path` holds the string the syscall's path argument pointed to.
    pub const PATH: u32 = 1;
    /// The call never returns (`exit`, `exit_group`): recorded at entry, `ret` is meaningless.
    pub const NO_RETURN: u32 = 2;
}

/// A traced call in flight (`TRACE_THREADS`, key: tid): entry time, number and arguments,
/// read at entry because some calls (`execve`) replace the registers by the time they return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceThread {
    /// `bpf_ktime_get_ns()` at entry; 0 when no traced call is in flight.
    pub start_ns: u64,
    pub nr: u32,
    pub _pad: u32,
    pub args: [u64; 6],
    /// The descriptor of the call in flight, classified at entry.
    pub fd: FdClass,
    pub fd_cache: FdCache,
}

/// One syscall of a traced target (`TRACE_EVENTS`), streamed only by `sysscope trace` and
/// `sysscope diagnose`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Its start and end are equal for `NO_RETURN` calls.
    pub call: CallStamp,
    pub nr: u32,
    /// Bits of [`trace_flags`].
    pub flags: u32,
    /// Return value (negative errno on failure).
    pub ret: i64,
    /// The six syscall arguments as passed in registers at entry.
    pub args: [u64; 6],
    /// What the descriptor was at entry ([`FdClass::NONE`] for calls not classified).
    pub fd: FdClass,
    /// The calling thread's comm.
    pub comm: [u8; 16],
    /// The path argument, for syscalls listed in `TRACE_PATH_ARGS` (flag `PATH`).
    pub path: [u8; TRACE_PATH_LEN],
}

impl Default for TraceEvent {
    fn default() -> Self {
        Self {
            call: CallStamp::default(),
            nr: 0,
            flags: 0,
            ret: 0,
            args: [0; 6],
            fd: FdClass::NONE,
            comm: [0; 16],
            path: [0; TRACE_PATH_LEN],
        }
    }
}

pod!(TraceEvent, TraceThread);

const _: () = {
    use core::mem::size_of;
    assert!(size_of::<TraceThread>() == 96);
    assert!(size_of::<TraceEvent>() == 248);
    assert!(core::mem::offset_of!(TraceEvent, nr) == 32);
    assert!(core::mem::offset_of!(TraceEvent, flags) == 36);
    assert!(core::mem::offset_of!(TraceEvent, path) == 120);
};
