//! Exemplars on `sysscope_syscall_duration_seconds`: in the OpenMetrics exposition, a latency
//! bucket carries the trace and span id of a recent slow call of the same series, so a Grafana
//! user can jump from a bucket to the span.
//!
//! The kernel aggregates the histogram, so there is no per-observation hook where an exemplar
//! could be recorded, and prometheus-client (0.25) can only build exemplars from observations
//! it makes itself. Instead, each slow call is remembered under the label set of the series it
//! was counted in (computed with the same labeler as the collector), and the OpenMetrics text
//! is annotated after encoding: the bucket line whose range holds the call's duration gets
//! ` # {trace_id="…",span_id="…"} <seconds> <timestamp>`. The protobuf exposition and the OTLP
//! push take the same calls by label set ([`ExemplarStore::of_series`]) as typed exemplars.
//! Series the cardinality budget folded into "other" get none. The 0.0.4 text format drops
//! exemplars, as it must.

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
};

use sysscope_abi::hist;

use super::event::SlowCall;
use crate::openmetrics::{label_key, parse_sample};

/// The histogram family whose series receive exemplars.
pub(crate) const EXEMPLAR_FAMILY: &str = "sysscope_syscall_duration_seconds";

/// Its bucket lines in the OpenMetrics text.
pub(crate) const BUCKET_PREFIX: &str = "sysscope_syscall_duration_seconds_bucket{";

/// Slow calls remembered per series (the most recent, of distinct buckets where possible).
const PER_SERIES: usize = 4;

/// A remembered slow call: its duration, when it ended, and its span's ids (lowercase hex).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RecentCall {
    pub(crate) duration_ns: u64,
    pub(crate) end_unix_ns: u64,
    pub(crate) trace_id: String,
    pub(crate) span_id: String,
}

#[derive(Debug, Default)]
struct Inner {
    series: HashMap<String, Vec<RecentCall>>,
    /// Series keys in the order they were first seen: the oldest is evicted first (a busy
    /// series evicted this way comes back with its next slow call).
    order: VecDeque<String>,
}

/// Recent slow calls by series, bounded to `capacity` series.
#[derive(Debug)]
pub(crate) struct ExemplarStore {
    capacity: usize,
    inner: Mutex<Inner>,
}

impl ExemplarStore {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().expect("exemplar lock").series.len()
    }

    /// Remembers `call` as an exemplar of the series labelled `labels`.
    pub(crate) fn record(&self, labels: &[(&'static str, String)], call: &SlowCall) {
        let key = label_key(labels.iter().map(|(k, v)| (*k, v.as_str())));
        let entry = RecentCall {
            duration_ns: call.duration_ns,
            end_unix_ns: call.end_unix_ns,
            trace_id: call.trace_id_hex(),
            span_id: call.span_id_hex(),
        };
        let mut inner = self.inner.lock().expect("exemplar lock");
        let inner = &mut *inner;
        match inner.series.get_mut(&key) {
            Some(entries) => {
                // Keep one per kernel bucket, newest last: a new call replaces an older one of
                // the same bucket, else the oldest.
                let bucket = hist::bucket_index;
                if let Some(i) = entries
                    .iter()
                    .position(|e| bucket(e.duration_ns) == bucket(entry.duration_ns))
                {
                    entries.remove(i);
                } else if entries.len() >= PER_SERIES {
                    entries.remove(0);
                }
                entries.push(entry);
            }
            None => {
                while inner.series.len() >= self.capacity {
                    match inner.order.pop_front() {
                        Some(old) => {
                            inner.series.remove(&old);
                        }
                        None => break,
                    }
                }
                inner.series.insert(key.clone(), vec![entry]);
                inner.order.push_back(key);
            }
        }
    }

    /// The calls remembered for the series labelled `labels` (in any order), oldest first.
    pub(crate) fn of_series<'a>(
        &self,
        labels: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Vec<RecentCall> {
        let inner = self.inner.lock().expect("exemplar lock");
        if inner.series.is_empty() {
            return Vec::new();
        }
        inner
            .series
            .get(&label_key(labels))
            .cloned()
            .unwrap_or_default()
    }

    /// Adds exemplars to the latency bucket lines of an OpenMetrics exposition.
    pub(crate) fn annotate(&self, om: &mut String) {
        let inner = self.inner.lock().expect("exemplar lock");
        if inner.series.is_empty() || !om.contains(BUCKET_PREFIX) {
            return;
        }
        let mut out = String::with_capacity(om.len() + inner.series.len() * 96);
        // Bucket lines of one series are consecutive with increasing `le`.
        let mut current: Option<(String, f64)> = None;
        for line in om.split_inclusive('\n') {
            if !line.starts_with(BUCKET_PREFIX) || line.contains(" # {") {
                out.push_str(line);
                continue;
            }
            let Some(sample) = parse_sample(line) else {
                out.push_str(line);
                continue;
            };
            let le = match sample.label("le").map(|v| v.parse::<f64>()) {
                Some(Ok(le)) => le,
                _ if sample.label("le") == Some("+Inf") => f64::INFINITY,
                _ => {
                    out.push_str(line);
                    continue;
                }
            };
            let key = label_key(
                sample
                    .labels
                    .iter()
                    .filter(|(k, _)| k != "le")
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            );
            let lower = match &current {
                Some((k, prev_le)) if *k == key => *prev_le,
                _ => f64::NEG_INFINITY,
            };
            // A bucket holds (lower, le]: the kernel's bounds are inclusive, as `le` is.
            let chosen = inner.series.get(&key).and_then(|entries| {
                entries.iter().rev().find(|e| {
                    let s = e.duration_ns as f64 / 1e9;
                    s > lower && s <= le
                })
            });
            match chosen {
                Some(e) => {
                    out.push_str(line.trim_end_matches('\n'));
                    out.push_str(&format!(
                        " # {{trace_id=\"{}\",span_id=\"{}\"}} {} {}.{:09}\n",
                        e.trace_id,
                        e.span_id,
                        e.duration_ns as f64 / 1e9,
                        e.end_unix_ns / 1_000_000_000,
                        e.end_unix_ns % 1_000_000_000
                    ));
                }
                None => out.push_str(line),
            }
            current = Some((key, le));
        }
        *om = out;
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    fn call(duration_ns: u64, id: u8) -> SlowCall {
        SlowCall {
            trace_id: [id; 16],
            span_id: [id; 8],
            name: Cow::Borrowed("read"),
            start_unix_ns: 1_700_000_000_000_000_000,
            end_unix_ns: 1_700_000_000_000_000_000 + duration_ns,
            duration_ns,
            error: None,
            attributes: vec![],
        }
    }

    fn labels(comm: &str) -> Vec<(&'static str, String)> {
        vec![
            ("cgroup", "/a".to_string()),
            ("comm", comm.to_string()),
            ("syscall", "read".to_string()),
        ]
    }

    const TEXT: &str = "# TYPE sysscope_syscall_duration_seconds histogram\n\
sysscope_syscall_duration_seconds_sum{cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 1.0\n\
sysscope_syscall_duration_seconds_bucket{le=\"0.015625\",cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 3\n\
sysscope_syscall_duration_seconds_bucket{le=\"0.0625\",cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 13\n\
sysscope_syscall_duration_seconds_bucket{le=\"+Inf\",cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 13\n\
sysscope_syscall_duration_seconds_bucket{le=\"0.015625\",cgroup=\"/a\",comm=\"y\",syscall=\"read\"} 0\n\
# EOF\n";

    #[test]
    fn exemplar_lands_in_the_bucket_of_its_duration() {
        let store = ExemplarStore::new(10);
        store.record(&labels("x"), &call(30_000_000, 0xab));
        let mut om = TEXT.to_string();
        store.annotate(&mut om);
        let lines: Vec<&str> = om.lines().collect();
        assert!(!lines[2].contains(" # "), "{}", lines[2]);
        assert_eq!(
            lines[3],
            format!(
                "sysscope_syscall_duration_seconds_bucket{{le=\"0.0625\",cgroup=\"/a\",comm=\"x\",syscall=\"read\"}} 13 # {{trace_id=\"{}\",span_id=\"{}\"}} 0.03 1700000000.030000000",
                "ab".repeat(16),
                "ab".repeat(8)
            )
        );
        assert!(!lines[4].contains(" # "), "one bucket only");
        assert!(!lines[5].contains(" # "), "other series untouched");
        // The annotated line still parses, exemplar included.
        let s = parse_sample(lines[3]).unwrap();
        assert_eq!(s.value, 13.0);
        assert_eq!(s.exemplar.unwrap().value, 0.03);
    }

    #[test]
    fn bounded_by_series_and_per_series() {
        let store = ExemplarStore::new(2);
        store.record(&labels("a"), &call(1, 1));
        store.record(&labels("b"), &call(1, 2));
        store.record(&labels("c"), &call(1, 3));
        assert_eq!(store.len(), 2);
        for i in 0..10u64 {
            store.record(&labels("c"), &call(1 << (20 + i), 4));
        }
        let inner = store.inner.lock().unwrap();
        let key = label_key(labels("c").iter().map(|(k, v)| (*k, v.as_str())));
        assert_eq!(inner.series[&key].len(), PER_SERIES);
    }

    #[test]
    fn calls_are_found_by_label_set_in_any_order() {
        let store = ExemplarStore::new(10);
        store.record(&labels("x"), &call(30_000_000, 0xab));
        let mut reversed = labels("x");
        reversed.reverse();
        let found = store.of_series(reversed.iter().map(|(k, v)| (*k, v.as_str())));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].duration_ns, 30_000_000);
        assert_eq!(found[0].trace_id, "ab".repeat(16));
        assert!(store
            .of_series(labels("y").iter().map(|(k, v)| (*k, v.as_str())))
            .is_empty());
    }

    #[test]
    fn nothing_recorded_leaves_text_alone() {
        let store = ExemplarStore::new(2);
        let mut om = TEXT.to_string();
        store.annotate(&mut om);
        assert_eq!(om, TEXT);
    }
}
