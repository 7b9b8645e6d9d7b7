//! The slow-call samples: `SLOW_EVENTS`, the ring buffer to which `sys_exit` writes a
//! `SlowCallEvent` for each call slower than its `SLOW_THRESHOLDS` entry (within the per-CPU
//! budget of `SLOW_RATE`; see `ebpf/probes/src/syscalls.rs`). Taken from the probes at start-up
//! and handed to the span source (`crate::spans`), which waits on its descriptor and reads the
//! records as they come. Also `SLOW_THRESHOLDS` ([`SlowThresholds`]), which decides what is slow,
//! written at start and at each reload.

use std::os::fd::{AsRawFd, RawFd};

use aya::maps::{Array, MapData, MapError, RingBuf};
use sysscope_abi::{maps, SlowCallEvent};

use super::{ring, ProbeError, Probes};

/// A record too short to be a `SlowCallEvent` (counted by the reader as malformed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// One slow-call record: the event, and the name of its file that the kernel wrote after it
/// (empty when it read none; see `sysscope_abi::FileIdentity`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowRecord {
    pub event: SlowCallEvent,
    pub file_name: Vec<u8>,
}

impl SlowRecord {
    /// The record the probes wrote in `bytes`; `None` when it is too short to hold an event.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let event = ring::record::<SlowCallEvent>(bytes)?;
        let file_name = bytes
            .get(std::mem::size_of::<SlowCallEvent>()..)
            .unwrap_or_default()
            .to_vec();
        Some(Self { event, file_name })
    }
}

/// `SLOW_EVENTS`, taken from the probes.
pub struct SlowEvents(RingBuf<MapData>);

impl std::fmt::Debug for SlowEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlowEvents").finish_non_exhaustive()
    }
}

impl SlowEvents {
    /// Takes `SLOW_EVENTS` from the loaded object.
    pub fn take(probes: &mut Probes) -> Result<Self, ProbeError> {
        RingBuf::try_from(probes.take_map(maps::SLOW_EVENTS)?)
            .map(Self)
            .map_err(|source| ProbeError::Map {
                map: maps::SLOW_EVENTS.into(),
                source,
            })
    }
}

/// The records waiting, oldest first; `None` when none is committed (the ring buffer's
/// descriptor tells when more come).
impl Iterator for SlowEvents {
    type Item = Result<SlowRecord, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = self.0.next()?;
        Some(SlowRecord::decode(&item).ok_or(Malformed))
    }
}

/// The ring buffer's descriptor: readable when records are committed.
impl AsRawFd for SlowEvents {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// `SLOW_THRESHOLDS`: per syscall number, the duration from which `sys_exit` samples a call
/// to `SLOW_EVENTS` (0: never). Written at start and at each reload.
pub struct SlowThresholds(Array<MapData, u64>);

impl SlowThresholds {
    /// Takes `SLOW_THRESHOLDS` from the loaded object.
    pub fn take(probes: &mut Probes) -> Result<Self, ProbeError> {
        Array::try_from(probes.take_map(maps::SLOW_THRESHOLDS)?)
            .map(Self)
            .map_err(threshold_err)
    }

    /// Writes every syscall's threshold in nanoseconds, by syscall number.
    pub fn write(&mut self, thresholds_ns: &[u64]) -> Result<(), ProbeError> {
        for (nr, ns) in thresholds_ns.iter().enumerate() {
            self.0.set(nr as u32, ns, 0).map_err(threshold_err)?;
        }
        Ok(())
    }
}

fn threshold_err(source: MapError) -> ProbeError {
    ProbeError::Map {
        map: maps::SLOW_THRESHOLDS.into(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sysscope_abi::CallStamp;

    #[test]
    fn records_carry_the_name_after_the_event() {
        let event = SlowCallEvent {
            call: CallStamp {
                start_ns: 10,
                end_ns: 30,
                tgid: 42,
                ..CallStamp::default()
            },
            nr: 0,
            args: [3, 0, 64, 0, 0, 0],
            ..SlowCallEvent::default()
        };
        // SAFETY: a plain #[repr(C)] value viewed as its own bytes, while it lives.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&event as *const SlowCallEvent).cast::<u8>(),
                std::mem::size_of::<SlowCallEvent>(),
            )
        };
        let mut record = bytes.to_vec();
        let bare = SlowRecord::decode(&record).unwrap();
        assert_eq!((bare.event, bare.file_name.as_slice()), (event, &b""[..]));
        record.extend_from_slice(b"/a/b");
        let named = SlowRecord::decode(&record).unwrap();
        assert_eq!(
            (named.event, named.file_name.as_slice()),
            (event, &b"/a/b"[..])
        );
        assert_eq!(SlowRecord::decode(&record[..bytes.len() - 1]), None);
    }
}
