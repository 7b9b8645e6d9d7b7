//! NVIDIA's NVML, the one way sysscope reads GPUs: the `gpu` collector and `sysscope trace`'s
//! counter tracks both go through it. No probes and no kernel maps.
//!
//! [`Nvml`] is what sysscope needs from the driver, in its own types: device gauges and
//! identity ([`DeviceReading`]), the processes on a device ([`ProcessReading`]), MIG instances,
//! and the XID errors NVML reports as events. [`library::NvmlLibrary`] implements it over the
//! `nvml-wrapper` crate, opening `libnvidia-ml.so.1` (or whatever `gpu.nvml_library` names)
//! with `dlopen` at run time, so sysscope has no link-time dependency on the driver; a bare
//! name is searched by the dynamic loader, then in the directories drivers install it in
//! ([`library::WELL_KNOWN_DIRS`]), since a FROM-scratch image has no loader cache;
//! [`events`] owns the thread that waits for XID events. The test suite runs all of it against
//! a stand-in library built from C (`exporter/tests/support/nvml/`); unit tests of the
//! collector's own logic use `fake.rs` (test builds only).

pub(crate) mod events;
#[cfg(test)]
pub(crate) mod fake;
pub(crate) mod library;

pub(crate) use library::NvmlLibrary;

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

/// What the driver says about itself, read once per initialisation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct DriverInfo {
    /// `nvmlSystemGetDriverVersion`, e.g. `550.54.15`.
    pub(crate) driver_version: Option<String>,
    /// The CUDA version the driver supports (`nvmlSystemGetCudaDriverVersion_v2`), e.g. `12.4`.
    pub(crate) cuda_version: Option<String>,
    /// The file NVML was loaded from ([`library::NvmlLibrary::connect`]).
    pub(crate) nvml_library: Option<String>,
}

/// A device's identity: what `nvidia-smi -L` and `--query-gpu=name,serial,pci.bus_id` print.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct DeviceInfo {
    pub(crate) model: Option<String>,
    pub(crate) serial: Option<String>,
    pub(crate) pci_bus_id: Option<String>,
}

/// ECC error counts since the driver was loaded (NVML's volatile counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct EccCounts {
    pub(crate) corrected: u64,
    pub(crate) uncorrected: u64,
}

/// One MIG device (a compute instance of a GPU instance) of a GPU in MIG mode.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct MigInstance {
    pub(crate) uuid: String,
    /// The profile from the MIG device's name (`1g.10gb` of `NVIDIA A100 ... MIG 1g.10gb`).
    pub(crate) profile: Option<String>,
    pub(crate) gpu_instance: Option<u32>,
    pub(crate) compute_instance: Option<u32>,
    pub(crate) memory_used_bytes: Option<u64>,
    pub(crate) memory_total_bytes: Option<u64>,
}

/// A device's MIG state; absent from a [`DeviceReading`] when the device does not support MIG.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct MigReading {
    /// MIG mode is on now (NVML's current mode, not the pending one).
    pub(crate) enabled: bool,
    pub(crate) instances: Vec<MigInstance>,
}

/// A reading that failed while its device answered (NVML's NoPermission, a transient
/// InsufficientSize, Unknown, ...): absent this time, and its series with it, but reported
/// ([`DeviceReading::failed`], [`ProcessReading::failed`]). Only a device that is lost, or a
/// handle or UUID that cannot be had, takes the whole device down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailedReading {
    /// The NVML function that failed.
    pub(crate) call: &'static str,
    /// NVML's error ([`error_name`]).
    pub(crate) error: &'static str,
    /// The error's text, for the log.
    pub(crate) detail: String,
}

/// NVML errors, named for a label: `no_permission`, `insufficient_size`, `unknown`, ...
pub(crate) fn error_name(e: &nvml_wrapper::error::NvmlError) -> &'static str {
    use nvml_wrapper::error::NvmlError as E;
    match e {
        E::Uninitialized => "uninitialized",
        E::InvalidArg => "invalid_argument",
        E::NotSupported => "not_supported",
        E::NoPermission => "no_permission",
        E::NotFound => "not_found",
        E::InsufficientSize(_) => "insufficient_size",
        E::InsufficientPower => "insufficient_power",
        E::DriverNotLoaded => "driver_not_loaded",
        E::Timeout => "timeout",
        E::IrqIssue => "irq_issue",
        E::CorruptedInfoROM => "corrupted_inforom",
        E::GpuLost => "gpu_lost",
        E::ResetRequired => "reset_required",
        E::Unknown => "unknown",
        _ => "other",
    }
}

/// Whether an error of one reading means the device (or NVML) is gone, rather than that one
/// reading failed: the device's series are then withdrawn until it answers again.
pub(crate) fn takes_device_down(e: &nvml_wrapper::error::NvmlError) -> bool {
    use nvml_wrapper::error::NvmlError as E;
    matches!(
        e,
        E::GpuLost | E::ResetRequired | E::Uninitialized | E::DriverNotLoaded
    )
}

/// One device's gauges, as `nvidia-smi dmon` shows them, its identity and counters. `None`:
/// the device does not support that reading (NVML's NotSupported), or reading it failed (then
/// in `failed`); either way its series is absent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct DeviceReading {
    pub(crate) uuid: String,
    pub(crate) info: DeviceInfo,
    /// Percent of the sample period during which a kernel ran (dmon `sm`).
    pub(crate) gpu_utilization_percent: Option<u32>,
    /// Percent of the sample period during which device memory was read or written (dmon `mem`).
    pub(crate) memory_utilization_percent: Option<u32>,
    pub(crate) memory_used_bytes: Option<u64>,
    pub(crate) memory_total_bytes: Option<u64>,
    pub(crate) power_milliwatts: Option<u32>,
    pub(crate) temperature_celsius: Option<u32>,
    pub(crate) graphics_clock_mhz: Option<u32>,
    pub(crate) sm_clock_mhz: Option<u32>,
    pub(crate) memory_clock_mhz: Option<u32>,
    /// Energy drawn since the driver was loaded (`nvmlDeviceGetTotalEnergyConsumption`).
    pub(crate) energy_millijoules: Option<u64>,
    /// Why the clocks are below their maximum, NVML's bit mask (`nvmlClocksEventReason*`).
    pub(crate) clocks_event_reasons: Option<u64>,
    pub(crate) ecc: Option<EccCounts>,
    pub(crate) mig: Option<MigReading>,
    /// Readings that failed this time (MIG instances among them).
    pub(crate) failed: Vec<FailedReading>,
}

/// A per-process utilisation sample (`nvmlDeviceGetProcessUtilization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcessSample {
    pub(crate) pid: u32,
    /// NVML's timestamp of the sample, in microseconds.
    pub(crate) timestamp_us: u64,
    pub(crate) sm_percent: u32,
    pub(crate) memory_percent: u32,
}

/// A process with a context on the device and the device memory it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ProcessMemory {
    pub(crate) pid: u32,
    /// `None` when NVML cannot tell (e.g. without the permission to see other processes).
    pub(crate) used_bytes: Option<u64>,
    /// The MIG GPU and compute instance the process runs on (MIG mode only).
    pub(crate) gpu_instance: Option<u32>,
    pub(crate) compute_instance: Option<u32>,
}

/// A device's processes, as `nvidia-smi pmon` shows them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ProcessReading {
    /// Samples newer than the timestamp asked for. NVML only returns processes that used the
    /// device in that period: a process without a sample was idle. `None` when the device
    /// cannot sample processes (NotSupported: older boards, and every GPU in MIG mode), or
    /// reading them failed.
    pub(crate) samples: Option<Vec<ProcessSample>>,
    /// Processes with a compute or graphics context on the device (those lists that could
    /// be read: in MIG mode NVML lists the parent's processes only to privileged callers).
    pub(crate) memory: Vec<ProcessMemory>,
    /// Lists or samples that failed this time: `samples` is then `None`, `memory` incomplete.
    pub(crate) failed: Vec<FailedReading>,
}

/// An XID error NVML reported as an event (`nvmlEventTypeXidCriticalError`), by device UUID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct XidKey {
    pub(crate) uuid: String,
    /// The XID code (`79`: fell off the bus, `48`: double-bit ECC error, ...); `None` when NVML
    /// reports it as unknown.
    pub(crate) xid: Option<u64>,
}

/// What the collector and the CLI need from NVML: the seam between sysscope and the driver.
pub(crate) trait Nvml: Send {
    /// The driver's version and the CUDA version it supports.
    fn driver(&mut self) -> DriverInfo;
    /// Devices NVML enumerates. An error here means NVML itself stopped answering.
    fn device_count(&mut self) -> Result<u32, GpuError>;
    /// The gauges of device `index` (NVML's enumeration order). An error: the device is lost
    /// or has no handle or UUID; a reading that fails otherwise is in `failed`.
    fn device(&mut self, index: u32) -> Result<DeviceReading, GpuError>;
    /// Only the utilisation of device `index`, percent (GPU, memory controller): one call,
    /// for samplers that read often. `None` where the device does not report it (MIG mode).
    fn utilization(&mut self, index: u32) -> Result<Option<(u32, u32)>, GpuError>;
    /// The processes of device `index`, with utilisation samples newer than `since_us`. Errors
    /// as for [`Nvml::device`].
    fn processes(&mut self, index: u32, since_us: u64) -> Result<ProcessReading, GpuError>;
    /// XID errors counted since the previous call, by device and code.
    fn take_xid_errors(&mut self) -> Vec<(XidKey, u64)>;
}

/// Opens an NVML connection (the real library, or a fake).
pub(crate) type Connect = Box<dyn FnMut() -> Result<Box<dyn Nvml>, GpuError> + Send>;

/// The profile of a MIG device from its name: NVML names MIG devices `<GPU name> MIG <profile>`.
pub(crate) fn mig_profile(name: &str) -> Option<String> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    (!profile.is_empty()).then(|| profile.to_string())
}

/// NVML's CUDA version integer (`12040`) as `12.4`.
pub(crate) fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_profiles_come_from_the_device_name() {
        assert_eq!(
            mig_profile("NVIDIA A100-SXM4-40GB MIG 1g.5gb").as_deref(),
            Some("1g.5gb")
        );
        assert_eq!(
            mig_profile("NVIDIA H100 80GB HBM3 MIG 3g.40gb").as_deref(),
            Some("3g.40gb")
        );
        assert_eq!(mig_profile("NVIDIA A100-SXM4-40GB"), None);
        assert_eq!(mig_profile("x MIG "), None);
    }

    #[test]
    fn cuda_versions_read_as_nvidia_smi_prints_them() {
        assert_eq!(cuda_version(12040), "12.4");
        assert_eq!(cuda_version(11080), "11.8");
        assert_eq!(cuda_version(12000), "12.0");
    }
}
