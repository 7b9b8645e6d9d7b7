//! The contract between sysscope's eBPF probes and its exporter.
//!
//! Everything the kernel side writes and user space reads is declared here once:
//! map names, `#[repr(C)]` keys and values, the latency bucket layout, the indices of the
//! probes' own drop counters and the per-architecture syscall numbers the probes special-case.
//! The crate is `no_std` so the probes can use it; the `user` feature adds `aya::Pod` impls.
#![no_std]

/// Latency histograms: log2 buckets over nanoseconds.
///
/// Bucket 0 holds durations below `2^FIRST_BUCKET_SHIFT` ns (1.024 µs); bucket `k` in
/// `1..HIST_BUCKETS-1` holds `[2^(FIRST_BUCKET_SHIFT+k-1), 2^(FIRST_BUCKET_SHIFT+k))` ns, and the
/// last bucket everything from `2^(FIRST_BUCKET_SHIFT+HIST_BUCKETS-2)` ns (17.2 s) up.
pub mod hist {
    /// Number of buckets kept per histogram in the kernel.
    pub const HIST_BUCKETS: usize = 26;
    /// log2 of the upper bound (ns) of bucket 0.
    pub const FIRST_BUCKET_SHIFT: u32 = 10;

    /// Index of the bucket that counts a duration of `ns` nanoseconds.
    #[inline(always)]
    pub fn bucket_index(ns: u64) -> usize {
        // floor(log2(ns)) by a branch-light binary search: the verifier accepts it and it costs
        // a handful of instructions, unlike a loop.
        let mut v = ns;
        let mut log = 0u32;
        if v >= 1 << 32 {
            v >>= 32;
            log += 32;
        }
        if v >= 1 << 16 {
            v >>= 16;
            log += 16;
        }
        if v >= 1 << 8 {
            v >>= 8;
            log += 8;
        }
        if v >= 1 << 4 {
            v >>= 4;
            log += 4;
        }
        if v >= 1 << 2 {
            v >>= 2;
            log += 2;
        }
        if v >= 1 << 1 {
            log += 1;
        }
        let idx = log as i64 - FIRST_BUCKET_SHIFT as i64 + 1;
        if idx <= 0 {
            0
        } else if idx >= HIST_BUCKETS as i64 {
            HIST_BUCKETS - 1
        } else {
            idx as usize
        }
    }

    /// Upper bound in nanoseconds of bucket `k`, `None` for the last (unbounded) bucket.
    pub const fn upper_bound_ns(k: usize) -> Option<u64> {
        if k + 1 >= HIST_BUCKETS {
            None
        } else {
            Some(1u64 << (FIRST_BUCKET_SHIFT as usize + k))
        }
    }
}

/// Names of the maps, as user space looks them up in the loaded object.
pub mod maps {
    /// Task-local storage: the calls in flight of tasks switched out mid-call ([`crate::ThreadSpill`]).
    pub const SYSCALL_THREADS: &str = "SYSCALL_THREADS";
    /// Per-CPU: the running task's call in flight and cached identity ([`crate::CpuState`]).
    pub const SYSCALL_CPU: &str = "SYSCALL_CPU";
    pub const SYSCALL_STATS: &str = "SYSCALL_STATS";
    pub const SYSCALL_SLOTS: &str = "SYSCALL_SLOTS";
    pub const FREE_SLOTS: &str = "FREE_SLOTS";
    pub const SLOT_EPOCH: &str = "SLOT_EPOCH";
    pub const SYSCALL_ERRORS: &str = "SYSCALL_ERRORS";
    /// cgroup id -> slots of `SYSCALL_STATS` the probes have handed to its keys (atomic adds).
    pub const CGROUP_TAKEN: &str = "CGROUP_TAKEN";
    /// cgroup id -> slots of its keys user space has freed (written by user space only).
    pub const CGROUP_RETURNED: &str = "CGROUP_RETURNED";
    pub const PROCESS_EXITS: &str = "PROCESS_EXITS";
    pub const PROBE_COUNTERS: &str = "PROBE_COUNTERS";
    pub const SLOW_THRESHOLDS: &str = "SLOW_THRESHOLDS";
    pub const SLOW_EVENTS: &str = "SLOW_EVENTS";
    pub const SLOW_RATE: &str = "SLOW_RATE";
    pub const BLOCK_INFLIGHT: &str = "BLOCK_INFLIGHT";
    pub const BLOCK_STATS: &str = "BLOCK_STATS";
    pub const BLOCK_LATENCY: &str = "BLOCK_LATENCY";
    pub const TRACE_EVENTS: &str = "TRACE_EVENTS";
    pub const TRACE_THREADS: &str = "TRACE_THREADS";
    pub const TRACE_TARGETS: &str = "TRACE_TARGETS";
    pub const TRACE_CGROUPS: &str = "TRACE_CGROUPS";
    pub const TRACE_PATH_ARGS: &str = "TRACE_PATH_ARGS";
    pub const TRACE_BLOCK_EVENTS: &str = "TRACE_BLOCK_EVENTS";
}

/// Names of the programs in the object file.
pub mod programs {
    pub const SYS_ENTER: &str = "sys_enter";
    pub const SYS_EXIT: &str = "sys_exit";
    pub const PROCESS_EXIT: &str = "sched_process_exit";
    /// On `cgroup:cgroup_attach_task`: invalidates the cached cgroup ids.
    pub const CGROUP_ATTACH: &str = "cgroup_attach_task";
    /// On `sched:sched_switch`: moves a call in flight of a task switched out mid-call from its
    /// CPU's `SYSCALL_CPU` to its `SYSCALL_THREADS` value.
    pub const SCHED_SWITCH: &str = "sched_switch";
    pub const EMPTY_SYS_ENTER: &str = "empty_sys_enter";
    pub const EMPTY_SYS_EXIT: &str = "empty_sys_exit";
    pub const TRACE_SYS_ENTER: &str = "trace_sys_enter";
    pub const TRACE_SYS_EXIT: &str = "trace_sys_exit";
    pub const BLOCK_RQ_ISSUE: &str = "block_rq_issue";
    pub const BLOCK_RQ_COMPLETE: &str = "block_rq_complete";
    pub const BLOCK_IO_START: &str = "block_io_start";
}

/// Names of the global variables the loader sets before the programs load.
pub mod globals {
    /// `u32`: slow-call events allowed per CPU per second (0 disables slow-call sampling).
    pub const SLOW_EVENTS_PER_CPU_PER_SEC: &str = "SLOW_EVENTS_PER_CPU_PER_SEC";
    /// `u64`: cgroup id whose syscalls the trace programs stream (0: use `TRACE_TARGETS` only).
    /// Tasks in descendant cgroups match too, through slot 0 of `TRACE_CGROUPS`.
    pub const TRACE_CGROUP_ID: &str = "TRACE_CGROUP_ID";
    /// `u32`: non-zero when the trace programs also follow the tgids listed in `TRACE_TARGETS`.
    pub const TRACE_FILTER_TGIDS: &str = "TRACE_FILTER_TGIDS";
    /// `u32`: non-zero when the syscall programs count only the target the trace filter
    /// selects (`TRACE_CGROUP_ID`, `TRACE_FILTER_TGIDS`): set by the command-line tools, so a
    /// busy node cannot fill their maps; 0 (count everything) for the exporter.
    pub const SYSCALL_TARGET_ONLY: &str = "SYSCALL_TARGET_ONLY";
    /// [`crate::BlockProbeConfig`]: kernel struct offsets and switches of the block probes.
    pub const BLOCK_CONFIG: &str = "BLOCK_CONFIG";
    /// `u32`: non-zero when the block probes record only the requests of the trace target
    /// (see [`crate::BlockInflight::traced`]) and stream each one, at completion, to
    /// `TRACE_BLOCK_EVENTS`: set by `sysscope trace`; 0 (every request, no stream) for the
    /// exporter.
    pub const BLOCK_TRACE: &str = "BLOCK_TRACE";
    /// `u32`, a power of two: copies of each `SYSCALL_STATS` slot, chosen by CPU
    /// ([`crate::SlotStats`]). Set by the loader from the possible CPUs (at most
    /// [`crate::MAX_STAT_STRIPES`]); 1 in the object.
    pub const SYSCALL_STAT_STRIPES: &str = "SYSCALL_STAT_STRIPES";
    /// `u32`: slots one cgroup's keys may hold before its new keys fold into the cgroup's
    /// shared key ([`crate::FOLDED_TGID`]); 0: no quota.
    pub const SYSCALL_CGROUP_QUOTA: &str = "SYSCALL_CGROUP_QUOTA";
    /// [`crate::FdProbeConfig`]: where the descriptor classification finds what it reads.
    pub const FD_CONFIG: &str = "FD_CONFIG";
}

/// Indices into `PROBE_COUNTERS`, a per-CPU array of `u64`: what the probes could not record.
pub mod counters {
    /// A new (cgroup, process, syscall) found no free slot in `SYSCALL_STATS` (or no room in
    /// `SYSCALL_SLOTS`): the map is full.
    pub const SYSCALL_STATS_FULL: u32 = 0;
    /// An insert into `SYSCALL_ERRORS` failed because the map is full.
    pub const SYSCALL_ERRORS_FULL: u32 = 1;
    /// A call in flight of a task switched out mid-call could not be kept: the kernel could not
    /// give the thread its `SYSCALL_THREADS` task storage (out of memory, or the storage busy on
    /// this CPU). The call is then counted as a `SYSCALL_EXIT_WITHOUT_ENTER` at its exit.
    pub const SYSCALL_THREADS_FULL: u32 = 2;
    /// A syscall returned without a recorded entry (attached mid-call, a new task's first return
    /// from `fork`/`clone`, or its entry could not be kept).
    pub const SYSCALL_EXIT_WITHOUT_ENTER: u32 = 3;
    /// A process exit could not be queued for reclaim: `PROCESS_EXITS` is full.
    pub const PROCESS_EXITS_FULL: u32 = 4;
    /// A slow call was not sampled: over the per-CPU rate limit.
    pub const SLOW_RATE_LIMITED: u32 = 5;
    /// A slow call was not sampled: the ring buffer was full (user space behind).
    pub const SLOW_RINGBUF_FULL: u32 = 6;
    /// Block I/O: an issued request could not be remembered (`BLOCK_INFLIGHT` full).
    pub const BLOCK_INFLIGHT_FULL: u32 = 7;
    /// Block I/O: an insert into `BLOCK_STATS` failed because the map is full.
    pub const BLOCK_STATS_FULL: u32 = 8;
    /// Block I/O: a completion without a recorded issue.
    pub const BLOCK_COMPLETE_WITHOUT_ISSUE: u32 = 9;
    /// Trace: an event was lost because the trace ring buffer was full.
    pub const TRACE_RINGBUF_FULL: u32 = 10;
    /// Block I/O: an insert into `BLOCK_LATENCY` failed because the map is full.
    pub const BLOCK_LATENCY_FULL: u32 = 11;
    /// Trace: a block request of the target was not streamed: `TRACE_BLOCK_EVENTS` was full.
    pub const TRACE_BLOCK_RINGBUF_FULL: u32 = 12;
    /// A syscall was counted under its cgroup's shared key ([`crate::FOLDED_TGID`], exported
    /// as `comm="other"`): the cgroup held its quota of slots, or no slot was free. Counted,
    /// never lost.
    pub const SYSCALL_FOLDED: u32 = 13;
    /// A syscall number outside the table (`syscall(20000)`, `syscall(-1)`) was counted as
    /// [`crate::INVALID_NR`].
    pub const SYSCALL_INVALID_NR: u32 = 14;
    /// Number of counters.
    pub const COUNT: u32 = 16;
}

/// Upper bound on syscall numbers the probes index arrays with (x86_64 < 470, aarch64 < 470).
pub const MAX_SYSCALL_NR: u32 = 512;

/// The number every syscall number at or above it is counted as (exported as
/// `syscall="invalid"`). Any process may call `syscall(n)` with any `n`; the kernel answers
/// ENOSYS, and counting each `n` apart would let one process fill the maps and the exposition.
/// No architecture sysscope supports uses it.
pub const INVALID_NR: u32 = MAX_SYSCALL_NR - 1;

/// The syscall number the probes count a raw tracepoint `id` as: itself when it is below
/// [`INVALID_NR`], else [`INVALID_NR`] (negative ids included).
#[inline(always)]
pub fn bounded_nr(id: u64) -> u32 {
    if id < INVALID_NR as u64 {
        id as u32
    } else {
        INVALID_NR
    }
}

/// The tgid of a cgroup's shared statistics key: calls of that cgroup's processes that could
/// not have a key of their own (the cgroup held [`globals::SYSCALL_CGROUP_QUOTA`] slots, or
/// none was free) are counted there, exported as `comm="other"`. No process has tgid 0.
pub const FOLDED_TGID: u32 = 0;

/// Most copies of a `SYSCALL_STATS` slot (see [`SlotStats`]): memory stays fixed however many
/// CPUs a node has.
pub const MAX_STAT_STRIPES: u32 = 8;

/// Syscalls that never return to user space: counted at entry, with no duration.
pub mod noreturn {
    #[cfg(any(target_arch = "x86_64", bpf_target_arch = "x86_64"))]
    pub const EXIT: u32 = 60;
    #[cfg(any(target_arch = "x86_64", bpf_target_arch = "x86_64"))]
    pub const EXIT_GROUP: u32 = 231;
    #[cfg(any(target_arch = "aarch64", bpf_target_arch = "aarch64"))]
    pub const EXIT: u32 = 93;
    #[cfg(any(target_arch = "aarch64", bpf_target_arch = "aarch64"))]
    pub const EXIT_GROUP: u32 = 94;
    #[cfg(not(any(
        target_arch = "x86_64",
        bpf_target_arch = "x86_64",
        target_arch = "aarch64",
        bpf_target_arch = "aarch64"
    )))]
    pub const EXIT: u32 = u32::MAX;
    #[cfg(not(any(
        target_arch = "x86_64",
        bpf_target_arch = "x86_64",
        target_arch = "aarch64",
        bpf_target_arch = "aarch64"
    )))]
    pub const EXIT_GROUP: u32 = u32::MAX;
}

/// What the descriptor of a read or write was at the call's entry: its kind, and for files the
/// filesystem (the superblock's magic, `statfs(2)`'s `f_type`). Classified in the kernel from
/// the task's file table, for the syscalls [`fd_class::classified`] names only; all zero for
/// every other syscall.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FdClass {
    /// Filesystem magic of a [`fd_class::FILE`] (0 for the other kinds).
    pub fs_magic: u32,
    /// One of the [`fd_class`] kinds.
    pub kind: u8,
    pub _pad: [u8; 3],
}

impl FdClass {
    /// Not classified (a syscall without a descriptor to classify).
    pub const NONE: Self = Self {
        fs_magic: 0,
        kind: fd_class::NONE,
        _pad: [0; 3],
    };

    pub const fn of(kind: u8, fs_magic: u32) -> Self {
        Self {
            fs_magic,
            kind,
            _pad: [0; 3],
        }
    }
}

/// Descriptor kinds ([`FdClass::kind`]) and the syscalls whose descriptor is classified.
pub mod fd_class {
    /// Not classified.
    pub const NONE: u8 = 0;
    /// A regular file, directory or symlink on a filesystem ([`super::FdClass::fs_magic`]).
    pub const FILE: u8 = 1;
    pub const SOCKET: u8 = 2;
    /// A pipe or FIFO.
    pub const PIPE: u8 = 3;
    /// A character device (ttys, `/dev/null`, `/dev/nvidia*`, ...).
    pub const CHAR: u8 = 4;
    /// An anonymous inode (eventfd, timerfd, signalfd, epoll, io_uring, ...).
    pub const ANON: u8 = 5;
    /// Anything else: a block device, a descriptor not open at entry, one that could not be read.
    pub const OTHER: u8 = 6;

    /// The `fd_kind` label of each kind, by index (`NONE` has none).
    pub const NAMES: [&str; 7] = ["", "file", "socket", "pipe", "char", "anon", "other"];

    /// The `fd_kind` label of `kind`, `None` when it is not classified.
    pub fn name(kind: u8) -> Option<&'static str> {
        match kind {
            NONE => None,
            k => Some(NAMES.get(k as usize).copied().unwrap_or("other")),
        }
    }

    /// `S_IFMT` and the file types of `i_mode` (the same on every architecture).
    pub const S_IFMT: u16 = 0o170000;
    pub const S_IFSOCK: u16 = 0o140000;
    pub const S_IFLNK: u16 = 0o120000;
    pub const S_IFREG: u16 = 0o100000;
    pub const S_IFBLK: u16 = 0o060000;
    pub const S_IFDIR: u16 = 0o040000;
    pub const S_IFCHR: u16 = 0o020000;
    pub const S_IFIFO: u16 = 0o010000;

    /// Superblock magic of the anonymous-inode filesystem (`ANON_INODE_FS_MAGIC`): its inodes
    /// are typeless on older kernels and regular files on newer ones, so the magic decides.
    pub const ANON_INODE_FS_MAGIC: u32 = 0x0904_1934;

    /// The kind of an inode of mode `mode` on a filesystem of magic `magic`.
    pub fn kind_of(mode: u16, magic: u32) -> u8 {
        if magic == ANON_INODE_FS_MAGIC {
            return ANON;
        }
        match mode & S_IFMT {
            S_IFREG | S_IFDIR | S_IFLNK => FILE,
            S_IFSOCK => SOCKET,
            S_IFIFO => PIPE,
            S_IFCHR => CHAR,
            0 => ANON,
            _ => OTHER,
        }
    }

    /// Whether syscall `nr`'s first argument is a descriptor read or written (the read and
    /// write families and the socket calls): only these are classified.
    #[cfg(any(target_arch = "x86_64", bpf_target_arch = "x86_64"))]
    pub fn classified(nr: u32) -> bool {
        // read write pread64 pwrite64 readv writev sendto recvfrom sendmsg recvmsg preadv
        // pwritev preadv2 pwritev2
        matches!(
            nr,
            0 | 1 | 17 | 18 | 19 | 20 | 44 | 45 | 46 | 47 | 295 | 296 | 327 | 328
        )
    }
    #[cfg(any(target_arch = "aarch64", bpf_target_arch = "aarch64"))]
    pub fn classified(nr: u32) -> bool {
        // read write readv writev pread64 pwrite64 preadv pwritev sendto recvfrom sendmsg
        // recvmsg preadv2 pwritev2
        matches!(nr, 63..=70 | 206 | 207 | 211 | 212 | 286 | 287)
    }
    #[cfg(not(any(
        target_arch = "x86_64",
        bpf_target_arch = "x86_64",
        target_arch = "aarch64",
        bpf_target_arch = "aarch64"
    )))]
    pub fn classified(_nr: u32) -> bool {
        false
    }
}

/// A thread's last classified descriptor: its `struct file` and inode addresses and its class.
/// The same pair on the next call is not read again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdCache {
    pub file: u64,
    pub inode: u64,
    pub class: FdClass,
}

/// Kernel struct offsets the descriptor classification reads (global `FD_CONFIG`), looked up in
/// the kernel's BTF before loading; `ready == 0` leaves every call unclassified.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdProbeConfig {
    pub ready: u32,
    /// `task_struct.files`, `files_struct.fdt`, `fdtable.max_fds`, `fdtable.fd`.
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdt_max_fds: u32,
    pub fdt_fd: u32,
    /// `file.f_inode`, `inode.i_mode`, `inode.i_sb`, `super_block.s_magic`.
    pub file_inode: u32,
    pub inode_mode: u32,
    pub inode_sb: u32,
    pub sb_magic: u32,
}

impl FdProbeConfig {
    pub const UNSET: Self = Self {
        ready: 0,
        task_files: NO_FIELD,
        files_fdt: NO_FIELD,
        fdt_max_fds: NO_FIELD,
        fdt_fd: NO_FIELD,
        file_inode: NO_FIELD,
        inode_mode: NO_FIELD,
        inode_sb: NO_FIELD,
        sb_magic: NO_FIELD,
    };
}

/// What each CPU keeps between `sys_enter` and `sys_exit` (`SYSCALL_CPU`, a one-entry per-CPU
/// array): the call in flight of the task running on it, and what is the same for every call
/// of that task, cached so the common path makes no helper call and no hash or task-storage
/// lookup for it.
///
/// A call in flight stays here only while its task keeps the CPU: `sched_switch` moves it to
/// the task's [`ThreadSpill`] when the task is switched out mid-call, so an entry here always
/// belongs to `task`. The identity (`tgid`, `cgroup_id`) is valid while `task` is the current
/// task and `generation` equals the probes' count of cgroup migrations and task exits (a task
/// exit may free the `task_struct` for another task to reuse).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuState {
    /// The task (its `task_struct` address) the identity and the call in flight belong to.
    pub task: u64,
    /// The identity count when `tgid` and `cgroup_id` were read ([`CpuState::NO_IDENTITY`]: never).
    pub generation: u64,
    /// cgroup v2 id of `task`.
    pub cgroup_id: u64,
    /// `bpf_ktime_get_ns()` at entry; 0 when no call is in flight on this CPU.
    pub start_ns: u64,
    /// tgid of `task`.
    pub tgid: u32,
    /// Syscall number at entry.
    pub nr: u32,
    /// The descriptor of the call in flight, classified at entry.
    pub fd: FdClass,
    /// The descriptors last classified on this CPU, [`CpuState::FD_CACHE_ENTRIES`] of them,
    /// the entry chosen by descriptor number and task: two threads that take turns on a CPU
    /// (a pipe's reader and writer) keep their own.
    pub fd_cache: [FdCache; CpuState::FD_CACHE_ENTRIES],
    /// The CPU's slot cache: [`slot_cache::ENTRIES`] entries made by [`slot_cache::entry`].
    pub slots: [u64; slot_cache::ENTRIES],
}

impl CpuState {
    /// `generation` of a CPU whose identity was never read.
    pub const NO_IDENTITY: u64 = u64::MAX;
    /// Entries of `fd_cache` (a power of two).
    pub const FD_CACHE_ENTRIES: usize = 8;

    /// The `fd_cache` entry of descriptor `fd` of the task at `task`.
    #[inline(always)]
    pub fn fd_cache_entry(task: u64, fd: u64) -> usize {
        ((fd ^ (task >> 10)) as usize) & (Self::FD_CACHE_ENTRIES - 1)
    }
}

/// A call in flight whose task was switched out mid-call (it blocked, or was preempted), kept
/// in the thread's `SYSCALL_THREADS` value (task-local storage, freed with the thread) until
/// its `sys_exit`, which may run on another CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadSpill {
    /// `bpf_ktime_get_ns()` at entry; 0 when nothing is kept.
    pub start_ns: u64,
    /// Syscall number at entry.
    pub nr: u32,
    pub _pad: u32,
    /// The descriptor of the call, classified at entry.
    pub fd: FdClass,
}

/// A CPU's cache of (syscall number -> `SYSCALL_STATS` slot), two-way set-associative.
///
/// The set of a syscall is its number modulo [`SETS`]; a set holds the two syscalls of that set
/// used last, so pairs that a direct-mapped cache would thrash (`read` and `ioctl`, `write` and
/// `openat`, `read` and `getdents64`, ...) both stay cached. An entry is tagged with the syscall number and the low
/// bits of `SLOT_EPOCH`: when user space frees slots it bumps the epoch, and every entry made
/// before turns into a miss without the probe clearing anything. A wrong hit (a tag that comes
/// round again after 65,536 bumps, another task's call on the same CPU, a task that changed
/// cgroup) is harmless: the probe uses a
/// slot only if the slot's copy names the caller's key.
pub mod slot_cache {
    /// Sets (a power of two).
    pub const SETS: usize = 16;
    /// Entries per set.
    pub const WAYS: usize = 2;
    pub const ENTRIES: usize = SETS * WAYS;

    /// Index of the first entry of the set of syscall `nr`.
    #[inline(always)]
    pub fn set_of(nr: u32) -> usize {
        (nr as usize & (SETS - 1)) * WAYS
    }

    /// The tag of syscall `nr` of process `tgid` on a descriptor of class `fd` cached under
    /// `epoch`. Bit 15 is always set, so a zeroed entry is empty. The syscall number takes the
    /// low 9 bits, the descriptor's kind and filesystem a few more, and a hash of the process
    /// is mixed in, so two processes taking turns on a CPU with the same syscall hold one way
    /// each: keys that share a tag only miss.
    #[inline(always)]
    pub fn tag(epoch: u64, tgid: u32, nr: u32, fd: &super::FdClass) -> u32 {
        // Six bits of a multiplicative hash of the class: the kinds and the usual filesystems
        // (ext4, xfs, btrfs, tmpfs, NFS, FUSE, overlay, Ceph, Lustre, GPFS) all differ.
        let class = ((fd.kind as u32).wrapping_mul(0x27D4_EB2F)
            ^ fd.fs_magic.wrapping_mul(0x1656_67B1))
            >> 26;
        let process = tgid.wrapping_mul(0x9E37_79B1) >> 17;
        ((epoch as u32) << 16) | 0x8000 | ((nr ^ (class << 9) ^ process) & 0x7fff)
    }

    /// An entry: the tag in the high half, the slot in the low half.
    #[inline(always)]
    pub fn entry(tag: u32, slot: u32) -> u64 {
        ((tag as u64) << 32) | slot as u64
    }

    /// The slot of `entry` if it carries `tag`.
    #[inline(always)]
    pub fn hit(entry: u64, tag: u32) -> Option<u32> {
        ((entry >> 32) as u32 == tag).then_some(entry as u32)
    }
}

/// One (cgroup, process, syscall): key of `SYSCALL_SLOTS` (whose value is the entry's slot in
/// `SYSCALL_STATS`) and of `SYSCALL_ERRORS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SyscallKey {
    /// cgroup v2 id (`bpf_get_current_cgroup_id()`, the inode of the cgroup's directory).
    pub cgroup_id: u64,
    pub tgid: u32,
    pub nr: u32,
    /// What the call read or wrote ([`FdClass::NONE`] for calls not classified).
    pub fd: FdClass,
}

/// A latency histogram as the probes keep it: the sum of durations and a count per log2
/// bucket ([`hist`]); the count of events is the sum of the buckets. One type for every
/// histogram the probes keep (syscall durations, block request latency).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Sum of durations in nanoseconds.
    pub sum_ns: u64,
    pub buckets: [u64; hist::HIST_BUCKETS],
}

impl LatencyHistogram {
    pub const ZERO: Self = Self {
        sum_ns: 0,
        buckets: [0; hist::HIST_BUCKETS],
    };

    pub fn count(&self) -> u64 {
        self.buckets
            .iter()
            .fold(0u64, |acc, b| acc.wrapping_add(*b))
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::ZERO
    }
}

/// Statistics of one (cgroup, process, syscall): durations of its calls.
pub type SyscallStats = LatencyHistogram;

/// One copy of a slot of `SYSCALL_STATS`, an array (shared by all CPUs) of
/// [`globals::SYSCALL_STAT_STRIPES`] copies per slot: the copy of slot `s` that CPU `c` adds to
/// is at index `s * stripes + (c % stripes)`, with atomic adds. So the map's size does not grow
/// with the CPU count (at most [`MAX_STAT_STRIPES`] copies), and CPUs that count the same key at
/// once mostly write different cache lines (a copy is 256 bytes, four lines).
///
/// A slot is handed out (from `FREE_SLOTS`) to one key at a time, recorded in `SYSCALL_SLOTS`.
/// The probe that takes a slot writes the key into every copy before it publishes the slot, and
/// adds to a copy only if the copy names its key; readers count a copy only for the key it
/// names. So a slot freed by user space and handed to another key never mixes the two keys'
/// counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotStats {
    /// Owner of this copy (all zero: none yet).
    pub key: SyscallKey,
    pub stats: SyscallStats,
    /// Pads a copy to four cache lines, so neighbouring copies share none.
    pub _pad: [u64; 2],
}

// The layouts both sides compile: a change here is a change of the kernel/user contract.
const _: () = assert!(core::mem::size_of::<SyscallKey>() == 24);
const _: () = assert!(core::mem::size_of::<SyscallStats>() == 8 + 8 * hist::HIST_BUCKETS);
const _: () = assert!(core::mem::size_of::<SlotStats>() == 256);
const _: () = assert!(core::mem::size_of::<ErrnoKey>() == 24);
const _: () = assert!(core::mem::size_of::<FdClass>() == 8);
const _: () = assert!(MAX_STAT_STRIPES.is_power_of_two());
const _: () = assert!(INVALID_NR < MAX_SYSCALL_NR);

/// Key of `SYSCALL_ERRORS` (value: `u64` count, shared by all CPUs, atomic adds). `nr` is a
/// [`bounded_nr`], so it always fits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrnoKey {
    pub cgroup_id: u64,
    pub tgid: u32,
    pub nr: u16,
    /// Positive errno (e.g. 2 for ENOENT).
    pub errno: u16,
    pub fd: FdClass,
}

/// Value of `PROCESS_EXITS` (key: tgid): what user space needs to label and reclaim the
/// entries of a process that has exited, since `/proc/<tgid>` is gone by then.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessExit {
    pub comm: [u8; 16],
    pub cgroup_id: u64,
    pub exit_ns: u64,
}

/// Per-CPU state of the slow-call rate limiter (`SLOW_RATE`, one slot).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateWindow {
    pub window_start_ns: u64,
    pub events: u64,
}

/// A syscall slower than its threshold, as written to `SLOW_EVENTS` at `sys_exit`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlowCallEvent {
    /// `bpf_ktime_get_ns()` at entry and exit (CLOCK_MONOTONIC).
    pub start_ns: u64,
    pub end_ns: u64,
    pub cgroup_id: u64,
    pub tgid: u32,
    pub tid: u32,
    pub nr: u32,
    pub _pad: u32,
    /// The descriptor's class at entry ([`FdClass::NONE`] for calls not classified).
    pub fd: FdClass,
    /// Return value (negative errno on failure).
    pub ret: i64,
    /// The six syscall arguments as passed in registers.
    pub args: [u64; 6],
    pub comm: [u8; 16],
}

/// Block I/O operation classes, decoded from the request's `cmd_flags`.
pub mod block_op {
    pub const READ: u8 = 0;
    pub const WRITE: u8 = 1;
    pub const FLUSH: u8 = 2;
    pub const DISCARD: u8 = 3;
    pub const COUNT: usize = 4;
    /// Any other operation (write-zeroes, zone management, driver-private): not recorded.
    pub const OTHER: u8 = u8::MAX;

    /// The `op` label value of each class.
    pub const NAMES: [&str; COUNT] = ["read", "write", "flush", "discard"];

    /// The `op` label of `op`, `None` for [`OTHER`] and unknown values.
    pub fn name(op: u8) -> Option<&'static str> {
        NAMES.get(op as usize).copied()
    }

    /// The operation occupies the low bits of `cmd_flags` (`REQ_OP_MASK`, 8 bits since 4.10);
    /// the flags (`REQ_PREFLUSH`, `REQ_FUA`, `REQ_SYNC`, ...) the bits above.
    pub const REQ_OP_MASK: u32 = 0xff;

    /// The kernel's `enum req_op` values the probes tell apart, read from kernel BTF at start-up
    /// (they have not changed since 4.10, [`ReqOps::LINUX`] holds them as a fallback).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct ReqOps {
        pub read: u32,
        pub write: u32,
        pub flush: u32,
        pub discard: u32,
        pub secure_erase: u32,
    }

    impl ReqOps {
        pub const LINUX: Self = Self {
            read: 0,
            write: 1,
            flush: 2,
            discard: 3,
            secure_erase: 5,
        };
    }

    impl Default for ReqOps {
        fn default() -> Self {
            Self::LINUX
        }
    }

    /// The class of a request from its `cmd_flags`.
    ///
    /// A write carrying `REQ_PREFLUSH` or `REQ_FUA` is a write: the block layer issues the
    /// cache flush it implies as a separate `REQ_OP_FLUSH` request, which is a flush. Secure
    /// erase is a discard. Write-zeroes moves no data from memory, so it is not a write.
    #[inline(always)]
    pub fn decode(cmd_flags: u32, ops: &ReqOps) -> u8 {
        let op = cmd_flags & REQ_OP_MASK;
        if op == ops.read {
            READ
        } else if op == ops.write {
            WRITE
        } else if op == ops.flush {
            FLUSH
        } else if op == ops.discard || op == ops.secure_erase {
            DISCARD
        } else {
            OTHER
        }
    }
}

/// Device numbers as the kernel keeps them inside (`dev_t` with a 20-bit minor), which is
/// what the block probes record; user space's `st_rdev` encodes them differently.
pub mod dev {
    pub const MINOR_BITS: u32 = 20;
    pub const MINOR_MASK: u32 = (1 << MINOR_BITS) - 1;

    #[inline(always)]
    pub const fn make(major: u32, minor: u32) -> u32 {
        (major << MINOR_BITS) | (minor & MINOR_MASK)
    }

    pub const fn major(dev: u32) -> u32 {
        dev >> MINOR_BITS
    }

    pub const fn minor(dev: u32) -> u32 {
        dev & MINOR_MASK
    }
}

/// Marks a struct member that does not exist on the running kernel in [`BlockProbeConfig`].
pub const NO_FIELD: u32 = u32::MAX;

/// What the block probes need to know about the running kernel, set by the loader as the
/// global `BLOCK_CONFIG` (read-only for the probes).
///
/// The probes read `struct request` and what hangs off it from the raw tracepoint argument;
/// those layouts change between kernel versions and configurations, so user space looks the
/// byte offsets up in the kernel's own BTF (`/sys/kernel/btf/vmlinux`) before loading.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockProbeConfig {
    /// Non-zero once the offsets below are filled in: the probes record nothing before.
    pub ready: u32,
    /// Non-zero: charge a request issued from outside its bio's cgroup (writeback, kernel
    /// threads) to the bio's cgroup. Only meaningful when the `io` controller is on cgroup v2.
    pub bio_cgroup: u32,
    /// Non-zero: `BLOCK_LATENCY` keys carry the cgroup (`block_io.latency_by_cgroup`).
    pub latency_by_cgroup: u32,
    /// `struct request`: `q`, `cmd_flags`, `__data_len`, `bio`, and `rq_disk` (before 5.17,
    /// else [`NO_FIELD`]).
    pub rq_q: u32,
    pub rq_cmd_flags: u32,
    pub rq_data_len: u32,
    pub rq_bio: u32,
    pub rq_disk: u32,
    /// `struct request_queue`: `disk` (5.15 and later, else [`NO_FIELD`]).
    pub q_disk: u32,
    /// `struct gendisk`: `major`, `first_minor`.
    pub disk_major: u32,
    pub disk_first_minor: u32,
    /// `struct bio`: `bi_blkg`; `struct blkcg_gq`: `blkcg`; `struct blkcg`: `css`;
    /// `struct cgroup_subsys_state`: `cgroup`; `struct cgroup`: `kn`, `level`;
    /// `struct kernfs_node`: `id`. Only read when `bio_cgroup` is set.
    pub bio_blkg: u32,
    pub blkg_blkcg: u32,
    pub blkcg_css: u32,
    pub css_cgroup: u32,
    pub cgroup_kn: u32,
    pub cgroup_level: u32,
    pub kn_id: u32,
    pub ops: block_op::ReqOps,
    /// `struct request`: `__sector` (only read when `BLOCK_TRACE` is set; [`NO_FIELD`]: 0).
    pub rq_sector: u32,
}

impl BlockProbeConfig {
    /// Nothing known yet: the probes stay idle.
    pub const UNSET: Self = Self {
        ready: 0,
        bio_cgroup: 0,
        latency_by_cgroup: 0,
        rq_q: NO_FIELD,
        rq_cmd_flags: NO_FIELD,
        rq_data_len: NO_FIELD,
        rq_bio: NO_FIELD,
        rq_disk: NO_FIELD,
        q_disk: NO_FIELD,
        disk_major: NO_FIELD,
        disk_first_minor: NO_FIELD,
        bio_blkg: NO_FIELD,
        blkg_blkcg: NO_FIELD,
        blkcg_css: NO_FIELD,
        css_cgroup: NO_FIELD,
        cgroup_kn: NO_FIELD,
        cgroup_level: NO_FIELD,
        kn_id: NO_FIELD,
        ops: block_op::ReqOps::LINUX,
        rq_sector: NO_FIELD,
    };
}

impl Default for BlockProbeConfig {
    fn default() -> Self {
        Self::UNSET
    }
}

/// The cgroup a request is charged to.
///
/// `current` is the issuing task's cgroup id, `bio_cgroup` the id of the cgroup the request's
/// bio is charged to (0 if unknown) and `current_ancestor` the id of the issuing task's
/// ancestor cgroup at the bio cgroup's depth. When the issuing task lives inside the bio's
/// cgroup, its own (deeper, more precise) cgroup wins; otherwise the task issues on someone
/// else's behalf (writeback, a loop or dm worker) and the bio's cgroup is the one the I/O
/// belongs to.
#[inline(always)]
pub fn charged_cgroup(current: u64, current_ancestor: u64, bio_cgroup: u64) -> u64 {
    if bio_cgroup == 0 || current_ancestor == bio_cgroup {
        current
    } else {
        bio_cgroup
    }
}

/// Value of `BLOCK_INFLIGHT` (key: the `struct request` address): who the request is for,
/// from its submission (or issue), and when it was issued.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockInflight {
    /// `bpf_ktime_get_ns()` at submission (or issue, when submission was not seen).
    pub submit_ns: u64,
    /// `bpf_ktime_get_ns()` at issue; 0 while submitted but not issued yet.
    pub issue_ns: u64,
    pub cgroup_id: u64,
    /// Bytes of partial completions seen so far.
    pub done_bytes: u64,
    pub tgid: u32,
    pub dev: u32,
    /// The issuing task's name.
    pub comm: [u8; 16],
    pub op: u8,
    /// Non-zero: the request is the trace target's (decided at submission, or issue, when
    /// `BLOCK_TRACE` is set; always 0 otherwise).
    pub traced: u8,
    pub _pad: [u8; 6],
    /// First sector at issue (when `BLOCK_TRACE` is set).
    pub sector: u64,
}

/// Key of `BLOCK_STATS`: bytes and requests per (cgroup, process, device, op).
///
/// The process name is part of the key, as the kernel knew it at issue: I/O often completes
/// after its process exited, when /proc no longer has a name for the tgid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    pub cgroup_id: u64,
    pub tgid: u32,
    /// Kernel `dev_t` of the disk (see [`dev`]).
    pub dev: u32,
    pub comm: [u8; 16],
    pub op: u8,
    pub _pad: [u8; 7],
}

/// Value of `BLOCK_STATS` (shared by all CPUs, updated with atomic adds).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockStats {
    pub bytes: u64,
    pub requests: u64,
}

/// Key of `BLOCK_LATENCY`: latency histogram per (device, op), and per cgroup when enabled.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockLatencyKey {
    /// 0 unless `BlockProbeConfig::latency_by_cgroup` is set.
    pub cgroup_id: u64,
    pub dev: u32,
    pub op: u8,
    pub _pad: [u8; 3],
}

/// Value of `BLOCK_LATENCY` (shared by all CPUs, atomic adds): issue-to-completion time of
/// block requests.
pub type BlockLatency = LatencyHistogram;

/// One completed block request of a traced target (`TRACE_BLOCK_EVENTS`), streamed only by
/// `sysscope trace`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockTraceEvent {
    /// `bpf_ktime_get_ns()` at submission (equal to `issue_ns` when not seen), issue to the
    /// driver and final completion (CLOCK_MONOTONIC).
    pub submit_ns: u64,
    pub issue_ns: u64,
    pub complete_ns: u64,
    /// First sector (512 bytes) at issue.
    pub sector: u64,
    /// Bytes completed (for a discard, the range discarded).
    pub bytes: u64,
    /// The cgroup the request is charged to (see [`charged_cgroup`]).
    pub cgroup_id: u64,
    pub tgid: u32,
    /// Kernel `dev_t` of the disk (see [`dev`]).
    pub dev: u32,
    pub comm: [u8; 16],
    /// [`block_op`] class.
    pub op: u8,
    /// `blk_status_t` of the last completion (0: success).
    pub error: u8,
    pub _pad: [u8; 6],
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
    /// `bpf_ktime_get_ns()` at entry and exit (CLOCK_MONOTONIC); equal for `NO_RETURN` calls.
    pub start_ns: u64,
    pub end_ns: u64,
    pub cgroup_id: u64,
    pub tgid: u32,
    pub tid: u32,
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
            start_ns: 0,
            end_ns: 0,
            cgroup_id: 0,
            tgid: 0,
            tid: 0,
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

#[cfg(feature = "user")]
#[allow(
    clippy::undocumented_unsafe_blocks,
    reason = "one SAFETY note, at the top, covers every impl: they share the same argument"
)]
mod pod {
    use super::*;
    // SAFETY: every type below is #[repr(C)], made only of integers and integer arrays, with
    // explicit padding fields, so any bit pattern is a valid value.
    unsafe impl aya::Pod for ThreadSpill {}
    unsafe impl aya::Pod for CpuState {}
    unsafe impl aya::Pod for SyscallKey {}
    unsafe impl aya::Pod for LatencyHistogram {}
    unsafe impl aya::Pod for SlotStats {}
    unsafe impl aya::Pod for ErrnoKey {}
    unsafe impl aya::Pod for ProcessExit {}
    unsafe impl aya::Pod for RateWindow {}
    unsafe impl aya::Pod for SlowCallEvent {}
    unsafe impl aya::Pod for BlockKey {}
    unsafe impl aya::Pod for BlockStats {}
    unsafe impl aya::Pod for BlockLatencyKey {}
    unsafe impl aya::Pod for BlockInflight {}
    unsafe impl aya::Pod for BlockProbeConfig {}
    unsafe impl aya::Pod for FdProbeConfig {}
    unsafe impl aya::Pod for FdClass {}
    unsafe impl aya::Pod for FdCache {}
    unsafe impl aya::Pod for TraceEvent {}
    unsafe impl aya::Pod for TraceThread {}
    unsafe impl aya::Pod for BlockTraceEvent {}
}

#[cfg(test)]
mod block_tests {
    use super::{block_op::*, charged_cgroup, dev};

    #[test]
    fn ops_decode_from_cmd_flags() {
        let ops = ReqOps::LINUX;
        // Flag bits above REQ_OP_MASK (sync, FUA, preflush, ...) do not change the class.
        const SYNC_FUA_PREFLUSH: u32 = (1 << 11) | (1 << 17) | (1 << 18);
        assert_eq!(decode(0, &ops), READ);
        assert_eq!(decode(1, &ops), WRITE);
        assert_eq!(decode(1 | SYNC_FUA_PREFLUSH, &ops), WRITE);
        assert_eq!(decode(2, &ops), FLUSH);
        assert_eq!(decode(2 | SYNC_FUA_PREFLUSH, &ops), FLUSH);
        assert_eq!(decode(3, &ops), DISCARD);
        assert_eq!(decode(5, &ops), DISCARD, "secure erase is a discard");
        for other in [7u32, 9, 11, 13, 15, 17, 19, 34, 35, 0xff] {
            assert_eq!(decode(other | (1 << 11), &ops), OTHER, "op {other}");
        }
        // Values come from the kernel's BTF when they differ.
        let shifted = ReqOps {
            read: 10,
            write: 11,
            flush: 12,
            discard: 13,
            secure_erase: 14,
        };
        assert_eq!(decode(0, &shifted), OTHER);
        assert_eq!(decode(12 | (1 << 20), &shifted), FLUSH);
        assert_eq!(name(READ), Some("read"));
        assert_eq!(name(DISCARD), Some("discard"));
        assert_eq!(name(OTHER), None);
    }

    #[test]
    fn kernel_dev_t_round_trips() {
        let d = dev::make(259, 3);
        assert_eq!(d, (259 << 20) | 3);
        assert_eq!((dev::major(d), dev::minor(d)), (259, 3));
        assert_eq!(dev::make(7, 0), 7 << 20);
    }

    #[test]
    fn charge_goes_to_bio_cgroup_only_for_outsiders() {
        // No bio cgroup known: the issuing task's cgroup.
        assert_eq!(charged_cgroup(42, 1, 0), 42);
        // The task is inside the bio's cgroup (ancestor at its depth matches): keep the task's.
        assert_eq!(charged_cgroup(42, 7, 7), 42);
        // A kernel worker in the root issues for cgroup 7: charge 7.
        assert_eq!(charged_cgroup(1, 1, 7), 7);
    }
}

#[cfg(test)]
mod slot_cache_tests {
    use super::slot_cache::*;

    #[test]
    fn entries_hit_only_their_syscall_class_and_epoch() {
        use super::{fd_class, FdClass};
        const TGID: u32 = 4321;
        let none = FdClass::NONE;
        let e = entry(tag(7, TGID, 0, &none), 1234);
        assert_eq!(hit(e, tag(7, TGID, 0, &none)), Some(1234));
        // Another syscall, or any later epoch, misses.
        assert_eq!(hit(e, tag(7, TGID, 8, &none)), None);
        assert_eq!(hit(e, tag(8, TGID, 0, &none)), None);
        // The same syscall on another kind of descriptor or another filesystem misses.
        let ext4 = FdClass::of(fd_class::FILE, 0xEF53);
        let tmpfs = FdClass::of(fd_class::FILE, 0x0102_1994);
        let pipe = FdClass::of(fd_class::PIPE, 0);
        let f = entry(tag(7, TGID, 0, &ext4), 99);
        assert_eq!(hit(f, tag(7, TGID, 0, &ext4)), Some(99));
        for other in [none, tmpfs, pipe] {
            assert_eq!(hit(f, tag(7, TGID, 0, &other)), None, "{other:?}");
        }
        // A zeroed entry never hits, whatever the epoch, process, number and class (bit 15 of
        // every tag is set).
        for epoch in [0, 1, u64::from(u16::MAX)] {
            for nr in [0, 1, 0x7fff, 0x8000, u32::MAX] {
                for class in [none, ext4, pipe] {
                    for tgid in [0, 1, TGID, u32::MAX] {
                        assert_eq!(
                            hit(0, tag(epoch, tgid, nr, &class)),
                            None,
                            "epoch {epoch}, tgid {tgid}, nr {nr}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn processes_taking_turns_on_a_cpu_mostly_differ() {
        // Consecutive and scattered pids: the same syscall of two processes should almost
        // never share a tag (a shared tag only costs a miss, but the two would then evict
        // each other from a set).
        let none = super::FdClass::NONE;
        let pids = || (1000..1100u32).chain((1..100u32).map(|i| i * 7919));
        let mut same = 0;
        for a in pids() {
            for b in pids() {
                if a != b && tag(3, a, 0, &none) == tag(3, b, 0, &none) {
                    same += 1;
                }
            }
        }
        let n = pids().count();
        let pairs = n * (n - 1);
        assert!(same * 100 < pairs, "{same} of {pairs} pairs share a tag");
    }

    #[test]
    fn sets_keep_the_usual_pairs_apart_or_together() {
        // read (0) and lseek (8), the pattern of HDF5 readers, fall in different sets; read and
        // ioctl (16) share one, and a set holds two.
        assert_ne!(set_of(0), set_of(8));
        assert_eq!(set_of(0), set_of(16));
        assert!(set_of(u32::MAX) + WAYS <= ENTRIES);
    }
}

#[cfg(test)]
mod tests {
    use super::hist::*;

    #[test]
    fn out_of_range_syscall_numbers_fold_into_one() {
        use super::{bounded_nr, INVALID_NR};
        assert_eq!(bounded_nr(0), 0);
        assert_eq!(bounded_nr(39), 39);
        assert_eq!(bounded_nr(INVALID_NR as u64 - 1), INVALID_NR - 1);
        for id in [
            INVALID_NR as u64,
            512,
            20_000,
            65_536,
            65_595,
            0x4000_0000,
            u64::MAX,
        ] {
            assert_eq!(bounded_nr(id), INVALID_NR, "{id}");
        }
    }

    #[test]
    fn bucket_edges() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(1023), 0);
        assert_eq!(bucket_index(1024), 1);
        assert_eq!(bucket_index(2047), 1);
        assert_eq!(bucket_index(2048), 2);
        // 20 ms = 20_000_000 ns: 2^24 = 16.8M <= 20M < 2^25
        assert_eq!(bucket_index(20_000_000), 15);
        assert_eq!(upper_bound_ns(15), Some(1 << 25));
        assert_eq!(bucket_index(u64::MAX), HIST_BUCKETS - 1);
        assert_eq!(upper_bound_ns(HIST_BUCKETS - 1), None);
    }

    #[test]
    fn every_duration_lies_below_its_bucket_bound() {
        let mut ns = 1u64;
        while ns < u64::MAX / 3 {
            for probe in [ns - 1, ns, ns + 1] {
                let k = bucket_index(probe);
                if let Some(ub) = upper_bound_ns(k) {
                    assert!(probe < ub, "{probe} ns in bucket {k} with bound {ub}");
                }
                if k > 0 {
                    let lb = upper_bound_ns(k - 1).unwrap();
                    assert!(probe >= lb, "{probe} ns in bucket {k} below {lb}");
                }
            }
            ns = ns * 3 / 2 + 1;
        }
    }
}

// The sizes both sides agree on. The `Pod` impls above rely on these types having no implicit
// padding; a field added or reordered changes the size and stops the build here rather than
// misreading a map on the other side. (The syscall statistics types are checked by the
// exporter's object-contract test.)
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<ProcessExit>() == 32);
    assert!(size_of::<RateWindow>() == 16);
    assert!(size_of::<SlowCallEvent>() == 120);
    assert!(size_of::<FdProbeConfig>() == 36);
    assert!(size_of::<BlockProbeConfig>() == 96);
    assert!(size_of::<BlockInflight>() == 72);
    assert!(size_of::<BlockKey>() == 40);
    assert!(size_of::<BlockStats>() == 16);
    assert!(size_of::<BlockLatencyKey>() == 16);
    assert!(size_of::<BlockLatency>() == 216);
    assert!(size_of::<BlockTraceEvent>() == 80);
    assert!(size_of::<TraceThread>() == 96);
    assert!(size_of::<FdCache>() == 24);
    assert!(size_of::<ThreadSpill>() == 24);
    assert!(
        size_of::<CpuState>()
            == 48 + size_of::<FdCache>() * CpuState::FD_CACHE_ENTRIES + 8 * slot_cache::ENTRIES
    );
    assert!(size_of::<TraceEvent>() == 248);
};
