//! The on-demand trace stream: attaches `trace_sys_enter`/`trace_sys_exit`, points their
//! in-kernel filter at the target (`TRACE_CGROUPS` slot 0 for a cgroup, `TRACE_TARGETS` for a
//! pid), fills `TRACE_PATH_ARGS` so path arguments are copied, and reads `TRACE_EVENTS`.
//! Records the ring buffer could not hold are counted by the probes
//! (`PROBE_COUNTERS[TRACE_RINGBUF_FULL]`).

use std::{os::fd::AsRawFd, time::Duration};

use aya::maps::{Array, CgroupArray, HashMap as BpfHashMap, MapData, RingBuf};
use sysscope_abi::{maps, programs, TraceEvent};

use super::{session::Session, sink::EventSink, CliError};
use crate::{kernel::Probes, syscall_table};

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

pub(crate) struct EventStream {
    ring: RingBuf<MapData>,
    /// Records read so far.
    pub received: u64,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> CliError {
    move |source| CliError::Map { map, source }
}

/// Points the in-kernel target filter at the session's target: slot 0 of `TRACE_CGROUPS` for
/// a cgroup (descendants match), `TRACE_TARGETS` for a pid. The probes must have been loaded
/// with `session.load_options()`. Call before attaching anything.
pub(crate) fn set_target_filter(probes: &mut Probes, session: &Session) -> Result<(), CliError> {
    {
        if let Some(dir) = session.cgroup_dir() {
            let fd = std::fs::File::open(dir)
                .map_err(|e| CliError::io(format!("opening {}", dir.display()), e))?;
            let mut cgroups = CgroupArray::try_from(probes.map_mut(maps::TRACE_CGROUPS)?)
                .map_err(map_err(maps::TRACE_CGROUPS))?;
            cgroups
                .set(0, fd, 0)
                .map_err(map_err(maps::TRACE_CGROUPS))?;
        }
        if let Some(pid) = session.pid() {
            let mut targets: BpfHashMap<&mut MapData, u32, u8> =
                BpfHashMap::try_from(probes.map_mut(maps::TRACE_TARGETS)?)
                    .map_err(map_err(maps::TRACE_TARGETS))?;
            targets
                .insert(pid, 1, 0)
                .map_err(map_err(maps::TRACE_TARGETS))?;
        }
    }
    Ok(())
}

impl EventStream {
    /// Fills `TRACE_PATH_ARGS` and attaches the trace programs (after [`set_target_filter`]).
    pub(crate) fn attach(probes: &mut Probes, tool: &'static str) -> Result<Self, CliError> {
        {
            let mut paths: Array<&mut MapData, u8> =
                Array::try_from(probes.map_mut(maps::TRACE_PATH_ARGS)?)
                    .map_err(map_err(maps::TRACE_PATH_ARGS))?;
            for (name, index) in PATH_ARGS {
                if let Some(nr) = syscall_table::number(name) {
                    paths
                        .set(nr, index + 1, 0)
                        .map_err(map_err(maps::TRACE_PATH_ARGS))?;
                }
            }
        }
        let ring = RingBuf::try_from(probes.take_map(maps::TRACE_EVENTS)?)
            .map_err(map_err(maps::TRACE_EVENTS))?;
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

    /// Hands every record waiting in the ring buffer to `sink`.
    pub(crate) fn drain(&mut self, sink: &mut dyn EventSink) -> u64 {
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            if item.len() < std::mem::size_of::<TraceEvent>() {
                continue;
            }
            // SAFETY: the record holds at least one TraceEvent (checked above), written by
            // the probes with this layout; read_unaligned copes with any alignment.
            let event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<TraceEvent>()) };
            drop(item);
            sink.event(&event);
            n += 1;
        }
        self.received += n;
        n
    }
}
