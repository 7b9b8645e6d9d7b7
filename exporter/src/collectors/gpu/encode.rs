//! The GPU collector's families (see the module docs of [`super`] for what each reads): the
//! devices and their identity, the per-device gauges (one table), clocks, counters, errors,
//! MIG instances and per-process series, in that order.

use std::borrow::Cow;

use prometheus_client::{
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
};

use super::{Device, GpuCollector, ProcessSeries, CLOCK_EVENT_REASONS};
use crate::sources::nvml::{DeviceReading, MigInstance};

/// A GPU that answered at the last refresh: its index (the `gpu` label), uuid, state and
/// reading.
type Up<'a> = (String, &'a str, &'a Device, &'a DeviceReading);

impl GpuCollector {
    /// Every family, in the order they have always been exposed.
    pub(super) fn encode_families(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let up = self.answering();
        self.encode_devices(encoder)?;
        encode_device_gauges(encoder, &up)?;
        encode_clocks(encoder, &up)?;
        encode_counters(encoder, &up)?;
        self.encode_errors(encoder)?;
        encode_mig(encoder, &up)?;
        self.encode_processes(encoder, &up)
    }

    fn answering(&self) -> Vec<Up<'_>> {
        self.devices
            .iter()
            .filter_map(|(uuid, d)| {
                d.reading
                    .as_ref()
                    .map(|r| (d.index.to_string(), uuid.as_str(), d, r))
            })
            .collect()
    }

    /// How many GPUs there are, which answer, and what each is.
    fn encode_devices(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        encoder
            .encode_descriptor(
                "sysscope_gpu_devices",
                "NVIDIA GPUs on the PCI bus (sysfs), whether or not NVML can be loaded; 0 on a node without NVIDIA GPUs.",
                None,
                MetricType::Gauge,
            )?
            .encode_gauge(&(self.pci_devices as i64))?;
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
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_gpu_info",
                "Identity of each GPU sysscope has seen (always 1): model, driver and CUDA version, the NVML library file loaded, PCI bus id and serial number where NVML reports them.",
                None,
                MetricType::Gauge,
            )?;
            for (uuid, d) in &self.devices {
                let gpu = d.index.to_string();
                let mut labels: Vec<(&str, &str)> = vec![("gpu", &gpu), ("uuid", uuid)];
                for (name, value) in [
                    ("model", &d.info.model),
                    ("driver_version", &self.driver.driver_version),
                    ("cuda_version", &self.driver.cuda_version),
                    ("nvml_library", &self.driver.nvml_library),
                    ("pci_bus_id", &d.info.pci_bus_id),
                    ("serial", &d.info.serial),
                ] {
                    if let Some(v) = value {
                        labels.push((name, v));
                    }
                }
                family.encode_family(&labels)?.encode_gauge(&1i64)?;
            }
        }
        Ok(())
    }

    /// XID events and failed NVML calls.
    fn encode_errors(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_gpu_xid_errors",
                "XID errors NVML reported as critical-error events since sysscope started, by XID code (nvidia-smi and the kernel log print them as `NVRM: Xid`).",
                None,
                MetricType::Counter,
            )?;
            for (key, n) in &self.xids {
                let gpu = self.devices.get(&key.uuid).map(|d| d.index.to_string());
                let xid = key
                    .xid
                    .map_or_else(|| "unknown".to_string(), |x| x.to_string());
                let mut labels: Vec<(&str, &str)> = Vec::with_capacity(3);
                if let Some(gpu) = &gpu {
                    labels.push(("gpu", gpu));
                }
                labels.push(("uuid", &key.uuid));
                labels.push(("xid", &xid));
                family
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, u64, u64>(n, None)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "sysscope_gpu_nvml_errors",
                "NVML calls that failed on a GPU that otherwise answered, by call and NVML error (no_permission, insufficient_size, unknown, ...): the readings behind them are absent meanwhile. A GPU that is lost shows in sysscope_gpu_device_up instead.",
                None,
                MetricType::Counter,
            )?;
            for ((uuid, call, error), n) in &self.failed_readings {
                let gpu = self.devices.get(uuid).map(|d| d.index.to_string());
                let mut labels: Vec<(&str, &str)> = Vec::with_capacity(4);
                if let Some(gpu) = &gpu {
                    labels.push(("gpu", gpu));
                }
                labels.extend([("uuid", uuid.as_str()), ("call", call), ("error", error)]);
                family
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, u64, u64>(n, None)?;
            }
        }
        Ok(())
    }

    /// The per-process series, and how many processes did not fit.
    fn encode_processes(
        &self,
        encoder: &mut DescriptorEncoder<'_>,
        up: &[Up<'_>],
    ) -> std::fmt::Result {
        type PickProcess = fn(&ProcessSeries) -> Option<f64>;
        let process_gauges: [(&str, &str, PickProcess); 3] = [
            (
                "sysscope_gpu_process_sm_utilization_ratio",
                "Share of the process's last sample period during which its kernels ran (nvidia-smi pmon `sm`); 0 when NVML has no sample since the previous refresh, absent where the GPU cannot sample processes (MIG mode).",
                |p| p.sm,
            ),
            (
                "sysscope_gpu_process_memory_utilization_ratio",
                "Share of the process's last sample period during which it read or wrote device memory (nvidia-smi pmon `mem`).",
                |p| p.memory,
            ),
            (
                "sysscope_gpu_process_memory_used_bytes",
                "Device memory the process holds (nvidia-smi pmon `fb`, --query-compute-apps used_memory).",
                |p| p.used_bytes.map(|b| b as f64),
            ),
        ];
        let mut labels: Vec<(&'static str, Cow<'_, str>)> = Vec::with_capacity(10);
        for (name, help, pick) in process_gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (gpu, uuid, device, _) in up {
                for p in &device.processes {
                    let Some(v) = pick(p) else { continue };
                    labels.clear();
                    labels.push(("gpu", Cow::Borrowed(gpu.as_str())));
                    labels.push(("uuid", Cow::Borrowed(*uuid)));
                    if let Some(gi) = p.gpu_instance {
                        labels.push(("gpu_instance", Cow::Owned(gi.to_string())));
                    }
                    if let Some(ci) = p.compute_instance {
                        labels.push(("compute_instance", Cow::Owned(ci.to_string())));
                    }
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

/// The per-device gauges: one table row each.
fn encode_device_gauges(encoder: &mut DescriptorEncoder<'_>, up: &[Up<'_>]) -> std::fmt::Result {
    for (name, help, pick) in DEVICE_GAUGES {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (gpu, uuid, _, reading) in up {
            if let Some(v) = pick(reading) {
                family
                    .encode_family(&[("gpu", gpu.as_str()), ("uuid", *uuid)])?
                    .encode_gauge(&v)?;
            }
        }
    }
    Ok(())
}

/// One gauge per GPU that answered: the family's name, help, and its value from the reading
/// (absent where NVML gave none).
type DeviceGauge = (
    &'static str,
    &'static str,
    fn(&DeviceReading) -> Option<f64>,
);

/// The per-device gauges, in exposition order. NVML reports no utilisation for a GPU in MIG
/// mode (NotSupported), so a partitioned GPU has no utilisation series: nothing to misread as
/// one instance's.
const DEVICE_GAUGES: [DeviceGauge; 6] = [
    (
        "sysscope_gpu_utilization_ratio",
        "Share of the last sample period during which a kernel ran on the GPU (nvidia-smi dmon `sm`); absent for a GPU in MIG mode, which NVML does not sample.",
        |r| r.gpu_utilization_percent.map(|p| p as f64 / 100.0),
    ),
    (
        "sysscope_gpu_memory_utilization_ratio",
        "Share of the last sample period during which device memory was read or written (nvidia-smi dmon `mem`; not the share of memory in use); absent for a GPU in MIG mode.",
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

/// Clock frequencies by domain, and why the clocks are held down.
fn encode_clocks(encoder: &mut DescriptorEncoder<'_>, up: &[Up<'_>]) -> std::fmt::Result {
    {
        let mut family = encoder.encode_descriptor(
                "sysscope_gpu_clock_hertz",
                "Current clock of the GPU by domain (nvidia-smi dmon `pclk` is graphics, `mclk` memory).",
                None,
                MetricType::Gauge,
            )?;
        for (gpu, uuid, _, r) in up {
            for (clock, mhz) in [
                ("graphics", r.graphics_clock_mhz),
                ("sm", r.sm_clock_mhz),
                ("memory", r.memory_clock_mhz),
            ] {
                if let Some(mhz) = mhz {
                    family
                        .encode_family(&[("gpu", gpu.as_str()), ("uuid", *uuid), ("clock", clock)])?
                        .encode_gauge(&(mhz as f64 * 1e6))?;
                }
            }
        }
    }
    {
        let mut family = encoder.encode_descriptor(
                "sysscope_gpu_clock_event_reason_active",
                "1 while NVML reports this reason for holding the GPU's clocks below their maximum (clocks event reasons, formerly throttle reasons; nvidia-smi -q -d PERFORMANCE), else 0.",
                None,
                MetricType::Gauge,
            )?;
        for (gpu, uuid, _, r) in up {
            let Some(mask) = r.clocks_event_reasons else {
                continue;
            };
            let known = CLOCK_EVENT_REASONS.iter().fold(0, |a, (bit, _)| a | bit);
            let reasons = CLOCK_EVENT_REASONS
                .iter()
                .map(|(bit, reason)| (*reason, mask & bit != 0))
                .chain([("other", mask & !known != 0)]);
            for (reason, on) in reasons {
                family
                    .encode_family(&[("gpu", gpu.as_str()), ("uuid", *uuid), ("reason", reason)])?
                    .encode_gauge(&(on as i64))?;
            }
        }
    }
    Ok(())
}

/// Energy drawn and ECC errors.
fn encode_counters(encoder: &mut DescriptorEncoder<'_>, up: &[Up<'_>]) -> std::fmt::Result {
    {
        let mut family = encoder.encode_descriptor(
                "sysscope_gpu_energy_joules",
                "Energy the GPU drew since its driver was loaded (nvmlDeviceGetTotalEnergyConsumption); resets when the driver reloads.",
                None,
                MetricType::Counter,
            )?;
        for (gpu, uuid, _, r) in up {
            if let Some(mj) = r.energy_millijoules {
                family
                    .encode_family(&[("gpu", gpu.as_str()), ("uuid", *uuid)])?
                    .encode_counter::<NoLabelSet, f64, u64>(&(mj as f64 / 1000.0), None)?;
            }
        }
    }
    {
        let mut family = encoder.encode_descriptor(
                "sysscope_gpu_ecc_errors",
                "Memory errors ECC detected since the driver was loaded (NVML volatile counts), corrected (single-bit) or uncorrected (double-bit); absent where ECC is off or not supported.",
                None,
                MetricType::Counter,
            )?;
        for (gpu, uuid, _, r) in up {
            if let Some(ecc) = r.ecc {
                for (error, n) in [
                    ("corrected", ecc.corrected),
                    ("uncorrected", ecc.uncorrected),
                ] {
                    family
                        .encode_family(&[("gpu", gpu.as_str()), ("uuid", *uuid), ("error", error)])?
                        .encode_counter::<NoLabelSet, u64, u64>(&n, None)?;
                }
            }
        }
    }
    Ok(())
}

/// Memory of each MIG instance.
fn encode_mig(encoder: &mut DescriptorEncoder<'_>, up: &[Up<'_>]) -> std::fmt::Result {
    type PickMig = fn(&MigInstance) -> Option<u64>;
    let mig_gauges: [(&str, &str, PickMig); 2] = [
            (
                "sysscope_gpu_mig_memory_used_bytes",
                "Device memory allocated in one MIG instance (a compute instance of a GPU instance) of a GPU in MIG mode.",
                |m| m.memory_used_bytes,
            ),
            (
                "sysscope_gpu_mig_memory_total_bytes",
                "Device memory of one MIG instance of a GPU in MIG mode.",
                |m| m.memory_total_bytes,
            ),
        ];
    for (name, help, pick) in mig_gauges {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (gpu, uuid, _, r) in up {
            for m in r.mig.iter().flat_map(|m| &m.instances) {
                let Some(v) = pick(m) else { continue };
                let gi = m.gpu_instance.map(|i| i.to_string());
                let ci = m.compute_instance.map(|i| i.to_string());
                let mut labels: Vec<(&str, &str)> = vec![
                    ("gpu", gpu.as_str()),
                    ("uuid", *uuid),
                    ("mig_uuid", &m.uuid),
                ];
                for (name, value) in [
                    ("gpu_instance", &gi),
                    ("compute_instance", &ci),
                    ("profile", &m.profile),
                ] {
                    if let Some(v) = value {
                        labels.push((name, v));
                    }
                }
                family.encode_family(&labels)?.encode_gauge(&(v as f64))?;
            }
        }
    }
    Ok(())
}
