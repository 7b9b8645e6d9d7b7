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
    sync::Arc,
};

use nvml_wrapper::{
    enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor},
    enums::device::UsedGpuMemory,
    error::{nvml_try, NvmlError},
    Device,
};

use super::{
    cuda_version, events::XidWatch, mig_profile, DeviceInfo, DeviceReading, DriverInfo, EccCounts,
    GpuError, MigInstance, MigReading, Nvml, ProcessMemory, ProcessReading, ProcessSample, XidKey,
};

/// An initialised NVML (shut down when the last user drops it), and the thread that counts
/// its XID events, once started.
pub(crate) struct NvmlLibrary {
    nvml: Arc<nvml_wrapper::Nvml>,
    xids: Option<XidWatch>,
}

impl std::fmt::Debug for NvmlLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlLibrary")
            .field("watching_xids", &self.xids.is_some())
            .finish_non_exhaustive()
    }
}

impl NvmlLibrary {
    /// Loads `library` (a path, or a name the dynamic loader searches) and initialises NVML.
    pub(crate) fn connect(library: &str) -> Result<Self, GpuError> {
        match nvml_wrapper::Nvml::builder()
            .lib_path(OsStr::new(library))
            .init()
        {
            Ok(nvml) => Ok(Self {
                nvml: Arc::new(nvml),
                xids: None,
            }),
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

    /// The MIG devices of `d`, when its MIG mode is on.
    fn mig_instances(&self, d: &Device<'_>) -> Result<Vec<MigInstance>, GpuError> {
        let max = d
            .mig_device_count()
            .map_err(call("nvmlDeviceGetMaxMigDeviceCount"))?;
        let mut out = Vec::new();
        for i in 0..max {
            let m = match d.mig_device_by_index(i) {
                Ok(m) => m,
                // The index has no MIG device: indices are slots, not a dense list.
                Err(NvmlError::NotFound) => continue,
                Err(source) => {
                    return Err(GpuError::Call {
                        call: "nvmlDeviceGetMigDeviceHandleByIndex",
                        source,
                    })
                }
            };
            let memory = optional(m.memory_info(), "nvmlDeviceGetMemoryInfo_v2")?;
            let name = optional(m.name(), "nvmlDeviceGetName")?;
            out.push(MigInstance {
                uuid: m.uuid().map_err(call("nvmlDeviceGetUUID"))?,
                profile: name.as_deref().and_then(mig_profile),
                gpu_instance: self.instance_id(&m, InstanceId::Gpu)?,
                compute_instance: self.instance_id(&m, InstanceId::Compute)?,
                memory_used_bytes: memory.as_ref().map(|m| m.used),
                memory_total_bytes: memory.as_ref().map(|m| m.total),
            });
        }
        Ok(out)
    }

    /// `nvmlDeviceGetGpuInstanceId` / `nvmlDeviceGetComputeInstanceId` of a MIG device, which
    /// nvml-wrapper does not wrap; `None` when the library lacks the call.
    fn instance_id(&self, d: &Device<'_>, which: InstanceId) -> Result<Option<u32>, GpuError> {
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
        let r = unsafe { (*sym)(d.handle(), &mut id) };
        optional(nvml_try(r).map(|()| id), name)
    }

    /// Why the clocks are held back: `nvmlDeviceGetCurrentClocksEventReasons` (NVML 12.2 and
    /// later), else its former name `nvmlDeviceGetCurrentClocksThrottleReasons`.
    fn clocks_event_reasons(&self, d: &Device<'_>) -> Result<Option<u64>, GpuError> {
        let lib = self.nvml.lib();
        let Ok(sym) = lib.nvmlDeviceGetCurrentClocksEventReasons.as_ref() else {
            return optional(
                d.current_throttle_reasons().map(|r| r.bits()),
                "nvmlDeviceGetCurrentClocksThrottleReasons",
            );
        };
        let mut mask: c_ulonglong = 0;
        // SAFETY: a live handle of this NVML and the `unsigned long long *` the call takes.
        let r = unsafe { (*sym)(d.handle(), &mut mask) };
        optional(
            nvml_try(r).map(|()| mask),
            "nvmlDeviceGetCurrentClocksEventReasons",
        )
    }
}

/// `NVML_DEVICE_MIG_ENABLE`, the current mode of a GPU in MIG mode.
const MIG_ENABLED: u32 = 1;

enum InstanceId {
    Gpu,
    Compute,
}

fn call(name: &'static str) -> impl Fn(NvmlError) -> GpuError {
    move |source| GpuError::Call { call: name, source }
}

/// A reading the device does not support is absent, not an error.
fn optional<T>(r: Result<T, NvmlError>, name: &'static str) -> Result<Option<T>, GpuError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(NvmlError::NotSupported) => Ok(None),
        Err(source) => Err(GpuError::Call { call: name, source }),
    }
}

impl Nvml for NvmlLibrary {
    fn driver(&mut self) -> DriverInfo {
        DriverInfo {
            driver_version: self.nvml.sys_driver_version().ok(),
            cuda_version: self.nvml.sys_cuda_driver_version().ok().map(cuda_version),
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
        let util = optional(d.utilization_rates(), "nvmlDeviceGetUtilizationRates")?;
        let memory = optional(d.memory_info(), "nvmlDeviceGetMemoryInfo_v2")?;
        let clock = |c: Clock| optional(d.clock_info(c), "nvmlDeviceGetClockInfo");
        let ecc = |e: MemoryError| {
            optional(
                d.total_ecc_errors(e, EccCounter::Volatile),
                "nvmlDeviceGetTotalEccErrors",
            )
        };
        let ecc = match (ecc(MemoryError::Corrected)?, ecc(MemoryError::Uncorrected)?) {
            (Some(corrected), Some(uncorrected)) => Some(EccCounts {
                corrected,
                uncorrected,
            }),
            _ => None,
        };
        let mig = match optional(d.mig_mode(), "nvmlDeviceGetMigMode")? {
            None => None,
            Some(mode) => {
                let enabled = mode.current == MIG_ENABLED;
                Some(MigReading {
                    enabled,
                    instances: if enabled {
                        self.mig_instances(&d)?
                    } else {
                        Vec::new()
                    },
                })
            }
        };
        let pci = optional(d.pci_info(), "nvmlDeviceGetPciInfo_v3")?;
        Ok(DeviceReading {
            uuid,
            info: DeviceInfo {
                model: optional(d.name(), "nvmlDeviceGetName")?,
                serial: optional(d.serial(), "nvmlDeviceGetSerial")?,
                pci_bus_id: pci.map(|p| p.bus_id),
            },
            gpu_utilization_percent: util.as_ref().map(|u| u.gpu),
            memory_utilization_percent: util.as_ref().map(|u| u.memory),
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            power_milliwatts: optional(d.power_usage(), "nvmlDeviceGetPowerUsage")?,
            temperature_celsius: optional(
                d.temperature(TemperatureSensor::Gpu),
                "nvmlDeviceGetTemperature",
            )?,
            graphics_clock_mhz: clock(Clock::Graphics)?,
            sm_clock_mhz: clock(Clock::SM)?,
            memory_clock_mhz: clock(Clock::Memory)?,
            energy_millijoules: optional(
                d.total_energy_consumption(),
                "nvmlDeviceGetTotalEnergyConsumption",
            )?,
            clocks_event_reasons: self.clocks_event_reasons(&d)?,
            ecc,
            mig,
        })
    }

    fn utilization(&mut self, index: u32) -> Result<Option<(u32, u32)>, GpuError> {
        let d = self.handle(index)?;
        Ok(
            optional(d.utilization_rates(), "nvmlDeviceGetUtilizationRates")?
                .map(|u| (u.gpu, u.memory)),
        )
    }

    fn processes(&mut self, index: u32, since_us: u64) -> Result<ProcessReading, GpuError> {
        let d = self.handle(index)?;
        let samples = match d.process_utilization_stats(since_us) {
            Ok(v) => Some(v),
            // NVML answers NotFound when no process used the device since `since_us`.
            Err(NvmlError::NotFound) => Some(Vec::new()),
            Err(NvmlError::NotSupported) => None,
            Err(source) => {
                return Err(GpuError::Call {
                    call: "nvmlDeviceGetProcessUtilization",
                    source,
                })
            }
        };
        let mut memory = Vec::new();
        for list in [
            optional(
                d.running_compute_processes(),
                "nvmlDeviceGetComputeRunningProcesses_v3",
            )?,
            optional(
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
            samples: samples.map(|v| {
                v.into_iter()
                    .map(|s| ProcessSample {
                        pid: s.pid,
                        timestamp_us: s.timestamp,
                        sm_percent: s.sm_util,
                        memory_percent: s.mem_util,
                    })
                    .collect()
            }),
            memory,
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
    fn a_library_that_is_not_nvml_is_reported_as_missing() {
        // libc loads but has no nvmlInit_v2.
        let e = NvmlLibrary::connect("libc.so.6").unwrap_err();
        assert!(matches!(e, GpuError::LibraryMissing { .. }), "{e:?}");
    }
}
