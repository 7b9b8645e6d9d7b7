//! The block I/O collector: bytes, requests and issue-to-completion latency of block requests,
//! per workload, device and operation.
//!
//! Probes: `block_rq_issue`, `block_rq_complete` (raw tracepoints, see
//! `ebpf/probes/src/block_io.rs`), which read `struct request` at offsets found in the kernel's
//! BTF before the object is loaded ([`crate::kernel::block_io`], global `BLOCK_CONFIG`).
//! Maps read: `BLOCK_STATS`, `BLOCK_LATENCY`; `BLOCK_INFLIGHT` is swept of requests that
//! never completed. Metrics: `sysscope_block_io_bytes_total`,
//! `sysscope_block_io_requests_total`, `sysscope_block_io_duration_seconds`.
//!
//! Like the syscall collector, each refresh adds what changed in every kernel entry to the
//! entry's series ([`crate::series::SeriesTable`]; an entry is named once, with the process
//! name the kernel recorded at issue), so series are monotonic sums over processes that come
//! and go. Entries of exited processes are reclaimed by the rule every collector shares
//! ([`crate::metadata::exits`]): once the process has been known gone (from its exit record,
//! or from /proc at a reclaim check) for one reclaim interval, and /proc still does not list
//! it, after their last values were read: I/O still in flight when a process exits completes
//! within that interval and is not lost. Entries of removed cgroups go once the cgroup was
//! found gone at two checks in a row.

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use prometheus_client::{
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
};
use sysscope_abi::{block_op, maps, BlockKey, BlockLatency, BlockLatencyKey, BlockStats};

use super::{Collector, CollectorError, Health, MapUsage};
use crate::{
    config::Config,
    hist::HistogramLayout,
    kernel::block_io::{
        latency_capacity, BlockIoError, BlockIoPlan, BlockMaps, Held, HeldKind, Inflight,
    },
    kernel::cumulative::HashReader,
    kernel::Probes,
    metadata::{cgroups::UNRESOLVED, devices::DeviceResolver, SharedLabeler},
    series::{Budget, CgroupLabels, Folded, LabelControl, Named, SeriesTable, Workload, OTHER},
};

pub(crate) const NAME: &str = "block_io";

/// Families named in `sysscope_dropped_series_total{family}`.
const IO_FAMILY: &str = "block_io";
const LATENCY_FAMILY: &str = "block_io_latency";

/// A request in flight longer than this never completed (device gone, completion missed):
/// its `BLOCK_INFLIGHT` entry is removed and counted. Far beyond any SCSI or NVMe timeout.
pub(crate) const INFLIGHT_STALE_AFTER: Duration = Duration::from_secs(300);

/// How often tgids and cgroups behind kernel entries are checked for having gone away.
const RECLAIM_INTERVAL: Duration = Duration::from_secs(5);

/// (workload, device, op) of the bytes and requests counters.
type IoKey = (Workload, Arc<str>, u8);
/// (cgroup when latency is kept per cgroup, device, op) of the latency histogram.
type LatKey = (Option<Arc<CgroupLabels>>, Arc<str>, u8);

/// Name, help and value of one counter family over the bytes-and-requests series.
type IoCounterFamily = (&'static str, &'static str, fn(&BlockStats) -> u64);

/// The `comm` label of a kernel-recorded name. Kernel worker threads are named after their
/// pool and CPU (`kworker/u8:3`, `swapper/1`): they fold into one name each so they do not
/// multiply series.
/// Whether a `BLOCK_STATS` key is its cgroup's shared key (tgid 0, no name), which the probes
/// count a request under when the cgroup's processes hold their bound of entries.
fn shared_key(key: &BlockKey) -> bool {
    key.tgid == 0 && key.comm == [0; 16]
}

pub(crate) fn comm_label(comm: &[u8; 16]) -> Arc<str> {
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

fn cgroup_gone(root: &Path, path: &str) -> bool {
    path == UNRESOLVED || !root.join(path.trim_start_matches('/')).exists()
}

pub(crate) struct BlockIoCollector {
    stats: HashReader<BlockKey, BlockStats>,
    latency: HashReader<BlockLatencyKey, BlockLatency>,
    inflight: Inflight,
    /// `BLOCK_HELD`: the per-tenant counts of `BLOCK_STATS` and `BLOCK_INFLIGHT`, set to the
    /// exact figures after each read.
    held: Held,
    /// Occupancy of `BLOCK_STATS`, `BLOCK_LATENCY` and `BLOCK_INFLIGHT`.
    stats_usage: MapUsage,
    latency_usage: MapUsage,
    inflight_usage: MapUsage,
    labeler: SharedLabeler,
    devices: DeviceResolver,
    io: SeriesTable<BlockKey, BlockStats, IoKey, IoKey>,
    latency_series: SeriesTable<BlockLatencyKey, BlockLatency, LatKey, LatKey>,
    budget: Budget<IoKey>,
    lat_budget: Budget<LatKey>,
    histograms: HistogramLayout,
    /// What the series keep of their labels (`[labels]`).
    control: LabelControl,
    by_cgroup: bool,
    retention: Duration,
    /// Cgroup ids found gone at the previous check: reclaimed if still gone.
    gone_cgroups: HashSet<u64>,
    last_reclaim_check: Instant,
    /// In-flight entries removed because their request never completed.
    expired_inflight: u64,
}

impl std::fmt::Debug for BlockIoCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockIoCollector")
            .field("io", &self.io)
            .field("latency", &self.latency_series)
            .finish_non_exhaustive()
    }
}

impl BlockIoCollector {
    /// Takes the block maps and attaches the probes to `block_io.tracepoints` (issue, then
    /// completion), plus `block_io_start` when the kernel has it. The object must have been
    /// loaded with `plan.probe`. On failure nothing stays attached.
    pub(crate) fn start(
        probes: &mut Probes,
        config: &Config,
        labeler: SharedLabeler,
        plan: &BlockIoPlan,
    ) -> Result<Self, BlockIoError> {
        let block = &config.block_io;
        let BlockMaps {
            stats,
            latency,
            inflight,
            held,
        } = BlockMaps::attach(probes, NAME, config, plan)?;
        let max_series = config.limits.max_series;
        Ok(Self {
            stats,
            latency,
            inflight,
            held,
            stats_usage: MapUsage::new(maps::BLOCK_STATS, block.max_entries),
            latency_usage: MapUsage::new(maps::BLOCK_LATENCY, latency_capacity(config)),
            inflight_usage: MapUsage::new(maps::BLOCK_INFLIGHT, block.max_inflight),
            labeler,
            devices: DeviceResolver::default(),
            io: SeriesTable::named_once(),
            latency_series: SeriesTable::named_once(),
            budget: Budget::new(max_series),
            lat_budget: Budget::new(max_series),
            histograms: HistogramLayout::new(config.syscalls.histogram_resolution),
            control: LabelControl::new(&config.labels),
            by_cgroup: block.latency_by_cgroup,
            retention: config.collection.series_retention,
            gone_cgroups: HashSet::new(),
            last_reclaim_check: Instant::now(),
            expired_inflight: 0,
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
        self.histograms.series_cost()
    }

    /// tgids gone for a reclaim interval, and cgroups gone at this check and the previous
    /// one: their entries can go.
    fn reclaimable(&mut self) -> (HashSet<u32>, HashSet<u64>) {
        if self.last_reclaim_check.elapsed() < RECLAIM_INTERVAL {
            return Default::default();
        }
        let now = Instant::now();
        self.last_reclaim_check = now;
        let mut labeler = self.labeler.lock().expect("labeler lock");
        let root = labeler.cgroups.root().to_path_buf();
        let tgids: HashSet<u32> = self.io.keys().map(|k| k.tgid).collect();
        // tgid 0 is the idle task (I/O issued from interrupt context): never gone. A tgid
        // listed in /proc again is alive (a zombie not yet reaped, or a pid reused).
        let not_listed: HashSet<u32> = tgids
            .into_iter()
            .filter(|t| *t != 0 && !labeler.comms.alive(*t))
            .collect();
        for tgid in &not_listed {
            labeler.exits.gone(*tgid, now);
        }
        let dead = not_listed
            .into_iter()
            .filter(|t| labeler.exits.gone_for(*t, RECLAIM_INTERVAL, now))
            .collect();
        // The paths the entries' cgroups were named with.
        let mut paths: HashMap<u64, Arc<str>> = HashMap::new();
        for (k, (workload, _, _)) in self.io.labels() {
            paths.insert(k.cgroup_id, workload.cgroup.path.clone());
        }
        for (k, (cgroup, _, _)) in self.latency_series.labels() {
            if let Some(cgroup) = cgroup {
                paths.insert(k.cgroup_id, cgroup.path.clone());
            }
        }
        let gone: HashSet<u64> = paths
            .into_iter()
            .filter(|(_, p)| cgroup_gone(&root, p))
            .map(|(id, _)| id)
            .collect();
        let gone_confirmed = gone.intersection(&self.gone_cgroups).copied().collect();
        self.gone_cgroups = gone;
        (dead, gone_confirmed)
    }

    /// Adds what changed in every `BLOCK_STATS` entry to its series; returns the entries to
    /// reclaim (their values are now read).
    fn read_stats(
        &mut self,
        now: Instant,
        dead: &HashSet<u32>,
        gone: &HashSet<u64>,
    ) -> (Folded<BlockKey>, Option<HashMap<u64, u64>>) {
        let snapshot = self.stats.read();
        // The entries of each cgroup's processes (its shared keys aside), when read in full.
        let held = snapshot.complete.then(|| {
            let mut held: HashMap<u64, u64> = HashMap::new();
            for (key, _) in snapshot.entries.iter().filter(|(k, _)| !shared_key(k)) {
                *held.entry(key.cgroup_id).or_default() += 1;
            }
            held
        });
        let seen_at = snapshot.read_at;
        let mut labeler = self.labeler.lock().expect("labeler lock");
        self.stats_usage.seen(snapshot.entries.len() as u64);
        let (budget, devices, control) = (&mut self.budget, &mut self.devices, &self.control);
        let folded = self.io.fold(
            snapshot,
            now,
            |key, _| {
                labeler.cgroup_seen(key.cgroup_id, seen_at);
                let workload = if shared_key(key) {
                    // The cgroup's shared key (its processes past their bound): comm="other".
                    labeler
                        .workload_named(key.cgroup_id, 0, Arc::from(OTHER))
                        .fold_comm()
                } else {
                    labeler.workload_named(key.cgroup_id, key.tgid, comm_label(&key.comm))
                };
                let labels = (workload, devices.resolve(key.dev), key.op);
                // Named with its cgroup's path (reclaim looks it up), routed with what label
                // control keeps.
                let kept = (
                    control.workload(labels.0.clone()),
                    labels.1.clone(),
                    labels.2,
                );
                let series = budget.route(&kept, 2, Self::io_fold);
                Named::As(labels, series)
            },
            |key, _| dead.contains(&key.tgid) || gone.contains(&key.cgroup_id),
        );
        (folded, held)
    }

    /// Adds what changed in every `BLOCK_LATENCY` entry to its series; as [`Self::read_stats`].
    fn read_latency(&mut self, now: Instant, gone: &HashSet<u64>) -> Folded<BlockLatencyKey> {
        let cost = self.lat_cost();
        let snapshot = self.latency.read();
        let seen_at = snapshot.read_at;
        let mut labeler = self.labeler.lock().expect("labeler lock");
        let by_cgroup = self.by_cgroup;
        self.latency_usage.seen(snapshot.entries.len() as u64);
        let (budget, devices, control) = (&mut self.lat_budget, &mut self.devices, &self.control);
        self.latency_series.fold(
            snapshot,
            now,
            |key, _| {
                let device = devices.resolve(key.dev);
                if by_cgroup {
                    let cgroup = labeler.cgroup_seen(key.cgroup_id, seen_at);
                    let kept = (Some(control.cgroup(&cgroup)), device.clone(), key.op);
                    let series = budget.route(&kept, cost, Self::lat_fold);
                    Named::As((Some(cgroup), device, key.op), series)
                } else {
                    let labels = (None, device, key.op);
                    Named::As(labels.clone(), labels)
                }
            },
            |key, _| by_cgroup && key.cgroup_id != 0 && gone.contains(&key.cgroup_id),
        )
    }

    /// Counts the requests in flight and removes those that will never complete.
    fn sweep_inflight(&mut self) {
        let sweep = self.inflight.sweep(INFLIGHT_STALE_AFTER);
        self.held.set(HeldKind::Inflight, &sweep.by_cgroup);
        self.expired_inflight += sweep.expired;
        self.inflight_usage.seen(sweep.in_flight);
    }

    /// Drops series no kernel entry feeds that have been idle for the retention period.
    fn retire_idle_series(&mut self, now: Instant) {
        if self.io.retire(now, self.retention) {
            let io = &self.io;
            self.budget.retain(|k| io.has_series(k));
        }
        if self.latency_series.retire(now, self.retention) {
            let latency = &self.latency_series;
            self.lat_budget.retain(|k| latency.has_series(k));
        }
    }
}

impl Collector for BlockIoCollector {
    fn name(&self) -> &'static str {
        NAME
    }

    fn refresh(&mut self) -> Result<(), CollectorError> {
        let now = Instant::now();
        self.labeler.lock().expect("labeler lock").new_cycle();
        let (dead, gone) = self.reclaimable();
        let (stats, held) = self.read_stats(now, &dead, &gone);
        let latency = self.read_latency(now, &gone);
        // Reclaim: the values of these entries were just added to their series; each is
        // forgotten only once its kernel entry is gone.
        let removed = self.stats.remove(&stats.reclaim);
        if let Some(mut held) = held {
            for key in removed.iter().filter(|k| !shared_key(k)) {
                if let Some(n) = held.get_mut(&key.cgroup_id) {
                    *n = n.saturating_sub(1);
                }
            }
            held.retain(|_, n| *n != 0);
            self.held.set(HeldKind::Entries, &held);
        }
        self.io.reclaimed(removed, stats.complete);
        let removed = self.latency.remove(&latency.reclaim);
        self.latency_series.reclaimed(removed, latency.complete);
        self.sweep_inflight();
        self.retire_idle_series(now);
        Ok(())
    }

    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let mut labels: Vec<(&'static str, Cow<'_, str>)> = Vec::with_capacity(8);
        let op_name = |op: u8| block_op::name(op & !block_op::FAILED).unwrap_or(OTHER);
        let counters: [(IoCounterFamily, bool); 3] = [
            (
                (
                    "sysscope_block_io_bytes",
                    "Bytes of block requests that completed successfully, per cgroup, process name, device and operation (discard: bytes discarded; flush: 0).",
                    |t| t.bytes,
                ),
                false,
            ),
            (
                (
                    "sysscope_block_io_requests",
                    "Block requests that completed successfully, per cgroup, process name, device and operation.",
                    |t| t.requests,
                ),
                false,
            ),
            (
                (
                    "sysscope_block_io_failed_requests",
                    "Block requests that completed with an error (their bytes are not in sysscope_block_io_bytes_total), per cgroup, process name, device and operation.",
                    |t| t.requests,
                ),
                true,
            ),
        ];
        for ((name, help, value), failed) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for ((workload, device, op), series) in self.io.series() {
                if (op & block_op::FAILED != 0) != failed {
                    continue;
                }
                labels.clear();
                workload.push_labels(&mut labels);
                labels.push(("device", Cow::Borrowed(device)));
                labels.push(("op", Cow::Borrowed(op_name(*op))));
                family
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&value(&series.sum), None)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_block_io_duration_seconds",
                "Time from issue to the device until completion of block requests (log2 buckets measured in the kernel).",
                None,
                MetricType::Histogram,
            )?;
            for ((cgroup, device, op), series) in self.latency_series.series() {
                labels.clear();
                if let Some(cgroup) = cgroup {
                    // An empty path is a `cgroup` label that label control dropped.
                    if !cgroup.path.is_empty() {
                        labels.push(("cgroup", Cow::Borrowed(&cgroup.path)));
                    }
                    for (k, v) in &cgroup.extra {
                        labels.push((k, Cow::Borrowed(v)));
                    }
                }
                labels.push(("device", Cow::Borrowed(device)));
                labels.push(("op", Cow::Borrowed(op_name(*op))));
                self.histograms
                    .encode(family.encode_family(&labels)?, &series.sum)?;
            }
        }
        Ok(())
    }

    fn reconfigure(&mut self, config: &Config) -> Result<(), CollectorError> {
        self.budget.set_max(config.limits.max_series);
        self.lat_budget.set_max(config.limits.max_series);
        self.retention = config.collection.series_retention;
        Ok(())
    }

    fn health(&self) -> Health {
        let mut folded_series = vec![(IO_FAMILY, self.budget.folded())];
        if self.by_cgroup {
            folded_series.push((LATENCY_FAMILY, self.lat_budget.folded()));
        }
        Health {
            maps: vec![
                self.stats_usage.clone(),
                self.latency_usage.clone(),
                self.inflight_usage.clone(),
            ],
            folded_series,
            missed_events: vec![("block_issue_without_complete", self.expired_inflight)],
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
}
