//! The CPU collector: per-CPU utilisation by mode, like `mpstat -P ALL`, and CPU time per
//! cgroup. No probes and no kernel maps: it reads `/proc/stat` and each cgroup v2 `cpu.stat`.
//! Metrics: `sysscope_cpu_utilization_ratio{cpu,mode}`,
//! `sysscope_cgroup_cpu_seconds_total{cgroup,mode}`, `sysscope_cgroup_cpu_skipped_cgroups`.
//!
//! Utilisation is the share of each mode in the ticks a CPU accounted between two refreshes
//! (a refresh happens at most once per `collection.min_interval`, on scrapes and on the
//! background tick). The first refresh has no previous sample, so it reports the averages
//! since boot, as `mpstat` does without an interval; a CPU that comes online later starts the
//! same way. `/proc/stat` is read through [`crate::sources::proc_stat`], which keeps each CPU's
//! kernel number.
//!
//! cgroup CPU time comes from the `usage_usec`/`user_usec`/`system_usec` lines every cgroup v2
//! directory has (whether or not the cpu controller is enabled). The hierarchy is walked
//! breadth first in name order and at most `cpu.max_cgroups` directories are read per refresh;
//! parents come first and include their children's time, so what is cut is detail, not time.

use std::{
    borrow::Cow,
    collections::{BTreeMap, VecDeque},
    os::unix::fs::{DirEntryExt, MetadataExt},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use prometheus_client::{
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
};

use super::{Collector, CollectorError};
use crate::{
    config::Config,
    metadata::SharedLabeler,
    series::CgroupLabels,
    sources::proc_stat::{self, CpuTicks, ProcStatError, MODES},
    util::pseudo_file::read_small,
};

pub(crate) const NAME: &str = "cpu";

#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error(transparent)]
    ProcStat(#[from] ProcStatError),
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl From<CpuError> for CollectorError {
    fn from(e: CpuError) -> Self {
        match e {
            CpuError::Read { path, source }
            | CpuError::ProcStat(ProcStatError::Read { path, source }) => CollectorError::Io {
                what: format!("reading {path}"),
                source,
            },
            other => CollectorError::Other(other.to_string()),
        }
    }
}

/// Share of each mode in the ticks between `prev` and `cur` (since boot without `prev`).
/// `None` when no tick was accounted in between (refreshes closer than a tick): the caller
/// keeps its previous values. A counter that went back (idle and iowait can, briefly, on
/// tickless kernels) contributes 0.
pub(crate) fn ratios(prev: Option<&CpuTicks>, cur: &CpuTicks) -> Option<[f64; 8]> {
    let delta = cur.since(prev.unwrap_or(&CpuTicks::default()));
    let total: u64 = delta.iter().sum();
    if total == 0 {
        return None;
    }
    let mut out = [0.0; 8];
    for (o, d) in out.iter_mut().zip(delta.iter()) {
        *o = *d as f64 / total as f64;
    }
    Some(out)
}

/// CPU time of one cgroup from its `cpu.stat`, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CgroupCpuStat {
    pub(crate) usage_usec: u64,
    pub(crate) user_usec: u64,
    pub(crate) system_usec: u64,
}

/// Parses a cgroup v2 `cpu.stat`; `None` when it lacks the usage lines.
pub(crate) fn parse_cpu_stat(text: &str) -> Option<CgroupCpuStat> {
    let mut stat = CgroupCpuStat::default();
    let mut found = 0;
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        let (Some(key), Some(value)) = (it.next(), it.next()) else {
            continue;
        };
        let slot = match key {
            "usage_usec" => &mut stat.usage_usec,
            "user_usec" => &mut stat.user_usec,
            "system_usec" => &mut stat.system_usec,
            _ => continue,
        };
        *slot = value.parse().ok()?;
        found += 1;
    }
    (found == 3).then_some(stat)
}

/// One cgroup read at the last refresh.
#[derive(Debug, Clone)]
struct CgroupCpu {
    labels: Arc<CgroupLabels>,
    stat: CgroupCpuStat,
}

/// A cgroup directory to read: (directory, path relative to the v2 root, cgroup id).
type CgroupDir = (PathBuf, String, u64);

/// Reads `cpu.stat` of up to `max` cgroups, breadth first in name order.
///
/// Listing directories costs as much as reading them, so the hierarchy is walked again only
/// when the root's `cgroup.stat` counts a different number of descendants (cgroups were
/// created or removed), or after [`WALK_INTERVAL`] in case a removal and a creation cancelled
/// out; otherwise the cgroups found by the last walk are read again.
#[derive(Debug)]
struct CgroupReader {
    root: PathBuf,
    max: usize,
    /// The cgroups found by the last walk, in walk order.
    dirs: Vec<CgroupDir>,
    walked: Option<(Instant, Option<u64>)>,
    /// By cgroup id: a directory re-created under the same path is a new cgroup (its counters
    /// restart), and only directories that exist now are read.
    read: BTreeMap<u64, CgroupCpu>,
    skipped: u64,
    buf: Vec<u8>,
}

/// The hierarchy is walked at least this often.
const WALK_INTERVAL: Duration = Duration::from_secs(60);

impl CgroupReader {
    fn new(root: PathBuf, max: usize) -> Self {
        Self {
            root,
            max: max.max(1),
            dirs: Vec::new(),
            walked: None,
            read: BTreeMap::new(),
            skipped: 0,
            buf: vec![0u8; 4096],
        }
    }

    /// `nr_descendants` of the root's `cgroup.stat`.
    fn descendants(&mut self) -> Option<u64> {
        let text = read_small(&self.root.join("cgroup.stat"), &mut self.buf)?;
        text.lines()
            .find_map(|l| l.strip_prefix("nr_descendants "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Lists up to `max` cgroups breadth first, children in name order; counts the rest of
    /// the queue as skipped.
    fn walk(&mut self) -> Result<(), CpuError> {
        let root_meta = std::fs::metadata(&self.root).map_err(|source| CpuError::Read {
            path: self.root.display().to_string(),
            source,
        })?;
        let mut dirs = Vec::new();
        let mut queue: VecDeque<CgroupDir> = VecDeque::new();
        queue.push_back((self.root.clone(), "/".into(), root_meta.ino()));
        while dirs.len() < self.max {
            let Some((dir, rel, id)) = queue.pop_front() else {
                break;
            };
            // A cgroup removed since its parent was listed is simply gone.
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            // The directory entry's inode is the cgroup id: no stat per child.
            let mut children: Vec<(String, PathBuf, u64)> = entries
                .flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        e.path(),
                        e.ino(),
                    )
                })
                .collect();
            children.sort_unstable();
            for (name, path, child) in children {
                let child_rel = if rel == "/" {
                    format!("/{name}")
                } else {
                    format!("{rel}/{name}")
                };
                queue.push_back((path, child_rel, child));
            }
            dirs.push((dir, rel, id));
        }
        self.skipped = queue.len() as u64;
        self.dirs = dirs;
        Ok(())
    }

    fn refresh(&mut self, labeler: &SharedLabeler) -> Result<(), CpuError> {
        let descendants = self.descendants();
        let stale = match self.walked {
            None => true,
            Some((at, before)) => {
                at.elapsed() >= WALK_INTERVAL || descendants.is_none() || before != descendants
            }
        };
        if stale {
            self.walk()?;
            self.walked = Some((Instant::now(), descendants));
        }
        let mut read = BTreeMap::new();
        let mut labeler = labeler.lock().expect("labeler lock");
        let mut gone = false;
        for (dir, rel, id) in &self.dirs {
            match read_small(&dir.join("cpu.stat"), &mut self.buf).and_then(parse_cpu_stat) {
                Some(stat) => {
                    let labels = labeler.cgroup_at(*id, rel);
                    read.insert(*id, CgroupCpu { labels, stat });
                }
                None => gone = true,
            }
        }
        if gone {
            // Removed between two walks: walk again next time.
            self.walked = None;
        }
        self.read = read;
        Ok(())
    }
}

pub struct CpuCollector {
    proc_stat: PathBuf,
    /// Last sample per CPU number.
    prev: BTreeMap<u32, CpuTicks>,
    /// Ratios over the last interval per CPU number, in [`MODES`] order.
    ratios: BTreeMap<u32, [f64; 8]>,
    cgroups: Option<CgroupReader>,
    labeler: SharedLabeler,
}

impl std::fmt::Debug for CpuCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuCollector")
            .field("cpus", &self.ratios.len())
            .field("cgroups", &self.cgroups.as_ref().map(|c| c.read.len()))
            .finish_non_exhaustive()
    }
}

impl CpuCollector {
    /// The collector over this machine's `/proc/stat` and cgroup v2 hierarchy.
    pub fn start(config: &Config, labeler: SharedLabeler) -> Result<Self, CpuError> {
        let root = crate::metadata::cgroup_root(&labeler);
        let cgroup_root = config.cpu.cgroups.then_some(root);
        Self::with_paths(
            proc_stat::PATH.into(),
            cgroup_root,
            config.cpu.max_cgroups,
            labeler,
        )
    }

    /// The collector over `proc_stat` and, when given, the cgroup v2 hierarchy at
    /// `cgroup_root` (reading at most `max_cgroups` per refresh). Fails if `proc_stat` cannot
    /// be read and parsed.
    pub(crate) fn with_paths(
        proc_stat: PathBuf,
        cgroup_root: Option<PathBuf>,
        max_cgroups: usize,
        labeler: SharedLabeler,
    ) -> Result<Self, CpuError> {
        proc_stat::read(&proc_stat)?;
        Ok(Self {
            proc_stat,
            prev: BTreeMap::new(),
            ratios: BTreeMap::new(),
            cgroups: cgroup_root.map(|root| CgroupReader::new(root, max_cgroups)),
            labeler,
        })
    }

    fn refresh_cpus(&mut self) -> Result<(), CpuError> {
        let cpus = proc_stat::read(&self.proc_stat)?.cpus;
        let online: Vec<u32> = cpus.iter().map(|(cpu, _)| *cpu).collect();
        for (cpu, ticks) in cpus {
            if let Some(r) = ratios(self.prev.get(&cpu), &ticks) {
                self.ratios.insert(cpu, r);
                self.prev.insert(cpu, ticks);
            }
        }
        // A CPU that went offline loses its series and starts from boot when it returns.
        self.ratios.retain(|cpu, _| online.contains(cpu));
        self.prev.retain(|cpu, _| online.contains(cpu));
        Ok(())
    }
}

impl Collector for CpuCollector {
    fn name(&self) -> &'static str {
        NAME
    }

    fn refresh(&mut self) -> Result<(), CollectorError> {
        let cpus = self.refresh_cpus();
        let cgroups = match self.cgroups.as_mut() {
            Some(c) => c.refresh(&self.labeler),
            None => Ok(()),
        };
        cpus?;
        cgroups?;
        Ok(())
    }

    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_cpu_utilization_ratio",
                "Share of the CPU's time in each mode between the last two refreshes (since boot at the first); the modes of a CPU sum to 1.",
                None,
                MetricType::Gauge,
            )?;
            for (cpu, ratios) in &self.ratios {
                let cpu = cpu.to_string();
                for (mode, value) in MODES.iter().zip(ratios.iter()) {
                    family
                        .encode_family(&[("cpu", cpu.as_str()), ("mode", mode)])?
                        .encode_gauge(value)?;
                }
            }
        }
        let Some(cgroups) = &self.cgroups else {
            return Ok(());
        };
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_cgroup_cpu_seconds",
                "CPU time of the cgroup and its descendants, from its cgroup v2 cpu.stat.",
                None,
                MetricType::Counter,
            )?;
            let mut labels: Vec<(&'static str, Cow<'_, str>)> = Vec::with_capacity(6);
            for cg in cgroups.read.values() {
                for (mode, usec) in [("user", cg.stat.user_usec), ("system", cg.stat.system_usec)] {
                    labels.clear();
                    labels.push(("cgroup", Cow::Borrowed(&cg.labels.path)));
                    for (k, v) in &cg.labels.extra {
                        labels.push((k, Cow::Borrowed(v)));
                    }
                    labels.push(("mode", Cow::Borrowed(mode)));
                    family
                        .encode_family(&labels)?
                        .encode_counter::<NoLabelSet, _, f64>(&(usec as f64 / 1e6), None)?;
                }
            }
        }
        encoder
            .encode_descriptor(
                "sysscope_cgroup_cpu_skipped_cgroups",
                "cgroups found but not read at the last refresh because of cpu.max_cgroups (their time is in their parents'; descendants of skipped cgroups are not walked, so this is a lower bound).",
                None,
                MetricType::Gauge,
            )?
            .encode_gauge(&(cgroups.skipped as i64))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::{path::Path, sync::Mutex};

    use super::*;
    use crate::metadata::Labeler;

    /// Two reads of /proc/stat of a 4-CPU machine with CPU 2 offline, one second apart
    /// (recorded from a real machine, the CPU numbers edited).
    const STAT_A: &str = "\
cpu  68730 0 22819 184610 2001 0 198 48 0 0
cpu0 32780 0 10243 95460 632 0 33 21 0 0
cpu1 35949 0 12576 89149 1369 0 165 26 0 0
cpu3 1 2 3 4 5 6 7 8 9 10
intr 746811 0 0 0
ctxt 1091176
btime 1763700000
processes 51234
procs_running 3
procs_blocked 0
softirq 1 2 3
";
    const STAT_B: &str = "\
cpu  68830 0 22839 184690 2001 0 199 48 30 0
cpu0 32880 0 10243 95460 632 0 33 21 30 0
cpu1 35949 5 12596 89209 1369 10 166 30 0 0
cpu3 1 2 3 4 5 6 7 8 9 10
intr 746811 0 0 0
";

    #[test]
    fn ratios_of_a_delta_sum_to_one_and_ignore_guest() {
        let a = proc_stat::parse(STAT_A, "a").unwrap().cpus;
        let b = proc_stat::parse(STAT_B, "b").unwrap().cpus;
        // cpu0: +100 user, +30 guest (already inside user): all user.
        let r0 = ratios(Some(&a[0].1), &b[0].1).unwrap();
        assert_eq!(r0, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        // cpu1: nice 5, system 20, idle 60, irq 10, softirq 1, steal 4 of 100 ticks.
        let r1 = ratios(Some(&a[1].1), &b[1].1).unwrap();
        let want = [0.0, 0.05, 0.20, 0.60, 0.0, 0.10, 0.01, 0.04];
        for (got, want) in r1.iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{r1:?}");
        }
        assert!((r1.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        // cpu3 did not move: no interval to report.
        assert_eq!(ratios(Some(&a[2].1), &b[2].1), None);
    }

    #[test]
    fn first_sample_is_since_boot_and_counters_going_back_count_zero() {
        let cur = CpuTicks([30, 0, 10, 60, 0, 0, 0, 0]);
        let r = ratios(None, &cur).unwrap();
        assert_eq!(r[0], 0.3);
        assert_eq!(r[3], 0.6);
        // idle went back by 2 (tickless accounting): it counts 0, the rest share the interval.
        let prev = CpuTicks([20, 0, 10, 62, 0, 0, 0, 0]);
        assert_eq!(
            ratios(Some(&prev), &cur).unwrap(),
            [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        );
    }

    #[test]
    fn parses_cpu_stat() {
        let text = "usage_usec 917453996\nuser_usec 687272772\nsystem_usec 230181224\nnice_usec 0\nnr_periods 0\n";
        assert_eq!(
            parse_cpu_stat(text),
            Some(CgroupCpuStat {
                usage_usec: 917453996,
                user_usec: 687272772,
                system_usec: 230181224
            })
        );
        assert_eq!(parse_cpu_stat("usage_usec 1\n"), None);
        assert_eq!(
            parse_cpu_stat("usage_usec x\nuser_usec 1\nsystem_usec 1\n"),
            None
        );
    }

    /// A labeler that derives a `pod_uid` for /b, as the Kubernetes deriver does for pods.
    fn labeler(root: &Path) -> SharedLabeler {
        let derive = |path: &str| {
            if path == "/b" {
                vec![("pod_uid", Arc::from("uid-b"))]
            } else {
                Vec::new()
            }
        };
        Arc::new(Mutex::new(
            Labeler::new(root.to_path_buf(), false).with_deriver(Box::new(derive)),
        ))
    }

    /// Encodes the collector through a registry, as a scrape does.
    fn encode(c: CpuCollector) -> (String, CpuCollector) {
        #[derive(Debug)]
        struct View(Arc<Mutex<CpuCollector>>);
        impl prometheus_client::collector::Collector for View {
            fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
                Collector::encode(&*self.0.lock().unwrap(), &mut e)
            }
        }
        let shared = Arc::new(Mutex::new(c));
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(View(shared.clone())));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        drop(registry);
        let c = Arc::try_unwrap(shared).unwrap().into_inner().unwrap();
        (out, c)
    }

    #[test]
    fn collector_reports_intervals_and_cgroups() {
        let dir = tempfile::tempdir().unwrap();
        let stat = dir.path().join("stat");
        let cg = dir.path().join("cg");
        std::fs::create_dir_all(cg.join("a/x")).unwrap();
        std::fs::create_dir_all(cg.join("b")).unwrap();
        let write_cpu_stat = |p: &Path, user: u64, system: u64| {
            std::fs::write(
                p.join("cpu.stat"),
                format!(
                    "usage_usec {}\nuser_usec {user}\nsystem_usec {system}\n",
                    user + system
                ),
            )
            .unwrap()
        };
        write_cpu_stat(&cg, 9_000_000, 1_000_000);
        write_cpu_stat(&cg.join("a"), 2_500_000, 500_000);
        write_cpu_stat(&cg.join("a/x"), 1_000_000, 0);
        write_cpu_stat(&cg.join("b"), 4_000_000, 250_000);
        std::fs::write(&stat, STAT_A).unwrap();
        let mut c =
            CpuCollector::with_paths(stat.clone(), Some(cg.clone()), 3, labeler(&cg)).unwrap();
        c.refresh().unwrap();
        // Since boot at first: cpu0 user = 32780 / 141169.
        let total0: u64 = [32780u64, 0, 10243, 95460, 632, 0, 33, 21].iter().sum();
        assert!((c.ratios[&0][0] - 32780.0 / total0 as f64).abs() < 1e-12);
        std::fs::write(&stat, STAT_B).unwrap();
        c.refresh().unwrap();
        assert_eq!(c.ratios[&0][0], 1.0);
        assert_eq!(c.ratios[&1][3], 0.6);
        // cpu3 had no tick in between: it keeps its since-boot values.
        assert_eq!(c.ratios[&3][0], 1.0 / 36.0);

        // Breadth first in name order with a cap of 3: /, /a, /b read; /a/x skipped.
        let cgs = c.cgroups.as_ref().unwrap();
        let paths: Vec<&str> = cgs.read.values().map(|c| &*c.labels.path).collect();
        let mut sorted = paths.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, ["/", "/a", "/b"]);
        assert_eq!(cgs.skipped, 1);
        let b = cgs.read.values().find(|c| &*c.labels.path == "/b").unwrap();
        assert_eq!(b.stat.user_usec, 4_000_000);
        assert_eq!(b.stat.system_usec, 250_000);
        let (text, mut c) = encode(c);
        for line in [
            "sysscope_cpu_utilization_ratio{cpu=\"1\",mode=\"idle\"} 0.6",
            "sysscope_cpu_utilization_ratio{cpu=\"0\",mode=\"user\"} 1.0",
            "sysscope_cgroup_cpu_seconds_total{cgroup=\"/b\",pod_uid=\"uid-b\",mode=\"user\"} 4.0",
            "sysscope_cgroup_cpu_seconds_total{cgroup=\"/b\",pod_uid=\"uid-b\",mode=\"system\"} 0.25",
            "sysscope_cgroup_cpu_seconds_total{cgroup=\"/\",mode=\"user\"} 9.0",
            "sysscope_cgroup_cpu_skipped_cgroups 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }

        // A removed cgroup disappears, and the cgroup the cap had left out now fits (without
        // a cgroup.stat in this fake root, every refresh walks). CPU 1 going offline removes
        // its series.
        // (Moved out of the fake root rather than deleted: the fake root's cgroup ids are
        // inode numbers, which the filesystem would hand to the next directory created, `c`
        // below; the kernel's cgroup ids are never reused.)
        std::fs::rename(cg.join("b"), dir.path().join("b-removed")).unwrap();
        std::fs::write(&stat, STAT_B.replace("cpu1 ", "xcpu1 ")).unwrap();
        c.refresh().unwrap();
        let paths = |c: &CpuCollector| {
            let mut p: Vec<String> = c
                .cgroups
                .as_ref()
                .unwrap()
                .read
                .values()
                .map(|c| c.labels.path.to_string())
                .collect();
            p.sort_unstable();
            p
        };
        assert_eq!(paths(&c), ["/", "/a", "/a/x"]);
        assert!(!c.ratios.contains_key(&1));
        assert_eq!(c.cgroups.as_ref().unwrap().skipped, 0);

        // Between walks only known cgroups are read: a new one shows up once the root's
        // cgroup.stat counts it.
        std::fs::write(
            cg.join("cgroup.stat"),
            "nr_descendants 2\nnr_dying_descendants 0\n",
        )
        .unwrap();
        c.refresh().unwrap(); // walks: the count is new
        std::fs::create_dir(cg.join("c")).unwrap();
        write_cpu_stat(&cg.join("c"), 1, 1);
        c.refresh().unwrap();
        assert_eq!(
            paths(&c),
            ["/", "/a", "/a/x"],
            "no walk while the count is unchanged"
        );
        std::fs::write(
            cg.join("cgroup.stat"),
            "nr_descendants 3\nnr_dying_descendants 0\n",
        )
        .unwrap();
        c.refresh().unwrap();
        assert_eq!(paths(&c), ["/", "/a", "/c"], "breadth first, capped at 3");
        assert_eq!(c.cgroups.as_ref().unwrap().skipped, 1);

        // An unreadable /proc/stat fails the refresh (collector down) but keeps the cgroups.
        std::fs::remove_file(&stat).unwrap();
        assert!(c.refresh().is_err());
    }
}
