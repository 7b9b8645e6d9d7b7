//! CLOCK_MONOTONIC, the clock `bpf_ktime_get_ns()` reads: the one reader the collectors, the
//! span pipeline and the CLI compare kernel timestamps against.

/// CLOCK_MONOTONIC now, in nanoseconds.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into; CLOCK_MONOTONIC exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
