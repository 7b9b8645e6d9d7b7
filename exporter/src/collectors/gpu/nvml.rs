//! The real NVML behind the [`Nvml`] seam, over `nvml-wrapper`. The library is opened with
//! `dlopen` at run time (`gpu.nvml_library`), so sysscope has no link-time dependency on the
//! NVIDIA driver and starts on any machine.
//!
//! Not yet run against NVIDIA hardware in this project's CI (there is none): see docs/gpu.md.

use std::ffi::OsStr;

use nvml_wrapper::{
    enum_wrappers::device::{Clock, TemperatureSensor},
    enums::device::UsedGpuMemory,
    error::NvmlError,
};

use super::{DeviceReading, GpuError, Nvml, ProcessMemory, ProcessReading, ProcessSample};

/// An initialised NVML (shut down on drop).
pub(crate) struct NvmlLibrary {
    nvml: nvml_wrapper::Nvml,
}

impl std::fmt::Debug for NvmlLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlLibrary").finish_non_exhaustive()
    }
}

impl NvmlLibrary {
    /// Loads `library` (a path, or a name the dynamic loader searches) and initialises NVML.
    pub(crate) fn connect(library: &str) -> Result<Self, GpuError> {
        match nvml_wrapper::Nvml::builder()
            .lib_path(OsStr::new(library))
            .init()
        {
            Ok(nvml) => Ok(Self { nvml }),
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

    fn handle(&self, index: u32) -> Result<nvml_wrapper::Device<'_>, GpuError> {
        self.nvml
            .device_by_index(index)
            .map_err(call("nvmlDeviceGetHandleByIndex"))
    }
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
    fn device_count(&mut self) -> Result<u32, GpuError> {
        self.nvml.device_count().map_err(call("nvmlDeviceGetCount"))
    }

    fn device(&mut self, index: u32) -> Result<DeviceReading, GpuError> {
        let d = self.handle(index)?;
        let uuid = d.uuid().map_err(call("nvmlDeviceGetUUID"))?;
        let util = optional(d.utilization_rates(), "nvmlDeviceGetUtilizationRates")?;
        let memory = optional(d.memory_info(), "nvmlDeviceGetMemoryInfo")?;
        let clock = |c: Clock| optional(d.clock_info(c), "nvmlDeviceGetClockInfo");
        Ok(DeviceReading {
            uuid,
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
        })
    }

    fn processes(&mut self, index: u32, since_us: u64) -> Result<ProcessReading, GpuError> {
        let d = self.handle(index)?;
        let samples = match d.process_utilization_stats(since_us) {
            Ok(v) => v,
            // NVML answers NotFound when no process used the device since `since_us`.
            Err(NvmlError::NotFound | NvmlError::NotSupported) => Vec::new(),
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
                "nvmlDeviceGetComputeRunningProcesses",
            )?,
            optional(
                d.running_graphics_processes(),
                "nvmlDeviceGetGraphicsRunningProcesses",
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
            }));
        }
        Ok(ProcessReading {
            samples: samples
                .into_iter()
                .map(|s| ProcessSample {
                    pid: s.pid,
                    timestamp_us: s.timestamp,
                    sm_percent: s.sm_util,
                    memory_percent: s.mem_util,
                })
                .collect(),
            memory,
        })
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
