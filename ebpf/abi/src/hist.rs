//! Latency histograms: one bucket per power of two of a second, the layout every histogram the
//! probes keep shares (syscall durations, block request latency).
//!
//! Bucket 0 holds durations up to `2^FIRST_BOUND_LOG2_S` s (2^-20 s, 953.67 ns); bucket `k` in
//! `1..HIST_BUCKETS-1` holds `(2^(FIRST_BOUND_LOG2_S+k-1), 2^(FIRST_BOUND_LOG2_S+k)]` s, and the
//! last bucket everything above `2^(FIRST_BOUND_LOG2_S+HIST_BUCKETS-2)` s (16 s). Upper bounds
//! are inclusive, as Prometheus' `le` is.
//!
//! These are the buckets of a Prometheus native histogram of schema 0 and of an OpenTelemetry
//! exponential histogram of scale 0 over seconds (bucket 0 their zero bucket), so both are
//! built from the kernel's counts without re-bucketing. Powers of two of a nanosecond would not
//! be: 10^9 is not a power of two, and each such bound lies 2^30/10^9 = 1.074 times a power of
//! two of a second, inside a native bucket rather than on its edge.
//!
//! The probes find the bucket from the duration's leading bit and one comparison: between
//! 2^p and 2^(p+1) ns lies exactly one bound, `10^9 * 2^(p-29)` ns = `1953125 << (p-20)`
//! (10^9 = 1953125 * 2^9 and 2^20 < 1953125 < 2^21).

/// Number of buckets kept per histogram in the kernel.
pub const HIST_BUCKETS: usize = 26;
/// log2 of the upper bound, in seconds, of bucket 0.
pub const FIRST_BOUND_LOG2_S: i32 = -20;
/// The odd factor of 10^9 (10^9 = `NS_ODD` * 2^9).
const NS_ODD: u64 = 1_953_125;
/// Durations of `2^OVERFLOW_LOG2_NS` ns (17.2 s) and more are above the last bound (16 s).
const OVERFLOW_LOG2_NS: u32 = 34;

/// floor(log2(ns)), 0 for 0, by a branch-light binary search: the verifier accepts it and it
/// costs a handful of instructions, unlike a loop.
#[inline(always)]
fn log2_floor(ns: u64) -> u32 {
    let mut v = ns;
    let mut log = 0u32;
    if v >= 1 << 32 {
        v >>= 32;
        log += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        log += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        log += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        log += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        log += 2;
    }
    if v >= 1 << 1 {
        log += 1;
    }
    log
}

/// Index of the bucket that counts a duration of `ns` nanoseconds.
#[inline(always)]
pub fn bucket_index(ns: u64) -> usize {
    let p = log2_floor(ns);
    if p >= OVERFLOW_LOG2_NS {
        return HIST_BUCKETS - 1;
    }
    // The bound 2^(p-29) s, in whole ns: the one bound in [2^p, 2^(p+1)) ns. `ns` is a whole
    // number, so it lies at or below the bound exactly when it lies at or below its floor.
    let bound = if p >= 20 {
        NS_ODD << (p - 20)
    } else {
        NS_ODD >> (20 - p)
    };
    // Bucket k's bound is 2^(k-20) s: at or below 2^(p-29) s is bucket p-9, above it p-8.
    let idx = p as i64 - 9 + (ns > bound) as i64;
    if idx <= 0 {
        0
    } else if idx >= HIST_BUCKETS as i64 {
        HIST_BUCKETS - 1
    } else {
        idx as usize
    }
}

/// log2 of the upper bound, in seconds, of bucket `k`; `None` for the last (unbounded) bucket.
pub const fn upper_bound_log2_s(k: usize) -> Option<i32> {
    if k + 1 >= HIST_BUCKETS {
        None
    } else {
        Some(FIRST_BOUND_LOG2_S + k as i32)
    }
}

/// The longest duration, in whole nanoseconds, that bucket `k` holds; `None` for the last
/// (unbounded) bucket.
pub const fn upper_bound_ns(k: usize) -> Option<u64> {
    match upper_bound_log2_s(k) {
        // 10^9 * 2^e = NS_ODD * 2^(e+9).
        Some(e) if e + 9 >= 0 => Some(NS_ODD << (e + 9) as u32),
        Some(e) => Some(NS_ODD >> (-(e + 9)) as u32),
        None => None,
    }
}

/// A latency histogram as the probes keep it: the sum of durations and a count per log2
/// bucket (see the module); the count of events is the sum of the buckets. One type for every
/// histogram the probes keep (syscall durations, block request latency).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Sum of durations in nanoseconds.
    pub sum_ns: u64,
    pub buckets: [u64; HIST_BUCKETS],
}

impl LatencyHistogram {
    pub const ZERO: Self = Self {
        sum_ns: 0,
        buckets: [0; HIST_BUCKETS],
    };

    pub fn count(&self) -> u64 {
        self.buckets
            .iter()
            .fold(0u64, |acc, b| acc.wrapping_add(*b))
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::ZERO
    }
}

pod!(LatencyHistogram);

#[cfg(test)]
mod tests {
    use super::*;

    /// The bucket of `ns` by exact arithmetic: the first k with ns <= 10^9 * 2^(k-20), i.e.
    /// ns * 2^20 <= 10^9 * 2^k.
    fn reference(ns: u64) -> usize {
        (0..HIST_BUCKETS - 1)
            .find(|&k| (ns as u128) << 20 <= 1_000_000_000u128 << k)
            .unwrap_or(HIST_BUCKETS - 1)
    }

    #[test]
    fn bucket_edges() {
        assert_eq!(bucket_index(0), 0);
        // 2^-20 s = 953.67 ns: 953 ns is in the first bucket, 954 ns in the next.
        assert_eq!(upper_bound_ns(0), Some(953));
        assert_eq!(bucket_index(953), 0);
        assert_eq!(bucket_index(954), 1);
        // 2^-9 s = 1953125 ns exactly: inclusive upper bound.
        assert_eq!(upper_bound_ns(11), Some(1_953_125));
        assert_eq!(bucket_index(1_953_125), 11);
        assert_eq!(bucket_index(1_953_126), 12);
        // 20 ms: 2^-6 s = 15.6 ms < 20 ms <= 2^-5 s = 31.25 ms.
        assert_eq!(bucket_index(20_000_000), 15);
        assert_eq!(upper_bound_log2_s(15), Some(-5));
        // 16 s is the last bound; above it, the unbounded bucket.
        assert_eq!(upper_bound_ns(HIST_BUCKETS - 2), Some(16_000_000_000));
        assert_eq!(bucket_index(16_000_000_000), HIST_BUCKETS - 2);
        assert_eq!(bucket_index(16_000_000_001), HIST_BUCKETS - 1);
        assert_eq!(bucket_index(u64::MAX), HIST_BUCKETS - 1);
        assert_eq!(upper_bound_ns(HIST_BUCKETS - 1), None);
        assert_eq!(upper_bound_log2_s(HIST_BUCKETS - 1), None);
    }

    /// Every bound and its neighbours, and a walk over the whole range, land where exact
    /// arithmetic puts them.
    #[test]
    fn bucket_index_is_exact() {
        for k in 0..HIST_BUCKETS - 1 {
            let b = upper_bound_ns(k).unwrap();
            for ns in [b - 1, b, b + 1] {
                assert_eq!(bucket_index(ns), reference(ns), "{ns} ns");
            }
            assert_eq!(bucket_index(b), k);
            assert_eq!(bucket_index(b + 1), k + 1);
        }
        let mut ns = 0u64;
        while ns < u64::MAX / 3 {
            assert_eq!(bucket_index(ns), reference(ns), "{ns} ns");
            ns += ns / 16 + 1;
        }
        for p in 0..64 {
            for ns in [1u64 << p, (1u64 << p) - 1, (1u64 << p) + 1] {
                assert_eq!(bucket_index(ns), reference(ns), "{ns} ns");
            }
        }
    }
}
