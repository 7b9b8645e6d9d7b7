//! NVIDIA GPUs on the PCI bus, counted from sysfs without NVML: `sysscope_gpu_devices`.
//!
//! It tells a node without NVIDIA GPUs (nothing to collect, nothing to alert on) from a GPU
//! node whose driver or NVML library is missing (a real problem), which `sysscope_collector_up`
//! alone cannot. sysfs is not namespaced for PCI devices, so this works in a container too.

use std::path::Path;

/// Where the kernel lists PCI devices.
pub(crate) const SYSFS_PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// NVIDIA's PCI vendor id.
const NVIDIA_VENDOR: u32 = 0x10de;

/// PCI base class of display controllers (VGA 0x0300, 3D 0x0302): GPUs, not the audio, USB
/// or NVSwitch functions NVIDIA boards also expose.
const DISPLAY_CLASS: u32 = 0x03;

fn read_hex(path: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    u32::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
}

/// NVIDIA display controllers under `devices` (a sysfs `/sys/bus/pci/devices`); 0 when the
/// directory cannot be read.
pub(crate) fn count_nvidia_gpus(devices: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(devices) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            let dir = e.path();
            read_hex(&dir.join("vendor")) == Some(NVIDIA_VENDOR)
                && read_hex(&dir.join("class")).is_some_and(|c| c >> 16 == DISPLAY_CLASS)
        })
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_nvidia_display_controllers_only() {
        let dir = tempfile::tempdir().unwrap();
        let add = |name: &str, vendor: &str, class: &str| {
            let d = dir.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
        };
        add("0000:00:00.0", "0x8086", "0x060000");
        add("0000:3b:00.0", "0x10de", "0x030200"); // 3D controller (A100, H100)
        add("0000:3b:00.1", "0x10de", "0x040300"); // its HDMI audio function
        add("0000:af:00.0", "0x10de", "0x030000"); // VGA controller
        add("0000:c0:00.0", "0x10de", "0x068000"); // NVSwitch bridge
        add("0000:d0:00.0", "0x1af4", "0x030000"); // virtio GPU
        assert_eq!(count_nvidia_gpus(dir.path()), 2);
        assert_eq!(count_nvidia_gpus(&dir.path().join("missing")), 0);
    }
}
