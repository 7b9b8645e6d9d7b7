//! The on-demand trace family (`ebpf/probes/src/trace.rs`) from user space: points the
//! programs' in-kernel filter at a target (slot 0 of `TRACE_CGROUPS` for a cgroup, descendants
//! included; `TRACE_TARGETS` for a tgid), fills `TRACE_PATH_ARGS` so path arguments are copied,
//! attaches `trace_sys_enter`/`trace_sys_exit` and reads their records from the `TRACE_EVENTS`
//! ring buffer. `TRACE_EVENTS` and `TRACE_THREADS` are sized at load time
//! ([`super::LoadOptions`]); records the ring buffer could not hold are counted by the probes
//! (`PROBE_COUNTERS[TRACE_RINGBUF_FULL]`, read through [`super::counters`]). The command-line
//! tools use it; they decode and render the records.

use std::{os::fd::AsRawFd, time::Duration};

use aya::maps::{Array, CgroupArray, HashMap as BpfHashMap, MapData, RingBuf};
use sysscope_abi::{maps, programs, TraceEvent};

use super::{read_err, ring, ProbeError, Probes};
use crate::syscall_table;

/// Syscalls with a user-space path argument, and its index: what `TRACE_PATH_ARGS` lists.
/// Names missing on an architecture (aarch64 has no `open`) are skipped.
pub(crate) const PATH_ARGS: &[(&str, u8)] = &[
    ("open", 0),
    ("creat", 0),
    ("openat", 1),
    ("openat2", 1),
    ("stat", 0),
    ("lstat", 0),
    ("newfstatat", 1),
    ("statx", 1),
    ("statfs", 0),
    ("access", 0),
    ("faccessat", 1),
    ("faccessat2", 1),
    ("execve", 0),
    ("execveat", 1),
    ("unlink", 0),
    ("unlinkat", 1),
    ("mkdir", 0),
    ("mkdirat", 1),
    ("rmdir", 0),
    ("rename", 0),
    ("renameat", 1),
    ("renameat2", 1),
    ("readlink", 0),
    ("readlinkat", 1),
    ("chdir", 0),
    ("chroot", 0),
    ("truncate", 0),
    ("chmod", 0),
    ("fchmodat", 1),
    ("chown", 0),
    ("lchown", 0),
    ("fchownat", 1),
    ("link", 0),
    ("linkat", 1),
    ("symlink", 1),
    ("symlinkat", 2),
    ("utimensat", 1),
    ("mknod", 0),
    ("mknodat", 1),
    ("getxattr", 0),
    ("lgetxattr", 0),
    ("setxattr", 0),
    ("lsetxattr", 0),
    ("listxattr", 0),
    ("inotify_add_watch", 1),
];

/// The index of the path argument of syscall `nr`, if it has one.
pub(crate) fn path_arg(nr: u32) -> Option<usize> {
    let name = syscall_table::name(nr)?;
    PATH_ARGS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, i)| *i as usize)
}

/// Points the in-kernel target filter at a target: `cgroup` (an open cgroup directory;
/// descendants match) goes to slot 0 of `TRACE_CGROUPS`, `pid` to `TRACE_TARGETS`. The probes
/// must have been loaded with the matching [`super::LoadOptions`] (`trace_cgroup_id`,
/// `trace_filter_tgids`). Call before attaching anything.
pub(crate) fn set_target_filter(
    probes: &mut Probes,
    cgroup: Option<&std::fs::File>,
    pid: Option<u32>,
) -> Result<(), ProbeError> {
    if let Some(dir) = cgroup {
        let mut cgroups = CgroupArray::try_from(probes.map_mut(maps::TRACE_CGROUPS)?)
            .map_err(read_err(maps::TRACE_CGROUPS))?;
        cgroups
            .set(0, dir.as_raw_fd(), 0)
            .map_err(read_err(maps::TRACE_CGROUPS))?;
    }
    if let Some(pid) = pid {
        let mut targets: BpfHashMap<&mut MapData, u32, u8> =
            BpfHashMap::try_from(probes.map_mut(maps::TRACE_TARGETS)?)
                .map_err(read_err(maps::TRACE_TARGETS))?;
        targets
            .insert(pid, 1, 0)
            .map_err(read_err(maps::TRACE_TARGETS))?;
    }
    Ok(())
}

/// The attached trace programs and their ring buffer.
pub(crate) struct TraceEvents {
    ring: RingBuf<MapData>,
    /// Records read so far.
    pub(crate) received: u64,
}

impl std::fmt::Debug for TraceEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceEvents")
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

impl TraceEvents {
    /// Fills `TRACE_PATH_ARGS`, takes `TRACE_EVENTS` and attaches the trace programs under
    /// `tool` (after [`set_target_filter`]).
    pub(crate) fn attach(probes: &mut Probes, tool: &'static str) -> Result<Self, ProbeError> {
        {
            let mut paths: Array<&mut MapData, u8> =
                Array::try_from(probes.map_mut(maps::TRACE_PATH_ARGS)?)
                    .map_err(read_err(maps::TRACE_PATH_ARGS))?;
            for (name, index) in PATH_ARGS {
                if let Some(nr) = syscall_table::number(name) {
                    paths
                        .set(nr, index + 1, 0)
                        .map_err(read_err(maps::TRACE_PATH_ARGS))?;
                }
            }
        }
        let ring = RingBuf::try_from(probes.take_map(maps::TRACE_EVENTS)?)
            .map_err(read_err(maps::TRACE_EVENTS))?;
        probes.attach_raw_tracepoint(tool, programs::TRACE_SYS_EXIT, "sys_exit")?;
        probes.attach_raw_tracepoint(tool, programs::TRACE_SYS_ENTER, "sys_enter")?;
        Ok(Self { ring, received: 0 })
    }

    /// Waits up to `timeout` for records (here, or in the ring buffer behind `also`).
    pub(crate) fn wait(&self, timeout: Duration, also: Option<i32>) {
        let poll = |fd: i32| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut fds = [poll(self.ring.as_raw_fd()), poll(also.unwrap_or(-1))];
        let n = if also.is_some() { 2 } else { 1 };
        // SAFETY: `n` valid pollfds; an interrupted or failed poll just returns early.
        unsafe { libc::poll(fds.as_mut_ptr(), n, timeout.as_millis() as i32) };
    }

    /// Hands every record waiting in the ring buffer to `each`; returns how many.
    pub(crate) fn drain(&mut self, mut each: impl FnMut(&TraceEvent)) -> u64 {
        let n = ring::drain(&mut self.ring, |e| each(e));
        self.received += n;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_arguments_are_found_by_syscall_number() {
        let nr = |name| syscall_table::number(name).unwrap();
        assert_eq!(path_arg(nr("openat")), Some(1));
        assert_eq!(path_arg(nr("execve")), Some(0));
        assert_eq!(path_arg(nr("symlinkat")), Some(2));
        assert_eq!(path_arg(nr("read")), None);
        // Syscalls take at most six arguments, and each is listed once.
        let mut names: Vec<&str> = PATH_ARGS.iter().map(|(n, _)| *n).collect();
        assert!(PATH_ARGS.iter().all(|(_, i)| *i < 6));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PATH_ARGS.len());
    }
}
