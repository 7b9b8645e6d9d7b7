//! CFS bandwidth throttling of a cgroup (`cpu.max`), as the kernel accounts it in the
//! cgroup's `cpu.stat`: periods, periods throttled, time throttled. Read for the cgroups the
//! syscall collector labels (exported beside their syscall time by state) and by
//! `sysscope diagnose`.
//!
//! The cgroup v2 file is read first (`nr_periods`, `nr_throttled`, `throttled_usec`). On a
//! hybrid host, where the `cpu` controller is bound to a cgroup v1 hierarchy and the v2
//! cgroup's `cpu.stat` has no bandwidth fields, the v1 `cpu` cgroup of the same path is read
//! instead (`nr_periods`, `nr_throttled`, `throttled_time` in ns): systemd and the kubelet
//! create a workload's cgroups at the same path in every hierarchy. A cgroup with neither has
//! no bandwidth accounting (the controller is off for it) and is reported as such (`None`),
//! never as zero.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use super::cgroups::unescape_mountinfo;
use crate::{kernel::cumulative::Counters, util::pseudo_file::read_small};

/// What `cpu.stat` says of a cgroup's CPU bandwidth, cumulative since the cgroup was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuBandwidth {
    /// Enforcement periods that had runnable tasks (`nr_periods`).
    pub periods: u64,
    /// Of those, periods in which the cgroup used its quota and was throttled (`nr_throttled`).
    pub throttled_periods: u64,
    /// Time the cgroup's runqueues spent throttled, summed over CPUs (`throttled_usec`, or
    /// `throttled_time` in cgroup v1).
    pub throttled: Duration,
}

impl CpuBandwidth {
    /// Share of periods throttled (0 without periods).
    pub fn throttled_ratio(&self) -> f64 {
        if self.periods == 0 {
            0.0
        } else {
            self.throttled_periods as f64 / self.periods as f64
        }
    }

    /// What `self`, a later read of the same cgroup, adds to `before` (all of it if a counter
    /// went back: the cgroup was created again).
    pub fn since(&self, before: &Self) -> Self {
        if self.periods < before.periods
            || self.throttled_periods < before.throttled_periods
            || self.throttled < before.throttled
        {
            return *self;
        }
        Self {
            periods: self.periods - before.periods,
            throttled_periods: self.throttled_periods - before.throttled_periods,
            throttled: self.throttled - before.throttled,
        }
    }
}

/// A cgroup's counters as the syscall collector sums them into series (see
/// `collectors::cgroup_cpu`).
impl Counters for CpuBandwidth {
    const ZERO: Self = Self {
        periods: 0,
        throttled_periods: 0,
        throttled: Duration::ZERO,
    };

    fn since(&self, prev: &Self) -> Self {
        CpuBandwidth::since(self, prev)
    }

    fn is_zero(&self) -> bool {
        *self == Self::ZERO
    }

    fn add(&mut self, change: &Self) {
        self.periods = self.periods.wrapping_add(change.periods);
        self.throttled_periods = self
            .throttled_periods
            .wrapping_add(change.throttled_periods);
        self.throttled = self.throttled.saturating_add(change.throttled);
    }

    fn has_events(&self) -> bool {
        self.periods > 0
    }
}

/// Reads [`CpuBandwidth`] by cgroup v2 path.
#[derive(Debug, Clone)]
pub struct BandwidthReader {
    v2_root: PathBuf,
    /// The cgroup v1 hierarchy the `cpu` controller is bound to, if any.
    v1_cpu_root: Option<PathBuf>,
}

impl BandwidthReader {
    /// A reader of the cgroups under `v2_root`, with this machine's v1 `cpu` hierarchy (from
    /// `/proc/self/mountinfo`) for hybrid hosts.
    pub fn new(v2_root: PathBuf) -> Self {
        let v1_cpu_root = std::fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|text| find_v1_cpu_mount(&text));
        Self {
            v2_root,
            v1_cpu_root,
        }
    }

    /// The bandwidth accounting of the cgroup at `path` (relative to the v2 root, `/` for the
    /// root); `None` when neither hierarchy accounts it (or the cgroup is gone). `buf` is the
    /// caller's, reused from read to read.
    pub fn read(&self, path: &str, buf: &mut Vec<u8>) -> Option<CpuBandwidth> {
        let rel = path.trim_start_matches('/');
        let v2 = read_small(&self.v2_root.join(rel).join("cpu.stat"), buf)
            .and_then(|text| parse(text, "throttled_usec", 1_000));
        v2.or_else(|| {
            let root = self.v1_cpu_root.as_ref()?;
            let text = read_small(&root.join(rel).join("cpu.stat"), buf)?;
            parse(text, "throttled_time", 1)
        })
    }

    /// The bandwidth accounting of the cgroup v2 directory `dir` (under this reader's root).
    pub fn read_dir(&self, dir: &Path) -> Option<CpuBandwidth> {
        let rel = dir.strip_prefix(&self.v2_root).ok()?;
        self.read(&format!("/{}", rel.display()), &mut vec![0; 1024])
    }

    /// The v1 `cpu` hierarchy this reader falls back to.
    pub fn v1_cpu_root(&self) -> Option<&Path> {
        self.v1_cpu_root.as_deref()
    }
}

/// The bandwidth fields of a `cpu.stat` text, the throttled time being `throttled` in units of
/// `ns_per_unit` nanoseconds; `None` without `nr_periods` (no bandwidth accounting).
fn parse(text: &str, throttled: &str, ns_per_unit: u64) -> Option<CpuBandwidth> {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.trim().parse::<u64>().ok())?
        })
    };
    Some(CpuBandwidth {
        periods: field("nr_periods")?,
        throttled_periods: field("nr_throttled")?,
        throttled: Duration::from_nanos(field(throttled)?.saturating_mul(ns_per_unit)),
    })
}

/// The mount point of the cgroup v1 hierarchy holding the `cpu` controller (`cpu` or
/// `cpu,cpuacct`), if one is mounted whole (root `/`).
fn find_v1_cpu_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // "30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,... - cgroup cgroup rw,cpu,cpuacct"
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split_whitespace();
        if right.next() != Some("cgroup") {
            return None;
        }
        let options = right.nth(1)?;
        if !options.split(',').any(|o| o == "cpu") {
            return None;
        }
        let mut fields = left.split_whitespace();
        let root = fields.nth(3)?;
        let mount_point = fields.next()?;
        (root == "/").then(|| PathBuf::from(unescape_mountinfo(mount_point)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_and_v1_files_and_mounts() {
        let v2 = "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 40\nnr_throttled 30\n\
                  throttled_usec 2500000\nnr_bursts 0\nburst_usec 0\n";
        assert_eq!(
            parse(v2, "throttled_usec", 1_000),
            Some(CpuBandwidth {
                periods: 40,
                throttled_periods: 30,
                throttled: Duration::from_millis(2500),
            })
        );
        // Without the cpu controller a v2 cgroup reports usage only.
        assert_eq!(
            parse(
                "usage_usec 5\nuser_usec 3\nsystem_usec 2\n",
                "throttled_usec",
                1000
            ),
            None
        );
        let v1 = "nr_periods 12\nnr_throttled 9\nthrottled_time 812345678\n";
        let b = parse(v1, "throttled_time", 1).unwrap();
        assert_eq!(b.throttled, Duration::from_nanos(812_345_678));
        assert_eq!(b.throttled_ratio(), 0.75);
        let later = CpuBandwidth {
            periods: 20,
            throttled_periods: 10,
            throttled: Duration::from_secs(1),
        };
        assert_eq!(later.since(&b).throttled_periods, 1);
        assert_eq!(b.since(&later), b);

        let mountinfo = "\
29 24 0:25 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
30 24 0:26 / /sys/fs/cgroup/cpuacct rw,nosuid - cgroup cgroup rw,cpuacct
31 24 0:27 /kubepods /mnt/cpu rw,nosuid - cgroup cgroup rw,cpu
32 24 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
";
        assert_eq!(
            find_v1_cpu_mount(mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        assert_eq!(
            find_v1_cpu_mount(&mountinfo[..mountinfo.find("31 ").unwrap()]),
            None
        );
    }

    #[test]
    fn a_cgroup_without_accounting_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/cpu.stat"), "usage_usec 1\n").unwrap();
        let v1 = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(v1.path().join("a/b")).unwrap();
        std::fs::write(
            v1.path().join("a/b/cpu.stat"),
            "nr_periods 3\nnr_throttled 1\nthrottled_time 1000\n",
        )
        .unwrap();
        let without_v1 = BandwidthReader {
            v2_root: dir.path().to_path_buf(),
            v1_cpu_root: None,
        };
        assert_eq!(without_v1.read("/a/b", &mut vec![0; 16]), None);
        assert_eq!(without_v1.read("/gone", &mut vec![0; 16]), None);
        let hybrid = BandwidthReader {
            v1_cpu_root: Some(v1.path().to_path_buf()),
            ..without_v1
        };
        assert_eq!(
            hybrid.read("/a/b", &mut vec![0; 16]).map(|b| b.periods),
            Some(3)
        );
    }
}
