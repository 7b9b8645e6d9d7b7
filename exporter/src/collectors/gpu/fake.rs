//! A scripted NVML behind the [`Nvml`] seam, for tests on machines without a GPU: the test
//! sets devices, readings and processes, and injects the failures the real driver has (a
//! device lost, NVML not answering, the library missing). It behaves like NVML where the
//! collector depends on it: process samples are returned only when newer than asked for.

use std::sync::{Arc, Mutex};

use nvml_wrapper::error::NvmlError;

use super::{Connect, DeviceReading, GpuError, Nvml, ProcessMemory, ProcessReading, ProcessSample};

/// A failure the fake can inject, turned into NVML's own error at each call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeFailure {
    /// The device fell off the bus.
    GpuLost,
    /// The driver is not loaded (e.g. being upgraded).
    DriverNotLoaded,
    /// Anything else.
    Unknown,
}

impl FakeFailure {
    fn error(self) -> NvmlError {
        match self {
            FakeFailure::GpuLost => NvmlError::GpuLost,
            FakeFailure::DriverNotLoaded => NvmlError::DriverNotLoaded,
            FakeFailure::Unknown => NvmlError::Unknown,
        }
    }
}

/// One fake device.
#[derive(Debug, Clone, Default)]
pub struct FakeDevice {
    pub reading: DeviceReading,
    /// Every sample ever taken; calls return those newer than asked for.
    pub samples: Vec<ProcessSample>,
    pub memory: Vec<ProcessMemory>,
    /// Every call on this device fails with it.
    pub failure: Option<FakeFailure>,
    /// Only the process calls fail with it.
    pub process_failure: Option<FakeFailure>,
}

#[derive(Debug, Default)]
pub struct FakeState {
    /// In NVML enumeration order: removing one shifts the indices of the next, like NVML.
    pub devices: Vec<FakeDevice>,
    /// `nvmlDeviceGetCount` fails with it (NVML itself not answering).
    pub count_failure: Option<FakeFailure>,
    /// Connecting fails: `Some(None)` as if the library were missing, `Some(Some(f))` as if
    /// initialisation failed with `f`.
    pub connect_failure: Option<Option<FakeFailure>>,
    /// Successful connections so far.
    pub connects: u32,
    /// `since_us` of the last process call per device index.
    pub last_since: Vec<(u32, u64)>,
}

/// A handle on the shared fake state; clones share it.
#[derive(Debug, Clone, Default)]
pub struct FakeNvml(pub Arc<Mutex<FakeState>>);

impl FakeNvml {
    pub fn new() -> Self {
        Self::default()
    }

    /// Changes the state (devices, failures) the next calls see.
    pub fn with<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        f(&mut self.0.lock().expect("fake nvml lock"))
    }

    /// A connector handing out this fake (or failing as scripted).
    pub fn connector(&self) -> Connect {
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
    fn device_count(&mut self) -> Result<u32, GpuError> {
        let s = self.0.lock().expect("fake nvml lock");
        match s.count_failure {
            Some(f) => Err(GpuError::Call {
                call: "nvmlDeviceGetCount",
                source: f.error(),
            }),
            None => Ok(s.devices.len() as u32),
        }
    }

    fn device(&mut self, index: u32) -> Result<DeviceReading, GpuError> {
        Ok(self.device_at(index, "nvmlDeviceGetHandleByIndex")?.reading)
    }

    fn processes(&mut self, index: u32, since_us: u64) -> Result<ProcessReading, GpuError> {
        let d = self.device_at(index, "nvmlDeviceGetProcessUtilization")?;
        if let Some(f) = d.process_failure {
            return Err(GpuError::Call {
                call: "nvmlDeviceGetProcessUtilization",
                source: f.error(),
            });
        }
        self.with(|s| s.last_since.push((index, since_us)));
        Ok(ProcessReading {
            samples: d
                .samples
                .into_iter()
                .filter(|s| s.timestamp_us > since_us)
                .collect(),
            memory: d.memory,
        })
    }
}
