//! Kernel latency histograms to exported Prometheus buckets: the bounds a resolution exports
//! and the folding of the probes' buckets (one per power of two of a second,
//! `sysscope_abi::hist`) onto them. Shared by every collector that exports a kernel histogram
//! (syscalls, block I/O).

use prometheus_client::encoding::{MetricEncoder, NoLabelSet};
use sysscope_abi::{hist, LatencyHistogram};

use crate::config::HistogramResolution;

/// Writes `histogram` (the sum of what the kernel measured for one series) as a Prometheus
/// histogram at the exported `bounds`.
pub(crate) fn encode_histogram(
    mut metric: MetricEncoder<'_>,
    histogram: &LatencyHistogram,
    bounds: &[(usize, f64)],
) -> std::fmt::Result {
    let buckets = fold_buckets(&histogram.buckets, bounds);
    metric.encode_histogram::<NoLabelSet>(
        histogram.sum_ns as f64 / 1e9,
        histogram.count(),
        &buckets,
        None,
    )
}

/// The upper bound of kernel bucket `k` in seconds (a power of two, exact as an `f64`).
pub(crate) fn upper_bound_seconds(k: usize) -> Option<f64> {
    hist::upper_bound_log2_s(k).map(|e| 2f64.powi(e))
}

/// Exported histogram bounds: (kernel bucket index, upper bound in seconds).
pub fn exported_bounds(resolution: HistogramResolution) -> Vec<(usize, f64)> {
    let step = match resolution {
        HistogramResolution::Log2 => 1,
        HistogramResolution::Log4 => 2,
    };
    (0..hist::HIST_BUCKETS)
        .step_by(step)
        .filter_map(|k| upper_bound_seconds(k).map(|s| (k, s)))
        .collect()
}

/// Non-cumulative bucket counts at the exported bounds, ending with +Inf, from kernel buckets.
pub fn fold_buckets(
    buckets: &[u64; hist::HIST_BUCKETS],
    bounds: &[(usize, f64)],
) -> Vec<(f64, u64)> {
    let mut out = Vec::with_capacity(bounds.len() + 1);
    let mut next = 0usize;
    for &(k, le) in bounds {
        let n: u64 = buckets[next..=k].iter().sum();
        out.push((le, n));
        next = k + 1;
    }
    out.push((f64::INFINITY, buckets[next..].iter().sum()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log4_bounds_are_powers_of_four_seconds() {
        let b = exported_bounds(HistogramResolution::Log4);
        assert_eq!(b.len(), 13);
        assert_eq!(b[0], (0, 2f64.powi(-20)));
        assert_eq!(b[1], (2, 2f64.powi(-18)));
        assert_eq!(b[12], (24, 16.0));
        assert_eq!(exported_bounds(HistogramResolution::Log2).len(), 25);
        assert_eq!(exported_bounds(HistogramResolution::Log2)[20], (20, 1.0));
    }

    #[test]
    fn folding_keeps_every_observation() {
        let mut buckets = [0u64; hist::HIST_BUCKETS];
        for (i, b) in buckets.iter_mut().enumerate() {
            *b = i as u64 + 1;
        }
        for res in [HistogramResolution::Log2, HistogramResolution::Log4] {
            let bounds = exported_bounds(res);
            let folded = fold_buckets(&buckets, &bounds);
            assert_eq!(folded.len(), bounds.len() + 1);
            assert_eq!(
                folded.iter().map(|(_, n)| n).sum::<u64>(),
                buckets.iter().sum::<u64>()
            );
            assert_eq!(folded.last().unwrap().0, f64::INFINITY);
        }
        // 20 ms lands below the 62.5 ms bound (4^-2 s) and above the 15.6 ms one (4^-3 s).
        let mut one = [0u64; hist::HIST_BUCKETS];
        one[hist::bucket_index(20_000_000)] = 1;
        let folded = fold_buckets(&one, &exported_bounds(HistogramResolution::Log4));
        let (le, _) = folded.iter().find(|(_, n)| *n == 1).unwrap();
        assert_eq!(*le, 0.0625);
    }
}
