//! The GPU collector: NVIDIA device gauges like `nvidia-smi dmon`, per-process gauges like
//! `nvidia-smi pmon`, MIG instances, XID and ECC errors, clock event (throttle) reasons,
//! energy and identity, read through NVML ([`crate::sources::nvml`]), which is loaded at run
//! time from `gpu.nvml_library`. No probes and no kernel maps. Metrics: `sysscope_gpu_*`
//! (docs/metrics.md, section GPU).
//!
//! Failures degrade, never spread:
//! - NVML cannot be loaded at start: the collector is registered down and only exports
//!   `sysscope_gpu_devices`, the NVIDIA GPUs on the PCI bus, so alerting can tell a node
//!   without GPUs from a GPU node whose driver is missing ([`pci`]).
//! - NVML loads but does not initialise, or stops answering: the collector is down and
//!   initialises again every [`RETRY_INTERVAL`].
//! - One device is lost (GPU_IS_LOST), has no handle or UUID, or disappears: its series go,
//!   `sysscope_gpu_device_up` of it is 0 and the collector reports down (the other devices'
//!   series stay) until it answers again.
//! - One reading of a device that answers fails otherwise (NoPermission for the process lists
//!   of a GPU in MIG mode, a transient InsufficientSize, Unknown, ...): that reading's series
//!   are absent meanwhile, the failure is logged once and counted
//!   (`sysscope_gpu_nvml_errors_total`), and the device and collector stay up.
//!
//! Per-process series join each pid to its process name and cgroup (the `0::` line of
//! `/proc/<pid>/cgroup`, then the shared labeler), so they carry the same `cgroup` and
//! Kubernetes labels as the syscall series. That line is relative to sysscope's own cgroup
//! namespace (a container's, in the shipped DaemonSets): it is joined to where that namespace's
//! root is in the host hierarchy ([`cgroups::namespace_root`]), found once.
//!
//! `encode.rs` writes the families, the per-device gauges from one table.

mod encode;
pub(crate) mod pci;

use std::{
    collections::{BTreeMap, BTreeSet},
    os::unix::fs::MetadataExt,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use prometheus_client::encoding::DescriptorEncoder;

use super::{Collector, CollectorError};
pub(crate) use crate::sources::nvml::GpuError;
use crate::{
    config::Config,
    metadata::{
        cgroups::{self, UNRESOLVED},
        Labeler, SharedLabeler,
    },
    series::{CgroupLabels, Workload},
    sources::nvml::{
        Connect, DeviceInfo, DeviceReading, DriverInfo, FailedReading, Nvml, NvmlLibrary,
        ProcessReading, ProcessSample, XidKey,
    },
    util::error::Chain,
};

pub(crate) const NAME: &str = "gpu";

/// How often NVML is initialised again while it does not answer.
pub(crate) const RETRY_INTERVAL: Duration = Duration::from_secs(30);

/// Processes per device exported at most; NVML itself lists far fewer. The rest are counted.
pub(crate) const MAX_PROCESSES_PER_DEVICE: usize = 256;

/// How often the PCI bus is counted again.
const PCI_RESCAN_INTERVAL: Duration = Duration::from_secs(60);

/// NVML's clocks event (formerly throttle) reasons, bit and label value (nvml.h
/// `nvmlClocksEventReason*`); bits outside these count as `other`.
pub(crate) const CLOCK_EVENT_REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// Where the collector looks for processes, cgroups and PCI devices.
#[derive(Debug, Clone)]
pub(crate) struct GpuPaths {
    pub(crate) proc_root: PathBuf,
    /// The cgroup v2 mount.
    pub(crate) cgroup_root: PathBuf,
    /// `/sys/bus/pci/devices`.
    pub(crate) pci_devices: PathBuf,
}

impl GpuPaths {
    /// This machine's paths, with the cgroup v2 mount the labeler uses.
    pub(crate) fn system(labeler: &SharedLabeler) -> Self {
        Self {
            proc_root: "/proc".into(),
            cgroup_root: labeler
                .lock()
                .expect("labeler lock")
                .cgroups
                .root()
                .to_path_buf(),
            pci_devices: pci::SYSFS_PCI_DEVICES.into(),
        }
    }
}

#[derive(Debug, Clone)]
struct ProcessSeries {
    workload: Workload,
    /// `None` when the device cannot sample processes (MIG mode, older boards).
    sm: Option<f64>,
    memory: Option<f64>,
    used_bytes: Option<u64>,
    gpu_instance: Option<u32>,
    compute_instance: Option<u32>,
}

#[derive(Debug)]
struct Device {
    index: u32,
    up: bool,
    /// `None` while the device is down: its gauges are not exported.
    reading: Option<DeviceReading>,
    /// The identity last read, kept while the device is down (`sysscope_gpu_info`).
    info: DeviceInfo,
    processes: Vec<ProcessSeries>,
    /// Newest process sample seen, so each refresh asks only for newer ones.
    last_sample_us: u64,
}

pub(crate) struct GpuCollector {
    connect: Connect,
    nvml: Option<Box<dyn Nvml>>,
    /// What the connected driver says about itself.
    driver: DriverInfo,
    /// Why NVML is not connected, while it is not.
    connect_error: Option<GpuError>,
    last_connect: Instant,
    retry: Duration,
    /// By UUID: NVML indices can shift when a device disappears.
    devices: BTreeMap<String, Device>,
    /// Indices that failed before their UUID was ever read (logged once each).
    failing_indices: BTreeSet<u32>,
    /// XID errors counted since start, by device and code (across NVML initialisations).
    xids: BTreeMap<XidKey, u64>,
    /// Readings that failed on devices that answered, by (device UUID, NVML call, error).
    failed_readings: BTreeMap<(String, &'static str, &'static str), u64>,
    labeler: SharedLabeler,
    paths: GpuPaths,
    pci_devices: u64,
    pci_counted: Instant,
    dropped_processes: u64,
    /// Where this process's cgroup namespace is rooted in the host hierarchy, once found.
    cgroup_namespace: Option<Arc<str>>,
    /// When finding it last failed (tried again after [`RETRY_INTERVAL`], logged once).
    cgroup_namespace_failed: Option<Instant>,
}

impl std::fmt::Debug for GpuCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuCollector")
            .field("connected", &self.nvml.is_some())
            .field("devices", &self.devices.len())
            .field("pci_devices", &self.pci_devices)
            .finish_non_exhaustive()
    }
}

impl GpuCollector {
    /// The collector over the NVML library of `config.gpu.nvml_library`. Check
    /// [`Self::connect_error`]: a missing library means the collector should be registered
    /// down ([`crate::agent::Agent::add_failed_with`]).
    pub(crate) fn start(config: &Config, labeler: SharedLabeler) -> Self {
        let library = config.gpu.nvml_library.clone();
        let connect: Connect = Box::new(move || {
            NvmlLibrary::connect(&library).map(|n| Box::new(n.watch_xid_errors()) as Box<dyn Nvml>)
        });
        let paths = GpuPaths::system(&labeler);
        Self::new(connect, labeler, paths)
    }

    /// A collector that connects through `connect` now and, while that fails, again on a
    /// refresh at most every [`RETRY_INTERVAL`].
    pub(crate) fn new(mut connect: Connect, labeler: SharedLabeler, paths: GpuPaths) -> Self {
        let (nvml, connect_error, driver) = match connect() {
            Ok(mut n) => {
                let driver = n.driver();
                (Some(n), None, driver)
            }
            Err(e) => (None, Some(e), DriverInfo::default()),
        };
        Self {
            connect,
            nvml,
            driver,
            connect_error,
            last_connect: Instant::now(),
            retry: RETRY_INTERVAL,
            devices: BTreeMap::new(),
            failing_indices: BTreeSet::new(),
            xids: BTreeMap::new(),
            failed_readings: BTreeMap::new(),
            labeler,
            pci_devices: pci::count_nvidia_gpus(&paths.pci_devices),
            pci_counted: Instant::now(),
            paths,
            dropped_processes: 0,
            cgroup_namespace: None,
            cgroup_namespace_failed: None,
        }
    }

    /// How long to wait before initialising NVML again (tests shorten it).
    #[cfg(test)]
    pub(crate) fn with_retry_interval(mut self, retry: Duration) -> Self {
        self.retry = retry;
        self
    }

    /// Why NVML is not connected, while it is not.
    pub(crate) fn connect_error(&self) -> Option<&GpuError> {
        self.connect_error.as_ref()
    }

    /// NVIDIA GPUs on the PCI bus (sysfs), whether or not NVML answers.
    pub(crate) fn pci_devices(&self) -> u64 {
        self.pci_devices
    }

    fn ensure_connected(&mut self) -> Result<(), CollectorError> {
        if self.nvml.is_some() {
            return Ok(());
        }
        if self.last_connect.elapsed() >= self.retry {
            self.last_connect = Instant::now();
            match (self.connect)() {
                Ok(mut n) => {
                    tracing::info!(collector = NAME, "NVML initialised");
                    self.driver = n.driver();
                    self.nvml = Some(n);
                    self.connect_error = None;
                    return Ok(());
                }
                Err(e) => self.connect_error = Some(e),
            }
        }
        Err(CollectorError::Other(match &self.connect_error {
            Some(e) => Chain(e).to_string(),
            None => "NVML is not initialised".into(),
        }))
    }

    /// Adds the XID errors counted since the previous refresh.
    fn take_xids(&mut self) {
        let Some(nvml) = self.nvml.as_mut() else {
            return;
        };
        for (key, n) in nvml.take_xid_errors() {
            *self.xids.entry(key).or_insert(0) += n;
        }
    }

    fn set_down(device: &mut Device, uuid: &str, why: &str) {
        if device.up {
            tracing::warn!(
                collector = NAME,
                gpu = device.index,
                uuid,
                error = why,
                "GPU unavailable; its series are withdrawn until it answers again"
            );
        }
        device.up = false;
        device.reading = None;
        device.processes.clear();
    }

    /// Reads device `index` and its processes; returns its UUID.
    fn read_device(&mut self, index: u32) -> Result<String, GpuError> {
        let nvml = self.nvml.as_mut().expect("connected");
        let reading = nvml.device(index)?;
        let uuid = reading.uuid.clone();
        let since = self.devices.get(&uuid).map_or(0, |d| d.last_sample_us);
        let procs = match nvml.processes(index, since) {
            Ok(p) => p,
            Err(e) => {
                if let Some(d) = self.devices.get_mut(&uuid) {
                    d.index = index;
                    Self::set_down(d, &uuid, &Chain(&e).to_string());
                }
                return Err(e);
            }
        };
        self.count_failed(index, &uuid, reading.failed.iter().chain(&procs.failed));
        // A process that exited while NVML still lists it keeps the labels it had.
        let previous: BTreeMap<u32, Workload> = self
            .devices
            .get(&uuid)
            .into_iter()
            .flat_map(|d| &d.processes)
            .filter_map(|p| Some((p.workload.pid?, p.workload.clone())))
            .collect();
        let processes = self.join_processes(&procs, &previous);
        let device = self.devices.entry(uuid.clone()).or_insert_with(|| Device {
            index,
            up: false,
            reading: None,
            info: DeviceInfo::default(),
            processes: Vec::new(),
            last_sample_us: 0,
        });
        if !device.up {
            tracing::info!(collector = NAME, gpu = index, uuid = %uuid, "GPU answering");
        }
        device.index = index;
        device.up = true;
        device.info = reading.info.clone();
        device.reading = Some(reading);
        device.last_sample_us = procs
            .samples
            .iter()
            .flatten()
            .map(|s| s.timestamp_us)
            .fold(since, u64::max);
        device.processes = processes;
        self.failing_indices.remove(&index);
        Ok(uuid)
    }

    /// Counts readings that failed on a device that answered; each kind is logged once.
    fn count_failed<'a>(
        &mut self,
        index: u32,
        uuid: &str,
        failed: impl Iterator<Item = &'a FailedReading>,
    ) {
        for f in failed {
            let n = self
                .failed_readings
                .entry((uuid.to_string(), f.call, f.error))
                .or_insert(0);
            if *n == 0 {
                tracing::warn!(collector = NAME, gpu = index, uuid, call = f.call, error = %f.detail, "GPU reading failed; its series are left out while it fails (sysscope_gpu_nvml_errors_total counts it)");
            }
            *n += 1;
        }
    }

    /// Where this process's cgroup namespace is rooted in the host hierarchy: found once, and
    /// while it cannot be, tried again every [`RETRY_INTERVAL`] (the first failure logged).
    fn cgroup_namespace(&mut self, labeler: &mut Labeler) -> Option<Arc<str>> {
        if self.cgroup_namespace.is_some() {
            return self.cgroup_namespace.clone();
        }
        if self
            .cgroup_namespace_failed
            .is_some_and(|at| at.elapsed() < RETRY_INTERVAL)
        {
            return None;
        }
        let proc_self = self.paths.proc_root.join("self");
        match cgroups::namespace_root(&mut labeler.cgroups, &proc_self) {
            Ok(root) => {
                if &*root != "/" {
                    tracing::info!(collector = NAME, root = %root, "in a cgroup namespace: GPU processes' cgroups are read relative to its root");
                }
                self.cgroup_namespace = Some(root);
            }
            Err(e) => {
                if self.cgroup_namespace_failed.is_none() {
                    tracing::warn!(collector = NAME, error = %Chain(&e), "cannot place this process's cgroup namespace in the host hierarchy: GPU processes outside it are labelled cgroup=\"(unresolved)\"");
                }
                self.cgroup_namespace_failed = Some(Instant::now());
            }
        }
        self.cgroup_namespace.clone()
    }

    /// One series per process: the newest sample of each (0 without one: NVML lists only
    /// processes that used the device; absent when the device cannot sample processes) and
    /// the memory it holds. A process whose `/proc` entry is gone keeps its cgroup and name
    /// from `previous` (its series continue unchanged until NVML stops listing it).
    fn join_processes(
        &mut self,
        procs: &ProcessReading,
        previous: &BTreeMap<u32, Workload>,
    ) -> Vec<ProcessSeries> {
        #[derive(Default)]
        struct Seen {
            sample: Option<ProcessSample>,
            used_bytes: Option<u64>,
            gpu_instance: Option<u32>,
            compute_instance: Option<u32>,
        }
        let mut by_pid: BTreeMap<u32, Seen> = BTreeMap::new();
        for s in procs.samples.iter().flatten() {
            let slot = &mut by_pid.entry(s.pid).or_default().sample;
            if slot.is_none_or(|old| s.timestamp_us >= old.timestamp_us) {
                *slot = Some(*s);
            }
        }
        for m in &procs.memory {
            let seen = by_pid.entry(m.pid).or_default();
            // A process with compute and graphics contexts is listed twice with one figure.
            if let Some(bytes) = m.used_bytes {
                seen.used_bytes = Some(seen.used_bytes.map_or(bytes, |b| b.max(bytes)));
            }
            seen.gpu_instance = seen.gpu_instance.or(m.gpu_instance);
            seen.compute_instance = seen.compute_instance.or(m.compute_instance);
        }
        if by_pid.len() > MAX_PROCESSES_PER_DEVICE {
            self.dropped_processes += (by_pid.len() - MAX_PROCESSES_PER_DEVICE) as u64;
        }
        let sampled = procs.samples.is_some();
        let shared = self.labeler.clone();
        let mut labeler = shared.lock().expect("labeler lock");
        let namespace = if by_pid.is_empty() {
            None
        } else {
            self.cgroup_namespace(&mut labeler)
        };
        by_pid
            .into_iter()
            .take(MAX_PROCESSES_PER_DEVICE)
            .map(|(pid, seen)| {
                let workload = match read_proc_cgroup(&self.paths.proc_root, pid) {
                    Some(path) => {
                        let host = match &namespace {
                            Some(root) => cgroups::join_namespace_path(root, &path),
                            // Where is unknown: right unless the path leads out of the
                            // namespace (without one, it never does).
                            None => (!path.split('/').any(|c| c == "..")).then_some(path),
                        };
                        let cgroup = match host {
                            Some(host) => {
                                let dir = self.paths.cgroup_root.join(host.trim_start_matches('/'));
                                match std::fs::metadata(&dir) {
                                    Ok(meta) => labeler.cgroup_at(meta.ino(), &host),
                                    // Removed since the process was read.
                                    Err(_) => Arc::new(CgroupLabels::plain(host)),
                                }
                            }
                            None => Arc::new(CgroupLabels::plain(UNRESOLVED)),
                        };
                        Workload {
                            cgroup,
                            comm: labeler.comms.resolve(pid),
                            pid: Some(pid),
                        }
                    }
                    None => previous.get(&pid).cloned().unwrap_or_else(|| Workload {
                        cgroup: Arc::new(CgroupLabels::plain(UNRESOLVED)),
                        comm: labeler.comms.resolve(pid),
                        pid: Some(pid),
                    }),
                };
                let ratio = |pick: fn(&ProcessSample) -> u32| {
                    sampled.then(|| seen.sample.as_ref().map_or(0.0, |s| pick(s) as f64 / 100.0))
                };
                ProcessSeries {
                    workload,
                    sm: ratio(|s| s.sm_percent),
                    memory: ratio(|s| s.memory_percent),
                    used_bytes: seen.used_bytes,
                    gpu_instance: seen.gpu_instance,
                    compute_instance: seen.compute_instance,
                }
            })
            .collect()
    }
}

/// The cgroup v2 path of `pid` (the `0::` line of `/proc/<pid>/cgroup`, relative to this
/// process's cgroup namespace), if it still runs.
pub(crate) fn read_proc_cgroup(proc_root: &std::path::Path, pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    cgroups::parse_proc_cgroup(&text)
}

impl Collector for GpuCollector {
    fn name(&self) -> &'static str {
        NAME
    }

    fn refresh(&mut self) -> Result<(), CollectorError> {
        if self.pci_counted.elapsed() >= PCI_RESCAN_INTERVAL {
            self.pci_devices = pci::count_nvidia_gpus(&self.paths.pci_devices);
            self.pci_counted = Instant::now();
        }
        if let Err(e) = self.ensure_connected() {
            for (uuid, d) in &mut self.devices {
                Self::set_down(d, uuid, "NVML is not initialised");
            }
            return Err(e);
        }
        self.take_xids();
        let count = match self.nvml.as_mut().expect("connected").device_count() {
            Ok(n) => n,
            Err(e) => {
                // NVML itself stopped answering (driver unloaded or reset): initialise again.
                self.take_xids();
                self.nvml = None;
                self.last_connect = Instant::now();
                let why = Chain(&e).to_string();
                self.connect_error = Some(e);
                for (uuid, d) in &mut self.devices {
                    Self::set_down(d, uuid, &why);
                }
                return Err(CollectorError::Other(format!("NVML: {why}")));
            }
        };
        let mut seen = BTreeSet::new();
        let mut problems = Vec::new();
        for index in 0..count {
            match self.read_device(index) {
                Ok(uuid) => {
                    seen.insert(uuid);
                }
                Err(e) => {
                    let why = Chain(&e).to_string();
                    let known = self
                        .devices
                        .iter_mut()
                        .find(|(uuid, d)| d.index == index && !seen.contains(*uuid));
                    match known {
                        Some((uuid, d)) => Self::set_down(d, uuid, &why),
                        None => {
                            if self.failing_indices.insert(index) {
                                tracing::warn!(collector = NAME, gpu = index, error = %why, "GPU does not answer");
                            }
                        }
                    }
                    problems.push(format!("gpu {index}: {why}"));
                }
            }
        }
        self.failing_indices.retain(|i| *i < count);
        for (uuid, d) in &mut self.devices {
            if !seen.contains(uuid) {
                if d.up {
                    problems.push(format!(
                        "gpu {} ({uuid}): no longer listed by NVML",
                        d.index
                    ));
                }
                Self::set_down(d, uuid, "no longer listed by NVML");
            }
        }
        let down: Vec<String> = self
            .devices
            .iter()
            .filter(|(_, d)| !d.up)
            .map(|(uuid, d)| format!("gpu {} ({uuid})", d.index))
            .collect();
        if problems.is_empty() && down.is_empty() {
            Ok(())
        } else if problems.is_empty() {
            Err(CollectorError::Other(format!(
                "GPUs not answering: {}",
                down.join(", ")
            )))
        } else {
            Err(CollectorError::Other(problems.join("; ")))
        }
    }

    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        self.encode_families(encoder)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{
        metadata::{processes::CommResolver, Labeler},
        sources::nvml::{
            fake::{FakeDevice, FakeFailure, FakeNvml},
            EccCounts, FailedReading, MigReading, ProcessMemory,
        },
    };

    /// A machine of its own: `proc/<pid>/{cgroup,comm}` and a cgroup v2 root in a temporary
    /// directory, so the per-process join runs without touching the host's processes.
    struct Node {
        dir: tempfile::TempDir,
    }

    impl Node {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("proc")).unwrap();
            std::fs::create_dir_all(dir.path().join("cgroup")).unwrap();
            Self { dir }
        }

        fn process(&self, pid: u32, comm: &str, cgroup: &str) {
            let p = self.dir.path().join("proc").join(pid.to_string());
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
            std::fs::write(p.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
            let cg = self
                .dir
                .path()
                .join("cgroup")
                .join(cgroup.trim_start_matches('/'));
            std::fs::create_dir_all(cg).unwrap();
        }

        fn collector(&self, fake: &FakeNvml) -> Shared {
            let root = |d: &str| self.dir.path().join(d);
            let mut labeler = Labeler::new(root("cgroup"), false);
            labeler.comms = CommResolver::new(root("proc"), Duration::from_secs(5));
            let paths = GpuPaths {
                proc_root: root("proc"),
                cgroup_root: root("cgroup"),
                pci_devices: root("pci"),
            };
            Shared(Arc::new(Mutex::new(
                GpuCollector::new(fake.connector(), Arc::new(Mutex::new(labeler)), paths)
                    .with_retry_interval(Duration::ZERO),
            )))
        }
    }

    fn reading(uuid: &str) -> DeviceReading {
        DeviceReading {
            uuid: uuid.into(),
            gpu_utilization_percent: Some(50),
            memory_utilization_percent: Some(10),
            ..DeviceReading::default()
        }
    }

    /// A fake NVML with two healthy devices, GPU-a (index 0) and GPU-b (index 1).
    fn two_devices() -> FakeNvml {
        let fake = FakeNvml::new();
        fake.with(|s| {
            for u in ["GPU-a", "GPU-b"] {
                s.devices.push(FakeDevice {
                    reading: reading(u),
                    ..FakeDevice::default()
                });
            }
        });
        fake
    }

    fn sample(pid: u32, timestamp_us: u64, sm_percent: u32) -> ProcessSample {
        ProcessSample {
            pid,
            timestamp_us,
            sm_percent,
            memory_percent: sm_percent / 2,
        }
    }

    fn memory(pid: u32, used: u64) -> ProcessMemory {
        ProcessMemory {
            pid,
            used_bytes: Some(used),
            ..ProcessMemory::default()
        }
    }

    /// A collector shared with the registry that encodes it, as a scrape does.
    #[derive(Debug, Clone)]
    struct Shared(Arc<Mutex<GpuCollector>>);

    impl prometheus_client::collector::Collector for Shared {
        fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
            Collector::encode(&*self.0.lock().unwrap(), &mut e)
        }
    }

    impl Shared {
        fn refresh(&self) -> Result<(), CollectorError> {
            self.0.lock().unwrap().refresh()
        }
    }

    /// The collector's text exposition.
    fn text(c: &Shared) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(c.clone()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    /// The value of the one line of `text` that starts with `series`.
    fn value(text: &str, series: &str) -> Option<f64> {
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(series)).collect();
        assert!(lines.len() <= 1, "{series}: {lines:?}");
        lines
            .first()
            .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
    }

    #[test]
    fn a_refresh_asks_only_for_newer_samples_and_an_idle_process_reads_zero() {
        let node = Node::new();
        node.process(41, "python", "/train");
        let fake = FakeNvml::new();
        fake.with(|s| {
            s.devices.push(FakeDevice {
                reading: reading("GPU-a"),
                samples: Some(vec![sample(41, 1_000, 30), sample(41, 2_000, 45)]),
                memory: vec![memory(41, 1 << 30)],
                ..FakeDevice::default()
            })
        });
        let c = node.collector(&fake);
        c.refresh().unwrap();
        let sm = "sysscope_gpu_process_sm_utilization_ratio{gpu=\"0\",uuid=\"GPU-a\",cgroup=\"/train\",comm=\"python\",pid=\"41\"}";
        // The newest of the two samples.
        assert_eq!(value(&text(&c), sm), Some(0.45));
        c.refresh().unwrap();
        assert_eq!(fake.with(|s| s.last_since.clone()), [(0, 0), (0, 2_000)]);
        // No sample since: the process was idle.
        assert_eq!(value(&text(&c), sm), Some(0.0));
        fake.with(|s| {
            s.devices[0]
                .samples
                .as_mut()
                .unwrap()
                .push(sample(41, 3_000, 80))
        });
        c.refresh().unwrap();
        assert_eq!(value(&text(&c), sm), Some(0.8));
    }

    #[test]
    fn one_series_per_process_whatever_its_contexts_and_exited_ones_are_labelled_so() {
        let node = Node::new();
        node.process(41, "python", "/train");
        let gone = 4_194_304 + 17;
        let fake = FakeNvml::new();
        fake.with(|s| {
            s.devices.push(FakeDevice {
                reading: reading("GPU-a"),
                samples: Some(Vec::new()),
                // Listed with its compute and its graphics context.
                memory: vec![
                    memory(41, 1 << 30),
                    memory(41, 1 << 30),
                    memory(gone, 256 << 20),
                ],
                ..FakeDevice::default()
            })
        });
        let c = node.collector(&fake);
        c.refresh().unwrap();
        let t = text(&c);
        let used: Vec<&str> = t
            .lines()
            .filter(|l| l.starts_with("sysscope_gpu_process_memory_used_bytes{"))
            .collect();
        assert_eq!(used.len(), 2, "{used:?}");
        let g = gone.to_string();
        assert_eq!(
            value(&t, &format!("sysscope_gpu_process_memory_used_bytes{{gpu=\"0\",uuid=\"GPU-a\",cgroup=\"(unresolved)\",comm=\"(exited)\",pid=\"{g}\"}}")),
            Some((256u64 << 20) as f64)
        );
    }

    #[test]
    fn a_device_that_cannot_sample_processes_exports_no_process_utilization() {
        let node = Node::new();
        node.process(41, "python", "/train");
        let fake = FakeNvml::new();
        fake.with(|s| {
            let mut r = reading("GPU-a");
            r.gpu_utilization_percent = None;
            r.memory_utilization_percent = None;
            r.mig = Some(MigReading {
                enabled: true,
                instances: Vec::new(),
            });
            s.devices.push(FakeDevice {
                reading: r,
                samples: None,
                memory: vec![ProcessMemory {
                    gpu_instance: Some(1),
                    compute_instance: Some(0),
                    ..memory(41, 1 << 30)
                }],
                ..FakeDevice::default()
            })
        });
        let c = node.collector(&fake);
        c.refresh().unwrap();
        let t = text(&c);
        assert!(
            !t.contains("sysscope_gpu_process_sm_utilization_ratio{"),
            "{t}"
        );
        assert!(!t.contains("sysscope_gpu_utilization_ratio{"), "{t}");
        assert_eq!(
            value(&t, "sysscope_gpu_process_memory_used_bytes{gpu=\"0\",uuid=\"GPU-a\",gpu_instance=\"1\",compute_instance=\"0\",cgroup=\"/train\",comm=\"python\",pid=\"41\"}"),
            Some((1u64 << 30) as f64)
        );
    }

    #[test]
    fn devices_keep_their_series_by_uuid_when_indices_shift() {
        let node = Node::new();
        let fake = two_devices();
        let c = node.collector(&fake);
        c.refresh().unwrap();
        let removed = fake.with(|s| s.devices.remove(0));
        assert!(c.refresh().is_err());
        let t = text(&c);
        assert_eq!(
            value(&t, "sysscope_gpu_device_up{gpu=\"0\",uuid=\"GPU-b\"}"),
            Some(1.0)
        );
        assert_eq!(
            value(&t, "sysscope_gpu_device_up{gpu=\"0\",uuid=\"GPU-a\"}"),
            Some(0.0)
        );
        assert!(
            !t.contains("sysscope_gpu_utilization_ratio{gpu=\"0\",uuid=\"GPU-a\""),
            "{t}"
        );
        fake.with(|s| s.devices.insert(0, removed));
        c.refresh().unwrap();
        let t = text(&c);
        assert_eq!(
            value(&t, "sysscope_gpu_device_up{gpu=\"1\",uuid=\"GPU-b\"}"),
            Some(1.0)
        );
    }

    #[test]
    fn a_failing_device_goes_down_alone_and_comes_back() {
        let node = Node::new();
        let fake = two_devices();
        let c = node.collector(&fake);
        c.refresh().unwrap();
        let util = |t: &str, g: &str, u: &str| {
            value(
                t,
                &format!("sysscope_gpu_utilization_ratio{{gpu=\"{g}\",uuid=\"{u}\"}}"),
            )
        };
        fake.with(|s| s.devices[1].failure = Some(FakeFailure::GpuLost));
        let e = c.refresh().unwrap_err().to_string();
        assert!(e.contains("gpu 1"), "{e}");
        let t = text(&c);
        assert_eq!(util(&t, "0", "GPU-a"), Some(0.5));
        assert_eq!(util(&t, "1", "GPU-b"), None);
        assert_eq!(
            value(&t, "sysscope_gpu_device_up{gpu=\"1\",uuid=\"GPU-b\"}"),
            Some(0.0)
        );
        // Still down while it fails, and without a new error: the reason names it.
        let e = c.refresh().unwrap_err().to_string();
        assert!(e.contains("gpu 1"), "{e}");
        // Lost while its processes are read.
        fake.with(|s| {
            s.devices[1].failure = None;
            s.devices[0].process_failure = Some(FakeFailure::GpuLost);
        });
        assert!(c.refresh().is_err());
        let t = text(&c);
        assert_eq!(util(&t, "0", "GPU-a"), None);
        assert_eq!(util(&t, "1", "GPU-b"), Some(0.5));
        fake.with(|s| s.devices[0].process_failure = None);
        c.refresh().unwrap();
        let t = text(&c);
        assert_eq!(util(&t, "0", "GPU-a"), Some(0.5));
        assert_eq!(
            value(&t, "sysscope_gpu_device_up{gpu=\"1\",uuid=\"GPU-b\"}"),
            Some(1.0)
        );
    }

    /// A reading that fails on a device that answers (NVML refusing an unprivileged caller the
    /// process lists of a GPU in MIG mode, a MIG instance that cannot be read) loses its own
    /// series only: the device, its other series and the collector stay up, and the failure
    /// is counted by call and error, and logged once.
    #[test]
    fn a_failed_reading_drops_its_series_not_the_device() {
        let node = Node::new();
        node.process(41, "python", "/train");
        let fake = FakeNvml::new();
        fake.with(|s| {
            let mut r = reading("GPU-a");
            r.power_milliwatts = Some(250_000);
            s.devices.push(FakeDevice {
                reading: r,
                samples: Some(vec![sample(41, 1_000, 30)]),
                memory: vec![memory(41, 1 << 30)],
                ..FakeDevice::default()
            })
        });
        let c = node.collector(&fake);
        c.refresh().unwrap();
        let mem = "sysscope_gpu_process_memory_used_bytes{gpu=\"0\",uuid=\"GPU-a\",cgroup=\"/train\",comm=\"python\",pid=\"41\"}";
        assert_eq!(value(&text(&c), mem), Some((1u64 << 30) as f64));
        let errors = |t: &str, call: &str, error: &str| {
            value(
                t,
                &format!("sysscope_gpu_nvml_errors_total{{gpu=\"0\",uuid=\"GPU-a\",call=\"{call}\",error=\"{error}\"}}"),
            )
        };
        fake.with(|s| {
            s.devices[0].process_failure = Some(FakeFailure::NoPermission);
            s.devices[0].reading.failed = vec![FailedReading {
                call: "nvmlDeviceGetMigDeviceHandleByIndex",
                error: "unknown",
                detail: "an unknown error occurred".into(),
            }];
        });
        for refresh in 1..=2 {
            c.refresh().unwrap();
            let t = text(&c);
            assert_eq!(value(&t, mem), None, "{t}");
            assert_eq!(
                value(&t, "sysscope_gpu_device_up{gpu=\"0\",uuid=\"GPU-a\"}"),
                Some(1.0)
            );
            assert_eq!(
                value(&t, "sysscope_gpu_power_watts{gpu=\"0\",uuid=\"GPU-a\"}"),
                Some(250.0)
            );
            assert_eq!(
                errors(
                    &t,
                    "nvmlDeviceGetComputeRunningProcesses_v3",
                    "no_permission"
                ),
                Some(refresh as f64),
                "{t}"
            );
            assert_eq!(
                errors(&t, "nvmlDeviceGetMigDeviceHandleByIndex", "unknown"),
                Some(refresh as f64)
            );
        }
        fake.with(|s| {
            s.devices[0].process_failure = None;
            s.devices[0].reading.failed.clear();
        });
        c.refresh().unwrap();
        let t = text(&c);
        assert_eq!(value(&t, mem), Some((1u64 << 30) as f64));
        assert_eq!(
            errors(
                &t,
                "nvmlDeviceGetComputeRunningProcesses_v3",
                "no_permission"
            ),
            Some(2.0)
        );
    }

    #[test]
    fn nvml_that_does_not_initialise_is_retried_and_xid_counts_survive_it() {
        let node = Node::new();
        let fake = FakeNvml::new();
        fake.with(|s| {
            s.connect_failure = Some(Some(FakeFailure::DriverNotLoaded));
            s.devices.push(FakeDevice {
                reading: reading("GPU-a"),
                ..FakeDevice::default()
            });
        });
        let c = node.collector(&fake);
        // The cause (the driver) is in the error's chain, as every log line and reason shows it.
        let why = Chain(c.0.lock().unwrap().connect_error().unwrap()).to_string();
        assert!(why.contains("driver"), "{why}");
        assert!(c.refresh().is_err());
        fake.with(|s| {
            s.connect_failure = None;
            s.xids.push((
                XidKey {
                    uuid: "GPU-a".into(),
                    xid: Some(79),
                },
                1,
            ));
        });
        c.refresh().unwrap();
        let xid79 = "sysscope_gpu_xid_errors_total{gpu=\"0\",uuid=\"GPU-a\",xid=\"79\"}";
        assert_eq!(value(&text(&c), xid79), Some(1.0));
        // NVML stops answering; what its event thread counted before is kept, and the count
        // goes on after it is initialised again.
        fake.with(|s| {
            s.count_failure = Some(FakeFailure::DriverNotLoaded);
            s.xids.push((
                XidKey {
                    uuid: "GPU-a".into(),
                    xid: Some(79),
                },
                2,
            ));
        });
        assert!(c.refresh().is_err());
        assert_eq!(value(&text(&c), xid79), Some(3.0));
        fake.with(|s| s.count_failure = None);
        c.refresh().unwrap();
        assert_eq!(value(&text(&c), xid79), Some(3.0));
        assert_eq!(fake.with(|s| s.connects), 2);
    }

    #[test]
    fn identity_energy_ecc_and_clock_event_reasons_are_encoded() {
        let node = Node::new();
        let fake = FakeNvml::new();
        fake.with(|s| {
            s.driver = DriverInfo {
                driver_version: Some("550.54.15".into()),
                cuda_version: Some("12.4".into()),
                nvml_library: None,
            };
            let mut r = reading("GPU-a");
            r.info = DeviceInfo {
                model: Some("NVIDIA H100 80GB HBM3".into()),
                serial: None,
                pci_bus_id: Some("00000000:3B:00.0".into()),
            };
            r.energy_millijoules = Some(1_234_567);
            r.ecc = Some(EccCounts {
                corrected: 3,
                uncorrected: 1,
            });
            // sw_power_cap, hw_thermal_slowdown and a bit NVML may add later.
            r.clocks_event_reasons = Some(0x4 | 0x40 | 0x10000);
            s.devices.push(FakeDevice {
                reading: r,
                ..FakeDevice::default()
            });
        });
        let c = node.collector(&fake);
        c.refresh().unwrap();
        let t = text(&c);
        let g = "gpu=\"0\",uuid=\"GPU-a\"";
        assert_eq!(
            value(&t, &format!("sysscope_gpu_info{{{g},model=\"NVIDIA H100 80GB HBM3\",driver_version=\"550.54.15\",cuda_version=\"12.4\",pci_bus_id=\"00000000:3B:00.0\"}}")),
            Some(1.0),
            "{t}"
        );
        assert_eq!(
            value(&t, &format!("sysscope_gpu_energy_joules_total{{{g}}}")),
            Some(1234.567)
        );
        assert_eq!(
            value(
                &t,
                &format!("sysscope_gpu_ecc_errors_total{{{g},error=\"corrected\"}}")
            ),
            Some(3.0)
        );
        assert_eq!(
            value(
                &t,
                &format!("sysscope_gpu_ecc_errors_total{{{g},error=\"uncorrected\"}}")
            ),
            Some(1.0)
        );
        let reason = |r: &str| {
            value(
                &t,
                &format!("sysscope_gpu_clock_event_reason_active{{{g},reason=\"{r}\"}}"),
            )
        };
        assert_eq!(reason("sw_power_cap"), Some(1.0));
        assert_eq!(reason("hw_thermal_slowdown"), Some(1.0));
        assert_eq!(reason("other"), Some(1.0));
        assert_eq!(reason("gpu_idle"), Some(0.0));
        assert_eq!(reason("hw_slowdown"), Some(0.0));
        assert_eq!(
            t.lines()
                .filter(|l| l.starts_with("sysscope_gpu_clock_event_reason_active{"))
                .count(),
            CLOCK_EVENT_REASONS.len() + 1
        );
        assert_eq!(
            value(&t, &format!("sysscope_gpu_utilization_ratio{{{g}}}")),
            Some(0.5)
        );
    }

    /// Inside a cgroup namespace (the agent's container), `/proc/<pid>/cgroup` of another
    /// pod's process goes up from the namespace's root: the series carry the cgroup's host
    /// path, as the syscall series do, not `/../..`.
    #[test]
    fn processes_seen_from_a_cgroup_namespace_get_their_host_cgroup() {
        let node = Node::new();
        let root = |d: &str| node.dir.path().join(d);
        // The agent (pid 7) in a namespace rooted at its container's cgroup, whose runtime
        // mounted the namespace's view of cgroup2 (mountinfo root "/"); the host's hierarchy
        // is the one the labeler walks.
        let agent = "/kubepods/besteffort/poda/ca";
        node.process(7, "sysscope", agent);
        std::fs::write(root("proc/7/cgroup"), "0::/\n").unwrap();
        let own_mount = root("cgroup").join(agent.trim_start_matches('/'));
        std::fs::write(
            root("proc/7/mountinfo"),
            format!(
                "1290 1280 0:30 / {} ro - cgroup2 cgroup rw\n1300 1280 0:30 /../../../.. /host rw - cgroup2 cgroup2 rw\n",
                own_mount.display()
            ),
        )
        .unwrap();
        std::os::unix::fs::symlink("7", root("proc/self")).unwrap();
        node.process(41, "python", "/kubepods/burstable/podb/cb");
        std::fs::write(root("proc/41/cgroup"), "0::/../../../burstable/podb/cb\n").unwrap();
        // Leads above the hierarchy: nothing to name it by.
        node.process(42, "python", "/elsewhere");
        std::fs::write(root("proc/42/cgroup"), "0::/../../../../../x\n").unwrap();
        let fake = FakeNvml::new();
        fake.with(|s| {
            s.devices.push(FakeDevice {
                reading: reading("GPU-a"),
                samples: Some(Vec::new()),
                memory: vec![memory(41, 1 << 30), memory(42, 1 << 20)],
                ..FakeDevice::default()
            })
        });
        let c = node.collector(&fake);
        c.refresh().unwrap();
        let t = text(&c);
        assert_eq!(
            value(&t, "sysscope_gpu_process_memory_used_bytes{gpu=\"0\",uuid=\"GPU-a\",cgroup=\"/kubepods/burstable/podb/cb\",comm=\"python\",pid=\"41\"}"),
            Some((1u64 << 30) as f64),
            "{t}"
        );
        assert_eq!(
            value(&t, "sysscope_gpu_process_memory_used_bytes{gpu=\"0\",uuid=\"GPU-a\",cgroup=\"(unresolved)\",comm=\"python\",pid=\"42\"}"),
            Some((1u64 << 20) as f64),
            "{t}"
        );
        assert!(!t.contains("cgroup=\"/.."), "{t}");
    }

    #[test]
    fn parses_the_v2_line_of_proc_cgroup() {
        let hybrid = "12:cpu,cpuacct:/user.slice\n1:name=systemd:/user.slice/session-1.scope\n0::/kubepods/burstable/pod1/abc\n";
        assert_eq!(
            cgroups::parse_proc_cgroup(hybrid).as_deref(),
            Some("/kubepods/burstable/pod1/abc")
        );
        assert_eq!(cgroups::parse_proc_cgroup("0::/\n").as_deref(), Some("/"));
        assert_eq!(cgroups::parse_proc_cgroup("3:memory:/a\n"), None);
    }

    #[test]
    fn reads_own_cgroup() {
        let me = std::process::id();
        let path = read_proc_cgroup(std::path::Path::new("/proc"), me).unwrap();
        assert!(path.starts_with('/'), "{path}");
        assert_eq!(
            read_proc_cgroup(std::path::Path::new("/proc"), u32::MAX),
            None
        );
    }
}
