//! Block I/O probes: bytes and requests per (cgroup, process, device, op), and the time from
//! issue to completion as a log2 histogram per (device, op), optionally per cgroup.
//!
//! Tracepoints (raw_tp): `block:block_io_start(struct request *rq)` (6.5 and later, optional),
//! `block:block_rq_issue(struct request *rq)` and
//! `block:block_rq_complete(struct request *rq, blk_status_t error, unsigned int nr_bytes)`.
//! Maps: `BLOCK_INFLIGHT` (request address -> issue time and attribution), `BLOCK_STATS`
//! ((cgroup, tgid, dev, op) -> bytes, requests), `BLOCK_LATENCY` ((cgroup or 0, dev, op) ->
//! sum + log2 buckets). Global: `BLOCK_CONFIG` (kernel struct offsets, switches).
//!
//! Why raw tracepoints: the request pointer they pass is the only exact way to pair a
//! completion with its issue (the classic tracepoint records carry (dev, sector), which every
//! flush shares), they need no tracefs, and the bio behind the request tells whose I/O it is.
//! `struct request` has no stable layout and aya has no CO-RE for Rust programs, so user space
//! reads the offsets from the kernel's BTF and hands them over in `BLOCK_CONFIG` before load.
//!
//! Attribution is made when the request is submitted (`block_io_start`), or at issue when that
//! tracepoint is missing: the task's tgid and name, and its cgroup unless the task is outside
//! the cgroup the bio is charged to (writeback, loop/dm workers): then the bio's. At issue, a
//! task outside the bio's cgroup is the dispatcher, not the submitter: the request is then
//! the bio's cgroup's with no process (its shared key). A request that failed (non-zero status
//! at completion) is counted under its op with `block_op::FAILED` set, and not in the latency
//! histogram.
//! Stats are recorded once per request, at its final completion, so bytes, requests and the
//! histogram count always agree. The stats and latency maps are shared by all CPUs and updated
//! with atomic adds: block I/O rates are far below syscall rates, and shared maps keep the
//! memory independent of the number of CPUs.
//!
//! `sysscope trace` sets the global `BLOCK_TRACE`: a request is then decided at submission
//! (or issue) to be the trace target's or not (`BlockInflight::traced`, the trace programs'
//! filter applied to the task the request is charged to), only the target's requests reach
//! `BLOCK_STATS` and `BLOCK_LATENCY`, and each of them is streamed at its final completion
//! to the `TRACE_BLOCK_EVENTS` ring buffer (drops: `PROBE_COUNTERS[TRACE_BLOCK_RINGBUF_FULL]`).

use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_ktime_get_ns, generated::bpf_get_current_ancestor_cgroup_id,
    },
    macros::{map, raw_tracepoint},
    maps::{HashMap, RingBuf},
    programs::RawTracePointContext,
};
use sysscope_abi::{
    block_held, block_op, charged_cgroup, counters, dev, hist, BlockInflight, BlockKey,
    BlockLatency, BlockLatencyKey, BlockProbeConfig, BlockStats, BlockTraceEvent, NO_FIELD,
};

use crate::common::{count_drop, read, zero, EEXIST};

// Capacities here are defaults; the exporter resizes the maps from its config before loading.
#[map(name = "BLOCK_INFLIGHT")]
static BLOCK_INFLIGHT: HashMap<u64, BlockInflight> = HashMap::with_max_entries(16384, 0);

#[map(name = "BLOCK_STATS")]
static BLOCK_STATS: HashMap<BlockKey, BlockStats> = HashMap::with_max_entries(8192, 0);

#[map(name = "BLOCK_LATENCY")]
static BLOCK_LATENCY: HashMap<BlockLatencyKey, BlockLatency> = HashMap::with_max_entries(1024, 0);

/// The counts the per-tenant bounds read (see `sysscope_abi::block_held`).
#[map(name = "BLOCK_HELD")]
static BLOCK_HELD: HashMap<u64, u64> = HashMap::with_max_entries(4096, 0);

/// `BLOCK_STATS` entries of one cgroup's processes (0: no bound); set by the loader.
#[unsafe(no_mangle)]
#[used]
static BLOCK_TENANT_ENTRIES: u32 = 0;

/// `BLOCK_STATS` entries of all processes (0: no bound); set by the loader.
#[unsafe(no_mangle)]
#[used]
static BLOCK_OWN_ENTRIES: u32 = 0;

/// Requests one cgroup may have tracked at once (0: no bound); set by the loader.
#[unsafe(no_mangle)]
#[used]
static BLOCK_TENANT_INFLIGHT: u32 = 0;

/// Requests all cgroups may have tracked at once, light tenants aside (0: no bound); set by
/// the loader.
#[unsafe(no_mangle)]
#[used]
static BLOCK_OWN_INFLIGHT: u32 = 0;

/// Requests in flight below which a cgroup is light: it may take the rest of the map; set by
/// the loader.
#[unsafe(no_mangle)]
#[used]
static BLOCK_LIGHT_INFLIGHT: u32 = 0;

/// Completed requests of the trace target, when `BLOCK_TRACE` is set. One page by default:
/// the exporter never streams; `sysscope trace` sizes it.
#[map(name = "TRACE_BLOCK_EVENTS")]
static TRACE_BLOCK_EVENTS: RingBuf = RingBuf::with_byte_size(4096, 0);

/// Non-zero: record only the trace target's requests and stream them; set by the loader.
#[unsafe(no_mangle)]
#[used]
static BLOCK_TRACE: u32 = 0;

#[inline(always)]
fn tracing_target() -> bool {
    // SAFETY: a global the loader sets before the load, read as a whole.
    unsafe { core::ptr::read_volatile(&BLOCK_TRACE) != 0 }
}

/// Set by the loader from kernel BTF; all `NO_FIELD` (and `ready == 0`) until then.
#[unsafe(no_mangle)]
#[used]
static BLOCK_CONFIG: BlockProbeConfig = BlockProbeConfig::UNSET;

#[inline(always)]
fn config() -> BlockProbeConfig {
    // SAFETY: a global the loader sets before the load, read as a whole.
    unsafe { core::ptr::read_volatile(&BLOCK_CONFIG) }
}

#[inline(always)]
fn read_ptr(base: u64, off: u32) -> u64 {
    read::<u64>(base, off).unwrap_or(0)
}

/// The disk's `dev_t` (whole disk, as the block tracepoints report it), 0 if unknown.
#[inline(always)]
fn disk_dev(rq: u64, cfg: &BlockProbeConfig) -> u32 {
    let disk = if cfg.rq_disk != NO_FIELD {
        read_ptr(rq, cfg.rq_disk)
    } else {
        read_ptr(read_ptr(rq, cfg.rq_q), cfg.q_disk)
    };
    let major = read::<i32>(disk, cfg.disk_major).unwrap_or(0);
    let minor = read::<i32>(disk, cfg.disk_first_minor).unwrap_or(0);
    dev::make(major as u32, minor as u32)
}

/// The cgroup the request is charged to (see `sysscope_abi::charged_cgroup`).
#[inline(always)]
fn request_cgroup(rq: u64, cfg: &BlockProbeConfig, current: u64) -> u64 {
    if cfg.bio_cgroup == 0 {
        return current;
    }
    // rq->bio->bi_blkg->blkcg->css.cgroup->kn->id; flush requests have no bio.
    let blkg = read_ptr(read_ptr(rq, cfg.rq_bio), cfg.bio_blkg);
    let blkcg = read_ptr(blkg, cfg.blkg_blkcg);
    if blkcg == 0 {
        return current;
    }
    let cgroup = read_ptr(blkcg, cfg.blkcg_css.wrapping_add(cfg.css_cgroup));
    let Some(level) = read::<i32>(cgroup, cfg.cgroup_level) else {
        return current;
    };
    let Some(id) = read::<u64>(read_ptr(cgroup, cfg.cgroup_kn), cfg.kn_id) else {
        return current;
    };
    // SAFETY: the helper has no preconditions.
    let ancestor = unsafe { bpf_get_current_ancestor_cgroup_id(level) };
    charged_cgroup(current, ancestor, id)
}

/// Who submitted a request, in the submitter's context (`block_io_start`, 6.5 and later). The
/// request may be dispatched to the driver later by another task (an I/O scheduler run from
/// kblockd, a plug flushed by someone else): attribution made here is the right one.
#[raw_tracepoint(tracepoint = "block_io_start")]
pub fn block_io_start(ctx: RawTracePointContext) -> i32 {
    let cfg = config();
    if cfg.ready == 0 {
        return 0;
    }
    // TP_PROTO(struct request *rq)
    let rq = ctx.arg::<u64>(0);
    // SAFETY: the helper has no preconditions.
    let entry = submitter(rq, &cfg, unsafe { bpf_ktime_get_ns() }, 0);
    track(rq, entry);
    0
}

/// Starts tracking request `rq` for `entry`'s cgroup, within the cgroup's bound of requests
/// in flight; counts it lost when the bound or the map refuses it. A request structure is
/// reused: an entry of its previous life is stale, and replaced (its count given back).
#[inline(never)]
fn track(rq: u64, mut entry: BlockInflight) {
    forget(rq);
    let tenant = block_held::inflight_of(entry.cgroup_id);
    // SAFETY: loader-set globals.
    let (bound, own, light) = unsafe {
        (
            core::ptr::read_volatile(&BLOCK_TENANT_INFLIGHT) as i64,
            core::ptr::read_volatile(&BLOCK_OWN_INFLIGHT) as i64,
            core::ptr::read_volatile(&BLOCK_LIGHT_INFLIGHT) as i64,
        )
    };
    if bound != 0 {
        let mine = held(tenant);
        // Past its own bound, or (unless it is light) past all tenants' share: not tracked.
        if mine >= bound || (mine >= light && held(block_held::ALL_INFLIGHT) >= own) {
            count_drop(counters::BLOCK_INFLIGHT_FULL);
            return;
        }
        entry.counted = 1;
    }
    if BLOCK_INFLIGHT.insert(&rq, &entry, 0).is_err() {
        count_drop(counters::BLOCK_INFLIGHT_FULL);
        return;
    }
    if entry.counted != 0 {
        count_held(tenant, 1);
        count_held(block_held::ALL_INFLIGHT, 1);
    }
}

/// Stops tracking request `rq`, giving its count back.
#[inline(always)]
fn forget(rq: u64) {
    let Some(old) = BLOCK_INFLIGHT.get_ptr(&rq) else {
        return;
    };
    // SAFETY: a value of `BLOCK_INFLIGHT`, read while the program runs.
    let (counted, cgroup_id) = unsafe { ((*old).counted, (*old).cgroup_id) };
    // Only the program that deletes the entry gives its count back.
    if BLOCK_INFLIGHT.remove(&rq).is_ok() && counted != 0 {
        count_held(block_held::inflight_of(cgroup_id), u64::MAX);
        count_held(block_held::ALL_INFLIGHT, u64::MAX);
    }
}

/// The count under `key` of `BLOCK_HELD`, as a signed figure (the in-flight counts are
/// adjusted by additions of -1), 0 when absent.
#[inline(always)]
fn held(key: u64) -> i64 {
    // SAFETY: a read of a hash map value, copied out at once (an aligned u64).
    unsafe { BLOCK_HELD.get(&key) }.map_or(0, |v| *v as i64)
}

/// Adds `delta` (wrapping: `u64::MAX` takes one away) to the count under `key`, created at 0.
#[inline(always)]
fn count_held(key: u64, delta: u64) {
    if BLOCK_HELD.get_ptr_mut(&key).is_none() {
        let _ = BLOCK_HELD.insert(&key, &zero(), BPF_NOEXIST as u64);
    }
    if let Some(count) = BLOCK_HELD.get_ptr_mut(&key) {
        add(count, delta);
    }
}

/// The current task as the one a request is for; `issue_ns` 0 means "not issued yet".
#[inline(always)]
fn submitter(rq: u64, cfg: &BlockProbeConfig, now: u64, issue_ns: u64) -> BlockInflight {
    // SAFETY: the helper has no preconditions.
    let current = unsafe { bpf_get_current_cgroup_id() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let cgroup_id = request_cgroup(rq, cfg, current);
    let traced = tracing_target() && is_traced(pid_tgid, current, cgroup_id);
    // Attributed at issue (no `block_io_start`: 6.1-6.4), by a task outside the cgroup the
    // bio is charged to: with an I/O scheduler that is whoever dispatched the request (another
    // tenant's task, kblockd), not who submitted it. The request is the bio's cgroup's, and
    // its process unknown: its cgroup's shared key (tgid 0, no name, `comm="other"`).
    let (tgid, comm) = if issue_ns != 0 && cgroup_id != current {
        (0, [0; 16])
    } else {
        (
            (pid_tgid >> 32) as u32,
            bpf_get_current_comm().unwrap_or([0; 16]),
        )
    };
    BlockInflight {
        submit_ns: now,
        issue_ns,
        cgroup_id,
        done_bytes: 0,
        tgid,
        dev: 0,
        comm,
        op: 0,
        traced: traced as u8,
        counted: 0,
        _pad: [0; 5],
        sector: 0,
    }
}

/// Whether a request charged to `charged` and submitted by the current task belongs to the
/// trace target, as the exporter would attribute it: charged to the task's own cgroup, it is
/// the target's when the task is (the trace programs' filter: the target cgroup and its
/// descendants, or a traced tgid); charged to another cgroup (writeback or a worker acting
/// for a bio's cgroup), when that cgroup is the target cgroup itself, or the task's tgid
/// is traced (`--pid` follows the submitting process, like the exporter's `pid` label).
#[inline(always)]
fn is_traced(pid_tgid: u64, current: u64, charged: u64) -> bool {
    if charged == current {
        return crate::trace::is_target(pid_tgid);
    }
    let target = crate::trace::target_cgroup();
    (target != 0 && charged == target) || crate::trace::is_target_tgid(pid_tgid)
}

/// The request goes to the driver: the latency clock starts. Attribution comes from
/// `block_io_start` when it saw the request, else from the issuing task.
#[raw_tracepoint(tracepoint = "block_rq_issue")]
pub fn block_rq_issue(ctx: RawTracePointContext) -> i32 {
    let cfg = config();
    if cfg.ready == 0 {
        return 0;
    }
    // TP_PROTO(struct request *rq)
    let rq = ctx.arg::<u64>(0);
    let Some(cmd_flags) = read::<u32>(rq, cfg.rq_cmd_flags) else {
        return 0;
    };
    let op = block_op::decode(cmd_flags, &cfg.ops);
    if op == block_op::OTHER {
        forget(rq);
        return 0;
    }
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let dev = disk_dev(rq, &cfg);
    if let Some(entry) = BLOCK_INFLIGHT.get_ptr_mut(&rq) {
        // Submitted earlier, or issued again after a requeue: the clock (re)starts.
        // SAFETY: a value of `BLOCK_INFLIGHT`, valid while the program runs; one request completes on one CPU at a time.
        unsafe {
            (*entry).issue_ns = now;
            (*entry).dev = dev;
            (*entry).op = op;
            if (*entry).traced != 0 {
                (*entry).sector = read::<u64>(rq, cfg.rq_sector).unwrap_or(0);
            }
        }
        return 0;
    }
    let mut entry = submitter(rq, &cfg, now, now);
    entry.dev = dev;
    entry.op = op;
    if entry.traced != 0 {
        entry.sector = read::<u64>(rq, cfg.rq_sector).unwrap_or(0);
    }
    track(rq, entry);
    0
}

#[raw_tracepoint(tracepoint = "block_rq_complete")]
pub fn block_rq_complete(ctx: RawTracePointContext) -> i32 {
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let cfg = config();
    // TP_PROTO(struct request *rq, blk_status_t error, unsigned int nr_bytes)
    let rq = ctx.arg::<u64>(0);
    let nr_bytes = ctx.arg::<u64>(2) & 0xffff_ffff;
    // Fired before the request's remaining length is reduced by `nr_bytes`.
    let remaining = read::<u32>(rq, cfg.rq_data_len).unwrap_or(0) as u64;
    let Some(entry) = BLOCK_INFLIGHT.get_ptr_mut(&rq) else {
        // Data-less requests complete without being issued when the flush machinery ends the
        // empty request that asked for a flush (the flush itself is a request of its own).
        // Anything else was issued before the probes attached, or BLOCK_INFLIGHT was full.
        if remaining != 0 {
            count_drop(counters::BLOCK_COMPLETE_WITHOUT_ISSUE);
        }
        return 0;
    };
    if nr_bytes < remaining {
        // A partial completion: the rest follows in another call.
        // SAFETY: a value of `BLOCK_INFLIGHT`, valid while the program runs; one request completes on one CPU at a time.
        unsafe { (*entry).done_bytes += nr_bytes };
        return 0;
    }
    // SAFETY: a value of `BLOCK_INFLIGHT`, valid while the program runs; one request completes on one CPU at a time.
    let e = unsafe { *entry };
    forget(rq);
    if e.issue_ns == 0 {
        // Submitted, never sent to the driver: the empty request that asked for a cache flush
        // (the flush is a request of its own), or one ended early. Not device I/O.
        return 0;
    }
    let tracing = tracing_target();
    if tracing && e.traced == 0 {
        // Another workload's request: the trace records the target's only.
        return 0;
    }
    let bytes = e.done_bytes + nr_bytes;
    // TP_PROTO(..., blk_status_t error, ...): a u8.
    let error = ctx.arg::<u64>(1) as u8;
    if tracing {
        stream(&e, bytes, now, error);
    }
    let key = BlockKey {
        cgroup_id: e.cgroup_id,
        tgid: e.tgid,
        dev: e.dev,
        comm: e.comm,
        op: if error != 0 {
            e.op | block_op::FAILED
        } else {
            e.op
        },
        _pad: [0; 7],
    };
    record_stats(&key, bytes);
    if error != 0 {
        // A failed request moved no data the caller can count on: counted apart, and kept
        // out of the latency histogram, whose count is that of the requests that completed.
        return 0;
    }
    let lkey = BlockLatencyKey {
        cgroup_id: if cfg.latency_by_cgroup != 0 {
            e.cgroup_id
        } else {
            0
        },
        dev: e.dev,
        op: e.op,
        _pad: [0; 3],
    };
    record_latency(&lkey, now.saturating_sub(e.issue_ns));
    0
}

/// Streams one completed request of the target, or counts it lost when the buffer is full.
#[inline(always)]
fn stream(e: &BlockInflight, bytes: u64, now: u64, error: u8) {
    let Some(mut entry) = TRACE_BLOCK_EVENTS.reserve::<BlockTraceEvent>(0) else {
        count_drop(counters::TRACE_BLOCK_RINGBUF_FULL);
        return;
    };
    // SAFETY: a ring-buffer record reserved for this program, of this type, until it is submitted.
    let out = unsafe { &mut *entry.as_mut_ptr() };
    out.submit_ns = e.submit_ns;
    out.issue_ns = e.issue_ns;
    out.complete_ns = now;
    out.sector = e.sector;
    out.bytes = bytes;
    out.cgroup_id = e.cgroup_id;
    out.tgid = e.tgid;
    out.dev = e.dev;
    out.comm = e.comm;
    out.op = e.op;
    out.error = error;
    out._pad = [0; 6];
    entry.submit(0);
}

#[inline(always)]
fn add(slot: *mut u64, v: u64) {
    // SAFETY: `slot` points into a map value that lives as long as the program runs; other
    // CPUs update it concurrently, hence the atomic add (its result unused: a plain XADD).
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(slot, v) };
}

/// Adds a completed request to its key's bytes and requests. A new key of a process is
/// created only while its cgroup's processes hold fewer than `BLOCK_TENANT_ENTRIES` keys and
/// all processes fewer than `BLOCK_OWN_ENTRIES`; past either, or with the map full, the request
/// counts under its cgroup's shared key for the device and op (tgid 0, no name), which alone
/// may take the rest of the map. A BPF subprogram: off the completion's common path (an
/// existing key).
#[inline(never)]
fn record_stats(key: &BlockKey, bytes: u64) {
    if add_stats(key, bytes) {
        return;
    }
    // SAFETY: loader-set globals.
    let (bound, own) = unsafe {
        (
            core::ptr::read_volatile(&BLOCK_TENANT_ENTRIES) as i64,
            core::ptr::read_volatile(&BLOCK_OWN_ENTRIES) as i64,
        )
    };
    let fits = bound == 0 || (held(key.cgroup_id) < bound && held(block_held::ALL_ENTRIES) < own);
    if fits {
        match insert_stats(key, bytes) {
            Inserted::Created => {
                if bound != 0 {
                    count_held(key.cgroup_id, 1);
                    count_held(block_held::ALL_ENTRIES, 1);
                }
                return;
            }
            Inserted::Added => return,
            Inserted::Full => {}
        }
    }
    let folded = BlockKey {
        tgid: 0,
        comm: [0; 16],
        ..*key
    };
    if !add_stats(&folded, bytes) && matches!(insert_stats(&folded, bytes), Inserted::Full) {
        count_drop(counters::BLOCK_STATS_FULL);
    }
}

/// Adds one request of `bytes` to an existing key; false when the key has none.
#[inline(always)]
fn add_stats(key: &BlockKey, bytes: u64) -> bool {
    match BLOCK_STATS.get_ptr_mut(key) {
        Some(stats) => {
            // SAFETY: a value of `BLOCK_STATS`, valid while the program runs; only its fields'
            // addresses are taken, and `add` updates them atomically.
            unsafe {
                add(&raw mut (*stats).bytes, bytes);
                add(&raw mut (*stats).requests, 1);
            }
            true
        }
        None => false,
    }
}

/// What [`insert_stats`] did.
enum Inserted {
    /// Created the key with this request.
    Created,
    /// Another CPU created it first; added to it.
    Added,
    /// The map is full: nothing counted.
    Full,
}

#[inline(always)]
fn insert_stats(key: &BlockKey, bytes: u64) -> Inserted {
    let fresh = BlockStats { bytes, requests: 1 };
    match BLOCK_STATS.insert(key, &fresh, BPF_NOEXIST as u64) {
        Ok(()) => Inserted::Created,
        // Another CPU created the entry between our lookup and insert: add to theirs.
        Err(EEXIST) if add_stats(key, bytes) => Inserted::Added,
        Err(_) => Inserted::Full,
    }
}

#[inline(always)]
fn add_latency(hist: *mut BlockLatency, bucket: usize, ns: u64) {
    // SAFETY: `hist` is a value of `BLOCK_LATENCY`, valid while the program runs; only its
    // fields' addresses are taken, and `add` updates them atomically.
    unsafe {
        add(&raw mut (*hist).sum_ns, ns);
        if let Some(b) = (*hist).buckets.get_mut(bucket) {
            add(b, 1);
        }
    }
}

#[inline(always)]
fn record_latency(key: &BlockLatencyKey, ns: u64) {
    let bucket = hist::bucket_index(ns);
    if let Some(h) = BLOCK_LATENCY.get_ptr_mut(key) {
        add_latency(h, bucket, ns);
        return;
    }
    let mut fresh = BlockLatency::ZERO;
    fresh.sum_ns = ns;
    if let Some(b) = fresh.buckets.get_mut(bucket) {
        *b = 1;
    }
    match BLOCK_LATENCY.insert(key, &fresh, BPF_NOEXIST as u64) {
        Ok(()) => {}
        Err(EEXIST) => {
            if let Some(h) = BLOCK_LATENCY.get_ptr_mut(key) {
                add_latency(h, bucket, ns);
            }
        }
        Err(_) => count_drop(counters::BLOCK_LATENCY_FULL),
    }
}
