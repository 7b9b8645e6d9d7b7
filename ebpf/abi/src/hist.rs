//! Latency histograms: log2 buckets over nanoseconds, the layout every histogram the probes
//! keep shares (syscall durations, block request latency).
//!
//! Bucket 0 holds durations below `2^FIRST_BUCKET_SHIFT` ns (1.024 µs); bucket `k` in
//! `1..HIST_BUCKETS-1` holds `[2^(FIRST_BUCKET_SHIFT+k-1), 2^(FIRST_BUCKET_SHIFT+k))` ns, and the
//! last bucket everything from `2^(FIRST_BUCKET_SHIFT+HIST_BUCKETS-2)` ns (17.2 s) up.

/// Number of buckets kept per histogram in the kernel.
pub const HIST_BUCKETS: usize = 26;
/// log2 of the upper bound (ns) of bucket 0.
pub const FIRST_BUCKET_SHIFT: u32 = 10;

/// Index of the bucket that counts a duration of `ns` nanoseconds.
#[inline(always)]
pub fn bucket_index(ns: u64) -> usize {
    // floor(log2(ns)) by a branch-light binary search: the verifier accepts it and it costs
    // a handful of instructions, unlike a loop.
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
    let idx = log as i64 - FIRST_BUCKET_SHIFT as i64 + 1;
    if idx <= 0 {
        0
    } else if idx >= HIST_BUCKETS as i64 {
        HIST_BUCKETS - 1
    } else {
        idx as usize
    }
}

/// Upper bound in nanoseconds of bucket `k`, `None` for the last (unbounded) bucket.
pub const fn upper_bound_ns(k: usize) -> Option<u64> {
    if k + 1 >= HIST_BUCKETS {
        None
    } else {
        Some(1u64 << (FIRST_BUCKET_SHIFT as usize + k))
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

    #[test]
    fn bucket_edges() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(1023), 0);
        assert_eq!(bucket_index(1024), 1);
        assert_eq!(bucket_index(2047), 1);
        assert_eq!(bucket_index(2048), 2);
        // 20 ms = 20_000_000 ns: 2^24 = 16.8M <= 20M < 2^25
        assert_eq!(bucket_index(20_000_000), 15);
        assert_eq!(upper_bound_ns(15), Some(1 << 25));
        assert_eq!(bucket_index(u64::MAX), HIST_BUCKETS - 1);
        assert_eq!(upper_bound_ns(HIST_BUCKETS - 1), None);
    }

    #[test]
    fn every_duration_lies_below_its_bucket_bound() {
        let mut ns = 1u64;
        while ns < u64::MAX / 3 {
            for probe in [ns - 1, ns, ns + 1] {
                let k = bucket_index(probe);
                if let Some(ub) = upper_bound_ns(k) {
                    assert!(probe < ub, "{probe} ns in bucket {k} with bound {ub}");
                }
                if k > 0 {
                    let lb = upper_bound_ns(k - 1).unwrap();
                    assert!(probe >= lb, "{probe} ns in bucket {k} below {lb}");
                }
            }
            ns = ns * 3 / 2 + 1;
        }
    }
}
