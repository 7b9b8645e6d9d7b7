//! The GPU collector: NVIDIA device gauges like `nvidia-smi dmon` and per-process gauges like
//! `nvidia-smi pmon`, read through NVML, which is loaded at run time from `gpu.nvml_library`.
//! No probes and no kernel maps. Metrics: `sysscope_gpu_*` (docs/metrics.md, section GPU).
//!
//! The collector talks to NVML only through the [`Nvml`] trait, the seam: [`nvml::NvmlLibrary`]
//! implements it over `nvml-wrapper`, [`fake::FakeNvml`] drives every path in tests on machines
//! without a GPU. Failures degrade, never spread:
//! - NVML cannot be loaded at start: the collector is registered down and only exports
//!   `sysscope_gpu_devices`, the NVIDIA GPUs on the PCI bus, so alerting can tell a node
//!   without GPUs from a GPU node whose driver is missing ([`pci`]).
//! - NVML loads but does not initialise, or stops answering: the collector is down and
//!   initialises again every [`RETRY_INTERVAL`].
//! - One device errors or disappears: its series go, `sysscope_gpu_device_up` of it is 0 and
//!   the collector reports down (the other devices' series stay) until it answers again.
//!
//! Per-process series join each pid to its process name and cgroup (the `0::` line of
//! `/proc/<pid>/cgroup`, then the shared labeler), so they carry the same `cgroup` and
//! Kubernetes labels as the syscall series.

pub mod fake;
pub(crate) mod nvml;
pub(crate) mod pci;

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
    os::unix::fs::MetadataExt,
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
    metadata::{cgroups::UNRESOLVED, SharedLabeler},
    series::{CgroupLabels, Workload},
    util::error::Chain,
};

pub(crate) const NAME: &str = "gpu";

/// How often NVML is initialised again while it does not answer.
pub(crate) const RETRY_INTERVAL: Duration = Duration::from_secs(30);

/// Processes per device exported at most; NVML itself lists far fewer. The rest are counted.
pub(crate) const MAX_PROCESSES_PER_DEVICE: usize = 256;

/// How often the PCI bus is counted again.
const PCI_RESCAN_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("cannot load NVML from `{library}` (is the NVIDIA driver installed, and does gpu.nvml_library name its libnvidia-ml.so.1?)")]
    LibraryMissing {
        library: String,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("NVML from `{library}` did not initialise")]
    Init {
        library: String,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("{call}")]
    Call {
        call: &'static str,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
}

/// One device's gauges, as `nvidia-smi dmon` shows them. `None`: the device does not
/// support that reading (NVML's NotSupported), so its series is absent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceReading {
    pub uuid: String,
    /// Percent of the sample period during which a kernel ran (dmon `sm`).
    pub gpu_utilization_percent: Option<u32>,
    /// Percent of the sample period during which device memory was read or written (dmon `mem`).
    pub memory_utilization_percent: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub power_milliwatts: Option<u32>,
    pub temperature_celsius: Option<u32>,
    pub graphics_clock_mhz: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub memory_clock_mhz: Option<u32>,
}

/// A per-process utilisation sample (`nvmlDeviceGetProcessUtilization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessSample {
    pub pid: u32,
    /// NVML's timestamp of the sample, in microseconds.
    pub timestamp_us: u64,
    pub sm_percent: u32,
    pub memory_percent: u32,
}

/// A process with a context on the device and the device memory it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    pub pid: u32,
    /// `None` when NVML cannot tell (e.g. without the permission to see other processes).
    pub used_bytes: Option<u64>,
}

/// A device's processes, as `nvidia-smi pmon` shows them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessReading {
    /// Samples newer than the timestamp asked for. NVML only returns processes that used the
    /// device in that period: a process without a sample was idle.
    pub(crate) samples: Vec<ProcessSample>,
    /// Processes with a compute or graphics context on the device.
    pub(crate) memory: Vec<ProcessMemory>,
}

/// What the collector needs from NVML: the seam between sysscope and the driver.
pub trait Nvml: Send {
    /// Devices NVML enumerates. An error here means NVML itself stopped answering.
    fn device_count(&mut self) -> Result<u32, GpuError>;
    /// The gauges of device `index` (NVML's enumeration order).
    fn device(&mut self, index: u32) -> Result<DeviceReading, GpuError>;
    /// The processes of device `index`, with utilisation samples newer than `since_us`.
    fn processes(&mut self, index: u32, since_us: u64) -> Result<ProcessReading, GpuError>;
}

/// Opens an NVML connection (the real library, or a fake).
pub(crate) type Connect = Box<dyn FnMut() -> Result<Box<dyn Nvml>, GpuError> + Send>;

/// Where the collector looks for processes, cgroups and PCI devices.
#[derive(Debug, Clone)]
pub struct GpuPaths {
    pub(crate) proc_root: PathBuf,
    /// The cgroup v2 mount.
    pub(crate) cgroup_root: PathBuf,
    /// `/sys/bus/pci/devices`.
    pub(crate) pci_devices: PathBuf,
}

impl GpuPaths {
    /// This machine's paths, with the cgroup v2 mount the labeler uses.
    pub fn system(labeler: &SharedLabeler) -> Self {
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
    sm: f64,
    memory: f64,
    used_bytes: Option<u64>,
}

#[derive(Debug)]
struct Device {
    index: u32,
    up: bool,
    /// `None` while the device is down: its gauges are not exported.
    reading: Option<DeviceReading>,
    processes: Vec<ProcessSeries>,
    /// Newest process sample seen, so each refresh asks only for newer ones.
    last_sample_us: u64,
}

pub struct GpuCollector {
    connect: Connect,
    nvml: Option<Box<dyn Nvml>>,
    /// Why NVML is not connected, while it is not.
    connect_error: Option<GpuError>,
    last_connect: Instant,
    retry: Duration,
    /// By UUID: NVML indices can shift when a device disappears.
    devices: BTreeMap<String, Device>,
    /// Indices that failed before their UUID was ever read (logged once each).
    failing_indices: BTreeSet<u32>,
    labeler: SharedLabeler,
    paths: GpuPaths,
    pci_devices: u64,
    pci_counted: Instant,
    dropped_processes: u64,
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
            nvml::NvmlLibrary::connect(&library).map(|n| Box::new(n) as Box<dyn Nvml>)
        });
        let paths = GpuPaths::system(&labeler);
        Self::new(connect, labeler, paths)
    }

    /// A collector that connects through `connect` now and, while that fails, again on a
    /// refresh at most every [`RETRY_INTERVAL`].
    pub fn new(mut connect: Connect, labeler: SharedLabeler, paths: GpuPaths) -> Self {
        let (nvml, connect_error) = match connect() {
            Ok(n) => (Some(n), None),
            Err(e) => (None, Some(e)),
        };
        Self {
            connect,
            nvml,
            connect_error,
            last_connect: Instant::now(),
            retry: RETRY_INTERVAL,
            devices: BTreeMap::new(),
            failing_indices: BTreeSet::new(),
            labeler,
            pci_devices: pci::count_nvidia_gpus(&paths.pci_devices),
            pci_counted: Instant::now(),
            paths,
            dropped_processes: 0,
        }
    }

    /// How long to wait before initialising NVML again (tests shorten it).
    pub fn with_retry_interval(mut self, retry: Duration) -> Self {
        self.retry = retry;
        self
    }

    /// Why NVML is not connected, while it is not.
    pub fn connect_error(&self) -> Option<&GpuError> {
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
                Ok(n) => {
                    tracing::info!(collector = NAME, "NVML initialised");
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
        let processes = self.join_processes(&procs);
        let device = self.devices.entry(uuid.clone()).or_insert_with(|| Device {
            index,
            up: false,
            reading: None,
            processes: Vec::new(),
            last_sample_us: 0,
        });
        if !device.up {
            tracing::info!(collector = NAME, gpu = index, uuid = %uuid, "GPU answering");
        }
        device.index = index;
        device.up = true;
        device.reading = Some(reading);
        device.last_sample_us = procs
            .samples
            .iter()
            .map(|s| s.timestamp_us)
            .fold(since, u64::max);
        device.processes = processes;
        self.failing_indices.remove(&index);
        Ok(uuid)
    }

    /// One series per process: the newest sample of each (0 without one: NVML lists only
    /// processes that used the device) and the memory it holds.
    fn join_processes(&mut self, procs: &ProcessReading) -> Vec<ProcessSeries> {
        let mut by_pid: BTreeMap<u32, (Option<ProcessSample>, Option<u64>)> = BTreeMap::new();
        for s in &procs.samples {
            let slot = &mut by_pid.entry(s.pid).or_default().0;
            if slot.is_none_or(|old| s.timestamp_us >= old.timestamp_us) {
                *slot = Some(*s);
            }
        }
        for m in &procs.memory {
            let slot = &mut by_pid.entry(m.pid).or_default().1;
            // A process with compute and graphics contexts is listed twice with one figure.
            if let Some(bytes) = m.used_bytes {
                *slot = Some(slot.map_or(bytes, |b| b.max(bytes)));
            }
        }
        if by_pid.len() > MAX_PROCESSES_PER_DEVICE {
            self.dropped_processes += (by_pid.len() - MAX_PROCESSES_PER_DEVICE) as u64;
        }
        let mut labeler = self.labeler.lock().expect("labeler lock");
        by_pid
            .into_iter()
            .take(MAX_PROCESSES_PER_DEVICE)
            .map(|(pid, (sample, used_bytes))| {
                let cgroup = match read_proc_cgroup(&self.paths.proc_root, pid) {
                    Some(path) => {
                        let dir = self.paths.cgroup_root.join(path.trim_start_matches('/'));
                        match std::fs::metadata(&dir) {
                            Ok(meta) => labeler.cgroup_at(meta.ino(), &path),
                            // Outside our view of the hierarchy (another cgroup namespace).
                            Err(_) => Arc::new(CgroupLabels::plain(path)),
                        }
                    }
                    None => Arc::new(CgroupLabels::plain(UNRESOLVED)),
                };
                ProcessSeries {
                    workload: Workload {
                        cgroup,
                        comm: labeler.comms.resolve(pid),
                        pid: Some(pid),
                    },
                    sm: sample.map_or(0.0, |s| s.sm_percent as f64 / 100.0),
                    memory: sample.map_or(0.0, |s| s.memory_percent as f64 / 100.0),
                    used_bytes,
                }
            })
            .collect()
    }
}

/// The cgroup v2 path of `pid` (the `0::` line of `/proc/<pid>/cgroup`), if it still runs.
pub(crate) fn read_proc_cgroup(proc_root: &std::path::Path, pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    parse_proc_cgroup(&text)
}

/// The path of the `0::` (cgroup v2) line of `/proc/<pid>/cgroup` text.
pub(crate) fn parse_proc_cgroup(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end().to_string())
        .filter(|p| p.starts_with('/'))
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
        let count = match self.nvml.as_mut().expect("connected").device_count() {
            Ok(n) => n,
            Err(e) => {
                // NVML itself stopped answering (driver unloaded or reset): initialise again.
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
        encoder
            .encode_descriptor(
                "sysscope_gpu_devices",
                "NVIDIA GPUs on the PCI bus (sysfs), whether or not NVML can be loaded; 0 on a node without NVIDIA GPUs.",
                None,
                MetricType::Gauge,
            )?
            .encode_gauge(&(self.pci_devices as i64))?;
        let up: Vec<(String, &str, &Device, &DeviceReading)> = self
            .devices
            .iter()
            .filter_map(|(uuid, d)| {
                d.reading
                    .as_ref()
                    .map(|r| (d.index.to_string(), uuid.as_str(), d, r))
            })
            .collect();
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_gpu_device_up",
                "1 if the GPU answered at the last refresh, 0 if it errors or is no longer listed by NVML (remembered until restart).",
                None,
                MetricType::Gauge,
            )?;
            for (uuid, d) in &self.devices {
                let gpu = d.index.to_string();
                family
                    .encode_family(&[("gpu", gpu.as_str()), ("uuid", uuid.as_str())])?
                    .encode_gauge(&(d.up as i64))?;
            }
        }
        type Pick = fn(&DeviceReading) -> Option<f64>;
        let gauges: [(&str, &str, Pick); 6] = [
            (
                "sysscope_gpu_utilization_ratio",
                "Share of the last sample period during which a kernel ran on the GPU (nvidia-smi dmon `sm`).",
                |r| r.gpu_utilization_percent.map(|p| p as f64 / 100.0),
            ),
            (
                "sysscope_gpu_memory_utilization_ratio",
                "Share of the last sample period during which device memory was read or written (nvidia-smi dmon `mem`; not the share of memory in use).",
                |r| r.memory_utilization_percent.map(|p| p as f64 / 100.0),
            ),
            (
                "sysscope_gpu_memory_used_bytes",
                "Device memory allocated (nvidia-smi dmon `fb`).",
                |r| r.memory_used_bytes.map(|b| b as f64),
            ),
            (
                "sysscope_gpu_memory_total_bytes",
                "Device memory installed.",
                |r| r.memory_total_bytes.map(|b| b as f64),
            ),
            (
                "sysscope_gpu_power_watts",
                "Power drawn by the board (nvidia-smi dmon `pwr`).",
                |r| r.power_milliwatts.map(|mw| mw as f64 / 1000.0),
            ),
            (
                "sysscope_gpu_temperature_celsius",
                "GPU die temperature (nvidia-smi dmon `gtemp`).",
                |r| r.temperature_celsius.map(|c| c as f64),
            ),
        ];
        for (name, help, pick) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (gpu, uuid, _, reading) in &up {
                if let Some(v) = pick(reading) {
                    family
                        .encode_family(&[("gpu", gpu.as_str()), ("uuid", *uuid)])?
                        .encode_gauge(&v)?;
                }
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_gpu_clock_hertz",
                "Current clock of the GPU by domain (nvidia-smi dmon `pclk` is graphics, `mclk` memory).",
                None,
                MetricType::Gauge,
            )?;
            for (gpu, uuid, _, r) in &up {
                for (clock, mhz) in [
                    ("graphics", r.graphics_clock_mhz),
                    ("sm", r.sm_clock_mhz),
                    ("memory", r.memory_clock_mhz),
                ] {
                    if let Some(mhz) = mhz {
                        family
                            .encode_family(&[
                                ("gpu", gpu.as_str()),
                                ("uuid", *uuid),
                                ("clock", clock),
                            ])?
                            .encode_gauge(&(mhz as f64 * 1e6))?;
                    }
                }
            }
        }
        type PickProcess = fn(&ProcessSeries) -> Option<f64>;
        let process_gauges: [(&str, &str, PickProcess); 3] = [
            (
                "sysscope_gpu_process_sm_utilization_ratio",
                "Share of the process's last sample period during which its kernels ran (nvidia-smi pmon `sm`); 0 when NVML has no sample since the previous refresh.",
                |p| Some(p.sm),
            ),
            (
                "sysscope_gpu_process_memory_utilization_ratio",
                "Share of the process's last sample period during which it read or wrote device memory (nvidia-smi pmon `mem`).",
                |p| Some(p.memory),
            ),
            (
                "sysscope_gpu_process_memory_used_bytes",
                "Device memory the process holds (nvidia-smi pmon `fb`, --query-compute-apps used_memory).",
                |p| p.used_bytes.map(|b| b as f64),
            ),
        ];
        let mut labels: Vec<(&'static str, Cow<'_, str>)> = Vec::with_capacity(8);
        for (name, help, pick) in process_gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (gpu, uuid, device, _) in &up {
                for p in &device.processes {
                    let Some(v) = pick(p) else { continue };
                    labels.clear();
                    labels.push(("gpu", Cow::Borrowed(gpu.as_str())));
                    labels.push(("uuid", Cow::Borrowed(*uuid)));
                    p.workload.push_labels(&mut labels);
                    family.encode_family(&labels)?.encode_gauge(&v)?;
                }
            }
        }
        encoder
            .encode_descriptor(
                "sysscope_gpu_processes_dropped",
                "GPU processes not exported because a device listed more than 256 (per refresh).",
                None,
                MetricType::Counter,
            )?
            .encode_counter::<NoLabelSet, _, u64>(&self.dropped_processes, None)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_v2_line_of_proc_cgroup() {
        let hybrid = "12:cpu,cpuacct:/user.slice\n1:name=systemd:/user.slice/session-1.scope\n0::/kubepods/burstable/pod1/abc\n";
        assert_eq!(
            parse_proc_cgroup(hybrid).as_deref(),
            Some("/kubepods/burstable/pod1/abc")
        );
        assert_eq!(parse_proc_cgroup("0::/\n").as_deref(), Some("/"));
        assert_eq!(parse_proc_cgroup("3:memory:/a\n"), None);
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
