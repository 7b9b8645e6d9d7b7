//! Kernel timestamps to wall-clock time.
//!
//! The probes stamp slow calls with `bpf_ktime_get_ns()`, which is CLOCK_MONOTONIC: it never
//! jumps, but it has no relation to the date. Spans need wall-clock (Unix) times, so we keep
//! the offset `CLOCK_REALTIME - CLOCK_MONOTONIC` and add it to each kernel timestamp.
//!
//! The offset is measured by reading the real-time clock between two monotonic reads and
//! keeping the tightest of a few tries (the error is at most half that gap, well under a
//! microsecond through the vDSO). It is re-measured every [`REFRESH`]: the wall clock can be
//! stepped (NTP, an operator) and the two clocks drift apart slightly while NTP slews the
//! real-time clock, and CLOCK_MONOTONIC stops during suspend. Events are converted within
//! milliseconds of happening, so the offset in force at conversion time is the right one;
//! re-measuring per event would cost three clock reads each for no better result.

use std::time::Duration;
#[cfg(test)]
use std::time::{SystemTime, UNIX_EPOCH};

/// How often the offset is measured again.
pub(crate) const REFRESH: Duration = Duration::from_secs(10);

fn read_clock(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write into; both clocks exist on every Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

pub(crate) use crate::util::clock::monotonic_ns;

/// Measures `CLOCK_REALTIME - CLOCK_MONOTONIC` in nanoseconds.
pub(crate) fn measure_offset_ns() -> i128 {
    let mut best: Option<(i128, i128)> = None;
    for _ in 0..5 {
        let before = read_clock(libc::CLOCK_MONOTONIC);
        let real = read_clock(libc::CLOCK_REALTIME);
        let after = read_clock(libc::CLOCK_MONOTONIC);
        let gap = after - before;
        let offset = real - (before + gap / 2);
        if best.is_none_or(|(g, _)| gap < g) {
            best = Some((gap, offset));
        }
    }
    best.map_or(0, |(_, offset)| offset)
}

/// Converts monotonic nanoseconds to wall-clock times, refreshing the offset periodically.
#[derive(Debug)]
pub(crate) struct WallClock {
    offset_ns: i128,
    measured_at_mono: u64,
    refresh_ns: u64,
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new(REFRESH)
    }
}

impl WallClock {
    pub(crate) fn new(refresh: Duration) -> Self {
        Self {
            offset_ns: measure_offset_ns(),
            measured_at_mono: monotonic_ns(),
            refresh_ns: refresh.as_nanos() as u64,
        }
    }

    /// A clock with a fixed offset (tests).
    #[cfg(test)]
    pub(crate) fn fixed(offset_ns: i128) -> Self {
        Self {
            offset_ns,
            measured_at_mono: u64::MAX,
            refresh_ns: u64::MAX,
        }
    }

    /// Re-measures the offset when it is older than the refresh period.
    pub(crate) fn maybe_refresh(&mut self) {
        if self.refresh_ns == u64::MAX {
            return;
        }
        let now = monotonic_ns();
        if now.saturating_sub(self.measured_at_mono) >= self.refresh_ns {
            self.offset_ns = measure_offset_ns();
            self.measured_at_mono = now;
        }
    }

    /// Unix time in nanoseconds of a CLOCK_MONOTONIC timestamp.
    pub(crate) fn unix_ns(&self, mono_ns: u64) -> u64 {
        (mono_ns as i128 + self.offset_ns).clamp(0, u64::MAX as i128) as u64
    }

    /// Wall-clock time of a CLOCK_MONOTONIC timestamp.
    #[cfg(test)]
    pub(crate) fn to_system_time(&self, mono_ns: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.unix_ns(mono_ns))
    }
}

/// RFC 3339 UTC with nanoseconds, e.g. `2026-11-21T10:00:00.123456789Z`.
pub(crate) fn rfc3339(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let nanos = unix_ns % 1_000_000_000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// (year, month, day) of a count of days since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_maps_now_to_now() {
        let clock = WallClock::default();
        let mono = monotonic_ns();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128;
        let converted = clock.unix_ns(mono) as i128;
        // Same instant through two paths: a few microseconds apart at most (allow 50 ms
        // for a preempted test thread).
        assert!(
            (converted - wall).abs() < 50_000_000,
            "{converted} vs {wall}"
        );
    }

    #[test]
    fn fixed_offset_is_exact() {
        let clock = WallClock::fixed(1_000);
        assert_eq!(clock.unix_ns(5), 1_005);
        assert_eq!(
            clock.to_system_time(0),
            UNIX_EPOCH + Duration::from_nanos(1_000)
        );
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000000Z");
        // 2000-02-29 (a leap day) 12:34:56.000000789
        assert_eq!(
            rfc3339(951_827_696_000_000_789),
            "2000-02-29T12:34:56.000000789Z"
        );
        assert_eq!(
            rfc3339(1_763_683_200_500_000_000),
            "2025-11-21T00:00:00.500000000Z"
        );
    }
}
