//! The block I/O collector: bytes, requests and issue-to-completion latency of block requests,
//! per workload, device and operation.
//!
//! Probes: `block_rq_issue`, `block_rq_complete` (raw tracepoints, see
//! `ebpf/probes/src/block_io.rs`), which read `struct request` at offsets this module finds in
//! the kernel's BTF before the object is loaded ([`plan`], global `BLOCK_CONFIG`).
//! Maps read: `BLOCK_STATS`, `BLOCK_LATENCY`; `BLOCK_INFLIGHT` is swept of requests that
//! never completed. Metrics: `sysscope_block_io_bytes_total`,
//! `sysscope_block_io_requests_total`, `sysscope_block_io_duration_seconds`.
//!
//! Like the syscall collector, each refresh adds what changed in every kernel entry to the
//! entry's series, so series are monotonic sums over processes that come and go. Exited
//! processes are not reported to this collector (the syscall collector drains the exit
//! queue), so entries are reclaimed when their tgid has been gone for two checks in a row,
//! after their last values were read: I/O still in flight when a process exits completes
//! between the two checks and is not lost.

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use prometheus_client::{
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
};
use sysscope_abi::{
    block_op, hist, maps, programs, BlockInflight, BlockKey, BlockLatency, BlockLatencyKey,
    BlockProbeConfig, BlockStats,
};

use super::{Collector, CollectorError, Health, MapUsage};
use crate::{
    btf::{Btf, BtfError, MemberKind},
    config::Config,
    hist::{exported_bounds, fold_buckets},
    metadata::{cgroups::UNRESOLVED, devices::DeviceResolver, SharedLabeler},
    probes::{block_latency_capacity as latency_capacity, ProbeError, Probes},
    series::{Budget, CgroupLabels, Workload, OTHER},
    util::clock::monotonic_ns,
    util::error::Chain,
};

pub const NAME: &str = "block_io";

/// Families named in `sysscope_dropped_series_total{family}`.
const IO_FAMILY: &str = "block_io";
const LATENCY_FAMILY: &str = "block_io_latency";

/// A request in flight longer than this never completed (device gone, completion missed):
/// its `BLOCK_INFLIGHT` entry is removed and counted. Far beyond any SCSI or NVMe timeout.
pub const INFLIGHT_STALE_AFTER: Duration = Duration::from_secs(300);

/// How often tgids and cgroups behind kernel entries are checked for having gone away.
const RECLAIM_INTERVAL: Duration = Duration::from_secs(5);

/// How long values of a cgroup id that cannot be named yet are held back (not exported)
/// before they are exported as `(unresolved)`: a cgroup created an instant before its first
/// I/O can miss the hierarchy walk of that cycle, and a series must not start unnamed.
const UNRESOLVED_GRACE: Duration = Duration::from_secs(10);

/// Tracepoint whose context is the task that submitted a request (6.5 and later).
pub const SUBMIT_TRACEPOINT: &str = "block_io_start";
/// The tracepoints whose prototypes the issue and completion programs are written for.
const ISSUE_PROTOTYPE: &str = "block_rq_issue";
const COMPLETE_PROTOTYPE: &str = "block_rq_complete";

#[derive(Debug, thiserror::Error)]
pub enum BlockIoError {
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

/// What [`plan`] found out about the running kernel, for the loader and [`BlockIoCollector::start`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockIoPlan {
    /// Handed to the probes as the global `BLOCK_CONFIG`.
    pub probe: BlockProbeConfig,
    /// Whether `block_io_start` exists: requests are then attributed at submission.
    pub attribute_at_submit: bool,
}

/// Whether the `io` controller is bound to the cgroup v2 hierarchy mounted at `root`: only
/// then is a bio's cgroup a v2 cgroup whose id the labeler can resolve. (On hybrid layouts it
/// lives on the v1 `blkio` hierarchy.)
pub fn io_controller_on_v2(root: &Path) -> bool {
    std::fs::read_to_string(root.join("cgroup.controllers"))
        .map(|s| s.split_whitespace().any(|c| c == "io"))
        .unwrap_or(false)
}

/// What the probes need, from the running kernel's BTF and the cgroup layout; checks that
/// the configured tracepoints exist with the prototypes the programs are written for.
pub fn plan(config: &Config, cgroup_root: &Path) -> Result<BlockIoPlan, BlockIoError> {
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

/// (workload, device, op) of the bytes and requests counters.
type IoKey = (Workload, Arc<str>, u8);
/// (cgroup when latency is kept per cgroup, device, op) of the latency histogram.
type LatKey = (Option<Arc<CgroupLabels>>, Arc<str>, u8);

/// What was last read from one kernel entry, and where its values go (`None` until its
/// cgroup could be named, see [`UNRESOLVED_GRACE`]).
#[derive(Debug)]
struct StatEntry {
    last: BlockStats,
    target: Option<IoKey>,
    cgroup_path: Option<Arc<str>>,
    first_seen: Instant,
    seen: u64,
}

#[derive(Debug)]
struct LatEntry {
    last: BlockLatency,
    target: Option<LatKey>,
    cgroup_path: Option<Arc<str>>,
    first_seen: Instant,
    seen: u64,
}

/// The labels of cgroup `id`, walking the hierarchy again (once per refresh) when the shared
/// labeler does not know it; `None` while the id is unknown and still within its grace.
fn cgroup_labels(
    labeler: &mut crate::metadata::Labeler,
    id: u64,
    rescanned: &mut bool,
    first_seen: Instant,
    now: Instant,
) -> Option<Arc<CgroupLabels>> {
    let mut labels = labeler.cgroup(id);
    if &*labels.path == UNRESOLVED && !*rescanned {
        // The labeler remembers ids it could not find for a while; a walk settles it.
        labeler.cgroups.rescan();
        *rescanned = true;
        labels = labeler.cgroup(id);
    }
    if &*labels.path == UNRESOLVED && now.duration_since(first_seen) < UNRESOLVED_GRACE {
        return None;
    }
    Some(labels)
}

#[derive(Debug)]
struct IoTotals {
    bytes: u64,
    requests: u64,
    last_change: Instant,
}

#[derive(Debug)]
struct LatTotals {
    sum_ns: u64,
    buckets: [u64; hist::HIST_BUCKETS],
    last_change: Instant,
}

impl LatTotals {
    fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// What changed between two reads. An entry that went backwards was deleted and re-created
/// in between: everything it holds now is new.
fn stats_delta(prev: &BlockStats, cur: &BlockStats) -> BlockStats {
    if cur.bytes < prev.bytes || cur.requests < prev.requests {
        return *cur;
    }
    BlockStats {
        bytes: cur.bytes - prev.bytes,
        requests: cur.requests - prev.requests,
    }
}

fn latency_delta(prev: &BlockLatency, cur: &BlockLatency) -> BlockLatency {
    let went_back = cur.sum_ns < prev.sum_ns
        || cur
            .buckets
            .iter()
            .zip(prev.buckets.iter())
            .any(|(c, p)| c < p);
    if went_back {
        return *cur;
    }
    let mut d = BlockLatency::ZERO;
    d.sum_ns = cur.sum_ns - prev.sum_ns;
    for (i, b) in d.buckets.iter_mut().enumerate() {
        *b = cur.buckets[i] - prev.buckets[i];
    }
    d
}

/// The `comm` label of a kernel-recorded name. Kernel worker threads are named after their
/// pool and CPU (`kworker/u8:3`, `swapper/1`): they fold into one name each so they do not
/// multiply series.
pub fn comm_label(comm: &[u8; 16]) -> Arc<str> {
    let name = crate::metadata::processes::comm_from_bytes(comm);
    for family in ["kworker", "swapper"] {
        if name
            .strip_prefix(family)
            .is_some_and(|rest| rest.starts_with('/'))
        {
            return Arc::from(family);
        }
    }
    name
}

/// Whether a kernel map delete left the key absent (deleted now, or already gone).
fn deleted(result: Result<(), aya::maps::MapError>) -> bool {
    match result {
        Ok(()) | Err(aya::maps::MapError::KeyNotFound) => true,
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::ENOENT) =>
        {
            true
        }
        Err(e) => {
            tracing::debug!(error = %e, "block I/O: deleting a kernel entry failed; retried later");
            false
        }
    }
}

fn cgroup_gone(root: &Path, path: &str) -> bool {
    path == UNRESOLVED || !root.join(path.trim_start_matches('/')).exists()
}

pub struct BlockIoCollector {
    stats: BpfHashMap<MapData, BlockKey, BlockStats>,
    latency: BpfHashMap<MapData, BlockLatencyKey, BlockLatency>,
    inflight: BpfHashMap<MapData, u64, BlockInflight>,
    /// Capacities of BLOCK_STATS, BLOCK_LATENCY, BLOCK_INFLIGHT.
    capacities: [u64; 3],
    /// Entries seen at the last read, same order.
    entries_seen: [u64; 3],
    labeler: SharedLabeler,
    devices: DeviceResolver,
    entries: HashMap<BlockKey, StatEntry>,
    lat_entries: HashMap<BlockLatencyKey, LatEntry>,
    io_series: HashMap<IoKey, IoTotals>,
    lat_series: HashMap<LatKey, LatTotals>,
    budget: Budget<IoKey>,
    lat_budget: Budget<LatKey>,
    bounds: Vec<(usize, f64)>,
    by_cgroup: bool,
    retention: Duration,
    generation: u64,
    /// tgids and cgroup ids found gone at the previous check: reclaimed if still gone.
    dead_tgids: HashSet<u32>,
    gone_cgroups: HashSet<u64>,
    last_reclaim_check: Instant,
    /// In-flight entries removed because their request never completed.
    expired_inflight: u64,
    /// Whether this refresh walked every kernel entry.
    walk_complete: bool,
}

impl std::fmt::Debug for BlockIoCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockIoCollector")
            .field("entries", &self.entries.len())
            .field("io_series", &self.io_series.len())
            .field("lat_series", &self.lat_series.len())
            .finish_non_exhaustive()
    }
}

impl BlockIoCollector {
    /// Takes the block maps and attaches the probes to `block_io.tracepoints` (issue, then
    /// completion), plus `block_io_start` when the kernel has it. The object must have been
    /// loaded with `plan.probe`. On failure nothing stays attached.
    pub fn start(
        probes: &mut Probes,
        config: &Config,
        labeler: SharedLabeler,
        plan: &BlockIoPlan,
    ) -> Result<Self, BlockIoError> {
        let block = &config.block_io;
        let [issue_tp, complete_tp] = block.tracepoints.as_slice() else {
            return Err(BlockIoError::Tracepoints(block.tracepoints.clone()));
        };
        let map_err = |name: &'static str| {
            move |source| ProbeError::Map {
                map: name.into(),
                source,
            }
        };
        let stats = BpfHashMap::try_from(probes.take_map(maps::BLOCK_STATS)?)
            .map_err(map_err(maps::BLOCK_STATS))?;
        let latency = BpfHashMap::try_from(probes.take_map(maps::BLOCK_LATENCY)?)
            .map_err(map_err(maps::BLOCK_LATENCY))?;
        let inflight = BpfHashMap::try_from(probes.take_map(maps::BLOCK_INFLIGHT)?)
            .map_err(map_err(maps::BLOCK_INFLIGHT))?;
        // Completion first: once requests are recorded, their completions are handled.
        let attached = probes
            .attach_raw_tracepoint(NAME, programs::BLOCK_RQ_COMPLETE, complete_tp)
            .and_then(|()| probes.attach_raw_tracepoint(NAME, programs::BLOCK_RQ_ISSUE, issue_tp))
            .and_then(|()| {
                if plan.attribute_at_submit {
                    probes.attach_raw_tracepoint(NAME, programs::BLOCK_IO_START, SUBMIT_TRACEPOINT)
                } else {
                    Ok(())
                }
            });
        if let Err(e) = attached {
            probes.detach_collector(NAME);
            return Err(e.into());
        }
        let max_series = config.limits.max_series;
        Ok(Self {
            stats,
            latency,
            inflight,
            capacities: [
                block.max_entries as u64,
                latency_capacity(config) as u64,
                block.max_inflight as u64,
            ],
            entries_seen: [0; 3],
            labeler,
            devices: DeviceResolver::default(),
            entries: HashMap::new(),
            lat_entries: HashMap::new(),
            io_series: HashMap::new(),
            lat_series: HashMap::new(),
            budget: Budget::new(max_series),
            lat_budget: Budget::new(max_series),
            bounds: exported_bounds(config.syscalls.histogram_resolution),
            by_cgroup: block.latency_by_cgroup,
            retention: config.collection.series_retention,
            generation: 0,
            dead_tgids: HashSet::new(),
            gone_cgroups: HashSet::new(),
            last_reclaim_check: Instant::now(),
            expired_inflight: 0,
            walk_complete: true,
        })
    }

    fn io_fold(key: &IoKey) -> Vec<IoKey> {
        vec![
            (key.0.fold_comm(), key.1.clone(), key.2),
            (Workload::fold_all(), key.1.clone(), key.2),
        ]
    }

    fn lat_fold(key: &LatKey) -> Vec<LatKey> {
        vec![(Some(Arc::new(CgroupLabels::other())), key.1.clone(), key.2)]
    }

    fn lat_cost(&self) -> usize {
        // one per bound + +Inf + _sum + _count
        self.bounds.len() + 3
    }

    /// tgids and cgroups gone at this check and the previous one: their entries can go.
    fn reclaimable(&mut self) -> (HashSet<u32>, HashSet<u64>) {
        if self.last_reclaim_check.elapsed() < RECLAIM_INTERVAL {
            return Default::default();
        }
        self.last_reclaim_check = Instant::now();
        let labeler = self.labeler.lock().expect("labeler lock");
        let root = labeler.cgroups.root().to_path_buf();
        let tgids: HashSet<u32> = self.entries.keys().map(|k| k.tgid).collect();
        // tgid 0 is the idle task (I/O issued from interrupt context): never gone.
        let dead: HashSet<u32> = tgids
            .into_iter()
            .filter(|t| *t != 0 && !labeler.comms.alive(*t))
            .collect();
        let mut paths: HashMap<u64, Arc<str>> = HashMap::new();
        for (k, e) in &self.entries {
            if let Some(p) = &e.cgroup_path {
                paths.insert(k.cgroup_id, p.clone());
            }
        }
        for (k, e) in &self.lat_entries {
            if let Some(p) = &e.cgroup_path {
                paths.insert(k.cgroup_id, p.clone());
            }
        }
        let gone: HashSet<u64> = paths
            .into_iter()
            .filter(|(_, p)| cgroup_gone(&root, p))
            .map(|(id, _)| id)
            .collect();
        let dead_confirmed = dead.intersection(&self.dead_tgids).copied().collect();
        let gone_confirmed = gone.intersection(&self.gone_cgroups).copied().collect();
        self.dead_tgids = dead;
        self.gone_cgroups = gone;
        (dead_confirmed, gone_confirmed)
    }

    fn read_stats(
        &mut self,
        now: Instant,
        dead: &HashSet<u32>,
        gone: &HashSet<u64>,
    ) -> Vec<BlockKey> {
        let generation = self.generation;
        let mut to_delete = Vec::new();
        let mut labeler = self.labeler.lock().expect("labeler lock");
        let mut rescanned = false;
        let mut seen = 0u64;
        for item in self.stats.iter() {
            // Entries deleted between listing and lookup are skipped by the iterator; an error
            // ends the walk, and entries not reached must not be taken for gone.
            let Ok((key, cur)) = item else {
                self.walk_complete = false;
                break;
            };
            seen += 1;
            let entry = self.entries.entry(key).or_insert_with(|| StatEntry {
                last: BlockStats::default(),
                target: None,
                cgroup_path: None,
                first_seen: now,
                seen: generation,
            });
            entry.seen = generation;
            let target = match &entry.target {
                Some(t) => t.clone(),
                None => {
                    let Some(cgroup) = cgroup_labels(
                        &mut labeler,
                        key.cgroup_id,
                        &mut rescanned,
                        entry.first_seen,
                        now,
                    ) else {
                        // Held back: `last` stays, so nothing is lost when it resolves.
                        continue;
                    };
                    entry.cgroup_path = Some(cgroup.path.clone());
                    let workload =
                        labeler.workload_named(key.cgroup_id, key.tgid, comm_label(&key.comm));
                    let device = self.devices.resolve(key.dev);
                    let target = self
                        .budget
                        .route(&(workload, device, key.op), 2, Self::io_fold);
                    entry.target = Some(target.clone());
                    target
                }
            };
            let d = stats_delta(&entry.last, &cur);
            entry.last = cur;
            let totals = self.io_series.entry(target).or_insert_with(|| IoTotals {
                bytes: 0,
                requests: 0,
                last_change: now,
            });
            totals.bytes = totals.bytes.wrapping_add(d.bytes);
            totals.requests = totals.requests.wrapping_add(d.requests);
            if d.requests > 0 {
                totals.last_change = now;
            }
            if dead.contains(&key.tgid) || gone.contains(&key.cgroup_id) {
                to_delete.push(key);
            }
        }
        self.entries_seen[0] = seen;
        to_delete
    }

    fn read_latency(&mut self, now: Instant, gone: &HashSet<u64>) -> Vec<BlockLatencyKey> {
        let generation = self.generation;
        let cost = self.lat_cost();
        let mut to_delete = Vec::new();
        let mut labeler = self.labeler.lock().expect("labeler lock");
        let mut rescanned = false;
        let mut seen = 0u64;
        let by_cgroup = self.by_cgroup;
        for item in self.latency.iter() {
            let Ok((key, cur)) = item else {
                self.walk_complete = false;
                break;
            };
            seen += 1;
            let entry = self.lat_entries.entry(key).or_insert_with(|| LatEntry {
                last: BlockLatency::ZERO,
                target: None,
                cgroup_path: None,
                first_seen: now,
                seen: generation,
            });
            entry.seen = generation;
            let target = match &entry.target {
                Some(t) => t.clone(),
                None => {
                    let device = self.devices.resolve(key.dev);
                    let target = if by_cgroup {
                        let Some(cgroup) = cgroup_labels(
                            &mut labeler,
                            key.cgroup_id,
                            &mut rescanned,
                            entry.first_seen,
                            now,
                        ) else {
                            continue;
                        };
                        entry.cgroup_path = Some(cgroup.path.clone());
                        self.lat_budget
                            .route(&(Some(cgroup), device, key.op), cost, Self::lat_fold)
                    } else {
                        (None, device, key.op)
                    };
                    entry.target = Some(target.clone());
                    target
                }
            };
            let d = latency_delta(&entry.last, &cur);
            entry.last = cur;
            let totals = self.lat_series.entry(target).or_insert_with(|| LatTotals {
                sum_ns: 0,
                buckets: [0; hist::HIST_BUCKETS],
                last_change: now,
            });
            totals.sum_ns = totals.sum_ns.wrapping_add(d.sum_ns);
            for (t, b) in totals.buckets.iter_mut().zip(d.buckets.iter()) {
                *t = t.wrapping_add(*b);
            }
            if d.count() > 0 {
                totals.last_change = now;
            }
            if by_cgroup && key.cgroup_id != 0 && gone.contains(&key.cgroup_id) {
                to_delete.push(key);
            }
        }
        self.entries_seen[1] = seen;
        to_delete
    }

    /// Counts the requests in flight and removes those that will never complete.
    fn sweep_inflight(&mut self) {
        let now = monotonic_ns();
        let stale_ns = INFLIGHT_STALE_AFTER.as_nanos() as u64;
        let mut stale = Vec::new();
        let mut seen = 0u64;
        for item in self.inflight.iter() {
            let Ok((rq, entry)) = item else { continue };
            seen += 1;
            let since = entry.issue_ns.max(entry.submit_ns);
            if now.saturating_sub(since) > stale_ns {
                // Submitted but never issued: merged into another request and freed without
                // a tracepoint. Normal, not counted; issued and never completed is.
                stale.push((rq, entry.issue_ns != 0));
            }
        }
        for (rq, issued) in &stale {
            if self.inflight.remove(rq).is_ok() {
                self.expired_inflight += *issued as u64;
                seen -= 1;
            }
        }
        self.entries_seen[2] = seen;
    }

    /// Drops series no kernel entry feeds that have been idle for the retention period.
    fn retire_idle_series(&mut self, now: Instant) {
        let retention = self.retention;
        let live: HashSet<&IoKey> = self
            .entries
            .values()
            .filter_map(|e| e.target.as_ref())
            .collect();
        let before = self.io_series.len();
        self.io_series
            .retain(|k, t| live.contains(k) || now.duration_since(t.last_change) < retention);
        if self.io_series.len() != before {
            let series = &self.io_series;
            self.budget.retain(|k| series.contains_key(k));
        }
        let live: HashSet<&LatKey> = self
            .lat_entries
            .values()
            .filter_map(|e| e.target.as_ref())
            .collect();
        let before = self.lat_series.len();
        self.lat_series
            .retain(|k, t| live.contains(k) || now.duration_since(t.last_change) < retention);
        if self.lat_series.len() != before {
            let series = &self.lat_series;
            self.lat_budget.retain(|k| series.contains_key(k));
        }
    }
}

impl Collector for BlockIoCollector {
    fn name(&self) -> &'static str {
        NAME
    }

    fn refresh(&mut self) -> Result<(), CollectorError> {
        let now = Instant::now();
        self.generation += 1;
        self.labeler.lock().expect("labeler lock").new_cycle();
        let (dead, gone) = self.reclaimable();
        self.walk_complete = true;
        let stale_stats = self.read_stats(now, &dead, &gone);
        let stale_latency = self.read_latency(now, &gone);
        // Reclaim: the values of these entries were just added to their series.
        // Our record of an entry goes only with the entry itself: were the kernel entry to
        // survive a failed delete, a forgotten record would count its values twice.
        for key in stale_stats {
            if deleted(self.stats.remove(&key)) {
                self.entries.remove(&key);
            }
        }
        for key in stale_latency {
            if deleted(self.latency.remove(&key)) {
                self.lat_entries.remove(&key);
            }
        }
        // Entries deleted behind our back (none expected) no longer exist; after an incomplete
        // walk that cannot be told, and forgetting a live entry would count it twice.
        let generation = self.generation;
        if self.walk_complete {
            self.entries.retain(|_, e| e.seen == generation);
            self.lat_entries.retain(|_, e| e.seen == generation);
        } else {
            tracing::debug!("block I/O: a map walk ended early; keeping unseen entries");
        }
        self.sweep_inflight();
        self.retire_idle_series(now);
        Ok(())
    }

    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let mut labels: Vec<(&'static str, Cow<'_, str>)> = Vec::with_capacity(8);
        let op_name = |op: u8| block_op::name(op).unwrap_or(OTHER);
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_block_io_bytes",
                "Bytes of completed block requests, per cgroup, process name, device and operation (discard: bytes discarded; flush: 0).",
                None,
                MetricType::Counter,
            )?;
            for ((workload, device, op), totals) in &self.io_series {
                labels.clear();
                workload.push_labels(&mut labels);
                labels.push(("device", Cow::Borrowed(device)));
                labels.push(("op", Cow::Borrowed(op_name(*op))));
                family
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&totals.bytes, None)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_block_io_requests",
                "Completed block requests, per cgroup, process name, device and operation.",
                None,
                MetricType::Counter,
            )?;
            for ((workload, device, op), totals) in &self.io_series {
                labels.clear();
                workload.push_labels(&mut labels);
                labels.push(("device", Cow::Borrowed(device)));
                labels.push(("op", Cow::Borrowed(op_name(*op))));
                family
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&totals.requests, None)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_block_io_duration_seconds",
                "Time from issue to the device until completion of block requests (log2 buckets measured in the kernel).",
                None,
                MetricType::Histogram,
            )?;
            for ((cgroup, device, op), totals) in &self.lat_series {
                labels.clear();
                if let Some(cgroup) = cgroup {
                    labels.push(("cgroup", Cow::Borrowed(&cgroup.path)));
                    for (k, v) in &cgroup.extra {
                        labels.push((k, Cow::Borrowed(v)));
                    }
                }
                labels.push(("device", Cow::Borrowed(device)));
                labels.push(("op", Cow::Borrowed(op_name(*op))));
                let buckets = fold_buckets(&totals.buckets, &self.bounds);
                family
                    .encode_family(&labels)?
                    .encode_histogram::<NoLabelSet>(
                        totals.sum_ns as f64 / 1e9,
                        totals.count(),
                        &buckets,
                        None,
                    )?;
            }
        }
        Ok(())
    }

    fn health(&self) -> Health {
        let mut folded_series = vec![(IO_FAMILY, self.budget.folded())];
        if self.by_cgroup {
            folded_series.push((LATENCY_FAMILY, self.lat_budget.folded()));
        }
        Health {
            maps: vec![
                MapUsage {
                    map: maps::BLOCK_STATS,
                    entries: self.entries_seen[0],
                    capacity: self.capacities[0],
                },
                MapUsage {
                    map: maps::BLOCK_LATENCY,
                    entries: self.entries_seen[1],
                    capacity: self.capacities[1],
                },
                MapUsage {
                    map: maps::BLOCK_INFLIGHT,
                    entries: self.entries_seen[2],
                    capacity: self.capacities[2],
                },
            ],
            folded_series,
            missed_events: vec![("block_issue_without_complete", self.expired_inflight)],
            ..Health::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comm(s: &str) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[..s.len()].copy_from_slice(s.as_bytes());
        c
    }

    #[test]
    fn kernel_worker_names_fold() {
        assert_eq!(&*comm_label(&comm("kworker/u8:3")), "kworker");
        assert_eq!(&*comm_label(&comm("kworker/1:1H")), "kworker");
        assert_eq!(&*comm_label(&comm("swapper/0")), "swapper");
        assert_eq!(&*comm_label(&comm("dd")), "dd");
        assert_eq!(&*comm_label(&comm("jbd2/vda-8")), "jbd2/vda-8");
        assert_eq!(&*comm_label(&comm("kworkers")), "kworkers");
    }

    #[test]
    fn deltas_survive_recreated_entries() {
        let a = BlockStats {
            bytes: 4096,
            requests: 1,
        };
        let b = BlockStats {
            bytes: 12288,
            requests: 3,
        };
        assert_eq!(
            stats_delta(&a, &b),
            BlockStats {
                bytes: 8192,
                requests: 2
            }
        );
        let c = BlockStats {
            bytes: 512,
            requests: 1,
        };
        assert_eq!(stats_delta(&b, &c), c);

        let mut x = BlockLatency::ZERO;
        x.sum_ns = 100;
        x.buckets[4] = 2;
        let mut y = x;
        y.sum_ns = 160;
        y.buckets[5] = 1;
        let d = latency_delta(&x, &y);
        assert_eq!(
            (d.sum_ns, d.buckets[4], d.buckets[5], d.count()),
            (60, 0, 1, 1)
        );
        assert_eq!(latency_delta(&y, &x), x);
    }

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
        let Ok(btf) = Btf::from_kernel() else {
            eprintln!("SKIPPED offsets_resolve_on_this_kernel: no readable kernel BTF");
            return;
        };
        let c = resolve_offsets(&btf, true, false).unwrap();
        assert_eq!(c.ready, 1);
        assert_eq!(c.ops, block_op::ReqOps::LINUX);
        // One of the two ways to the disk is known, and the bio chain is complete.
        assert!(c.rq_disk != sysscope_abi::NO_FIELD || c.q_disk != sysscope_abi::NO_FIELD);
        if c.bio_cgroup != 0 {
            assert_ne!(c.kn_id, sysscope_abi::NO_FIELD);
        }
        let off = resolve_offsets(&btf, false, true).unwrap();
        assert_eq!((off.bio_cgroup, off.latency_by_cgroup), (0, 1));
    }
}
