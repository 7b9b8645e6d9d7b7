//! The real NVML behind the [`Nvml`] seam, over `nvml-wrapper`. The library is opened with
//! `dlopen` at run time (`gpu.nvml_library`), so sysscope has no link-time dependency on the
//! NVIDIA driver and starts on any machine.
//!
//! The calls and the structs they fill are NVML's own (`nvmlDeviceGetCount_v2`,
//! `nvmlDeviceGetMemoryInfo_v2`, `nvmlDeviceGetComputeRunningProcesses_v3`, ...); the test suite
//! runs every one of them against a stand-in library with the same ABI. Not yet run against
//! NVIDIA hardware by this project: see docs/gpu.md.

use std::{
    ffi::OsStr,
    os::raw::{c_uint, c_ulonglong},
    ptr,
    sync::Arc,
};

use nvml_wrapper::{
    enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor},
    enums::device::UsedGpuMemory,
    error::{nvml_try, NvmlError},
    Device,
};

use super::{
    cuda_version, error_name, events::XidWatch, mig_profile, takes_device_down, DeviceInfo,
    DeviceReading, DriverInfo, EccCounts, FailedReading, GpuError, MigInstance, MigReading, Nvml,
    ProcessMemory, ProcessReading, ProcessSample, XidKey,
};
use crate::util::error::Chain;

/// Directories the NVIDIA driver's `libnvidia-ml.so.1` is installed in, tried in this order
/// when `gpu.nvml_library` is a bare name the dynamic loader does not find: an image built
/// `FROM scratch` has no `/etc/ld.so.cache`, and its loader's default path lacks `/usr/lib64`,
/// so whether a library a container runtime injects is found would otherwise depend on the
/// runtime writing a cache. The host's multiarch directory (Debian, Ubuntu), `/usr/lib64`
/// (RHEL, Amazon Linux 2023, SUSE), `/usr/lib`, `/usr/local/nvidia/lib64` (GKE, and where the
/// host-driver overlay mounts it), and the GPU Operator's driver container root.
#[cfg(target_arch = "aarch64")]
pub(crate) const WELL_KNOWN_DIRS: &[&str] = &[
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/run/nvidia/driver/usr/lib/aarch64-linux-gnu",
    "/run/nvidia/driver/usr/lib64",
];
/// See the aarch64 list; this is the same for x86_64.
#[cfg(not(target_arch = "aarch64"))]
pub(crate) const WELL_KNOWN_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu",
    "/run/nvidia/driver/usr/lib64",
];

/// A directory put in front of each of [`WELL_KNOWN_DIRS`] (e.g. `/host`, where the host's
/// root is mounted read-only), read when NVML is loaded. Unset: the directories as they are.
pub(crate) const ROOT_ENV: &str = "SYSSCOPE_NVML_ROOT";

/// An initialised NVML (shut down when the last user drops it), and the thread that counts
/// its XID events, once started.
pub(crate) struct NvmlLibrary {
    nvml: Arc<nvml_wrapper::Nvml>,
    xids: Option<XidWatch>,
    /// The file it was loaded from.
    path: String,
}

impl std::fmt::Debug for NvmlLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlLibrary")
            .field("watching_xids", &self.xids.is_some())
            .finish_non_exhaustive()
    }
}

impl NvmlLibrary {
    /// Loads `library` and initialises NVML. A path is loaded as it is; a bare name is searched
    /// by the dynamic loader (`LD_LIBRARY_PATH`, the loader's cache and default directories),
    /// then in [`WELL_KNOWN_DIRS`] (under `$SYSSCOPE_NVML_ROOT`), in order. The file loaded is
    /// logged and reported in [`DriverInfo::nvml_library`].
    pub(crate) fn connect(library: &str) -> Result<Self, GpuError> {
        if library.contains('/') {
            return Self::load(library);
        }
        let root = std::env::var(ROOT_ENV).unwrap_or_default();
        let root = root.trim_end_matches('/');
        let candidates: Vec<String> = WELL_KNOWN_DIRS
            .iter()
            .map(|dir| format!("{root}{dir}/{library}"))
            .collect();
        let by_name = match Self::load(library) {
            Err(GpuError::LibraryMissing { source, .. }) => source,
            found => return found,
        };
        for path in &candidates {
            if !std::path::Path::new(path).is_file() {
                continue;
            }
            match Self::load(path) {
                Err(GpuError::LibraryMissing { source, .. }) => {
                    tracing::debug!(library = %path, error = %source, "not NVML");
                }
                found => return found,
            }
        }
        Err(GpuError::LibraryMissing {
            library: format!(
                "{library}, searched by the dynamic loader and in {}",
                candidates.join(", ")
            ),
            source: by_name,
        })
    }

    /// Loads `library` (a path, or a name the dynamic loader searches) and initialises NVML.
    fn load(library: &str) -> Result<Self, GpuError> {
        match nvml_wrapper::Nvml::builder()
            .lib_path(OsStr::new(library))
            .init()
        {
            Ok(nvml) => {
                let path = if library.contains('/') {
                    library.to_string()
                } else {
                    mapped_file(library).unwrap_or_else(|| library.to_string())
                };
                tracing::info!(library = %path, "NVML loaded");
                Ok(Self {
                    nvml: Arc::new(nvml),
                    xids: None,
                    path,
                })
            }
            // Not there, or not an NVML library.
            Err(
                source @ (NvmlError::LibloadingError(_)
                | NvmlError::FailedToLoadSymbol(_)
                | NvmlError::LibraryNotFound
                | NvmlError::FunctionNotFound),
            ) => Err(GpuError::LibraryMissing {
                library: library.to_string(),
                source,
            }),
            Err(source) => Err(GpuError::Init {
                library: library.to_string(),
                source,
            }),
        }
    }

    /// Starts counting XID errors of the devices NVML lists now ([`Nvml::take_xid_errors`]).
    pub(crate) fn watch_xid_errors(mut self) -> Self {
        self.xids = Some(XidWatch::start(self.nvml.clone()));
        self
    }

    fn handle(&self, index: u32) -> Result<Device<'_>, GpuError> {
        self.nvml
            .device_by_index(index)
            .map_err(call("nvmlDeviceGetHandleByIndex_v2"))
    }

    /// The MIG devices of `d`, when its MIG mode is on: those that can be read (an instance
    /// that cannot is left out, and in `r`).
    fn mig_instances(
        &self,
        d: &Device<'_>,
        r: &mut Readings,
    ) -> Result<Vec<MigInstance>, GpuError> {
        let Some(max) = r.optional(d.mig_device_count(), "nvmlDeviceGetMaxMigDeviceCount")? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for i in 0..max {
            let m = match d.mig_device_by_index(i) {
                // The index has no MIG device: indices are slots, not a dense list.
                Err(NvmlError::NotFound) => continue,
                m => match r.optional(m, "nvmlDeviceGetMigDeviceHandleByIndex")? {
                    Some(m) => m,
                    None => continue,
                },
            };
            let Some(uuid) = r.optional(m.uuid(), "nvmlDeviceGetUUID")? else {
                continue;
            };
            let memory = r.optional(m.memory_info(), "nvmlDeviceGetMemoryInfo_v2")?;
            let name = r.optional(m.name(), "nvmlDeviceGetName")?;
            out.push(MigInstance {
                uuid,
                profile: name.as_deref().and_then(mig_profile),
                gpu_instance: self.instance_id(&m, InstanceId::Gpu, r)?,
                compute_instance: self.instance_id(&m, InstanceId::Compute, r)?,
                memory_used_bytes: memory.as_ref().map(|m| m.used),
                memory_total_bytes: memory.as_ref().map(|m| m.total),
            });
        }
        Ok(out)
    }

    /// `nvmlDeviceGetGpuInstanceId` / `nvmlDeviceGetComputeInstanceId` of a MIG device, which
    /// nvml-wrapper does not wrap; `None` when the library lacks the call.
    fn instance_id(
        &self,
        d: &Device<'_>,
        which: InstanceId,
        r: &mut Readings,
    ) -> Result<Option<u32>, GpuError> {
        let lib = self.nvml.lib();
        let (sym, name) = match which {
            InstanceId::Gpu => (
                lib.nvmlDeviceGetGpuInstanceId.as_ref(),
                "nvmlDeviceGetGpuInstanceId",
            ),
            InstanceId::Compute => (
                lib.nvmlDeviceGetComputeInstanceId.as_ref(),
                "nvmlDeviceGetComputeInstanceId",
            ),
        };
        let Ok(sym) = sym else { return Ok(None) };
        let mut id: c_uint = 0;
        // SAFETY: `d.handle()` is a live handle of this NVML (the device borrows it), and `id`
        // is the `unsigned int *` both calls take.
        let rc = unsafe { (*sym)(d.handle(), &mut id) };
        r.optional(nvml_try(rc).map(|()| id), name)
    }

    /// Why the clocks are held back: `nvmlDeviceGetCurrentClocksEventReasons` (NVML 12.2 and
    /// later), else its former name `nvmlDeviceGetCurrentClocksThrottleReasons`. Both raw: the
    /// whole mask, bits nvml-wrapper does not know included (they are reported as `other`;
    /// its `current_throttle_reasons` drops them).
    fn clocks_event_reasons(
        &self,
        d: &Device<'_>,
        r: &mut Readings,
    ) -> Result<Option<u64>, GpuError> {
        let lib = self.nvml.lib();
        let (sym, name) = match lib.nvmlDeviceGetCurrentClocksEventReasons.as_ref() {
            Ok(sym) => (sym, "nvmlDeviceGetCurrentClocksEventReasons"),
            Err(_) => match lib.nvmlDeviceGetCurrentClocksThrottleReasons.as_ref() {
                Ok(sym) => (sym, "nvmlDeviceGetCurrentClocksThrottleReasons"),
                Err(_) => return Ok(None),
            },
        };
        let mut mask: c_ulonglong = 0;
        // SAFETY: a live handle of this NVML and the `unsigned long long *` both calls take.
        let rc = unsafe { (*sym)(d.handle(), &mut mask) };
        r.optional(nvml_try(rc).map(|()| mask), name)
    }

    /// `nvmlDeviceGetProcessUtilization`, asked for samples newer than `since_us`. nvml-wrapper
    /// sizes the buffer to the count NVML gave a moment before, so a process sampled in
    /// between fails its call with INSUFFICIENT_SIZE; here the buffer has room to spare and
    /// the call is made again, larger, while NVML says so. `None`: not supported.
    fn process_samples(
        &self,
        d: &Device<'_>,
        since_us: u64,
        r: &mut Readings,
    ) -> Result<Option<Vec<ProcessSample>>, GpuError> {
        const CALL: &str = "nvmlDeviceGetProcessUtilization";
        let lib = self.nvml.lib();
        let Ok(sym) = lib.nvmlDeviceGetProcessUtilization.as_ref() else {
            return Ok(None);
        };
        let mut count: c_uint = 0;
        // SAFETY: a live handle; a null buffer asks for the count only.
        let rc = unsafe { (*sym)(d.handle(), ptr::null_mut(), &mut count, since_us) };
        match nvml_try(rc) {
            Ok(()) | Err(NvmlError::InsufficientSize(_)) => {}
            // No process used the device since `since_us`.
            Err(NvmlError::NotFound) => return Ok(Some(Vec::new())),
            Err(e) => return r.optional(Err(e), CALL),
        }
        for _ in 0..SAMPLE_ATTEMPTS {
            let mut buf = vec![RawSample::default(); count as usize + SAMPLE_HEADROOM];
            let mut n = buf.len() as c_uint;
            // SAFETY: `buf` has room for `n` samples of nvml.h's nvmlProcessUtilizationSample_t
            // layout (RawSample), which the call fills and counts in `n`.
            let rc = unsafe { (*sym)(d.handle(), buf.as_mut_ptr().cast(), &mut n, since_us) };
            match nvml_try(rc) {
                Ok(()) => {
                    buf.truncate(n as usize);
                    return Ok(Some(buf.into_iter().map(RawSample::sample).collect()));
                }
                Err(NvmlError::NotFound) => return Ok(Some(Vec::new())),
                // More processes than room: NVML has set `n` to what it needs.
                Err(NvmlError::InsufficientSize(_)) => count = n.max(count + 1),
                Err(e) => return r.optional(Err(e), CALL),
            }
        }
        r.optional(Err(NvmlError::InsufficientSize(Some(count as usize))), CALL)
    }
}

/// Tries of [`NvmlLibrary::process_samples`] while NVML asks for a larger buffer.
const SAMPLE_ATTEMPTS: usize = 3;
/// Samples of room beyond the count NVML gave, for processes sampled in between.
const SAMPLE_HEADROOM: usize = 8;

/// `nvmlProcessUtilizationSample_t` of nvml.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawSample {
    pid: c_uint,
    time_stamp: c_ulonglong,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

impl RawSample {
    fn sample(self) -> ProcessSample {
        ProcessSample {
            pid: self.pid,
            timestamp_us: self.time_stamp,
            sm_percent: self.sm_util,
            memory_percent: self.mem_util,
        }
    }
}

/// The readings of one device as they are made: NotSupported makes a reading absent, an
/// error that means the device is gone ([`takes_device_down`]) is returned, and any other
/// error makes the reading absent and is kept in `failed`.
#[derive(Debug, Default)]
struct Readings {
    failed: Vec<FailedReading>,
}

impl Readings {
    fn optional<T>(
        &mut self,
        r: Result<T, NvmlError>,
        call: &'static str,
    ) -> Result<Option<T>, GpuError> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(NvmlError::NotSupported) => Ok(None),
            Err(source) if takes_device_down(&source) => Err(GpuError::Call { call, source }),
            Err(e) => {
                self.failed.push(FailedReading {
                    call,
                    error: error_name(&e),
                    detail: Chain(&e).to_string(),
                });
                Ok(None)
            }
        }
    }
}

/// `NVML_DEVICE_MIG_ENABLE`, the current mode of a GPU in MIG mode.
const MIG_ENABLED: u32 = 1;

enum InstanceId {
    Gpu,
    Compute,
}

/// The file the dynamic loader mapped for the bare library `name` (e.g. `libnvidia-ml.so.1`),
/// from `/proc/self/maps`: the first mapped file whose name starts with `name`'s stem up to
/// `.so` (the soname is usually a link to `libnvidia-ml.so.<driver version>`).
fn mapped_file(name: &str) -> Option<String> {
    let stem = &name[..name.find(".so").map_or(name.len(), |i| i + 3)];
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.starts_with('/') && p.rsplit('/').next().is_some_and(|f| f.starts_with(stem)))
        .map(str::to_string)
}

fn call(name: &'static str) -> impl Fn(NvmlError) -> GpuError {
    move |source| GpuError::Call { call: name, source }
}

impl Nvml for NvmlLibrary {
    fn driver(&mut self) -> DriverInfo {
        DriverInfo {
            driver_version: self.nvml.sys_driver_version().ok(),
            cuda_version: self.nvml.sys_cuda_driver_version().ok().map(cuda_version),
            nvml_library: Some(self.path.clone()),
        }
    }

    fn device_count(&mut self) -> Result<u32, GpuError> {
        self.nvml
            .device_count()
            .map_err(call("nvmlDeviceGetCount_v2"))
    }

    fn device(&mut self, index: u32) -> Result<DeviceReading, GpuError> {
        let d = self.handle(index)?;
        let uuid = d.uuid().map_err(call("nvmlDeviceGetUUID"))?;
        if let Some(xids) = &self.xids {
            xids.notice(&uuid);
        }
        let mut r = Readings::default();
        let util = r.optional(d.utilization_rates(), "nvmlDeviceGetUtilizationRates")?;
        let memory = r.optional(d.memory_info(), "nvmlDeviceGetMemoryInfo_v2")?;
        let ecc = |r: &mut Readings, e: MemoryError| {
            r.optional(
                d.total_ecc_errors(e, EccCounter::Volatile),
                "nvmlDeviceGetTotalEccErrors",
            )
        };
        let ecc = match (
            ecc(&mut r, MemoryError::Corrected)?,
            ecc(&mut r, MemoryError::Uncorrected)?,
        ) {
            (Some(corrected), Some(uncorrected)) => Some(EccCounts {
                corrected,
                uncorrected,
            }),
            _ => None,
        };
        let mig = match r.optional(d.mig_mode(), "nvmlDeviceGetMigMode")? {
            None => None,
            Some(mode) => {
                let enabled = mode.current == MIG_ENABLED;
                Some(MigReading {
                    enabled,
                    instances: if enabled {
                        self.mig_instances(&d, &mut r)?
                    } else {
                        Vec::new()
                    },
                })
            }
        };
        let pci = r.optional(d.pci_info(), "nvmlDeviceGetPciInfo_v3")?;
        let clock =
            |r: &mut Readings, c: Clock| r.optional(d.clock_info(c), "nvmlDeviceGetClockInfo");
        let (graphics_clock_mhz, sm_clock_mhz, memory_clock_mhz) = (
            clock(&mut r, Clock::Graphics)?,
            clock(&mut r, Clock::SM)?,
            clock(&mut r, Clock::Memory)?,
        );
        Ok(DeviceReading {
            uuid,
            info: DeviceInfo {
                model: r.optional(d.name(), "nvmlDeviceGetName")?,
                serial: r.optional(d.serial(), "nvmlDeviceGetSerial")?,
                pci_bus_id: pci.map(|p| p.bus_id),
            },
            gpu_utilization_percent: util.as_ref().map(|u| u.gpu),
            memory_utilization_percent: util.as_ref().map(|u| u.memory),
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            power_milliwatts: r.optional(d.power_usage(), "nvmlDeviceGetPowerUsage")?,
            temperature_celsius: r.optional(
                d.temperature(TemperatureSensor::Gpu),
                "nvmlDeviceGetTemperature",
            )?,
            graphics_clock_mhz,
            sm_clock_mhz,
            memory_clock_mhz,
            energy_millijoules: r.optional(
                d.total_energy_consumption(),
                "nvmlDeviceGetTotalEnergyConsumption",
            )?,
            clocks_event_reasons: self.clocks_event_reasons(&d, &mut r)?,
            ecc,
            mig,
            failed: r.failed,
        })
    }

    fn utilization(&mut self, index: u32) -> Result<Option<(u32, u32)>, GpuError> {
        let d = self.handle(index)?;
        // A sampler that reads often has nowhere to report a failed reading: it has a gap.
        Ok(Readings::default()
            .optional(d.utilization_rates(), "nvmlDeviceGetUtilizationRates")?
            .map(|u| (u.gpu, u.memory)))
    }

    fn processes(&mut self, index: u32, since_us: u64) -> Result<ProcessReading, GpuError> {
        let d = self.handle(index)?;
        let mut r = Readings::default();
        let samples = self.process_samples(&d, since_us, &mut r)?;
        let mut memory = Vec::new();
        for list in [
            r.optional(
                d.running_compute_processes(),
                "nvmlDeviceGetComputeRunningProcesses_v3",
            )?,
            r.optional(
                d.running_graphics_processes(),
                "nvmlDeviceGetGraphicsRunningProcesses_v3",
            )?,
        ]
        .into_iter()
        .flatten()
        {
            memory.extend(list.into_iter().map(|p| ProcessMemory {
                pid: p.pid,
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
                gpu_instance: p.gpu_instance_id,
                compute_instance: p.compute_instance_id,
            }));
        }
        Ok(ProcessReading {
            samples,
            memory,
            failed: r.failed,
        })
    }

    fn take_xid_errors(&mut self) -> Vec<(XidKey, u64)> {
        self.xids.as_ref().map(XidWatch::take).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_reported_as_missing() {
        let e = NvmlLibrary::connect("/nonexistent/libnvidia-ml.so.1").unwrap_err();
        assert!(matches!(e, GpuError::LibraryMissing { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("/nonexistent/libnvidia-ml.so.1") && text.contains("gpu.nvml_library"),
            "{text}"
        );
    }

    #[test]
    fn a_name_found_nowhere_names_every_directory_searched() {
        let e = NvmlLibrary::connect("libsysscope-no-such-nvml.so.1").unwrap_err();
        assert!(matches!(e, GpuError::LibraryMissing { .. }), "{e:?}");
        let text = e.to_string();
        for dir in WELL_KNOWN_DIRS {
            assert!(
                text.contains(&format!("{dir}/libsysscope-no-such-nvml.so.1")),
                "{dir} not in: {text}"
            );
        }
    }

    #[test]
    fn the_file_a_bare_name_was_loaded_from_is_found_in_the_mappings() {
        // libc is mapped in every process, from the path its soname resolves to.
        let path = mapped_file("libc.so.6").expect("libc mapped");
        assert!(path.starts_with('/') && path.contains("/libc.so"), "{path}");
        assert!(std::path::Path::new(&path).is_file(), "{path}");
        assert_eq!(mapped_file("libsysscope-not-loaded.so.1"), None);
    }

    #[test]
    fn a_library_that_is_not_nvml_is_reported_as_missing() {
        // libc loads but has no nvmlInit_v2.
        let e = NvmlLibrary::connect("libc.so.6").unwrap_err();
        assert!(matches!(e, GpuError::LibraryMissing { .. }), "{e:?}");
    }
}
