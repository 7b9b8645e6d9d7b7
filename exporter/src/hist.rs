//! Kernel latency histograms to exported Prometheus buckets: the bounds a resolution exports
//! and the folding of the probes' log2 buckets onto them. Shared by every collector that
//! exports a kernel histogram (syscalls, block I/O).

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

/// Exported histogram bounds: (kernel bucket index, upper bound in seconds).
pub fn exported_bounds(resolution: HistogramResolution) -> Vec<(usize, f64)> {
    let step = match resolution {
        HistogramResolution::Log2 => 1,
        HistogramResolution::Log4 => 2,
    };
    (0..hist::HIST_BUCKETS)
        .step_by(step)
        .filter_map(|k| hist::upper_bound_ns(k).map(|ns| (k, ns as f64 / 1e9)))
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
    fn log4_bounds_are_powers_of_four_ns() {
        let b = exported_bounds(HistogramResolution::Log4);
        assert_eq!(b.len(), 13);
        assert_eq!(b[0], (0, 1.024e-6));
        assert_eq!(b[1], (2, 4.096e-6));
        assert_eq!(b[12].0, 24);
        assert!((b[12].1 - 17.179869184).abs() < 1e-9);
        assert_eq!(exported_bounds(HistogramResolution::Log2).len(), 25);
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
        // 20 ms lands below the 67 ms bound and above the 16.8 ms bound.
        let mut one = [0u64; hist::HIST_BUCKETS];
        one[hist::bucket_index(20_000_000)] = 1;
        let folded = fold_buckets(&one, &exported_bounds(HistogramResolution::Log4));
        let (le, _) = folded.iter().find(|(_, n)| *n == 1).unwrap();
        assert!((*le - 0.067108864).abs() < 1e-12, "{le}");
    }
}
