//! The syscall collector: counts, errors by errno and latency histograms per workload.
//!
//! Probes: `sys_enter`, `sys_exit`, `sched_process_exit`, `sched_process_exec`,
//! `cgroup_attach_task` (raw
//! tracepoints, see `ebpf/probes/src/syscalls.rs`), `sched_switch` and `sched_wakeup` (BTF
//! tracepoints, `ebpf/probes/src/sched.rs`).
//! Maps read: the statistics table (`SYSCALL_SLOTS` + `SYSCALL_STATS` + `SYSCALL_STATES`,
//! see [`crate::kernel::syscalls`]), `SYSCALL_ERRORS`, `PROCESS_EXITS`; `SLOW_THRESHOLDS` is
//! written once at start. Files read: the `cpu.stat` of the cgroups it labels.
//! Metrics: `sysscope_syscalls_total`, `sysscope_syscall_errors_total`,
//! `sysscope_syscall_duration_seconds`, `sysscope_syscall_time_seconds_total` (time by state,
//! [`super::syscall_time`]) and the cgroups' CPU throttling ([`super::cgroup_cpu`]).
//!
//! Each refresh reads every kernel entry and adds what changed since the previous read to the
//! entry's series ([`crate::series::SeriesTable`]; an entry is named again whenever it changed,
//! so a renamed process counts under its new name), and reclaims the entries of processes that
//! have exited (after their last values were read), so series are monotonic sums over
//! processes that come and go. It drains the exit queue and reports every process it finds gone (by
//! its exit record, or missing from /proc) to the lifecycle all collectors share
//! ([`crate::metadata::exits`]); a process's calls end with it, so its entries go at once.

use std::{
    borrow::Cow,
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use prometheus_client::{
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
};
use sysscope_abi::{maps, ErrnoKey, FdClass, SyscallKey, SyscallStats, FOLDED_TGID};

use super::{
    cgroup_cpu::CgroupCpu,
    syscall_time::{SyscallTime, STATES},
    Collector, CollectorError, Health, MapUsage,
};
use crate::{
    config::Config,
    hist::HistogramLayout,
    kernel::cumulative::Counters,
    kernel::fd_class,
    kernel::slow_events::SlowThresholds,
    kernel::syscalls::SyscallMaps,
    kernel::{ProbeError, Probes},
    metadata::{self, Labeler, SharedLabeler, Sighting},
    series::{Budget, CgroupLabels, Folded, LabelControl, Named, SeriesTable, Workload, OTHER},
    syscall_table,
};

pub(crate) const NAME: &str = "syscalls";

/// How often entries of processes that vanished without an exit record are looked for.
const ORPHAN_SCAN_INTERVAL: Duration = Duration::from_secs(30);

/// (workload, syscall, descriptor class) of the call series.
type SeriesKey = (Workload, u32, FdClass);
/// (workload, syscall, descriptor class, errno) of the error series.
type ErrorSeriesKey = (Workload, u32, FdClass, u16);

pub(crate) struct SyscallCollector {
    maps: SyscallMaps,
    /// Per syscall number, the duration from which a call is sampled.
    thresholds: SlowThresholds,
    labeler: SharedLabeler,
    stats: SeriesTable<SyscallKey, SyscallStats, SeriesKey, SeriesKey>,
    /// Error entries are named like call entries (the budget routes their label set without
    /// the errno), and counted per errno.
    errors: SeriesTable<ErrnoKey, u64, SeriesKey, ErrorSeriesKey>,
    /// The call series' time by state (`None`: `syscalls.time_by_state` is off).
    time: Option<SyscallTime<SeriesKey>>,
    /// CPU throttling of the cgroups the call series name.
    cgroup_cpu: CgroupCpu,
    budget: Budget<SeriesKey>,
    histograms: HistogramLayout,
    /// What the series keep of their labels (`[labels]`), applied before the budget.
    control: LabelControl,
    retention: Duration,
    last_orphan_scan: Instant,
    /// Occupancy of `SYSCALL_STATS` (slots held), `SYSCALL_ERRORS` and `PROCESS_EXITS`.
    stats_usage: MapUsage,
    errors_usage: MapUsage,
    exits_usage: MapUsage,
}

impl std::fmt::Debug for SyscallCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyscallCollector")
            .field("stats", &self.stats)
            .field("errors", &self.errors)
            .finish_non_exhaustive()
    }
}

impl SyscallCollector {
    /// Attaches the syscall probes, writes the slow-call thresholds and takes the maps.
    pub(crate) fn start(
        probes: &mut Probes,
        config: &Config,
        labeler: SharedLabeler,
    ) -> Result<Self, ProbeError> {
        let mut thresholds = SlowThresholds::take(probes)?;
        thresholds.write(&config.slow_thresholds_ns())?;
        let maps = SyscallMaps::attach(probes, NAME)?;
        let limits = &config.limits;
        let time = maps.stats.splits_by_state().then(SyscallTime::default);
        let cgroup_cpu = CgroupCpu::new(metadata::cgroup_root(&labeler));
        Ok(Self {
            time,
            cgroup_cpu,
            maps,
            thresholds,
            labeler,
            stats: SeriesTable::following_renames(),
            errors: SeriesTable::following_renames(),
            budget: Budget::new(limits.max_series),
            histograms: HistogramLayout::new(config.syscalls.histogram_resolution),
            control: LabelControl::new(&config.labels),
            retention: config.collection.series_retention,
            last_orphan_scan: Instant::now(),
            stats_usage: MapUsage::new(maps::SYSCALL_STATS, limits.max_syscall_entries),
            errors_usage: MapUsage::new(maps::SYSCALL_ERRORS, limits.max_error_entries),
            exits_usage: MapUsage::new(maps::PROCESS_EXITS, limits.max_exited_processes),
        })
    }

    fn series_cost(&self) -> usize {
        // _total + the histogram's (+ one per state)
        let states = if self.time.is_some() { STATES.len() } else { 0 };
        1 + self.histograms.series_cost() + states
    }

    /// The coarser label sets a call series folds into when it does not fit the budget.
    fn coarser(key: &SeriesKey) -> Vec<SeriesKey> {
        vec![
            (key.0.fold_comm(), key.1, key.2),
            (Workload::fold_all(), key.1, key.2),
        ]
    }

    /// Reads the exit queue: tgids whose entries can be reclaimed once read.
    fn read_exits(&mut self) -> HashSet<u32> {
        let mut exited = HashSet::new();
        let now = Instant::now();
        let mut labeler = self.labeler.lock().expect("labeler lock");
        for (tgid, exit) in self.maps.exits.read() {
            labeler.comms.set_exited(tgid, &exit.comm);
            labeler.exits.gone(tgid, now);
            exited.insert(tgid);
        }
        self.exits_usage.seen(exited.len() as u64);
        exited
    }

    /// Entries whose process is gone without an exit record (e.g. the exit queue was full).
    /// Looked for every `ORPHAN_SCAN_INTERVAL`, and at every read while the stats map is more
    /// than half full: under heavy process churn the exit queue overflows first, and waiting
    /// for the next scan would let orphans fill the map and lose new processes' calls.
    fn orphans(&mut self, exited: &HashSet<u32>) -> HashSet<u32> {
        let filling = self.stats_usage.entries * 2 > self.stats_usage.capacity;
        if self.last_orphan_scan.elapsed() < ORPHAN_SCAN_INTERVAL && !filling {
            return HashSet::new();
        }
        self.last_orphan_scan = Instant::now();
        let now = Instant::now();
        let mut labeler = self.labeler.lock().expect("labeler lock");
        // A cgroup's shared key belongs to no process: it is reclaimed when idle (read_stats).
        let tgids: HashSet<u32> = self
            .stats
            .keys()
            .map(|k| k.tgid)
            .filter(|t| *t != FOLDED_TGID)
            .collect();
        let orphans: HashSet<u32> = tgids
            .into_iter()
            .filter(|t| !exited.contains(t) && !labeler.comms.alive(*t))
            .collect();
        for tgid in &orphans {
            labeler.exits.gone(*tgid, now);
        }
        orphans
    }

    /// Adds what changed in every statistics entry to its series; returns the entries to
    /// reclaim (their values are now read).
    fn read_stats(&mut self, now: Instant, reclaim: &HashSet<u32>) -> Folded<SyscallKey> {
        let cost = self.series_cost();
        let snapshot = self.maps.stats.snapshot();
        let names = Names {
            seen_at: snapshot.read_at,
            reclaim,
        };
        let mut labeler = self.labeler.lock().expect("labeler lock");
        let (budget, control) = (&mut self.budget, &self.control);
        let folded = self.stats.fold(
            snapshot,
            now,
            // Not nameable yet (a process that exited since the snapshot): the values wait for
            // the next cycle (and the entry in the kernel) rather than go to a placeholder.
            |key, first| match names.of(&mut labeler, key.cgroup_id, key.tgid, first) {
                Some(workload) => {
                    let labels = series_key(control, workload, key.nr, key.fd);
                    let series = budget.route(&labels, cost, Self::coarser);
                    Named::As(labels, series)
                }
                None => Named::NotYet,
            },
            // A cgroup's shared key is freed once a read finds it idle: its values are read,
            // and the slot serves whichever key needs one next.
            |key, change| {
                reclaim.contains(&key.tgid) || (key.tgid == FOLDED_TGID && change.is_zero())
            },
        );
        // What fills the table: keys holding a slot (a key whose copies are not written yet
        // holds one too).
        self.stats_usage.seen(self.maps.stats.keys_held() as u64);
        folded
    }

    /// Adds what changed in the parts off CPU of every statistics entry to the series its
    /// durations count in: read right after [`Self::read_stats`] (see [`super::syscall_time`]).
    /// Returns whether the read saw every entry (`None`: the split is off).
    fn read_times(&mut self, now: Instant) -> Option<bool> {
        let time = self.time.as_mut()?;
        let stats = &self.stats;
        Some(time.read(self.maps.stats.state_snapshot(), now, |key| {
            stats.series_of(key).cloned()
        }))
    }

    /// Hands the cgroups of the entries named so far, with the labels of their series, to the
    /// CPU throttling reader: right after [`Self::read_stats`], before the entries of exited
    /// processes are reclaimed.
    fn label_cgroups(&mut self) {
        let mut labelled: std::collections::HashMap<u64, Arc<CgroupLabels>> =
            std::collections::HashMap::new();
        for (key, (workload, _, _)) in self.stats.routes() {
            // A series of the cgroup's own wins over one folded into `cgroup="other"`.
            let series = labelled
                .entry(key.cgroup_id)
                .or_insert_with(|| workload.cgroup.clone());
            if series.path.as_ref() == OTHER {
                *series = workload.cgroup.clone();
            }
        }
        let cgroups: Vec<_> = {
            let mut labeler = self.labeler.lock().expect("labeler lock");
            labelled
                .into_iter()
                .map(|(id, series)| (id, labeler.cgroup(id), series))
                .collect()
        };
        self.cgroup_cpu.label(cgroups);
    }

    /// Adds what changed in every error entry to its series; as [`Self::read_stats`].
    fn read_errors(&mut self, now: Instant, reclaim: &HashSet<u32>) -> Folded<ErrnoKey> {
        let cost = self.series_cost();
        let snapshot = self.maps.errors.read();
        let names = Names {
            seen_at: snapshot.read_at,
            reclaim,
        };
        let mut labeler = self.labeler.lock().expect("labeler lock");
        self.errors_usage.seen(snapshot.entries.len() as u64);
        let (budget, control) = (&mut self.budget, &self.control);
        self.errors.fold(
            snapshot,
            now,
            |key, first| match names.of(&mut labeler, key.cgroup_id, key.tgid, first) {
                Some(workload) => {
                    let labels = series_key(control, workload, key.nr as u32, key.fd);
                    let (w, nr, fd) = budget.route(&labels, cost, Self::coarser);
                    Named::As(labels, (w, nr, fd, key.errno))
                }
                None => Named::NotYet,
            },
            |key, change| reclaim.contains(&key.tgid) || (key.tgid == FOLDED_TGID && *change == 0),
        )
    }

    /// Drops series no kernel entry feeds that have been idle for the retention period.
    fn retire_idle_series(&mut self, now: Instant) {
        let retired = self.stats.retire(now, self.retention);
        self.errors.retire(now, self.retention);
        if retired {
            let stats = &self.stats;
            self.budget.retain(|k| stats.has_series(k));
            let mut labeler = self.labeler.lock().expect("labeler lock");
            let ids: HashSet<u64> = self.stats.keys().map(|k| k.cgroup_id).collect();
            labeler.retain_cgroups(|id| ids.contains(&id));
        }
    }
}

/// The label set a kernel entry counts in, as label control keeps it: a 32-bit compat call
/// counts as the native call of the same name, where there is one
/// ([`syscall_table::canonical`]); a syscall label control does not export by name counts as
/// `syscall="other"`, without the descriptor's labels.
fn series_key(control: &LabelControl, workload: Workload, nr: u32, fd: FdClass) -> SeriesKey {
    let nr = syscall_table::canonical(nr);
    let kept = control.syscall(nr);
    let fd = if kept == nr { fd } else { FdClass::NONE };
    (control.workload(workload), kept, fd)
}

/// The labels of a syscall series: the workload's, `syscall`, and the descriptor's.
fn series_labels<'a>(
    labels: &mut Vec<(&'static str, Cow<'a, str>)>,
    workload: &'a Workload,
    nr: u32,
    fd: &FdClass,
) {
    labels.clear();
    workload.push_labels(labels);
    labels.push(("syscall", syscall_table::label(nr)));
    fd_class::push_labels(fd, labels);
}

/// Names the entries of one read of a map: `seen_at` is when the read ended, `reclaim` the
/// processes whose entries it reads for the last time.
struct Names<'a> {
    seen_at: Instant,
    reclaim: &'a HashSet<u32>,
}

impl Names<'_> {
    /// The workload of a kernel (cgroup, tgid) pair, `first` when its entry was never named;
    /// a cgroup's shared key ([`FOLDED_TGID`]) is its cgroup's `comm="other"`.
    fn of(
        &self,
        labeler: &mut Labeler,
        cgroup_id: u64,
        tgid: u32,
        first: bool,
    ) -> Option<Workload> {
        if tgid == FOLDED_TGID {
            return Some(
                labeler
                    .workload_named(cgroup_id, tgid, Arc::from(OTHER))
                    .fold_comm(),
            );
        }
        let sighting = Sighting::of(first, self.reclaim.contains(&tgid));
        labeler.try_workload(cgroup_id, tgid, self.seen_at, sighting)
    }
}

impl Collector for SyscallCollector {
    fn name(&self) -> &'static str {
        NAME
    }

    fn refresh(&mut self) -> Result<(), CollectorError> {
        let now = Instant::now();
        self.labeler.lock().expect("labeler lock").new_cycle();
        let exited = self.read_exits();
        let mut reclaim = self.orphans(&exited);
        reclaim.extend(exited.iter().copied());
        let stats = self.read_stats(now, &reclaim);
        let times = self.read_times(now);
        self.label_cgroups();
        let errors = self.read_errors(now, &reclaim);

        // Reclaim: the values of these entries were just added to their series. An entry is
        // forgotten only once the kernel's is gone; otherwise it is read again next time.
        let gone = self.maps.stats.remove(&stats.reclaim);
        if let (Some(time), Some(complete)) = (self.time.as_mut(), times) {
            time.reclaimed(gone.iter().copied(), complete);
        }
        self.stats.reclaimed(gone, stats.complete);
        let gone = self.maps.remove_errors(&errors.reclaim);
        self.errors.reclaimed(gone, errors.complete);
        self.maps.stats.forget_idle_cgroups();
        {
            // Entries deferred this cycle still need the exit-time name.
            let remaining: HashSet<u32> = self
                .stats
                .keys()
                .map(|k| k.tgid)
                .chain(self.errors.keys().map(|k| k.tgid))
                .collect();
            let mut labeler = self.labeler.lock().expect("labeler lock");
            self.maps.exits.forget(&exited);
            for tgid in &exited {
                if !remaining.contains(tgid) {
                    labeler.comms.forget(*tgid);
                }
            }
            // Orphans too: their exit record was lost, but they are gone all the same.
            for tgid in &reclaim {
                if !remaining.contains(tgid) {
                    labeler.comms.forget(*tgid);
                }
            }
        }
        if !reclaim.is_empty() {
            // Routing state follows the live label sets, not every label set ever seen:
            // under process churn with unique names the budget would otherwise grow forever.
            let live: HashSet<&SeriesKey> = self
                .stats
                .labels()
                .map(|(_, labels)| labels)
                .chain(self.errors.labels().map(|(_, labels)| labels))
                .collect();
            self.budget.retain_routes(|k| live.contains(k));
        }
        self.retire_idle_series(now);
        if let Some(time) = self.time.as_mut() {
            time.settle(self.stats.series().map(|(k, s)| (k, s.sum.sum_ns)));
        }
        self.cgroup_cpu.refresh(now, self.retention);
        Ok(())
    }

    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let mut labels: Vec<(&'static str, Cow<'_, str>)> = Vec::with_capacity(8);
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_syscalls",
                "Syscalls completed, per cgroup, process name and syscall (exit and exit_group are counted at entry).",
                None,
                MetricType::Counter,
            )?;
            for ((workload, nr, fd), series) in self.stats.series() {
                series_labels(&mut labels, workload, *nr, fd);
                family
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&series.sum.count(), None)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_syscall_errors",
                "Syscalls that returned an error, by errno.",
                None,
                MetricType::Counter,
            )?;
            for ((workload, nr, fd, errno), series) in self.errors.series() {
                series_labels(&mut labels, workload, *nr, fd);
                labels.push(("errno", syscall_table::errno_label(*errno)));
                family
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&series.sum, None)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_syscall_duration_seconds",
                "Time from syscall entry to exit (log2 buckets measured in the kernel).",
                None,
                MetricType::Histogram,
            )?;
            for ((workload, nr, fd), series) in self.stats.series() {
                series_labels(&mut labels, workload, *nr, fd);
                self.histograms
                    .encode(family.encode_family(&labels)?, &series.sum)?;
            }
        }
        if let Some(time) = &self.time {
            let mut family = encoder.encode_descriptor(
                "sysscope_syscall_time_seconds",
                "Time inside syscalls by where the calling thread was: on_cpu (running), wait_cpu (runnable, waiting for a CPU: preempted, or woken and not yet running), blocked (asleep: I/O, locks, sleeps), unknown (off CPU with a stamp missed); a state is exported once the series has spent time in it, and the states add up to sysscope_syscall_duration_seconds_sum.",
                None,
                MetricType::Counter,
            )?;
            for (key, _) in self.stats.series() {
                let (workload, nr, fd) = key;
                // The series' labels once, then each state in the last place.
                series_labels(&mut labels, workload, *nr, fd);
                let len = labels.len();
                for (state, ns) in STATES.iter().zip(time.get(key).by_state()) {
                    // A state the series never spent time in is not exported: most triples
                    // never wait for a CPU or go unaccounted. A part only grows while its
                    // series lives, so a state once exported stays.
                    if ns == 0 {
                        continue;
                    }
                    labels.truncate(len);
                    labels.push(("state", Cow::Borrowed(state)));
                    family
                        .encode_family(&labels)?
                        .encode_counter::<NoLabelSet, _, u64>(&(ns as f64 / 1e9), None)?;
                }
            }
        }
        self.cgroup_cpu.encode(encoder)?;
        Ok(())
    }

    fn reconfigure(&mut self, config: &Config) -> Result<(), CollectorError> {
        self.thresholds.write(&config.slow_thresholds_ns())?;
        self.budget.set_max(config.limits.max_series);
        self.retention = config.collection.series_retention;
        Ok(())
    }

    fn health(&self) -> Health {
        Health {
            maps: vec![
                self.stats_usage.clone(),
                self.errors_usage.clone(),
                self.exits_usage.clone(),
            ],
            folded_series: vec![("syscalls", self.budget.folded())],
            ..Health::default()
        }
    }
}
