//! The fdinfo of this process's own descriptors (`/proc/self/fdinfo`), where the kernel writes
//! what each BPF map costs and each program has run: readable without any capability.

/// One descriptor's fdinfo.
#[derive(Debug)]
pub(crate) struct FdInfo(String);

impl FdInfo {
    /// The number after `name` (e.g. `"prog_id:"`), if the descriptor has that field.
    pub(crate) fn field(&self, name: &str) -> Option<u64> {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    }
}

/// The fdinfo of every descriptor this process holds (none if `/proc` cannot be read).
pub(crate) fn own() -> Vec<FdInfo> {
    let Ok(fds) = std::fs::read_dir("/proc/self/fdinfo") else {
        return Vec::new();
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .map(FdInfo)
        .collect()
}
