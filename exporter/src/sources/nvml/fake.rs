//! A scripted NVML behind the [`Nvml`] seam, for unit tests of the collector's own logic
//! (which samples it asks for, how it folds duplicate processes, how it tracks devices by
//! UUID when indices shift, how it retries). Everything that goes through the real library
//! is tested against the stand-in `libnvidia-ml.so.1` instead (exporter/tests/support/nvml).

use std::sync::{Arc, Mutex};

use nvml_wrapper::error::NvmlError;

use super::{
    error_name, takes_device_down, Connect, DeviceReading, DriverInfo, FailedReading, GpuError,
    Nvml, ProcessMemory, ProcessReading, ProcessSample, XidKey,
};

/// A failure the fake can inject, turned into NVML's own error at each call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FakeFailure {
    /// The device fell off the bus.
    GpuLost,
    /// The driver is not loaded (e.g. being upgraded).
    DriverNotLoaded,
    /// The caller lacks a privilege the call needs (process lists of a GPU in MIG mode).
    NoPermission,
}

impl FakeFailure {
    fn error(self) -> NvmlError {
        match self {
            FakeFailure::GpuLost => NvmlError::GpuLost,
            FakeFailure::DriverNotLoaded => NvmlError::DriverNotLoaded,
            FakeFailure::NoPermission => NvmlError::NoPermission,
        }
    }
}

/// One fake device.
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeDevice {
    pub(crate) reading: DeviceReading,
    /// Every sample ever taken; calls return those newer than asked for. `None`: the device
    /// cannot sample processes.
    pub(crate) samples: Option<Vec<ProcessSample>>,
    pub(crate) memory: Vec<ProcessMemory>,
    /// Every call on this device fails with it.
    pub(crate) failure: Option<FakeFailure>,
    /// Only the process lists fail with it: the device is down if it means that
    /// ([`takes_device_down`]), else the lists are a failed reading, as the library does.
    pub(crate) process_failure: Option<FakeFailure>,
}

#[derive(Debug, Default)]
pub(crate) struct FakeState {
    /// In NVML enumeration order: removing one shifts the indices of the next, like NVML.
    pub(crate) devices: Vec<FakeDevice>,
    pub(crate) driver: DriverInfo,
    /// `nvmlDeviceGetCount` fails with it (NVML itself not answering).
    pub(crate) count_failure: Option<FakeFailure>,
    /// Connecting fails: `Some(None)` as if the library were missing, `Some(Some(f))` as if
    /// initialisation failed with `f`.
    pub(crate) connect_failure: Option<Option<FakeFailure>>,
    /// Successful connections so far.
    pub(crate) connects: u32,
    /// `since_us` of the last process call per device index.
    pub(crate) last_since: Vec<(u32, u64)>,
    /// XID errors waiting for the next take.
    pub(crate) xids: Vec<(XidKey, u64)>,
}

/// A handle on the shared fake state; clones share it.
#[derive(Debug, Clone, Default)]
pub(crate) struct FakeNvml(pub(crate) Arc<Mutex<FakeState>>);

impl FakeNvml {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Changes the state (devices, failures) the next calls see.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        f(&mut self.0.lock().expect("fake nvml lock"))
    }

    /// A connector handing out this fake (or failing as scripted).
    pub(crate) fn connector(&self) -> Connect {
        let fake = self.clone();
        Box::new(move || {
            let mut s = fake.0.lock().expect("fake nvml lock");
            match s.connect_failure {
                Some(None) => Err(GpuError::LibraryMissing {
                    library: "fake-libnvidia-ml.so.1".into(),
                    source: NvmlError::LibraryNotFound,
                }),
                Some(Some(f)) => Err(GpuError::Init {
                    library: "fake-libnvidia-ml.so.1".into(),
                    source: f.error(),
                }),
                None => {
                    s.connects += 1;
                    drop(s);
                    Ok(Box::new(fake.clone()) as Box<dyn Nvml>)
                }
            }
        })
    }

    fn device_at(&self, index: u32, call: &'static str) -> Result<FakeDevice, GpuError> {
        let s = self.0.lock().expect("fake nvml lock");
        let d = s.devices.get(index as usize).ok_or(GpuError::Call {
            call,
            source: NvmlError::InvalidArg,
        })?;
        if let Some(f) = d.failure {
            return Err(GpuError::Call {
                call,
                source: f.error(),
            });
        }
        Ok(d.clone())
    }
}

impl Nvml for FakeNvml {
    fn driver(&mut self) -> DriverInfo {
        self.with(|s| s.driver.clone())
    }

    fn device_count(&mut self) -> Result<u32, GpuError> {
        let s = self.0.lock().expect("fake nvml lock");
        match s.count_failure {
            Some(f) => Err(GpuError::Call {
                call: "nvmlDeviceGetCount_v2",
                source: f.error(),
            }),
            None => Ok(s.devices.len() as u32),
        }
    }

    fn device(&mut self, index: u32) -> Result<DeviceReading, GpuError> {
        Ok(self
            .device_at(index, "nvmlDeviceGetHandleByIndex_v2")?
            .reading)
    }

    fn utilization(&mut self, index: u32) -> Result<Option<(u32, u32)>, GpuError> {
        let r = self
            .device_at(index, "nvmlDeviceGetUtilizationRates")?
            .reading;
        Ok(r.gpu_utilization_percent.zip(r.memory_utilization_percent))
    }

    fn processes(&mut self, index: u32, since_us: u64) -> Result<ProcessReading, GpuError> {
        const CALL: &str = "nvmlDeviceGetComputeRunningProcesses_v3";
        let d = self.device_at(index, "nvmlDeviceGetProcessUtilization")?;
        self.with(|s| s.last_since.push((index, since_us)));
        let samples = d.samples.map(|v| {
            v.into_iter()
                .filter(|s| s.timestamp_us > since_us)
                .collect()
        });
        match d.process_failure.map(FakeFailure::error) {
            Some(source) if takes_device_down(&source) => {
                Err(GpuError::Call { call: CALL, source })
            }
            Some(e) => Ok(ProcessReading {
                samples,
                memory: Vec::new(),
                failed: vec![FailedReading {
                    call: CALL,
                    error: error_name(&e),
                    detail: e.to_string(),
                }],
            }),
            None => Ok(ProcessReading {
                samples,
                memory: d.memory,
                failed: Vec::new(),
            }),
        }
    }

    fn take_xid_errors(&mut self) -> Vec<(XidKey, u64)> {
        self.with(|s| std::mem::take(&mut s.xids))
    }
}
