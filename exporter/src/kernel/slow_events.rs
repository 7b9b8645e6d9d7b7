//! The slow-call samples: `SLOW_EVENTS`, the ring buffer to which `sys_exit` writes a
//! `SlowCallEvent` for each call slower than its `SLOW_THRESHOLDS` entry (within the per-CPU
//! budget of `SLOW_RATE`; see `ebpf/probes/src/syscalls.rs`). Taken from the probes at start-up
//! and handed to the span source (`crate::spans`), which waits on its descriptor and reads the
//! records as they come.

use std::os::fd::{AsRawFd, RawFd};

use aya::maps::{MapData, RingBuf};
use sysscope_abi::{maps, SlowCallEvent};

use super::{ring, ProbeError, Probes};

/// A record too short to be a `SlowCallEvent` (counted by the reader as malformed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed;

/// `SLOW_EVENTS`, taken from the probes.
pub(crate) struct SlowEvents(RingBuf<MapData>);

impl std::fmt::Debug for SlowEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlowEvents").finish_non_exhaustive()
    }
}

impl SlowEvents {
    /// Takes `SLOW_EVENTS` from the loaded object.
    pub(crate) fn take(probes: &mut Probes) -> Result<Self, ProbeError> {
        RingBuf::try_from(probes.take_map(maps::SLOW_EVENTS)?)
            .map(Self)
            .map_err(|source| ProbeError::Map {
                map: maps::SLOW_EVENTS.into(),
                source,
            })
    }

    /// The next record waiting, if any.
    pub(crate) fn next(&mut self) -> Option<Result<SlowCallEvent, Malformed>> {
        let item = self.0.next()?;
        Some(ring::record(&item).ok_or(Malformed))
    }
}

/// The ring buffer's descriptor: readable when records are committed.
impl AsRawFd for SlowEvents {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
