//! CPU bandwidth throttling of the cgroups the syscall collector labels, exported beside their
//! syscall time by state: `sysscope_cgroup_cpu_periods_total`,
//! `sysscope_cgroup_cpu_throttled_periods_total`, `sysscope_cgroup_cpu_throttled_seconds_total`.
//!
//! No probe: each refresh reads the `cpu.stat` of every cgroup that has a syscall series of
//! its own ([`crate::metadata::cpu_bandwidth`]), so the cgroups are those already labelled and
//! as bounded as the syscall series (cgroups folded into `cgroup="other"` and unresolved ids
//! are skipped). A cgroup is read from the first time it has one until it is gone. A cgroup
//! whose `cpu.stat` has no bandwidth accounting (the `cpu` controller is off for it) has no
//! series here.
//!
//! The counters go through a [`SeriesTable`] keyed by cgroup id and named with the cgroup
//! labels of the cgroup's syscall series, label control applied: where `[labels] cgroup =
//! "unless_pod_known"` drops `cgroup` and `container_id`, the cgroups of a container before
//! and after a restart count in one series, whose values are the sums of what each cgroup
//! counted while it was read (the kernel's counters start at zero with each cgroup).

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use prometheus_client::{
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
};

use crate::{
    kernel::cumulative::Snapshot,
    metadata::{
        cgroups::UNRESOLVED,
        cpu_bandwidth::{BandwidthReader, CpuBandwidth},
    },
    series::{CgroupLabels, Named, SeriesTable, OTHER},
};

/// One exported family: name, help, and its value of a cgroup's accounting.
type Family = (&'static str, &'static str, fn(&CpuBandwidth) -> f64);

/// A cgroup read: its path (relative to the v2 root) and the labels its series carries.
#[derive(Debug)]
struct Read {
    path: Arc<str>,
    series: Arc<CgroupLabels>,
}

/// The bandwidth accounting of labelled cgroups, summed into their series.
#[derive(Debug)]
pub(crate) struct CgroupCpu {
    reader: BandwidthReader,
    cgroups: HashMap<u64, Read>,
    /// Cgroups whose `cpu.stat` had no bandwidth accounting (no cpu controller) or could not
    /// be read: not offered again while the reads name them, so each costs one read, and a
    /// cgroup whose series ended is never counted again from zero.
    unaccounted: HashSet<u64>,
    /// The buffer every `cpu.stat` is read into.
    buf: Vec<u8>,
    table: SeriesTable<u64, CpuBandwidth, (), Arc<CgroupLabels>>,
}

impl CgroupCpu {
    /// Reads the cgroups under the v2 mount `root` (and the v1 `cpu` hierarchy on hybrid
    /// hosts).
    pub(crate) fn new(root: std::path::PathBuf) -> Self {
        Self {
            reader: BandwidthReader::new(root),
            cgroups: HashMap::new(),
            unaccounted: HashSet::new(),
            buf: vec![0; 1024],
            table: SeriesTable::following_renames(),
        }
    }

    /// Adds cgroups to read: each cgroup id with its labels and the cgroup labels of a series
    /// it counts in (label control applied; [`CgroupLabels::other`] when folded away). Called
    /// with the entries a read named, before the entries of exited processes are reclaimed,
    /// so a cgroup whose processes all ended since the last read is read too.
    pub(crate) fn label(
        &mut self,
        labelled: impl IntoIterator<Item = (u64, Arc<CgroupLabels>, Arc<CgroupLabels>)>,
    ) {
        let mut named = HashSet::new();
        for (id, cgroup, series) in labelled {
            named.insert(id);
            let path = &cgroup.path;
            if series.path.as_ref() == OTHER
                || &**path == UNRESOLVED
                || &**path == OTHER
                || self.unaccounted.contains(&id)
            {
                continue;
            }
            self.cgroups.insert(
                id,
                Read {
                    path: path.clone(),
                    series,
                },
            );
        }
        // A cgroup no read names any more is gone; its id is not reused.
        self.unaccounted.retain(|id| named.contains(id));
    }

    /// Reads the `cpu.stat` of every cgroup labelled so far into its series. Series no cgroup
    /// feeds any more are dropped once idle for `retention`.
    pub(crate) fn refresh(&mut self, now: Instant, retention: Duration) {
        // A cgroup that can no longer be read is gone (or no longer accounts bandwidth): it
        // is forgotten, what it counted stays in its series.
        let (reader, unaccounted, buf) = (&self.reader, &mut self.unaccounted, &mut self.buf);
        let mut entries = Vec::with_capacity(self.cgroups.len());
        self.cgroups
            .retain(|id, read| match reader.read(&read.path, buf) {
                Some(bandwidth) => {
                    entries.push((*id, bandwidth));
                    true
                }
                None => {
                    unaccounted.insert(*id);
                    false
                }
            });
        let cgroups = &self.cgroups;
        let folded = self.table.fold(
            Snapshot::ended(entries, true),
            now,
            |id, _| match cgroups.get(id) {
                Some(read) => Named::As((), read.series.clone()),
                None => Named::Ignored,
            },
            |_, _| false,
        );
        self.table.reclaimed([], folded.complete);
        self.table.retire(now, retention);
    }

    pub(crate) fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let families: [Family; 3] = [
            (
                "sysscope_cgroup_cpu_periods",
                "CFS bandwidth enforcement periods of the cgroup that had runnable tasks (cpu.stat nr_periods).",
                |b| b.periods as f64,
            ),
            (
                "sysscope_cgroup_cpu_throttled_periods",
                "Periods in which the cgroup used its CPU quota (cpu.max) and was throttled (cpu.stat nr_throttled).",
                |b| b.throttled_periods as f64,
            ),
            (
                "sysscope_cgroup_cpu_throttled_seconds",
                "Time the cgroup's runqueues spent throttled by its CPU quota, summed over CPUs (cpu.stat throttled_usec).",
                |b| b.throttled.as_secs_f64(),
            ),
        ];
        let mut series: Vec<_> = self.table.series().collect();
        series.sort_by(|a, b| a.0.cmp(b.0));
        let mut labels: Vec<(&'static str, Cow<'_, str>)> = Vec::with_capacity(6);
        for (name, help, value) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (cgroup, totals) in &series {
                labels.clear();
                // A cgroup path label control dropped is empty, and not exported.
                if !cgroup.path.is_empty() {
                    labels.push(("cgroup", Cow::Borrowed(&cgroup.path)));
                }
                for (k, v) in &cgroup.extra {
                    labels.push((k, Cow::Borrowed(v)));
                }
                family
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&value(&totals.sum), None)?;
            }
        }
        Ok(())
    }
}
