//! The block I/O family (`ebpf/probes/src/block_io.rs`, `exporter/src/kernel/block_io.rs`):
//! requests in flight, bytes and requests per (cgroup, process, device, op), request latency
//! per (device, op), and for `sysscope trace` the stream of the target's completed requests.

use crate::{LatencyHistogram, NO_FIELD};

maps! {
    /// The `struct request` address -> who the request is for and when it was issued.
    BLOCK_INFLIGHT: HashMap(u64 => BlockInflight),
    /// Bytes and requests per [`crate::BlockKey`] (atomic adds).
    BLOCK_STATS: HashMap(BlockKey => BlockStats),
    /// Request latency per [`crate::BlockLatencyKey`] (atomic adds).
    BLOCK_LATENCY: HashMap(BlockLatencyKey => BlockLatency),
    /// Ring buffer of [`crate::BlockTraceEvent`] records, streamed only when `BLOCK_TRACE` is set.
    TRACE_BLOCK_EVENTS: RingBuf(() => BlockTraceEvent),
    /// What the per-tenant bounds of the block maps count (keys: [`block_held`]): the
    /// `BLOCK_STATS` entries of each cgroup's processes and of all (counted up by the probes,
    /// set to the exact figure by user space after each read), and the requests each cgroup
    /// and all have in `BLOCK_INFLIGHT` (kept by the probes alone, as `i64`).
    BLOCK_HELD: HashMap(u64 => u64),
}

programs! {
    BLOCK_RQ_ISSUE = "block_rq_issue",
    BLOCK_RQ_COMPLETE = "block_rq_complete",
    BLOCK_IO_START = "block_io_start",
}

globals! {
    /// [`crate::BlockProbeConfig`]: kernel struct offsets and switches of the block probes.
    BLOCK_CONFIG: BlockProbeConfig,
    /// `u32`: non-zero when the block probes record only the requests of the trace target
    /// (see [`crate::BlockInflight::traced`]) and stream each one, at completion, to
    /// `TRACE_BLOCK_EVENTS`: set by `sysscope trace`; 0 (every request, no stream) for the
    /// exporter.
    BLOCK_TRACE: u32,
    /// `u32`: `BLOCK_STATS` entries of processes one cgroup may hold before its new
    /// (process, device, op) keys fold into its shared key (tgid 0, no name); 0: no bound.
    BLOCK_TENANT_ENTRIES: u32,
    /// `u32`: `BLOCK_STATS` entries of processes all cgroups may hold (0: no bound); the rest
    /// is the reserve of the shared keys.
    BLOCK_OWN_ENTRIES: u32,
    /// `u32`: requests one cgroup may have tracked in `BLOCK_INFLIGHT`; past it its new
    /// requests are not tracked (counted lost); 0: no bound.
    BLOCK_TENANT_INFLIGHT: u32,
    /// `u32`: requests all cgroups may have tracked in `BLOCK_INFLIGHT` (0: no bound), except
    /// that a light cgroup (`BLOCK_LIGHT_INFLIGHT`) may always add one: the rest of the map
    /// is the light tenants' reserve.
    BLOCK_OWN_INFLIGHT: u32,
    /// `u32`: requests in flight below which a cgroup is light
    /// ([`block_held::light_inflight`] of the map).
    BLOCK_LIGHT_INFLIGHT: u32,
}

/// The keys of `BLOCK_HELD`, and the bounds the loader derives from the maps' sizes. Cgroup
/// ids are kernfs inode numbers, far below 2^62, so no key is ever another's.
pub mod block_held {
    /// `BLOCK_STATS` entries of all processes.
    pub const ALL_ENTRIES: u64 = u64::MAX;
    /// `BLOCK_INFLIGHT` requests of all cgroups.
    pub const ALL_INFLIGHT: u64 = u64::MAX - 1;
    /// The bit that makes a cgroup id the key of its requests in flight.
    pub const INFLIGHT: u64 = 1 << 62;

    /// The key counting `cgroup_id`'s requests in `BLOCK_INFLIGHT`.
    #[inline(always)]
    pub const fn inflight_of(cgroup_id: u64) -> u64 {
        cgroup_id | INFLIGHT
    }

    /// The part of a map of `entries` one tenant may fill: a quarter.
    pub const fn tenant_share(entries: u32) -> u32 {
        entries / 4
    }

    /// The part of a map of `entries` all tenants' own keys may fill: seven eighths.
    pub const fn own_share(entries: u32) -> u32 {
        entries - entries / 8
    }

    /// Requests in flight below which a cgroup may take the reserve of `BLOCK_INFLIGHT` (of
    /// `entries`): a sixty-fourth of the map (at least 16).
    pub const fn light_inflight(entries: u32) -> u32 {
        let light = entries / 64;
        if light < 16 {
            16
        } else {
            light
        }
    }
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
    /// Set in the `op` of a `BLOCK_STATS` key whose requests failed (a non-zero status at
    /// completion): they are counted apart, and their bytes were not moved.
    pub const FAILED: u8 = 0x80;

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
    /// (read, write, flush, discard and secure erase have not changed since 4.10; zone append
    /// was 13 from 5.8 and is 7 since the zone ops were renumbered in 6.x; [`ReqOps::LINUX`]
    /// holds the 5.8 values as a fallback).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct ReqOps {
        pub read: u32,
        pub write: u32,
        pub flush: u32,
        pub discard: u32,
        pub secure_erase: u32,
        /// `REQ_OP_ZONE_APPEND` (5.8 and later): a data write to a zoned device, counted as
        /// a write.
        pub zone_append: u32,
    }

    impl ReqOps {
        pub const LINUX: Self = Self {
            read: 0,
            write: 1,
            flush: 2,
            discard: 3,
            secure_erase: 5,
            zone_append: 13,
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
    /// erase is a discard, zone append a write. Write-zeroes moves no data from memory, so it
    /// is not a write.
    #[inline(always)]
    pub fn decode(cmd_flags: u32, ops: &ReqOps) -> u8 {
        let op = cmd_flags & REQ_OP_MASK;
        if op == ops.read {
            READ
        } else if op == ops.write || op == ops.zone_append {
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
    /// Non-zero: the request counts in its cgroup's `BLOCK_HELD` in-flight figure (and
    /// all's), which its removal takes back.
    pub counted: u8,
    pub _pad: [u8; 5],
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

pod!(
    BlockKey,
    BlockStats,
    BlockLatencyKey,
    BlockInflight,
    BlockProbeConfig,
    BlockTraceEvent
);

// The sizes both sides agree on: a field added or reordered stops the build here rather than
// misreading a map on the other side.
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<BlockProbeConfig>() == 100);
    assert!(size_of::<BlockInflight>() == 72);
    assert!(size_of::<BlockKey>() == 40);
    assert!(size_of::<BlockStats>() == 16);
    assert!(size_of::<BlockLatencyKey>() == 16);
    assert!(size_of::<BlockLatency>() == 216);
    assert!(size_of::<BlockTraceEvent>() == 80);
};

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
        assert_eq!(decode(13, &ops), WRITE, "zone append is a write");
        for other in [7u32, 9, 11, 15, 17, 19, 34, 35, 0xff] {
            assert_eq!(decode(other | (1 << 11), &ops), OTHER, "op {other}");
        }
        // Values come from the kernel's BTF when they differ.
        let shifted = ReqOps {
            read: 10,
            write: 11,
            flush: 12,
            discard: 13,
            secure_erase: 14,
            zone_append: 15,
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
