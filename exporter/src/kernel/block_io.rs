//! The block I/O probe family (`ebpf/probes/src/block_io.rs`) from user space: what the
//! probes need to know of the running kernel before the load (the offsets of `struct request`
//! and friends in its BTF, global `BLOCK_CONFIG`, see [`plan`]), the sizes of its maps, and
//! attaching its programs (`block_rq_issue`, `block_rq_complete`, `block_io_start`) with its maps
//! taken: `BLOCK_STATS` and `BLOCK_LATENCY` (cumulative, read through [`HashReader`]) and
//! `BLOCK_INFLIGHT` (requests issued and not yet completed) for the block I/O collector
//! ([`BlockMaps`]); `BLOCK_STATS` and the `TRACE_BLOCK_EVENTS` ring buffer of the trace
//! target's requests for `sysscope trace`'s block tracks ([`BlockTrace`]).

use std::{collections::HashMap, os::fd::AsRawFd, path::Path, time::Duration};

use aya::maps::{HashMap as BpfHashMap, MapData, MapError, RingBuf};
use sysscope_abi::{
    block_held, block_op, maps, programs, BlockInflight, BlockKey, BlockLatency, BlockLatencyKey,
    BlockProbeConfig, BlockStats, BlockTraceEvent,
};

use super::{
    btf::{Btf, BtfError, MemberKind},
    cumulative::HashReader,
    read_err, ring, ProbeError, Probes,
};
use crate::{
    config::Config,
    util::{clock::monotonic_ns, error::Chain},
};

/// `BLOCK_LATENCY` capacity when latency is kept per (device, op) only.
const LATENCY_DEVICE_OP_ENTRIES: u32 = 1024;

/// Capacity of `BLOCK_LATENCY` for this config.
pub(crate) fn latency_capacity(config: &Config) -> u32 {
    if config.block_io.latency_by_cgroup {
        config.block_io.max_entries
    } else {
        LATENCY_DEVICE_OP_ENTRIES
    }
}

/// This family's map sizes for `config`, which the loader applies.
pub(crate) fn map_sizes(config: &Config) -> [(&'static str, u32); 4] {
    let block = &config.block_io;
    [
        (maps::BLOCK_INFLIGHT, block.max_inflight),
        (maps::BLOCK_STATS, block.max_entries),
        (maps::BLOCK_LATENCY, latency_capacity(config)),
        // A count per cgroup holding entries of either map, and the two counts of all.
        (
            maps::BLOCK_HELD,
            (block.max_entries.min(block.max_inflight) / 2).max(64) + 2,
        ),
    ]
}

/// The per-tenant bounds of the block maps for `config`, as the globals the loader sets:
/// (`BLOCK_TENANT_ENTRIES`, `BLOCK_OWN_ENTRIES`, `BLOCK_TENANT_INFLIGHT`,
/// `BLOCK_OWN_INFLIGHT`, `BLOCK_LIGHT_INFLIGHT`).
pub(crate) fn bounds(config: &Config) -> [(&'static str, u32); 5] {
    let block = &config.block_io;
    [
        (
            sysscope_abi::globals::BLOCK_TENANT_ENTRIES,
            block_held::tenant_share(block.max_entries),
        ),
        (
            sysscope_abi::globals::BLOCK_OWN_ENTRIES,
            block_held::own_share(block.max_entries),
        ),
        (
            sysscope_abi::globals::BLOCK_TENANT_INFLIGHT,
            block_held::tenant_share(block.max_inflight),
        ),
        (
            sysscope_abi::globals::BLOCK_OWN_INFLIGHT,
            block_held::own_share(block.max_inflight),
        ),
        (
            sysscope_abi::globals::BLOCK_LIGHT_INFLIGHT,
            block_held::light_inflight(block.max_inflight),
        ),
    ]
}

/// `BLOCK_HELD`: what the per-tenant bounds of `BLOCK_STATS` and `BLOCK_INFLIGHT` count.
/// The probes count up (and, for requests, down) as they go; user space sets each count to
/// the exact figure after every read, so what a race between the two loses is made good at
/// the next read.
pub(crate) struct Held(BpfHashMap<MapData, u64, u64>);

/// Which counts of `BLOCK_HELD` a [`Held::set`] replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeldKind {
    /// `BLOCK_STATS` entries of each cgroup's processes (keyed by cgroup id).
    Entries,
    /// `BLOCK_INFLIGHT` requests of each cgroup.
    Inflight,
}

impl Held {
    /// Replaces the counts of `kind` with `counts` (by cgroup id), and their total.
    pub(crate) fn set(&mut self, kind: HeldKind, counts: &HashMap<u64, u64>) {
        let (key_of, all): (fn(u64) -> u64, u64) = match kind {
            HeldKind::Entries => (|id| id, block_held::ALL_ENTRIES),
            HeldKind::Inflight => (block_held::inflight_of, block_held::ALL_INFLIGHT),
        };
        let of_kind = |key: u64| {
            key != block_held::ALL_ENTRIES
                && key != block_held::ALL_INFLIGHT
                && (key & block_held::INFLIGHT != 0) == (kind == HeldKind::Inflight)
        };
        let keep: std::collections::HashSet<u64> = counts.keys().map(|id| key_of(*id)).collect();
        let stale: Vec<u64> = self
            .0
            .keys()
            .filter_map(Result::ok)
            .filter(|k| of_kind(*k) && !keep.contains(k))
            .collect();
        for key in stale {
            let _ = self.0.remove(&key);
        }
        for (id, n) in counts {
            if let Err(e) = self.0.insert(key_of(*id), *n, 0) {
                tracing::debug!(error = %Chain(&e), "could not set a block map's tenant count");
            }
        }
        let total = counts.values().sum::<u64>();
        if let Err(e) = self.0.insert(all, total, 0) {
            tracing::debug!(error = %Chain(&e), "could not set a block map's total count");
        }
    }
}

/// The block probes attached, with their maps.
pub(crate) struct BlockMaps {
    pub(crate) stats: HashReader<BlockKey, BlockStats>,
    pub(crate) latency: HashReader<BlockLatencyKey, BlockLatency>,
    pub(crate) inflight: Inflight,
    pub(crate) held: Held,
}

/// `BLOCK_INFLIGHT`: the requests issued (or submitted) and not completed yet, by `struct
/// request` address.
pub(crate) struct Inflight(BpfHashMap<MapData, u64, BlockInflight>);

/// What a sweep of `BLOCK_INFLIGHT` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sweep {
    /// Requests in flight after the sweep.
    pub(crate) in_flight: u64,
    /// Requests issued to the device that never completed, removed by the sweep.
    pub(crate) expired: u64,
    /// Requests in flight after the sweep that count in their cgroup's bound, by cgroup.
    pub(crate) by_cgroup: HashMap<u64, u64>,
}

impl Inflight {
    /// Counts the requests in flight and removes those in flight longer than `stale_after`:
    /// they will never complete (device gone, completion missed).
    pub(crate) fn sweep(&mut self, stale_after: Duration) -> Sweep {
        let now = monotonic_ns();
        let stale_ns = stale_after.as_nanos() as u64;
        let mut stale = Vec::new();
        let mut seen = 0u64;
        let mut by_cgroup: HashMap<u64, u64> = HashMap::new();
        for item in self.0.iter() {
            let Ok((rq, entry)) = item else { continue };
            seen += 1;
            if entry.counted != 0 {
                *by_cgroup.entry(entry.cgroup_id).or_default() += 1;
            }
            let since = entry.issue_ns.max(entry.submit_ns);
            if now.saturating_sub(since) > stale_ns {
                // Submitted but never issued: merged into another request and freed without
                // a tracepoint. Normal, not counted; issued and never completed is.
                stale.push((rq, entry.issue_ns != 0, entry.counted != 0, entry.cgroup_id));
            }
        }
        let mut expired = 0;
        for (rq, issued, counted, cgroup_id) in &stale {
            if self.0.remove(rq).is_ok() {
                expired += *issued as u64;
                seen -= 1;
                if *counted {
                    if let Some(n) = by_cgroup.get_mut(cgroup_id) {
                        *n -= 1;
                    }
                }
            }
        }
        by_cgroup.retain(|_, n| *n != 0);
        Sweep {
            in_flight: seen,
            expired,
            by_cgroup,
        }
    }
}

impl BlockMaps {
    /// Takes the block maps and attaches the probes to `block_io.tracepoints` (completion,
    /// then issue), plus `block_io_start` when the kernel has it, recording them under
    /// `collector`. The object must have been loaded with `plan.probe`. On failure nothing
    /// stays attached.
    pub(crate) fn attach(
        probes: &mut Probes,
        collector: &'static str,
        config: &Config,
        plan: &BlockIoPlan,
    ) -> Result<Self, BlockIoError> {
        let tracepoints = &config.block_io.tracepoints;
        let [issue_tp, complete_tp] = tracepoints.as_slice() else {
            return Err(BlockIoError::Tracepoints(tracepoints.clone()));
        };
        let map_err = |name: &'static str| {
            move |source| ProbeError::Map {
                map: name.into(),
                source,
            }
        };
        let stats = HashReader::new(
            BpfHashMap::try_from(probes.take_map(maps::BLOCK_STATS)?)
                .map_err(map_err(maps::BLOCK_STATS))?,
        );
        let latency = HashReader::new(
            BpfHashMap::try_from(probes.take_map(maps::BLOCK_LATENCY)?)
                .map_err(map_err(maps::BLOCK_LATENCY))?,
        );
        let inflight = BpfHashMap::try_from(probes.take_map(maps::BLOCK_INFLIGHT)?)
            .map(Inflight)
            .map_err(map_err(maps::BLOCK_INFLIGHT))?;
        let held = BpfHashMap::try_from(probes.take_map(maps::BLOCK_HELD)?)
            .map(Held)
            .map_err(map_err(maps::BLOCK_HELD))?;
        attach_programs(probes, collector, issue_tp, complete_tp, plan)?;
        Ok(Self {
            stats,
            latency,
            inflight,
            held,
        })
    }
}

/// Attaches the block programs under `collector`: completion first (once requests are
/// recorded, their completions are handled), then issue, then `block_io_start` when the kernel
/// has it. On failure every program of `collector` is detached again.
fn attach_programs(
    probes: &mut Probes,
    collector: &'static str,
    issue: &str,
    complete: &str,
    plan: &BlockIoPlan,
) -> Result<(), ProbeError> {
    let attached = probes
        .attach_raw_tracepoint(collector, programs::BLOCK_RQ_COMPLETE, complete)
        .and_then(|()| probes.attach_raw_tracepoint(collector, programs::BLOCK_RQ_ISSUE, issue))
        .and_then(|()| {
            if plan.attribute_at_submit {
                probes.attach_raw_tracepoint(collector, programs::BLOCK_IO_START, SUBMIT_TRACEPOINT)
            } else {
                Ok(())
            }
        });
    if attached.is_err() {
        probes.detach_collector(collector);
    }
    attached
}

/// The block probes attached in trace mode (the object loaded with the global `BLOCK_TRACE`
/// set, [`super::LoadOptions::block_trace`]): `BLOCK_STATS` then holds only the trace
/// target's requests, and each of them is also streamed to `TRACE_BLOCK_EVENTS`.
pub(crate) struct BlockTrace {
    ring: RingBuf<MapData>,
    stats: BpfHashMap<MapData, BlockKey, BlockStats>,
}

impl std::fmt::Debug for BlockTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockTrace").finish_non_exhaustive()
    }
}

impl BlockTrace {
    /// Takes `BLOCK_STATS` and `TRACE_BLOCK_EVENTS` and attaches the block programs to
    /// `issue` and `complete` under `collector`. The object must have been loaded with
    /// `plan.probe` and `block_trace` set. On failure nothing stays attached.
    pub(crate) fn attach(
        probes: &mut Probes,
        collector: &'static str,
        issue: &str,
        complete: &str,
        plan: &BlockIoPlan,
    ) -> Result<Self, ProbeError> {
        let stats = BpfHashMap::try_from(probes.take_map(maps::BLOCK_STATS)?)
            .map_err(read_err(maps::BLOCK_STATS))?;
        let ring = RingBuf::try_from(probes.take_map(maps::TRACE_BLOCK_EVENTS)?)
            .map_err(read_err(maps::TRACE_BLOCK_EVENTS))?;
        attach_programs(probes, collector, issue, complete, plan)?;
        Ok(Self { ring, stats })
    }

    /// The ring buffer's descriptor, to poll together with the syscall stream.
    pub(crate) fn fd(&self) -> i32 {
        self.ring.as_raw_fd()
    }

    /// Hands every request waiting in `TRACE_BLOCK_EVENTS` to `each`; returns how many.
    pub(crate) fn drain(&mut self, each: impl FnMut(&BlockTraceEvent)) -> u64 {
        ring::drain(&mut self.ring, each)
    }

    /// Hands every `BLOCK_STATS` entry to `each`; an error ends the walk early.
    pub(crate) fn read_stats(
        &self,
        mut each: impl FnMut(&BlockKey, &BlockStats),
    ) -> Result<(), MapError> {
        for item in self.stats.iter() {
            let (key, stats) = item?;
            each(&key, &stats);
        }
        Ok(())
    }
}

/// Tracepoint whose context is the task that submitted a request (6.5 and later).
pub(crate) const SUBMIT_TRACEPOINT: &str = "block_io_start";
/// The tracepoints whose prototypes the issue and completion programs are written for.
const ISSUE_PROTOTYPE: &str = "block_rq_issue";
const COMPLETE_PROTOTYPE: &str = "block_rq_complete";

#[derive(Debug, thiserror::Error)]
pub(crate) enum BlockIoError {
    #[error("cannot find the kernel's block request layout")]
    Btf(#[from] BtfError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(
        "block_io.tracepoints must name the issue and the completion tracepoint, in that \
         order (got {0:?})"
    )]
    Tracepoints(Vec<String>),
    #[error("block_io.tracepoints: tracepoint `{name}` {problem}")]
    Tracepoint { name: String, problem: String },
}

/// What [`plan`] found out about the running kernel, for the loader and [`BlockMaps::attach`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockIoPlan {
    /// Handed to the probes as the global `BLOCK_CONFIG`.
    pub(crate) probe: BlockProbeConfig,
    /// Whether `block_io_start` exists: requests are then attributed at submission.
    pub(crate) attribute_at_submit: bool,
}

/// Whether the `io` controller is bound to the cgroup v2 hierarchy mounted at `root`: only
/// then is a bio's cgroup a v2 cgroup whose id the labeler can resolve. (On hybrid layouts it
/// lives on the v1 `blkio` hierarchy.)
pub(crate) fn io_controller_on_v2(root: &Path) -> bool {
    std::fs::read_to_string(root.join("cgroup.controllers"))
        .map(|s| s.split_whitespace().any(|c| c == "io"))
        .unwrap_or(false)
}

/// What the probes need, from the running kernel's BTF and the cgroup layout; checks that
/// the configured tracepoints exist with the prototypes the programs are written for.
pub(crate) fn plan(config: &Config, cgroup_root: &Path) -> Result<BlockIoPlan, BlockIoError> {
    let btf = Btf::from_kernel()?;
    let tracepoints = &config.block_io.tracepoints;
    let [issue, complete] = tracepoints.as_slice() else {
        return Err(BlockIoError::Tracepoints(tracepoints.clone()));
    };
    check_tracepoint(&btf, issue, ISSUE_PROTOTYPE)?;
    check_tracepoint(&btf, complete, COMPLETE_PROTOTYPE)?;
    let attribute_at_submit = btf.tracepoint_proto(SUBMIT_TRACEPOINT).is_some()
        && btf.tracepoint_proto(SUBMIT_TRACEPOINT) == btf.tracepoint_proto(ISSUE_PROTOTYPE);
    let bio_cgroup = io_controller_on_v2(cgroup_root);
    let probe = resolve_offsets(&btf, bio_cgroup, config.block_io.latency_by_cgroup)?;
    tracing::info!(
        bio_cgroup = probe.bio_cgroup != 0,
        at_submit = attribute_at_submit,
        "block I/O: requests are charged to the {} task's cgroup{}",
        if attribute_at_submit {
            "submitting"
        } else {
            "issuing"
        },
        if probe.bio_cgroup != 0 {
            ", or to the bio's cgroup when submitted on its behalf"
        } else {
            " (the io controller is not on cgroup v2)"
        }
    );
    Ok(BlockIoPlan {
        probe,
        attribute_at_submit,
    })
}

/// `name` must exist and take the same arguments as `like`. Kernels whose BTF lists no
/// tracepoints (before 5.5) are not checked here: attaching tells.
fn check_tracepoint(btf: &Btf, name: &str, like: &str) -> Result<(), BlockIoError> {
    let Some(expected) = btf.tracepoint_proto(like) else {
        return Ok(());
    };
    match btf.tracepoint_proto(name) {
        None => Err(BlockIoError::Tracepoint {
            name: name.to_string(),
            problem: "does not exist on this kernel".into(),
        }),
        Some(p) if p != expected => Err(BlockIoError::Tracepoint {
            name: name.to_string(),
            problem: format!("takes other arguments than `{like}`, which the probe is written for"),
        }),
        Some(_) => Ok(()),
    }
}

/// The probes' view of the kernel's structs, from `btf`. `want_bio_cgroup` asks for the
/// offsets of the bio -> cgroup chain; when the kernel lacks one of them (no
/// `CONFIG_BLK_CGROUP`), bio attribution is off and the rest still works.
pub fn resolve_offsets(
    btf: &Btf,
    want_bio_cgroup: bool,
    latency_by_cgroup: bool,
) -> Result<BlockProbeConfig, BtfError> {
    use MemberKind::{Composite, Int, Pointer};
    let mut c = BlockProbeConfig::UNSET;
    c.rq_cmd_flags = btf.field_of_kind("request", "cmd_flags", Int(4))?;
    c.rq_data_len = btf.field_of_kind("request", "__data_len", Int(4))?;
    c.rq_bio = btf.field_of_kind("request", "bio", Pointer)?;
    // Only the trace reads the sector: a kernel without it still counts.
    c.rq_sector = btf
        .field_of_kind("request", "__sector", Int(8))
        .unwrap_or(sysscope_abi::NO_FIELD);
    // Before 5.17 the disk hung off the request itself; since, off its queue.
    match btf.field_of_kind("request", "rq_disk", Pointer) {
        Ok(off) => c.rq_disk = off,
        Err(_) => {
            c.rq_q = btf.field_of_kind("request", "q", Pointer)?;
            c.q_disk = btf.field_of_kind("request_queue", "disk", Pointer)?;
        }
    }
    c.disk_major = btf.field_of_kind("gendisk", "major", Int(4))?;
    c.disk_first_minor = btf.field_of_kind("gendisk", "first_minor", Int(4))?;
    // `enum req_op` since 6.0, `enum req_opf` before.
    let op = |name: &str, fallback: u32| {
        ["req_op", "req_opf"]
            .iter()
            .find_map(|e| btf.enum_value(e, name))
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(fallback)
    };
    let linux = block_op::ReqOps::LINUX;
    c.ops = block_op::ReqOps {
        read: op("REQ_OP_READ", linux.read),
        write: op("REQ_OP_WRITE", linux.write),
        flush: op("REQ_OP_FLUSH", linux.flush),
        discard: op("REQ_OP_DISCARD", linux.discard),
        secure_erase: op("REQ_OP_SECURE_ERASE", linux.secure_erase),
        zone_append: op("REQ_OP_ZONE_APPEND", linux.zone_append),
    };
    if want_bio_cgroup {
        let chain = (|| -> Result<[u32; 7], BtfError> {
            Ok([
                btf.field_of_kind("bio", "bi_blkg", Pointer)?,
                btf.field_of_kind("blkcg_gq", "blkcg", Pointer)?,
                btf.field("blkcg", "css").and_then(|f| match f.kind {
                    Composite(_) => Ok(f.offset),
                    other => Err(BtfError::UnexpectedType {
                        strukt: "blkcg".into(),
                        member: "css".into(),
                        found: other.to_string(),
                        expected: "a struct".into(),
                    }),
                })?,
                btf.field_of_kind("cgroup_subsys_state", "cgroup", Pointer)?,
                btf.field_of_kind("cgroup", "kn", Pointer)?,
                btf.field_of_kind("cgroup", "level", Int(4))?,
                btf.field_of_kind("kernfs_node", "id", Int(8))?,
            ])
        })();
        match chain {
            Ok([blkg, blkcg, css, cgroup, kn, level, id]) => {
                c.bio_blkg = blkg;
                c.blkg_blkcg = blkcg;
                c.blkcg_css = css;
                c.css_cgroup = cgroup;
                c.cgroup_kn = kn;
                c.cgroup_level = level;
                c.kn_id = id;
                c.bio_cgroup = 1;
            }
            Err(e) => {
                tracing::warn!(error = %Chain(&e), "block I/O: cannot follow a bio to its cgroup; charging the issuing task's cgroup");
            }
        }
    }
    c.latency_by_cgroup = latency_by_cgroup as u32;
    c.ready = 1;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_controller_detection_reads_cgroup_controllers() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!io_controller_on_v2(dir.path()));
        std::fs::write(
            dir.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        assert!(io_controller_on_v2(dir.path()));
        std::fs::write(dir.path().join("cgroup.controllers"), "hugetlb iox\n").unwrap();
        assert!(!io_controller_on_v2(dir.path()));
    }

    #[test]
    fn offsets_resolve_on_this_kernel() {
        let Some(btf) = crate::kernel::btf::for_test("offsets_resolve_on_this_kernel") else {
            return;
        };
        let c = resolve_offsets(&btf, true, false).unwrap();
        assert_eq!(c.ready, 1);
        // Every op kept its number since 4.10 but zone append, which moved from 13 to 7 in
        // 6.x's renumbering of the zone ops: whichever this kernel has, BTF named it.
        assert!(
            c.ops.zone_append == 13 || c.ops.zone_append == 7,
            "{:?}",
            c.ops
        );
        assert_eq!(
            block_op::ReqOps {
                zone_append: block_op::ReqOps::LINUX.zone_append,
                ..c.ops
            },
            block_op::ReqOps::LINUX
        );
        // One of the two ways to the disk is known, and the bio chain is complete.
        assert!(c.rq_disk != sysscope_abi::NO_FIELD || c.q_disk != sysscope_abi::NO_FIELD);
        if c.bio_cgroup != 0 {
            assert_ne!(c.kn_id, sysscope_abi::NO_FIELD);
        }
        let off = resolve_offsets(&btf, false, true).unwrap();
        assert_eq!((off.bio_cgroup, off.latency_by_cgroup), (0, 1));
    }
}
