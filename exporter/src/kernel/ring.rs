//! Records of the probes' ring buffers (`SLOW_EVENTS`, `TRACE_EVENTS`, `TRACE_BLOCK_EVENTS`,
//! `OFFCPU_EVENTS`):
//! each is one `#[repr(C)]` ABI value the probes wrote, copied out of the ring buffer's
//! memory without any assumption about its alignment.

use aya::maps::{MapData, RingBuf};

/// The `T` at the start of a ring-buffer record; `None` when the record is too short to hold
/// one.
pub(crate) fn record<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: the record holds at least one `T` (checked above), written by the probes with the
    // ABI's layout of `T`; `T: Pod` makes every bit pattern a valid `T`, and read_unaligned
    // makes no assumption about the alignment of the ring buffer's memory.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Reads every record of type `T` waiting in `ring` and hands it to `each` (records shorter
/// than a `T` are skipped); returns how many were handed over.
pub(crate) fn drain<T: aya::Pod>(ring: &mut RingBuf<MapData>, mut each: impl FnMut(&T)) -> u64 {
    let mut n = 0;
    while let Some(item) = ring.next() {
        let Some(value) = record::<T>(&item) else {
            continue;
        };
        drop(item);
        each(&value);
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use sysscope_abi::{CallStamp, SlowCallEvent};

    use super::*;

    #[test]
    fn records_are_checked_for_length_and_read_at_any_alignment() {
        let ev = SlowCallEvent {
            call: CallStamp {
                start_ns: 10,
                end_ns: 30,
                tgid: 42,
                ..CallStamp::default()
            },
            nr: 17,
            ret: -2,
            args: [3, 0, 64, 0, 0, 0],
            ..SlowCallEvent::default()
        };
        // SAFETY: a plain #[repr(C)] value viewed as its own bytes, while it lives.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&ev as *const SlowCallEvent).cast::<u8>(),
                std::mem::size_of::<SlowCallEvent>(),
            )
        };
        // Copied to an odd offset: reading must not assume alignment.
        let mut buf = vec![0u8; bytes.len() + 1];
        buf[1..].copy_from_slice(bytes);
        assert_eq!(record::<SlowCallEvent>(&buf[1..]), Some(ev));
        assert_eq!(record::<SlowCallEvent>(&bytes[..bytes.len() - 1]), None);
    }
}
