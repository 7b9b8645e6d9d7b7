//! Block device names: the kernel's `dev_t` (as the block probes record it, a 20-bit minor)
//! -> the disk name the kernel uses (`vda`, `nvme0n1`, `loop3`, `dm-0`).
//!
//! Read from `/sys/dev/block/<major>:<minor>/uevent` (`DEVNAME=`), falling back to
//! `/proc/partitions`, and cached for a while: minors of dynamic majors (NVMe, device-mapper)
//! may be handed to another disk after a hot-unplug.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use sysscope_abi::dev;

/// Label of requests whose disk the probe could not read.
pub(crate) const UNKNOWN_DEVICE: &str = "unknown";

#[derive(Debug)]
pub(crate) struct DeviceResolver {
    sys_root: PathBuf,
    proc_root: PathBuf,
    ttl: Duration,
    cache: HashMap<u32, (Arc<str>, Instant)>,
}

impl Default for DeviceResolver {
    fn default() -> Self {
        Self::new("/sys".into(), "/proc".into(), Duration::from_secs(60))
    }
}

impl DeviceResolver {
    pub(crate) fn new(sys_root: PathBuf, proc_root: PathBuf, ttl: Duration) -> Self {
        Self {
            sys_root,
            proc_root,
            ttl,
            cache: HashMap::new(),
        }
    }

    /// The name of kernel device `dev`; `major:minor` when the device is gone or unknown.
    pub(crate) fn resolve(&mut self, kdev: u32) -> Arc<str> {
        if kdev == 0 {
            return Arc::from(UNKNOWN_DEVICE);
        }
        if let Some((name, at)) = self.cache.get(&kdev) {
            if at.elapsed() < self.ttl {
                return name.clone();
            }
        }
        let (major, minor) = (dev::major(kdev), dev::minor(kdev));
        let name: Arc<str> = match self
            .read_sysfs(major, minor)
            .or_else(|| self.read_partitions(major, minor))
        {
            Some(n) => Arc::from(n.as_str()),
            // Gone: keep the name we knew, else the numbers (still a stable label).
            None => match self.cache.get(&kdev) {
                Some((n, _)) => n.clone(),
                None => Arc::from(format!("{major}:{minor}").as_str()),
            },
        };
        self.cache.insert(kdev, (name.clone(), Instant::now()));
        name
    }

    fn read_sysfs(&self, major: u32, minor: u32) -> Option<String> {
        let path = self
            .sys_root
            .join(format!("dev/block/{major}:{minor}/uevent"));
        parse_uevent_devname(&std::fs::read_to_string(path).ok()?)
    }

    fn read_partitions(&self, major: u32, minor: u32) -> Option<String> {
        let text = std::fs::read_to_string(self.proc_root.join("partitions")).ok()?;
        parse_partitions(&text, major, minor)
    }
}

/// `DEVNAME=` of a uevent file (`MAJOR=7\nMINOR=0\nDEVNAME=loop0\nDEVTYPE=disk\n`).
pub(crate) fn parse_uevent_devname(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .map(|n| sanitize(n.trim()))
        .filter(|n| !n.is_empty())
}

/// The name of `major:minor` in `/proc/partitions` (`major minor #blocks name` rows).
pub(crate) fn parse_partitions(text: &str, major: u32, minor: u32) -> Option<String> {
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let ma: u32 = f.next()?.parse().ok()?;
        let mi: u32 = f.next()?.parse().ok()?;
        let _blocks = f.next()?;
        let name = f.next()?;
        (ma == major && mi == minor).then(|| sanitize(name))
    })
}

/// Names under /dev may have subdirectories (`mapper/x` is a symlink, but `DEVNAME` can be
/// e.g. `bus/...` for odd drivers): keep them, only drop control characters.
fn sanitize(name: &str) -> String {
    name.chars().filter(|c| !c.is_control()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys/dev/block");
        for (majmin, uevent) in [
            (
                "7:3",
                "MAJOR=7\nMINOR=3\nDEVNAME=loop3\nDEVTYPE=disk\nDISKSEQ=12\n",
            ),
            (
                "259:0",
                "MAJOR=259\nMINOR=0\nDEVNAME=nvme0n1\nDEVTYPE=disk\n",
            ),
            ("253:0", "MAJOR=253\nMINOR=0\nDEVTYPE=disk\n"),
        ] {
            std::fs::create_dir_all(sys.join(majmin)).unwrap();
            std::fs::write(sys.join(majmin).join("uevent"), uevent).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        std::fs::write(
            dir.path().join("proc/partitions"),
            "major minor  #blocks  name\n\n 254        0  268435456 vda\n 253        0    1048576 dm-0\n   7        3     131072 loop3\n",
        )
        .unwrap();
        dir
    }

    fn resolver(dir: &tempfile::TempDir) -> DeviceResolver {
        DeviceResolver::new(
            dir.path().join("sys"),
            dir.path().join("proc"),
            Duration::from_secs(60),
        )
    }

    #[test]
    fn names_from_sysfs_then_partitions_then_numbers() {
        let dir = fake_tree();
        let mut r = resolver(&dir);
        assert_eq!(&*r.resolve(dev::make(7, 3)), "loop3");
        assert_eq!(&*r.resolve(dev::make(259, 0)), "nvme0n1");
        // uevent without DEVNAME: /proc/partitions knows it.
        assert_eq!(&*r.resolve(dev::make(253, 0)), "dm-0");
        // Only in /proc/partitions.
        assert_eq!(&*r.resolve(dev::make(254, 0)), "vda");
        // Nowhere: the numbers.
        assert_eq!(&*r.resolve(dev::make(8, 16)), "8:16");
        assert_eq!(&*r.resolve(0), UNKNOWN_DEVICE);
    }

    #[test]
    fn kernel_dev_t_is_not_userspace_dev_t() {
        // 259:1 in the kernel's encoding is (259 << 20) | 1; glibc's makedev would give
        // 0x10301. Only the former is what the probes record.
        let dir = fake_tree();
        std::fs::create_dir_all(dir.path().join("sys/dev/block/259:1")).unwrap();
        std::fs::write(
            dir.path().join("sys/dev/block/259:1/uevent"),
            "DEVNAME=nvme0n1p1\n",
        )
        .unwrap();
        let mut r = resolver(&dir);
        assert_eq!(&*r.resolve((259 << 20) | 1), "nvme0n1p1");
    }

    #[test]
    fn a_vanished_device_keeps_its_last_name() {
        let dir = fake_tree();
        let mut r = DeviceResolver::new(
            dir.path().join("sys"),
            dir.path().join("proc"),
            Duration::ZERO,
        );
        assert_eq!(&*r.resolve(dev::make(7, 3)), "loop3");
        std::fs::remove_dir_all(dir.path().join("sys/dev/block/7:3")).unwrap();
        std::fs::write(dir.path().join("proc/partitions"), "").unwrap();
        assert_eq!(&*r.resolve(dev::make(7, 3)), "loop3");
    }

    #[test]
    fn parsers() {
        assert_eq!(
            parse_uevent_devname("MAJOR=8\nDEVNAME=sda\n").as_deref(),
            Some("sda")
        );
        assert_eq!(parse_uevent_devname("MAJOR=8\n"), None);
        assert_eq!(
            parse_partitions(" 8 16 100 sdb\n 8 17 50 sdb1\n", 8, 17).as_deref(),
            Some("sdb1")
        );
        assert_eq!(parse_partitions("garbage\n", 8, 17), None);
    }

    #[test]
    fn resolves_a_real_device_of_this_machine() {
        // Any block device listed by the kernel must resolve to its own name.
        let Ok(text) = std::fs::read_to_string("/proc/partitions") else {
            return;
        };
        let mut r = DeviceResolver::default();
        for line in text.lines().skip(2) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() == 4 {
                let (ma, mi): (u32, u32) = (f[0].parse().unwrap(), f[1].parse().unwrap());
                assert_eq!(&*r.resolve(dev::make(ma, mi)), f[3], "{line}");
            }
        }
    }
}
