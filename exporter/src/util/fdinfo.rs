//! The fdinfo of a process's descriptors (`/proc/self/fdinfo`, `/proc/<pid>/fdinfo`), where
//! the kernel writes what each BPF map costs and each program has run: a process's own are
//! readable without any capability.

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
    read("/proc/self/fdinfo").unwrap_or_default()
}

/// The fdinfo of every descriptor in `dir` (`/proc/<pid>/fdinfo`); a descriptor closed while
/// it is read is skipped.
pub(crate) fn read(dir: &str) -> std::io::Result<Vec<FdInfo>> {
    Ok(std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .map(FdInfo)
        .collect())
}
