//! Kernel latency histograms as exported histograms, for every collector that exports one
//! (syscalls, block I/O): the classic buckets at the bounds a resolution exports, and the
//! native histogram of the same buckets that the Prometheus protobuf exposition carries.
//!
//! The kernel's buckets are powers of two of a second (`sysscope_abi::hist`), the bounds of a
//! native histogram of schema 0, so the native form is the kernel's counts as they are: bucket
//! 0 is the zero bucket (threshold 2^-20 s), kernel bucket `k` the native bucket of index
//! `k - 20`, (2^(k-21), 2^(k-20)] s. The `log4` resolution exports every second bound, the
//! bounds of schema -1 (powers of four), whose bucket `i` is the sum of kernel buckets
//! `2i + 19` and `2i + 20`. Durations above the last bound (16 s), which the kernel does not
//! resolve, are the classic `+Inf` bucket and the native bucket just above 16 s ((16, 32] s at
//! schema 0, (16, 64] s at schema -1): a native histogram has no unbounded bucket.

use prometheus_client::encoding::{
    MetricEncoder, NativeHistogram, NativeHistogramBuckets, NoLabelSet,
};
use sysscope_abi::{hist, LatencyHistogram};

use crate::config::HistogramResolution;

/// Writes `histogram` (the sum of what the kernel measured for one series): classic buckets at
/// the exported `bounds` for every format, and the native histogram of `resolution` for the
/// formats that carry one (the Prometheus protobuf exposition).
pub(crate) fn encode_histogram(
    mut metric: MetricEncoder<'_>,
    histogram: &LatencyHistogram,
    bounds: &[(usize, f64)],
    resolution: HistogramResolution,
) -> std::fmt::Result {
    let buckets = fold_buckets(&histogram.buckets, bounds);
    let native = NativeBuckets::of(histogram, resolution);
    metric.encode_histogram_with_native::<NoLabelSet>(
        histogram.sum_ns as f64 / 1e9,
        histogram.count(),
        &buckets,
        None,
        native.as_encoding(),
    )
}

/// How a collector exports its latency histograms: the classic bounds and the native
/// histogram's resolution, both from `[syscalls] histogram_resolution`.
#[derive(Debug, Clone)]
pub(crate) struct HistogramLayout {
    /// Kernel bucket indices whose upper bounds are exported, with the bound in seconds.
    bounds: Vec<(usize, f64)>,
    /// Sets the native histogram's schema.
    resolution: HistogramResolution,
}

impl HistogramLayout {
    pub(crate) fn new(resolution: HistogramResolution) -> Self {
        Self {
            bounds: exported_bounds(resolution),
            resolution,
        }
    }

    /// Classic series one histogram costs: one per bound, `+Inf`, `_sum` and `_count`.
    pub(crate) fn series_cost(&self) -> usize {
        self.bounds.len() + 3
    }

    /// Writes `histogram` with this layout ([`encode_histogram`]).
    pub(crate) fn encode(
        &self,
        metric: MetricEncoder<'_>,
        histogram: &LatencyHistogram,
    ) -> std::fmt::Result {
        encode_histogram(metric, histogram, &self.bounds, self.resolution)
    }
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

/// The native histogram schema of a resolution: 0 (powers of two) for `log2`, -1 (powers of
/// four) for `log4`.
pub fn native_schema(resolution: HistogramResolution) -> i32 {
    match resolution {
        HistogramResolution::Log2 => 0,
        HistogramResolution::Log4 => -1,
    }
}

/// The zero bucket's threshold in seconds: the upper bound of kernel bucket 0.
pub fn zero_threshold() -> f64 {
    2f64.powi(hist::FIRST_BOUND_LOG2_S)
}

/// The native bucket (at `schema` 0 or -1) that kernel bucket `k` (1 or more) counts in: the
/// one whose upper bound is the kernel bucket's, or for the last kernel bucket the one just
/// above 16 s.
pub fn native_index(k: usize, schema: i32) -> i32 {
    let e = hist::FIRST_BOUND_LOG2_S + k as i32;
    // Schema -1's bucket i is (4^(i-1), 4^i] = (2^(2i-2), 2^(2i)]: i = ceil(e / 2).
    if schema == 0 {
        e
    } else {
        (e + 1).div_euclid(2)
    }
}

/// A native histogram's buckets as the Prometheus protobuf exposition carries them: spans of
/// consecutive bucket indices and, along them, each count as the difference from the previous.
#[derive(Debug, Clone, PartialEq)]
pub struct NativeBuckets {
    pub schema: i32,
    pub zero_threshold: f64,
    pub zero_count: u64,
    /// (offset from the end of the previous span, or the first index; length).
    pub spans: Vec<(i32, u32)>,
    pub deltas: Vec<i64>,
}

/// Runs of at most this many empty buckets stay inside a span (as zero counts): cheaper than
/// opening a new span, which costs two fields.
const MAX_EMPTY_IN_SPAN: i32 = 2;

impl NativeBuckets {
    /// The native form of kernel buckets at the resolution's schema.
    pub fn of(histogram: &LatencyHistogram, resolution: HistogramResolution) -> Self {
        let schema = native_schema(resolution);
        // (native index, count) in increasing index order, merging the kernel buckets a
        // coarser schema puts together.
        let mut counts: Vec<(i32, u64)> = Vec::with_capacity(hist::HIST_BUCKETS);
        for (k, &n) in histogram.buckets.iter().enumerate().skip(1) {
            if n == 0 {
                continue;
            }
            let i = native_index(k, schema);
            match counts.last_mut() {
                Some((last, c)) if *last == i => *c += n,
                _ => counts.push((i, n)),
            }
        }
        let mut spans: Vec<(i32, u32)> = Vec::new();
        let mut deltas = Vec::with_capacity(counts.len());
        let mut previous_count = 0i64;
        let mut previous_index: Option<i32> = None;
        for (i, n) in counts {
            match previous_index {
                Some(p) if i - p - 1 <= MAX_EMPTY_IN_SPAN => {
                    // Inside the current span: the empty buckets between are zeros.
                    for _ in p + 1..i {
                        deltas.push(-previous_count);
                        previous_count = 0;
                    }
                    if let Some(span) = spans.last_mut() {
                        span.1 += (i - p) as u32;
                    }
                }
                Some(p) => spans.push((i - p - 1, 1)),
                None => spans.push((i, 1)),
            }
            deltas.push(n as i64 - previous_count);
            previous_count = n as i64;
            previous_index = Some(i);
        }
        Self {
            schema,
            zero_threshold: zero_threshold(),
            zero_count: histogram.buckets[0],
            spans,
            deltas,
        }
    }

    /// The form prometheus-client's encoders take. A histogram without observations in its
    /// buckets still has a span (empty), as the protobuf format asks of native histograms.
    fn as_encoding(&self) -> NativeHistogram<'_> {
        const NO_OP: &[(i32, u32)] = &[(0, 0)];
        NativeHistogram {
            schema: self.schema,
            zero_threshold: self.zero_threshold,
            zero_count: self.zero_count,
            negative: NativeHistogramBuckets {
                spans: &[],
                deltas: &[],
            },
            positive: NativeHistogramBuckets {
                spans: if self.spans.is_empty() {
                    NO_OP
                } else {
                    &self.spans
                },
                deltas: &self.deltas,
            },
            created: None,
        }
    }
}

/// Absolute counts by bucket index from spans and deltas (the inverse of the delta coding).
pub fn expand_spans(spans: &[(i32, u32)], deltas: &[i64]) -> Vec<(i32, u64)> {
    let mut out = Vec::with_capacity(deltas.len());
    let mut deltas = deltas.iter();
    let mut index = 0i32;
    let mut count = 0i64;
    for (n, &(offset, length)) in spans.iter().enumerate() {
        index = if n == 0 { offset } else { index + offset };
        for _ in 0..length {
            let Some(d) = deltas.next() else {
                return out;
            };
            count += d;
            out.push((index, count.max(0) as u64));
            index += 1;
        }
    }
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

    /// Every native bucket's bounds are the bounds of the kernel buckets counted in it, so the
    /// native histogram holds exactly what the classic one holds.
    #[test]
    fn native_buckets_have_the_kernel_bounds() {
        let bound = |i: i32, schema: i32| 2f64.powf(i as f64 * 2f64.powi(-schema));
        for resolution in [HistogramResolution::Log2, HistogramResolution::Log4] {
            let schema = native_schema(resolution);
            for k in 1..hist::HIST_BUCKETS - 1 {
                let i = native_index(k, schema);
                let upper = upper_bound_seconds(k).unwrap();
                let lower = upper_bound_seconds(k - 1).unwrap();
                assert!(bound(i - 1, schema) <= lower && upper <= bound(i, schema));
            }
            // Classic bounds are native bounds: the ones the resolution exports end buckets.
            for (k, le) in exported_bounds(resolution).into_iter().skip(1) {
                assert_eq!(bound(native_index(k, schema), schema), le, "{resolution:?}");
            }
            // The unbounded kernel bucket counts just above 16 s.
            let last = native_index(hist::HIST_BUCKETS - 1, schema);
            assert_eq!(bound(last - 1, schema), 16.0);
        }
        assert_eq!(zero_threshold(), upper_bound_seconds(0).unwrap());
    }

    #[test]
    fn native_spans_and_deltas() {
        let mut h = LatencyHistogram::ZERO;
        h.buckets[0] = 7; // zero bucket
        h.buckets[hist::bucket_index(2_100_000)] = 100; // (2^-9, 2^-8] s: index -8
        h.buckets[hist::bucket_index(40_000_000)] = 50; // (2^-5, 2^-4] s: index -4
        h.buckets[hist::HIST_BUCKETS - 1] = 1; // above 16 s: index 5
        h.sum_ns = 100 * 2_100_000 + 50 * 40_000_000 + 20_000_000_000;
        let n = NativeBuckets::of(&h, HistogramResolution::Log2);
        assert_eq!((n.schema, n.zero_count), (0, 7));
        assert_eq!(n.zero_threshold, 2f64.powi(-20));
        // -8 then three empty buckets (a new span), -4, then the gap to 5.
        assert_eq!(n.spans, vec![(-8, 1), (3, 1), (8, 1)]);
        assert_eq!(n.deltas, vec![100, -50, -49]);
        assert_eq!(
            expand_spans(&n.spans, &n.deltas),
            vec![(-8, 100), (-4, 50), (5, 1)]
        );
        // Schema -1: (4^-5, 4^-4] holds 2^-9..2^-8; (4^-3, 4^-2] holds 2^-5..2^-4.
        let n = NativeBuckets::of(&h, HistogramResolution::Log4);
        // One empty bucket between two counted ones stays in the span, as a zero.
        assert_eq!(
            expand_spans(&n.spans, &n.deltas),
            vec![(-4, 100), (-3, 0), (-2, 50), (3, 1)]
        );
        assert_eq!(n.spans, vec![(-4, 3), (4, 1)]);
        assert_eq!(n.deltas, vec![100, -100, 50, -49]);
        // Empty: no bucket, and the no-op span the format asks for.
        let empty = NativeBuckets::of(&LatencyHistogram::ZERO, HistogramResolution::Log4);
        assert!(empty.spans.is_empty() && empty.deltas.is_empty());
        assert_eq!(empty.as_encoding().positive.spans, &[(0, 0)]);
    }

    /// One histogram series through prometheus-client's encoders, with its native form or
    /// without.
    #[derive(Debug)]
    struct One(LatencyHistogram, bool);

    impl prometheus_client::collector::Collector for One {
        fn encode(
            &self,
            mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
        ) -> std::fmt::Result {
            let mut family = encoder.encode_descriptor(
                "h_seconds",
                "H.",
                None,
                prometheus_client::metrics::MetricType::Histogram,
            )?;
            let bounds = exported_bounds(HistogramResolution::Log4);
            let mut metric = family.encode_family(&[("comm", "x")])?;
            if self.1 {
                encode_histogram(metric, &self.0, &bounds, HistogramResolution::Log4)
            } else {
                metric.encode_histogram::<NoLabelSet>(
                    self.0.sum_ns as f64 / 1e9,
                    self.0.count(),
                    &fold_buckets(&self.0.buckets, &bounds),
                    None,
                )
            }
        }
    }

    /// The native form changes nothing in the text formats, byte for byte; the protobuf
    /// exposition carries it beside the classic buckets.
    #[test]
    fn the_text_formats_are_unchanged_and_protobuf_carries_the_native_form() {
        use prometheus_client::{encoding, registry::Registry};
        let mut h = LatencyHistogram::ZERO;
        h.buckets[0] = 3;
        h.buckets[hist::bucket_index(2_100_000)] = 100;
        h.buckets[hist::bucket_index(40_000_000)] = 50;
        h.sum_ns = 3 * 500 + 100 * 2_100_000 + 50 * 40_000_000;
        let text = |native| {
            let mut registry = Registry::default();
            registry.register_collector(Box::new(One(h, native)));
            let mut out = String::new();
            encoding::text::encode(&mut out, &registry).unwrap();
            (
                out,
                encoding::prometheus_protobuf::encode(&registry).unwrap(),
            )
        };
        let (with_native, families) = text(true);
        let (classic_only, _) = text(false);
        assert_eq!(with_native, classic_only);
        assert!(with_native.contains("h_seconds_bucket{le=\"0.0625\",comm=\"x\"} 153\n"));
        let p = families[0].metric[0].histogram.as_ref().unwrap();
        assert_eq!((p.sample_count, p.schema, p.zero_count), (153, -1, 3));
        assert_eq!(p.bucket.len(), 14);
        let spans: Vec<(i32, u32)> = p
            .positive_span
            .iter()
            .map(|s| (s.offset, s.length))
            .collect();
        assert_eq!(
            expand_spans(&spans, &p.positive_delta),
            [(-4, 100), (-3, 0), (-2, 50)]
        );
    }

    /// Merged or not, the native buckets hold every observation once.
    #[test]
    fn native_counts_add_up_to_the_kernel_count() {
        let mut h = LatencyHistogram::ZERO;
        for (k, b) in h.buckets.iter_mut().enumerate() {
            *b = (k as u64 * 7919) % 13;
        }
        for res in [HistogramResolution::Log2, HistogramResolution::Log4] {
            let n = NativeBuckets::of(&h, res);
            let total: u64 = expand_spans(&n.spans, &n.deltas)
                .iter()
                .map(|(_, c)| c)
                .sum();
            assert_eq!(total + n.zero_count, h.count());
        }
    }
}
